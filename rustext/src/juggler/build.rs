//! Building: server frames (ACK/NACK/RES/EVNT, each ending in `\n`), client
//! frames and the Redis payloads, byte for byte as the Go encoder writes them.

use super::parse::new_uuid;
use super::scan::normalize_args;
use super::{Result, ACK, CALL, EVNT, NACK, PUB, RES, SUB, UNSB};

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

pub(super) fn write_int(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(v.to_string().as_bytes());
}

pub(super) fn meta(out: &mut Vec<u8>, t: u32, uuid: &str) {
    out.extend_from_slice(b"{\"meta\":{\"type\":");
    write_int(out, t as i64);
    out.extend_from_slice(b",\"uuid\":");
    write_str(out, uuid);
    out.extend_from_slice(b"},\"payload\":{");
}

pub(super) fn target_key(for_type: u32) -> &'static [u8] {
    if for_type == CALL {
        b",\"uri\":"
    } else {
        b",\"channel\":"
    }
}

/// `key` (with its quotes, colon and any leading comma) then `v` as a JSON
/// string: one field of a frame or payload being built.
#[inline]
pub(super) fn put_str(out: &mut Vec<u8>, key: &[u8], v: &str) {
    out.extend_from_slice(key);
    write_str(out, v);
}

/// `,"args":` and the (normalized) args when there are any: clients and
/// payloads omit absent args, where server frames write `null`.
#[inline]
pub(super) fn put_opt_args(out: &mut Vec<u8>, args: Option<&[u8]>) {
    if let Some(a) = args {
        out.extend_from_slice(b",\"args\":");
        out.extend_from_slice(a);
    }
}

/// The part ACK and NACK frames share: meta (fresh uuid), `for`,
/// `for_type` and the target (`uri` of a CALL, else `channel`).
pub(super) fn answer_head(out: &mut Vec<u8>, t: u32, for_uuid: &str, for_type: u32, target: &str) {
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

pub(super) fn write_args(out: &mut Vec<u8>, args: Option<&[u8]>) {
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

/// EVNT frame; `pattern` only when a pattern subscription matched; `position`
/// (offset, epoch) on channels with history (an extension original clients ignore).
pub fn build_evnt(
    for_uuid: &str,
    channel: &str,
    pattern: Option<&str>,
    args: Option<&[u8]>,
    position: Option<(u64, &str)>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(200 + channel.len() + args.map_or(4, <[u8]>::len));
    meta(&mut out, EVNT, &new_uuid());
    put_str(&mut out, b"\"for\":", for_uuid);
    put_str(&mut out, b",\"channel\":", channel);
    if let Some(p) = pattern {
        put_str(&mut out, b",\"pattern\":", p);
    }
    out.extend_from_slice(b",\"args\":");
    write_args(&mut out, args);
    put_position(&mut out, position);
    out.extend_from_slice(b"}}\n");
    out
}

fn put_position(out: &mut Vec<u8>, position: Option<(u64, &str)>) {
    if let Some((offset, epoch)) = position {
        out.extend_from_slice(b",\"offset\":");
        out.extend_from_slice(offset.to_string().as_bytes());
        put_str(out, b",\"epoch\":", epoch);
    }
}

/// ACK of a SUB on a channel with history: the channel's position, and
/// `recovered` when the SUB asked to recover (`since`).
pub fn build_sub_ack(for_uuid: &str, channel: &str, position: Option<(u64, &str)>, recovered: Option<bool>) -> Vec<u8> {
    let mut out = Vec::with_capacity(220 + channel.len());
    answer_head(&mut out, ACK, for_uuid, SUB, channel);
    put_position(&mut out, position);
    if let Some(r) = recovered {
        out.extend_from_slice(if r { b",\"recovered\":true" } else { b",\"recovered\":false" });
    }
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

/// SUB frame with the extensions: recover from `since` (offset, epoch), ask for join/leave notices.
pub fn build_sub_ext(uuid: &str, channel: &str, pattern: bool, since: Option<(u64, &str)>, join_leave: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(200 + channel.len());
    meta(&mut out, SUB, uuid);
    put_str(&mut out, b"\"channel\":", channel);
    out.extend_from_slice(if pattern { b",\"pattern\":true" } else { b",\"pattern\":false" });
    if let Some((offset, epoch)) = since {
        out.extend_from_slice(b",\"since\":{\"offset\":");
        out.extend_from_slice(offset.to_string().as_bytes());
        put_str(&mut out, b",\"epoch\":", epoch);
        out.push(b'}');
    }
    if join_leave {
        out.extend_from_slice(b",\"join_leave\":true");
    }
    out.extend_from_slice(b"}}\n");
    out
}

/// Redis call/result payload; `args` (valid JSON) is normalized, omitted when None.
pub fn build_call_payload(conn_uuid: &str, msg_uuid: &str, uri: &str, args: Option<&[u8]>) -> Result<Vec<u8>> {
    build_call_payload_traced(conn_uuid, msg_uuid, uri, args, None)
}

/// `build_call_payload` plus a `"trace"` member last when given: a JSON
/// object (normalized; another value is `Error::NotObject`).
pub fn build_call_payload_traced(
    conn_uuid: &str,
    msg_uuid: &str,
    uri: &str,
    args: Option<&[u8]>,
    trace: Option<&[u8]>,
) -> Result<Vec<u8>> {
    let args = args.map(normalize_args).transpose()?;
    let trace = trace.map(normalize_args).transpose()?;
    if trace.as_ref().is_some_and(|t| t.first() != Some(&b'{')) {
        return Err(super::Error::NotObject);
    }
    let extra = args.as_ref().map_or(0, Vec::len) + trace.as_ref().map_or(0, Vec::len);
    let mut out = Vec::with_capacity(130 + uri.len() + extra);
    put_str(&mut out, b"{\"conn_uuid\":", conn_uuid);
    put_str(&mut out, b",\"msg_uuid\":", msg_uuid);
    put_str(&mut out, b",\"uri\":", uri);
    put_opt_args(&mut out, args.as_deref());
    if let Some(t) = trace {
        out.extend_from_slice(b",\"trace\":");
        out.extend_from_slice(&t);
    }
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
