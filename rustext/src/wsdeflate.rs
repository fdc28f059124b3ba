//! permessage-deflate (RFC 7692) for the websocket server: the compressed
//! payload of a server message, and bounded inflation of client messages.
//!
//! Server side, the agreement always has `server_no_context_takeover`: every
//! message is compressed on its own (RFC 7692 §7.2.1), so one compressed
//! frame of an event serves every subscriber that negotiated deflate, and a
//! connection holds no compressor. A [`Deflater`] is one reusable compressor
//! (owned by the server, shared by its connections, reset per message).
//!
//! Client side, an [`Inflater`] inflates a message's fragments as they come
//! into a buffer that never grows past the read limit: a small frame that
//! inflates past it (a compression bomb) is refused after at most `limit`
//! bytes of output, never allocated first. With client context takeover its
//! 32 KiB window lives as long as the connection; without it, only while a
//! compressed message is being read.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The four bytes a sync flush ends with, removed by the sender and put back
/// by the receiver (RFC 7692 §7.2.1, §7.2.2).
pub const TAIL: [u8; 4] = [0x00, 0x00, 0xFF, 0xFF];

/// Output grows by at most this many bytes at a time (and never past the limit).
const STEP: usize = 16 * 1024;

/// A reusable raw-deflate compressor: one message at a time, no context kept.
pub struct Deflater {
    z: Compress,
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deflater").finish_non_exhaustive()
    }
}

impl Deflater {
    /// `level`: 0 (stored) to 9 (smallest); clamped.
    pub fn new(level: u32) -> Self {
        Deflater { z: Compress::new(Compression::new(level.min(9)), false) }
    }

    /// Append the compressed payload of one message (sync-flushed, its
    /// trailing `00 00 FF FF` removed) to `out`.
    pub fn compress_into(&mut self, payload: &[u8], out: &mut Vec<u8>) {
        self.z.reset();
        let start = out.len();
        // room for the worst case (stored blocks) at once: one call nearly always does
        out.reserve(payload.len() + payload.len() / 64 + 64);
        let mut input = payload;
        loop {
            let before = self.z.total_in();
            // a raw stream into a Vec's spare capacity: no error is possible
            let _ = self.z.compress_vec(input, out, FlushCompress::Sync);
            input = &input[(self.z.total_in() - before) as usize..];
            // done once every byte is in and the flush did not fill the room given
            // (another call would only add an empty block: still valid, never wrong)
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            out.reserve(out.capacity().max(256));
        }
        if out.len() - start >= 4 && out.ends_with(&TAIL) {
            out.truncate(out.len() - 4);
        }
    }

    /// The compressed payload of one message.
    pub fn compress(&mut self, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.compress_into(payload, &mut out);
        out
    }
}

/// Why inflating failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// The output would exceed the limit (close code 1009).
    TooBig,
    /// Not a valid deflate stream (close code 1007).
    Invalid,
}

/// Inflater of one connection's compressed client messages (see module doc).
#[derive(Debug)]
pub struct Inflater {
    z: Option<Box<Decompress>>,
    /// keep the window from one message to the next (client context takeover)
    takeover: bool,
    /// the stream ended with a final block: the next message starts afresh
    ended: bool,
}

impl Inflater {
    /// `takeover`: the client may refer to earlier messages (no
    /// `client_no_context_takeover` in the agreement).
    pub fn new(takeover: bool) -> Self {
        Inflater { z: None, takeover, ended: false }
    }

    /// True while a window is held (between messages only with context takeover).
    pub fn holds_window(&self) -> bool {
        self.z.is_some()
    }

    /// Inflate one fragment's compressed bytes, appending to `out`; `fin`: the
    /// message's last fragment. `out` never grows past `limit` bytes (0 = no limit).
    pub fn inflate(&mut self, data: &[u8], fin: bool, out: &mut Vec<u8>, limit: u64) -> Result<(), InflateError> {
        let r = self.inflate_part(data, out, limit).and_then(|()| if fin { self.inflate_part(&TAIL, out, limit) } else { Ok(()) });
        if r.is_err() || (fin && (!self.takeover || self.ended)) {
            // no context to keep (or none left): the window goes
            self.z = None;
            self.ended = false;
        }
        r
    }

    fn inflate_part(&mut self, mut input: &[u8], out: &mut Vec<u8>, limit: u64) -> Result<(), InflateError> {
        if self.ended {
            return Ok(()); // bytes after a final block (the appended tail) are ignored
        }
        let z = self.z.get_or_insert_with(|| Box::new(Decompress::new(false)));
        let limit = if limit == 0 { usize::MAX } else { usize::try_from(limit).unwrap_or(usize::MAX) };
        loop {
            if out.len() == out.capacity() {
                if out.len() >= limit {
                    // at the limit: one more byte of output means too big
                    let mut one = [0u8; 1];
                    let before = z.total_out();
                    let st = z.decompress(input, &mut one, FlushDecompress::Sync).map_err(|_| InflateError::Invalid)?;
                    if z.total_out() != before {
                        return Err(InflateError::TooBig);
                    }
                    if st == Status::StreamEnd {
                        self.ended = true;
                    }
                    return Ok(());
                }
                let grow = out.len().max(STEP).min(limit - out.len());
                out.reserve_exact(grow);
            }
            let (in0, out0) = (z.total_in(), z.total_out());
            let st = z.decompress_vec(input, out, FlushDecompress::Sync).map_err(|_| InflateError::Invalid)?;
            input = &input[(z.total_in() - in0) as usize..];
            if st == Status::StreamEnd {
                self.ended = true;
                return Ok(());
            }
            let produced = z.total_out() - out0;
            // done when every byte is in and the output did not fill the room given
            if out.len() < out.capacity() && (input.is_empty() || produced == 0 && z.total_in() == in0) {
                if !input.is_empty() {
                    return Err(InflateError::Invalid); // stalled with input and room: corrupt
                }
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inflate_all(parts: &[&[u8]], limit: u64, takeover: bool) -> Result<Vec<u8>, InflateError> {
        let mut inf = Inflater::new(takeover);
        let mut out = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            inf.inflate(p, i + 1 == parts.len(), &mut out, limit)?;
        }
        Ok(out)
    }

    #[test]
    fn rfc7692_examples() {
        // §7.2.3.1: "Hello" compressed
        let hello = [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];
        assert_eq!(inflate_all(&[&hello], 0, false).unwrap(), b"Hello");
        // §7.2.3.2: the same, split in two fragments
        assert_eq!(inflate_all(&[&[0xf2, 0x48, 0xcd], &[0xc9, 0xc9, 0x07, 0x00]], 0, false).unwrap(), b"Hello");
        // §7.2.3.3: context takeover, the second "Hello" refers to the first
        let mut inf = Inflater::new(true);
        let mut a = Vec::new();
        inf.inflate(&hello, true, &mut a, 0).unwrap();
        assert!(inf.holds_window());
        let mut b = Vec::new();
        inf.inflate(&[0xf2, 0x00, 0x11, 0x00, 0x00], true, &mut b, 0).unwrap();
        assert_eq!(b, b"Hello");
        // §7.2.3.4: a stored (uncompressed) block
        assert_eq!(inflate_all(&[&[0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x00]], 0, false).unwrap(), b"Hello");
        // §7.2.3.5: a final block (BFINAL set)
        assert_eq!(inflate_all(&[&[0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00]], 0, false).unwrap(), b"Hello");
        // §7.2.3.6: two blocks in one message
        let two = [0xf2, 0x48, 0x05, 0x00, 0x00, 0x00, 0xff, 0xff, 0xca, 0xc9, 0xc9, 0x07, 0x00];
        assert_eq!(inflate_all(&[&two], 0, false).unwrap(), b"Hello");
        // compressing "Hello" gives the bytes of §7.2.3.1
        assert_eq!(Deflater::new(6).compress(b"Hello"), hello);
    }

    #[test]
    fn no_context_takeover_drops_the_window() {
        let mut inf = Inflater::new(false);
        let mut out = Vec::new();
        inf.inflate(&Deflater::new(1).compress(b"abc"), true, &mut out, 0).unwrap();
        assert!(!inf.holds_window());
        // a message that refers back to the previous one does not see it
        let mut out = Vec::new();
        let r = inf.inflate(&[0xf2, 0x00, 0x11, 0x00, 0x00], true, &mut out, 0);
        assert!(r.is_err() || out != b"Hello");
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        let big = vec![b'a'; 10 << 20];
        let z = Deflater::new(9).compress(&big);
        assert!(z.len() < 20_000, "{}", z.len());
        let mut inf = Inflater::new(false);
        let mut out = Vec::new();
        assert_eq!(inf.inflate(&z, true, &mut out, 1 << 16), Err(InflateError::TooBig));
        assert!(out.capacity() <= 1 << 16, "{}", out.capacity());
        assert!(!inf.holds_window());
        // exactly the limit fits
        let z = Deflater::new(9).compress(&big[..1000]);
        assert_eq!(inflate_all(&[&z], 1000, false).unwrap().len(), 1000);
        assert_eq!(inflate_all(&[&z], 999, false), Err(InflateError::TooBig));
    }

    #[test]
    fn garbage_is_invalid() {
        assert_eq!(inflate_all(&[&[0xff, 0xff, 0xff, 0xff]], 0, false), Err(InflateError::Invalid));
    }

    proptest! {
        #[test]
        fn round_trips(msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 1..4),
                       level in 0u32..10, cut in 1usize..50, takeover in any::<bool>()) {
            let mut d = Deflater::new(level);
            let mut inf = Inflater::new(takeover);
            for m in &msgs {
                let z = d.compress(m);
                let mut out = Vec::new();
                let chunks: Vec<&[u8]> = if z.is_empty() { vec![&z[..]] } else { z.chunks(cut).collect() };
                for (i, c) in chunks.iter().enumerate() {
                    inf.inflate(c, i + 1 == chunks.len(), &mut out, m.len() as u64).unwrap();
                }
                prop_assert_eq!(&out, m);
            }
        }

        #[test]
        fn arbitrary_input_never_panics_nor_exceeds_the_limit(data in proptest::collection::vec(any::<u8>(), 0..200),
                                                             limit in 1u64..5000) {
            let mut out = Vec::new();
            let _ = Inflater::new(true).inflate(&data, true, &mut out, limit);
            prop_assert!(out.len() as u64 <= limit);
            prop_assert!(out.capacity() as u64 <= limit.max(STEP as u64));
        }
    }
}

#[cfg(feature = "python")]
pub mod python {
    //! `rustext.WsDeflate`: server text frames compressed above a threshold.

    use super::Deflater;
    use crate::errors::ErrorKind;
    use crate::wsframe::server_header;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyList};

    /// Builds server text frames with permessage-deflate (no context takeover):
    /// one per server, shared by its connections (see the Rust module doc).
    #[pyclass(module = "rustext", name = "WsDeflate")]
    pub struct PyWsDeflate {
        z: Deflater,
        threshold: usize,
        scratch: Vec<u8>,
    }

    impl PyWsDeflate {
        /// Append the frame of `p`: compressed (RSV1) when at least `threshold`
        /// bytes long and smaller so, else plain.
        fn frame_into(&mut self, p: &[u8], out: &mut Vec<u8>) {
            if p.len() >= self.threshold {
                self.scratch.clear();
                self.z.compress_into(p, &mut self.scratch);
                if self.scratch.len() < p.len() {
                    let (mut h, hl) = server_header(1, self.scratch.len());
                    h[0] |= 0x40;
                    out.extend_from_slice(&h[..hl]);
                    out.extend_from_slice(&self.scratch);
                    if self.scratch.capacity() > 1 << 20 {
                        self.scratch = Vec::new(); // do not keep a huge buffer for small events
                    }
                    return;
                }
            }
            let (h, hl) = server_header(1, p.len());
            out.extend_from_slice(&h[..hl]);
            out.extend_from_slice(p);
        }
    }

    #[pymethods]
    impl PyWsDeflate {
        #[new]
        #[pyo3(signature = (level = 1, threshold = 0))]
        fn new(level: i64, threshold: i64) -> PyResult<Self> {
            if !(0..=9).contains(&level) || threshold < 0 {
                return Err(ErrorKind::Rustext.err(format!(
                    "level must be 0-9 and threshold >= 0, got level {level}, threshold {threshold}"
                )));
            }
            Ok(PyWsDeflate { z: Deflater::new(level as u32), threshold: threshold as usize, scratch: Vec::new() })
        }

        /// One text frame per payload, back to back: compressed (RSV1 set) when
        /// the payload has at least `threshold` bytes and compressing shrinks it.
        fn text_frames<'py>(&mut self, py: Python<'py>, payloads: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyBytes>> {
            let mut out = Vec::new();
            for item in payloads.iter() {
                let b = item.cast_into::<PyBytes>()?;
                self.frame_into(b.as_bytes(), &mut out);
            }
            Ok(PyBytes::new(py, &out))
        }

        /// The compressed payload of one message (trailing `00 00 FF FF` removed).
        fn compress<'py>(&mut self, py: Python<'py>, payload: &[u8]) -> Bound<'py, PyBytes> {
            self.scratch.clear();
            self.z.compress_into(payload, &mut self.scratch);
            PyBytes::new(py, &self.scratch)
        }

        /// Payloads shorter than this many bytes go uncompressed.
        #[getter]
        fn threshold(&self) -> usize {
            self.threshold
        }
    }

    pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_class::<PyWsDeflate>()
    }
}
