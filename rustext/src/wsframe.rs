//! Websocket frame reader for the server side (RFC 6455 §5, client→server),
//! sans-I/O: feed any chunking of the bytes a client sent after its handshake,
//! get back the events they carry, in order.
//!
//! What it does (the juggler server's rules, `juggler/conn.py`):
//!
//! - buffers a partial frame across `feed` calls; decodes 7/16/64-bit lengths;
//! - RSV bits set, or an unmasked frame: failure 1002 "protocol error";
//!   once permessage-deflate is agreed ([`FrameReader::enable_deflate`]),
//!   RSV1 marks a compressed message on its first frame (text or binary)
//!   only: on a continuation or control frame it is still 1002. A compressed
//!   message is inflated fragment by fragment ([`crate::wsdeflate`]); its
//!   inflated size counts against `read_limit` (1009, checked while inflating,
//!   never allocated past the limit); invalid deflate data is 1007
//!   "invalid compressed data";
//! - `read_limit` (0 = none): as soon as a frame's length is readable, its
//!   length plus the bytes of the fragments already held must not exceed the
//!   limit, else failure 1009 "message too big" (before its payload is buffered);
//! - unmasks payloads 32 bytes at a time (vector XOR);
//! - reassembles fragmented text messages: text frames come out whole, and
//!   valid UTF-8 (§8.1), checked fragment by fragment so an invalid byte
//!   fails at once: failure 1007 "invalid UTF-8 in a text message";
//! - a binary frame is reported (juggler.0 is text only) and ends the stream;
//! - control frames: FIN unset or payload over 125 bytes is failure 1002
//!   "invalid control frame"; pings are reported with their payload; pongs are
//!   dropped; a close frame is reported with its payload: empty, or a valid
//!   code (§7.4: 1000–1003, 1007–1014, 3000–4999; 1005, 1006 and 1015 are
//!   never sent) and a UTF-8 reason; else failure 1002 "invalid close frame",
//!   "invalid close code N", or 1007 "invalid UTF-8 in a close reason";
//! - text while a fragmented message is open: 1002 "expected a continuation
//!   frame"; continuation without one: 1002 "unexpected continuation frame";
//!   opcodes 3–7 and 11–15: 1002 "reserved opcode N"; a 64-bit length with
//!   its most significant bit set: 1002 "protocol error".
//!
//! Server frames go the other way through [`encode_server_frame`] (unmasked,
//! FIN set), and [`encode_text_frames`] writes the text frames of one
//! event-loop turn into one buffer: the server's one `write` per turn.
//!
//! After a failure, a binary frame or a close frame the reader is finished:
//! it drops what it holds and every later `feed` returns nothing. Memory held:
//! one partial frame plus the fragments of one message (both bounded by
//! `read_limit` when it is set).

use std::mem;

use crate::wsdeflate::{InflateError, Inflater};

/// Opcode-like kinds of events, as crossed into Python.
pub const EV_BINARY: u8 = 2;
pub const EV_CLOSE: u8 = 8;
pub const EV_PING: u8 = 9;
pub const EV_FAIL: u8 = 0xFF;

/// One thing a client's bytes said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WsEvent {
    /// A complete text message, reassembled, unmasked, valid UTF-8.
    Text(Vec<u8>),
    /// A binary frame (its payload is not kept). The reader is finished.
    Binary,
    /// A ping with its (unmasked) payload, at most 125 bytes.
    Ping(Vec<u8>),
    /// A close frame with its (unmasked) payload: empty, or a valid code
    /// then a UTF-8 reason. The reader is finished.
    Close(Vec<u8>),
    /// The stream is invalid: close with `code` and `reason`. The reader is finished.
    Fail { code: u16, reason: String },
}

/// Incremental reader of masked client frames (see module doc).
#[derive(Debug, Default)]
pub struct FrameReader {
    limit: u64,
    buf: Vec<u8>,
    frag: Option<Vec<u8>>,
    /// bytes at the start of `frag` known to be complete, valid UTF-8
    checked: usize,
    done: bool,
    /// permessage-deflate agreed: the client's compressed messages are inflated here
    inflater: Option<Inflater>,
    /// the fragmented message held in `frag` came compressed
    compressed: bool,
}

/// Close codes a peer may send (RFC 6455 §7.4.1 and the IANA registry):
/// 1005, 1006 and 1015 are reserved for reporting and never on the wire.
pub fn close_code_is_valid(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

impl FrameReader {
    /// `read_limit`: largest message in bytes (0 = no limit).
    pub fn new(read_limit: u64) -> Self {
        FrameReader { limit: read_limit, ..Default::default() }
    }

    /// permessage-deflate was agreed: RSV1 marks compressed messages from now
    /// on. `context_takeover`: the client may refer to its earlier messages
    /// (the agreement has no `client_no_context_takeover`).
    pub fn enable_deflate(&mut self, context_takeover: bool) {
        self.inflater = Some(Inflater::new(context_takeover));
    }

    /// True after a failure, a binary or a close frame: nothing more comes out.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Bytes held: the partial frame plus the fragments of an open message.
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.frag.as_ref().map_or(0, Vec::len)
    }

    /// Feed bytes; returns the events they complete.
    pub fn feed(&mut self, data: &[u8]) -> Vec<WsEvent> {
        let mut out = Vec::new();
        self.feed_into(data, &mut out);
        out
    }

    /// Feed bytes; appends the events they complete to `out`.
    pub fn feed_into(&mut self, data: &[u8], out: &mut Vec<WsEvent>) {
        if self.done {
            return;
        }
        if self.buf.is_empty() {
            let pos = self.parse(data, out);
            if !self.done && pos < data.len() {
                self.buf.extend_from_slice(&data[pos..]);
            }
        } else {
            self.buf.extend_from_slice(data);
            let mut buf = mem::take(&mut self.buf);
            let pos = self.parse(&buf, out);
            if !self.done {
                buf.drain(..pos);
                self.buf = buf;
            }
        }
    }

    fn finish(&mut self) {
        self.done = true;
        self.buf = Vec::new();
        self.frag = None;
        self.inflater = None;
    }

    fn fail(&mut self, code: u16, reason: impl Into<String>, out: &mut Vec<WsEvent>) {
        out.push(WsEvent::Fail { code, reason: reason.into() });
        self.finish();
    }

    /// Parse whole frames from `view`; returns the bytes consumed.
    fn parse(&mut self, view: &[u8], out: &mut Vec<WsEvent>) -> usize {
        let n = view.len();
        let mut pos = 0usize;
        while !self.done && n - pos >= 2 {
            let b0 = view[pos];
            let b1 = view[pos + 1];
            let mut ln = u64::from(b1 & 0x7F);
            let hdr: usize;
            if ln < 126 {
                hdr = 2;
            } else if ln == 126 {
                if n - pos < 4 {
                    break;
                }
                ln = u64::from(u16::from_be_bytes([view[pos + 2], view[pos + 3]]));
                hdr = 4;
            } else {
                if n - pos < 10 {
                    break;
                }
                let mut a = [0u8; 8];
                a.copy_from_slice(&view[pos + 2..pos + 10]);
                ln = u64::from_be_bytes(a);
                hdr = 10;
            }
            let op = b0 & 0x0F;
            // RSV1 on the first frame of a text or binary message once deflate is agreed (RFC 7692 §6)
            let rsv1 = b0 & 0x70 == 0x40 && self.inflater.is_some() && (op == 1 || op == 2);
            if (b0 & 0x70 != 0 && !rsv1) || b1 & 0x80 == 0 || ln >> 63 != 0 {
                // RSV bits no extension gave a meaning, an unmasked client frame,
                // or a 64-bit length with its most significant bit set (§5.2)
                self.fail(1002, "protocol error", out);
                return n;
            }
            let held = self.frag.as_ref().map_or(0, Vec::len) as u64;
            // compressed bytes may exceed what they inflate to by a little (stored blocks)
            let slack = if rsv1 || (op == 0 && self.compressed) { 64 + (self.limit >> 10) } else { 0 };
            if self.limit != 0 && ln.saturating_add(held) > self.limit + slack {
                self.fail(1009, "message too big", out);
                return n;
            }
            let avail = (n - pos - hdr) as u64; // n - pos >= hdr here
            if avail < 4 || ln > avail - 4 {
                break;
            }
            let start = pos + hdr + 4;
            let end = start + ln as usize; // ≤ n, checked above
            let key = [view[pos + hdr], view[pos + hdr + 1], view[pos + hdr + 2], view[pos + hdr + 3]];
            pos = end;
            self.frame(b0 & 0x80 != 0, rsv1, op, key, &view[start..end], out);
        }
        pos
    }

    fn frame(&mut self, fin: bool, rsv1: bool, op: u8, key: [u8; 4], masked: &[u8], out: &mut Vec<WsEvent>) {
        match op {
            1 => {
                if self.frag.is_some() {
                    self.fail(1002, "expected a continuation frame", out);
                } else if rsv1 {
                    let mut text = Vec::new();
                    if !self.inflate(&unmasked(masked, key), fin, &mut text, out) {
                        return;
                    }
                    if !fin {
                        self.frag = Some(text);
                        self.compressed = true;
                        self.checked = 0;
                        self.check_fragments(false, out);
                    } else if std::str::from_utf8(&text).is_ok() {
                        out.push(WsEvent::Text(text));
                    } else {
                        self.fail(1007, INVALID_TEXT, out);
                    }
                } else if fin {
                    let text = unmasked(masked, key);
                    if std::str::from_utf8(&text).is_ok() {
                        out.push(WsEvent::Text(text));
                    } else {
                        self.fail(1007, INVALID_TEXT, out);
                    }
                } else {
                    self.frag = Some(unmasked(masked, key));
                    self.checked = 0;
                    self.check_fragments(false, out);
                }
            }
            0 if self.compressed => {
                let mut frag = self.frag.take().unwrap_or_default();
                if !self.inflate(&unmasked(masked, key), fin, &mut frag, out) {
                    return;
                }
                self.frag = Some(frag);
                if self.check_fragments(fin, out) && fin {
                    self.compressed = false;
                    if let Some(text) = self.frag.take() {
                        out.push(WsEvent::Text(text));
                    }
                }
            }
            0 => match self.frag.as_mut() {
                None => self.fail(1002, "unexpected continuation frame", out),
                Some(frag) => {
                    unmask_into(frag, masked, key);
                    if self.check_fragments(fin, out) && fin {
                        if let Some(text) = self.frag.take() {
                            out.push(WsEvent::Text(text));
                        }
                    }
                }
            },
            2 => {
                out.push(WsEvent::Binary);
                self.finish();
            }
            8..=15 if !fin || masked.len() > 125 => self.fail(1002, "invalid control frame", out),
            9 => out.push(WsEvent::Ping(unmasked(masked, key))),
            10 => {} // pong: nothing to do (the server sends no pings)
            8 => {
                let payload = unmasked(masked, key);
                if payload.len() == 1 {
                    self.fail(1002, "invalid close frame", out);
                } else if payload.len() >= 2 && !close_code_is_valid(u16::from_be_bytes([payload[0], payload[1]])) {
                    let code = u16::from_be_bytes([payload[0], payload[1]]);
                    self.fail(1002, format!("invalid close code {code}"), out);
                } else if payload.len() > 2 && std::str::from_utf8(&payload[2..]).is_err() {
                    self.fail(1007, "invalid UTF-8 in a close reason", out);
                } else {
                    out.push(WsEvent::Close(payload));
                    self.finish();
                }
            }
            _ => self.fail(1002, format!("reserved opcode {op}"), out),
        }
    }
}

const INVALID_TEXT: &str = "invalid UTF-8 in a text message";

impl FrameReader {
    /// Inflate one compressed fragment into `text`; false (and a failure event) when it cannot be.
    fn inflate(&mut self, data: &[u8], fin: bool, text: &mut Vec<u8>, out: &mut Vec<WsEvent>) -> bool {
        let Some(inflater) = self.inflater.as_mut() else { return false };
        match inflater.inflate(data, fin, text, self.limit) {
            Ok(()) => true,
            Err(InflateError::TooBig) => {
                self.fail(1009, "message too big", out);
                false
            }
            Err(InflateError::Invalid) => {
                self.fail(1007, "invalid compressed data", out);
                false
            }
        }
    }

    /// Validate the fragments held past `checked`; an incomplete character at
    /// the end is fine until the last fragment (`fin`). False (and failure
    /// 1007) on invalid UTF-8.
    fn check_fragments(&mut self, fin: bool, out: &mut Vec<WsEvent>) -> bool {
        let Some(frag) = self.frag.as_ref() else { return true };
        match std::str::from_utf8(&frag[self.checked..]) {
            Ok(_) => {
                self.checked = frag.len();
                true
            }
            Err(e) if e.error_len().is_none() && !fin => {
                self.checked += e.valid_up_to();
                true
            }
            Err(_) => {
                self.fail(1007, INVALID_TEXT, out);
                false
            }
        }
    }
}

/// XOR `buf` with the 4-byte masking key `key`, the key starting at `buf[0]`
/// (masking and unmasking are the same operation). 32 bytes at a time against
/// the key repeated (the compiler turns the inner loop into vector XORs),
/// then 8 at a time, then bytewise.
pub fn apply_mask(buf: &mut [u8], key: [u8; 4]) {
    let mut pat = [0u8; 32];
    for (i, p) in pat.iter_mut().enumerate() {
        *p = key[i & 3];
    }
    let mut chunks = buf.chunks_exact_mut(32);
    for c in &mut chunks {
        for (b, k) in c.iter_mut().zip(pat.iter()) {
            *b ^= k;
        }
    }
    // every remainder below starts at a multiple of 4, so the key restarts at key[0]
    let k8 = u64::from_ne_bytes([key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3]]);
    let mut words = chunks.into_remainder().chunks_exact_mut(8);
    for c in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        c.copy_from_slice(&(u64::from_ne_bytes(a) ^ k8).to_ne_bytes());
    }
    for (i, b) in words.into_remainder().iter_mut().enumerate() {
        *b ^= key[i & 3];
    }
}

fn unmasked(masked: &[u8], key: [u8; 4]) -> Vec<u8> {
    let mut v = masked.to_vec();
    apply_mask(&mut v, key);
    v
}

fn unmask_into(dst: &mut Vec<u8>, masked: &[u8], key: [u8; 4]) {
    let start = dst.len();
    dst.extend_from_slice(masked);
    apply_mask(&mut dst[start..], key);
}

/// Bytes of an unmasked server frame header for an `n`-byte payload.
#[inline]
pub fn server_header_len(n: usize) -> usize {
    if n < 126 {
        2
    } else if n < 65536 {
        4
    } else {
        10
    }
}

/// The header of an unmasked server frame (FIN set, opcode `op`, `n` bytes
/// of payload): the buffer and how many of its bytes are used.
#[inline]
pub fn server_header(op: u8, n: usize) -> ([u8; 10], usize) {
    let mut h = [0u8; 10];
    h[0] = 0x80 | (op & 0x0F);
    let len = server_header_len(n);
    match len {
        2 => h[1] = n as u8,
        4 => {
            h[1] = 126;
            h[2..4].copy_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            h[1] = 127;
            h[2..10].copy_from_slice(&(n as u64).to_be_bytes());
        }
    }
    (h, len)
}

/// Append one unmasked server frame (FIN set, opcode `op`) to `out`.
pub fn encode_server_frame(out: &mut Vec<u8>, op: u8, payload: &[u8]) {
    let (h, len) = server_header(op, payload.len());
    out.reserve(len + payload.len());
    out.extend_from_slice(&h[..len]);
    out.extend_from_slice(payload);
}

/// One text frame per payload, back to back in one buffer.
pub fn encode_text_frames<P: AsRef<[u8]>>(payloads: &[P]) -> Vec<u8> {
    let total = payloads.iter().map(|p| server_header_len(p.as_ref().len()) + p.as_ref().len()).sum();
    let mut out = Vec::with_capacity(total);
    for p in payloads {
        encode_server_frame(&mut out, 1, p.as_ref());
    }
    out
}

/// A close frame: the 2-byte code, then `reason` cut to 123 bytes (the
/// control-frame limit of 125 bytes of payload).
pub fn encode_close_frame(code: u16, reason: &[u8]) -> Vec<u8> {
    let reason = &reason[..reason.len().min(123)];
    let mut body = Vec::with_capacity(2 + reason.len());
    body.extend_from_slice(&code.to_be_bytes());
    body.extend_from_slice(reason);
    let mut out = Vec::with_capacity(2 + body.len());
    encode_server_frame(&mut out, 8, &body);
    out
}

/// Encode one masked client frame (tests, and clients written in Rust).
pub fn encode_client_frame(fin: bool, op: u8, payload: &[u8], key: [u8; 4]) -> Vec<u8> {
    let n = payload.len();
    let mut v = Vec::with_capacity(n + 14);
    v.push(if fin { 0x80 } else { 0 } | (op & 0x0F));
    if n < 126 {
        v.push(0x80 | n as u8);
    } else if n < 65536 {
        v.push(0x80 | 126);
        v.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        v.push(0x80 | 127);
        v.extend_from_slice(&(n as u64).to_be_bytes());
    }
    v.extend_from_slice(&key);
    unmask_into(&mut v, payload, key);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const K: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    fn frame(fin: bool, op: u8, p: &[u8]) -> Vec<u8> {
        encode_client_frame(fin, op, p, K)
    }

    fn fail(code: u16, reason: &str) -> WsEvent {
        WsEvent::Fail { code, reason: reason.to_string() }
    }

    #[test]
    fn rfc_example_masked_hello() {
        // RFC 6455 §5.7: a single-frame masked text message "Hello"
        let data = [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58];
        let mut r = FrameReader::new(0);
        assert_eq!(r.feed(&data), vec![WsEvent::Text(b"Hello".to_vec())]);
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn lengths_16_and_64_bit_and_byte_at_a_time() {
        let a = vec![b'a'; 300];
        let b = vec![b'b'; 70_000];
        let mut data = frame(true, 1, &a);
        data.extend(frame(true, 1, &b));
        assert_eq!(data[1] & 0x7F, 126);
        let mut r = FrameReader::new(0);
        let mut got = Vec::new();
        for byte in &data {
            got.extend(r.feed(std::slice::from_ref(byte)));
        }
        assert_eq!(got, vec![WsEvent::Text(a), WsEvent::Text(b)]);
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn fragments_and_interleaved_control() {
        let mut data = frame(false, 1, b"{\"a\":");
        data.extend(frame(true, 9, b"pi"));
        data.extend(frame(true, 10, b"po"));
        data.extend(frame(false, 0, b" 1"));
        data.extend(frame(true, 0, b"}"));
        let mut r = FrameReader::new(0);
        assert_eq!(
            r.feed(&data),
            vec![WsEvent::Ping(b"pi".to_vec()), WsEvent::Text(b"{\"a\": 1}".to_vec())]
        );
    }

    #[test]
    fn protocol_errors() {
        let cases: Vec<(Vec<u8>, WsEvent)> = vec![
            (vec![0x81 | 0x40, 0x80, 0, 0, 0, 0], fail(1002, "protocol error")),
            (vec![0x81, 0x00], fail(1002, "protocol error")),
            ([frame(false, 1, b"a"), frame(true, 1, b"b")].concat(), fail(1002, "expected a continuation frame")),
            (frame(true, 0, b"a"), fail(1002, "unexpected continuation frame")),
            (frame(false, 9, b""), fail(1002, "invalid control frame")),
            (frame(true, 9, &[0; 126]), fail(1002, "invalid control frame")),
            (frame(true, 8, b"\x03"), fail(1002, "invalid close frame")),
            (frame(true, 3, b""), fail(1002, "reserved opcode 3")),
            (frame(true, 11, b""), fail(1002, "reserved opcode 11")),
        ];
        for (data, want) in cases {
            let mut r = FrameReader::new(0);
            assert_eq!(r.feed(&data), vec![want], "{data:?}");
            assert!(r.is_done());
            assert_eq!(r.buffered(), 0);
        }
    }

    #[test]
    fn text_must_be_utf8_checked_fragment_by_fragment() {
        let euro = "€".as_bytes(); // 3 bytes
        let mut data = frame(false, 1, &euro[..1]);
        data.extend(frame(false, 0, &euro[1..]));
        data.extend(frame(true, 0, b"!"));
        assert_eq!(FrameReader::new(0).feed(&data), vec![WsEvent::Text("€!".as_bytes().to_vec())]);
        assert_eq!(FrameReader::new(0).feed(&frame(true, 1, b"\xff")), vec![fail(1007, INVALID_TEXT)]);
        // an invalid byte fails at once, before the message ends
        let mut r = FrameReader::new(0);
        assert_eq!(r.feed(&frame(false, 1, b"ok\xc0\xaf")), vec![fail(1007, INVALID_TEXT)]);
        // a character left incomplete by the last fragment
        let mut r = FrameReader::new(0);
        assert!(r.feed(&frame(false, 1, &euro[..2])).is_empty());
        assert_eq!(r.feed(&frame(true, 0, b"")), vec![fail(1007, INVALID_TEXT)]);
        // surrogates encoded in UTF-8 (CESU) are not UTF-8
        assert_eq!(FrameReader::new(0).feed(&frame(true, 1, b"\xed\xa0\x80")), vec![fail(1007, INVALID_TEXT)]);
    }

    #[test]
    fn close_codes_and_reasons_are_checked() {
        for code in [1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999] {
            let mut p = code.to_be_bytes().to_vec();
            p.extend(b"bye");
            assert_eq!(FrameReader::new(0).feed(&frame(true, 8, &p)), vec![WsEvent::Close(p.clone())], "{code}");
        }
        for code in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535] {
            let got = FrameReader::new(0).feed(&frame(true, 8, &code.to_be_bytes()));
            assert_eq!(got, vec![fail(1002, &format!("invalid close code {code}"))]);
        }
        let mut p = 1000u16.to_be_bytes().to_vec();
        p.extend(b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80");
        assert_eq!(FrameReader::new(0).feed(&frame(true, 8, &p)), vec![fail(1007, "invalid UTF-8 in a close reason")]);
        assert_eq!(FrameReader::new(0).feed(&frame(true, 8, b"")), vec![WsEvent::Close(Vec::new())]);
    }

    #[test]
    fn header_errors_need_the_whole_length_field() {
        // an unmasked frame with a 16-bit length is judged once the length is readable
        let mut r = FrameReader::new(0);
        assert!(r.feed(&[0x81, 126, 0]).is_empty());
        assert_eq!(r.feed(&[1]), vec![fail(1002, "protocol error")]);
    }

    #[test]
    fn limit_counts_held_fragments_and_fires_before_the_payload() {
        let mut r = FrameReader::new(10);
        assert!(r.feed(&frame(false, 1, b"123456")).is_empty());
        // 5 more would make 11: refused from the header alone
        let next = frame(true, 0, b"12345");
        assert_eq!(r.feed(&next[..2]), vec![fail(1009, "message too big")]);
        assert!(r.feed(&next[2..]).is_empty());

        let mut r = FrameReader::new(10);
        let mut data = frame(false, 1, b"123456");
        data.extend(frame(true, 0, b"1234"));
        assert_eq!(r.feed(&data), vec![WsEvent::Text(b"1234561234".to_vec())]);
        // a huge 64-bit length does not overflow
        let mut r = FrameReader::new(10);
        let mut h = vec![0x81, 0xFF];
        h.extend((1u64 << 62).to_be_bytes());
        assert_eq!(r.feed(&h), vec![fail(1009, "message too big")]);
        let mut r = FrameReader::new(0);
        h.extend(K);
        assert!(r.feed(&h).is_empty());
        // the most significant bit of a 64-bit length must be 0 (§5.2)
        let mut h = vec![0x81, 0xFF];
        h.extend(u64::MAX.to_be_bytes());
        assert_eq!(FrameReader::new(0).feed(&h), vec![fail(1002, "protocol error")]);
    }

    #[test]
    fn finished_after_close_or_binary() {
        let mut r = FrameReader::new(0);
        let mut data = frame(true, 8, b"\x03\xe8bye");
        data.extend(frame(true, 1, b"late"));
        assert_eq!(r.feed(&data), vec![WsEvent::Close(b"\x03\xe8bye".to_vec())]);
        assert!(r.feed(&frame(true, 1, b"x")).is_empty());
        let mut r = FrameReader::new(0);
        let mut data = frame(true, 1, b"a");
        data.extend(frame(true, 2, b"bin"));
        data.extend(frame(true, 1, b"b"));
        assert_eq!(r.feed(&data), vec![WsEvent::Text(b"a".to_vec()), WsEvent::Binary]);
        assert!(r.is_done());
        let mut r = FrameReader::new(0);
        assert_eq!(r.feed(&frame(true, 8, b"")), vec![WsEvent::Close(vec![])]);
    }

    #[test]
    fn server_frames() {
        // RFC 6455 §5.7: a single-frame unmasked text message "Hello"
        assert_eq!(encode_text_frames(&[b"Hello"]), [0x81, 0x05, b'H', b'e', b'l', b'l', b'o']);
        let mid = vec![b'm'; 300];
        let big = vec![b'b'; 70_000];
        let out = encode_text_frames(&[&b""[..], &mid, &big]);
        assert_eq!(&out[..2], [0x81, 0]);
        assert_eq!(&out[2..6], [0x81, 126, 0x01, 0x2C]);
        assert_eq!(&out[306..316], [0x81, 127, 0, 0, 0, 0, 0, 0x01, 0x11, 0x70]);
        assert_eq!(out.len(), 2 + 4 + 300 + 10 + 70_000);
        assert_eq!(encode_close_frame(1001, b"going"), [0x88, 7, 0x03, 0xE9, b'g', b'o', b'i', b'n', b'g']);
        assert_eq!(encode_close_frame(1000, &[b'r'; 200]).len(), 2 + 125);
        let mut pong = Vec::new();
        encode_server_frame(&mut pong, 10, b"hi");
        assert_eq!(pong, [0x8A, 2, b'h', b'i']);
    }

    fn zframe(fin: bool, op: u8, p: &[u8]) -> Vec<u8> {
        let mut f = frame(fin, op, p);
        f[0] |= 0x40;
        f
    }

    fn deflating(limit: u64, takeover: bool) -> FrameReader {
        let mut r = FrameReader::new(limit);
        r.enable_deflate(takeover);
        r
    }

    #[test]
    fn rsv1_only_where_deflate_allows_it() {
        let z = crate::wsdeflate::Deflater::new(1).compress(b"hello");
        // not agreed: any RSV bit is a protocol error
        assert_eq!(FrameReader::new(0).feed(&zframe(true, 1, &z)), vec![fail(1002, "protocol error")]);
        // agreed: RSV1 on a text frame is a compressed message
        assert_eq!(deflating(0, false).feed(&zframe(true, 1, &z)), vec![WsEvent::Text(b"hello".to_vec())]);
        // never on a continuation frame, a control frame, nor RSV2/RSV3
        let mut r = deflating(0, false);
        let mut data = frame(false, 1, b"he");
        data.extend(zframe(true, 0, b"llo"));
        assert_eq!(r.feed(&data), vec![fail(1002, "protocol error")]);
        for op in [8u8, 9, 10] {
            assert_eq!(deflating(0, false).feed(&zframe(true, op, b"")), vec![fail(1002, "protocol error")], "{op}");
        }
        for bits in [0x20u8, 0x10, 0x60, 0x50] {
            let mut f = frame(true, 1, b"x");
            f[0] |= bits;
            assert_eq!(deflating(0, false).feed(&f), vec![fail(1002, "protocol error")], "{bits:#x}");
        }
        // a binary message, compressed or not, is reported and ends the stream
        assert_eq!(deflating(0, false).feed(&zframe(true, 2, &z)), vec![WsEvent::Binary]);
    }

    #[test]
    fn fragmented_compressed_messages_and_plain_ones_mix() {
        let text = "ünïcödé ".repeat(200);
        let z = crate::wsdeflate::Deflater::new(6).compress(text.as_bytes());
        let mut data = zframe(false, 1, &z[..1]);
        data.extend(frame(true, 9, b"ping in between"));
        data.extend(frame(false, 0, &z[1..z.len() / 2]));
        data.extend(frame(true, 0, &z[z.len() / 2..]));
        data.extend(frame(true, 1, b"plain"));
        data.extend(zframe(true, 1, &crate::wsdeflate::Deflater::new(1).compress(b"")));
        let want = vec![
            WsEvent::Ping(b"ping in between".to_vec()),
            WsEvent::Text(text.clone().into_bytes()),
            WsEvent::Text(b"plain".to_vec()),
            WsEvent::Text(Vec::new()),
        ];
        assert_eq!(deflating(0, false).feed(&data), want);
        // byte by byte, the same
        let mut r = deflating(0, true);
        let got: Vec<WsEvent> = data.chunks(1).flat_map(|c| r.feed(c)).collect();
        assert_eq!(got, want);
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn a_deflate_bomb_is_too_big_and_bad_data_invalid() {
        let bomb = crate::wsdeflate::Deflater::new(9).compress(&vec![b'a'; 4 << 20]);
        assert!(bomb.len() < 10_000);
        assert_eq!(deflating(1 << 16, false).feed(&zframe(true, 1, &bomb)), vec![fail(1009, "message too big")]);
        // fragmented: the inflated fragments held count too
        let mut r = deflating(1 << 16, false);
        let mut data = zframe(false, 1, &bomb[..bomb.len() / 2]);
        data.extend(frame(true, 0, &bomb[bomb.len() / 2..]));
        assert_eq!(r.feed(&data), vec![fail(1009, "message too big")]);
        assert!(r.is_done());
        assert_eq!(r.buffered(), 0);
        assert_eq!(deflating(0, false).feed(&zframe(true, 1, b"\xff\xff\xff\xff")), vec![fail(1007, "invalid compressed data")]);
        // inflated text is still checked as UTF-8
        let z = crate::wsdeflate::Deflater::new(1).compress(b"\xc0\xaf");
        assert_eq!(deflating(0, false).feed(&zframe(true, 1, &z)), vec![fail(1007, INVALID_TEXT)]);
    }

    #[test]
    fn mask_alignment() {
        for n in 0..100 {
            let p: Vec<u8> = (0..n as u8).collect();
            let mut m = p.clone();
            apply_mask(&mut m, K);
            for (i, (a, b)) in p.iter().zip(&m).enumerate() {
                assert_eq!(a ^ K[i % 4], *b);
            }
        }
    }

    #[derive(Clone, Debug)]
    enum F {
        Text(Vec<u8>, usize),
        Ping(Vec<u8>),
        Pong(Vec<u8>),
    }

    fn arb_frame() -> impl Strategy<Value = F> {
        prop_oneof![
            // valid UTF-8, fragmented at any byte (characters split between fragments)
            4 => (any::<String>(), 0usize..4).prop_map(|(p, k)| F::Text(p.into_bytes(), k)),
            1 => proptest::collection::vec(any::<u8>(), 0..126).prop_map(F::Ping),
            1 => proptest::collection::vec(any::<u8>(), 0..126).prop_map(F::Pong),
        ]
    }

    /// A valid stream (text messages in `k + 1` fragments, pings, pongs) and the events it gives.
    fn stream(frames: &[F], key: [u8; 4]) -> (Vec<u8>, Vec<WsEvent>) {
        let mut data = Vec::new();
        let mut want = Vec::new();
        for f in frames {
            match f {
                F::Text(p, k) => {
                    let parts = k + 1;
                    let step = p.len().div_ceil(parts).max(1);
                    let chunks: Vec<&[u8]> = if p.is_empty() { vec![&p[..]] } else { p.chunks(step).collect() };
                    for (i, c) in chunks.iter().enumerate() {
                        let op = if i == 0 { 1 } else { 0 };
                        data.extend(encode_client_frame(i + 1 == chunks.len(), op, c, key));
                    }
                    want.push(WsEvent::Text(p.clone()));
                }
                F::Ping(p) => {
                    data.extend(encode_client_frame(true, 9, p, key));
                    want.push(WsEvent::Ping(p.clone()));
                }
                F::Pong(p) => data.extend(encode_client_frame(true, 10, p, key)),
            }
        }
        (data, want)
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_events(
            frames in proptest::collection::vec(arb_frame(), 0..12),
            key in any::<[u8; 4]>(),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let (data, want) = stream(&frames, key);
            let mut whole = FrameReader::new(0);
            prop_assert_eq!(&whole.feed(&data), &want);
            prop_assert_eq!(whole.buffered(), 0);
            let mut cuts: Vec<usize> = cuts.iter().map(|c| if data.is_empty() { 0 } else { c % data.len() }).collect();
            cuts.sort_unstable();
            let mut r = FrameReader::new(0);
            let mut got = Vec::new();
            let mut last = 0;
            for c in cuts.into_iter().chain(std::iter::once(data.len())) {
                got.extend(r.feed(&data[last..c]));
                last = c;
            }
            prop_assert_eq!(got, want);
            prop_assert_eq!(r.buffered(), 0);
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            limit in prop_oneof![Just(0u64), 0u64..200],
        ) {
            let mut r = FrameReader::new(limit);
            for c in &chunks {
                for ev in r.feed(c) {
                    if let WsEvent::Fail { code, .. } = ev {
                        prop_assert!(code == 1002 || code == 1007 || code == 1009);
                        prop_assert!(r.is_done());
                    }
                }
            }
        }

        #[test]
        fn compressed_streams_give_the_same_events_at_any_split(
            frames in proptest::collection::vec(arb_frame(), 0..8),
            key in any::<[u8; 4]>(),
            cut in 1usize..40,
            takeover in any::<bool>(),
        ) {
            // the same messages, compressed (each text message's first frame RSV1)
            let mut z = crate::wsdeflate::Deflater::new(6);
            let mut data = Vec::new();
            let mut want = Vec::new();
            for f in &frames {
                match f {
                    F::Text(p, k) => {
                        let c = z.compress(p);
                        let step = c.len().div_ceil(k + 1).max(1);
                        let chunks: Vec<&[u8]> = c.chunks(step).collect();
                        for (i, ch) in chunks.iter().enumerate() {
                            let mut fr = encode_client_frame(i + 1 == chunks.len(), if i == 0 { 1 } else { 0 }, ch, key);
                            if i == 0 {
                                fr[0] |= 0x40;
                            }
                            data.extend(fr);
                        }
                        want.push(WsEvent::Text(p.clone()));
                    }
                    F::Ping(p) => {
                        data.extend(encode_client_frame(true, 9, p, key));
                        want.push(WsEvent::Ping(p.clone()));
                    }
                    F::Pong(p) => data.extend(encode_client_frame(true, 10, p, key)),
                }
            }
            let mut r = FrameReader::new(0);
            r.enable_deflate(takeover);
            let got: Vec<WsEvent> = data.chunks(cut).flat_map(|c| r.feed(c)).collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(r.buffered(), 0);
        }

        #[test]
        fn arbitrary_bytes_never_panic_with_deflate(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            limit in prop_oneof![Just(0u64), 1u64..2000],
        ) {
            let mut r = FrameReader::new(limit);
            r.enable_deflate(true);
            for c in &chunks {
                for ev in r.feed(c) {
                    if let WsEvent::Text(t) = &ev {
                        prop_assert!(limit == 0 || t.len() as u64 <= limit);
                    }
                    if let WsEvent::Fail { code, .. } = ev {
                        prop_assert!(code == 1002 || code == 1007 || code == 1009);
                    }
                }
            }
        }

        #[test]
        fn mask_round_trips(p in proptest::collection::vec(any::<u8>(), 0..100), key in any::<[u8; 4]>()) {
            let mut m = p.clone();
            apply_mask(&mut m, key);
            for (i, (a, b)) in p.iter().zip(&m).enumerate() {
                prop_assert_eq!(a ^ key[i % 4], *b);
            }
            apply_mask(&mut m, key);
            prop_assert_eq!(m, p);
        }
    }
}

#[cfg(feature = "python")]
pub mod python {
    //! Bindings: `rustext.WsFrameReader` and the event kinds `WS_BINARY`,
    //! `WS_CLOSE`, `WS_PING`, `WS_FAIL`.
    //!
    //! `feed` returns a list whose items are `bytes` (a whole text message:
    //! the common case, no wrapper) or tuples: `(WS_PING, payload)`,
    //! `(WS_CLOSE, payload)`, `(WS_BINARY, b"")`, `(WS_FAIL, code, reason)`.
    //!
    //! Writing: `ws_text_frames(payloads)` (the frames of one loop turn in
    //! one buffer), `ws_control_frame(opcode, payload)`, `ws_close_frame(code, reason)`.

    use super::{encode_close_frame, encode_server_frame, server_header, server_header_len, FrameReader, WsEvent};
    use super::{EV_BINARY, EV_CLOSE, EV_FAIL, EV_PING};
    use crate::errors::ErrorKind;
    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyList};

    /// Server-side reader of masked client websocket frames (RFC 6455 §5).
    #[pyclass(module = "rustext", name = "WsFrameReader")]
    pub struct PyWsFrameReader {
        inner: FrameReader,
        events: Vec<WsEvent>,
    }

    #[pymethods]
    impl PyWsFrameReader {
        #[new]
        #[pyo3(signature = (read_limit = 0))]
        fn new(read_limit: i64) -> PyResult<Self> {
            if read_limit < 0 {
                return Err(ErrorKind::Rustext.err(format!("read_limit must be >= 0, got {read_limit}")));
            }
            Ok(PyWsFrameReader { inner: FrameReader::new(read_limit as u64), events: Vec::new() })
        }

        /// Feed bytes received; returns the events they complete, in order.
        fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
            let mut events = std::mem::take(&mut self.events);
            self.inner.feed_into(data, &mut events);
            let list = PyList::empty(py);
            for ev in events.drain(..) {
                match ev {
                    WsEvent::Text(v) => list.append(PyBytes::new(py, &v))?,
                    WsEvent::Ping(v) => list.append((EV_PING, PyBytes::new(py, &v)))?,
                    WsEvent::Close(v) => list.append((EV_CLOSE, PyBytes::new(py, &v)))?,
                    WsEvent::Binary => list.append((EV_BINARY, PyBytes::new(py, b"")))?,
                    WsEvent::Fail { code, reason } => list.append((EV_FAIL, code, reason))?,
                }
            }
            self.events = events;
            Ok(list)
        }

        /// permessage-deflate was agreed: RSV1 marks compressed messages from
        /// now on; `context_takeover` when the agreement lacks `client_no_context_takeover`.
        fn enable_deflate(&mut self, context_takeover: bool) {
            self.inner.enable_deflate(context_takeover);
        }

        /// True after a failure, a binary or a close frame.
        #[getter]
        fn done(&self) -> bool {
            self.inner.is_done()
        }

        /// Bytes held: a partial frame plus the fragments of an open message.
        #[getter]
        fn buffered(&self) -> usize {
            self.inner.buffered()
        }
    }

    /// One unmasked text frame per payload, back to back in one `bytes`.
    #[pyfunction]
    fn ws_text_frames<'py>(py: Python<'py>, payloads: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyBytes>> {
        let mut views: Vec<Bound<'py, PyBytes>> = Vec::with_capacity(payloads.len());
        let mut total = 0usize;
        for item in payloads.iter() {
            let b = item.cast_into::<PyBytes>()?;
            let n = b.as_bytes().len();
            total += server_header_len(n) + n;
            views.push(b);
        }
        let len = ffi::Py_ssize_t::try_from(total).map_err(|_| ErrorKind::Rustext.err("frames too large"))?;
        // SAFETY: a new bytes object of `total` uninitialised bytes (PyBytes::new_with
        // would zero them first: a second pass over large frames), every byte of
        // which is written below before the object is handed to Python.
        unsafe {
            let obj = ffi::PyBytes_FromStringAndSize(std::ptr::null(), len);
            if obj.is_null() {
                return Err(PyErr::fetch(py));
            }
            let buf = std::slice::from_raw_parts_mut(ffi::PyBytes_AsString(obj).cast::<u8>(), total);
            let mut pos = 0;
            for b in &views {
                let p = b.as_bytes();
                let (h, hl) = server_header(1, p.len());
                buf[pos..pos + hl].copy_from_slice(&h[..hl]);
                pos += hl;
                buf[pos..pos + p.len()].copy_from_slice(p);
                pos += p.len();
            }
            debug_assert_eq!(pos, total);
            Ok(Bound::from_owned_ptr(py, obj).cast_into_unchecked::<PyBytes>())
        }
    }

    /// One unmasked control frame (ping, pong or close with a raw payload of at most 125 bytes).
    #[pyfunction]
    fn ws_control_frame<'py>(py: Python<'py>, opcode: u8, payload: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        if !(8..=10).contains(&opcode) || payload.len() > 125 {
            return Err(ErrorKind::Rustext.err(format!(
                "not a control frame: opcode {opcode} with {} bytes of payload",
                payload.len()
            )));
        }
        let mut out = Vec::with_capacity(2 + payload.len());
        encode_server_frame(&mut out, opcode, payload);
        Ok(PyBytes::new(py, &out))
    }

    /// A close frame: `code`, then `reason` (UTF-8) cut to 123 bytes.
    #[pyfunction]
    #[pyo3(signature = (code, reason = ""))]
    fn ws_close_frame<'py>(py: Python<'py>, code: u16, reason: &str) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &encode_close_frame(code, reason.as_bytes()))
    }

    pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_function(wrap_pyfunction!(ws_text_frames, m)?)?;
        m.add_function(wrap_pyfunction!(ws_control_frame, m)?)?;
        m.add_function(wrap_pyfunction!(ws_close_frame, m)?)?;
        m.add("WS_BINARY", EV_BINARY)?;
        m.add("WS_CLOSE", EV_CLOSE)?;
        m.add("WS_PING", EV_PING)?;
        m.add("WS_FAIL", EV_FAIL)?;
        m.add_class::<PyWsFrameReader>()?;
        Ok(())
    }
}
