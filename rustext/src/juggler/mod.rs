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
//!
//! Layout:
//! - `scan`    the validating JSON scanner, string decoding, args normalization.
//! - `parse`   client/server frames, Redis payloads, UUIDs, the allowed-types header.
//! - `build`   server frames, client frames, Redis payloads (Go's encoder bytes).
//! - `python`  the PyO3 bindings (feature `python`).

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
    /// SUB (extension): recover from this position, `{"offset": N, "epoch": "E"}`.
    pub since: Option<(u64, String)>,
    /// SUB (extension): send join/leave notices of this channel.
    pub join_leave: bool,
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
    /// EVNT, SUB ACK (extension): the channel's history position.
    pub offset: Option<u64>,
    pub epoch: Option<String>,
    /// SUB ACK, EVNT (extension): whether missed events could be recovered.
    pub recovered: Option<bool>,
    /// EVNT (extension): a join or leave notice, raw JSON.
    pub join: Option<Vec<u8>>,
    pub leave: Option<Vec<u8>>,
}

/// A Redis PUBLISH body: `{"msg_uuid","args"}`, plus `offset` and `epoch`
/// on channels with history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubPayload {
    pub msg_uuid: String,
    pub args: Option<Vec<u8>>,
    pub offset: Option<u64>,
    pub epoch: Option<String>,
}

/// The Redis call/result payload `{"conn_uuid","msg_uuid","uri","args"}`,
/// and our optional `"trace"`: a JSON object of trace-context headers
/// (`traceparent`, ...) that Go callees ignore as an unknown field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPayload {
    pub conn_uuid: String,
    pub msg_uuid: String,
    pub uri: String,
    pub args: Option<Vec<u8>>,
    /// the raw `"trace"` object, when the payload has one
    pub trace: Option<Vec<u8>>,
}

mod build;
mod parse;
mod scan;

pub use build::{
    build_ack, build_call, build_call_payload, build_call_payload_traced, build_evnt, build_nack, build_pub, build_pub_payload, build_res,
    build_sub, build_sub_ack, build_sub_ext, write_str,
};
pub use parse::{
    allowed_mask, new_uuid, parse_call_payload, parse_client, parse_pub_payload, parse_pub_payload_at, parse_server,
    parse_uuid,
};
pub use scan::normalize_args;

#[cfg(test)]
mod tests;

pub mod fanout;
pub mod subscribers;

#[cfg(feature = "python")]
pub mod python;
