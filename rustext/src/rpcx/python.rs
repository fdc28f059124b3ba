//! The Python bindings of the rpcx codec (`rustext._native`).
use super::encode::gzip;
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
