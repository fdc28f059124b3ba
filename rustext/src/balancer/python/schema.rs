//! The balancer's configuration read from `balancer.config`'s dataclasses.
//!
//! The structs below mirror those dataclasses (each names its class) and are
//! filled by typed attribute extraction; the functions after them turn them
//! into the data plane's types (`config.rs`). Python is the one definition:
//! it holds the defaults, turns aliases into canonical names, checks values
//! and ranges (with FILE:LINE errors), and computes the views the data plane
//! needs (the listeners in force, each pool with its policy, the tunnel
//! timeout in force...). What only Rust can check (certificate files,
//! addresses resolved to sockets, what the `http` crate takes) raises
//! `BalancerConfigError`, a `ValueError`, naming the attribute.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::super::accesslog::{AccessLogSpec, ListenerLog, SyslogSpec};
use super::super::config::{
    Algorithm, BackendSpec, CertTest, ClientVerify, Config, ErrorPage as PageSpec, H2Limits, HashKey, HeaderTest, HstsSpec, ListenAddr,
    ListenTls, ListenerSpec, PolicySpec, PoolSpec, Proto, RedirectSpec, RouteSpec, RoutingSpec, RuleSpec, RulesSpec,
    Settings, StickySpec,
};
use super::super::encode::{Coding, Policy as Compress};
use super::super::proxyproto::Version;
use super::super::ratelimit::{LimitKey, Spec as RateSpec};
use crate::errors::ErrorKind;
use super::super::clientcert::CertHeaders;
use crate::tls::{client_config, server_config_verifying, CertPair, CertResolver, ServerTrust};

pub(super) fn cfg_err(msg: impl Into<String>) -> PyErr {
    ErrorKind::BalancerConfig.err(msg)
}

/// Seconds as a `Duration` (the dataclasses keep them finite, 0 to one year).
fn secs(v: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let s: f64 = v.extract()?;
    Duration::try_from_secs_f64(s).map_err(|_| PyValueError::new_err(format!("{s} is not a number of seconds")))
}

/// A mapping's `(name, value)` items in order (the `set` and `add` of header rules).
fn items(v: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    v.call_method0("items")?.try_iter()?.map(|i| i?.extract()).collect()
}

/// A name the data plane does not know: the dataclasses turn aliases into
/// canonical names and refuse the rest, so this is a bug between the two.
fn not_canonical(at: &str, value: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{at}: {value:?} is not a name the data plane knows (balancer.config should have refused or normalized it)"
    ))
}

/// `at`, under the key path `prefix` (empty: top level).
fn under(prefix: &str, at: &str) -> String {
    if prefix.is_empty() {
        at.to_string()
    } else {
        format!("{prefix}.{at}")
    }
}

// --- the dataclasses --------------------------------------------------------

mod rewrite;

/// `balancer.config.Timeouts`
#[derive(FromPyObject)]
struct Timeouts {
    #[pyo3(attribute, from_py_with = secs)]
    connect: Duration,
    #[pyo3(attribute, from_py_with = secs)]
    header: Duration,
    #[pyo3(attribute, from_py_with = secs)]
    response: Duration,
    #[pyo3(attribute, from_py_with = secs)]
    idle: Duration,
    #[pyo3(attribute, from_py_with = secs)]
    total: Duration,
    #[pyo3(attribute, from_py_with = secs)]
    queue: Duration,
    #[pyo3(attribute("tunnel_effective"), from_py_with = secs)]
    tunnel: Duration,
}

/// `balancer.config.Passive`
#[derive(FromPyObject)]
struct Passive {
    #[pyo3(attribute)]
    eject_after: u32,
    #[pyo3(attribute, from_py_with = secs)]
    cooldown: Duration,
    #[pyo3(attribute)]
    eject_until_checked: bool,
}

/// `balancer.config.Limits`
#[derive(FromPyObject)]
struct Limits {
    #[pyo3(attribute)]
    max_connections: usize,
    #[pyo3(attribute)]
    max_client_connections: usize,
    #[pyo3(attribute)]
    max_open_connections: usize,
    #[pyo3(attribute)]
    max_header_bytes: usize,
    #[pyo3(attribute)]
    pool_max_idle: usize,
    #[pyo3(attribute, from_py_with = secs)]
    pool_idle_timeout: Duration,
}

/// `balancer.config.Certificate`
#[derive(FromPyObject)]
struct Certificate {
    #[pyo3(attribute)]
    cert: String,
    #[pyo3(attribute)]
    key: String,
}

/// `balancer.config.Tls`
#[derive(FromPyObject)]
struct Tls {
    #[pyo3(attribute)]
    certificates: Vec<Certificate>,
    #[pyo3(attribute)]
    client_ca: Option<String>,
    #[pyo3(attribute)]
    client_verify: String,
    #[pyo3(attribute)]
    client_crl: Option<String>,
    #[pyo3(attribute)]
    client_cert_headers: ClientCertHeaders,
    #[pyo3(attribute)]
    redirect: Option<String>,
    #[pyo3(attribute)]
    backend: bool,
    #[pyo3(attribute)]
    backend_ca: Option<String>,
    #[pyo3(attribute)]
    backend_insecure: bool,
}

/// `balancer.config_sections.ClientCertHeaders`
#[derive(FromPyObject)]
struct ClientCertHeaders {
    #[pyo3(attribute)]
    subject: Option<String>,
    #[pyo3(attribute)]
    fingerprint: Option<String>,
    #[pyo3(attribute)]
    verified: Option<String>,
    #[pyo3(attribute)]
    serial: Option<String>,
    #[pyo3(attribute)]
    san: Option<String>,
}

/// `balancer.accesslog.AccessLog`
#[derive(FromPyObject)]
struct AccessLog {
    #[pyo3(attribute)]
    path: String,
    #[pyo3(attribute)]
    format: String,
    #[pyo3(attribute)]
    syslog: Option<String>,
    /// None without `syslog`
    #[pyo3(attribute)]
    facility_code: Option<u8>,
    #[pyo3(attribute)]
    syslog_format: String,
    #[pyo3(attribute)]
    syslog_framing: Option<String>,
    #[pyo3(attribute)]
    tag: String,
    #[pyo3(attribute)]
    max_length: usize,
    #[pyo3(attribute)]
    log_empty: bool,
}

/// A listener's `access_log`: its own, or `False` (none); None inherits.
#[derive(FromPyObject)]
enum ListenerAccessLog {
    Own(AccessLog),
    Flag(bool),
}

/// `balancer.ratelimit.RateLimit`
#[derive(FromPyObject)]
struct RateLimit {
    /// (requests, period in seconds)
    #[pyo3(attribute)]
    per_period: (u64, f64),
    #[pyo3(attribute)]
    burst: u64,
    #[pyo3(attribute)]
    key: String,
    #[pyo3(attribute)]
    missing: String,
    #[pyo3(attribute)]
    max_keys: usize,
    #[pyo3(attribute)]
    status: u16,
    #[pyo3(attribute)]
    nodelay: bool,
    #[pyo3(attribute)]
    delay: u64,
}

/// `balancer.errorpages.ErrorPage` (also what a route's `respond` answers)
#[derive(FromPyObject)]
struct ErrorPage {
    #[pyo3(attribute)]
    status: u16,
    #[pyo3(attribute)]
    headers: Vec<(String, String)>,
    #[pyo3(attribute)]
    body: Vec<u8>,
}

/// `balancer.routing.HeaderRules`
#[derive(FromPyObject)]
struct HeaderRules {
    #[pyo3(attribute, from_py_with = items)]
    set: Vec<(String, String)>,
    #[pyo3(attribute, from_py_with = items)]
    add: Vec<(String, String)>,
    #[pyo3(attribute)]
    delete: Vec<String>,
}

/// `balancer.routing.HeaderMatch`
#[derive(FromPyObject)]
struct HeaderMatch {
    #[pyo3(attribute)]
    name: String,
    #[pyo3(attribute)]
    equals: Option<String>,
    #[pyo3(attribute)]
    prefix: Option<String>,
}

/// `balancer.routing.ClientCertMatch`
#[derive(FromPyObject)]
struct ClientCertMatch {
    #[pyo3(attribute)]
    verified: bool,
    #[pyo3(attribute)]
    subject: Option<String>,
    #[pyo3(attribute)]
    subject_prefix: Option<String>,
}

/// `balancer.routing.Redirect` (`location`, or else `scheme = "https"`)
#[derive(FromPyObject)]
struct Redirect {
    #[pyo3(attribute)]
    code: u16,
    #[pyo3(attribute)]
    location: Option<String>,
    #[pyo3(attribute)]
    port: Option<u16>,
}

/// `balancer.routing.Respond`: the answer it makes
#[derive(FromPyObject)]
struct Respond {
    #[pyo3(attribute)]
    page: ErrorPage,
}

/// `balancer.routing.Route`
#[derive(FromPyObject)]
struct Route {
    #[pyo3(attribute)]
    host: Vec<String>,
    #[pyo3(attribute)]
    path: Vec<String>,
    #[pyo3(attribute)]
    path_prefix: Vec<String>,
    #[pyo3(attribute)]
    method: Vec<String>,
    #[pyo3(attribute)]
    header: Vec<HeaderMatch>,
    #[pyo3(attribute)]
    client_cert: Option<ClientCertMatch>,
    #[pyo3(attribute)]
    path_regex: Option<String>,
    #[pyo3(attribute)]
    host_regex: Option<String>,
    #[pyo3(attribute)]
    rewrite: Option<rewrite::Rewrite>,
    #[pyo3(attribute)]
    backend: Option<String>,
    #[pyo3(attribute)]
    redirect: Option<Redirect>,
    #[pyo3(attribute)]
    respond: Option<Respond>,
    #[pyo3(attribute)]
    request_headers: HeaderRules,
    #[pyo3(attribute)]
    response_headers: HeaderRules,
    #[pyo3(attribute)]
    rate_limit: Option<RateLimit>,
    #[pyo3(attribute)]
    compress: Option<Compression>,
    #[pyo3(attribute("where"))]
    at: String,
}

/// `balancer.compression.Compression`
#[derive(FromPyObject)]
struct Compression {
    #[pyo3(attribute)]
    enabled: bool,
    #[pyo3(attribute)]
    algorithms: Vec<String>,
    #[pyo3(attribute)]
    gzip_level: u32,
    #[pyo3(attribute)]
    br_level: u32,
    #[pyo3(attribute)]
    zstd_level: u32,
    #[pyo3(attribute)]
    types: Vec<String>,
    #[pyo3(attribute)]
    min_length: u64,
    #[pyo3(attribute("where"))]
    at: String,
}

/// `balancer.routing.RequestId`
#[derive(FromPyObject)]
struct RequestId {
    #[pyo3(attribute)]
    header: String,
}

/// `balancer.routing.Hsts`
#[derive(FromPyObject)]
struct Hsts {
    #[pyo3(attribute)]
    max_age: u64,
    #[pyo3(attribute)]
    include_subdomains: bool,
    #[pyo3(attribute)]
    preload: bool,
}

/// `balancer.routing.Listener` (`where` is its key path; empty: the top-level `listen`)
#[derive(FromPyObject)]
struct Listener {
    #[pyo3(attribute)]
    address: String,
    #[pyo3(attribute)]
    tls: bool,
    #[pyo3(attribute)]
    routes: Vec<Route>,
    #[pyo3(attribute)]
    default_backend: Option<String>,
    #[pyo3(attribute)]
    request_id: Option<RequestId>,
    #[pyo3(attribute)]
    hsts: Option<Hsts>,
    #[pyo3(attribute)]
    request_headers: HeaderRules,
    #[pyo3(attribute)]
    response_headers: HeaderRules,
    #[pyo3(attribute)]
    accept_proxy: bool,
    #[pyo3(attribute)]
    http3: bool,
    #[pyo3(attribute)]
    mode: Option<String>,
    #[pyo3(attribute)]
    access_log: Option<ListenerAccessLog>,
    #[pyo3(attribute)]
    compress: Option<Compression>,
    #[pyo3(attribute)]
    client_verify: Option<String>,
    #[pyo3(attribute("where"))]
    at: String,
}

/// `balancer.config.BackendConfig`
#[derive(FromPyObject)]
struct Backend {
    #[pyo3(attribute)]
    address: String,
    #[pyo3(attribute)]
    weight: u32,
    #[pyo3(attribute)]
    max_connections: usize,
    #[pyo3(attribute)]
    send_proxy: Option<String>,
}

/// `balancer.policies.Sticky`
#[derive(FromPyObject)]
struct Sticky {
    #[pyo3(attribute)]
    cookie: String,
    #[pyo3(attribute)]
    indirect: bool,
    #[pyo3(attribute)]
    nocache: bool,
    #[pyo3(attribute)]
    httponly: bool,
    #[pyo3(attribute)]
    secure: bool,
    #[pyo3(attribute)]
    max_age: Option<u64>,
    #[pyo3(attribute)]
    domain: Option<String>,
    #[pyo3(attribute)]
    path: String,
}

/// `balancer.policies.Policy`: a pool's policies as Python derives them
#[derive(FromPyObject)]
struct Policy {
    #[pyo3(attribute)]
    backups: Vec<String>,
    #[pyo3(attribute)]
    all_backups: bool,
    #[pyo3(attribute)]
    slow_start: Vec<(String, f64)>,
    #[pyo3(attribute)]
    retry_statuses: Vec<u16>,
    #[pyo3(attribute)]
    retry_timeout: bool,
    #[pyo3(attribute)]
    error_statuses: Vec<u16>,
    #[pyo3(attribute)]
    sticky: Option<Sticky>,
    #[pyo3(attribute)]
    cookies: Vec<(String, String)>,
}

/// A pool's own `balancer.config.BalancerConfig` (as `BalancerConfig.pools()` makes it)
#[derive(FromPyObject)]
struct PoolConfig {
    #[pyo3(attribute)]
    backends: Vec<Backend>,
    #[pyo3(attribute)]
    algorithm: String,
    #[pyo3(attribute)]
    hash_key: String,
    #[pyo3(attribute)]
    retries: u32,
    #[pyo3(attribute)]
    timeouts: Timeouts,
    #[pyo3(attribute)]
    passive: Passive,
    #[pyo3(attribute)]
    limits: Limits,
    #[pyo3(attribute)]
    send_proxy: String,
    #[pyo3(attribute)]
    policy: Policy,
    #[pyo3(attribute)]
    proto: String,
    #[pyo3(attribute)]
    h2_max_streams: u32,
    #[pyo3(attribute)]
    h2_connections: usize,
}

/// `balancer.config.BackendPool` (`where`: its key path, empty for the top-level `[[backends]]`)
#[derive(FromPyObject)]
struct Pool {
    #[pyo3(attribute)]
    name: String,
    #[pyo3(attribute)]
    config: PoolConfig,
    #[pyo3(attribute)]
    request_headers: HeaderRules,
    #[pyo3(attribute)]
    response_headers: HeaderRules,
    #[pyo3(attribute)]
    rate_limit: Option<RateLimit>,
    #[pyo3(attribute("where"))]
    at: String,
}

/// What `balancer.config.BalancerConfig` holds for a balancer's life
#[derive(FromPyObject)]
struct Fixed {
    #[pyo3(attribute)]
    workers: usize,
    #[pyo3(attribute)]
    timeouts: Timeouts,
    #[pyo3(attribute)]
    limits: Limits,
    #[pyo3(attribute)]
    tls: Tls,
}

/// What `balancer.config.BalancerConfig` holds besides its listeners and
/// pools that a reload changes
#[derive(FromPyObject)]
struct Reloaded {
    #[pyo3(attribute)]
    access_log: Option<AccessLog>,
    #[pyo3(attribute)]
    rate_limit: Option<RateLimit>,
    #[pyo3(attribute)]
    error_pages: Vec<ErrorPage>,
    #[pyo3(attribute)]
    tls: Tls,
}

// --- into the data plane's types --------------------------------------------

/// What a reload changes: the listeners, the routing and the access logs.
pub(super) struct Reloadable {
    pub addrs: Vec<ListenAddr>,
    pub routing: RoutingSpec,
    pub access_log: Option<AccessLogSpec>,
    pub listener_logs: Vec<ListenerLog>,
}

/// The configuration a balancer starts with, from a `BalancerConfig`.
pub(super) fn read_config(cfg: &Bound<'_, PyAny>) -> PyResult<Config> {
    let r = read_reloadable(cfg)?;
    let top: Fixed = cfg.extract()?;
    Ok(Config {
        listeners: r.addrs,
        routing: r.routing,
        workers: top.workers,
        header_timeout: top.timeouts.header,
        idle_timeout: top.timeouts.idle,
        max_header_bytes: top.limits.max_header_bytes,
        pool_max_idle: top.limits.pool_max_idle,
        pool_idle_timeout: top.limits.pool_idle_timeout,
        max_client_connections: top.limits.max_client_connections,
        max_open_connections: top.limits.max_open_connections,
        tls: listen_tls(&top.tls)?,
        redirect_listen: top.tls.redirect.as_deref().map(|r| host_port(r, "tls.redirect")).transpose()?,
        backend_tls: backend_tls(&top.tls)?,
        access_log: r.access_log,
        listener_logs: r.listener_logs,
    })
}

/// The parts of a `BalancerConfig` a reload applies.
pub(super) fn read_reloadable(cfg: &Bound<'_, PyAny>) -> PyResult<Reloadable> {
    let top: Reloaded = cfg.extract()?;
    let listeners: Vec<Listener> = cfg.call_method0("effective_listeners")?.extract()?;
    let pools: Vec<Pool> = cfg.call_method0("backend_pools")?.extract()?;
    let mut addrs = Vec::with_capacity(listeners.len());
    let mut specs = Vec::with_capacity(listeners.len());
    let mut listener_logs = Vec::with_capacity(listeners.len());
    let cert_headers = cert_headers(&top.tls.client_cert_headers)?;
    for l in listeners {
        let (addr, mut spec, log) = listener(l)?;
        // a client never sends the identity headers itself (on any listener)
        spec.rules.request.extend(cert_headers.names().map(|n| RuleSpec::Delete(n.as_str().to_owned())));
        addrs.push(addr);
        specs.push(spec);
        listener_logs.push(log);
    }
    let mut error_pages: Vec<Arc<PageSpec>> = Vec::with_capacity(top.error_pages.len());
    for p in top.error_pages {
        error_pages.push(Arc::new(page(p, "error_pages")?));
    }
    Ok(Reloadable {
        addrs,
        routing: RoutingSpec {
            pools: pools.into_iter().map(pool).collect::<PyResult<_>>()?,
            listeners: specs,
            rate_limit: top.rate_limit.map(|r| rate_limit(r, "")).transpose()?,
            error_pages,
        },
        access_log: top.access_log.map(access_log).transpose()?,
        listener_logs,
    })
}

/// `host:port` resolved to a socket address; `at` names the attribute.
fn host_port(text: &str, at: &str) -> PyResult<SocketAddr> {
    text.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| cfg_err(format!("{at}: {text:?} does not resolve to an address")))
}

fn listen_tls(t: &Tls) -> PyResult<Option<ListenTls>> {
    if t.certificates.is_empty() {
        return Ok(None);
    }
    let pairs = t.certificates.iter().map(|c| CertPair::new(&c.cert, &c.key)).collect();
    let certs = Arc::new(CertResolver::new(pairs).map_err(|e| cfg_err(format!("tls.certificates: {e}")))?);
    let at = if t.client_ca.is_some() { "tls.client_ca" } else { "tls.certificates" };
    let optional = t.client_verify == "optional";
    let at = if t.client_crl.is_some() { "tls.client_ca or tls.client_crl" } else { at };
    let (ca, crl) = (t.client_ca.as_deref().map(Path::new), t.client_crl.as_deref().map(Path::new));
    let config = server_config_verifying(certs.clone(), &[b"h2", b"http/1.1", crate::tls_alpn::ACME_TLS_1], ca, optional, crl)
        .map_err(|e| cfg_err(format!("{at}: {e}")))?;
    let cert_headers = cert_headers(&t.client_cert_headers)?;
    // a listener's own client_verify: the three configurations, built once
    let by_verify = match ca {
        Some(_) => {
            let build = |ca, optional| {
                server_config_verifying(certs.clone(), &[b"h2", b"http/1.1", crate::tls_alpn::ACME_TLS_1], ca, optional, crl)
                    .map(Arc::new)
                    .map_err(|e| cfg_err(format!("{at}: {e}")))
            };
            Some([build(None, false)?, build(ca, true)?, build(ca, false)?])
        }
        None => None,
    };
    Ok(Some(ListenTls { certs, config: Arc::new(config), by_verify, cert_headers: Arc::new(cert_headers) }))
}

/// `tls.client_cert_headers` as header names.
fn cert_headers(h: &ClientCertHeaders) -> PyResult<CertHeaders> {
    let name = |v: &Option<String>, field: &str| {
        v.as_deref()
            .map(|n| {
                http::HeaderName::from_bytes(n.as_bytes())
                    .map_err(|_| cfg_err(format!("tls.client_cert_headers.{field}: invalid header name {n:?}")))
            })
            .transpose()
    };
    Ok(CertHeaders {
        subject: name(&h.subject, "subject")?,
        fingerprint: name(&h.fingerprint, "fingerprint")?,
        verified: name(&h.verified, "verified")?,
        serial: name(&h.serial, "serial")?,
        san: name(&h.san, "san")?,
    })
}

fn backend_tls(t: &Tls) -> PyResult<Option<Arc<rustls::ClientConfig>>> {
    if !t.backend {
        return Ok(None);
    }
    let trust = match (t.backend_insecure, &t.backend_ca) {
        (true, _) => ServerTrust::Insecure,
        (false, Some(ca)) => ServerTrust::CaFile(ca.into()),
        (false, None) => ServerTrust::System,
    };
    let config = client_config(&trust, None, &[b"http/1.1"]).map_err(|e| cfg_err(format!("tls.backend_ca: {e}")))?;
    Ok(Some(Arc::new(config)))
}

fn access_log(a: AccessLog) -> PyResult<AccessLogSpec> {
    let syslog = match (a.syslog, a.facility_code) {
        (Some(address), Some(facility)) => Some(SyslogSpec {
            address,
            facility,
            rfc5424: a.syslog_format == "rfc5424",
            newline_framing: a.syslog_framing.as_deref() == Some("newline"),
            tag: a.tag,
            max_length: a.max_length,
        }),
        (Some(_), None) => return Err(PyValueError::new_err("access_log.facility_code: none for a syslog log")),
        (None, _) => None,
    };
    Ok(AccessLogSpec { path: a.path, format: a.format, syslog, log_empty: a.log_empty })
}

/// A page the balancer answers with; `at` names where it is configured.
fn page(p: ErrorPage, at: &str) -> PyResult<PageSpec> {
    PageSpec::new(p.status, p.headers, p.body).map_err(|e| cfg_err(format!("{at}: {e}")))
}

/// A rate limit under the key path `prefix` (empty: the top-level `[rate_limit]`).
fn rate_limit(r: RateLimit, prefix: &str) -> PyResult<RateSpec> {
    let at = under(prefix, "rate_limit");
    let (count, period) = r.per_period;
    let spec = RateSpec {
        count,
        period: Duration::try_from_secs_f64(period).map_err(|_| cfg_err(format!("{at}.rate: bad period {period}")))?,
        burst: r.burst,
        key: LimitKey::parse(&r.key).map_err(|e| cfg_err(under(prefix, &e)))?,
        missing_allow: match r.missing.as_str() {
            "src" => false,
            "allow" => true,
            other => return Err(not_canonical(&format!("{at}.missing"), other)),
        },
        max_keys: r.max_keys,
        status: r.status,
        delay: (!r.nodelay).then_some(r.delay),
    };
    spec.validate().map_err(|e| cfg_err(under(prefix, &e)))?;
    Ok(spec)
}

fn rules(r: HeaderRules) -> Vec<RuleSpec> {
    let deletes = r.delete.into_iter().map(RuleSpec::Delete);
    let sets = r.set.into_iter().map(|(n, v)| RuleSpec::Set(n, v));
    deletes.chain(sets).chain(r.add.into_iter().map(|(n, v)| RuleSpec::Add(n, v))).collect()
}

/// A `compress` value as the data plane's policy; None: off.
fn compression(c: Option<Compression>) -> PyResult<Option<Arc<Compress>>> {
    let Some(c) = c.filter(|c| c.enabled) else { return Ok(None) };
    let mut codings = Vec::with_capacity(c.algorithms.len());
    for a in &c.algorithms {
        let coding = Coding::parse(a).ok_or_else(|| cfg_err(format!("{}.algorithms: unknown coding {a:?}", c.at)))?;
        let level = match coding {
            Coding::Gzip => c.gzip_level,
            Coding::Br => c.br_level,
            Coding::Zstd => c.zstd_level,
        };
        codings.push((coding, level));
    }
    Ok(Some(Arc::new(Compress { codings, types: c.types, min_length: c.min_length })))
}

/// A route's compression: its own, else its listener's.
fn route(r: Route, listener_compress: &Option<Arc<Compress>>) -> PyResult<RouteSpec> {
    let headers = r
        .header
        .into_iter()
        .map(|h| {
            let test = match (h.equals, h.prefix) {
                (Some(v), _) => HeaderTest::Equals(v),
                (None, Some(v)) => HeaderTest::Prefix(v),
                (None, None) => HeaderTest::Present,
            };
            (h.name, test)
        })
        .collect();
    let redirect = r.redirect.map(|d| match d.location {
        Some(location) => RedirectSpec::Location { code: d.code, location },
        None => RedirectSpec::Https { code: d.code, port: d.port },
    });
    let respond = match r.respond {
        Some(p) => Some(Arc::new(page(p.page, &format!("{}.respond", r.at))?)),
        None => None,
    };
    Ok(RouteSpec {
        hosts: r.host,
        paths: r.path,
        path_prefixes: r.path_prefix,
        methods: r.method,
        headers,
        client_cert: r.client_cert.map(|c| match (c.verified, c.subject, c.subject_prefix) {
            (false, ..) => CertTest::Absent,
            (true, Some(v), _) => CertTest::Subject(HeaderTest::Equals(v)),
            (true, None, Some(v)) => CertTest::Subject(HeaderTest::Prefix(v)),
            (true, None, None) => CertTest::Subject(HeaderTest::Present),
        }),
        path_regex: r.path_regex,
        host_regex: r.host_regex,
        rewrite: rewrite::spec(r.rewrite),
        backend: r.backend,
        redirect,
        respond,
        rules: RulesSpec { request: rules(r.request_headers), response: rules(r.response_headers) },
        rate_limit: r.rate_limit.map(|l| rate_limit(l, &r.at)).transpose()?,
        compress: match r.compress {
            Some(own) => compression(Some(own))?,
            None => listener_compress.clone(),
        },
    })
}

fn listener(l: Listener) -> PyResult<(ListenAddr, ListenerSpec, ListenerLog)> {
    let at = if l.at.is_empty() { "listen".to_string() } else { format!("{}.address", l.at) };
    let unix = match super::super::unix::backend_path(&l.address) {
        Some(path) => {
            super::super::unix::check_path(&l.address, &path).map_err(|e| cfg_err(format!("{at}: {e}")))?;
            let mode = match &l.mode {
                Some(m) => Some(u32::from_str_radix(m, 8).map_err(|_| cfg_err(format!("{at}: mode {m:?} is not octal")))?),
                None => None,
            };
            Some(super::super::unix::UnixListen { path, mode })
        }
        None => None,
    };
    let addr = if unix.is_some() { SocketAddr::from(([0, 0, 0, 0], 0)) } else { host_port(&l.address, &at)? };
    let log = match l.access_log {
        None | Some(ListenerAccessLog::Flag(true)) => ListenerLog::Inherit,
        Some(ListenerAccessLog::Flag(false)) => ListenerLog::Off,
        Some(ListenerAccessLog::Own(a)) => ListenerLog::Own(access_log(a)?),
    };
    let compress = compression(l.compress)?;
    let spec = ListenerSpec {
        routes: l.routes.into_iter().map(|r| route(r, &compress)).collect::<PyResult<_>>()?,
        default_backend: l.default_backend.filter(|s| !s.is_empty()),
        request_id: l.request_id.map(|r| r.header),
        hsts: l.hsts.map(|h| HstsSpec {
            max_age: h.max_age,
            include_subdomains: h.include_subdomains,
            preload: h.preload,
        }),
        rules: RulesSpec { request: rules(l.request_headers), response: rules(l.response_headers) },
        compress,
        client_verify: match l.client_verify.as_deref() {
            None => None,
            Some("off") => Some(ClientVerify::Off),
            Some("optional") => Some(ClientVerify::Optional),
            Some("required") => Some(ClientVerify::Required),
            Some(other) => return Err(not_canonical(&format!("{}.client_verify", l.at), other)),
        },
    };
    Ok((ListenAddr { addr, tls: l.tls, http3: l.http3, accept_proxy: l.accept_proxy, unix }, spec, log))
}

/// `send_proxy`: `"v1"`, `"v2"` or `"none"` (off).
fn send_proxy(value: &str, at: &str) -> PyResult<Option<Version>> {
    match value {
        "none" => Ok(None),
        other => Version::parse(other).map(Some).map_err(|_| not_canonical(at, other)),
    }
}

fn pool(p: Pool) -> PyResult<PoolSpec> {
    let at = |key: &str| under(&p.at, key);
    let c = p.config;
    let mut send_proxy_servers = Vec::new();
    for b in &c.backends {
        if let Some(v) = &b.send_proxy {
            send_proxy_servers.push((b.address.clone(), send_proxy(v, &format!("backend {} send_proxy", b.address))?));
        }
    }
    let settings = Settings {
        backends: c
            .backends
            .iter()
            .map(|b| BackendSpec { name: b.address.clone(), weight: b.weight, max_connections: b.max_connections })
            .collect(),
        algorithm: Algorithm::from_name(&c.algorithm).ok_or_else(|| not_canonical(&at("algorithm"), &c.algorithm))?,
        hash_key: HashKey::parse(&c.hash_key).map_err(|e| cfg_err(format!("{}: {e}", at("hash_key"))))?,
        connect_timeout: c.timeouts.connect,
        response_timeout: c.timeouts.response,
        total_timeout: c.timeouts.total,
        retries: c.retries,
        eject_after: c.passive.eject_after,
        eject_cooldown: c.passive.cooldown,
        eject_until_checked: c.passive.eject_until_checked,
        max_connections: c.limits.max_connections,
        queue_timeout: c.timeouts.queue,
        send_proxy: send_proxy(&c.send_proxy, &at("send_proxy"))?,
        send_proxy_servers,
        tunnel_timeout: c.timeouts.tunnel,
        policy: policy(c.policy, p.rate_limit.map(|r| rate_limit(r, &p.at)).transpose()?, &at("slow_start"))?,
        proto: Proto::parse(&c.proto).map_err(|_| not_canonical(&at("proto"), &c.proto))?,
        h2: H2Limits { streams: c.h2_max_streams, connections: c.h2_connections },
    };
    Ok(PoolSpec {
        name: p.name,
        settings,
        rules: RulesSpec { request: rules(p.request_headers), response: rules(p.response_headers) },
    })
}

fn policy(p: Policy, rate_limit: Option<RateSpec>, slow_at: &str) -> PyResult<PolicySpec> {
    let mut slow_start = Vec::with_capacity(p.slow_start.len());
    for (server, s) in p.slow_start {
        let d = Duration::try_from_secs_f64(s).map_err(|_| cfg_err(format!("{slow_at}: {s} is not a duration")))?;
        slow_start.push((server, d));
    }
    let values = p.cookies;
    Ok(PolicySpec {
        backups: p.backups,
        all_backups: p.all_backups,
        slow_start,
        retry_statuses: p.retry_statuses,
        retry_timeout: p.retry_timeout,
        error_statuses: p.error_statuses,
        sticky: p.sticky.map(|s| StickySpec {
            name: s.cookie,
            values,
            indirect: s.indirect,
            nocache: s.nocache,
            httponly: s.httponly,
            secure: s.secure,
            max_age: s.max_age,
            domain: s.domain,
            path: s.path,
        }),
        rate_limit,
    })
}
