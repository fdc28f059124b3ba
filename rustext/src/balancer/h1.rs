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

use std::io::Write;

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
    Ready(ReqHead),
}

/// Parse a request head from `buf` and write its backend form into `out`
/// (cleared first): request line and kept headers, without the final
/// forwarding headers and blank line (see [`finish_request`]).
pub fn parse_request(buf: &[u8], hash_header: Option<&str>, out: &mut Vec<u8>) -> ReqParse {
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
    if version > 1
        || !target.starts_with('/')
        || !target
            .bytes()
            .all(|c| (0x21..0x7f).contains(&c) && c != b'#')
    {
        return ReqParse::Fallback;
    }
    let headers: &[httparse::Header<'_>] = req.headers;
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
            "GET" | "OPTIONS" | "TRACE" | "PUT" | "DELETE" => MethodKind::Idempotent,
            _ => MethodKind::Other,
        },
        path: (0, 0),
        hash_value: None,
        has_host: false,
        xff: [(0, 0); MAX_PREV],
        n_xff: 0,
        fwd: [(0, 0); MAX_PREV],
        n_fwd: 0,
    };
    for h in headers {
        let n = h.name.as_bytes();
        match n.len() {
            4 if n.eq_ignore_ascii_case(b"host") => has_host = true,
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
        {
            continue;
        }
        out.extend_from_slice(n);
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    let t = range_of(buf, target.as_bytes());
    let path_len = target.find('?').unwrap_or(target.len()) as u32;
    head.path = (t.0, t.0 + path_len);
    head.body_len = body_len.unwrap_or(0);
    head.keep_alive = if head.http10 {
        conn.keep_alive && !conn.close
    } else {
        !conn.close
    };
    head.has_host = has_host;
    head.hash_value = hash_value;
    ReqParse::Ready(head)
}

fn joined(out: &mut Vec<u8>, name: &[u8], buf: &[u8], prev: &[Range], item: &[u8]) {
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

/// How the response body is carried from the backend to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyMode {
    /// No body (HEAD, 204, 304).
    Empty,
    /// `Content-Length`, passed through.
    Length(u64),
    /// Chunked from the backend, passed through as is (HTTP/1.1 client).
    ChunkedPass,
    /// Chunked from the backend, decoded, close-delimited (HTTP/1.0 client).
    Dechunk,
    /// Close-delimited from the backend, chunk-encoded (HTTP/1.1 client).
    Chunk,
    /// Close-delimited both ways (HTTP/1.0 client).
    Raw,
}

/// What the client side of the exchange looks like.
#[derive(Clone, Copy, Debug)]
pub struct ClientView {
    pub http10: bool,
    pub keep_alive: bool,
    pub head_request: bool,
    /// The balancer is closing the connection after this exchange (drain).
    pub closing: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct RespHead {
    pub head_len: usize,
    pub status: u16,
    pub mode: BodyMode,
    /// The backend connection may be reused after the body.
    pub backend_keep_alive: bool,
    /// The client connection stays open after the body.
    pub client_keep_alive: bool,
}

#[derive(Debug)]
pub enum RespParse {
    Partial,
    /// An interim 1xx response of this many bytes: skipped.
    Interim(usize),
    Invalid,
    Ready(RespHead),
}

/// Parse a backend's response head and write the client's into `out` (cleared first).
pub fn parse_response(buf: &[u8], client: ClientView, out: &mut Vec<u8>) -> RespParse {
    out.clear();
    let mut hs = [httparse::EMPTY_HEADER; MAX_RESP_HEADERS];
    let mut resp = httparse::Response::new(&mut hs);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return RespParse::Partial,
        Err(_) => return RespParse::Invalid,
    };
    let (Some(version), Some(status)) = (resp.version, resp.code) else {
        return RespParse::Invalid;
    };
    if status == 101 {
        return RespParse::Invalid; // never asked for
    }
    if (100..200).contains(&status) {
        return RespParse::Interim(head_len);
    }
    let headers: &[httparse::Header<'_>] = resp.headers;
    let mut conn = ConnFlags::default();
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut te = false;
    for h in headers {
        let n = h.name.as_bytes();
        if n.eq_ignore_ascii_case(b"connection") {
            conn.add(h.value);
        } else if n.eq_ignore_ascii_case(b"content-length") {
            match (parse_length(h.value.trim_ascii()), length) {
                (Some(l), None) => length = Some(l),
                (Some(l), Some(p)) if l == p => {}
                _ => return RespParse::Invalid,
            }
        } else if n.eq_ignore_ascii_case(b"transfer-encoding") {
            te = true;
            // Only the last coding decides the framing.
            chunked = tokens(h.value)
                .last()
                .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
        }
    }
    let no_body = client.head_request || status == 204 || status == 304;
    let framing_close;
    let mode = if no_body {
        framing_close = false;
        BodyMode::Empty
    } else if te {
        framing_close = !chunked;
        match (chunked, client.http10) {
            (true, false) => BodyMode::ChunkedPass,
            (true, true) => BodyMode::Dechunk,
            (false, false) => BodyMode::Chunk,
            (false, true) => BodyMode::Raw,
        }
    } else if let Some(l) = length {
        framing_close = false;
        BodyMode::Length(l)
    } else {
        framing_close = true;
        if client.http10 {
            BodyMode::Raw
        } else {
            BodyMode::Chunk
        }
    };
    let backend_keep_alive = !framing_close
        && if version == 0 {
            conn.keep_alive && !conn.close
        } else {
            !conn.close
        };
    let client_keep_alive =
        client.keep_alive && !client.closing && !matches!(mode, BodyMode::Dechunk | BodyMode::Raw);
    out.reserve(head_len + 64);
    out.extend_from_slice(if client.http10 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    let _ = write!(out, "{status:03} ");
    out.extend_from_slice(resp.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let drop_length = matches!(
        mode,
        BodyMode::ChunkedPass | BodyMode::Dechunk | BodyMode::Chunk | BodyMode::Raw
    );
    for h in headers {
        let n = h.name.as_bytes();
        if drop_header(n, conn, headers)
            || (drop_length && n.eq_ignore_ascii_case(b"content-length"))
        {
            continue;
        }
        out.extend_from_slice(n);
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    if matches!(mode, BodyMode::ChunkedPass | BodyMode::Chunk) {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if !client_keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if client.http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    RespParse::Ready(RespHead {
        head_len,
        status,
        mode,
        backend_keep_alive,
        client_keep_alive,
    })
}

/// A response of the balancer's own (errors), in `out`.
pub fn simple_response(
    out: &mut Vec<u8>,
    status: u16,
    reason: &str,
    body: &str,
    client: ClientView,
) {
    out.clear();
    let _ = write!(
        out,
        "{} {status} {reason}\r\ncontent-type: text/plain\r\ncache-control: no-store\r\ncontent-length: {}\r\n",
        if client.http10 { "HTTP/1.0" } else { "HTTP/1.1" },
        body.len()
    );
    if !client.keep_alive || client.closing {
        out.extend_from_slice(b"connection: close\r\n");
    } else if client.http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !client.head_request {
        out.extend_from_slice(body.as_bytes());
    }
}

/// The chunk framing of `n` data bytes.
pub fn chunk_header(out: &mut Vec<u8>, n: usize) {
    let _ = write!(out, "{n:x}\r\n");
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Size,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    LastLf,
    Done,
}

/// Follows a chunked body: where it ends, and (optionally) its data.
#[derive(Clone, Debug)]
pub struct Chunks {
    st: St,
    size: u64,
    digits: u8,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ChunkError;

impl Default for Chunks {
    fn default() -> Self {
        Chunks {
            st: St::Size,
            size: 0,
            digits: 0,
        }
    }
}

impl Chunks {
    pub fn done(&self) -> bool {
        self.st == St::Done
    }

    /// Consume framing and data from `input` up to the end of the body;
    /// `data` receives the body's bytes. Returns the bytes consumed (less
    /// than `input.len()` only once done).
    pub fn feed(&mut self, input: &[u8], mut data: impl FnMut(&[u8])) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < input.len() {
            let c = input[i];
            match self.st {
                St::Size => match c {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if self.digits >= 15 {
                            return Err(ChunkError);
                        }
                        let d = (c as char).to_digit(16).unwrap_or(0) as u64;
                        self.size = self.size * 16 + d;
                        self.digits += 1;
                    }
                    b';' | b' ' | b'\t' if self.digits > 0 => self.st = St::Ext,
                    b'\r' if self.digits > 0 => self.st = St::SizeLf,
                    b'\n' if self.digits > 0 => self.after_size(),
                    _ => return Err(ChunkError),
                },
                St::Ext => match c {
                    b'\r' => self.st = St::SizeLf,
                    b'\n' => self.after_size(),
                    _ => {}
                },
                St::SizeLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.after_size();
                }
                St::Data => {
                    let n = (self.size as usize).min(input.len() - i);
                    data(&input[i..i + n]);
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.st = St::DataCr;
                    }
                    continue;
                }
                St::DataCr => match c {
                    b'\r' => self.st = St::DataLf,
                    b'\n' => self.st = St::Size,
                    _ => return Err(ChunkError),
                },
                St::DataLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.st = St::Size;
                }
                St::TrailerStart => match c {
                    b'\r' => self.st = St::LastLf,
                    b'\n' => {
                        self.st = St::Done;
                        return Ok(i + 1);
                    }
                    _ => self.st = St::TrailerLine,
                },
                St::TrailerLine => {
                    if c == b'\n' {
                        self.st = St::TrailerStart;
                    }
                }
                St::LastLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.st = St::Done;
                    return Ok(i + 1);
                }
                St::Done => return Ok(i),
            }
            i += 1;
        }
        Ok(i)
    }

    fn after_size(&mut self) {
        self.digits = 0;
        self.st = if self.size == 0 {
            St::TrailerStart
        } else {
            St::Data
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ready(buf: &[u8], hash: Option<&str>) -> (ReqHead, Vec<u8>) {
        let mut out = Vec::new();
        match parse_request(buf, hash, &mut out) {
            ReqParse::Ready(h) => (h, out),
            other => panic!("{other:?}"),
        }
    }

    fn finished(buf: &[u8]) -> String {
        let (h, mut out) = ready(buf, None);
        finish_request(
            &mut out,
            buf,
            &h,
            b"10.0.0.2",
            b"for=10.0.0.2;proto=http",
            "be:80",
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn rewrites_request_head() {
        let raw = b"GET /a?b=1 HTTP/1.1\r\nHost: ex\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nTE: trailers\r\nKeep-Alive: 5\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-Proto: https\r\nAccept: */*\r\n\r\nNEXT";
        let (h, _) = ready(raw, None);
        assert_eq!(h.head_len, raw.len() - 4);
        assert!(h.keep_alive && !h.http10 && h.has_host);
        assert_eq!(slice(raw, h.path), b"/a");
        assert_eq!(
            finished(raw),
            "GET /a?b=1 HTTP/1.1\r\nHost: ex\r\nAccept: */*\r\nx-forwarded-for: 1.1.1.1, 10.0.0.2\r\n\
             x-forwarded-proto: http\r\nforwarded: for=10.0.0.2;proto=http\r\n\r\n"
        );
    }

    #[test]
    fn http10_and_host() {
        let raw = b"GET / HTTP/1.0\r\n\r\n";
        let (h, _) = ready(raw, None);
        assert!(h.http10 && !h.keep_alive && !h.has_host);
        assert!(finished(raw).contains("\r\nhost: be:80\r\n"));
        let (h, _) = ready(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", None);
        assert!(h.keep_alive);
        let (h, _) = ready(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", None);
        assert!(!h.keep_alive);
    }

    #[test]
    fn forwarded_lists_and_hash_header() {
        let raw = b"POST /x HTTP/1.1\r\nX-User: bob\r\nForwarded: for=1.1.1.1\r\nx-forwarded-for: a\r\nX-Forwarded-For: b\r\nContent-Length: 3\r\n\r\nabc";
        let (h, _) = ready(raw, Some("x-user"));
        assert_eq!(h.body_len, 3);
        assert_eq!(h.method, MethodKind::Other);
        assert_eq!(slice(raw, h.hash_value.unwrap()), b"bob");
        let s = finished(raw);
        assert!(s.contains("x-forwarded-for: a, b, 10.0.0.2\r\n"), "{s}");
        assert!(
            s.contains("forwarded: for=1.1.1.1, for=10.0.0.2;proto=http\r\n"),
            "{s}"
        );
        assert!(s.contains("Content-Length: 3\r\n"));
    }

    #[test]
    fn fallbacks_and_partials() {
        let mut out = Vec::new();
        for raw in [
            &b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nConnection: Upgrade\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\n\r\n",
            b"GET /a#b HTTP/1.1\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"G@T / HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(parse_request(raw, None, &mut out), ReqParse::Fallback),
                "{raw:?}"
            );
        }
        assert!(matches!(
            parse_request(b"GET / HTTP/1.1\r\nHost: a\r\n", None, &mut out),
            ReqParse::Partial
        ));
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..MAX_HEADERS + 1 {
            many.extend_from_slice(format!("x-{i}: 1\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(matches!(
            parse_request(&many, None, &mut out),
            ReqParse::Fallback
        ));
    }

    const C11: ClientView = ClientView {
        http10: false,
        keep_alive: true,
        head_request: false,
        closing: false,
    };
    const C10: ClientView = ClientView {
        http10: true,
        keep_alive: false,
        head_request: false,
        closing: false,
    };

    fn resp(raw: &[u8], c: ClientView) -> (RespHead, String) {
        let mut out = Vec::new();
        match parse_response(raw, c, &mut out) {
            RespParse::Ready(h) => (h, String::from_utf8(out).unwrap()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn response_modes() {
        let (h, s) = resp(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nKeep-Alive: timeout=5\r\nServer: x\r\n\r\nhello", C11);
        assert_eq!(
            (h.mode, h.backend_keep_alive, h.client_keep_alive),
            (BodyMode::Length(5), true, true)
        );
        assert_eq!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nServer: x\r\n\r\n"
        );
        let (h, s) = resp(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            C11,
        );
        assert_eq!(h.mode, BodyMode::ChunkedPass);
        assert!(s.contains("transfer-encoding: chunked\r\n"));
        let (h, s) = resp(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n",
            C10,
        );
        assert_eq!((h.mode, h.client_keep_alive), (BodyMode::Dechunk, false));
        assert!(
            s.starts_with("HTTP/1.0 200 OK\r\n")
                && !s.contains("chunked")
                && !s.contains("Content-Length"),
            "{s}"
        );
        assert!(s.contains("connection: close\r\n"));
        let (h, s) = resp(b"HTTP/1.0 200 OK\r\n\r\n", C11);
        assert_eq!((h.mode, h.backend_keep_alive), (BodyMode::Chunk, false));
        assert!(s.contains("transfer-encoding: chunked"));
        let (h, _) = resp(b"HTTP/1.0 200 OK\r\n\r\n", C10);
        assert_eq!(h.mode, BodyMode::Raw);
        let (h, s) = resp(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            ClientView {
                keep_alive: true,
                ..C10
            },
        );
        assert!(h.client_keep_alive && s.contains("connection: keep-alive\r\n"));
        let (h, _) = resp(
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
            C11,
        );
        assert_eq!(h.mode, BodyMode::Empty);
        let (h, _) = resp(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
            ClientView {
                head_request: true,
                ..C11
            },
        );
        assert_eq!((h.mode, h.backend_keep_alive), (BodyMode::Empty, false));
        let mut out = Vec::new();
        assert!(matches!(
            parse_response(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1", C11, &mut out),
            RespParse::Interim(25)
        ));
        assert!(matches!(
            parse_response(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                C11,
                &mut out
            ),
            RespParse::Invalid
        ));
        assert!(matches!(
            parse_response(b"HTTP/1.1 101 Switching\r\n\r\n", C11, &mut out),
            RespParse::Invalid
        ));
    }

    #[test]
    fn chunks_end_and_data() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let mut c = Chunks::default();
        let mut data = Vec::new();
        let n = c.feed(body, |d| data.extend_from_slice(d)).unwrap();
        assert!(c.done());
        assert_eq!(&body[n..], b"NEXT");
        assert_eq!(data, b"hello world");
        assert!(Chunks::default().feed(b"x\r\n", |_| {}).is_err());
        assert!(Chunks::default().feed(b"1\r\nab", |_| {}).is_err());
        assert!(Chunks::default()
            .feed(b"ffffffffffffffff\r\n", |_| {})
            .is_err());
    }

    fn chunked(parts: &[Vec<u8>], trailer: bool) -> Vec<u8> {
        let mut v = Vec::new();
        for p in parts.iter().filter(|p| !p.is_empty()) {
            chunk_header(&mut v, p.len());
            v.extend_from_slice(p);
            v.extend_from_slice(b"\r\n");
        }
        v.extend_from_slice(if trailer {
            b"0\r\nX-T: 1\r\n\r\n"
        } else {
            b"0\r\n\r\n"
        });
        v
    }

    proptest! {
        #[test]
        fn chunks_any_split(parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..6),
                            trailer in any::<bool>(), cuts in proptest::collection::vec(0usize..2000, 0..8)) {
            let enc = chunked(&parts, trailer);
            let mut input = enc.clone();
            input.extend_from_slice(b"rest");
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (input.len() + 1)).collect();
            cuts.push(input.len());
            cuts.sort_unstable();
            let mut c = Chunks::default();
            let (mut data, mut pos) = (Vec::new(), 0);
            for cut in cuts {
                if cut <= pos || c.done() { continue; }
                let n = c.feed(&input[pos..cut], |d| data.extend_from_slice(d)).unwrap();
                pos += n;
            }
            prop_assert!(c.done());
            prop_assert_eq!(pos, enc.len());
            prop_assert_eq!(data, parts.concat());
        }

        #[test]
        fn chunks_never_panic(input in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Chunks::default().feed(&input, |_| {});
        }

        #[test]
        fn request_parser_never_panics_and_is_prefix_stable(input in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut out = Vec::new();
            let _ = parse_request(&input, Some("x-k"), &mut out);
        }

        #[test]
        fn request_rewrite_roundtrip(
            path in "/[a-z0-9/._~-]{0,20}(\\?[a-z0-9=&]{0,10})?",
            names in proptest::collection::vec("[a-z][a-z0-9-]{0,10}", 0..8),
            values in proptest::collection::vec("[ -~]{0,20}", 8),
            http10 in any::<bool>(),
            split in 0usize..400,
        ) {
            let mut raw = format!("GET {path} HTTP/1.{}\r\n", if http10 { 0 } else { 1 }).into_bytes();
            let mut kept = Vec::new();
            for (n, v) in names.iter().zip(&values) {
                let v = v.trim();
                raw.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
                let special = is_hop_by_hop(n.as_bytes()) || ["x-forwarded-for", "x-forwarded-proto", "forwarded",
                    "content-length", "expect", "upgrade", "host"].contains(&n.as_str());
                if !special && !names.iter().any(|n| n == "connection") { kept.push(format!("{n}: {v}\r\n")); }
            }
            raw.extend_from_slice(b"\r\n");
            let mut out = Vec::new();
            // Any prefix is partial; the whole head is ready (or a fallback for odd names).
            let cut = split % raw.len();
            prop_assert!(matches!(parse_request(&raw[..cut], None, &mut out), ReqParse::Partial));
            if let ReqParse::Ready(h) = parse_request(&raw, None, &mut out) {
                prop_assert_eq!(h.head_len, raw.len());
                prop_assert_eq!(h.http10, http10);
                finish_request(&mut out, &raw, &h, b"1.2.3.4", b"for=1.2.3.4;proto=http", "b:1");
                let s = String::from_utf8(out).unwrap();
                let expected_line = format!("GET {} HTTP/1.1\r\n", path);
                prop_assert!(s.starts_with(&expected_line));
                for k in kept { prop_assert!(s.contains(&k), "{} missing in {}", k, s); }
                prop_assert!(s.ends_with("x-forwarded-proto: http\r\nforwarded: for=1.2.3.4;proto=http\r\n\r\n"));
                // What we send parses back as one complete request.
                let mut hs = [httparse::EMPTY_HEADER; 32];
                let mut r = httparse::Request::new(&mut hs);
                prop_assert_eq!(r.parse(s.as_bytes()).unwrap(), httparse::Status::Complete(s.len()));
            }
        }

        #[test]
        fn response_parser_never_panics(input in proptest::collection::vec(any::<u8>(), 0..300), h10 in any::<bool>()) {
            let mut out = Vec::new();
            let _ = parse_response(&input, ClientView { http10: h10, ..C11 }, &mut out);
        }
    }
}
