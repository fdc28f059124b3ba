//! juggler.0 envelope codec (shared/protocols/juggler.md), sans-I/O.
//!
//! - [`parse_client`] turns one client text frame into a [`ClientMsg`]; `args`
//!   is kept as raw JSON (validated, compacted and HTML-escaped exactly as the
//!   Go server re-encodes a `json.RawMessage`), never decoded into values.
//! - [`parse_server`] does the same for server frames (used by clients).
//! - `build_*` write server frames (ACK/NACK/RES/EVNT, each ending in `\n`),
//!   client frames, and the Redis call/result/pub payloads.
//!
//! The decoder follows what the upstream Go server accepts: one JSON value is
//! read from the frame and anything after it is ignored; object keys match
//! case-insensitively and the last duplicate wins; `meta.type` and `timeout`
//! must be JSON integers; `meta.uuid` must parse as a UUID (any of the forms
//! Go's uuid.Parse takes) and is returned in canonical lower case; a `null`
//! field is the same as an absent one. Every input is bounded: nesting deeper
//! than [`MAX_DEPTH`] is rejected and nothing is buffered beyond the frame.

use std::borrow::Cow;
use std::fmt;

/// Message types of juggler.0.
pub const CALL: u32 = 1;
pub const PUB: u32 = 2;
pub const SUB: u32 = 3;
pub const UNSB: u32 = 4;
pub const NACK: u32 = 7;
pub const ACK: u32 = 8;
pub const RES: u32 = 9;
pub const EVNT: u32 = 10;

/// Bit mask (bit `1 << type`) of every client message type.
pub const ALL_CLIENT_TYPES: u32 = (1 << CALL) | (1 << PUB) | (1 << SUB) | (1 << UNSB);

/// Deepest nesting of arrays/objects accepted anywhere in a frame.
pub const MAX_DEPTH: usize = 512;

/// Why a frame or payload was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Empty input or only whitespace.
    Empty,
    /// Not valid UTF-8.
    InvalidUtf8,
    /// Malformed JSON at a byte offset.
    Syntax { at: usize, what: &'static str },
    /// Nesting deeper than [`MAX_DEPTH`].
    TooDeep,
    /// The top-level value is not an object.
    NotObject,
    /// A field has the wrong JSON type (e.g. a string `meta.type`, a float `timeout`).
    FieldType(&'static str),
    /// `meta.type` is 0, unknown, or a type the sender may not send.
    UnknownType(i64),
    /// A client type forbidden on this connection (`Juggler-Allowed-Messages`).
    Forbidden(u32),
    /// A required field is absent (or null).
    Missing(&'static str),
    /// A uuid field that is not a UUID.
    BadUuid(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Empty => write!(f, "empty message"),
            Error::InvalidUtf8 => write!(f, "message is not valid UTF-8"),
            Error::Syntax { at, what } => write!(f, "invalid JSON at byte {at}: {what}"),
            Error::TooDeep => write!(f, "JSON nested deeper than {MAX_DEPTH} levels"),
            Error::NotObject => write!(f, "message is not a JSON object"),
            Error::FieldType(name) => write!(f, "field {name} has the wrong JSON type"),
            Error::UnknownType(t) => write!(f, "unknown or unexpected message type {t}"),
            Error::Forbidden(t) => write!(f, "message type {t} is not allowed on this connection"),
            Error::Missing(name) => write!(f, "missing field {name}"),
            Error::BadUuid(name) => write!(f, "field {name} is not a valid UUID"),
        }
    }
}

impl std::error::Error for Error {}

type Result<T> = std::result::Result<T, Error>;

/// A parsed client message (CALL, PUB, SUB or UNSB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientMsg {
    pub msg_type: u32,
    /// Canonical lower-case UUID.
    pub uuid: String,
    /// CALL: the URI ("" when absent).
    pub uri: Option<String>,
    /// CALL: the timeout in nanoseconds as sent; None when absent or null.
    pub timeout_ns: Option<i64>,
    /// PUB/SUB/UNSB: the channel ("" when absent).
    pub channel: Option<String>,
    /// SUB/UNSB: whether `channel` is a glob pattern.
    pub pattern: bool,
    /// CALL/PUB: normalized raw JSON of `args`; None when absent.
    pub args: Option<Vec<u8>>,
}

/// A parsed server message (NACK, ACK, RES or EVNT).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerMsg {
    pub msg_type: u32,
    pub uuid: String,
    pub for_uuid: String,
    /// ACK/NACK: the type of the acknowledged message.
    pub for_type: Option<u32>,
    pub uri: Option<String>,
    pub channel: Option<String>,
    /// EVNT: the pattern that matched, when a pattern subscription matched.
    pub pattern: Option<String>,
    /// NACK: the error code and message.
    pub code: Option<i64>,
    pub message: Option<String>,
    /// RES/EVNT: raw JSON of `args` (as sent); None when absent.
    pub args: Option<Vec<u8>>,
}

/// The Redis call/result payload `{"conn_uuid","msg_uuid","uri","args"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPayload {
    pub conn_uuid: String,
    pub msg_uuid: String,
    pub uri: String,
    pub args: Option<Vec<u8>>,
}

// ---------------------------------------------------------------------------
// Scanner: a validating JSON scanner over a byte slice.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Object,
    Array,
    String,
    Int,
    Float,
    True,
    False,
    Null,
}

/// A validated JSON value inside the input.
#[derive(Debug, Clone, Copy)]
struct Span {
    kind: Kind,
    start: usize,
    end: usize,
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

#[inline]
fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

impl<'a> Scanner<'a> {
    fn new(b: &'a [u8]) -> Self {
        Scanner { b, i: 0 }
    }

    fn at(&self, i: usize) -> Self {
        Scanner { b: self.b, i }
    }

    #[inline]
    fn ws(&mut self) {
        while self.i < self.b.len() && is_ws(self.b[self.i]) {
            self.i += 1;
        }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn err(&self, what: &'static str) -> Error {
        Error::Syntax { at: self.i, what }
    }

    fn literal(&mut self, lit: &'static [u8], kind: Kind) -> Result<Kind> {
        if self.b[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(kind)
        } else {
            Err(self.err("invalid literal"))
        }
    }

    /// Validate one value starting at `self.i` (after whitespace); leaves `i` after it.
    fn value(&mut self, depth: usize) -> Result<Span> {
        self.ws();
        let start = self.i;
        let kind = match self.peek() {
            None => return Err(self.err("unexpected end of input")),
            Some(b'{') => {
                self.object_skip(depth + 1)?;
                Kind::Object
            }
            Some(b'[') => {
                self.array_skip(depth + 1)?;
                Kind::Array
            }
            Some(b'"') => {
                self.string()?;
                Kind::String
            }
            Some(b't') => self.literal(b"true", Kind::True)?,
            Some(b'f') => self.literal(b"false", Kind::False)?,
            Some(b'n') => self.literal(b"null", Kind::Null)?,
            Some(b'-' | b'0'..=b'9') => self.number()?,
            Some(_) => return Err(self.err("unexpected character")),
        };
        Ok(Span { kind, start, end: self.i })
    }

    fn object_skip(&mut self, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(Error::TooDeep);
        }
        self.i += 1; // '{'
        self.items(b'}', "expected ',' or '}'", |s| {
            s.key()?;
            s.value(depth).map(drop)
        })
    }

    fn array_skip(&mut self, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(Error::TooDeep);
        }
        self.i += 1; // '['
        self.items(b']', "expected ',' or ']'", |s| s.value(depth).map(drop))
    }

    /// The comma-separated items of an object or array whose opening bracket
    /// is just behind `self.i`: `item` reads one, this reads the separators
    /// and the closing `close`. The one loop of every container, so objects
    /// skipped, arrays skipped and envelopes iterated agree on what is valid.
    #[inline]
    fn items(&mut self, close: u8, expected: &'static str, mut item: impl FnMut(&mut Self) -> Result<()>) -> Result<()> {
        self.ws();
        if self.peek() == Some(close) {
            self.i += 1;
            return Ok(());
        }
        loop {
            item(self)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(c) if c == close => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.err(expected)),
            }
        }
    }

    /// An object key and its ':' (whitespace around them allowed); returns
    /// the key's span, quotes included, and whether it has escapes (what
    /// `decode_string` takes).
    fn key(&mut self) -> Result<(usize, usize, bool)> {
        self.ws();
        if self.peek() != Some(b'"') {
            return Err(self.err("expected object key"));
        }
        let start = self.i;
        let escaped = self.string()?;
        let end = self.i;
        self.ws();
        if self.peek() != Some(b':') {
            return Err(self.err("expected ':'"));
        }
        self.i += 1;
        Ok((start, end, escaped))
    }

    /// Validate a string at `self.i` (the opening quote); returns whether it has escapes.
    fn string(&mut self) -> Result<bool> {
        self.i += 1;
        let mut escaped = false;
        loop {
            let Some(&c) = self.b.get(self.i) else {
                return Err(self.err("unterminated string"));
            };
            match c {
                b'"' => {
                    self.i += 1;
                    return Ok(escaped);
                }
                b'\\' => {
                    escaped = true;
                    match self.b.get(self.i + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.i += 2,
                        Some(b'u') => {
                            let hex = self.b.get(self.i + 2..self.i + 6);
                            match hex {
                                Some(h) if h.iter().all(u8::is_ascii_hexdigit) => self.i += 6,
                                _ => return Err(self.err("invalid \\u escape")),
                            }
                        }
                        _ => return Err(self.err("invalid escape")),
                    }
                }
                0..=0x1f => return Err(self.err("control character in string")),
                _ => self.i += 1,
            }
        }
    }

    fn number(&mut self) -> Result<Kind> {
        let mut float = false;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                while matches!(self.peek(), Some(b'0'..=b'9')) {
                    self.i += 1;
                }
            }
            _ => return Err(self.err("invalid number")),
        }
        if self.peek() == Some(b'.') {
            float = true;
            self.i += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.err("invalid number"));
            }
            while matches!(self.peek(), Some(b'0'..=b'9')) {
                self.i += 1;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            float = true;
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.err("invalid number"));
            }
            while matches!(self.peek(), Some(b'0'..=b'9')) {
                self.i += 1;
            }
        }
        Ok(if float { Kind::Float } else { Kind::Int })
    }

    /// Iterate the members of the object starting at `self.i` ('{' after
    /// whitespace), calling `f(key, value_span)` for each. Validates all of it.
    fn members<F>(&mut self, mut f: F) -> Result<()>
    where
        F: FnMut(&str, Span) -> Result<()>,
    {
        self.ws();
        if self.peek() != Some(b'{') {
            return Err(Error::NotObject);
        }
        self.i += 1;
        self.items(b'}', "expected ',' or '}'", |s| {
            let (start, end, escaped) = s.key()?;
            let key = decode_string(s.b, start, end, escaped);
            let span = s.value(1)?;
            f(&key, span)
        })
    }
}

fn hex4(h: &[u8]) -> u32 {
    h.iter().fold(0u32, |acc, &c| {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => c - b'A' + 10,
        };
        (acc << 4) | d as u32
    })
}

/// Decode a validated JSON string token `b[start..end]` (quotes included).
/// Invalid surrogate escapes become U+FFFD, as in Go.
fn decode_string(b: &[u8], start: usize, end: usize, escaped: bool) -> Cow<'_, str> {
    let inner = &b[start + 1..end - 1];
    if !escaped {
        return String::from_utf8_lossy(inner);
    }
    let mut out: Vec<u8> = Vec::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        let c = inner[i];
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        let e = inner[i + 1];
        i += 2;
        let ch: char = match e {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            _ => {
                // 'u'
                let u = hex4(&inner[i..i + 4]);
                i += 4;
                if (0xD800..0xDC00).contains(&u) {
                    // a high surrogate: needs a low one right after
                    if inner.get(i) == Some(&b'\\') && inner.get(i + 1) == Some(&b'u') && i + 6 <= inner.len() {
                        let lo = hex4(&inner[i + 2..i + 6]);
                        if (0xDC00..0xE000).contains(&lo) {
                            i += 6;
                            let cp = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                            char::from_u32(cp).unwrap_or('\u{FFFD}')
                        } else {
                            '\u{FFFD}'
                        }
                    } else {
                        '\u{FFFD}'
                    }
                } else {
                    char::from_u32(u).unwrap_or('\u{FFFD}')
                }
            }
        };
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

fn span_str(b: &[u8], s: Span, name: &'static str) -> Result<Option<String>> {
    match s.kind {
        Kind::Null => Ok(None),
        Kind::String => {
            let esc = b[s.start + 1..s.end - 1].contains(&b'\\');
            Ok(Some(decode_string(b, s.start, s.end, esc).into_owned()))
        }
        _ => Err(Error::FieldType(name)),
    }
}

fn span_int(b: &[u8], s: Span, name: &'static str) -> Result<Option<i64>> {
    match s.kind {
        Kind::Null => Ok(None),
        Kind::Int => std::str::from_utf8(&b[s.start..s.end])
            .ok()
            .and_then(|t| t.parse::<i64>().ok())
            .map(Some)
            .ok_or(Error::FieldType(name)),
        _ => Err(Error::FieldType(name)),
    }
}

fn span_bool(s: Span, name: &'static str) -> Result<Option<bool>> {
    match s.kind {
        Kind::Null => Ok(None),
        Kind::True => Ok(Some(true)),
        Kind::False => Ok(Some(false)),
        _ => Err(Error::FieldType(name)),
    }
}

fn span_uuid(b: &[u8], s: Span, name: &'static str) -> Result<Option<String>> {
    match span_str(b, s, name)? {
        None => Ok(None),
        Some(text) => parse_uuid(&text).map(Some).ok_or(Error::BadUuid(name)),
    }
}

// ---------------------------------------------------------------------------
// UUIDs
// ---------------------------------------------------------------------------

/// Parse a UUID in any form Go's `uuid.Parse` accepts (canonical 36 chars,
/// `{...}`, `urn:uuid:...`, 32 hex digits), case-insensitively; returns the
/// canonical lower-case 36-char form.
pub fn parse_uuid(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let core: &[u8] = match b.len() {
        36 => b,
        38 if b[0] == b'{' && b[37] == b'}' => &b[1..37],
        45 if b[..9].eq_ignore_ascii_case(b"urn:uuid:") => &b[9..],
        32 => {
            if !b.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let mut out = String::with_capacity(36);
            for (i, &c) in b.iter().enumerate() {
                if matches!(i, 8 | 12 | 16 | 20) {
                    out.push('-');
                }
                out.push(c.to_ascii_lowercase() as char);
            }
            return Some(out);
        }
        _ => return None,
    };
    let mut out = String::with_capacity(36);
    for (i, &c) in core.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
            out.push('-');
        } else if c.is_ascii_hexdigit() {
            out.push(c.to_ascii_lowercase() as char);
        } else {
            return None;
        }
    }
    Some(out)
}

/// A fresh random (v4) UUID, canonical lower case.
pub fn new_uuid() -> String {
    let mut buf = [0u8; 36];
    uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf).to_owned()
}

// ---------------------------------------------------------------------------
// Raw args normalization (Go's json.Compact with HTML escaping)
// ---------------------------------------------------------------------------

/// Whether `raw` (valid JSON) would change under [`normalize_into`].
fn needs_normalize(raw: &[u8]) -> bool {
    raw.iter()
        .any(|&c| matches!(c, b' ' | b'\t' | b'\n' | b'\r' | b'<' | b'>' | b'&' | 0xE2))
}

/// Append `raw` (valid JSON) compacted, with `<`, `>`, `&`, U+2028 and U+2029
/// escaped inside strings: the bytes Go's encoder writes for a RawMessage.
fn normalize_into(out: &mut Vec<u8>, raw: &[u8]) {
    let mut in_str = false;
    let mut i = 0;
    while i < raw.len() {
        let c = raw[i];
        if in_str {
            match c {
                b'\\' => {
                    out.extend_from_slice(&raw[i..i + 2]);
                    i += 2;
                    continue;
                }
                b'"' => in_str = false,
                b'<' => {
                    out.extend_from_slice(b"\\u003c");
                    i += 1;
                    continue;
                }
                b'>' => {
                    out.extend_from_slice(b"\\u003e");
                    i += 1;
                    continue;
                }
                b'&' => {
                    out.extend_from_slice(b"\\u0026");
                    i += 1;
                    continue;
                }
                0xE2 if raw.get(i + 1) == Some(&0x80) && matches!(raw.get(i + 2), Some(0xA8 | 0xA9)) => {
                    out.extend_from_slice(if raw[i + 2] == 0xA8 { b"\\u2028" } else { b"\\u2029" });
                    i += 3;
                    continue;
                }
                _ => {}
            }
            out.push(c);
        } else if !is_ws(c) {
            if c == b'"' {
                in_str = true;
            }
            out.push(c);
        }
        i += 1;
    }
}

/// The normalized form of a validated raw JSON value.
fn normalized(raw: &[u8]) -> Vec<u8> {
    if !needs_normalize(raw) {
        return raw.to_vec();
    }
    let mut out = Vec::with_capacity(raw.len());
    normalize_into(&mut out, raw);
    out
}

/// Validate that `raw` is exactly one JSON value (surrounding whitespace allowed)
/// and return its normalized form.
pub fn normalize_args(raw: &[u8]) -> Result<Vec<u8>> {
    if std::str::from_utf8(raw).is_err() {
        return Err(Error::InvalidUtf8);
    }
    let mut s = Scanner::new(raw);
    s.ws();
    if s.peek().is_none() {
        return Err(Error::Empty);
    }
    let span = s.value(0)?;
    s.ws();
    if s.peek().is_some() {
        return Err(s.err("trailing data after the value"));
    }
    Ok(normalized(&raw[span.start..span.end]))
}

// ---------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------

/// The `meta` and `payload` of an envelope.
struct Envelope {
    msg_type: i64,
    uuid: Option<String>,
    payload: Option<Span>,
}

fn parse_envelope(b: &[u8]) -> Result<Envelope> {
    if std::str::from_utf8(b).is_err() {
        return Err(Error::InvalidUtf8);
    }
    let mut s = Scanner::new(b);
    s.ws();
    match s.peek() {
        None => return Err(Error::Empty),
        Some(b'{') => {}
        Some(b'[' | b'"' | b't' | b'f' | b'n' | b'-' | b'0'..=b'9') => {
            // A valid non-object value is a type error; still report syntax first.
            s.value(0)?;
            return Err(Error::NotObject);
        }
        Some(_) => return Err(s.err("unexpected character")),
    }
    let mut env = Envelope { msg_type: 0, uuid: None, payload: None };
    s.members(|key, span| {
        if key.eq_ignore_ascii_case("meta") {
            match span.kind {
                Kind::Null => Ok(()),
                Kind::Object => {
                    // Go decodes duplicate "meta" members into the same struct: fields merge.
                    let mut m = Scanner::new(b).at(span.start);
                    m.members(|k, v| {
                        if k.eq_ignore_ascii_case("type") {
                            if let Some(t) = span_int(b, v, "meta.type")? {
                                env.msg_type = t;
                            }
                        } else if k.eq_ignore_ascii_case("uuid") {
                            if let Some(u) = span_uuid(b, v, "meta.uuid")? {
                                env.uuid = Some(u);
                            }
                        }
                        Ok(())
                    })
                }
                _ => Err(Error::FieldType("meta")),
            }
        } else if key.eq_ignore_ascii_case("payload") {
            env.payload = Some(span);
            Ok(())
        } else {
            Ok(())
        }
    })?;
    // Anything after the first value is ignored, as upstream's json.Decoder does.
    Ok(env)
}

/// Parse one client frame. `allowed` is a mask of `1 << type` bits
/// ([`ALL_CLIENT_TYPES`] for all); any other type is an error.
pub fn parse_client(b: &[u8], allowed: u32) -> Result<ClientMsg> {
    let env = parse_envelope(b)?;
    let t = env.msg_type;
    if !(CALL as i64..=UNSB as i64).contains(&t) {
        return Err(Error::UnknownType(t));
    }
    let t = t as u32;
    if allowed & (1 << t) == 0 {
        return Err(Error::Forbidden(t));
    }
    let uuid = env.uuid.ok_or(Error::Missing("meta.uuid"))?;
    let payload = match env.payload {
        Some(p) if p.kind == Kind::Object => p,
        Some(p) if p.kind != Kind::Null => return Err(Error::FieldType("payload")),
        _ => return Err(Error::Missing("payload")),
    };
    let mut msg = ClientMsg {
        msg_type: t,
        uuid,
        uri: None,
        timeout_ns: None,
        channel: None,
        pattern: false,
        args: None,
    };
    let mut args: Option<Span> = None;
    let mut p = Scanner::new(b).at(payload.start);
    p.members(|key, v| {
        match t {
            CALL => {
                if key.eq_ignore_ascii_case("uri") {
                    msg.uri = span_str(b, v, "uri")?;
                } else if key.eq_ignore_ascii_case("timeout") {
                    msg.timeout_ns = span_int(b, v, "timeout")?;
                } else if key.eq_ignore_ascii_case("args") {
                    args = Some(v);
                }
            }
            PUB => {
                if key.eq_ignore_ascii_case("channel") {
                    msg.channel = span_str(b, v, "channel")?;
                } else if key.eq_ignore_ascii_case("args") {
                    args = Some(v);
                }
            }
            _ => {
                if key.eq_ignore_ascii_case("channel") {
                    msg.channel = span_str(b, v, "channel")?;
                } else if key.eq_ignore_ascii_case("pattern") {
                    msg.pattern = span_bool(v, "pattern")?.unwrap_or(false);
                }
            }
        }
        Ok(())
    })?;
    match t {
        CALL => {
            msg.uri.get_or_insert_with(String::new);
        }
        _ => {
            msg.channel.get_or_insert_with(String::new);
        }
    }
    msg.args = args.map(|a| normalized(&b[a.start..a.end]));
    Ok(msg)
}

/// Parse one server frame (NACK, ACK, RES or EVNT). `args` is returned as sent.
pub fn parse_server(b: &[u8]) -> Result<ServerMsg> {
    let env = parse_envelope(b)?;
    let t = env.msg_type;
    if !matches!(t, 7..=10) {
        return Err(Error::UnknownType(t));
    }
    let uuid = env.uuid.ok_or(Error::Missing("meta.uuid"))?;
    let payload = match env.payload {
        Some(p) if p.kind == Kind::Object => p,
        Some(p) if p.kind != Kind::Null => return Err(Error::FieldType("payload")),
        _ => return Err(Error::Missing("payload")),
    };
    let mut msg = ServerMsg { msg_type: t as u32, uuid, ..Default::default() };
    let mut for_uuid = None;
    let mut p = Scanner::new(b).at(payload.start);
    p.members(|key, v| {
        if key.eq_ignore_ascii_case("for") {
            for_uuid = span_uuid(b, v, "for")?;
        } else if key.eq_ignore_ascii_case("for_type") {
            msg.for_type = span_int(b, v, "for_type")?
                .map(|x| u32::try_from(x).map_err(|_| Error::FieldType("for_type")))
                .transpose()?;
        } else if key.eq_ignore_ascii_case("uri") {
            msg.uri = span_str(b, v, "uri")?;
        } else if key.eq_ignore_ascii_case("channel") {
            msg.channel = span_str(b, v, "channel")?;
        } else if key.eq_ignore_ascii_case("pattern") {
            msg.pattern = span_str(b, v, "pattern")?;
        } else if key.eq_ignore_ascii_case("code") {
            msg.code = span_int(b, v, "code")?;
        } else if key.eq_ignore_ascii_case("message") {
            msg.message = span_str(b, v, "message")?;
        } else if key.eq_ignore_ascii_case("args") {
            msg.args = Some(b[v.start..v.end].to_vec());
        }
        Ok(())
    })?;
    msg.for_uuid = for_uuid.ok_or(Error::Missing("for"))?;
    Ok(msg)
}

/// The members of a Redis payload `b`: UTF-8 holding one JSON object
/// (empty input: `Error::Empty`; another value: `Error::NotObject`).
fn payload_members<F>(b: &[u8], f: F) -> Result<()>
where
    F: FnMut(&str, Span) -> Result<()>,
{
    if std::str::from_utf8(b).is_err() {
        return Err(Error::InvalidUtf8);
    }
    let mut s = Scanner::new(b);
    s.ws();
    if s.peek().is_none() {
        return Err(Error::Empty);
    }
    s.members(f)
}

/// Parse a Redis call or result payload.
pub fn parse_call_payload(b: &[u8]) -> Result<CallPayload> {
    let mut conn = None;
    let mut msg = None;
    let mut uri = None;
    let mut args: Option<Span> = None;
    payload_members(b, |key, v| {
        if key.eq_ignore_ascii_case("conn_uuid") {
            conn = span_uuid(b, v, "conn_uuid")?;
        } else if key.eq_ignore_ascii_case("msg_uuid") {
            msg = span_uuid(b, v, "msg_uuid")?;
        } else if key.eq_ignore_ascii_case("uri") {
            uri = span_str(b, v, "uri")?;
        } else if key.eq_ignore_ascii_case("args") {
            args = Some(v);
        }
        Ok(())
    })?;
    Ok(CallPayload {
        conn_uuid: conn.ok_or(Error::Missing("conn_uuid"))?,
        msg_uuid: msg.ok_or(Error::Missing("msg_uuid"))?,
        uri: uri.unwrap_or_default(),
        args: args.map(|a| normalized(&b[a.start..a.end])),
    })
}

/// Parse a Redis PUBLISH body `{"msg_uuid","args"}`.
pub fn parse_pub_payload(b: &[u8]) -> Result<(String, Option<Vec<u8>>)> {
    let mut msg = None;
    let mut args: Option<Span> = None;
    payload_members(b, |key, v| {
        if key.eq_ignore_ascii_case("msg_uuid") {
            msg = span_uuid(b, v, "msg_uuid")?;
        } else if key.eq_ignore_ascii_case("args") {
            args = Some(v);
        }
        Ok(())
    })?;
    Ok((
        msg.ok_or(Error::Missing("msg_uuid"))?,
        args.map(|a| normalized(&b[a.start..a.end])),
    ))
}

// ---------------------------------------------------------------------------
// Building
// ---------------------------------------------------------------------------

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Append `s` as a JSON string the way Go's encoder writes it (HTML-safe).
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let b = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let esc: Option<&[u8]> = match c {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            0..=0x1f | b'<' | b'>' | b'&' => Some(b""),
            0xE2 if b.get(i + 1) == Some(&0x80) && matches!(b.get(i + 2), Some(0xA8 | 0xA9)) => Some(b""),
            _ => None,
        };
        match esc {
            None => i += 1,
            Some(e) => {
                out.extend_from_slice(&b[start..i]);
                if !e.is_empty() {
                    out.extend_from_slice(e);
                    i += 1;
                } else if c == 0xE2 {
                    out.extend_from_slice(if b[i + 2] == 0xA8 { b"\\u2028" } else { b"\\u2029" });
                    i += 3;
                } else {
                    out.extend_from_slice(b"\\u00");
                    out.push(HEX[(c >> 4) as usize]);
                    out.push(HEX[(c & 0xF) as usize]);
                    i += 1;
                }
                start = i;
            }
        }
    }
    out.extend_from_slice(&b[start..]);
    out.push(b'"');
}

fn write_int(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(v.to_string().as_bytes());
}

fn meta(out: &mut Vec<u8>, t: u32, uuid: &str) {
    out.extend_from_slice(b"{\"meta\":{\"type\":");
    write_int(out, t as i64);
    out.extend_from_slice(b",\"uuid\":");
    write_str(out, uuid);
    out.extend_from_slice(b"},\"payload\":{");
}

fn target_key(for_type: u32) -> &'static [u8] {
    if for_type == CALL {
        b",\"uri\":"
    } else {
        b",\"channel\":"
    }
}

/// `key` (with its quotes, colon and any leading comma) then `v` as a JSON
/// string: one field of a frame or payload being built.
#[inline]
fn put_str(out: &mut Vec<u8>, key: &[u8], v: &str) {
    out.extend_from_slice(key);
    write_str(out, v);
}

/// `,"args":` and the (normalized) args when there are any: clients and
/// payloads omit absent args, where server frames write `null`.
#[inline]
fn put_opt_args(out: &mut Vec<u8>, args: Option<&[u8]>) {
    if let Some(a) = args {
        out.extend_from_slice(b",\"args\":");
        out.extend_from_slice(a);
    }
}

/// The part ACK and NACK frames share: meta (fresh uuid), `for`,
/// `for_type` and the target (`uri` of a CALL, else `channel`).
fn answer_head(out: &mut Vec<u8>, t: u32, for_uuid: &str, for_type: u32, target: &str) {
    meta(out, t, &new_uuid());
    put_str(out, b"\"for\":", for_uuid);
    out.extend_from_slice(b",\"for_type\":");
    write_int(out, for_type as i64);
    put_str(out, target_key(for_type), target);
}

/// ACK frame (fresh uuid, trailing newline); `target` is the uri (CALL) or channel.
pub fn build_ack(for_uuid: &str, for_type: u32, target: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + target.len());
    answer_head(&mut out, ACK, for_uuid, for_type, target);
    out.extend_from_slice(b"}}\n");
    out
}

/// NACK frame: as ACK plus `code` and `message`.
pub fn build_nack(for_uuid: &str, for_type: u32, target: &str, code: i64, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(200 + target.len() + message.len());
    answer_head(&mut out, NACK, for_uuid, for_type, target);
    out.extend_from_slice(b",\"code\":");
    write_int(&mut out, code);
    put_str(&mut out, b",\"message\":", message);
    out.extend_from_slice(b"}}\n");
    out
}

fn write_args(out: &mut Vec<u8>, args: Option<&[u8]>) {
    match args {
        Some(a) if !a.is_empty() => out.extend_from_slice(a),
        _ => out.extend_from_slice(b"null"),
    }
}

/// RES frame; `args` is trusted raw JSON (`null` when None).
pub fn build_res(for_uuid: &str, uri: &str, args: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + uri.len() + args.map_or(4, <[u8]>::len));
    meta(&mut out, RES, &new_uuid());
    put_str(&mut out, b"\"for\":", for_uuid);
    put_str(&mut out, b",\"uri\":", uri);
    out.extend_from_slice(b",\"args\":");
    write_args(&mut out, args);
    out.extend_from_slice(b"}}\n");
    out
}

/// EVNT frame; `pattern` only when a pattern subscription matched.
pub fn build_evnt(for_uuid: &str, channel: &str, pattern: Option<&str>, args: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(180 + channel.len() + args.map_or(4, <[u8]>::len));
    meta(&mut out, EVNT, &new_uuid());
    put_str(&mut out, b"\"for\":", for_uuid);
    put_str(&mut out, b",\"channel\":", channel);
    if let Some(p) = pattern {
        put_str(&mut out, b",\"pattern\":", p);
    }
    out.extend_from_slice(b",\"args\":");
    write_args(&mut out, args);
    out.extend_from_slice(b"}}\n");
    out
}

/// CALL frame of a client (`args` omitted when None; must be valid JSON).
pub fn build_call(uuid: &str, uri: &str, timeout_ns: i64, args: Option<&[u8]>) -> Result<Vec<u8>> {
    let args = args.map(normalize_args).transpose()?;
    let mut out = Vec::with_capacity(160 + uri.len() + args.as_ref().map_or(0, Vec::len));
    meta(&mut out, CALL, uuid);
    put_str(&mut out, b"\"uri\":", uri);
    out.extend_from_slice(b",\"timeout\":");
    write_int(&mut out, timeout_ns);
    put_opt_args(&mut out, args.as_deref());
    out.extend_from_slice(b"}}\n");
    Ok(out)
}

/// PUB frame of a client (`args` omitted when None; must be valid JSON).
pub fn build_pub(uuid: &str, channel: &str, args: Option<&[u8]>) -> Result<Vec<u8>> {
    let args = args.map(normalize_args).transpose()?;
    let mut out = Vec::with_capacity(160 + channel.len() + args.as_ref().map_or(0, Vec::len));
    meta(&mut out, PUB, uuid);
    put_str(&mut out, b"\"channel\":", channel);
    put_opt_args(&mut out, args.as_deref());
    out.extend_from_slice(b"}}\n");
    Ok(out)
}

/// SUB (`unsubscribe` false) or UNSB frame of a client.
pub fn build_sub(uuid: &str, channel: &str, pattern: bool, unsubscribe: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(140 + channel.len());
    meta(&mut out, if unsubscribe { UNSB } else { SUB }, uuid);
    put_str(&mut out, b"\"channel\":", channel);
    out.extend_from_slice(if pattern { b",\"pattern\":true}}\n" } else { b",\"pattern\":false}}\n" });
    out
}

/// Redis call/result payload; `args` (valid JSON) is normalized, omitted when None.
pub fn build_call_payload(conn_uuid: &str, msg_uuid: &str, uri: &str, args: Option<&[u8]>) -> Result<Vec<u8>> {
    let args = args.map(normalize_args).transpose()?;
    let mut out = Vec::with_capacity(120 + uri.len() + args.as_ref().map_or(0, Vec::len));
    put_str(&mut out, b"{\"conn_uuid\":", conn_uuid);
    put_str(&mut out, b",\"msg_uuid\":", msg_uuid);
    put_str(&mut out, b",\"uri\":", uri);
    put_opt_args(&mut out, args.as_deref());
    out.push(b'}');
    Ok(out)
}

/// Redis PUBLISH body; `args` (valid JSON) normalized, omitted when None.
pub fn build_pub_payload(msg_uuid: &str, args: Option<&[u8]>) -> Result<Vec<u8>> {
    let args = args.map(normalize_args).transpose()?;
    let mut out = Vec::with_capacity(60 + args.as_ref().map_or(0, Vec::len));
    put_str(&mut out, b"{\"msg_uuid\":", msg_uuid);
    put_opt_args(&mut out, args.as_deref());
    out.push(b'}');
    Ok(out)
}

/// Parse a `Juggler-Allowed-Messages` header value into a type mask:
/// comma-separated names, case-insensitive; `*` or empty means all.
/// Unknown names are an error.
pub fn allowed_mask(header: &str) -> std::result::Result<u32, String> {
    let h = header.trim();
    if h.is_empty() || h == "*" {
        return Ok(ALL_CLIENT_TYPES);
    }
    let mut mask = 0;
    for part in h.split(',') {
        let p = part.trim();
        if p.is_empty() {
            continue;
        }
        mask |= match p.to_ascii_lowercase().as_str() {
            "*" => ALL_CLIENT_TYPES,
            "call" => 1 << CALL,
            "pub" => 1 << PUB,
            "sub" => 1 << SUB,
            "unsb" => 1 << UNSB,
            _ => return Err(format!("unknown message type {p:?}")),
        };
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const U: &str = "d11bff91-58fb-4e20-87ca-8c221fccbb49";

    fn call(extra: &str) -> String {
        format!(r#"{{"meta": {{"type": 1, "uuid": "{U}"}}, "payload": {{"uri": "test.echo", "timeout": 5000000000{extra}}}}}"#)
    }

    #[test]
    fn parses_call() {
        let m = parse_client(call(r#", "args": "hello""#).as_bytes(), ALL_CLIENT_TYPES).unwrap();
        assert_eq!(m.msg_type, CALL);
        assert_eq!(m.uuid, U);
        assert_eq!(m.uri.as_deref(), Some("test.echo"));
        assert_eq!(m.timeout_ns, Some(5_000_000_000));
        assert_eq!(m.args.as_deref(), Some(&b"\"hello\""[..]));
    }

    #[test]
    fn args_absent_and_null() {
        let m = parse_client(call("").as_bytes(), ALL_CLIENT_TYPES).unwrap();
        assert_eq!(m.args, None);
        let m = parse_client(call(r#", "args": null"#).as_bytes(), ALL_CLIENT_TYPES).unwrap();
        assert_eq!(m.args.as_deref(), Some(&b"null"[..]));
    }

    #[test]
    fn args_normalized_like_go() {
        let m = parse_client(call(r#", "args": {"k": [1, 2, 3], "s": "a<b>&c\u2028 d"}"#).as_bytes(), ALL_CLIENT_TYPES)
            .unwrap();
        assert_eq!(
            std::str::from_utf8(m.args.as_deref().unwrap()).unwrap(),
            r#"{"k":[1,2,3],"s":"a\u003cb\u003e\u0026c\u2028 d"}"#
        );
        let raw = "\"a<b>&c\u{2028}d\"";
        let m = parse_client(call(&format!(", \"args\": {raw}")).as_bytes(), ALL_CLIENT_TYPES).unwrap();
        assert_eq!(m.args.as_deref().unwrap(), br#""a\u003cb\u003e\u0026c\u2028d""#);
    }

    #[test]
    fn uppercase_uuid_canonical() {
        let f = r#"{"meta":{"type":1,"uuid":"DF2D1E9D-5C7A-4530-97D9-3BD1B3FE40A7"},"payload":{"uri":"x"}}"#;
        assert_eq!(parse_client(f.as_bytes(), ALL_CLIENT_TYPES).unwrap().uuid, "df2d1e9d-5c7a-4530-97d9-3bd1b3fe40a7");
    }

    #[test]
    fn uuid_forms() {
        let c = "df2d1e9d-5c7a-4530-97d9-3bd1b3fe40a7";
        for f in [
            "df2d1e9d-5c7a-4530-97d9-3bd1b3fe40a7",
            "{df2d1e9d-5c7a-4530-97d9-3bd1b3fe40a7}",
            "urn:uuid:df2d1e9d-5c7a-4530-97d9-3bd1b3fe40a7",
            "df2d1e9d5c7a453097d93bd1b3fe40a7",
        ] {
            assert_eq!(parse_uuid(f).as_deref(), Some(c), "{f}");
        }
        for f in ["", "not-a-uuid", "df2d1e9d-5c7a-4530-97d9-3bd1b3fe40ag", "df2d1e9d+5c7a-4530-97d9-3bd1b3fe40a7"] {
            assert_eq!(parse_uuid(f), None, "{f}");
        }
    }

    #[test]
    fn rejects_protocol_errors() {
        let bad = [
            "",
            "   ",
            "this is not json",
            "[]",
            "null",
            r#"{"meta": {"type": 99, "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}"#,
            r#"{"meta": {"type": 8, "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}"#,
            r#"{"meta": {"type": 0, "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}"#,
            r#"{"meta": {"type": "CALL", "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}"#,
            r#"{"meta": {"type": 1.0, "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}"#,
            r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":"test.echo","timeout":1.5e9,"args":"x"}}"#,
            r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":"test.echo","timeout":"5s"}}"#,
            r#"{"meta":{"type":1,"uuid":"not-a-uuid"},"payload":{"uri":"test.echo"}}"#,
            r#"{"meta":{"type":1},"payload":{"uri":"test.echo"}}"#,
            r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"}}"#,
            r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":null}"#,
            r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":5}}"#,
            r#"{"meta":{"type":3,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"channel":"a","pattern":"yes"}}"#,
            r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":"a","args":[1,]}}"#,
            r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":"a","args":"#,
        ];
        for f in bad {
            assert!(parse_client(f.as_bytes(), ALL_CLIENT_TYPES).is_err(), "{f}");
        }
        assert_eq!(parse_client(b"\xff", ALL_CLIENT_TYPES), Err(Error::InvalidUtf8));
    }

    #[test]
    fn forbidden_type() {
        let f = r#"{"meta":{"type":3,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"channel":"a"}}"#;
        let mask = allowed_mask("call, pub").unwrap();
        assert_eq!(parse_client(f.as_bytes(), mask), Err(Error::Forbidden(3)));
        assert!(parse_client(f.as_bytes(), ALL_CLIENT_TYPES).is_ok());
    }

    #[test]
    fn trailing_value_ignored() {
        let f = format!("{}{}", call(r#","args":"first""#), call(r#","args":"second""#));
        let m = parse_client(f.as_bytes(), ALL_CLIENT_TYPES).unwrap();
        assert_eq!(m.args.as_deref(), Some(&b"\"first\""[..]));
    }

    #[test]
    fn case_insensitive_keys_last_wins() {
        let f = format!(
            r#"{{"META":{{"Type":2,"UUID":"{U}"}},"Payload":{{"channel":"a","Channel":"b","args":1,"args":2}}}}"#
        );
        let m = parse_client(f.as_bytes(), ALL_CLIENT_TYPES).unwrap();
        assert_eq!(m.msg_type, PUB);
        assert_eq!(m.channel.as_deref(), Some("b"));
        assert_eq!(m.args.as_deref(), Some(&b"2"[..]));
    }

    #[test]
    fn sub_unsb() {
        let f = format!(r#"{{"meta":{{"type":4,"uuid":"{U}"}},"payload":{{"channel":"cap.news.*","pattern":true}}}}"#);
        let m = parse_client(f.as_bytes(), ALL_CLIENT_TYPES).unwrap();
        assert_eq!((m.msg_type, m.channel.as_deref(), m.pattern), (UNSB, Some("cap.news.*"), true));
        let f = format!(r#"{{"meta":{{"type":3,"uuid":"{U}"}},"payload":{{}}}}"#);
        let m = parse_client(f.as_bytes(), ALL_CLIENT_TYPES).unwrap();
        assert_eq!((m.channel.as_deref(), m.pattern), (Some(""), false));
    }

    #[test]
    fn depth_bounded() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 10), "]".repeat(MAX_DEPTH + 10));
        assert_eq!(normalize_args(deep.as_bytes()), Err(Error::TooDeep));
        let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(normalize_args(ok.as_bytes()).is_ok());
    }

    #[test]
    fn builds_frames() {
        let ack = String::from_utf8(build_ack(U, CALL, "test.echo")).unwrap();
        assert!(ack.ends_with("}}\n"));
        let m = parse_server(ack.as_bytes()).unwrap();
        assert_eq!((m.msg_type, m.for_uuid.as_str(), m.for_type, m.uri.as_deref()), (ACK, U, Some(1), Some("test.echo")));
        assert_ne!(m.uuid, U);
        let ack = build_ack(U, SUB, "a.b");
        let m = parse_server(&ack).unwrap();
        assert_eq!((m.channel.as_deref(), m.uri), (Some("a.b"), None));
        let nack = build_nack(U, CALL, "x", 500, "list capacity exceeded");
        let m = parse_server(&nack).unwrap();
        assert_eq!((m.msg_type, m.code, m.message.as_deref()), (NACK, Some(500), Some("list capacity exceeded")));
        let res = build_res(U, "x", Some(b"{\"a\":1}"));
        let m = parse_server(&res).unwrap();
        assert_eq!(m.args.as_deref(), Some(&b"{\"a\":1}"[..]));
        let ev = build_evnt(U, "c", Some("c*"), None);
        let m = parse_server(&ev).unwrap();
        assert_eq!((m.pattern.as_deref(), m.args.as_deref()), (Some("c*"), Some(&b"null"[..])));
        assert!(!String::from_utf8(build_evnt(U, "c", None, Some(b"1"))).unwrap().contains("pattern"));
    }

    #[test]
    fn payloads() {
        let p = build_call_payload(U, U, "u", None).unwrap();
        assert_eq!(std::str::from_utf8(&p).unwrap(), format!(r#"{{"conn_uuid":"{U}","msg_uuid":"{U}","uri":"u"}}"#));
        let p = build_call_payload(U, U, "u", Some(b" { \"k\" : [1, 2] } ")).unwrap();
        let c = parse_call_payload(&p).unwrap();
        assert_eq!(c.args.as_deref(), Some(&br#"{"k":[1,2]}"#[..]));
        assert!(build_call_payload(U, U, "u", Some(b"{bad")).is_err());
        let p = build_pub_payload(U, None).unwrap();
        assert_eq!(parse_pub_payload(&p).unwrap(), (U.to_string(), None));
        let raw = format!(r#"{{"msg_uuid": "{U}", "args": {{"from": "redis"}}}}"#);
        assert_eq!(parse_pub_payload(raw.as_bytes()).unwrap().1.as_deref(), Some(&br#"{"from":"redis"}"#[..]));
    }

    #[test]
    fn client_builders_roundtrip() {
        let f = build_call(U, "test.echo", 5, Some(b"\"x\"")).unwrap();
        let m = parse_client(&f, ALL_CLIENT_TYPES).unwrap();
        assert_eq!((m.uri.as_deref(), m.timeout_ns, m.args.as_deref()), (Some("test.echo"), Some(5), Some(&b"\"x\""[..])));
        let f = build_pub(U, "ch", None).unwrap();
        assert_eq!(parse_client(&f, ALL_CLIENT_TYPES).unwrap().args, None);
        let f = build_sub(U, "ch*", true, true);
        let m = parse_client(&f, ALL_CLIENT_TYPES).unwrap();
        assert_eq!((m.msg_type, m.pattern), (UNSB, true));
    }

    #[test]
    fn write_str_escapes_like_go() {
        let mut out = Vec::new();
        write_str(&mut out, "a\"b\\c\n\u{1}<>&\u{2028}\u{2029}é");
        assert_eq!(std::str::from_utf8(&out).unwrap(), r#""a\"b\\c\n\u0001\u003c\u003e\u0026\u2028\u2029é""#);
    }

    #[test]
    fn allowed_header() {
        assert_eq!(allowed_mask(""), Ok(ALL_CLIENT_TYPES));
        assert_eq!(allowed_mask("*"), Ok(ALL_CLIENT_TYPES));
        assert_eq!(allowed_mask("CALL, Pub"), Ok((1 << CALL) | (1 << PUB)));
        assert!(allowed_mask("call, nope").is_err());
    }

    #[test]
    fn new_uuid_is_v4() {
        let u = new_uuid();
        assert_eq!(parse_uuid(&u).as_deref(), Some(u.as_str()));
        assert_eq!(&u[14..15], "4");
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(serde_json::Value::from),
            (-4000i32..4000).prop_map(|i| serde_json::Value::from(f64::from(i) / 8.0)),
            ".*".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                prop::collection::btree_map(".*", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn parse_never_panics(data in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_client(&data, ALL_CLIENT_TYPES);
            let _ = parse_server(&data);
            let _ = parse_call_payload(&data);
            let _ = parse_pub_payload(&data);
            let _ = normalize_args(&data);
        }

        #[test]
        fn parse_never_panics_on_mutated_frames(pos in 0usize..120, byte in any::<u8>()) {
            let mut f = call(r#", "args": {"k": [1, "a\u00e9", null, true]}"#).into_bytes();
            let p = pos % f.len();
            f[p] = byte;
            let _ = parse_client(&f, ALL_CLIENT_TYPES);
        }

        #[test]
        fn args_roundtrip_semantically(v in json_value(), pretty in any::<bool>()) {
            let raw = if pretty { serde_json::to_vec_pretty(&v).unwrap() } else { serde_json::to_vec(&v).unwrap() };
            let f = build_call(U, "u", 1, Some(&raw)).unwrap();
            let m = parse_client(&f, ALL_CLIENT_TYPES).unwrap();
            let back: serde_json::Value = serde_json::from_slice(m.args.as_deref().unwrap()).unwrap();
            prop_assert_eq!(&back, &v);
            // normalization is idempotent and has no insignificant whitespace left
            let again = normalize_args(m.args.as_deref().unwrap()).unwrap();
            prop_assert_eq!(again.as_slice(), m.args.as_deref().unwrap());
            let res = build_res(U, "u", m.args.as_deref());
            let s = parse_server(&res).unwrap();
            let back: serde_json::Value = serde_json::from_slice(s.args.as_deref().unwrap()).unwrap();
            prop_assert_eq!(back, v);
        }

        #[test]
        fn strings_roundtrip(s in ".*") {
            let mut out = Vec::new();
            write_str(&mut out, &s);
            let back: String = serde_json::from_slice(&out).unwrap();
            prop_assert_eq!(back, s.clone());
            let f = build_sub(U, &s, false, false);
            let m = parse_client(&f, ALL_CLIENT_TYPES).unwrap();
            prop_assert_eq!(m.channel.as_deref(), Some(s.as_str()));
        }

        #[test]
        fn validation_agrees_with_serde(data in "[\\[\\]{}\",:0-9a-tv-z \\\\.eE+-]{0,40}") {
            let ours = normalize_args(data.as_bytes()).is_ok();
            let theirs = serde_json::from_str::<serde_json::Value>(&data).is_ok();
            prop_assert_eq!(ours, theirs, "{:?}", data);
        }
    }
}

#[cfg(feature = "python")]
pub mod python {
    //! Bindings: `rustext.ClientMessage`, `parse_client_message`, the builders.

    use super::{allowed_mask, normalize_args, parse_client, parse_server, parse_uuid, CallPayload, ClientMsg, Error};
    use super::{ACK, ALL_CLIENT_TYPES, CALL, EVNT, NACK, PUB, RES, SUB, UNSB};
    use crate::errors::ErrorKind;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyList, PyString};

    fn decode_err(e: Error) -> PyErr {
        ErrorKind::JugglerDecode.err(e.to_string())
    }

    fn opt_bytes(py: Python<'_>, v: Option<Vec<u8>>) -> Option<Py<PyBytes>> {
        v.map(|a| PyBytes::new(py, &a).unbind())
    }

    /// A parsed client frame. `args` stays raw JSON bytes (never decoded).
    #[pyclass(frozen, module = "rustext", name = "ClientMessage")]
    pub struct ClientMessage {
        #[pyo3(get, name = "type")]
        msg_type: u32,
        #[pyo3(get)]
        uuid: Py<PyString>,
        #[pyo3(get)]
        uri: Option<Py<PyString>>,
        #[pyo3(get)]
        timeout_ns: Option<i64>,
        #[pyo3(get)]
        channel: Option<Py<PyString>>,
        #[pyo3(get)]
        pattern: bool,
        #[pyo3(get)]
        args: Option<Py<PyBytes>>,
    }

    #[pymethods]
    impl ClientMessage {
        fn __repr__(&self, py: Python<'_>) -> String {
            let target = self.uri.as_ref().or(self.channel.as_ref()).map(|s| s.bind(py).to_string()).unwrap_or_default();
            format!("ClientMessage(type={}, uuid={}, target={:?})", self.msg_type, self.uuid.bind(py), target)
        }
    }

    /// A parsed server frame (for clients). `args` is raw JSON bytes.
    #[pyclass(frozen, module = "rustext", name = "ServerMessage")]
    pub struct ServerMessage {
        #[pyo3(get, name = "type")]
        msg_type: u32,
        #[pyo3(get)]
        uuid: Py<PyString>,
        #[pyo3(get)]
        for_uuid: Py<PyString>,
        #[pyo3(get)]
        for_type: Option<u32>,
        #[pyo3(get)]
        uri: Option<Py<PyString>>,
        #[pyo3(get)]
        channel: Option<Py<PyString>>,
        #[pyo3(get)]
        pattern: Option<Py<PyString>>,
        #[pyo3(get)]
        code: Option<i64>,
        #[pyo3(get)]
        message: Option<Py<PyString>>,
        #[pyo3(get)]
        args: Option<Py<PyBytes>>,
    }

    #[pymethods]
    impl ServerMessage {
        fn __repr__(&self, py: Python<'_>) -> String {
            format!("ServerMessage(type={}, uuid={}, for={})", self.msg_type, self.uuid.bind(py), self.for_uuid.bind(py))
        }
    }

    /// The Redis call/result payload.
    #[pyclass(frozen, module = "rustext", name = "CallPayload")]
    pub struct PyCallPayload {
        #[pyo3(get)]
        conn_uuid: Py<PyString>,
        #[pyo3(get)]
        msg_uuid: Py<PyString>,
        #[pyo3(get)]
        uri: Py<PyString>,
        #[pyo3(get)]
        args: Option<Py<PyBytes>>,
    }

    #[pymethods]
    impl PyCallPayload {
        fn __repr__(&self, py: Python<'_>) -> String {
            format!("CallPayload(msg_uuid={}, uri={:?})", self.msg_uuid.bind(py), self.uri.bind(py).to_string())
        }
    }

    fn opt_str(py: Python<'_>, s: Option<String>) -> Option<Py<PyString>> {
        s.map(|s| PyString::new(py, &s).unbind())
    }

    /// Borrow the bytes of a `str` (UTF-8) or `bytes` frame.
    fn with_frame<R>(frame: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> PyResult<R>) -> PyResult<R> {
        if let Ok(s) = frame.cast::<PyString>() {
            let text = s.to_str()?;
            f(text.as_bytes())
        } else if let Ok(b) = frame.cast::<PyBytes>() {
            f(b.as_bytes())
        } else {
            Err(pyo3::exceptions::PyTypeError::new_err("frame must be str or bytes"))
        }
    }

    fn client_message(py: Python<'_>, m: ClientMsg) -> ClientMessage {
        ClientMessage {
            msg_type: m.msg_type,
            uuid: PyString::new(py, &m.uuid).unbind(),
            uri: opt_str(py, m.uri),
            timeout_ns: m.timeout_ns,
            channel: opt_str(py, m.channel),
            pattern: m.pattern,
            args: opt_bytes(py, m.args),
        }
    }

    #[pyfunction]
    #[pyo3(signature = (frame, allowed = ALL_CLIENT_TYPES))]
    fn parse_client_message(py: Python<'_>, frame: &Bound<'_, PyAny>, allowed: u32) -> PyResult<ClientMessage> {
        with_frame(frame, |b| parse_client(b, allowed).map(|m| client_message(py, m)).map_err(decode_err))
    }

    #[pyfunction]
    fn parse_server_message(py: Python<'_>, frame: &Bound<'_, PyAny>) -> PyResult<ServerMessage> {
        with_frame(frame, |b| {
            let m = parse_server(b).map_err(decode_err)?;
            Ok(ServerMessage {
                msg_type: m.msg_type,
                uuid: PyString::new(py, &m.uuid).unbind(),
                for_uuid: PyString::new(py, &m.for_uuid).unbind(),
                for_type: m.for_type,
                uri: opt_str(py, m.uri),
                channel: opt_str(py, m.channel),
                pattern: opt_str(py, m.pattern),
                code: m.code,
                message: opt_str(py, m.message),
                args: opt_bytes(py, m.args),
            })
        })
    }

    #[pyfunction]
    fn parse_allowed_messages(header: &str) -> PyResult<u32> {
        allowed_mask(header).map_err(|e| ErrorKind::JugglerDecode.err(e))
    }

    #[pyfunction]
    fn build_ack<'py>(py: Python<'py>, for_uuid: &str, for_type: u32, target: &str) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &super::build_ack(for_uuid, for_type, target))
    }

    #[pyfunction]
    fn build_nack<'py>(
        py: Python<'py>,
        for_uuid: &str,
        for_type: u32,
        target: &str,
        code: i64,
        message: &str,
    ) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &super::build_nack(for_uuid, for_type, target, code, message))
    }

    #[pyfunction]
    fn build_res<'py>(py: Python<'py>, for_uuid: &str, uri: &str, args: Option<&[u8]>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &super::build_res(for_uuid, uri, args))
    }

    #[pyfunction]
    fn build_evnt<'py>(
        py: Python<'py>,
        for_uuid: &str,
        channel: &str,
        pattern: Option<&str>,
        args: Option<&[u8]>,
    ) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &super::build_evnt(for_uuid, channel, pattern, args))
    }

    #[pyfunction]
    #[pyo3(signature = (msg_uuid, uri, timeout_ns, args = None))]
    fn build_call<'py>(
        py: Python<'py>,
        msg_uuid: &str,
        uri: &str,
        timeout_ns: i64,
        args: Option<&[u8]>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &super::build_call(msg_uuid, uri, timeout_ns, args).map_err(decode_err)?))
    }

    #[pyfunction]
    #[pyo3(signature = (msg_uuid, channel, args = None))]
    fn build_pub<'py>(py: Python<'py>, msg_uuid: &str, channel: &str, args: Option<&[u8]>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &super::build_pub(msg_uuid, channel, args).map_err(decode_err)?))
    }

    #[pyfunction]
    #[pyo3(signature = (msg_uuid, channel, pattern = false))]
    fn build_sub<'py>(py: Python<'py>, msg_uuid: &str, channel: &str, pattern: bool) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &super::build_sub(msg_uuid, channel, pattern, false))
    }

    #[pyfunction]
    #[pyo3(signature = (msg_uuid, channel, pattern = false))]
    fn build_unsb<'py>(py: Python<'py>, msg_uuid: &str, channel: &str, pattern: bool) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &super::build_sub(msg_uuid, channel, pattern, true))
    }

    #[pyfunction]
    fn build_call_payload<'py>(
        py: Python<'py>,
        conn_uuid: &str,
        msg_uuid: &str,
        uri: &str,
        args: Option<&[u8]>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &super::build_call_payload(conn_uuid, msg_uuid, uri, args).map_err(decode_err)?))
    }

    fn call_payload(py: Python<'_>, p: CallPayload) -> PyCallPayload {
        PyCallPayload {
            conn_uuid: PyString::new(py, &p.conn_uuid).unbind(),
            msg_uuid: PyString::new(py, &p.msg_uuid).unbind(),
            uri: PyString::new(py, &p.uri).unbind(),
            args: opt_bytes(py, p.args),
        }
    }

    #[pyfunction]
    fn parse_call_payload(py: Python<'_>, data: &[u8]) -> PyResult<PyCallPayload> {
        super::parse_call_payload(data).map(|p| call_payload(py, p)).map_err(decode_err)
    }

    /// Parse many payloads in one crossing; an invalid one becomes `None`
    /// (the caller counts and drops it) instead of failing the batch.
    #[pyfunction]
    fn parse_call_payloads<'py>(py: Python<'py>, items: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for item in items.iter() {
            let parsed = match item.cast::<PyBytes>() {
                Ok(b) => super::parse_call_payload(b.as_bytes()).ok(),
                Err(_) => None,
            };
            match parsed {
                Some(p) => out.append(Py::new(py, call_payload(py, p))?)?,
                None => out.append(py.None())?,
            }
        }
        Ok(out)
    }

    #[pyfunction]
    fn build_pub_payload<'py>(py: Python<'py>, msg_uuid: &str, args: Option<&[u8]>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &super::build_pub_payload(msg_uuid, args).map_err(decode_err)?))
    }

    #[pyfunction]
    fn parse_pub_payload<'py>(py: Python<'py>, data: &[u8]) -> PyResult<(Bound<'py, PyString>, Option<Bound<'py, PyBytes>>)> {
        let (u, a) = super::parse_pub_payload(data).map_err(decode_err)?;
        Ok((PyString::new(py, &u), a.map(|a| PyBytes::new(py, &a))))
    }

    #[pyfunction]
    fn normalize_json<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &normalize_args(data).map_err(decode_err)?))
    }

    #[pyfunction]
    fn new_uuid() -> String {
        super::new_uuid()
    }

    #[pyfunction]
    fn canonical_uuid(s: &str) -> Option<String> {
        parse_uuid(s)
    }

    pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("CALL", CALL)?;
        m.add("PUB", PUB)?;
        m.add("SUB", SUB)?;
        m.add("UNSB", UNSB)?;
        m.add("NACK", NACK)?;
        m.add("ACK", ACK)?;
        m.add("RES", RES)?;
        m.add("EVNT", EVNT)?;
        m.add("ALL_CLIENT_TYPES", ALL_CLIENT_TYPES)?;
        m.add_class::<ClientMessage>()?;
        m.add_class::<ServerMessage>()?;
        m.add_class::<PyCallPayload>()?;
        m.add_function(wrap_pyfunction!(parse_client_message, m)?)?;
        m.add_function(wrap_pyfunction!(parse_server_message, m)?)?;
        m.add_function(wrap_pyfunction!(parse_allowed_messages, m)?)?;
        m.add_function(wrap_pyfunction!(build_ack, m)?)?;
        m.add_function(wrap_pyfunction!(build_nack, m)?)?;
        m.add_function(wrap_pyfunction!(build_res, m)?)?;
        m.add_function(wrap_pyfunction!(build_evnt, m)?)?;
        m.add_function(wrap_pyfunction!(build_call, m)?)?;
        m.add_function(wrap_pyfunction!(build_pub, m)?)?;
        m.add_function(wrap_pyfunction!(build_sub, m)?)?;
        m.add_function(wrap_pyfunction!(build_unsb, m)?)?;
        m.add_function(wrap_pyfunction!(build_call_payload, m)?)?;
        m.add_function(wrap_pyfunction!(parse_call_payload, m)?)?;
        m.add_function(wrap_pyfunction!(parse_call_payloads, m)?)?;
        m.add_function(wrap_pyfunction!(build_pub_payload, m)?)?;
        m.add_function(wrap_pyfunction!(parse_pub_payload, m)?)?;
        m.add_function(wrap_pyfunction!(normalize_json, m)?)?;
        m.add_function(wrap_pyfunction!(new_uuid, m)?)?;
        m.add_function(wrap_pyfunction!(canonical_uuid, m)?)?;
        Ok(())
    }
}
