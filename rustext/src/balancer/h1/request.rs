//! Request heads: parsed (httparse), routed, and rewritten for a backend.

use std::sync::Arc;

use super::*;
use crate::balancer::config::HashKey;
use crate::balancer::route::{self, Listener, View};
use crate::balancer::upstream::Upstream;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MethodKind {
    Head,
    /// GET, OPTIONS, TRACE, PUT, DELETE: may be replayed (without a body).
    Idempotent,
    Other,
}

/// A request head ready for a backend (its rewritten start in `out`).
#[derive(Clone, Debug)]
pub struct ReqHead {
    pub head_len: usize,
    pub body_len: u64,
    pub http10: bool,
    /// The client keeps the connection after this exchange.
    pub keep_alive: bool,
    pub method: MethodKind,
    /// The target's path (before `?`), for hashing.
    pub path: Range,
    /// The value of the hash header, if asked for and present.
    pub hash_value: Option<Range>,
    pub has_host: bool,
    /// The `Host` value, if any.
    pub host: Option<Range>,
    /// The whole request target.
    pub target: Range,
    /// The routing action (see [`Listener::action`]; 0 unrouted).
    pub action: usize,
    /// A valid incoming request id (else one is generated), with `request_id` set.
    pub req_id: Option<Range>,
    xff: [Range; MAX_PREV],
    n_xff: u8,
    fwd: [Range; MAX_PREV],
    n_fwd: u8,
}

#[derive(Debug)]
pub enum ReqParse {
    /// More bytes needed.
    Partial,
    /// Not for the fast path (or invalid): hand the bytes to hyper.
    Fallback,
    /// Framing two parsers could read differently (Content-Length with
    /// Transfer-Encoding, repeated Transfer-Encoding), or a fragment in the
    /// target: answer 400 and close, forwarding nothing (RFC 9112 §6.3,
    /// §3.2). hyper would normalize these instead.
    Refuse,
    Ready(ReqHead),
}

/// Parse a request head from `buf` and write its backend form into `out`
/// (cleared first): request line and kept headers, without the final
/// forwarding headers and blank line (see [`finish_request`]).
/// A byte of an origin-form target: pchar, "/" and "?" (RFC 3986 §3.3, §3.4).
#[inline]
fn uri_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=:@/?".contains(&c)
}

pub fn parse_request(buf: &[u8], hash_header: Option<&str>, out: &mut Vec<u8>) -> ReqParse {
    parse(buf, hash_header, None, out)
}

/// [`parse_request`], routed by `listener` (pools give the hash key of the
/// chosen pool). A redirect, or no backend, is `Ready` with nothing written
/// in `out`: the caller answers it.
pub fn parse_request_routed(
    buf: &[u8],
    listener: &Listener,
    pools: &[Arc<Upstream>],
    out: &mut Vec<u8>,
) -> ReqParse {
    parse(buf, None, Some((listener, pools)), out)
}

/// The parsed head as routing sees it.
struct SliceView<'a, 'h> {
    host: Option<&'a [u8]>,
    path: &'a [u8],
    method: &'a [u8],
    headers: &'h [httparse::Header<'a>],
}

impl View for SliceView<'_, '_> {
    fn host(&self) -> Option<&[u8]> {
        self.host
    }
    fn path(&self) -> &[u8] {
        self.path
    }
    fn method(&self) -> &[u8] {
        self.method
    }
    fn header_any(&self, name: &[u8], test: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        self.headers
            .iter()
            .any(|h| h.name.len() == name.len() && h.name.as_bytes().eq_ignore_ascii_case(name) && test(h.value))
    }
}

fn parse(
    buf: &[u8],
    hash_header: Option<&str>,
    routing: Option<(&Listener, &[Arc<Upstream>])>,
    out: &mut Vec<u8>,
) -> ReqParse {
    out.clear();
    let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut hs);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return ReqParse::Partial,
        Err(_) => return ReqParse::Fallback,
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return ReqParse::Fallback;
    };
    if target.contains('#') {
        // a fragment is never sent (RFC 9112 §3.2); hyper's path would drop it silently
        return ReqParse::Refuse;
    }
    if version > 1 || !target.starts_with('/') || !target.bytes().all(uri_byte) {
        // outside RFC 3986's path and query characters: hyper's path decides (it refuses what
        // its URI parser does not take), so that both paths agree on every target they accept
        return ReqParse::Fallback;
    }
    let headers: &[httparse::Header<'_>] = req.headers;
    let (mut n_cl, mut n_te) = (0u32, 0u32);
    for h in headers {
        let n = h.name.as_bytes();
        if n.len() == 14 && n.eq_ignore_ascii_case(b"content-length") {
            n_cl += 1;
        } else if n.len() == 17 && n.eq_ignore_ascii_case(b"transfer-encoding") {
            n_te += 1;
        }
    }
    if n_te > 1 || (n_te > 0 && n_cl > 0) {
        return ReqParse::Refuse;
    }
    let mut conn = ConnFlags::default();
    let mut body_len: Option<u64> = None;
    let mut has_host = false;
    let mut hash_value = None;
    let mut head = ReqHead {
        head_len,
        body_len: 0,
        http10: version == 0,
        keep_alive: false,
        method: match method {
            "HEAD" => MethodKind::Head,
            m if super::idempotent(m.as_bytes()) => MethodKind::Idempotent,
            _ => MethodKind::Other,
        },
        path: (0, 0),
        hash_value: None,
        has_host: false,
        host: None,
        target: (0, 0),
        action: 0,
        req_id: None,
        xff: [(0, 0); MAX_PREV],
        n_xff: 0,
        fwd: [(0, 0); MAX_PREV],
        n_fwd: 0,
    };
    for h in headers {
        let n = h.name.as_bytes();
        match n.len() {
            4 if n.eq_ignore_ascii_case(b"host") => {
                if has_host || !super::valid_host(h.value) {
                    return ReqParse::Fallback; // refused on hyper's path
                }
                has_host = true;
                head.host = Some(range_of(buf, h.value));
            }
            10 if n.eq_ignore_ascii_case(b"connection") => conn.add(h.value),
            14 if n.eq_ignore_ascii_case(b"content-length") => {
                match (parse_length(h.value.trim_ascii()), body_len) {
                    (Some(l), None) => body_len = Some(l),
                    _ => return ReqParse::Fallback, // invalid or repeated
                }
            }
            6 if n.eq_ignore_ascii_case(b"expect") => return ReqParse::Fallback,
            7 if n.eq_ignore_ascii_case(b"upgrade") => return ReqParse::Fallback,
            17 if n.eq_ignore_ascii_case(b"transfer-encoding") => return ReqParse::Fallback,
            15 if n.eq_ignore_ascii_case(b"x-forwarded-for") => {
                if head.n_xff as usize == MAX_PREV {
                    return ReqParse::Fallback;
                }
                head.xff[head.n_xff as usize] = range_of(buf, h.value);
                head.n_xff += 1;
            }
            9 if n.eq_ignore_ascii_case(b"forwarded") => {
                if head.n_fwd as usize == MAX_PREV {
                    return ReqParse::Fallback;
                }
                head.fwd[head.n_fwd as usize] = range_of(buf, h.value);
                head.n_fwd += 1;
            }
            _ => {}
        }
        if hash_value.is_none() && hash_header.is_some_and(|k| k.eq_ignore_ascii_case(h.name)) {
            hash_value = Some(range_of(buf, h.value));
        }
    }
    if conn.upgrade {
        return ReqParse::Fallback;
    }
    if !has_host && !head.http10 {
        return ReqParse::Fallback; // HTTP/1.1 without Host: refused on hyper's path
    }
    let t = range_of(buf, target.as_bytes());
    let path_len = target.find('?').unwrap_or(target.len()) as u32;
    head.path = (t.0, t.0 + path_len);
    head.target = t;
    head.body_len = body_len.unwrap_or(0);
    head.keep_alive = if head.http10 {
        conn.keep_alive && !conn.close
    } else {
        !conn.close
    };
    head.has_host = has_host;
    let mut rules = None;
    let mut rid_name: Option<&str> = None;
    if let Some((listener, pools)) = routing {
        let view = SliceView {
            host: head.host.map(|r| slice(buf, r)),
            path: slice(buf, head.path),
            method: method.as_bytes(),
            headers,
        };
        head.action = listener.route(&view);
        let action = listener.action(head.action);
        if let Some(name) = &listener.request_id {
            let mut given = headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name.as_str()));
            if let (Some(h), None) = (given.next(), given.next()) {
                if route::valid_request_id(h.value) {
                    head.req_id = Some(range_of(buf, h.value));
                }
            }
            rid_name = Some(name.as_str());
        }
        let Some(pool) = action.pool.filter(|_| action.redirect.is_none()) else {
            return ReqParse::Ready(head); // answered by the balancer
        };
        if let HashKey::Header(k) = &pools[pool].settings.hash_key {
            hash_value = headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(k.as_str()))
                .map(|h| range_of(buf, h.value));
        }
        if action
            .request
            .add
            .iter()
            .any(|a| a.name == "x-forwarded-for" || a.name == "forwarded" || a.name == "x-forwarded-proto")
        {
            // a rule writes them (the balancer's own value goes after it; a rule's X-Forwarded-Proto
            // wins): hyper's path, where that is done once
            return ReqParse::Fallback;
        }
        rules = Some(&action.request).filter(|r| !r.delete.is_empty());
    }
    head.hash_value = hash_value;
    if let Some(r) = rules {
        // deleting them drops the incoming values; the balancer's own are added still (as on hyper's path)
        if r.deletes(b"x-forwarded-for") {
            head.n_xff = 0;
        }
        if r.deletes(b"forwarded") {
            head.n_fwd = 0;
        }
    }
    out.reserve(head_len + 128);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for h in headers {
        let n = h.name.as_bytes();
        if drop_header(n, conn, headers)
            || n.eq_ignore_ascii_case(b"x-forwarded-for")
            || n.eq_ignore_ascii_case(b"x-forwarded-proto")
            || n.eq_ignore_ascii_case(b"forwarded")
            || rules.is_some_and(|r| r.deletes(n))
            || rid_name.is_some_and(|r| r.len() == n.len() && r.as_bytes().eq_ignore_ascii_case(n))
        {
            continue;
        }
        out.extend_from_slice(n);
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    ReqParse::Ready(head)
}

fn joined(out: &mut Vec<u8>, name: &[u8], buf: &[u8], prev: &[Range], item: &[u8]) {
    if item.is_empty() {
        // nothing to add (a client on a Unix socket): the incoming values as they were
        if let Some((last, rest)) = prev.split_last() {
            out.extend_from_slice(name);
            for &r in rest {
                out.extend_from_slice(slice(buf, r));
                out.extend_from_slice(b", ");
            }
            out.extend_from_slice(slice(buf, *last));
            out.extend_from_slice(b"\r\n");
        }
        return;
    }
    out.extend_from_slice(name);
    for &r in prev {
        out.extend_from_slice(slice(buf, r));
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(item);
    out.extend_from_slice(b"\r\n");
}

/// Headers a route adds to a message, and the request id.
#[derive(Clone, Copy, Default)]
pub struct Edits<'a> {
    pub add: &'a [route::Added],
    /// The request id header: name and value.
    pub req_id: Option<(&'a str, &'a [u8])>,
    /// The client's address (`%[src]`).
    pub src: &'a [u8],
}

impl Edits<'_> {
    /// Append the added headers and the request id to a head being written.
    pub fn write(&self, out: &mut Vec<u8>) {
        let id = self.req_id.map_or(&b""[..], |(_, v)| v);
        for a in self.add {
            out.extend_from_slice(a.name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            a.render(out, id, self.src);
            out.extend_from_slice(b"\r\n");
        }
        if let Some((n, v)) = self.req_id {
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Complete the head written by [`parse_request`]: `Host` if the client sent
/// none, the forwarding headers, the blank line.
pub fn finish_request(
    out: &mut Vec<u8>,
    buf: &[u8],
    head: &ReqHead,
    xff: &[u8],
    forwarded: &[u8],
    host: &str,
) {
    finish_request_with(out, buf, head, xff, forwarded, host, &Edits::default())
}

/// [`finish_request`] with a route's added headers and the request id.
pub fn finish_request_with(
    out: &mut Vec<u8>,
    buf: &[u8],
    head: &ReqHead,
    xff: &[u8],
    forwarded: &[u8],
    host: &str,
    edits: &Edits<'_>,
) {
    edits.write(out);
    if !head.has_host {
        out.extend_from_slice(b"host: ");
        out.extend_from_slice(host.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    joined(
        out,
        b"x-forwarded-for: ",
        buf,
        &head.xff[..head.n_xff as usize],
        xff,
    );
    out.extend_from_slice(b"x-forwarded-proto: http\r\n");
    joined(
        out,
        b"forwarded: ",
        buf,
        &head.fwd[..head.n_fwd as usize],
        forwarded,
    );
    out.extend_from_slice(b"\r\n");
}
