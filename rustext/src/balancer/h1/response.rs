//! Response heads: a backend's parsed and rewritten for the client; our own answers.

use std::io::Write;

use super::*;

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
    parse_response_with(buf, client, out, None, &Edits::default())
}

/// [`parse_response`], deleting the fields `rules` delete and adding `edits`.
pub fn parse_response_with(
    buf: &[u8],
    client: ClientView,
    out: &mut Vec<u8>,
    rules: Option<&Rules>,
    edits: &Edits<'_>,
) -> RespParse {
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
            || rules.is_some_and(|r| r.deletes(n))
            || edits.req_id.is_some_and(|(r, _)| r.len() == n.len() && r.as_bytes().eq_ignore_ascii_case(n))
        {
            continue;
        }
        out.extend_from_slice(n);
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    edits.write(out);
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
    simple_response_with(out, status, reason, body, client, &Edits::default())
}

/// [`simple_response`] with the request id (`edits`).
pub fn simple_response_with(
    out: &mut Vec<u8>,
    status: u16,
    reason: &str,
    body: &str,
    client: ClientView,
    edits: &Edits<'_>,
) {
    out.clear();
    let _ = write!(
        out,
        "{} {status} {reason}\r\ncontent-type: text/plain\r\ncache-control: no-store\r\ncontent-length: {}\r\n",
        if client.http10 { "HTTP/1.0" } else { "HTTP/1.1" },
        body.len()
    );
    end_own_head(out, body.as_bytes(), client, edits);
}

/// The end of an answer of the balancer's own: `edits`, the connection's
/// fate, the blank line, and `body` (not for HEAD).
fn end_own_head(out: &mut Vec<u8>, body: &[u8], client: ClientView, edits: &Edits<'_>) {
    edits.write(out);
    if !client.keep_alive || client.closing {
        out.extend_from_slice(b"connection: close\r\n");
    } else if client.http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !client.head_request {
        out.extend_from_slice(body);
    }
}

/// An answer of the balancer's own with a configured page (`[error_pages]`)
/// instead of its one-line text, in `out`.
pub fn page_response_with(
    out: &mut Vec<u8>,
    page: Page<'_>,
    reason: &str,
    client: ClientView,
    edits: &Edits<'_>,
) {
    out.clear();
    let _ = write!(out, "{} {} {reason}\r\n", if client.http10 { "HTTP/1.0" } else { "HTTP/1.1" }, page.status);
    for (n, v) in page.headers {
        out.extend_from_slice(n.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let _ = write!(out, "content-length: {}\r\n", page.body.len());
    end_own_head(out, page.body, client, edits);
}

/// A configured page as the codec writes it: status, fields, body.
#[derive(Clone, Copy)]
pub struct Page<'a> {
    pub status: u16,
    pub headers: &'a [(http::HeaderName, http::HeaderValue)],
    pub body: &'a [u8],
}

/// A redirect of the balancer's own, in `out`: `location` writes the
/// `Location` value; `edits` adds the request id.
pub fn redirect_response(
    out: &mut Vec<u8>,
    (code, reason): (u16, &str),
    location: impl FnOnce(&mut Vec<u8>),
    client: ClientView,
    edits: &Edits<'_>,
) {
    out.clear();
    let _ = write!(
        out,
        "{} {code} {reason}\r\nlocation: ",
        if client.http10 { "HTTP/1.0" } else { "HTTP/1.1" },
    );
    location(out);
    out.extend_from_slice(b"\r\ncache-control: no-store\r\ncontent-length: 0\r\n");
    edits.write(out);
    if !client.keep_alive || client.closing {
        out.extend_from_slice(b"connection: close\r\n");
    } else if client.http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}
