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
//!
//! Layout: `decode` (frames in), `encode` (frames out), `stream` (a
//! byte stream split into messages), `python` (the bindings), `tests`.

use std::borrow::Cow;
use std::fmt;

mod decode;
mod encode;
mod stream;
#[cfg(test)]
mod tests;

pub use decode::{decode, frame_len};
pub(crate) use decode::decode_body;
pub use encode::{encode_into, frame_size, write_frame, Sink, SliceSink};
pub use stream::{Stream, StreamError};

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


#[cfg(feature = "python")]
pub mod python;
