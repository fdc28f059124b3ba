//! Hand-written protobuf (proto3) codec of the six `pb.RRAPI` messages (rrseq.md).
//!
//! Sans-I/O: `decode(&[u8])` and `encode(&self, &mut Vec<u8>)`. Decoding
//! follows protobuf's rules: fields in any order, the last occurrence of a
//! scalar wins, unknown fields (and known field numbers carrying another
//! wire type) are skipped, strings must be UTF-8. Groups (wire types 3/4)
//! are refused. Encoding omits default values, as proto3 does.

use std::fmt;

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Truncated,
    VarintTooLong,
    BadWireType(u8),
    FieldZero,
    BadUtf8,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "truncated message"),
            DecodeError::VarintTooLong => write!(f, "varint longer than 10 bytes"),
            DecodeError::BadWireType(t) => write!(f, "unsupported wire type {t}"),
            DecodeError::FieldZero => write!(f, "field number 0"),
            DecodeError::BadUtf8 => write!(f, "string field is not UTF-8"),
        }
    }
}

impl std::error::Error for DecodeError {}

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// A cursor over one encoded message.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = *self.buf.get(self.pos).ok_or(DecodeError::Truncated)?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(DecodeError::VarintTooLong)
    }

    /// The next (field number, wire type), or None at the end.
    pub fn key(&mut self) -> Result<Option<(u32, u8)>, DecodeError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let k = self.varint()?;
        let field = k >> 3;
        if field == 0 {
            return Err(DecodeError::FieldZero);
        }
        let wt = (k & 7) as u8;
        if !matches!(wt, VARINT | I64 | LEN | I32) {
            return Err(DecodeError::BadWireType(wt));
        }
        Ok(Some((u32::try_from(field).unwrap_or(u32::MAX), wt)))
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.varint()?;
        let n = usize::try_from(n).map_err(|_| DecodeError::Truncated)?;
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    pub fn string(&mut self) -> Result<String, DecodeError> {
        let b = self.bytes()?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| DecodeError::BadUtf8)
    }

    /// Skip one value of wire type `wt`.
    pub fn skip(&mut self, wt: u8) -> Result<(), DecodeError> {
        let n = match wt {
            VARINT => {
                self.varint()?;
                return Ok(());
            }
            LEN => {
                self.bytes()?;
                return Ok(());
            }
            I64 => 8,
            I32 => 4,
            other => return Err(DecodeError::BadWireType(other)),
        };
        if self.buf.len() - self.pos < n {
            return Err(DecodeError::Truncated);
        }
        self.pos += n;
        Ok(())
    }
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wt: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wt));
}

fn put_uint(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_key(out, field, VARINT);
        put_varint(out, v);
    }
}

fn put_str(out: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        put_key(out, field, LEN);
        put_varint(out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
}

/// `message NextIDRequest { string name = 1; int64 range_size = 2; }`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NextIdRequest {
    pub name: String,
    pub range_size: i64,
}

/// `message NextIDReply { uint64 from_id = 1; uint64 to_id = 2; }`
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NextIdReply {
    pub from_id: u64,
    pub to_id: u64,
}

/// `message CurIDRequest { string name = 1; }`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CurIdRequest {
    pub name: String,
}

/// `message CurIDReply { uint64 cur_id = 1; }`
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CurIdReply {
    pub cur_id: u64,
}

/// `message SetIDRequest { string name = 1; uint64 new_id = 2; }`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetIdRequest {
    pub name: String,
    pub new_id: u64,
}

/// `message SetIDReply { bool success = 1; }`
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetIdReply {
    pub success: bool,
}

/// Decode a message whose fields are (number, kind) with kind string or varint:
/// calls `on_str(field, s)` / `on_int(field, v)` for known fields, skips the rest.
fn decode_fields(
    buf: &[u8],
    strings: &[u32],
    ints: &[u32],
    mut on_str: impl FnMut(u32, String),
    mut on_int: impl FnMut(u32, u64),
) -> Result<(), DecodeError> {
    let mut r = Reader::new(buf);
    while let Some((field, wt)) = r.key()? {
        if wt == LEN && strings.contains(&field) {
            on_str(field, r.string()?);
        } else if wt == VARINT && ints.contains(&field) {
            on_int(field, r.varint()?);
        } else {
            r.skip(wt)?;
        }
    }
    Ok(())
}

impl NextIdRequest {
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut m = Self::default();
        let mut size = 0u64;
        decode_fields(buf, &[1], &[2], |_, s| m.name = s, |_, v| size = v)?;
        m.range_size = size as i64; // int64: two's complement on the wire
        Ok(m)
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_str(out, 1, &self.name);
        put_uint(out, 2, self.range_size as u64);
    }
}

impl NextIdReply {
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut m = Self::default();
        decode_fields(buf, &[], &[1, 2], |_, _| {}, |f, v| {
            if f == 1 {
                m.from_id = v
            } else {
                m.to_id = v
            }
        })?;
        Ok(m)
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_uint(out, 1, self.from_id);
        put_uint(out, 2, self.to_id);
    }
}

impl CurIdRequest {
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut m = Self::default();
        decode_fields(buf, &[1], &[], |_, s| m.name = s, |_, _| {})?;
        Ok(m)
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_str(out, 1, &self.name);
    }
}

impl CurIdReply {
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut m = Self::default();
        decode_fields(buf, &[], &[1], |_, _| {}, |_, v| m.cur_id = v)?;
        Ok(m)
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_uint(out, 1, self.cur_id);
    }
}

impl SetIdRequest {
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut m = Self::default();
        decode_fields(buf, &[1], &[2], |_, s| m.name = s, |_, v| m.new_id = v)?;
        Ok(m)
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_str(out, 1, &self.name);
        put_uint(out, 2, self.new_id);
    }
}

impl SetIdReply {
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut m = Self::default();
        decode_fields(buf, &[], &[1], |_, _| {}, |_, v| m.success = v != 0)?;
        Ok(m)
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_uint(out, 1, u64::from(self.success));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn enc<F: Fn(&mut Vec<u8>)>(f: F) -> Vec<u8> {
        let mut v = Vec::new();
        f(&mut v);
        v
    }

    #[test]
    fn known_bytes() {
        // protoc --encode of NextIDRequest{name:"ab", range_size:300}
        let b = enc(|o| NextIdRequest { name: "ab".into(), range_size: 300 }.encode(o));
        assert_eq!(b, [0x0a, 2, b'a', b'b', 0x10, 0xac, 0x02]);
        assert_eq!(enc(|o| NextIdReply::default().encode(o)), Vec::<u8>::new());
        assert_eq!(enc(|o| SetIdReply { success: true }.encode(o)), [0x08, 1]);
    }

    #[test]
    fn negative_int64_is_ten_bytes() {
        let m = NextIdRequest { name: String::new(), range_size: -1 };
        let b = enc(|o| m.encode(o));
        assert_eq!(b.len(), 11);
        assert_eq!(NextIdRequest::decode(&b).unwrap(), m);
    }

    #[test]
    fn unknown_fields_are_skipped_and_last_wins() {
        let mut b = Vec::new();
        put_key(&mut b, 9, I64);
        b.extend_from_slice(&[0; 8]);
        put_key(&mut b, 7, I32);
        b.extend_from_slice(&[0; 4]);
        put_key(&mut b, 8, LEN);
        put_varint(&mut b, 3);
        b.extend_from_slice(b"xyz");
        put_str(&mut b, 1, "first");
        put_key(&mut b, 1, VARINT); // known number, other wire type: skipped
        put_varint(&mut b, 5);
        put_str(&mut b, 1, "last");
        put_uint(&mut b, 2, 7);
        assert_eq!(SetIdRequest::decode(&b).unwrap(), SetIdRequest { name: "last".into(), new_id: 7 });
    }

    #[test]
    fn errors() {
        assert_eq!(CurIdRequest::decode(&[0x0a, 5, b'a']), Err(DecodeError::Truncated));
        assert_eq!(CurIdRequest::decode(&[0x0a, 1, 0xff]), Err(DecodeError::BadUtf8));
        assert_eq!(CurIdRequest::decode(&[0x0b]), Err(DecodeError::BadWireType(3)));
        assert_eq!(CurIdRequest::decode(&[0x00]), Err(DecodeError::FieldZero));
        assert_eq!(CurIdReply::decode(&[0x08; 1]), Err(DecodeError::Truncated));
        assert_eq!(CurIdReply::decode(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1]), Err(DecodeError::VarintTooLong));
    }

    proptest! {
        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = NextIdRequest::decode(&b);
            let _ = NextIdReply::decode(&b);
            let _ = CurIdRequest::decode(&b);
            let _ = CurIdReply::decode(&b);
            let _ = SetIdRequest::decode(&b);
            let _ = SetIdReply::decode(&b);
        }

        #[test]
        fn roundtrip(name in ".{0,40}", size in any::<i64>(), a in any::<u64>(), c in any::<u64>(), ok in any::<bool>()) {
            let m = NextIdRequest { name: name.clone(), range_size: size };
            prop_assert_eq!(NextIdRequest::decode(&enc(|o| m.encode(o))).unwrap(), m);
            let m = NextIdReply { from_id: a, to_id: c };
            prop_assert_eq!(NextIdReply::decode(&enc(|o| m.encode(o))).unwrap(), m);
            let m = CurIdRequest { name: name.clone() };
            prop_assert_eq!(CurIdRequest::decode(&enc(|o| m.encode(o))).unwrap(), m);
            let m = CurIdReply { cur_id: a };
            prop_assert_eq!(CurIdReply::decode(&enc(|o| m.encode(o))).unwrap(), m);
            let m = SetIdRequest { name, new_id: c };
            prop_assert_eq!(SetIdRequest::decode(&enc(|o| m.encode(o))).unwrap(), m);
            let m = SetIdReply { success: ok };
            prop_assert_eq!(SetIdReply::decode(&enc(|o| m.encode(o))).unwrap(), m);
        }

        #[test]
        fn mutated_messages_never_panic(name in ".{0,20}", size in any::<i64>(), pos in any::<usize>(), byte in any::<u8>()) {
            let mut b = enc(|o| NextIdRequest { name: name.clone(), range_size: size }.encode(o));
            if !b.is_empty() {
                let i = pos % b.len();
                b[i] = byte;
            }
            let _ = NextIdRequest::decode(&b);
            b.truncate(pos % (b.len() + 1));
            let _ = NextIdRequest::decode(&b);
        }
    }
}
