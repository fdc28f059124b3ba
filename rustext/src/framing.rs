//! Length-field stream splitter (sans-I/O): feed any chunking of a byte
//! stream, get back exactly the frames it carries, in order.
//!
//! A frame is `[header (offset bytes)] [length field (width bytes)] [body]`.
//! The length field holds `body_len - adjust` (most protocols: adjust = 0), in
//! big- or little-endian. Two common shapes:
//!
//! - plain length prefix: offset 0, width 4, frames returned without the prefix;
//! - rpcx: a 12-byte header, then a u32 big-endian "bytes after this field":
//!   offset 12, width 4, frames returned whole (`strip_header = false`).
//!
//! Bounds: the body length is checked against `max_frame` as soon as the length
//! field is readable, before anything of the body is buffered; after an error the
//! splitter is poisoned (a stream that lost sync cannot be resynchronised) and
//! every later `feed` fails the same way. Memory held is at most one partial
//! frame (≤ header + max_frame bytes) plus the input of the current call.

use std::fmt;

/// Byte order of the length field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endian {
    Big,
    Little,
}

/// Shape and limits of a length-field framing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameConfig {
    /// Bytes before the length field (a fixed header), 0 for a plain prefix.
    pub offset: usize,
    /// Width of the length field: 1, 2, 4 or 8 bytes.
    pub width: usize,
    pub endian: Endian,
    /// Added to the length field to get the body length (may be negative).
    pub adjust: i64,
    /// Largest body (bytes after the length field) accepted.
    pub max_frame: usize,
    /// Return frames without header and length field (true) or whole (false).
    pub strip_header: bool,
    /// When set, the first byte of every frame must be this (checked as soon
    /// as it arrives, so garbage fails fast instead of waiting for a length).
    pub magic: Option<u8>,
}

impl Default for FrameConfig {
    fn default() -> Self {
        FrameConfig {
            offset: 0,
            width: 4,
            endian: Endian::Big,
            adjust: 0,
            max_frame: 16 * 1024 * 1024,
            strip_header: true,
            magic: None,
        }
    }
}

/// Why a stream cannot be split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// A configuration that cannot work (bad width, …).
    Config(String),
    /// The length field announces a body over `max_frame` (raised before buffering).
    TooLarge { len: u64, max: usize },
    /// The length field plus `adjust` is negative.
    BadLength(i128),
    /// The encoder was given a header of the wrong size.
    BadHeader { got: usize, want: usize },
    /// A frame does not start with the configured magic byte.
    BadMagic(u8),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Config(m) => write!(f, "invalid framing config: {m}"),
            FrameError::TooLarge { len, max } => {
                write!(f, "frame of {len} bytes exceeds the maximum of {max}")
            }
            FrameError::BadLength(l) => write!(f, "invalid frame length {l}"),
            FrameError::BadHeader { got, want } => {
                write!(f, "header of {got} bytes, the framing needs exactly {want}")
            }
            FrameError::BadMagic(b) => write!(f, "wrong magic number: {b:#04x}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl FrameConfig {
    /// Check the configuration once, so that the hot path need not.
    pub fn validate(&self) -> Result<(), FrameError> {
        if !matches!(self.width, 1 | 2 | 4 | 8) {
            return Err(FrameError::Config(format!("width must be 1, 2, 4 or 8, not {}", self.width)));
        }
        if self.offset > 1 << 20 {
            return Err(FrameError::Config(format!("offset {} is unreasonably large", self.offset)));
        }
        if self.max_frame > isize::MAX as usize / 2 {
            return Err(FrameError::Config("max_frame too large".into()));
        }
        Ok(())
    }

    /// Bytes before the body: header plus length field.
    #[inline]
    pub fn prefix_len(&self) -> usize {
        self.offset + self.width
    }

    /// Body length of the frame starting at `buf[0]`, if the length field is there.
    #[inline]
    fn body_len(&self, buf: &[u8]) -> Option<Result<usize, FrameError>> {
        if let (Some(m), Some(&b)) = (self.magic, buf.first()) {
            if b != m {
                return Some(Err(FrameError::BadMagic(b)));
            }
        }
        let field = buf.get(self.offset..self.offset + self.width)?;
        let mut raw: u64 = 0;
        match self.endian {
            Endian::Big => {
                for &b in field {
                    raw = (raw << 8) | u64::from(b);
                }
            }
            Endian::Little => {
                for &b in field.iter().rev() {
                    raw = (raw << 8) | u64::from(b);
                }
            }
        }
        let len = i128::from(raw) + i128::from(self.adjust);
        if len < 0 {
            return Some(Err(FrameError::BadLength(len)));
        }
        if len > self.max_frame as i128 {
            return Some(Err(FrameError::TooLarge { len: len as u64, max: self.max_frame }));
        }
        Some(Ok(len as usize))
    }

    /// Append one frame: `header` (exactly `offset` bytes), the length field, `body`.
    pub fn encode_into(&self, header: &[u8], body: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
        if header.len() != self.offset {
            return Err(FrameError::BadHeader { got: header.len(), want: self.offset });
        }
        if body.len() > self.max_frame {
            return Err(FrameError::TooLarge { len: body.len() as u64, max: self.max_frame });
        }
        let field = body.len() as i128 - i128::from(self.adjust);
        let limit: i128 = if self.width == 8 { i128::from(u64::MAX) } else { (1i128 << (self.width * 8)) - 1 };
        if field < 0 || field > limit {
            return Err(FrameError::BadLength(field));
        }
        let field = field as u64;
        out.reserve(self.prefix_len() + body.len());
        out.extend_from_slice(header);
        match self.endian {
            Endian::Big => out.extend_from_slice(&field.to_be_bytes()[8 - self.width..]),
            Endian::Little => out.extend_from_slice(&field.to_le_bytes()[..self.width]),
        }
        out.extend_from_slice(body);
        Ok(())
    }
}

/// The incremental splitter. `feed` calls `emit` once per complete frame.
#[derive(Debug)]
pub struct FrameSplitter {
    cfg: FrameConfig,
    /// Unconsumed bytes (a partial frame); never more than one frame.
    buf: Vec<u8>,
    /// Sticky error: a stream that failed once stays failed.
    failed: Option<FrameError>,
}

impl FrameSplitter {
    pub fn new(cfg: FrameConfig) -> Result<Self, FrameError> {
        cfg.validate()?;
        Ok(FrameSplitter { cfg, buf: Vec::new(), failed: None })
    }

    pub fn config(&self) -> &FrameConfig {
        &self.cfg
    }

    /// Bytes held for an incomplete frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// True after an error: the splitter accepts no more input.
    pub fn failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Consume `data`; call `emit` with each complete frame (as configured:
    /// stripped or whole). Frames emitted before an error stay emitted; the
    /// error poisons the splitter. `emit` may itself fail (`Err(E)` stops the
    /// feed and is returned; the unconsumed rest is dropped and the splitter
    /// poisoned, since the caller can no longer account for it).
    pub fn feed<E, F>(&mut self, data: &[u8], mut emit: F) -> Result<(), FeedError<E>>
    where
        F: FnMut(&[u8]) -> Result<(), E>,
    {
        if let Some(e) = &self.failed {
            return Err(FeedError::Frame(e.clone()));
        }
        let r = self.feed_inner(data, &mut emit);
        if let Err(FeedError::Frame(e)) = &r {
            self.failed = Some(e.clone());
            self.buf = Vec::new();
        } else if r.is_err() {
            self.failed = Some(FrameError::Config("stream abandoned after a consumer error".into()));
            self.buf = Vec::new();
        }
        r
    }

    fn feed_inner<E, F>(&mut self, mut data: &[u8], emit: &mut F) -> Result<(), FeedError<E>>
    where
        F: FnMut(&[u8]) -> Result<(), E>,
    {
        let prefix = self.cfg.prefix_len();
        // 1. Complete the partial frame held from earlier calls, taking only
        //    what it needs from `data`.
        if !self.buf.is_empty() {
            if self.buf.len() < prefix {
                if let Some(Err(e)) = self.cfg.body_len(&self.buf) {
                    return Err(FeedError::Frame(e));
                }
                let take = (prefix - self.buf.len()).min(data.len());
                self.buf.extend_from_slice(&data[..take]);
                data = &data[take..];
                if self.buf.len() < prefix {
                    if let Some(Err(e)) = self.cfg.body_len(&self.buf) {
                        return Err(FeedError::Frame(e));
                    }
                    return Ok(());
                }
            }
            let body = self.cfg.body_len(&self.buf).expect("prefix present").map_err(FeedError::Frame)?;
            let total = prefix + body;
            let take = (total - self.buf.len()).min(data.len());
            if self.buf.capacity() < total {
                self.buf.reserve_exact(total - self.buf.len());
            }
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buf.len() < total {
                return Ok(());
            }
            let start = if self.cfg.strip_header { prefix } else { 0 };
            let r = emit(&self.buf[start..]);
            self.buf.clear();
            if self.buf.capacity() > 1 << 20 {
                self.buf = Vec::new(); // do not keep a big frame's buffer around
            }
            r.map_err(FeedError::Consumer)?;
        }
        // 2. Whole frames straight from `data`, without copying.
        while let Some(body) = self.cfg.body_len(data) {
            let body = body.map_err(FeedError::Frame)?;
            let total = prefix + body;
            if data.len() < total {
                // Only the bytes present are buffered; the rest is reserved
                // once (bounded by max_frame, checked above).
                self.buf.reserve_exact(total);
                break;
            }
            let start = if self.cfg.strip_header { prefix } else { 0 };
            emit(&data[start..total]).map_err(FeedError::Consumer)?;
            data = &data[total..];
        }
        // 3. Keep the tail (an incomplete frame), after checking its magic.
        if let (Some(m), Some(&b)) = (self.cfg.magic, data.first()) {
            if b != m {
                return Err(FeedError::Frame(FrameError::BadMagic(b)));
            }
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// Convenience: all frames of `data` as owned vectors.
    pub fn feed_collect(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut out = Vec::new();
        self.feed(data, |f| {
            out.push(f.to_vec());
            Ok::<(), std::convert::Infallible>(())
        })
        .map_err(|e| match e {
            FeedError::Frame(e) => e,
            FeedError::Consumer(never) => match never {},
        })?;
        Ok(out)
    }
}

/// An error of [`FrameSplitter::feed`]: the stream's or the consumer's.
#[derive(Debug, PartialEq, Eq)]
pub enum FeedError<E> {
    Frame(FrameError),
    Consumer(E),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plain(max: usize) -> FrameConfig {
        FrameConfig { max_frame: max, ..FrameConfig::default() }
    }

    #[test]
    fn splits_and_strips() {
        let mut s = FrameSplitter::new(plain(100)).unwrap();
        let mut wire = Vec::new();
        plain(100).encode_into(b"", b"hello", &mut wire).unwrap();
        plain(100).encode_into(b"", b"", &mut wire).unwrap();
        plain(100).encode_into(b"", b"world!", &mut wire).unwrap();
        assert_eq!(s.feed_collect(&wire).unwrap(), vec![b"hello".to_vec(), vec![], b"world!".to_vec()]);
        assert_eq!(s.buffered(), 0);
    }

    #[test]
    fn oversized_fails_before_buffering() {
        let mut s = FrameSplitter::new(plain(10)).unwrap();
        // Only the length field: the error comes before any body byte.
        let err = s.feed_collect(&[0, 0, 0, 11]).unwrap_err();
        assert_eq!(err, FrameError::TooLarge { len: 11, max: 10 });
        assert_eq!(s.buffered(), 0);
        assert!(s.failed());
        assert!(s.feed_collect(b"").is_err(), "poisoned");
    }

    #[test]
    fn oversized_split_length_field() {
        let mut s = FrameSplitter::new(plain(10)).unwrap();
        assert!(s.feed_collect(&[0, 0]).unwrap().is_empty());
        assert!(matches!(s.feed_collect(&[1, 0]), Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn rpcx_shape_keeps_whole_frame() {
        let cfg = FrameConfig { offset: 12, strip_header: false, ..FrameConfig::default() };
        let mut s = FrameSplitter::new(cfg.clone()).unwrap();
        let mut wire = Vec::new();
        cfg.encode_into(&[8u8; 12], b"abc", &mut wire).unwrap();
        assert_eq!(wire.len(), 19);
        let frames = s.feed_collect(&wire).unwrap();
        assert_eq!(frames, vec![wire.clone()]);
    }

    #[test]
    fn widths_endians_and_adjust() {
        for width in [1usize, 2, 4, 8] {
            for endian in [Endian::Big, Endian::Little] {
                for adjust in [-2i64, 0, 3] {
                    let cfg = FrameConfig { width, endian, adjust, max_frame: 200, ..FrameConfig::default() };
                    let mut wire = Vec::new();
                    let bodies: Vec<Vec<u8>> = vec![vec![7; 5], vec![1; 100], vec![9; 3]];
                    for b in &bodies {
                        cfg.encode_into(b"", b, &mut wire).unwrap();
                    }
                    let mut s = FrameSplitter::new(cfg).unwrap();
                    assert_eq!(s.feed_collect(&wire).unwrap(), bodies);
                }
            }
        }
    }

    #[test]
    fn negative_length_rejected() {
        let cfg = FrameConfig { adjust: -5, ..FrameConfig::default() };
        let mut s = FrameSplitter::new(cfg).unwrap();
        assert!(matches!(s.feed_collect(&[0, 0, 0, 1]), Err(FrameError::BadLength(-4))));
    }

    #[test]
    fn bad_config() {
        assert!(FrameSplitter::new(FrameConfig { width: 3, ..FrameConfig::default() }).is_err());
    }

    #[test]
    fn encoder_checks() {
        let cfg = FrameConfig { width: 1, max_frame: 1000, ..FrameConfig::default() };
        let mut out = Vec::new();
        assert!(matches!(cfg.encode_into(b"", &[0; 256], &mut out), Err(FrameError::BadLength(256))));
        assert!(matches!(cfg.encode_into(b"x", b"", &mut out), Err(FrameError::BadHeader { .. })));
        assert!(matches!(plain(3).encode_into(b"", b"abcd", &mut out), Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn consumer_error_stops() {
        let mut s = FrameSplitter::new(plain(100)).unwrap();
        let mut wire = Vec::new();
        plain(100).encode_into(b"", b"a", &mut wire).unwrap();
        plain(100).encode_into(b"", b"b", &mut wire).unwrap();
        let mut n = 0;
        let r = s.feed(&wire, |_| {
            n += 1;
            Err("stop")
        });
        assert_eq!(r, Err(FeedError::Consumer("stop")));
        assert_eq!(n, 1);
        assert!(s.failed());
    }

    proptest! {
        #[test]
        fn any_chunking_same_frames(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20),
            cuts in proptest::collection::vec(any::<usize>(), 0..30),
            width in prop_oneof![Just(2usize), Just(4), Just(8)],
            little in any::<bool>(),
            offset in 0usize..5,
        ) {
            let endian = if little { Endian::Little } else { Endian::Big };
            let cfg = FrameConfig { offset, width, endian, max_frame: 300, strip_header: offset == 0, ..FrameConfig::default() };
            let mut wire = Vec::new();
            let mut expect = Vec::new();
            for b in &bodies {
                let start = wire.len();
                cfg.encode_into(&vec![0xAB; offset], b, &mut wire).unwrap();
                expect.push(if offset == 0 { b.clone() } else { wire[start..].to_vec() });
            }
            let mut points: Vec<usize> = cuts.iter().map(|c| if wire.is_empty() { 0 } else { c % (wire.len() + 1) }).collect();
            points.push(0);
            points.push(wire.len());
            points.sort_unstable();
            let mut s = FrameSplitter::new(cfg).unwrap();
            let mut got = Vec::new();
            for w in points.windows(2) {
                got.extend(s.feed_collect(&wire[w[0]..w[1]]).unwrap());
            }
            prop_assert_eq!(got, expect);
            prop_assert_eq!(s.buffered(), 0);
        }

        #[test]
        fn random_bytes_never_panic_nor_overbuffer(data in proptest::collection::vec(any::<u8>(), 0..2000), chunk in 1usize..64) {
            let mut s = FrameSplitter::new(plain(64)).unwrap();
            for c in data.chunks(chunk) {
                if s.feed_collect(c).is_err() { break; }
                prop_assert!(s.buffered() <= 4 + 64);
            }
        }
    }
}

#[cfg(feature = "python")]
pub mod python {
    use super::*;
    use crate::errors::ErrorKind;
    use pyo3::buffer::PyBuffer;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyList};

    pub(crate) fn frame_err(e: FrameError) -> PyErr {
        match e {
            FrameError::TooLarge { .. } => ErrorKind::FrameTooLarge.err(e.to_string()),
            FrameError::Config(_) | FrameError::BadHeader { .. } => {
                pyo3::exceptions::PyValueError::new_err(e.to_string())
            }
            FrameError::BadLength(_) | FrameError::BadMagic(_) => ErrorKind::Decode.err(e.to_string()),
        }
    }

    pub(crate) fn parse_endian(s: &str) -> PyResult<Endian> {
        match s {
            "big" => Ok(Endian::Big),
            "little" => Ok(Endian::Little),
            _ => Err(pyo3::exceptions::PyValueError::new_err("endian must be 'big' or 'little'")),
        }
    }

    /// Run `f` over the bytes of any contiguous buffer (bytes, bytearray, memoryview).
    pub(crate) fn with_bytes<R>(data: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> PyResult<R>) -> PyResult<R> {
        if let Ok(b) = data.cast::<PyBytes>() {
            return f(b.as_bytes());
        }
        let buf = PyBuffer::<u8>::get(data)?;
        if !buf.is_c_contiguous() {
            return Err(pyo3::exceptions::PyValueError::new_err("buffer must be contiguous"));
        }
        // SAFETY: the buffer is contiguous and held for the duration of `f`;
        // we only read it, and no Python code runs while we hold the slice
        // except what `f` does, which never mutates this object.
        let slice = unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) };
        f(slice)
    }

    /// Length-field frame splitter and encoder (see `rustext._native.pyi`).
    #[pyclass(module = "rustext")]
    pub struct FrameDecoder {
        inner: FrameSplitter,
    }

    #[pymethods]
    impl FrameDecoder {
        #[new]
        #[pyo3(signature = (*, width=4, endian="big", offset=0, adjust=0, max_frame=16*1024*1024, strip_header=true))]
        fn new(width: usize, endian: &str, offset: usize, adjust: i64, max_frame: usize, strip_header: bool) -> PyResult<Self> {
            let cfg = FrameConfig { offset, width, endian: parse_endian(endian)?, adjust, max_frame, strip_header, magic: None };
            Ok(FrameDecoder { inner: FrameSplitter::new(cfg).map_err(frame_err)? })
        }

        /// All complete frames in the stream so far, in order.
        fn feed<'py>(&mut self, py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
            let out = PyList::empty(py);
            let inner = &mut self.inner;
            with_bytes(data, |bytes| {
                inner
                    .feed(bytes, |f| out.append(PyBytes::new(py, f)))
                    .map_err(|e| match e {
                        FeedError::Frame(e) => frame_err(e),
                        FeedError::Consumer(e) => e,
                    })
            })?;
            Ok(out)
        }

        /// One encoded frame: `header` (exactly `offset` bytes), length field, `body`.
        #[pyo3(signature = (body, header=None))]
        fn encode<'py>(&self, py: Python<'py>, body: &Bound<'py, PyAny>, header: Option<&[u8]>) -> PyResult<Bound<'py, PyBytes>> {
            let cfg = self.inner.config();
            let mut out = Vec::new();
            with_bytes(body, |b| cfg.encode_into(header.unwrap_or(b""), b, &mut out).map_err(frame_err))?;
            Ok(PyBytes::new(py, &out))
        }

        /// Many frames (offset must be 0), concatenated into one buffer.
        fn encode_many<'py>(&self, py: Python<'py>, bodies: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
            let cfg = self.inner.config();
            let mut out = Vec::new();
            for body in bodies.try_iter()? {
                let body = body?;
                with_bytes(&body, |b| cfg.encode_into(b"", b, &mut out).map_err(frame_err))?;
            }
            Ok(PyBytes::new(py, &out))
        }

        #[getter]
        fn buffered(&self) -> usize {
            self.inner.buffered()
        }

        #[getter]
        fn failed(&self) -> bool {
            self.inner.failed()
        }

        #[getter]
        fn max_frame(&self) -> usize {
            self.inner.config().max_frame
        }
    }

    pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_class::<FrameDecoder>()?;
        Ok(())
    }
}
