//! gRPC over HTTP/2, the parts that are not HTTP/2: length-prefixed messages,
//! status codes, `grpc-timeout` and `grpc-message` encodings. Sans-I/O.
//!
//! A message on the wire is `flag (1 byte: 0 plain, 1 compressed) | length
//! (u32 big endian) | bytes`. A unary call carries exactly one message each way.

use std::fmt;
use std::time::Duration;

/// gRPC status codes (the subset of meaning we produce and map; any u32 decodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    pub fn from_u32(v: u32) -> Code {
        use Code::*;
        const ALL: [Code; 17] = [
            Ok, Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
            PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
            Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated,
        ];
        ALL.get(v as usize).copied().unwrap_or(Unknown)
    }

    /// The decimal text of the `grpc-status` trailer.
    pub fn as_str(self) -> &'static str {
        const S: [&str; 17] = [
            "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
        ];
        S[self as usize]
    }
}

/// Why a unary body is not one well-formed gRPC message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// No message at all (empty body).
    Empty,
    /// The body ends inside a message.
    Truncated,
    /// More than one message (or trailing bytes) in a unary call.
    Trailing,
    /// The compressed flag is set: we accept identity only.
    Compressed,
    /// A flag byte other than 0 or 1.
    BadFlag(u8),
    /// Declared length above the limit.
    TooLarge(usize),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Empty => write!(f, "no request message"),
            FrameError::Truncated => write!(f, "truncated gRPC message"),
            FrameError::Trailing => write!(f, "more than one message in a unary call"),
            FrameError::Compressed => write!(f, "compressed messages are not supported (identity only)"),
            FrameError::BadFlag(b) => write!(f, "bad gRPC message flag {b}"),
            FrameError::TooLarge(n) => write!(f, "message of {n} bytes is over the limit"),
        }
    }
}

impl std::error::Error for FrameError {}

impl FrameError {
    /// The status a server answers with.
    pub fn code(&self) -> Code {
        match self {
            FrameError::Compressed => Code::Unimplemented,
            FrameError::TooLarge(_) => Code::ResourceExhausted,
            _ => Code::Internal,
        }
    }
}

/// Parse a `grpc-status` value (anything but a decimal number is UNKNOWN).
pub fn parse_code(v: &[u8]) -> Code {
    std::str::from_utf8(v).ok().and_then(|s| s.parse::<u32>().ok()).map_or(Code::Unknown, Code::from_u32)
}

/// Prefix `msg` with its 5-byte header.
pub fn encode_message(msg: &[u8], out: &mut Vec<u8>) {
    out.reserve(5 + msg.len());
    out.push(0);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
}

/// Check a message header as soon as 5 bytes are there (reject oversize before buffering).
pub fn check_header(head: &[u8], max: usize) -> Result<Option<usize>, FrameError> {
    if head.len() < 5 {
        return Ok(None);
    }
    match head[0] {
        0 => {}
        1 => return Err(FrameError::Compressed),
        b => return Err(FrameError::BadFlag(b)),
    }
    let n = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if n > max {
        return Err(FrameError::TooLarge(n));
    }
    Ok(Some(n))
}

/// The one message of a whole unary body.
pub fn unary_message(body: &[u8], max: usize) -> Result<&[u8], FrameError> {
    if body.is_empty() {
        return Err(FrameError::Empty);
    }
    let n = check_header(body, max)?.ok_or(FrameError::Truncated)?;
    let rest = &body[5..];
    match rest.len().cmp(&n) {
        std::cmp::Ordering::Less => Err(FrameError::Truncated),
        std::cmp::Ordering::Greater => Err(FrameError::Trailing),
        std::cmp::Ordering::Equal => Ok(rest),
    }
}

/// Parse a `grpc-timeout` value (`1-8 digits` + `H M S m u n`).
pub fn parse_timeout(v: &[u8]) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit[0] {
        b'H' => Duration::from_secs(n.checked_mul(3600)?),
        b'M' => Duration::from_secs(n.checked_mul(60)?),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Format a timeout for the `grpc-timeout` header (at most 8 digits, rounded up).
pub fn format_timeout(d: Duration) -> String {
    let ns = d.as_nanos();
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    for (div, unit) in units {
        let v = ns.div_ceil(div);
        if v < 100_000_000 {
            return format!("{v}{unit}");
        }
    }
    "99999999H".to_owned()
}

/// Percent-encode a `grpc-message` (space through `~` except `%` stay as is).
pub fn percent_encode(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for &b in msg.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decode a `grpc-message` (invalid escapes stay literal, invalid UTF-8 is replaced).
pub fn percent_decode(v: &[u8]) -> String {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        if v[i] == b'%' && i + 2 < v.len() {
            let hex = std::str::from_utf8(&v[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(b) = hex {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(v[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unary() {
        let mut b = Vec::new();
        encode_message(b"abc", &mut b);
        assert_eq!(b, [0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(unary_message(&b, 10).unwrap(), b"abc");
        assert_eq!(unary_message(&b, 2), Err(FrameError::TooLarge(3)));
        assert_eq!(unary_message(&b[..6], 10), Err(FrameError::Truncated));
        assert_eq!(unary_message(&b[..3], 10), Err(FrameError::Truncated));
        assert_eq!(unary_message(&[], 10), Err(FrameError::Empty));
        let mut two = b.clone();
        two.extend_from_slice(&b);
        assert_eq!(unary_message(&two, 10), Err(FrameError::Trailing));
        b[0] = 1;
        assert_eq!(unary_message(&b, 10), Err(FrameError::Compressed));
        b[0] = 7;
        assert_eq!(unary_message(&b, 10), Err(FrameError::BadFlag(7)));
        let mut empty = Vec::new();
        encode_message(b"", &mut empty);
        assert_eq!(unary_message(&empty, 10).unwrap(), b"");
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout(b"100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_timeout(b"2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(b"5n"), Some(Duration::from_nanos(5)));
        assert_eq!(parse_timeout(b"m"), None);
        assert_eq!(parse_timeout(b"123456789m"), None);
        assert_eq!(parse_timeout(b"1x"), None);
        assert_eq!(parse_timeout(b"-1m"), None);
        assert_eq!(format_timeout(Duration::from_millis(250)), "250000u");
        assert_eq!(parse_timeout(format_timeout(Duration::from_secs(5)).as_bytes()), Some(Duration::from_secs(5)));
    }

    #[test]
    fn messages() {
        assert_eq!(percent_encode("a b%c\né"), "a b%25c%0A%C3%A9");
        assert_eq!(percent_decode(b"a b%25c%0A%C3%A9"), "a b%c\né");
        assert_eq!(percent_decode(b"100%"), "100%");
        assert_eq!(percent_decode(b"%zz%4"), "%zz%4");
    }

    proptest! {
        #[test]
        fn percent_roundtrip(s in ".{0,40}") {
            prop_assert_eq!(percent_decode(percent_encode(&s).as_bytes()), s);
        }

        #[test]
        fn frame_parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..32), max in 0usize..64) {
            let _ = unary_message(&b, max);
            let _ = parse_timeout(&b);
            let _ = percent_decode(&b);
        }

        #[test]
        fn timeout_roundtrip_rounds_up(ns in 0u64..(1u64 << 50)) {
            let d = Duration::from_nanos(ns);
            let back = parse_timeout(format_timeout(d).as_bytes()).unwrap();
            prop_assert!(back >= d);
        }
    }
}
