//! A validating JSON scanner over a byte slice: values are checked and their
//! spans returned, never decoded into a tree; strings decode on demand; raw
//! `args` are normalized the way Go re-encodes a `json.RawMessage`.

use std::borrow::Cow;

use super::{Error, Result, MAX_DEPTH};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
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
pub(super) struct Span {
    pub(super) kind: Kind,
    pub(super) start: usize,
    pub(super) end: usize,
}

pub(super) struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

#[inline]
pub(super) fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

impl<'a> Scanner<'a> {
    pub(super) fn new(b: &'a [u8]) -> Self {
        Scanner { b, i: 0 }
    }

    pub(super) fn at(&self, i: usize) -> Self {
        Scanner { b: self.b, i }
    }

    #[inline]
    pub(super) fn ws(&mut self) {
        while self.i < self.b.len() && is_ws(self.b[self.i]) {
            self.i += 1;
        }
    }

    #[inline]
    pub(super) fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    pub(super) fn err(&self, what: &'static str) -> Error {
        Error::Syntax { at: self.i, what }
    }

    pub(super) fn literal(&mut self, lit: &'static [u8], kind: Kind) -> Result<Kind> {
        if self.b[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(kind)
        } else {
            Err(self.err("invalid literal"))
        }
    }

    /// Validate one value starting at `self.i` (after whitespace); leaves `i` after it.
    pub(super) fn value(&mut self, depth: usize) -> Result<Span> {
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

    pub(super) fn object_skip(&mut self, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(Error::TooDeep);
        }
        self.i += 1; // '{'
        self.items(b'}', "expected ',' or '}'", |s| {
            s.key()?;
            s.value(depth).map(drop)
        })
    }

    pub(super) fn array_skip(&mut self, depth: usize) -> Result<()> {
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
    pub(super) fn items(&mut self, close: u8, expected: &'static str, mut item: impl FnMut(&mut Self) -> Result<()>) -> Result<()> {
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
    pub(super) fn key(&mut self) -> Result<(usize, usize, bool)> {
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
    pub(super) fn string(&mut self) -> Result<bool> {
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

    pub(super) fn number(&mut self) -> Result<Kind> {
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
    pub(super) fn members<F>(&mut self, mut f: F) -> Result<()>
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

pub(super) fn hex4(h: &[u8]) -> u32 {
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
pub(super) fn decode_string(b: &[u8], start: usize, end: usize, escaped: bool) -> Cow<'_, str> {
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

// ---------------------------------------------------------------------------
// Raw args normalization (Go's json.Compact with HTML escaping)
// ---------------------------------------------------------------------------

/// Whether `raw` (valid JSON) would change under [`normalize_into`].
pub(super) fn needs_normalize(raw: &[u8]) -> bool {
    raw.iter()
        .any(|&c| matches!(c, b' ' | b'\t' | b'\n' | b'\r' | b'<' | b'>' | b'&' | 0xE2))
}

/// Append `raw` (valid JSON) compacted, with `<`, `>`, `&`, U+2028 and U+2029
/// escaped inside strings: the bytes Go's encoder writes for a RawMessage.
pub(super) fn normalize_into(out: &mut Vec<u8>, raw: &[u8]) {
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
pub(super) fn normalized(raw: &[u8]) -> Vec<u8> {
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
