//! Parsing: client and server frames, the Redis call/result/pub payloads,
//! UUIDs and the `Juggler-Allowed-Messages` header.

use super::scan::{decode_string, normalized, Kind, Scanner, Span};
use super::{CallPayload, ClientMsg, Error, PubPayload, Result, ServerMsg, ALL_CLIENT_TYPES, CALL, PUB, SUB, UNSB};

pub(super) fn span_str(b: &[u8], s: Span, name: &'static str) -> Result<Option<String>> {
    match s.kind {
        Kind::Null => Ok(None),
        Kind::String => {
            let esc = b[s.start + 1..s.end - 1].contains(&b'\\');
            Ok(Some(decode_string(b, s.start, s.end, esc).into_owned()))
        }
        _ => Err(Error::FieldType(name)),
    }
}

pub(super) fn span_int(b: &[u8], s: Span, name: &'static str) -> Result<Option<i64>> {
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

pub(super) fn span_bool(s: Span, name: &'static str) -> Result<Option<bool>> {
    match s.kind {
        Kind::Null => Ok(None),
        Kind::True => Ok(Some(true)),
        Kind::False => Ok(Some(false)),
        _ => Err(Error::FieldType(name)),
    }
}

pub(super) fn span_uuid(b: &[u8], s: Span, name: &'static str) -> Result<Option<String>> {
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

/// The `meta` and `payload` of an envelope.
pub(super) struct Envelope {
    msg_type: i64,
    uuid: Option<String>,
    payload: Option<Span>,
}

impl Envelope {
    /// The uuid and the payload object, both required.
    fn parts(self) -> Result<(String, Span)> {
        let uuid = self.uuid.ok_or(Error::Missing("meta.uuid"))?;
        match self.payload {
            Some(p) if p.kind == Kind::Object => Ok((uuid, p)),
            Some(p) if p.kind != Kind::Null => Err(Error::FieldType("payload")),
            _ => Err(Error::Missing("payload")),
        }
    }
}

pub(super) fn parse_envelope(b: &[u8]) -> Result<Envelope> {
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
    let (uuid, payload) = env.parts()?;
    let mut msg = ClientMsg {
        msg_type: t,
        uuid,
        uri: None,
        timeout_ns: None,
        channel: None,
        pattern: false,
        args: None,
        since: None,
        join_leave: false,
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
                } else if t == SUB && key.eq_ignore_ascii_case("since") {
                    msg.since = span_since(b, v)?;
                } else if t == SUB && key.eq_ignore_ascii_case("join_leave") {
                    msg.join_leave = span_bool(v, "join_leave")?.unwrap_or(false);
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

/// A non-negative JSON integer that fits u64 (offsets).
fn span_offset(b: &[u8], s: Span, name: &'static str) -> Result<Option<u64>> {
    match span_int(b, s, name)? {
        None => Ok(None),
        Some(v) => u64::try_from(v).map(Some).map_err(|_| Error::FieldType(name)),
    }
}

/// `since` of a SUB: `{"offset": N >= 0, "epoch": "E"}` (both required), or null.
fn span_since(b: &[u8], s: Span) -> Result<Option<(u64, String)>> {
    match s.kind {
        Kind::Null => return Ok(None),
        Kind::Object => {}
        _ => return Err(Error::FieldType("since")),
    }
    let mut offset = None;
    let mut epoch = None;
    Scanner::new(b).at(s.start).members(|key, v| {
        if key.eq_ignore_ascii_case("offset") {
            offset = span_offset(b, v, "since.offset")?;
        } else if key.eq_ignore_ascii_case("epoch") {
            epoch = span_str(b, v, "since.epoch")?;
        }
        Ok(())
    })?;
    Ok(Some((offset.ok_or(Error::Missing("since.offset"))?, epoch.ok_or(Error::Missing("since.epoch"))?)))
}

/// Parse one server frame (NACK, ACK, RES or EVNT). `args` is returned as sent.
pub fn parse_server(b: &[u8]) -> Result<ServerMsg> {
    let env = parse_envelope(b)?;
    let t = env.msg_type;
    if !matches!(t, 7..=10) {
        return Err(Error::UnknownType(t));
    }
    let (uuid, payload) = env.parts()?;
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
        } else if key.eq_ignore_ascii_case("offset") {
            msg.offset = span_offset(b, v, "offset")?;
        } else if key.eq_ignore_ascii_case("epoch") {
            msg.epoch = span_str(b, v, "epoch")?;
        } else if key.eq_ignore_ascii_case("recovered") {
            msg.recovered = span_bool(v, "recovered")?;
        } else if key.eq_ignore_ascii_case("join") && v.kind == Kind::Object {
            msg.join = Some(b[v.start..v.end].to_vec());
        } else if key.eq_ignore_ascii_case("leave") && v.kind == Kind::Object {
            msg.leave = Some(b[v.start..v.end].to_vec());
        }
        Ok(())
    })?;
    // notices (join/leave, an unrecoverable gap) answer no message: no `for`
    let notice = msg.msg_type == super::EVNT && (msg.join.is_some() || msg.leave.is_some() || msg.recovered == Some(false));
    msg.for_uuid = match for_uuid {
        Some(u) => u,
        None if notice => String::new(),
        None => return Err(Error::Missing("for")),
    };
    Ok(msg)
}

/// The members of a Redis payload `b`: UTF-8 holding one JSON object
/// (empty input: `Error::Empty`; another value: `Error::NotObject`).
pub(super) fn payload_members<F>(b: &[u8], f: F) -> Result<()>
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
    let mut trace: Option<Span> = None;
    payload_members(b, |key, v| {
        if key.eq_ignore_ascii_case("conn_uuid") {
            conn = span_uuid(b, v, "conn_uuid")?;
        } else if key.eq_ignore_ascii_case("msg_uuid") {
            msg = span_uuid(b, v, "msg_uuid")?;
        } else if key.eq_ignore_ascii_case("uri") {
            uri = span_str(b, v, "uri")?;
        } else if key.eq_ignore_ascii_case("args") {
            args = Some(v);
        } else if key == "trace" && v.kind == Kind::Object {
            trace = Some(v);
        }
        Ok(())
    })?;
    Ok(CallPayload {
        conn_uuid: conn.ok_or(Error::Missing("conn_uuid"))?,
        msg_uuid: msg.ok_or(Error::Missing("msg_uuid"))?,
        uri: uri.unwrap_or_default(),
        args: args.map(|a| normalized(&b[a.start..a.end])),
        trace: trace.map(|t| b[t.start..t.end].to_vec()),
    })
}

/// Parse a Redis PUBLISH body with its history position, if any.
pub fn parse_pub_payload_at(b: &[u8]) -> Result<PubPayload> {
    let mut msg = None;
    let mut args: Option<Span> = None;
    let mut offset = None;
    let mut epoch = None;
    payload_members(b, |key, v| {
        if key.eq_ignore_ascii_case("msg_uuid") {
            msg = span_uuid(b, v, "msg_uuid")?;
        } else if key.eq_ignore_ascii_case("args") {
            args = Some(v);
        } else if key.eq_ignore_ascii_case("offset") {
            offset = span_offset(b, v, "offset")?;
        } else if key.eq_ignore_ascii_case("epoch") {
            epoch = span_str(b, v, "epoch")?;
        }
        Ok(())
    })?;
    Ok(PubPayload {
        msg_uuid: msg.ok_or(Error::Missing("msg_uuid"))?,
        args: args.map(|a| normalized(&b[a.start..a.end])),
        offset,
        epoch,
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
