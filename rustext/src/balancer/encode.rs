//! Response compression, the decision (sans-I/O): which coding a client
//! accepts (`Accept-Encoding`, RFC 9110 §12.5.3), whether a response may be
//! compressed at all, and the header edits when it is. Pure functions over
//! header values; the streaming encoder is [`super::compress`]'s.
//!
//! Among codings of equal weight the server's preference wins: the order
//! of the configuration's `algorithms` (by default zstd, br, gzip — the
//! smallest output for the CPU first). `*` stands for every coding not
//! named; `identity;q=0` (or `*;q=0`) without an acceptable coding still
//! gets the identity body, as nginx and Caddy send (a 406 helps no one).

use http::{header, HeaderMap, HeaderValue, StatusCode};

/// A content coding the balancer produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coding {
    Zstd,
    Br,
    Gzip,
}

impl Coding {
    pub fn token(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Br => "br",
            Coding::Gzip => "gzip",
        }
    }

    /// The configuration's names (`gzip`, `br`, `zstd`).
    pub fn parse(name: &str) -> Option<Coding> {
        match name {
            "zstd" => Some(Coding::Zstd),
            "br" => Some(Coding::Br),
            "gzip" => Some(Coding::Gzip),
            _ => None,
        }
    }

    fn matches(self, token: &[u8]) -> bool {
        token.eq_ignore_ascii_case(self.token().as_bytes())
            || (self == Coding::Gzip && token.eq_ignore_ascii_case(b"x-gzip"))
    }
}

/// A route's (or listener's) compression, compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The codings offered with their levels, in the server's order of preference.
    pub codings: Vec<(Coding, u32)>,
    /// Media types compressed: `type/subtype` exact, or `type/*`; lower case.
    pub types: Vec<String>,
    /// A response whose `Content-Length` is below this is sent as it is.
    pub min_length: u64,
}

/// At most this many elements of `Accept-Encoding` are read: a hostile
/// value costs a bounded amount of work (browsers send four or five).
const MAX_ELEMENTS: usize = 64;

/// A weight in thousandths (RFC 9110 §12.4.2: `0`, `1`, up to three
/// decimals); None when malformed.
fn qvalue(v: &[u8]) -> Option<u16> {
    let (int, frac) = match v.iter().position(|&b| b == b'.') {
        Some(i) => (&v[..i], &v[i + 1..]),
        None => (v, &b""[..]),
    };
    if int.len() != 1 || frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut thousandths = 0u16;
    for i in 0..3 {
        thousandths = thousandths * 10 + frac.get(i).map_or(0, |d| u16::from(d - b'0'));
    }
    match int[0] {
        b'0' => Some(thousandths),
        b'1' if thousandths == 0 => Some(1000),
        _ => None,
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

fn is_token(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter().all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The elements of `Accept-Encoding` (all its fields): `(coding, weight in
/// thousandths)`. A malformed element (bad token, bad weight) is skipped,
/// the others still count.
pub fn parse_accept<'a>(fields: impl IntoIterator<Item = &'a [u8]>) -> Vec<(&'a [u8], u16)> {
    let mut out = Vec::new();
    for field in fields {
        for element in field.split(|&b| b == b',') {
            if out.len() == MAX_ELEMENTS {
                return out;
            }
            let mut parts = element.split(|&b| b == b';');
            let coding = trim(parts.next().unwrap_or_default());
            if coding.is_empty() {
                continue; // empty list elements are allowed (RFC 9110 §5.6.1)
            }
            if !is_token(coding) {
                continue;
            }
            let mut q = Some(1000);
            for param in parts {
                let param = trim(param);
                match param.iter().position(|&b| b == b'=') {
                    Some(i) if trim(&param[..i]).eq_ignore_ascii_case(b"q") => q = qvalue(trim(&param[i + 1..])),
                    // other parameters are not defined for codings: ignored
                    _ => {}
                }
            }
            if let Some(q) = q {
                out.push((coding, q));
            }
        }
    }
    out
}

/// The coding to send among `offered` (in the server's order of
/// preference), or None for the identity body. No `Accept-Encoding` at
/// all gets the identity body too, as every server does.
pub fn choose<'a>(fields: impl IntoIterator<Item = &'a [u8]>, offered: &[(Coding, u32)]) -> Option<(Coding, u32)> {
    let accept = parse_accept(fields);
    let star = accept.iter().filter(|(c, _)| *c == b"*").map(|&(_, q)| q).max();
    let mut best: Option<((Coding, u32), u16)> = None;
    for &(coding, level) in offered {
        // the highest weight given to the coding's own name, else `*`'s
        let own = accept.iter().filter(|(c, _)| coding.matches(c)).map(|&(_, q)| q).max();
        let q = own.or(star).unwrap_or(0);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some(((coding, level), q));
        }
    }
    best.map(|(c, _)| c)
}

/// What the request says about compressing its response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asked {
    /// The coding the client accepts best, if any.
    pub coding: Option<(Coding, u32)>,
    /// HEAD or a `Range` request: never compressed.
    pub excluded: bool,
}

/// Read the request's side: its method, `Range` and `Accept-Encoding`.
pub fn asked(policy: &Policy, method: &[u8], headers: &HeaderMap) -> Asked {
    let excluded = method.eq_ignore_ascii_case(b"HEAD") || headers.contains_key(header::RANGE);
    let coding = if excluded {
        None
    } else {
        choose(headers.get_all(header::ACCEPT_ENCODING).iter().map(HeaderValue::as_bytes), &policy.codings)
    };
    Asked { coding, excluded }
}

/// What to do with one response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Not a compressible response: sent as it is.
    AsIs,
    /// Compressible, but not for this client: sent as it is, with `Vary: Accept-Encoding`.
    Vary,
    /// Compressed with this coding and level.
    Compress(Coding, u32),
}

/// The media type of a `Content-Type` value, lower case, parameters cut.
fn media_type(v: &[u8]) -> Vec<u8> {
    let end = v.iter().position(|&b| b == b';').unwrap_or(v.len());
    trim(&v[..end]).to_ascii_lowercase()
}

/// Whether `types` allows this media type: `type/subtype` exactly, or a
/// pattern with one `*` (`text/*`, `application/*+json`). An event stream
/// (`text/event-stream`) only when named by itself: `text/*` does not
/// take it (long-lived, its events must arrive as they are sent). gRPC
/// never, whatever the list says.
pub fn type_allowed(types: &[String], content_type: &[u8]) -> bool {
    let m = media_type(content_type);
    if m.starts_with(b"application/grpc") {
        return false; // gRPC frames its messages (and compresses them) itself
    }
    if m == b"text/event-stream" {
        return types.iter().any(|t| t == "text/event-stream");
    }
    types.iter().any(|t| match t.split_once('*') {
        Some((prefix, suffix)) => {
            m.len() > prefix.len() + suffix.len() && m.starts_with(prefix.as_bytes()) && m.ends_with(suffix.as_bytes())
        }
        None => m == t.as_bytes(),
    })
}

fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|t| {
                let t = trim(t);
                let t = &t[..t.iter().position(|&b| b == b'=').unwrap_or(t.len())];
                t.eq_ignore_ascii_case(token.as_bytes())
            })
    })
}

/// Whether and how a response is compressed, from the request's side
/// ([`asked`]) and the response's status and headers.
pub fn plan(policy: &Policy, asked: Asked, status: StatusCode, headers: &HeaderMap) -> Plan {
    let s = status.as_u16();
    if asked.excluded
        || s < 200
        || s == 204
        || s == 206
        || s == 304
        || headers.contains_key(header::CONTENT_RANGE)
    {
        return Plan::AsIs;
    }
    let encoded = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !trim(v.as_bytes()).eq_ignore_ascii_case(b"identity"));
    if encoded || has_token(headers, header::CACHE_CONTROL, "no-transform") {
        return Plan::AsIs;
    }
    match headers.get(header::CONTENT_TYPE) {
        Some(t) if type_allowed(&policy.types, t.as_bytes()) => {}
        _ => return Plan::AsIs,
    }
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if length.is_some_and(|n| n == 0 || n < policy.min_length) {
        return Plan::Vary; // another (longer) response of the same resource may be compressed
    }
    match asked.coding {
        Some((coding, level)) => Plan::Compress(coding, level),
        None => Plan::Vary,
    }
}

/// `Vary` with `Accept-Encoding` in it (merged into an existing `Vary`;
/// `Vary: *` says it all already).
pub fn add_vary(headers: &mut HeaderMap) {
    if has_token(headers, header::VARY, "accept-encoding") || has_token(headers, header::VARY, "*") {
        return;
    }
    let mut merged: Vec<u8> = Vec::new();
    for v in headers.get_all(header::VARY) {
        let v = trim(v.as_bytes());
        if !v.is_empty() {
            merged.extend_from_slice(v);
            merged.extend_from_slice(b", ");
        }
    }
    merged.extend_from_slice(b"Accept-Encoding");
    if let Ok(v) = HeaderValue::from_bytes(&merged) {
        headers.insert(header::VARY, v);
    }
}

/// The header edits of a response compressed with `coding`: its
/// `Content-Encoding`, no length (the encoder's output is framed by the
/// connection), `Vary`, a weak `ETag` (the bytes differ, the meaning does
/// not) and no `Accept-Ranges` (ranges of the coded body are not served).
pub fn edit(headers: &mut HeaderMap, coding: Coding) {
    headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding.token()));
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::ACCEPT_RANGES);
    add_vary(headers);
    if let Some(tag) = headers.get(header::ETAG) {
        let t = tag.as_bytes();
        if !t.starts_with(b"W/") {
            let mut weak = Vec::with_capacity(t.len() + 2);
            weak.extend_from_slice(b"W/");
            weak.extend_from_slice(t);
            if let Ok(v) = HeaderValue::from_bytes(&weak) {
                headers.insert(header::ETAG, v);
            }
        }
    }
}

#[cfg(test)]
mod tests;
