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
mod tests;

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
