//! Header edits the caller asks for: fields deleted, fields added from
//! templates (`%[req.id]`, `%[src]`), the request id. Compiled by routing
//! from the configuration; applied here, by the codec, while a head is
//! rewritten, and by hyper's path on a `HeaderMap`.

use http::{HeaderName, HeaderValue};

/// A piece of a header value template.
#[derive(Clone, Debug)]
pub enum Piece {
    Lit(Box<[u8]>),
    /// `%[req.id]`: the request id (empty without `request_id`).
    ReqId,
    /// `%[src]`: the client's address.
    Src,
}

/// A header added by a rule: name and value template.
#[derive(Clone, Debug)]
pub struct Added {
    pub name: HeaderName,
    pub pieces: Box<[Piece]>,
    /// The value when it has no dynamic piece.
    pub fixed: Option<HeaderValue>,
}

impl Added {
    /// Write the value into `out`.
    pub fn render(&self, out: &mut Vec<u8>, req_id: &[u8], src: &[u8]) {
        for p in self.pieces.iter() {
            match p {
                Piece::Lit(b) => out.extend_from_slice(b),
                Piece::ReqId => out.extend_from_slice(req_id),
                Piece::Src => out.extend_from_slice(src),
            }
        }
    }

    /// The value for a `HeaderMap` (allocates only for dynamic values).
    pub fn value(&self, req_id: &[u8], src: &[u8]) -> Option<HeaderValue> {
        if let Some(v) = &self.fixed {
            return Some(v.clone());
        }
        let mut v = Vec::with_capacity(64);
        self.render(&mut v, req_id, src);
        HeaderValue::from_bytes(&v).ok()
    }
}

/// Header rules folded into their effect on one message.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    /// Fields removed from the incoming message (lower case).
    pub delete: Box<[HeaderName]>,
    /// Fields added, in order.
    pub add: Box<[Added]>,
}

impl Rules {
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.add.is_empty()
    }

    /// Whether an incoming field of this name goes.
    #[inline]
    pub fn deletes(&self, name: &[u8]) -> bool {
        self.delete
            .iter()
            .any(|d| d.as_str().len() == name.len() && d.as_str().as_bytes().eq_ignore_ascii_case(name))
    }
}

/// Headers a route adds to a message, and the request id.
#[derive(Clone, Copy, Default)]
pub struct Edits<'a> {
    pub add: &'a [Added],
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

/// An incoming request id worth keeping: 1 to 200 visible ASCII characters.
pub fn valid_request_id(v: &[u8]) -> bool {
    !v.is_empty() && v.len() <= 200 && v.iter().all(|&b| (0x21..0x7f).contains(&b))
}

