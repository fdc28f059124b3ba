//! `rustext.Balancer`: the data plane as a Python object.
//!
//! It takes a `balancer.config.BalancerConfig` and reads its dataclasses
//! directly (`python/schema`); what only Rust can check raises
//! `BalancerConfigError` naming the attribute and leaves a running balancer
//! untouched. Every method is quick except `drain`/`close`, which release
//! the GIL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::config::{Config, RuleSpec};
use super::server::Balancer;
use super::stats::{Totals, LATENCY_BOUNDS_US};
use crate::errors::ErrorKind;

mod schema;
use schema::{cfg_err, read_config, read_reloadable};

/// A dict is not a configuration: say what is.
fn config_of<'a, 'py>(config: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyAny>> {
    if config.is_instance_of::<PyDict>() {
        return Err(PyTypeError::new_err(
            "rustext.Balancer takes a balancer.config.BalancerConfig (balancer.config.from_dict builds one from a dict)",
        ));
    }
    Ok(config)
}

/// The data plane of the HTTP load balancer (see `rustext/_native.pyi`).
#[pyclass(name = "Balancer", module = "rustext")]
pub struct PyBalancer {
    config: Config,
    inner: Mutex<Option<Arc<Balancer>>>,
    closed: Mutex<bool>,
}

impl PyBalancer {
    fn running(&self) -> PyResult<Arc<Balancer>> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| ErrorKind::Balancer.err("the balancer is not running (call start())"))
    }
}

fn totals_dict<'py>(py: Python<'py>, t: &Totals) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("connections_total", t.connections_total)?;
    d.set_item("connections_active", t.connections_active)?;
    d.set_item("requests", t.requests)?;
    let r = PyDict::new(py);
    for (i, n) in t.responses.iter().enumerate() {
        r.set_item(format!("{}xx", i + 1), n)?;
    }
    d.set_item("responses", r)?;
    d.set_item("bytes_in", t.bytes_in)?;
    d.set_item("bytes_out", t.bytes_out)?;
    d.set_item("retries", t.retries)?;
    d.set_item("no_backend", t.no_backend)?;
    d.set_item("backend_errors", t.backend_errors)?;
    d.set_item("timeouts", t.timeouts)?;
    d.set_item("clients_refused", t.clients_refused)?;
    d.set_item("rate_limited", t.rate_limited)?;
    d.set_item("rate_delayed", t.rate_delayed)?;
    d.set_item("compressed", t.compressed)?;
    d.set_item("compress_bytes_in", t.compress_in)?;
    d.set_item("compress_bytes_out", t.compress_out)?;
    let bounds: Vec<f64> = LATENCY_BOUNDS_US.iter().map(|&u| u as f64 / 1e6).collect();
    d.set_item("latency_bounds", bounds)?;
    d.set_item("latency_buckets", t.latency.to_vec())?;
    d.set_item("latency_sum", t.latency_sum_us as f64 / 1e6)?;
    d.set_item("proxy_refused", t.proxy_refused)?;
    Ok(d)
}

#[pymethods]
impl PyBalancer {
    /// Check `config` (a `balancer.config.BalancerConfig`) without starting.
    #[new]
    fn new(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<Self> {
        let config = read_config(config_of(config)?)?;
        // Validation resolves backend names, which may block: without the GIL.
        py.detach(|| config.validate()).map_err(cfg_err)?;
        Ok(PyBalancer {
            config,
            inner: Mutex::new(None),
            closed: Mutex::new(false),
        })
    }

    /// Bind the listeners and start the worker threads; returns (host, port).
    /// `inherited`: listening sockets handed over by the process this one
    /// replaces, by listener key (see `listener_sockets`); those listeners
    /// accept on copies of them instead of binding. The descriptors stay the
    /// caller's (close them after).
    #[pyo3(signature = (inherited = None))]
    fn start(&self, py: Python<'_>, inherited: Option<std::collections::HashMap<String, Vec<i32>>>) -> PyResult<(String, u16)> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.is_some() || *self.closed.lock().unwrap_or_else(|e| e.into_inner()) {
            return Err(ErrorKind::Balancer.err("start() may be called once"));
        }
        let cfg = self.config.clone();
        let inherited = inherited.unwrap_or_default();
        let b = py
            .detach(|| Balancer::start(cfg, &inherited))
            .map_err(|e| ErrorKind::Balancer.err(e))?;
        let a = b.local_addr();
        *inner = Some(Arc::new(b));
        Ok((a.ip().to_string(), a.port()))
    }

    /// Every listener's sockets for a process that takes them over: a list
    /// of (key, tls, descriptors), the descriptors new copies that the caller
    /// owns (and closes). Empty before start() and once draining.
    fn listener_sockets(&self) -> PyResult<Vec<(String, bool, Vec<i32>)>> {
        use std::os::fd::IntoRawFd;
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(b) = inner.as_ref() else { return Ok(Vec::new()) };
        let socks = b.listener_sockets().map_err(|e| ErrorKind::Balancer.err(format!("cannot copy a listener: {e}")))?;
        Ok(socks
            .into_iter()
            .map(|(k, tls, fds)| (k, tls, fds.into_iter().map(IntoRawFd::into_raw_fd).collect()))
            .collect())
    }

    /// The listeners were handed over to another process: their Unix socket
    /// files stay when this one stops.
    fn handed_over(&self) {
        if let Some(b) = self.inner.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            b.handed_over();
        }
    }

    /// (host, port) of the listener, or None before start().
    #[getter]
    fn address(&self) -> Option<(String, u16)> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .as_ref()
            .map(|b| (b.local_addr().ip().to_string(), b.local_addr().port()))
    }

    /// (host, port) of every listener, the first as `address`; empty before
    /// start(). A Unix socket listener is ("unix:/path", 0).
    #[getter]
    fn addresses(&self) -> Vec<(String, u16)> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.as_ref().map_or_else(Vec::new, |b| {
            b.local_addrs()
                .iter()
                .zip(b.frontends())
                .map(|(a, f)| if f.starts_with("unix:") { (f.clone(), 0) } else { (a.ip().to_string(), a.port()) })
                .collect()
        })
    }

    /// (host, port) of the HTTP-to-HTTPS redirect listener, or None.
    #[getter]
    fn redirect_address(&self) -> Option<(String, u16)> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .as_ref()
            .and_then(|b| b.redirect_addr())
            .map(|a| (a.ip().to_string(), a.port()))
    }

    /// Whether the listener terminates TLS.
    #[getter]
    fn tls(&self) -> bool {
        self.config.tls.is_some()
    }

    /// Read the certificate files again (SIGHUP): new handshakes get the new
    /// certificates, established connections keep theirs. Raises
    /// BalancerConfigError naming the file, keeping the current ones.
    fn reload_tls(&self) -> PyResult<()> {
        let b = self.running()?;
        b.reload_tls().map_err(cfg_err)
    }

    /// Staple `response` (a DER OCSP response) to the served certificate
    /// whose leaf is `certificate` (DER); None removes it. New handshakes get
    /// it, connections are not touched. False when no served certificate is
    /// that one.
    #[pyo3(signature = (certificate, response))]
    fn set_ocsp_staple(&self, certificate: &[u8], response: Option<Vec<u8>>) -> PyResult<bool> {
        match &self.config.tls {
            Some(tls) => Ok(tls.certs.set_ocsp(certificate, response)),
            None => Err(ErrorKind::Balancer.err("this balancer does not serve TLS")),
        }
    }

    /// The staple served with the certificate whose leaf is `certificate` (DER).
    fn ocsp_staple(&self, certificate: &[u8]) -> Option<Vec<u8>> {
        self.config.tls.as_ref().and_then(|tls| tls.certs.ocsp(certificate))
    }

    /// Answer the ACME HTTP-01 challenge `token` with `key_authorization`
    /// on the plain-HTTP listeners (before routing) until removed.
    fn acme_http01_set(&self, token: &str, key_authorization: &str) -> PyResult<()> {
        self.running()?.acme_http01().set(token, key_authorization);
        Ok(())
    }

    /// Stop answering the HTTP-01 challenge `token`.
    fn acme_http01_remove(&self, token: &str) -> PyResult<()> {
        self.running()?.acme_http01().remove(token);
        Ok(())
    }

    /// Serve `cert_pem`/`key_pem` to TLS-ALPN-01 validations (`acme-tls/1`
    /// handshakes) for host `name` until removed. Raises BalancerConfigError
    /// for unusable PEM or without TLS on the listener.
    fn acme_tls_alpn_set(&self, name: &str, cert_pem: &[u8], key_pem: &[u8]) -> PyResult<()> {
        let tls = self.config.tls.as_ref().ok_or_else(|| cfg_err("this balancer does not serve TLS".to_string()))?;
        tls.certs.acme.set(name, cert_pem, key_pem).map_err(cfg_err)
    }

    /// Stop answering TLS-ALPN-01 validations for `name`.
    fn acme_tls_alpn_remove(&self, name: &str) {
        if let Some(tls) = &self.config.tls {
            tls.certs.acme.remove(name);
        }
    }

    #[getter]
    fn workers(&self) -> usize {
        self.config.workers
    }

    /// True between start() and drain()/close().
    #[getter]
    fn is_running(&self) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.as_ref().is_some_and(|b| b.running())
    }

    /// Replace listeners, pools, routes, policies and access logs at run time
    /// without dropping connections, from a `balancer.config.BalancerConfig`.
    /// What is fixed at start (workers, header/idle timeouts, pool sizes,
    /// TLS) is not read again. On error the running configuration is kept.
    fn update(&self, py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<()> {
        let b = self.running()?;
        let mut r = read_reloadable(config_of(config)?)?;
        // The identity headers the running TLS adds stay removed from clients'
        // requests even if the new file names others (those need a restart).
        if let Some(tls) = &self.config.tls {
            let names: Vec<_> = tls.cert_headers.names().map(|n| RuleSpec::Delete(n.as_str().to_owned())).collect();
            for l in &mut r.routing.listeners {
                l.rules.request.extend(names.iter().cloned());
            }
        }
        // new log destinations are opened first: one that cannot be changes nothing
        let prepared = b.prepare_access_log(r.access_log.as_ref(), &r.listener_logs).map_err(cfg_err)?;
        // Resolving new backend names may block: not with the GIL held.
        let (addrs, routing) = (r.addrs, r.routing);
        py.detach(|| b.update_listeners(addrs, routing)).map_err(cfg_err)?;
        // new formats and destinations apply from here; the files are reopened (logrotate)
        b.commit_access_log(prepared, r.access_log.as_ref(), &r.listener_logs);
        Ok(())
    }

    /// Reopen the access log file (after logrotate moved it); no-op without one.
    fn reopen_access_log(&self) -> PyResult<()> {
        self.running()?.reopen_access_log(None).map_err(cfg_err)
    }

    /// Check an access log format; raises ValueError naming what is wrong.
    #[staticmethod]
    fn check_log_format(format: &str) -> PyResult<()> {
        crate::balancer::accesslog::compile(format)
            .map(|_| ())
            .map_err(pyo3::exceptions::PyValueError::new_err)
    }

    /// Check a route's regular expression (and a replacement's groups, when
    /// given) as the routing table compiles them; raises ValueError naming
    /// what is wrong.
    #[staticmethod]
    #[pyo3(signature = (pattern, replacement = None))]
    fn check_regex(pattern: &str, replacement: Option<&str>) -> PyResult<()> {
        use crate::balancer::route::{PathRewrite, Rewrite, RewriteSpec};
        let checked = match replacement {
            None => crate::balancer::route::rewrite::compile(pattern, false).map(|_| ()),
            Some(r) => Rewrite::new(&RewriteSpec {
                path: PathRewrite::Replace { regex: pattern.into(), replacement: r.into() },
                ..Default::default()
            })
            .map(|_| ()),
        };
        checked.map_err(pyo3::exceptions::PyValueError::new_err)
    }

    /// Admin state of a backend: "up", "drain" (no new requests) or "down".
    fn set_backend_state(&self, name: &str, state: &str) -> PyResult<()> {
        self.running()?
            .set_backend_state(name, state)
            .map_err(|e| ErrorKind::Balancer.err(e))
    }

    /// Health from active checks; an unhealthy backend gets no requests.
    /// `pool`: only in that backend pool (default: every pool listing it).
    #[pyo3(signature = (name, healthy, pool = None))]
    fn set_backend_health(&self, name: &str, healthy: bool, pool: Option<&str>) -> PyResult<()> {
        self.running()?
            .set_backend_health(name, healthy, pool)
            .map_err(|e| ErrorKind::Balancer.err(e))
    }

    /// Whether the backend is out after passive failures (ejected, or
    /// marked down until a health check brings it back), in `pool` or in
    /// any pool listing it.
    #[pyo3(signature = (name, pool = None))]
    fn backend_ejected(&self, name: &str, pool: Option<&str>) -> PyResult<bool> {
        self.running()?
            .backend_ejected(name, pool)
            .map_err(|e| ErrorKind::Balancer.err(e))
    }

    fn set_backend_weight(&self, py: Python<'_>, name: &str, weight: u32) -> PyResult<()> {
        let b = self.running()?;
        py.detach(|| b.set_backend_weight(name, weight))
            .map_err(|e| ErrorKind::Balancer.err(e))
    }

    /// One dict per backend: name, weight, state, active, requests, failures,
    /// ejections, responses (by class), bytes_out.
    fn backends<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let b = self.running()?;
        let out = PyList::empty(py);
        for info in b.backends() {
            let d = PyDict::new(py);
            d.set_item("pool", info.pool)?;
            d.set_item("name", info.name)?;
            d.set_item("weight", info.weight)?;
            d.set_item("state", info.state)?;
            d.set_item("active", info.active)?;
            d.set_item("requests", info.requests)?;
            d.set_item("failures", info.failures)?;
            d.set_item("ejections", info.ejections)?;
            let r = PyDict::new(py);
            for (i, n) in info.responses.iter().enumerate() {
                r.set_item(format!("{}xx", i + 1), n)?;
            }
            d.set_item("responses", r)?;
            d.set_item("bytes_out", info.bytes_out)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Totals over all workers, plus "workers": the same per worker and
    /// "backends": as backends().
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let b = self.running()?;
        let d = totals_dict(py, &b.totals())?;
        let per = PyList::empty(py);
        for t in b.per_worker() {
            per.append(totals_dict(py, &t)?)?;
        }
        d.set_item("workers", per)?;
        d.set_item("backends", self.backends(py)?)?;
        let routing = b.routing();
        let first = &routing.pools[0].settings;
        d.set_item("algorithm", first.algorithm.name())?;
        let (written, dropped) = b.access_log_counts();
        d.set_item("access_log_lines", written)?;
        d.set_item("access_log_dropped", dropped)?;
        d.set_item("hash_key", first.hash_key.describe())?;
        Ok(d)
    }

    /// Stop accepting, finish in-flight exchanges within `timeout` seconds,
    /// then stop the workers. Blocks without the GIL; idempotent.
    #[pyo3(signature = (timeout = 30.0))]
    fn drain(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        if !timeout.is_finite() || timeout < 0.0 {
            return Err(cfg_err("timeout must be a non-negative number of seconds"));
        }
        *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = true;
        let b = self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(b) = b {
            py.detach(|| b.drain(Duration::from_secs_f64(timeout.min(86_400.0))));
        }
        Ok(())
    }

    /// Stop now (in-flight exchanges are cut). Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.drain(py, 0.0)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBalancer>()
}
