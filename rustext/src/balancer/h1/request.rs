//! Request heads: parsed (httparse), decided on by the caller, and
//! rewritten for a backend.

use super::*;

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
    parse_request_with(buf, out, |_| Some(Routed { action: 0, request_id: None, forward: Some(Forward { hash_header, rules: None, rewrite: None }) }))
}

/// A parsed request head as the caller sees it to decide on it, while its
/// fields are at hand.
pub struct RawHead<'a, 'h> {
    /// The `Host` value, if any.
    pub host: Option<&'a [u8]>,
    /// The target's path, without the query.
    pub path: &'a [u8],
    pub method: &'a [u8],
    pub headers: &'h [httparse::Header<'a>],
}

impl<'a> RawHead<'a, '_> {
    /// Whether some field named `name` (any case) has a value passing `test`.
    pub fn header_any(&self, name: &[u8], test: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        self.headers
            .iter()
            .any(|h| h.name.len() == name.len() && h.name.as_bytes().eq_ignore_ascii_case(name) && test(h.value))
    }

    /// The first value of field `name` (any case).
    pub fn first(&self, name: &[u8]) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .find(|h| h.name.len() == name.len() && h.name.as_bytes().eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }
}

/// The caller's decision on a parsed head: how the codec goes on.
pub struct Routed<'r> {
    /// The caller's name for its decision, kept in [`ReqHead::action`].
    pub action: usize,
    /// The request id field: one valid incoming value is kept in
    /// [`ReqHead::req_id`]; the field never reaches the rewritten head.
    pub request_id: Option<&'r str>,
    /// How to rewrite the head for a backend; None: the caller answers
    /// itself (nothing is written).
    pub forward: Option<Forward<'r>>,
}

/// How to rewrite a head for a backend.
#[derive(Clone, Copy)]
pub struct Forward<'r> {
    /// The field whose value keys the backend choice ([`ReqHead::hash_value`]).
    pub hash_header: Option<&'r str>,
    /// Fields deleted from the incoming head (their additions are the
    /// caller's [`Edits`] at [`finish_request_with`]).
    pub rules: Option<&'r Rules>,
    /// The target's rewrite, if the route has one.
    pub rewrite: Option<&'r dyn TargetRewrite>,
}

/// A change of the request target, decided elsewhere (routing).
pub trait TargetRewrite: Sync {
    /// Write the new target for `target` to `out`; false: the result is
    /// invalid (this path does not forward it: [`ReqParse::Fallback`]).
    fn rewrite(&self, target: &[u8], out: &mut Vec<u8>) -> bool;
}

/// Parse a request head from `buf`; `decide` sees it parsed (None: not for
/// this path, [`ReqParse::Fallback`]) and says how to write its backend form
/// into `out` (cleared first): request line and kept headers, without the
/// final forwarding headers and blank line (see [`finish_request_with`]).
pub fn parse_request_with<'r>(
    buf: &[u8],
    out: &mut Vec<u8>,
    decide: impl FnOnce(&RawHead<'_, '_>) -> Option<Routed<'r>>,
) -> ReqParse {
    parse(buf, decide, out)
}

fn parse<'r>(
    buf: &[u8],
    decide: impl FnOnce(&RawHead<'_, '_>) -> Option<Routed<'r>>,
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
    let view = RawHead {
        host: head.host.map(|r| slice(buf, r)),
        path: slice(buf, head.path),
        method: method.as_bytes(),
        headers,
    };
    let Some(routed) = decide(&view) else {
        return ReqParse::Fallback;
    };
    head.action = routed.action;
    let rid_name = routed.request_id;
    if let Some(name) = rid_name {
        let mut given = headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name));
        if let (Some(h), None) = (given.next(), given.next()) {
            if valid_request_id(h.value) {
                head.req_id = Some(range_of(buf, h.value));
            }
        }
    }
    let Some(forward) = routed.forward else {
        return ReqParse::Ready(head); // answered by the caller
    };
    if let Some(k) = forward.hash_header {
        head.hash_value = view.first(k.as_bytes()).map(|v| range_of(buf, v));
    }
    let rules = forward.rules.filter(|r| !r.delete.is_empty());
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
    match forward.rewrite {
        // an invalid result: hyper's path answers it (the same check, the same answer)
        Some(rw) => {
            if !rw.rewrite(target.as_bytes(), out) {
                return ReqParse::Fallback;
            }
        }
        None => out.extend_from_slice(target.as_bytes()),
    }
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
