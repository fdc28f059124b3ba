//! Bindings: `rustext.ClientMessage`, `parse_client_message`, the builders.

use super::{allowed_mask, normalize_args, parse_client, parse_server, parse_uuid, CallPayload, ClientMsg, Error};
use super::{ACK, ALL_CLIENT_TYPES, CALL, EVNT, NACK, PUB, RES, SUB, UNSB};
use crate::errors::ErrorKind;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

fn decode_err(e: Error) -> PyErr {
    ErrorKind::JugglerDecode.err(e.to_string())
}

fn opt_bytes(py: Python<'_>, v: Option<Vec<u8>>) -> Option<Py<PyBytes>> {
    v.map(|a| PyBytes::new(py, &a).unbind())
}

/// A parsed client frame. `args` stays raw JSON bytes (never decoded).
#[pyclass(frozen, module = "rustext", name = "ClientMessage")]
pub struct ClientMessage {
    #[pyo3(get, name = "type")]
    msg_type: u32,
    #[pyo3(get)]
    uuid: Py<PyString>,
    #[pyo3(get)]
    uri: Option<Py<PyString>>,
    #[pyo3(get)]
    timeout_ns: Option<i64>,
    #[pyo3(get)]
    channel: Option<Py<PyString>>,
    #[pyo3(get)]
    pattern: bool,
    #[pyo3(get)]
    args: Option<Py<PyBytes>>,
    /// SUB: (offset, epoch) to recover from, or None
    #[pyo3(get)]
    since: Option<(u64, Py<PyString>)>,
    /// SUB: the client asks for join/leave notices
    #[pyo3(get)]
    join_leave: bool,
}

#[pymethods]
impl ClientMessage {
    fn __repr__(&self, py: Python<'_>) -> String {
        let target = self.uri.as_ref().or(self.channel.as_ref()).map(|s| s.bind(py).to_string()).unwrap_or_default();
        format!("ClientMessage(type={}, uuid={}, target={:?})", self.msg_type, self.uuid.bind(py), target)
    }
}

/// A parsed server frame (for clients). `args` is raw JSON bytes.
#[pyclass(frozen, module = "rustext", name = "ServerMessage")]
pub struct ServerMessage {
    #[pyo3(get, name = "type")]
    msg_type: u32,
    #[pyo3(get)]
    uuid: Py<PyString>,
    #[pyo3(get)]
    for_uuid: Py<PyString>,
    #[pyo3(get)]
    for_type: Option<u32>,
    #[pyo3(get)]
    uri: Option<Py<PyString>>,
    #[pyo3(get)]
    channel: Option<Py<PyString>>,
    #[pyo3(get)]
    pattern: Option<Py<PyString>>,
    #[pyo3(get)]
    code: Option<i64>,
    #[pyo3(get)]
    message: Option<Py<PyString>>,
    #[pyo3(get)]
    args: Option<Py<PyBytes>>,
    #[pyo3(get)]
    offset: Option<u64>,
    #[pyo3(get)]
    epoch: Option<Py<PyString>>,
    #[pyo3(get)]
    recovered: Option<bool>,
    #[pyo3(get)]
    join: Option<Py<PyBytes>>,
    #[pyo3(get)]
    leave: Option<Py<PyBytes>>,
}

#[pymethods]
impl ServerMessage {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!("ServerMessage(type={}, uuid={}, for={})", self.msg_type, self.uuid.bind(py), self.for_uuid.bind(py))
    }
}

/// The Redis call/result payload.
#[pyclass(frozen, module = "rustext", name = "CallPayload")]
pub struct PyCallPayload {
    #[pyo3(get)]
    conn_uuid: Py<PyString>,
    #[pyo3(get)]
    msg_uuid: Py<PyString>,
    #[pyo3(get)]
    uri: Py<PyString>,
    #[pyo3(get)]
    args: Option<Py<PyBytes>>,
    #[pyo3(get)]
    trace: Option<Py<PyBytes>>,
}

#[pymethods]
impl PyCallPayload {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!("CallPayload(msg_uuid={}, uri={:?})", self.msg_uuid.bind(py), self.uri.bind(py).to_string())
    }
}

fn opt_str(py: Python<'_>, s: Option<String>) -> Option<Py<PyString>> {
    s.map(|s| PyString::new(py, &s).unbind())
}

/// Borrow the bytes of a `str` (UTF-8) or `bytes` frame.
fn with_frame<R>(frame: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> PyResult<R>) -> PyResult<R> {
    if let Ok(s) = frame.cast::<PyString>() {
        let text = s.to_str()?;
        f(text.as_bytes())
    } else if let Ok(b) = frame.cast::<PyBytes>() {
        f(b.as_bytes())
    } else {
        Err(pyo3::exceptions::PyTypeError::new_err("frame must be str or bytes"))
    }
}

fn client_message(py: Python<'_>, m: ClientMsg) -> ClientMessage {
    ClientMessage {
        msg_type: m.msg_type,
        uuid: PyString::new(py, &m.uuid).unbind(),
        uri: opt_str(py, m.uri),
        timeout_ns: m.timeout_ns,
        channel: opt_str(py, m.channel),
        pattern: m.pattern,
        args: opt_bytes(py, m.args),
        since: m.since.map(|(o, e)| (o, PyString::new(py, &e).unbind())),
        join_leave: m.join_leave,
    }
}

#[pyfunction]
#[pyo3(signature = (frame, allowed = ALL_CLIENT_TYPES))]
fn parse_client_message(py: Python<'_>, frame: &Bound<'_, PyAny>, allowed: u32) -> PyResult<ClientMessage> {
    with_frame(frame, |b| parse_client(b, allowed).map(|m| client_message(py, m)).map_err(decode_err))
}

#[pyfunction]
fn parse_server_message(py: Python<'_>, frame: &Bound<'_, PyAny>) -> PyResult<ServerMessage> {
    with_frame(frame, |b| {
        let m = parse_server(b).map_err(decode_err)?;
        Ok(ServerMessage {
            msg_type: m.msg_type,
            uuid: PyString::new(py, &m.uuid).unbind(),
            for_uuid: PyString::new(py, &m.for_uuid).unbind(),
            for_type: m.for_type,
            uri: opt_str(py, m.uri),
            channel: opt_str(py, m.channel),
            pattern: opt_str(py, m.pattern),
            code: m.code,
            message: opt_str(py, m.message),
            args: opt_bytes(py, m.args),
            offset: m.offset,
            epoch: opt_str(py, m.epoch),
            recovered: m.recovered,
            join: opt_bytes(py, m.join),
            leave: opt_bytes(py, m.leave),
        })
    })
}

#[pyfunction]
fn parse_allowed_messages(header: &str) -> PyResult<u32> {
    allowed_mask(header).map_err(|e| ErrorKind::JugglerDecode.err(e))
}

#[pyfunction]
fn build_ack<'py>(py: Python<'py>, for_uuid: &str, for_type: u32, target: &str) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &super::build_ack(for_uuid, for_type, target))
}

#[pyfunction]
fn build_nack<'py>(
    py: Python<'py>,
    for_uuid: &str,
    for_type: u32,
    target: &str,
    code: i64,
    message: &str,
) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &super::build_nack(for_uuid, for_type, target, code, message))
}

#[pyfunction]
fn build_res<'py>(py: Python<'py>, for_uuid: &str, uri: &str, args: Option<&[u8]>) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &super::build_res(for_uuid, uri, args))
}

#[pyfunction]
#[pyo3(signature = (for_uuid, channel, pattern = None, args = None, offset = None, epoch = None))]
fn build_evnt<'py>(
    py: Python<'py>,
    for_uuid: &str,
    channel: &str,
    pattern: Option<&str>,
    args: Option<&[u8]>,
    offset: Option<u64>,
    epoch: Option<&str>,
) -> Bound<'py, PyBytes> {
    let position = offset.map(|o| (o, epoch.unwrap_or("")));
    PyBytes::new(py, &super::build_evnt(for_uuid, channel, pattern, args, position))
}

#[pyfunction]
#[pyo3(signature = (for_uuid, channel, offset = None, epoch = None, recovered = None))]
fn build_sub_ack<'py>(
    py: Python<'py>,
    for_uuid: &str,
    channel: &str,
    offset: Option<u64>,
    epoch: Option<&str>,
    recovered: Option<bool>,
) -> Bound<'py, PyBytes> {
    let position = offset.map(|o| (o, epoch.unwrap_or("")));
    PyBytes::new(py, &super::build_sub_ack(for_uuid, channel, position, recovered))
}

#[pyfunction]
#[pyo3(signature = (msg_uuid, uri, timeout_ns, args = None))]
fn build_call<'py>(
    py: Python<'py>,
    msg_uuid: &str,
    uri: &str,
    timeout_ns: i64,
    args: Option<&[u8]>,
) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(py, &super::build_call(msg_uuid, uri, timeout_ns, args).map_err(decode_err)?))
}

#[pyfunction]
#[pyo3(signature = (msg_uuid, channel, args = None))]
fn build_pub<'py>(py: Python<'py>, msg_uuid: &str, channel: &str, args: Option<&[u8]>) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(py, &super::build_pub(msg_uuid, channel, args).map_err(decode_err)?))
}

#[pyfunction]
#[pyo3(signature = (msg_uuid, channel, pattern = false, since = None, join_leave = false))]
fn build_sub<'py>(
    py: Python<'py>,
    msg_uuid: &str,
    channel: &str,
    pattern: bool,
    since: Option<(u64, String)>,
    join_leave: bool,
) -> Bound<'py, PyBytes> {
    if since.is_none() && !join_leave {
        return PyBytes::new(py, &super::build_sub(msg_uuid, channel, pattern, false));
    }
    let since = since.as_ref().map(|(o, e)| (*o, e.as_str()));
    PyBytes::new(py, &super::build_sub_ext(msg_uuid, channel, pattern, since, join_leave))
}

#[pyfunction]
#[pyo3(signature = (msg_uuid, channel, pattern = false))]
fn build_unsb<'py>(py: Python<'py>, msg_uuid: &str, channel: &str, pattern: bool) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &super::build_sub(msg_uuid, channel, pattern, true))
}

#[pyfunction]
#[pyo3(signature = (conn_uuid, msg_uuid, uri, args, trace = None))]
fn build_call_payload<'py>(
    py: Python<'py>,
    conn_uuid: &str,
    msg_uuid: &str,
    uri: &str,
    args: Option<&[u8]>,
    trace: Option<&[u8]>,
) -> PyResult<Bound<'py, PyBytes>> {
    let built = super::build_call_payload_traced(conn_uuid, msg_uuid, uri, args, trace).map_err(decode_err)?;
    Ok(PyBytes::new(py, &built))
}

fn call_payload(py: Python<'_>, p: CallPayload) -> PyCallPayload {
    PyCallPayload {
        conn_uuid: PyString::new(py, &p.conn_uuid).unbind(),
        msg_uuid: PyString::new(py, &p.msg_uuid).unbind(),
        uri: PyString::new(py, &p.uri).unbind(),
        args: opt_bytes(py, p.args),
        trace: opt_bytes(py, p.trace),
    }
}

#[pyfunction]
fn parse_call_payload(py: Python<'_>, data: &[u8]) -> PyResult<PyCallPayload> {
    super::parse_call_payload(data).map(|p| call_payload(py, p)).map_err(decode_err)
}

/// Parse many payloads in one crossing; an invalid one becomes `None`
/// (the caller counts and drops it) instead of failing the batch.
#[pyfunction]
fn parse_call_payloads<'py>(py: Python<'py>, items: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for item in items.iter() {
        let parsed = match item.cast::<PyBytes>() {
            Ok(b) => super::parse_call_payload(b.as_bytes()).ok(),
            Err(_) => None,
        };
        match parsed {
            Some(p) => out.append(Py::new(py, call_payload(py, p))?)?,
            None => out.append(py.None())?,
        }
    }
    Ok(out)
}

#[pyfunction]
fn build_pub_payload<'py>(py: Python<'py>, msg_uuid: &str, args: Option<&[u8]>) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(py, &super::build_pub_payload(msg_uuid, args).map_err(decode_err)?))
}

#[pyfunction]
fn parse_pub_payload<'py>(py: Python<'py>, data: &[u8]) -> PyResult<(Bound<'py, PyString>, Option<Bound<'py, PyBytes>>)> {
    let (u, a) = super::parse_pub_payload(data).map_err(decode_err)?;
    Ok((PyString::new(py, &u), a.map(|a| PyBytes::new(py, &a))))
}

#[pyfunction]
#[allow(clippy::type_complexity)]
fn parse_pub_payload_at<'py>(
    py: Python<'py>,
    data: &[u8],
) -> PyResult<(Bound<'py, PyString>, Option<Bound<'py, PyBytes>>, Option<u64>, Option<Bound<'py, PyString>>)> {
    let p = super::parse_pub_payload_at(data).map_err(decode_err)?;
    Ok((
        PyString::new(py, &p.msg_uuid),
        p.args.map(|a| PyBytes::new(py, &a)),
        p.offset,
        p.epoch.map(|e| PyString::new(py, &e)),
    ))
}

#[pyfunction]
fn normalize_json<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(py, &normalize_args(data).map_err(decode_err)?))
}

#[pyfunction]
fn new_uuid() -> String {
    super::new_uuid()
}

#[pyfunction]
fn canonical_uuid(s: &str) -> Option<String> {
    parse_uuid(s)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CALL", CALL)?;
    m.add("PUB", PUB)?;
    m.add("SUB", SUB)?;
    m.add("UNSB", UNSB)?;
    m.add("NACK", NACK)?;
    m.add("ACK", ACK)?;
    m.add("RES", RES)?;
    m.add("EVNT", EVNT)?;
    m.add("ALL_CLIENT_TYPES", ALL_CLIENT_TYPES)?;
    m.add_class::<ClientMessage>()?;
    m.add_class::<ServerMessage>()?;
    m.add_class::<PyCallPayload>()?;
    m.add_function(wrap_pyfunction!(parse_client_message, m)?)?;
    m.add_function(wrap_pyfunction!(parse_server_message, m)?)?;
    m.add_function(wrap_pyfunction!(parse_allowed_messages, m)?)?;
    m.add_function(wrap_pyfunction!(build_ack, m)?)?;
    m.add_function(wrap_pyfunction!(build_nack, m)?)?;
    m.add_function(wrap_pyfunction!(build_res, m)?)?;
    m.add_function(wrap_pyfunction!(build_evnt, m)?)?;
    m.add_function(wrap_pyfunction!(build_sub_ack, m)?)?;
    m.add_function(wrap_pyfunction!(parse_pub_payload_at, m)?)?;
    m.add_class::<super::fanout::python::FanoutHub>()?;
    m.add_class::<super::subscribers::python::FanoutSubscribers>()?;
    m.add_function(wrap_pyfunction!(build_call, m)?)?;
    m.add_function(wrap_pyfunction!(build_pub, m)?)?;
    m.add_function(wrap_pyfunction!(build_sub, m)?)?;
    m.add_function(wrap_pyfunction!(build_unsb, m)?)?;
    m.add_function(wrap_pyfunction!(build_call_payload, m)?)?;
    m.add_function(wrap_pyfunction!(parse_call_payload, m)?)?;
    m.add_function(wrap_pyfunction!(parse_call_payloads, m)?)?;
    m.add_function(wrap_pyfunction!(build_pub_payload, m)?)?;
    m.add_function(wrap_pyfunction!(parse_pub_payload, m)?)?;
    m.add_function(wrap_pyfunction!(normalize_json, m)?)?;
    m.add_function(wrap_pyfunction!(new_uuid, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_uuid, m)?)?;
    Ok(())
}
