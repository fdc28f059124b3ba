//! Sans-I/O HTTP/1 for the fast path: parse a request head (httparse) and
//! rewrite it for a backend, parse a backend's response head and rewrite it
//! for the client, and follow chunked bodies.
//!
//! Only the common exchange is handled here: origin-form targets, no body or
//! a `Content-Length` body, no `Upgrade`, no `Expect`, no request
//! `Transfer-Encoding`. Anything else is [`ReqParse::Fallback`]: the
//! connection goes to hyper, which handles (or rejects) every case.
//!
//! The rewrites follow the hyper path exactly: hop-by-hop headers (and those
//! named by `Connection`) removed, `X-Forwarded-For` / `Forwarded` appended
//! to, `X-Forwarded-Proto` replaced, `Host` kept (added only when missing),
//! HTTP/1.0 clients never see chunked encoding.
//!
//! Layout: `request` (request heads in, rewritten out), `response` (response
//! heads, our own answers), `chunks` (chunked bodies), `edits` (header edits
//! asked for by the caller), `tests`; the shared header helpers are here.
//!
//! The codec knows nothing of routes, pools or configuration: the caller
//! decides from a parsed head (see [`parse_request_with`]) and says how to
//! rewrite it.

mod chunks;
mod edits;
mod request;
mod response;
#[cfg(test)]
mod tests;

pub use chunks::{chunk_header, ChunkError, Chunks};
pub use edits::{valid_request_id, Added, Edits, Piece, Rules};
pub use request::{
    finish_request, finish_request_with, parse_request, parse_request_with, Forward, MethodKind, RawHead, Routed, ReqHead, ReqParse,
    TargetRewrite,
};
pub use response::{
    page_response_with, parse_response, parse_response_with, redirect_response, simple_response, simple_response_with, BodyMode, Page,
    ClientView, RespHead, RespParse,
};

/// Methods whose requests may be sent twice with the effect of once (RFC
/// 9110 §9.2.2), so a body-less one is replayed after a reset.
pub fn idempotent(method: &[u8]) -> bool {
    matches!(method, b"GET" | b"HEAD" | b"OPTIONS" | b"TRACE" | b"PUT" | b"DELETE")
}

/// `uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2): a reg-name or
/// IPv4 address (unreserved, pct-encoded, sub-delims), or an IP literal in
/// brackets; the port all digits. Empty is allowed (a target without an
/// authority). No userinfo, spaces or controls.
pub fn valid_host(h: &[u8]) -> bool {
    let (host, port) = if h.first() == Some(&b'[') {
        let Some(end) = h.iter().position(|&b| b == b']') else { return false };
        let lit = &h[1..end];
        if lit.is_empty() || !lit.iter().all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.') {
            return false;
        }
        match &h[end + 1..] {
            [] => (&h[..0], None),
            [b':', port @ ..] => (&h[..0], Some(port)),
            _ => return false,
        }
    } else {
        match h.iter().rposition(|&b| b == b':') {
            Some(i) => (&h[..i], Some(&h[i + 1..])),
            None => (h, None),
        }
    };
    let reg_name = host.iter().all(|&b| {
        b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(&b)
    });
    reg_name && port.is_none_or(|p| p.iter().all(u8::is_ascii_digit))
}

/// Headers parsed per request head; more goes to hyper (limit 100 there).
pub const MAX_HEADERS: usize = 64;
/// Headers accepted in a backend's response head.
pub const MAX_RESP_HEADERS: usize = 128;
/// Previous values of `X-Forwarded-For` / `Forwarded` joined (more: hyper).
const MAX_PREV: usize = 4;

type Range = (u32, u32);

fn range_of(buf: &[u8], s: &[u8]) -> Range {
    let start = s.as_ptr() as usize - buf.as_ptr() as usize;
    (start as u32, (start + s.len()) as u32)
}

#[inline]
pub fn slice(buf: &[u8], r: Range) -> &[u8] {
    &buf[r.0 as usize..r.1 as usize]
}

/// Hop-by-hop header names (RFC 9110 §7.6.1), lower-case.
fn is_hop_by_hop(n: &[u8]) -> bool {
    const HOP: [&[u8]; 9] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    ];
    HOP.iter().any(|h| h.eq_ignore_ascii_case(n))
}

/// Headers a `Connection` header cannot make hop-by-hop: they frame or
/// address the message itself, and dropping them would leave a backend (or
/// client) reading the body as the next message or a request without `Host`.
/// RFC 9110 §7.6.1 forbids senders to nominate such fields; a receiver that
/// obeyed anyway would be open to request smuggling.
pub(crate) fn never_nominated(n: &[u8]) -> bool {
    n.eq_ignore_ascii_case(b"host") || n.eq_ignore_ascii_case(b"content-length")
}

fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&c| c == b',')
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// What `Connection` headers say.
#[derive(Default, Clone, Copy)]
struct ConnFlags {
    close: bool,
    keep_alive: bool,
    upgrade: bool,
    /// Names other headers (to be removed as hop-by-hop).
    names_others: bool,
}

impl ConnFlags {
    fn add(&mut self, v: &[u8]) {
        for t in tokens(v) {
            if t.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if t.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            } else {
                if t.eq_ignore_ascii_case(b"upgrade") {
                    self.upgrade = true;
                }
                self.names_others = true;
            }
        }
    }
}

/// Whether header `name` is hop-by-hop, statically or by a `Connection` header.
fn drop_header(name: &[u8], conn: ConnFlags, headers: &[httparse::Header<'_>]) -> bool {
    if is_hop_by_hop(name) {
        return true;
    }
    conn.names_others
        && !never_nominated(name)
        && headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .any(|h| tokens(h.value).any(|t| t.eq_ignore_ascii_case(name.as_ref())))
}

fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, &d| n * 10 + (d - b'0') as u64))
}
