//! `rustext.GrpcServer` (and `rustext.GrpcClient`): the gRPC bridge as Python objects.
//!
//! Python registers `fileno()` with `loop.add_reader`; when it turns readable,
//! one `take()` returns every queued call, and one `complete(...)` answers a
//! whole batch. No call takes the GIL on the runtime thread.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use super::frame::Code;
use super::client::{ClientConfig, GrpcClient};
use super::server::{Call, GrpcServer, Kind, Reply, ServerConfig};
use crate::errors::ErrorKind;
use crate::tls::{client_config, server_config, CertPair, CertResolver, ServerTrust};

fn resolve(host: &str, port: u16) -> PyResult<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| PyOSError::new_err(format!("cannot resolve {host}:{port}: {e}")))?
        .next()
        .ok_or_else(|| PyOSError::new_err(format!("cannot resolve {host}:{port}")))
}

fn duration(what: &str, secs: f64) -> PyResult<Duration> {
    if !secs.is_finite() || !(0.0..=86_400.0 * 365.0).contains(&secs) {
        return Err(PyValueError::new_err(format!("{what} must be between 0 and one year, got {secs}")));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Kind numbers of `take()` tuples.
const KIND_NEXT: u32 = 0;
const KIND_CUR: u32 = 1;
const KIND_SET: u32 = 2;
const KIND_RAW: u32 = 3;

fn tls_err(e: crate::tls::TlsError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

#[pyclass(name = "GrpcServer", module = "rustext", frozen)]
pub struct PyGrpcServer {
    host: String,
    port: u16,
    config: ServerConfig,
    certs: Option<std::sync::Arc<CertResolver>>,
    server: Mutex<Option<GrpcServer>>,
    bridge: Mutex<Option<std::sync::Arc<super::server::Bridge>>>,
}

impl PyGrpcServer {
    fn bridge(&self) -> Option<std::sync::Arc<super::server::Bridge>> {
        self.bridge.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[pymethods]
impl PyGrpcServer {
    #[new]
    #[pyo3(signature = (host, port, *, raw_methods = Vec::new(), max_message = 4 << 20, max_concurrent_streams = 4096, max_wait = 60.0, tls_cert = None, tls_key = None, tls_client_ca = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        host: String,
        port: u16,
        raw_methods: Vec<String>,
        max_message: usize,
        max_concurrent_streams: u32,
        max_wait: f64,
        tls_cert: Option<String>,
        tls_key: Option<String>,
        tls_client_ca: Option<String>,
    ) -> PyResult<Self> {
        if max_message == 0 || max_message > (1 << 30) {
            return Err(PyValueError::new_err("max_message must be in 1..=2**30"));
        }
        if max_concurrent_streams == 0 {
            return Err(PyValueError::new_err("max_concurrent_streams must be >= 1"));
        }
        for m in &raw_methods {
            if !m.starts_with('/') || m.matches('/').count() != 2 {
                return Err(PyValueError::new_err(format!("raw method {m:?} is not /package.Service/Method")));
            }
        }
        let max_wait = duration("max_wait", max_wait)?;
        if max_wait.is_zero() {
            return Err(PyValueError::new_err("max_wait must be > 0"));
        }
        let (certs, tls) = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => {
                let resolver = std::sync::Arc::new(CertResolver::new(vec![CertPair::new(cert, key)]).map_err(tls_err)?);
                let ca = tls_client_ca.as_deref().map(std::path::Path::new);
                let config = server_config(resolver.clone(), &[b"h2"], ca).map_err(tls_err)?;
                (Some(resolver), Some(std::sync::Arc::new(config)))
            }
            (None, None) if tls_client_ca.is_none() => (None, None),
            _ => return Err(PyValueError::new_err("TLS needs both tls_cert and tls_key")),
        };
        Ok(PyGrpcServer {
            host,
            port,
            certs,
            config: ServerConfig { max_message, max_concurrent_streams, max_wait, raw_methods, tls },
            server: Mutex::new(None),
            bridge: Mutex::new(None),
        })
    }

    /// Bind and start serving; returns the bound port. Raises OSError.
    fn start(&self, py: Python<'_>) -> PyResult<u16> {
        let mut slot = self.server.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Err(ErrorKind::Rustext.err("GrpcServer already started"));
        }
        let addr = resolve(&self.host, self.port)?;
        let cfg = self.config.clone();
        let server = py
            .detach(|| GrpcServer::start(addr, cfg))
            .map_err(|e| PyOSError::new_err(format!("cannot listen on {}:{}: {e}", self.host, self.port)))?;
        let port = server.local_addr().port();
        *self.bridge.lock().unwrap_or_else(|e| e.into_inner()) = Some(server.bridge().clone());
        *slot = Some(server);
        Ok(port)
    }

    /// Read the certificate files again: new handshakes get the new
    /// certificate, established connections keep theirs. Raises ValueError
    /// (naming the file) and keeps the current certificate when the files
    /// are unusable.
    fn reload_tls(&self) -> PyResult<()> {
        let certs = self.certs.as_ref().ok_or_else(|| PyValueError::new_err("this server does not serve TLS"))?;
        certs.reload(None).map_err(tls_err)
    }

    /// The fd that is readable while calls are queued (for `loop.add_reader`).
    fn fileno(&self) -> PyResult<i32> {
        self.bridge()
            .map(|b| b.wake_fd())
            .ok_or_else(|| ErrorKind::Rustext.err("GrpcServer not started"))
    }

    /// Every queued call: `(token, kind, name_or_payload, arg, timeout_s_or_None)`.
    fn take<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        let Some(bridge) = self.bridge() else { return Ok(list) };
        let calls = bridge.take();
        if calls.is_empty() {
            return Ok(list);
        }
        let now = Instant::now();
        for q in calls {
            let timeout: Option<f64> = q.deadline.map(|d| d.saturating_duration_since(now).as_secs_f64());
            let t = match q.call {
                Call::NextId(r) => (q.token, KIND_NEXT, r.name.into_pyobject(py)?.into_any(), r.range_size.into_pyobject(py)?.into_any(), timeout),
                Call::CurId(r) => (q.token, KIND_CUR, r.name.into_pyobject(py)?.into_any(), 0u64.into_pyobject(py)?.into_any(), timeout),
                Call::SetId(r) => (q.token, KIND_SET, r.name.into_pyobject(py)?.into_any(), r.new_id.into_pyobject(py)?.into_any(), timeout),
                Call::Raw(i, b) => (q.token, KIND_RAW + i as u32, PyBytes::new(py, &b).into_any(), 0u64.into_pyobject(py)?.into_any(), timeout),
            };
            list.append(PyTuple::new(py, [
                t.0.into_pyobject(py)?.into_any(),
                t.1.into_pyobject(py)?.into_any(),
                t.2,
                t.3,
                t.4.into_pyobject(py)?.into_any(),
            ])?)?;
        }
        Ok(list)
    }

    /// Answer a batch: `(token, a, b)` each (NextID: from, to; CurID: cur; SetID: success).
    /// Returns how many were still waiting.
    fn complete(&self, replies: &Bound<'_, PyList>) -> PyResult<usize> {
        let Some(bridge) = self.bridge() else { return Ok(0) };
        let mut items = Vec::with_capacity(replies.len());
        for it in replies.iter() {
            let (token, a, b): (u64, u64, u64) = it.extract()?;
            items.push((token, a, b));
        }
        Ok(bridge.complete_many(items))
    }

    /// Answer a raw method's call with its serialized reply message.
    fn complete_raw(&self, token: u64, data: &[u8]) -> bool {
        let Some(bridge) = self.bridge() else { return false };
        bridge.complete(token, |_| Reply::Raw(bytes::Bytes::copy_from_slice(data)))
    }

    /// Answer a call with a non-OK gRPC status (`code` 1..=16).
    fn fail(&self, token: u64, code: u32, message: &str) -> PyResult<bool> {
        if !(1..=16).contains(&code) {
            return Err(PyValueError::new_err(format!("status code {code} is not in 1..=16")));
        }
        let Some(bridge) = self.bridge() else { return Ok(false) };
        Ok(bridge.complete(token, |_| Reply::Status(Code::from_u32(code), message.to_owned())))
    }

    /// Calls received and not answered yet.
    fn pending(&self) -> usize {
        self.bridge().map_or(0, |b| b.pending())
    }

    /// Stop accepting (listener closed, GOAWAY, new calls UNAVAILABLE); queued calls may still be answered.
    fn drain(&self) {
        if let Some(s) = self.server.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            s.drain();
        }
    }

    /// Fail what is left with UNAVAILABLE, stop the runtime thread and join it. Idempotent.
    fn close(&self, py: Python<'_>) {
        let server = self.server.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = server {
            py.detach(move || drop(s));
        }
    }

    #[getter]
    fn closed(&self) -> bool {
        self.server.lock().unwrap_or_else(|e| e.into_inner()).is_none() && self.bridge().is_some()
    }
}

#[pyclass(name = "GrpcClient", module = "rustext", frozen)]
pub struct PyGrpcClient {
    client: Mutex<Option<std::sync::Arc<GrpcClient>>>,
}

impl PyGrpcClient {
    fn get(&self) -> PyResult<std::sync::Arc<GrpcClient>> {
        self.client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| ErrorKind::Rustext.err("GrpcClient is closed"))
    }

    fn submit(&self, target: usize, kind: Kind, name: &str, arg: u64, timeout: f64) -> PyResult<u64> {
        let t = duration("timeout", timeout)?;
        let c = self.get()?;
        if target >= c.targets() {
            return Err(PyValueError::new_err(format!("no target {target}")));
        }
        c.call(target, kind, name, arg, t)
            .ok_or_else(|| ErrorKind::Rustext.err("GrpcClient is closed"))
    }
}

#[pymethods]
impl PyGrpcClient {
    /// Start the runtime thread; connections are made on first use.
    #[new]
    #[pyo3(signature = (targets, *, connect_timeout = 1.0, max_message = 4 << 20, tls = false, tls_ca = None, tls_cert = None, tls_key = None, tls_insecure = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        targets: Vec<String>,
        connect_timeout: f64,
        max_message: usize,
        tls: bool,
        tls_ca: Option<String>,
        tls_cert: Option<String>,
        tls_key: Option<String>,
        tls_insecure: bool,
    ) -> PyResult<Self> {
        if targets.is_empty() {
            return Err(PyValueError::new_err("at least one target"));
        }
        for t in &targets {
            let (host, port) = t.rsplit_once(':').unwrap_or(("", ""));
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(PyValueError::new_err(format!("expected HOST:PORT, got {t:?}")));
            }
        }
        let connect_timeout = duration("connect_timeout", connect_timeout)?;
        if connect_timeout.is_zero() || max_message == 0 {
            return Err(PyValueError::new_err("connect_timeout and max_message must be > 0"));
        }
        let tls = if tls || tls_ca.is_some() || tls_cert.is_some() || tls_insecure {
            let trust = match (tls_insecure, tls_ca) {
                (true, _) => ServerTrust::Insecure,
                (false, Some(ca)) => ServerTrust::CaFile(ca.into()),
                (false, None) => ServerTrust::System,
            };
            let pair = match (tls_cert, tls_key) {
                (Some(c), Some(k)) => Some(CertPair::new(c, k)),
                (None, None) => None,
                _ => return Err(PyValueError::new_err("a client certificate needs both tls_cert and tls_key")),
            };
            Some(std::sync::Arc::new(client_config(&trust, pair.as_ref(), &[b"h2"]).map_err(tls_err)?))
        } else {
            None
        };
        let cfg = ClientConfig { connect_timeout, max_message, tls };
        let c = py
            .detach(|| GrpcClient::start(&targets, cfg))
            .map_err(|e| PyOSError::new_err(format!("cannot start the gRPC client: {e}")))?;
        Ok(PyGrpcClient { client: Mutex::new(Some(std::sync::Arc::new(c))) })
    }

    /// Readable while finished calls wait in `take()`.
    fn fileno(&self) -> PyResult<i32> {
        Ok(self.get()?.wake_fd())
    }

    /// Start `GRPCNextID(name, range_size)` on target `target`; returns the call's token.
    fn next_id(&self, target: usize, name: &str, range_size: i64, timeout: f64) -> PyResult<u64> {
        self.submit(target, Kind::NextId, name, range_size as u64, timeout)
    }

    fn cur_id(&self, target: usize, name: &str, timeout: f64) -> PyResult<u64> {
        self.submit(target, Kind::CurId, name, 0, timeout)
    }

    fn set_id(&self, target: usize, name: &str, new_id: u64, timeout: f64) -> PyResult<u64> {
        self.submit(target, Kind::SetId, name, new_id, timeout)
    }

    /// Every finished call: `(token, status, a, b, message)`; status 0 (OK) carries
    /// a, b (NextID: from, to; CurID: cur, 0; SetID: success, 0), others the message.
    fn take<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        let Ok(c) = self.get() else { return Ok(list) };
        for done in c.take() {
            let t = match done.outcome {
                Ok((a, b)) => (done.token, 0u32, a, b, None),
                Err((code, msg)) => (done.token, code as u32, 0, 0, Some(msg)),
            };
            list.append(t.into_pyobject(py)?)?;
        }
        Ok(list)
    }

    /// Give up call `token` (its asyncio future was cancelled): never sent, or
    /// its stream reset; no completion comes. False when it had finished.
    fn cancel(&self, token: u64) -> bool {
        self.get().is_ok_and(|c| c.cancel(token))
    }

    /// Calls started and not finished.
    fn inflight(&self) -> usize {
        self.get().map_or(0, |c| c.inflight())
    }

    /// Drop calls in flight (no completion), stop and join the runtime thread. Idempotent.
    fn close(&self, py: Python<'_>) {
        let c = self.client.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(c) = c {
            py.detach(move || c.close());
        }
    }

    #[getter]
    fn closed(&self) -> bool {
        self.client.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGrpcServer>()?;
    m.add_class::<PyGrpcClient>()?;
    Ok(())
}
