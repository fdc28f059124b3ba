//! rpcx message codec (sans-I/O), wire-compatible with rpcx v1.8/v1.9
//! (`shared/protocols/rpcx.md`).
//!
//! ```text
//! 0    magic 0x08
//! 1    version (ignored on decode, 0 on encode)
//! 2    type(0x80) heartbeat(0x40) oneway(0x20) compress(0x1C) status(0x03)
//! 3    serialize(0xF0), low nibble reserved (ignored on decode, 0 on encode)
//! 4..12  seq u64 BE
//! 12..16 total length u32 BE (bytes after this field)
//! then   u32 len + service path, u32 len + method,
//!        u32 len + metadata (repeated u32 klen, key, u32 vlen, value),
//!        u32 len + payload (gzip-compressed when compress = 1)
//! ```
//!
//! Where rpcx is lenient we choose (the `lenient` vectors):
//! - reserved bits (version byte, low nibble of byte 3): ignored, as rpcx does,
//!   so that frames of a future minor revision still decode;
//! - payload length field that disagrees with the total length: **rejected**
//!   (rpcx ignores the field and takes the rest of the body; a disagreement
//!   means a corrupt or hostile frame, and no rpcx encoder writes one);
//! - a repeated metadata key: the last value wins, as in rpcx (the pair keeps
//!   the position of its last occurrence);
//! - also stricter than rpcx: bytes after the payload, strings that are not
//!   UTF-8 and an unknown compress type are errors (rpcx errs only on the last).
//!
//! Bounds: `max_message_len` caps the total length field before anything is
//! read past the header; `max_decompressed` caps a gzip payload's inflated size
//! (decompression stops one byte past the limit).

use std::borrow::Cow;
use std::fmt;
use std::io::{Read, Write};

use crate::framing::{FeedError, FrameConfig, FrameError, FrameSplitter};

pub const MAGIC: u8 = 0x08;
/// Header plus total-length field.
pub const HEADER_LEN: usize = 16;
pub const COMPRESS_NONE: u8 = 0;
pub const COMPRESS_GZIP: u8 = 1;
pub const STATUS_NORMAL: u8 = 0;
pub const STATUS_ERROR: u8 = 1;
/// Metadata key of a response's error text.
pub const ERROR_KEY: &str = "__rpcx_error__";

/// Decoder limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest total length field accepted (bytes after the 16-byte prefix).
    pub max_message_len: usize,
    /// Largest inflated gzip payload accepted.
    pub max_decompressed: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_message_len: 64 << 20, max_decompressed: 64 << 20 }
    }
}

/// Why a frame is not a valid rpcx message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RpcxError {
    /// Fewer bytes than the frame needs (`what` names the missing part).
    Truncated(&'static str),
    BadMagic(u8),
    /// Total length over `max_message_len` (checked before reading the body).
    TooLong { len: usize, max: usize },
    /// A section length that does not fit in the body.
    BadLength(&'static str),
    /// Metadata whose pairs do not fill its section exactly.
    Metadata,
    /// Bytes after the payload, or a payload length that disagrees with the body.
    PayloadLength { field: usize, actual: usize },
    /// Bytes after the frame (single-frame decode only).
    Trailing(usize),
    NotUtf8(&'static str),
    UnsupportedCompressor(u8),
    Gzip(String),
    DecompressedTooLarge(usize),
    /// Encode: a field out of range.
    Invalid(String),
}

impl fmt::Display for RpcxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcxError::Truncated(w) => write!(f, "rpcx frame truncated in {w}"),
            RpcxError::BadMagic(b) => write!(f, "wrong magic number: {b:#04x}"),
            RpcxError::TooLong { len, max } => write!(f, "message is too long: {len} > {max} bytes"),
            RpcxError::BadLength(w) => write!(f, "{w} length exceeds the message"),
            RpcxError::Metadata => write!(f, "wrong metadata lines: some keys or values are missing"),
            RpcxError::PayloadLength { field, actual } => {
                write!(f, "payload length field {field} disagrees with the {actual} bytes left")
            }
            RpcxError::Trailing(n) => write!(f, "{n} bytes after the rpcx frame"),
            RpcxError::NotUtf8(w) => write!(f, "{w} is not valid UTF-8"),
            RpcxError::UnsupportedCompressor(c) => write!(f, "unsupported compressor {c}"),
            RpcxError::Gzip(e) => write!(f, "gzip: {e}"),
            RpcxError::DecompressedTooLarge(max) => {
                write!(f, "decompressed payload exceeds the limit of {max} bytes")
            }
            RpcxError::Invalid(m) => write!(f, "invalid rpcx message: {m}"),
        }
    }
}

impl std::error::Error for RpcxError {}

/// The fixed header fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub response: bool,
    pub heartbeat: bool,
    pub oneway: bool,
    pub compress: u8,
    pub status: u8,
    pub serialize: u8,
    pub seq: u64,
}

impl Header {
    fn parse(b: &[u8]) -> Header {
        Header {
            response: b[2] & 0x80 != 0,
            heartbeat: b[2] & 0x40 != 0,
            oneway: b[2] & 0x20 != 0,
            compress: (b[2] & 0x1C) >> 2,
            status: b[2] & 0x03,
            serialize: b[3] >> 4,
            seq: u64::from_be_bytes(b[4..12].try_into().expect("8 bytes")),
        }
    }

    fn validate(&self) -> Result<(), RpcxError> {
        if self.compress > 7 || self.status > 3 || self.serialize > 15 {
            return Err(RpcxError::Invalid(format!(
                "compress {} (0..7), status {} (0..3), serialize {} (0..15) out of range",
                self.compress, self.status, self.serialize
            )));
        }
        if self.compress > COMPRESS_GZIP {
            return Err(RpcxError::UnsupportedCompressor(self.compress));
        }
        Ok(())
    }
}

/// A decoded message borrowing from the frame (the payload is owned only
/// when it was inflated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageRef<'a> {
    pub header: Header,
    pub service_path: &'a str,
    pub service_method: &'a str,
    pub metadata: Vec<(&'a str, &'a str)>,
    pub payload: Cow<'a, [u8]>,
}

/// An owned message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    pub header: Header,
    pub service_path: String,
    pub service_method: String,
    pub metadata: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl MessageRef<'_> {
    pub fn to_owned(&self) -> Message {
        Message {
            header: self.header,
            service_path: self.service_path.to_owned(),
            service_method: self.service_method.to_owned(),
            metadata: self.metadata.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            payload: self.payload.to_vec(),
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn u32(&mut self, what: &'static str) -> Result<usize, RpcxError> {
        if self.buf.len() < 4 {
            return Err(RpcxError::BadLength(what));
        }
        let (h, t) = self.buf.split_at(4);
        self.buf = t;
        Ok(u32::from_be_bytes(h.try_into().expect("4 bytes")) as usize)
    }

    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], RpcxError> {
        if self.buf.len() < n {
            return Err(RpcxError::BadLength(what));
        }
        let (h, t) = self.buf.split_at(n);
        self.buf = t;
        Ok(h)
    }

    fn string(&mut self, what: &'static str) -> Result<&'a str, RpcxError> {
        let n = self.u32(what)?;
        let b = self.bytes(n, what)?;
        std::str::from_utf8(b).map_err(|_| RpcxError::NotUtf8(what))
    }
}

/// Length of the frame at the start of `buf`, once its 16-byte prefix is
/// there: `Ok(None)` = need more bytes; errors on a bad magic or an over-long
/// total length (before anything past the prefix is read).
pub fn frame_len(buf: &[u8], limits: &Limits) -> Result<Option<usize>, RpcxError> {
    if let Some(&b) = buf.first() {
        if b != MAGIC {
            return Err(RpcxError::BadMagic(b));
        }
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let total = u32::from_be_bytes(buf[12..16].try_into().expect("4 bytes")) as usize;
    if total > limits.max_message_len {
        return Err(RpcxError::TooLong { len: total, max: limits.max_message_len });
    }
    Ok(Some(HEADER_LEN + total))
}

/// Decode exactly one frame (`buf` must hold it and nothing else).
pub fn decode<'a>(buf: &'a [u8], limits: &Limits) -> Result<MessageRef<'a>, RpcxError> {
    if buf.is_empty() {
        return Err(RpcxError::Truncated("header"));
    }
    let Some(len) = frame_len(buf, limits)? else {
        return Err(RpcxError::Truncated(if buf.len() < 12 { "header" } else { "total length" }));
    };
    if buf.len() < len {
        return Err(RpcxError::Truncated("body"));
    }
    if buf.len() > len {
        return Err(RpcxError::Trailing(buf.len() - len));
    }
    decode_body(buf, limits)
}

/// Decode a frame whose length was already checked by [`frame_len`].
fn decode_body<'a>(buf: &'a [u8], limits: &Limits) -> Result<MessageRef<'a>, RpcxError> {
    let header = Header::parse(buf);
    if header.compress > COMPRESS_GZIP {
        return Err(RpcxError::UnsupportedCompressor(header.compress));
    }
    let mut r = Reader { buf: &buf[HEADER_LEN..] };
    let service_path = r.string("service path")?;
    let service_method = r.string("service method")?;
    let meta_len = r.u32("metadata")?;
    let meta = r.bytes(meta_len, "metadata")?;
    let metadata = decode_metadata(meta)?;
    let field = r.u32("payload")?;
    if field != r.buf.len() {
        return Err(RpcxError::PayloadLength { field, actual: r.buf.len() });
    }
    let wire = r.buf;
    let payload = if header.compress == COMPRESS_GZIP {
        Cow::Owned(gunzip(wire, limits.max_decompressed)?)
    } else {
        Cow::Borrowed(wire)
    };
    Ok(MessageRef { header, service_path, service_method, metadata, payload })
}

fn decode_metadata(meta: &[u8]) -> Result<Vec<(&str, &str)>, RpcxError> {
    fn take<'a>(m: &mut &'a [u8]) -> Result<&'a str, RpcxError> {
        let all: &'a [u8] = m;
        if all.len() < 4 {
            return Err(RpcxError::Metadata);
        }
        let n = u32::from_be_bytes(all[..4].try_into().expect("4 bytes")) as usize;
        if all.len() - 4 < n {
            return Err(RpcxError::Metadata);
        }
        let s = std::str::from_utf8(&all[4..4 + n]).map_err(|_| RpcxError::NotUtf8("metadata"))?;
        *m = &all[4 + n..];
        Ok(s)
    }
    let mut out: Vec<(&str, &str)> = Vec::new();
    let mut rest = meta;
    while !rest.is_empty() {
        let k = take(&mut rest)?;
        let v = take(&mut rest)?;
        out.push((k, v));
    }
    dedup_last_wins(&mut out);
    Ok(out)
}

/// Keep only the last pair of each key, at its position.
fn dedup_last_wins<K: PartialEq + Copy + std::hash::Hash + Eq, V>(pairs: &mut Vec<(K, V)>) {
    if pairs.len() < 2 {
        return;
    }
    let mut seen = std::collections::HashSet::with_capacity(pairs.len());
    let mut keep = vec![false; pairs.len()];
    for (i, (k, _)) in pairs.iter().enumerate().rev() {
        keep[i] = seen.insert(*k);
    }
    if keep.iter().all(|&k| k) {
        return;
    }
    let mut i = 0;
    pairs.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

fn gunzip(wire: &[u8], max: usize) -> Result<Vec<u8>, RpcxError> {
    let dec = flate2::read::MultiGzDecoder::new(wire);
    let mut out = Vec::with_capacity(wire.len().saturating_mul(4).min(max).min(1 << 20));
    dec.take(max as u64 + 1).read_to_end(&mut out).map_err(|e| RpcxError::Gzip(e.to_string()))?;
    if out.len() > max {
        return Err(RpcxError::DecompressedTooLarge(max));
    }
    Ok(out)
}

fn gzip(payload: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(payload.len() / 2 + 64), flate2::Compression::fast());
    enc.write_all(payload).expect("writing to a Vec cannot fail");
    enc.finish().expect("writing to a Vec cannot fail")
}

/// Where an encoder writes: a growing `Vec` or a preallocated slice.
pub trait Sink {
    fn put(&mut self, b: &[u8]);
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// A slice filled front to back (its length must be the frame's exact size).
pub struct SliceSink<'a> {
    pub buf: &'a mut [u8],
    pub pos: usize,
}

impl Sink for SliceSink<'_> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
}

fn check_u32(n: usize, what: &str) -> Result<(), RpcxError> {
    if n > u32::MAX as usize {
        return Err(RpcxError::Invalid(format!("{what} longer than 4 GiB")));
    }
    Ok(())
}

/// Size of the whole frame whose (already compressed, if gzip) payload has
/// `wire_len` bytes; validates the header and every length field.
pub fn frame_size<K: AsRef<str>, V: AsRef<str>>(
    header: &Header,
    service_path: &str,
    service_method: &str,
    metadata: &[(K, V)],
    wire_len: usize,
) -> Result<usize, RpcxError> {
    header.validate()?;
    check_u32(service_path.len(), "service path")?;
    check_u32(service_method.len(), "service method")?;
    let mut meta_len = 0usize;
    for (k, v) in metadata {
        check_u32(k.as_ref().len(), "metadata key")?;
        check_u32(v.as_ref().len(), "metadata value")?;
        meta_len += 8 + k.as_ref().len() + v.as_ref().len();
    }
    check_u32(meta_len, "metadata")?;
    check_u32(wire_len, "payload")?;
    let total = 16 + service_path.len() + service_method.len() + meta_len + wire_len;
    check_u32(total, "message")?;
    Ok(HEADER_LEN + total)
}

/// Write a frame whose size `frame_size` accepted (`size` is its result).
pub fn write_frame<K: AsRef<str>, V: AsRef<str>, S: Sink>(
    header: &Header,
    service_path: &str,
    service_method: &str,
    metadata: &[(K, V)],
    wire: &[u8],
    size: usize,
    out: &mut S,
) {
    let meta_len: usize = metadata.iter().map(|(k, v)| 8 + k.as_ref().len() + v.as_ref().len()).sum();
    let mut b2 = (header.compress << 2) | header.status;
    if header.response {
        b2 |= 0x80;
    }
    if header.heartbeat {
        b2 |= 0x40;
    }
    if header.oneway {
        b2 |= 0x20;
    }
    out.put(&[MAGIC, 0, b2, header.serialize << 4]);
    out.put(&header.seq.to_be_bytes());
    let be = |n: usize| (n as u32).to_be_bytes();
    out.put(&be(size - HEADER_LEN));
    out.put(&be(service_path.len()));
    out.put(service_path.as_bytes());
    out.put(&be(service_method.len()));
    out.put(service_method.as_bytes());
    out.put(&be(meta_len));
    for (k, v) in metadata {
        let (k, v) = (k.as_ref(), v.as_ref());
        out.put(&be(k.len()));
        out.put(k.as_bytes());
        out.put(&be(v.len()));
        out.put(v.as_bytes());
    }
    out.put(&be(wire.len()));
    out.put(wire);
}

/// Append one frame to `out` (on error `out` is left as it was).
pub fn encode_into<K: AsRef<str>, V: AsRef<str>>(
    header: &Header,
    service_path: &str,
    service_method: &str,
    metadata: &[(K, V)],
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), RpcxError> {
    header.validate()?;
    let compressed;
    let wire: &[u8] = if header.compress == COMPRESS_GZIP {
        compressed = gzip(payload);
        &compressed
    } else {
        payload
    };
    let size = frame_size(header, service_path, service_method, metadata, wire.len())?;
    out.reserve(size);
    write_frame(header, service_path, service_method, metadata, wire, size, out);
    Ok(())
}

impl Message {
    pub fn encode(&self) -> Result<Vec<u8>, RpcxError> {
        let mut out = Vec::new();
        encode_into(&self.header, &self.service_path, &self.service_method, &self.metadata, &self.payload, &mut out)?;
        Ok(out)
    }
}

/// Stream decoder: feed read buffers, get whole messages. A bad magic or an
/// over-long length fails as soon as the 1 or 16 bytes that show it arrive.
pub struct Stream {
    limits: Limits,
    splitter: FrameSplitter,
}

impl Stream {
    pub fn new(limits: Limits) -> Self {
        let cfg = FrameConfig {
            offset: 12,
            width: 4,
            max_frame: limits.max_message_len,
            strip_header: false,
            magic: Some(MAGIC),
            ..FrameConfig::default()
        };
        Stream { limits, splitter: FrameSplitter::new(cfg).expect("valid rpcx framing") }
    }

    pub fn buffered(&self) -> usize {
        self.splitter.buffered()
    }

    /// Decode every complete frame of the stream so far, calling `emit` on each.
    pub fn feed<E, F>(&mut self, data: &[u8], mut emit: F) -> Result<(), StreamError<E>>
    where
        F: FnMut(MessageRef<'_>) -> Result<(), E>,
    {
        let limits = self.limits;
        self.splitter
            .feed(data, |frame| match decode_body(frame, &limits) {
                Ok(m) => emit(m).map_err(StreamError::Consumer),
                Err(e) => Err(StreamError::Rpcx(e)),
            })
            .map_err(|e| match e {
                FeedError::Frame(FrameError::TooLarge { len, max }) => {
                    StreamError::Rpcx(RpcxError::TooLong { len: len as usize, max })
                }
                FeedError::Frame(FrameError::BadMagic(b)) => StreamError::Rpcx(RpcxError::BadMagic(b)),
                FeedError::Frame(e) => StreamError::Rpcx(RpcxError::Invalid(e.to_string())),
                FeedError::Consumer(e) => e,
            })
    }
}

/// An error of [`Stream::feed`].
#[derive(Debug, PartialEq, Eq)]
pub enum StreamError<E> {
    Rpcx(RpcxError),
    Consumer(E),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Message {
        Message {
            header: Header { serialize: 1, seq: 1, ..Header::default() },
            service_path: "Arith".into(),
            service_method: "Mul".into(),
            metadata: vec![],
            payload: br#"{"A":10,"B":20}"#.to_vec(),
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn request_json_vector() {
        let wire = hex("08000010000000000000000100000027000000054172697468000000034d756c000000000000000f7b2241223a31302c2242223a32307d");
        assert_eq!(sample().encode().unwrap(), wire);
        assert_eq!(decode(&wire, &Limits::default()).unwrap().to_owned(), sample());
    }

    #[test]
    fn rejects() {
        let wire = sample().encode().unwrap();
        let l = Limits::default();
        assert_eq!(decode(&[], &l), Err(RpcxError::Truncated("header")));
        assert_eq!(decode(&[9], &l), Err(RpcxError::BadMagic(9)));
        assert!(matches!(decode(&wire[..wire.len() - 1], &l), Err(RpcxError::Truncated(_))));
        let mut long = wire.clone();
        long.push(0);
        assert_eq!(decode(&long, &l), Err(RpcxError::Trailing(1)));
        let small = Limits { max_message_len: 16, ..l };
        assert!(matches!(decode(&wire, &small), Err(RpcxError::TooLong { .. })));
    }

    #[test]
    fn gzip_roundtrip_and_bomb_limit() {
        let mut m = sample();
        m.header.compress = COMPRESS_GZIP;
        m.payload = vec![b'x'; 100_000];
        let wire = m.encode().unwrap();
        assert!(wire.len() < 2000);
        assert_eq!(decode(&wire, &Limits::default()).unwrap().to_owned(), m);
        let tight = Limits { max_decompressed: 99_999, ..Limits::default() };
        assert_eq!(decode(&wire, &tight), Err(RpcxError::DecompressedTooLarge(99_999)));
    }

    #[test]
    fn duplicate_keys_last_wins() {
        let mut m = sample();
        m.metadata = vec![("a".into(), "1".into()), ("b".into(), "x".into()), ("a".into(), "2".into())];
        let wire = m.encode().unwrap();
        let d = decode(&wire, &Limits::default()).unwrap();
        assert_eq!(d.metadata, vec![("b", "x"), ("a", "2")]);
    }

    #[test]
    fn stream_splits_and_fails_fast_on_garbage() {
        let mut wire = sample().encode().unwrap();
        wire.extend(sample().encode().unwrap());
        let mut s = Stream::new(Limits::default());
        let mut n = 0;
        for c in wire.chunks(7) {
            s.feed(c, |m| {
                assert_eq!(m.service_path, "Arith");
                n += 1;
                Ok::<(), ()>(())
            })
            .unwrap();
        }
        assert_eq!(n, 2);
        let mut s = Stream::new(Limits::default());
        assert_eq!(s.feed(b"G", |_| Ok::<(), ()>(())), Err(StreamError::Rpcx(RpcxError::BadMagic(b'G'))));
    }

    #[test]
    fn encode_rejects_bad_fields() {
        let mut m = sample();
        m.header.compress = 2;
        assert_eq!(m.encode(), Err(RpcxError::UnsupportedCompressor(2)));
        m.header.compress = 0;
        m.header.serialize = 16;
        assert!(matches!(m.encode(), Err(RpcxError::Invalid(_))));
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        (
            (any::<bool>(), any::<bool>(), any::<bool>(), 0u8..2, 0u8..4, 0u8..16, any::<u64>()),
            ".{0,20}",
            ".{0,20}",
            proptest::collection::vec(("[a-z]{1,3}", ".{0,8}"), 0..6),
            proptest::collection::vec(any::<u8>(), 0..500),
        )
            .prop_map(|((response, heartbeat, oneway, compress, status, serialize, seq), p, me, meta, payload)| {
                let mut metadata: Vec<(String, String)> = meta;
                // decode keeps one pair per key: generate unique keys.
                let mut seen = std::collections::HashSet::new();
                metadata.retain(|(k, _)| seen.insert(k.clone()));
                Message {
                    header: Header { response, heartbeat, oneway, compress, status, serialize, seq },
                    service_path: p,
                    service_method: me,
                    metadata,
                    payload,
                }
            })
    }

    proptest! {
        #[test]
        fn decode_encode_roundtrip(m in arb_message()) {
            let wire = m.encode().unwrap();
            prop_assert_eq!(decode(&wire, &Limits::default()).unwrap().to_owned(), m);
        }

        #[test]
        fn stream_any_chunking(ms in proptest::collection::vec(arb_message(), 0..6), chunk in 1usize..100) {
            let mut wire = Vec::new();
            for m in &ms { wire.extend(m.encode().unwrap()); }
            let mut s = Stream::new(Limits::default());
            let mut got = Vec::new();
            for c in wire.chunks(chunk) {
                s.feed(c, |m| { got.push(m.to_owned()); Ok::<(), ()>(()) }).unwrap();
            }
            prop_assert_eq!(got, ms);
        }

        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
            let limits = Limits { max_message_len: 256, max_decompressed: 1024 };
            let _ = decode(&data, &limits);
            let mut d = data.clone();
            if !d.is_empty() { d[0] = MAGIC; }
            let _ = decode(&d, &limits);
            let mut s = Stream::new(limits);
            let _ = s.feed(&d, |_| Ok::<(), ()>(()));
            prop_assert!(s.buffered() <= HEADER_LEN + 256);
        }

        #[test]
        fn mutated_frames_never_panic(m in arb_message(), pos in any::<usize>(), byte in any::<u8>()) {
            let mut wire = m.encode().unwrap();
            let i = pos % wire.len();
            wire[i] = byte;
            let _ = decode(&wire, &Limits { max_message_len: 4096, max_decompressed: 4096 });
        }
    }
}

#[cfg(feature = "python")]
pub mod python {
    use super::*;
    use crate::errors::ErrorKind;
    use crate::framing::python::with_bytes;
    use pyo3::exceptions::PyValueError;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

    pub(crate) fn rpcx_err(e: RpcxError) -> PyErr {
        match e {
            RpcxError::TooLong { .. } => ErrorKind::FrameTooLarge.err(e.to_string()),
            RpcxError::Invalid(_) => PyValueError::new_err(e.to_string()),
            _ => ErrorKind::RpcxDecode.err(e.to_string()),
        }
    }

    fn limits(max_message_len: usize, max_decompressed: usize) -> Limits {
        Limits { max_message_len, max_decompressed }
    }

    /// One rpcx message (see `rustext._native.pyi`).
    #[pyclass(module = "rustext", name = "RpcxMessage", eq)]
    pub struct PyMessage {
        #[pyo3(get, set)]
        message_type: u8,
        #[pyo3(get, set)]
        heartbeat: bool,
        #[pyo3(get, set)]
        oneway: bool,
        #[pyo3(get, set)]
        compress_type: u8,
        #[pyo3(get, set)]
        status: u8,
        #[pyo3(get, set)]
        serialize_type: u8,
        #[pyo3(get, set)]
        seq: u64,
        #[pyo3(get, set)]
        service_path: Py<PyString>,
        #[pyo3(get, set)]
        service_method: Py<PyString>,
        meta: Vec<(String, String)>,
        #[pyo3(get, set)]
        payload: Py<PyBytes>,
    }

    impl PartialEq for PyMessage {
        fn eq(&self, o: &Self) -> bool {
            Python::attach(|py| {
                self.header() == o.header()
                    && self.meta == o.meta
                    && self.payload.as_bytes(py) == o.payload.as_bytes(py)
                    && self.service_path.bind(py).to_str().ok() == o.service_path.bind(py).to_str().ok()
                    && self.service_method.bind(py).to_str().ok() == o.service_method.bind(py).to_str().ok()
            })
        }
    }

    impl PyMessage {
        fn header(&self) -> Header {
            Header {
                response: self.message_type != 0,
                heartbeat: self.heartbeat,
                oneway: self.oneway,
                compress: self.compress_type,
                status: self.status,
                serialize: self.serialize_type,
                seq: self.seq,
            }
        }

        fn from_ref(py: Python<'_>, m: &MessageRef<'_>) -> PyMessage {
            let h = m.header;
            PyMessage {
                message_type: u8::from(h.response),
                heartbeat: h.heartbeat,
                oneway: h.oneway,
                compress_type: h.compress,
                status: h.status,
                serialize_type: h.serialize,
                seq: h.seq,
                service_path: PyString::new(py, m.service_path).unbind(),
                service_method: PyString::new(py, m.service_method).unbind(),
                meta: m.metadata.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
                payload: PyBytes::new(py, &m.payload).unbind(),
            }
        }

        fn encode_to(&self, py: Python<'_>, out: &mut Vec<u8>) -> PyResult<()> {
            let path = self.service_path.bind(py).to_str()?;
            let method = self.service_method.bind(py).to_str()?;
            if self.message_type > 1 {
                return Err(PyValueError::new_err("message_type must be 0 (request) or 1 (response)"));
            }
            encode_into(&self.header(), path, method, &self.meta, self.payload.as_bytes(py), out).map_err(rpcx_err)
        }

        fn reply_header(&self, error: bool) -> Header {
            let mut h = self.header();
            h.response = true;
            h.oneway = false;
            h.status = if error { STATUS_ERROR } else { STATUS_NORMAL };
            h
        }
    }

    /// One frame straight into a Python bytes object (no intermediate buffer
    /// unless the payload is gzip-compressed).
    fn encode_py<'py>(
        py: Python<'py>,
        h: &Header,
        path: &str,
        method: &str,
        meta: &[(String, String)],
        payload: &[u8],
    ) -> PyResult<Bound<'py, PyBytes>> {
        if h.compress == COMPRESS_GZIP {
            let mut out = Vec::new();
            encode_into(h, path, method, meta, payload, &mut out).map_err(rpcx_err)?;
            return Ok(PyBytes::new(py, &out));
        }
        let size = frame_size(h, path, method, meta, payload.len()).map_err(rpcx_err)?;
        PyBytes::new_with(py, size, |buf| {
            write_frame(h, path, method, meta, payload, size, &mut SliceSink { buf, pos: 0 });
            Ok(())
        })
    }

    fn meta_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, String)>> {
        let Some(obj) = obj else { return Ok(Vec::new()) };
        if obj.is_none() {
            return Ok(Vec::new());
        }
        let items = if let Ok(d) = obj.cast::<pyo3::types::PyDict>() { d.items().into_any() } else { obj.clone() };
        let mut out = Vec::new();
        for pair in items.try_iter()? {
            let (k, v): (String, String) = pair?.extract()?;
            out.push((k, v));
        }
        Ok(out)
    }

    #[pymethods]
    impl PyMessage {
        #[new]
        #[pyo3(signature = (*, message_type=0, heartbeat=false, oneway=false, compress_type=0, status=0,
                            serialize_type=0, seq=0, service_path=None, service_method=None,
                            metadata=None, payload=None))]
        #[allow(clippy::too_many_arguments)]
        fn new(
            py: Python<'_>,
            message_type: u8,
            heartbeat: bool,
            oneway: bool,
            compress_type: u8,
            status: u8,
            serialize_type: u8,
            seq: u64,
            service_path: Option<Bound<'_, PyString>>,
            service_method: Option<Bound<'_, PyString>>,
            metadata: Option<&Bound<'_, PyAny>>,
            payload: Option<Bound<'_, PyBytes>>,
        ) -> PyResult<Self> {
            Ok(PyMessage {
                message_type,
                heartbeat,
                oneway,
                compress_type,
                status,
                serialize_type,
                seq,
                service_path: service_path.unwrap_or_else(|| PyString::new(py, "")).unbind(),
                service_method: service_method.unwrap_or_else(|| PyString::new(py, "")).unbind(),
                meta: meta_from_py(metadata)?,
                payload: payload.unwrap_or_else(|| PyBytes::new(py, b"")).unbind(),
            })
        }

        /// Ordered (key, value) pairs.
        #[getter]
        fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
            let items: Vec<Bound<'py, PyTuple>> = self
                .meta
                .iter()
                .map(|(k, v)| PyTuple::new(py, [k.as_str(), v.as_str()]))
                .collect::<PyResult<_>>()?;
            PyList::new(py, items)
        }

        #[setter]
        fn set_metadata(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
            self.meta = meta_from_py(Some(value))?;
            Ok(())
        }

        /// The value of metadata `key` (the last one), or `default`.
        #[pyo3(signature = (key, default=None))]
        fn get_meta(&self, key: &str, default: Option<String>) -> Option<String> {
            self.meta.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone()).or(default)
        }

        #[getter]
        fn is_response(&self) -> bool {
            self.message_type != 0
        }

        /// The error text of an error response (`__rpcx_error__`), else None.
        #[getter]
        fn error(&self) -> Option<String> {
            if self.status == STATUS_ERROR {
                Some(self.get_meta(ERROR_KEY, None).unwrap_or_default())
            } else {
                None
            }
        }

        fn encode<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
            if self.message_type > 1 {
                return Err(PyValueError::new_err("message_type must be 0 (request) or 1 (response)"));
            }
            let path = self.service_path.bind(py).to_str()?;
            let method = self.service_method.bind(py).to_str()?;
            encode_py(py, &self.header(), path, method, &self.meta, self.payload.as_bytes(py))
        }

        /// The response frame to this request, built without a Python message:
        /// seq, path, method, serialize and compress type are the request's
        /// (as rpcx's server does). `error` sets status error and `__rpcx_error__`.
        #[pyo3(signature = (payload=None, *, error=None, metadata=None))]
        fn encode_reply<'py>(
            &self,
            py: Python<'py>,
            payload: Option<&Bound<'py, PyAny>>,
            error: Option<&str>,
            metadata: Option<&Bound<'py, PyAny>>,
        ) -> PyResult<Bound<'py, PyBytes>> {
            let mut meta = meta_from_py(metadata)?;
            if let Some(e) = error {
                meta.push((ERROR_KEY.to_owned(), e.to_owned()));
            }
            let h = self.reply_header(error.is_some());
            let path = self.service_path.bind(py).to_str()?;
            let method = self.service_method.bind(py).to_str()?;
            match payload {
                None => encode_py(py, &h, path, method, &meta, b""),
                Some(p) => with_bytes(p, |p| encode_py(py, &h, path, method, &meta, p)),
            }
        }

        /// The response to this request as a message (see `encode_reply`).
        #[pyo3(signature = (payload=None, *, error=None, metadata=None))]
        fn reply(
            &self,
            py: Python<'_>,
            payload: Option<Bound<'_, PyBytes>>,
            error: Option<&str>,
            metadata: Option<&Bound<'_, PyAny>>,
        ) -> PyResult<PyMessage> {
            let mut meta = meta_from_py(metadata)?;
            let mut status = STATUS_NORMAL;
            if let Some(e) = error {
                meta.push((ERROR_KEY.to_owned(), e.to_owned()));
                status = STATUS_ERROR;
            }
            Ok(PyMessage {
                message_type: 1,
                heartbeat: self.heartbeat,
                oneway: false,
                compress_type: self.compress_type,
                status,
                serialize_type: self.serialize_type,
                seq: self.seq,
                service_path: self.service_path.clone_ref(py),
                service_method: self.service_method.clone_ref(py),
                meta,
                payload: payload.map(|p| p.unbind()).unwrap_or_else(|| PyBytes::new(py, b"").unbind()),
            })
        }

        fn __repr__(&self, py: Python<'_>) -> String {
            format!(
                "RpcxMessage(message_type={}, heartbeat={}, oneway={}, compress_type={}, status={}, serialize_type={}, seq={}, service_path={:?}, service_method={:?}, metadata={:?}, payload=<{} bytes>)",
                self.message_type,
                self.heartbeat,
                self.oneway,
                self.compress_type,
                self.status,
                self.serialize_type,
                self.seq,
                self.service_path.bind(py).to_string(),
                self.service_method.bind(py).to_string(),
                self.meta,
                self.payload.as_bytes(py).len()
            )
        }
    }

    /// Decode exactly one frame.
    #[pyfunction]
    #[pyo3(signature = (frame, *, max_message_len=64<<20, max_decompressed=64<<20))]
    fn decode_rpcx(py: Python<'_>, frame: &Bound<'_, PyAny>, max_message_len: usize, max_decompressed: usize) -> PyResult<PyMessage> {
        let l = limits(max_message_len, max_decompressed);
        with_bytes(frame, |b| {
            let m = decode(b, &l).map_err(rpcx_err)?;
            Ok(PyMessage::from_ref(py, &m))
        })
    }

    /// A request frame in one call, without building an `RpcxMessage`
    /// (the client's hot path).
    #[pyfunction]
    #[pyo3(signature = (seq, payload, *, service_path="", service_method="", metadata=None,
                        serialize_type=0, oneway=false, heartbeat=false, compress_type=0))]
    #[allow(clippy::too_many_arguments)]
    fn encode_rpcx_request<'py>(
        py: Python<'py>,
        seq: u64,
        payload: &Bound<'py, PyAny>,
        service_path: &str,
        service_method: &str,
        metadata: Option<&Bound<'py, PyAny>>,
        serialize_type: u8,
        oneway: bool,
        heartbeat: bool,
        compress_type: u8,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let meta = meta_from_py(metadata)?;
        let h = Header {
            response: false,
            heartbeat,
            oneway,
            compress: compress_type,
            status: STATUS_NORMAL,
            serialize: serialize_type,
            seq,
        };
        with_bytes(payload, |p| encode_py(py, &h, service_path, service_method, &meta, p))
    }

    /// Encode many messages into one buffer (one write).
    #[pyfunction]
    fn encode_rpcx_many<'py>(py: Python<'py>, messages: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = Vec::new();
        for m in messages.try_iter()? {
            let m = m?;
            let m = m.cast::<PyMessage>()?.borrow();
            m.encode_to(py, &mut out)?;
        }
        Ok(PyBytes::new(py, &out))
    }

    /// Encode many replies in one call: `items` is an iterable of
    /// `(request, payload)` or `(request, payload, error)`; returns one buffer,
    /// written in place (one allocation for the whole batch).
    #[pyfunction]
    fn encode_rpcx_replies<'py>(py: Python<'py>, items: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        struct Item<'py> {
            header: Header,
            path: Bound<'py, PyString>,
            method: Bound<'py, PyString>,
            meta: Vec<(String, String)>,
            payload: Option<Bound<'py, PyBytes>>,
            gz: Option<Vec<u8>>,
            size: usize,
        }
        let mut batch: Vec<Item<'py>> = Vec::new();
        let mut total = 0usize;
        for it in items.try_iter()? {
            let it = it?;
            let t = it.cast::<PyTuple>()?;
            if t.len() != 2 && t.len() != 3 {
                return Err(PyValueError::new_err("items must be (request, payload[, error])"));
            }
            let req = t.get_item(0)?;
            let req = req.cast::<PyMessage>()?.borrow();
            let payload = t.get_item(1)?;
            let error: Option<String> = if t.len() == 3 { t.get_item(2)?.extract()? } else { None };
            let payload: Option<Bound<'py, PyBytes>> = if payload.is_none() {
                None
            } else if let Ok(b) = payload.cast::<PyBytes>() {
                Some(b.clone())
            } else {
                Some(with_bytes(&payload, |b| Ok(PyBytes::new(py, b)))?)
            };
            let mut meta = Vec::new();
            if let Some(e) = error.as_deref() {
                meta.push((ERROR_KEY.to_owned(), e.to_owned()));
            }
            let header = req.reply_header(error.is_some());
            let path = req.service_path.bind(py).clone();
            let method = req.service_method.bind(py).clone();
            let raw: &[u8] = payload.as_ref().map(|p| p.as_bytes()).unwrap_or(b"");
            let gz = (header.compress == COMPRESS_GZIP).then(|| gzip(raw));
            let wire_len = gz.as_ref().map(|g| g.len()).unwrap_or(raw.len());
            let size = frame_size(&header, path.to_str()?, method.to_str()?, &meta, wire_len).map_err(rpcx_err)?;
            total += size;
            batch.push(Item { header, path, method, meta, payload, gz, size });
        }
        PyBytes::new_with(py, total, |buf| {
            let mut sink = SliceSink { buf, pos: 0 };
            for item in &batch {
                let raw: &[u8] = item.payload.as_ref().map(|p| p.as_bytes()).unwrap_or(b"");
                let wire = item.gz.as_deref().unwrap_or(raw);
                write_frame(&item.header, item.path.to_str()?, item.method.to_str()?, &item.meta, wire, item.size, &mut sink);
            }
            Ok(())
        })
    }

    /// Stream decoder (see `rustext._native.pyi`).
    #[pyclass(module = "rustext", name = "RpcxStream")]
    pub struct PyStream {
        inner: Stream,
        failed: bool,
    }

    #[pymethods]
    impl PyStream {
        #[new]
        #[pyo3(signature = (*, max_message_len=64<<20, max_decompressed=64<<20))]
        fn new(max_message_len: usize, max_decompressed: usize) -> Self {
            PyStream { inner: Stream::new(limits(max_message_len, max_decompressed)), failed: false }
        }

        fn feed<'py>(&mut self, py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
            if self.failed {
                return Err(ErrorKind::RpcxDecode.err("stream failed earlier; it accepts no more input"));
            }
            let out = PyList::empty(py);
            let inner = &mut self.inner;
            let r = with_bytes(data, |b| {
                inner
                    .feed(b, |m| {
                        let obj = Bound::new(py, PyMessage::from_ref(py, &m))?;
                        out.append(obj)
                    })
                    .map_err(|e| match e {
                        StreamError::Rpcx(e) => rpcx_err(e),
                        StreamError::Consumer(e) => e,
                    })
            });
            if r.is_err() {
                self.failed = true;
            }
            r?;
            Ok(out)
        }

        #[getter]
        fn buffered(&self) -> usize {
            self.inner.buffered()
        }

        #[getter]
        fn failed(&self) -> bool {
            self.failed
        }
    }

    pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_class::<PyMessage>()?;
        m.add_class::<PyStream>()?;
        m.add_function(wrap_pyfunction!(decode_rpcx, m)?)?;
        m.add_function(wrap_pyfunction!(encode_rpcx_many, m)?)?;
        m.add_function(wrap_pyfunction!(encode_rpcx_request, m)?)?;
        m.add_function(wrap_pyfunction!(encode_rpcx_replies, m)?)?;
        m.add("RPCX_REQUEST", 0)?;
        m.add("RPCX_RESPONSE", 1)?;
        m.add("RPCX_COMPRESS_NONE", COMPRESS_NONE)?;
        m.add("RPCX_COMPRESS_GZIP", COMPRESS_GZIP)?;
        m.add("RPCX_STATUS_NORMAL", STATUS_NORMAL)?;
        m.add("RPCX_STATUS_ERROR", STATUS_ERROR)?;
        m.add("RPCX_SERIALIZE_RAW", 0)?;
        m.add("RPCX_SERIALIZE_JSON", 1)?;
        m.add("RPCX_SERIALIZE_PROTOBUF", 2)?;
        m.add("RPCX_SERIALIZE_MSGPACK", 3)?;
        m.add("RPCX_SERIALIZE_THRIFT", 4)?;
        Ok(())
    }
}
