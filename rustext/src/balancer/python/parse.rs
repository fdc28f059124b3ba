//! The balancer's configuration read from the dicts Python passes (built
//! from `balancer.config`'s dataclasses) and checked again: a bad value
//! raises `BalancerConfigError` and leaves a running balancer untouched.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::super::config::{Algorithm, BackendSpec, Config, HashKey, ListenAddr, ListenTls, Proto, Settings};
use super::super::route::{
    HeaderTest, HstsSpec, ListenerSpec, PoolSpec, RedirectSpec, RouteSpec, RoutingSpec, RuleSpec, RulesSpec,
};
use crate::tls::{client_config, server_config, CertPair, CertResolver, ServerTrust};
use crate::errors::ErrorKind;

const SETTINGS_KEYS: [&str; 18] = [
    "pools",
    "listeners",
    "backends",
    "algorithm",
    "hash_key",
    "connect_timeout",
    "response_timeout",
    "total_timeout",
    "retries",
    "eject_after",
    "eject_cooldown",
    "eject_until_checked",
    "max_connections",
    "queue_timeout",
    "listen",
    "proto",
    "h2_max_streams",
    "h2_connections",
];
const FIXED_KEYS: [&str; 16] = [
    "access_log",
    "listener_logs",
    "max_client_connections",
    "max_open_connections",
    "workers",
    "header_timeout",
    "idle_timeout",
    "max_header_bytes",
    "pool_max_idle",
    "pool_idle_timeout",
    "tls_certificates",
    "tls_client_ca",
    "http_redirect",
    "backend_tls",
    "backend_ca",
    "backend_tls_insecure",
];

/// Reloadable keys of the request policies (rate limit).
const POLICY_KEYS: &[&str] = &["rate_limit", "policy", "error_pages"];

/// `error_pages`: [{"status", "headers": [(name, value)], "body": bytes}].
pub(super) fn parse_error_pages(d: &Bound<'_, PyDict>) -> PyResult<Vec<Arc<crate::balancer::route::ErrorPage>>> {
    let Some(v) = d.get_item("error_pages")?.filter(|v| !v.is_none()) else { return Ok(Vec::new()) };
    let mut pages = Vec::new();
    for item in v.try_iter().map_err(|_| cfg_err("error_pages must be a list"))? {
        let p = page(&dict(&item?, "an error page")?)?;
        if pages.iter().any(|x: &Arc<crate::balancer::route::ErrorPage>| x.status == p.status) {
            return Err(cfg_err(format!("error_pages: two pages for {}", p.status)));
        }
        pages.push(Arc::new(p));
    }
    Ok(pages)
}

/// An answer of the balancer's own: {"status", "headers": [(name, value)], "body": bytes}.
fn page(p: &Bound<'_, PyDict>) -> PyResult<crate::balancer::route::ErrorPage> {
    let status: u16 = int(p, "status", 0u16)?;
    let headers: Vec<(String, String)> = match p.get_item("headers")? {
        Some(h) if !h.is_none() => h.extract().map_err(|_| cfg_err("headers is a list of (name, value) pairs"))?,
        _ => Vec::new(),
    };
    let body: Vec<u8> = match p.get_item("body")? {
        Some(b) if !b.is_none() => b.extract().map_err(|_| cfg_err("body must be bytes"))?,
        _ => Vec::new(),
    };
    crate::balancer::route::ErrorPage::new(status, headers, body).map_err(cfg_err)
}

/// `rate_limit`: {"count", "period" (seconds), "burst", "key", "missing"
/// ("src" or "allow"), "max_keys", "status", "delay" (None: nodelay)} or None.
pub(super) fn parse_rate_limit(d: &Bound<'_, PyDict>) -> PyResult<Option<crate::balancer::ratelimit::Spec>> {
    let Some(v) = d.get_item("rate_limit")?.filter(|v| !v.is_none()) else { return Ok(None) };
    let r = dict(&v, "rate_limit")?;
    let key = string(&r, "key")?.unwrap_or_else(|| "src".into());
    let missing = string(&r, "missing")?.unwrap_or_else(|| "src".into());
    let spec = crate::balancer::ratelimit::Spec {
        count: int(&r, "count", 0u64)?,
        period: secs(&r, "period", Duration::from_secs(1))?,
        burst: int(&r, "burst", 0u64)?,
        key: crate::balancer::ratelimit::LimitKey::parse(&key).map_err(cfg_err)?,
        missing_allow: match missing.as_str() {
            "src" => false,
            "allow" => true,
            other => return Err(cfg_err(format!("rate_limit.missing must be src or allow, got {other:?}"))),
        },
        max_keys: int(&r, "max_keys", 100_000usize)?,
        status: int(&r, "status", 429u16)?,
        delay: match r.get_item("delay")? {
            Some(v) if !v.is_none() => Some(v.extract().map_err(|_| cfg_err("rate_limit.delay must be an integer >= 0"))?),
            _ => None,
        },
    };
    spec.validate().map_err(cfg_err)?;
    Ok(Some(spec))
}

/// `tls_certificates`: a list of `(cert, key)` PEM file pairs (the first is
/// the default); `tls_client_ca`: require client certificates.
fn parse_listen_tls(d: &Bound<'_, PyDict>) -> PyResult<Option<ListenTls>> {
    let Some(items) = d.get_item("tls_certificates")? else { return Ok(None) };
    if items.is_none() {
        return Ok(None);
    }
    let mut pairs = Vec::new();
    for item in items.try_iter()? {
        let (cert, key): (String, String) = item?
            .extract()
            .map_err(|_| cfg_err("tls_certificates is a list of (certificate file, key file) pairs"))?;
        pairs.push(CertPair::new(cert, key));
    }
    if pairs.is_empty() {
        return Ok(None);
    }
    let certs = Arc::new(CertResolver::new(pairs).map_err(|e| cfg_err(e.to_string()))?);
    let ca = string(d, "tls_client_ca")?;
    let config = server_config(certs.clone(), &[b"h2", b"http/1.1"], ca.as_deref().map(std::path::Path::new))
        .map_err(|e| cfg_err(e.to_string()))?;
    Ok(Some(ListenTls { certs, config: Arc::new(config) }))
}

fn parse_backend_tls(d: &Bound<'_, PyDict>) -> PyResult<Option<Arc<rustls::ClientConfig>>> {
    let on = flag(d, "", "backend_tls", false)?;
    let ca = string(d, "backend_ca")?;
    let insecure = flag(d, "", "backend_tls_insecure", false)?;
    if !on {
        if ca.is_some() || insecure {
            return Err(cfg_err("backend_ca and backend_tls_insecure need backend_tls"));
        }
        return Ok(None);
    }
    let trust = match (insecure, ca) {
        (true, _) => ServerTrust::Insecure,
        (false, Some(ca)) => ServerTrust::CaFile(ca.into()),
        (false, None) => ServerTrust::System,
    };
    let config = client_config(&trust, None, &[b"http/1.1"]).map_err(|e| cfg_err(e.to_string()))?;
    Ok(Some(Arc::new(config)))
}

pub(super) fn cfg_err(msg: impl Into<String>) -> PyErr {
    ErrorKind::BalancerConfig.err(msg)
}

fn secs(d: &Bound<'_, PyDict>, key: &str, default: Duration) -> PyResult<Duration> {
    match d.get_item(key)? {
        None => Ok(default),
        Some(v) if v.is_none() => Ok(Duration::ZERO),
        Some(v) => {
            let f: f64 = v
                .extract()
                .map_err(|_| cfg_err(format!("{key} must be a number of seconds")))?;
            if !f.is_finite() || !(0.0..=86_400.0 * 365.0).contains(&f) {
                return Err(cfg_err(format!(
                    "{key} must be between 0 and one year, got {f}"
                )));
            }
            Ok(Duration::from_secs_f64(f))
        }
    }
}

fn int<T: for<'a> FromPyObject<'a, 'a> + Copy>(
    d: &Bound<'_, PyDict>,
    key: &str,
    default: T,
) -> PyResult<T> {
    match d.get_item(key)? {
        None => Ok(default),
        Some(v) => v
            .extract::<T>()
            .map_err(|_| cfg_err(format!("{key} must be a non-negative integer in range"))),
    }
}

fn string(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Option<String>> {
    match d.get_item(key)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => Ok(Some(
            v.extract()
                .map_err(|_| cfg_err(format!("{key} must be a string")))?,
        )),
    }
}

/// `send_proxy`: "v1", "v2", or none/"none"/false (off).
fn parse_send_proxy(v: &Bound<'_, PyAny>) -> PyResult<Option<super::super::proxyproto::Version>> {
    if v.is_none() || v.extract::<bool>().is_ok_and(|b| !b) {
        return Ok(None);
    }
    let s: String = v.extract().map_err(|_| cfg_err("send_proxy must be \"v1\", \"v2\" or \"none\""))?;
    if s == "none" {
        return Ok(None);
    }
    super::super::proxyproto::Version::parse(&s).map(Some).map_err(cfg_err)
}

pub(super) fn parse_settings(d: &Bound<'_, PyDict>) -> PyResult<Settings> {
    let def = Settings::default();
    let mut backends = Vec::new();
    let mut send_proxy_servers = Vec::new();
    if let Some(list) = d.get_item("backends")? {
        for item in list
            .try_iter()
            .map_err(|_| cfg_err("backends must be a list"))?
        {
            let item = item?;
            let spec = if let Ok(name) = item.extract::<String>() {
                BackendSpec {
                    name,
                    weight: 1,
                    max_connections: 0,
                }
            } else if let Ok(b) = item.cast::<PyDict>() {
                let name =
                    string(b, "address")?.ok_or_else(|| cfg_err("a backend needs an address"))?;
                if let Some(v) = b.get_item("send_proxy")? {
                    send_proxy_servers.push((name.clone(), parse_send_proxy(&v)?));
                }
                BackendSpec {
                    name,
                    weight: int(b, "weight", 1u32)?,
                    max_connections: int(b, "max_connections", 0usize)?,
                }
            } else {
                return Err(cfg_err(
                    "a backend is \"host:port\" or {\"address\": ..., \"weight\": ...}",
                ));
            };
            backends.push(spec);
        }
    }
    let algorithm = match string(d, "algorithm")? {
        Some(a) => Algorithm::parse(&a).map_err(cfg_err)?,
        None => def.algorithm,
    };
    let hash_key = match string(d, "hash_key")? {
        Some(k) => HashKey::parse(&k).map_err(cfg_err)?,
        None => def.hash_key,
    };
    let s = Settings {
        backends,
        algorithm,
        hash_key,
        connect_timeout: secs(d, "connect_timeout", def.connect_timeout)?,
        response_timeout: secs(d, "response_timeout", def.response_timeout)?,
        total_timeout: secs(d, "total_timeout", def.total_timeout)?,
        retries: int(d, "retries", def.retries)?,
        eject_after: int(d, "eject_after", def.eject_after)?,
        eject_cooldown: secs(d, "eject_cooldown", def.eject_cooldown)?,
        eject_until_checked: flag(d, "", "eject_until_checked", false)?,
        max_connections: int(d, "max_connections", def.max_connections)?,
        queue_timeout: secs(d, "queue_timeout", def.queue_timeout)?,
        send_proxy: match d.get_item("send_proxy")? {
            Some(v) => parse_send_proxy(&v)?,
            None => None,
        },
        send_proxy_servers,
        tunnel_timeout: secs(d, "tunnel_timeout", def.tunnel_timeout)?,
        policy: parse_policy(d)?,
        proto: match string(d, "proto")? {
            Some(p) => Proto::parse(&p).map_err(cfg_err)?,
            None => def.proto,
        },
        h2: super::super::config::H2Limits {
            streams: int(d, "h2_max_streams", def.h2.streams)?,
            connections: int(d, "h2_connections", def.h2.connections)?,
        },
    };
    if !(1..=1000).contains(&s.h2.streams) || !(1..=64).contains(&s.h2.connections) {
        return Err(cfg_err("h2_max_streams must be in 1..=1000 and h2_connections in 1..=64"));
    }
    Ok(s)
}

/// `policy`: {"backups": [name], "all_backups", "slow_start": {name: secs},
/// "retry_statuses": [int], "retry_timeout", "error_statuses": [int],
/// "sticky": {"name", "values": {server: value}, "indirect", "nocache",
/// "httponly", "secure", "max_age", "domain", "path"}}; absent: none.
fn parse_policy(d: &Bound<'_, PyDict>) -> PyResult<crate::balancer::policy::PolicySpec> {
    use crate::balancer::policy::{PolicySpec, StickySpec};
    let Some(v) = d.get_item("policy")?.filter(|v| !v.is_none()) else { return Ok(PolicySpec::default()) };
    let p = dict(&v, "policy")?;
    let statuses = |k: &str| -> PyResult<Vec<u16>> {
        match p.get_item(k)? {
            Some(v) if !v.is_none() => v.extract().map_err(|_| cfg_err(format!("{k} must be a list of statuses"))),
            _ => Ok(Vec::new()),
        }
    };
    let slow_start = match p.get_item("slow_start")? {
        Some(v) if !v.is_none() => {
            let m: std::collections::HashMap<String, f64> =
                v.extract().map_err(|_| cfg_err("slow_start must map servers to seconds"))?;
            m.into_iter()
                .filter(|(_, s)| s.is_finite() && *s > 0.0)
                .map(|(n, s)| (n, Duration::from_secs_f64(s.min(86_400.0))))
                .collect()
        }
        _ => Vec::new(),
    };
    let sticky = match p.get_item("sticky")? {
        Some(v) if !v.is_none() => {
            let c = dict(&v, "sticky")?;
            let values = match c.get_item("values")? {
                Some(v) if !v.is_none() => {
                    let m: std::collections::HashMap<String, String> =
                        v.extract().map_err(|_| cfg_err("sticky values must map servers to cookie values"))?;
                    m.into_iter().collect()
                }
                _ => Vec::new(),
            };
            Some(StickySpec {
                name: string(&c, "name")?.unwrap_or_else(|| "SERVERID".into()),
                values,
                indirect: flag(&c, "sticky.", "indirect", true)?,
                nocache: flag(&c, "sticky.", "nocache", true)?,
                httponly: flag(&c, "sticky.", "httponly", true)?,
                secure: flag(&c, "sticky.", "secure", false)?,
                max_age: match c.get_item("max_age")? {
                    Some(v) if !v.is_none() => Some(v.extract().map_err(|_| cfg_err("sticky max_age must be seconds"))?),
                    _ => None,
                },
                domain: string(&c, "domain")?,
                path: string(&c, "path")?.unwrap_or_else(|| "/".into()),
            })
        }
        _ => None,
    };
    Ok(PolicySpec {
        backups: strings(&p, "backups")?,
        all_backups: flag(&p, "", "all_backups", false)?,
        slow_start,
        retry_statuses: statuses("retry_statuses")?,
        retry_timeout: flag(&p, "", "retry_timeout", false)?,
        error_statuses: statuses("error_statuses")?,
        sticky,
        rate_limit: parse_rate_limit(&p)?,
    })
}

/// A boolean setting (`default` when absent or None); the error names it `{table}{key}`.
fn flag(d: &Bound<'_, PyDict>, table: &str, key: &str, default: bool) -> PyResult<bool> {
    match d.get_item(key)? {
        Some(v) if !v.is_none() => v.extract::<bool>().map_err(|_| cfg_err(format!("{table}{key} must be true or false"))),
        _ => Ok(default),
    }
}

/// `host:port` (resolved); `what` names it in the error.
fn host_port(text: &str, what: &str) -> PyResult<SocketAddr> {
    text.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| cfg_err(format!("{what} {text:?} must be host:port")))
}

fn strings(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Vec<String>> {
    match d.get_item(key)? {
        None => Ok(Vec::new()),
        Some(v) if v.is_none() => Ok(Vec::new()),
        Some(v) => v
            .extract()
            .map_err(|_| cfg_err(format!("{key} must be a list of strings"))),
    }
}

fn dict<'py>(v: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyDict>> {
    v.cast::<PyDict>()
        .cloned()
        .map_err(|_| cfg_err(format!("{what} must be a dict")))
}

fn list<'py>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    match d.get_item(key)? {
        None => Ok(Vec::new()),
        Some(v) if v.is_none() => Ok(Vec::new()),
        Some(v) => v
            .try_iter()
            .map_err(|_| cfg_err(format!("{key} must be a list")))?
            .collect(),
    }
}

/// `[("set", name, value) | ("add", name, value) | ("delete", name), ...]`
fn parse_rules(d: &Bound<'_, PyDict>) -> PyResult<RulesSpec> {
    let one = |key: &str| -> PyResult<Vec<RuleSpec>> {
        let mut out = Vec::new();
        for item in list(d, key)? {
            let parts: Vec<String> = item
                .extract()
                .map_err(|_| cfg_err(format!("{key}: a rule is (\"set\"|\"add\", name, value) or (\"delete\", name)")))?;
            out.push(match parts.as_slice() {
                [op, n, v] if op == "set" => RuleSpec::Set(n.clone(), v.clone()),
                [op, n, v] if op == "add" => RuleSpec::Add(n.clone(), v.clone()),
                [op, n] if op == "delete" => RuleSpec::Delete(n.clone()),
                _ => return Err(cfg_err(format!("{key}: unknown rule {parts:?}"))),
            });
        }
        Ok(out)
    };
    Ok(RulesSpec {
        request: one("request_headers")?,
        response: one("response_headers")?,
    })
}

fn parse_route(d: &Bound<'_, PyDict>) -> PyResult<RouteSpec> {
    let mut headers = Vec::new();
    for item in list(d, "header")? {
        let parts: Vec<String> = item
            .extract()
            .map_err(|_| cfg_err("header: a condition is (name, \"present\"|\"equals\"|\"prefix\", value)"))?;
        headers.push(match parts.as_slice() {
            [n, t] if t == "present" => (n.clone(), HeaderTest::Present),
            [n, t, _] if t == "present" => (n.clone(), HeaderTest::Present),
            [n, t, v] if t == "equals" => (n.clone(), HeaderTest::Equals(v.clone())),
            [n, t, v] if t == "prefix" => (n.clone(), HeaderTest::Prefix(v.clone())),
            _ => return Err(cfg_err(format!("header: unknown condition {parts:?}"))),
        });
    }
    let redirect = match d.get_item("redirect")? {
        Some(r) if !r.is_none() => {
            let r = dict(&r, "redirect")?;
            let code = int(&r, "code", 302u16)?;
            match (string(&r, "location")?, string(&r, "scheme")?) {
                (Some(location), None) => Some(RedirectSpec::Location { code, location }),
                (None, Some(s)) if s == "https" => Some(RedirectSpec::Https {
                    code,
                    port: match r.get_item("port")? {
                        Some(p) if !p.is_none() => Some(p.extract().map_err(|_| cfg_err("redirect.port must be a port number"))?),
                        _ => None,
                    },
                }),
                _ => return Err(cfg_err("redirect needs location = \"...\" or scheme = \"https\"")),
            }
        }
        _ => None,
    };
    Ok(RouteSpec {
        hosts: strings(d, "host")?,
        paths: strings(d, "path")?,
        path_prefixes: strings(d, "path_prefix")?,
        methods: strings(d, "method")?,
        headers,
        backend: match d.get_item("backend")? {
            Some(v) if !v.is_none() => Some(v.extract().map_err(|_| cfg_err("backend must be a string"))?),
            _ => None,
        },
        redirect,
        respond: match d.get_item("respond")? {
            Some(r) if !r.is_none() => Some(Arc::new(page(&dict(&r, "respond")?)?)),
            _ => None,
        },
        rules: parse_rules(d)?,
        rate_limit: parse_rate_limit(d)?,
    })
}

fn parse_listener(d: &Bound<'_, PyDict>) -> PyResult<(ListenAddr, ListenerSpec)> {
    let address = string(d, "address")?.ok_or_else(|| cfg_err("a listener needs an address"))?;
    let unix = match super::super::unix::backend_path(&address) {
        Some(path) => {
            super::super::unix::check_path(&address, &path).map_err(|e| cfg_err(e.replace("backend", "listener")))?;
            let mode = match string(d, "mode")? {
                Some(m) => Some(
                    u32::from_str_radix(&m, 8)
                        .ok()
                        .filter(|&m| m <= 0o777)
                        .ok_or_else(|| cfg_err(format!("listener mode {m:?} must be octal permissions such as \"0660\"")))?,
                ),
                None => None,
            };
            Some(super::super::unix::UnixListen { path, mode })
        }
        None => None,
    };
    let addr = if unix.is_some() { SocketAddr::from(([0, 0, 0, 0], 0)) } else { host_port(&address, "listener address")? };
    let tls = flag(d, "listener ", "tls", false)?;
    let accept_proxy = flag(d, "listener ", "accept_proxy", false)?;
    let routes = list(d, "routes")?
        .iter()
        .map(|r| parse_route(&dict(r, "a route")?))
        .collect::<PyResult<Vec<_>>>()?;
    let hsts = match d.get_item("hsts")? {
        Some(h) if !h.is_none() => {
            let h = dict(&h, "hsts")?;
            Some(HstsSpec {
                max_age: int(&h, "max_age", 0u64)?,
                include_subdomains: flag(&h, "hsts.", "include_subdomains", false)?,
                preload: flag(&h, "hsts.", "preload", false)?,
            })
        }
        _ => None,
    };
    Ok((
        ListenAddr { addr, tls, accept_proxy, unix },
        ListenerSpec {
            routes,
            default_backend: string(d, "default_backend")?.filter(|s| !s.is_empty()),
            request_id: string(d, "request_id")?.filter(|s| !s.is_empty()),
            hsts,
            rules: parse_rules(d)?,
        },
    ))
}

/// `pools` and `listeners`, if given (else one pool from the top-level keys).
pub(super) fn parse_routing(d: &Bound<'_, PyDict>) -> PyResult<Option<(Vec<ListenAddr>, RoutingSpec)>> {
    let has_pools = d.get_item("pools")?.is_some_and(|v| !v.is_none());
    let has_listeners = d.get_item("listeners")?.is_some_and(|v| !v.is_none());
    if !has_pools && !has_listeners {
        return Ok(None);
    }
    let pools = if has_pools {
        let mut pools = Vec::new();
        for p in list(d, "pools")? {
            let p = dict(&p, "a pool")?;
            let name = string(&p, "name")?.ok_or_else(|| cfg_err("a pool needs a name"))?;
            pools.push(PoolSpec {
                settings: parse_settings(&p).map_err(|e| cfg_err(format!("backend {name:?}: {e}")))?,
                rules: parse_rules(&p)?,
                name,
            });
        }
        pools
    } else {
        RoutingSpec::single(parse_settings(d)?, 1).pools
    };
    let mut addrs = Vec::new();
    let mut listeners = Vec::new();
    if has_listeners {
        for l in list(d, "listeners")? {
            let (a, spec) = parse_listener(&dict(&l, "a listener")?)?;
            addrs.push(a);
            listeners.push(spec);
        }
    }
    if listeners.is_empty() {
        return Err(cfg_err("listeners must list at least one listener"));
    }
    Ok(Some((
        addrs,
        RoutingSpec { pools, listeners, rate_limit: parse_rate_limit(d)?, error_pages: parse_error_pages(d)? },
    )))
}

/// `access_log`: {"path", "format", "log_empty", "syslog": {"address", "facility", "format", "tag", "max_length",
/// "framing"}} or None.
pub(super) fn parse_access_log(d: &Bound<'_, PyDict>) -> PyResult<Option<crate::balancer::accesslog::AccessLogSpec>> {
    let Some(v) = d.get_item("access_log")?.filter(|v| !v.is_none()) else { return Ok(None) };
    access_log_spec(&dict(&v, "access_log")?, "access_log").map(Some)
}

fn access_log_spec(a: &Bound<'_, PyDict>, what: &str) -> PyResult<crate::balancer::accesslog::AccessLogSpec> {
    use crate::balancer::accesslog::{AccessLogSpec, SyslogSpec};
    let format = string(a, "format")?.unwrap_or_else(|| "haproxy".into());
    crate::balancer::accesslog::compile(&format).map_err(|e| cfg_err(format!("{what}.format: {e}")))?;
    let log_empty = match a.get_item("log_empty")? {
        Some(v) if !v.is_none() => v.extract().map_err(|_| cfg_err(format!("{what}.log_empty must be true or false")))?,
        _ => false,
    };
    let syslog = match a.get_item("syslog")?.filter(|v| !v.is_none()) {
        Some(s) => {
            let s = dict(&s, "syslog")?;
            let address = string(&s, "address")?.ok_or_else(|| cfg_err(format!("{what}.syslog needs an address")))?;
            let facility: u8 = int(&s, "facility", 16u8)?;
            if facility > 23 {
                return Err(cfg_err(format!("{what}.syslog facility must be in 0..=23")));
            }
            let rfc5424 = match string(&s, "format")?.as_deref() {
                None | Some("rfc3164") => false,
                Some("rfc5424") => true,
                Some(o) => return Err(cfg_err(format!("{what}.syslog format must be rfc3164 or rfc5424, got {o:?}"))),
            };
            let newline_framing = match string(&s, "framing")?.as_deref() {
                None | Some("octet-count") => false,
                Some("newline") => true,
                Some(o) => {
                    return Err(cfg_err(format!("{what}.syslog framing must be octet-count or newline, got {o:?}")))
                }
            };
            Some(SyslogSpec {
                address,
                facility,
                rfc5424,
                newline_framing,
                tag: string(&s, "tag")?.unwrap_or_else(|| "balancer".into()),
                max_length: int(&s, "max_length", 1024usize)?.max(64),
            })
        }
        None => None,
    };
    let path = string(a, "path")?.unwrap_or_default();
    if path.is_empty() && syslog.is_none() {
        return Err(cfg_err(format!("{what} needs a path or a syslog address")));
    }
    Ok(AccessLogSpec { path, format, syslog, log_empty })
}

/// `listener_logs`: per listener, None (the top-level log), False (none) or an access_log dict.
pub(super) fn parse_listener_logs(d: &Bound<'_, PyDict>) -> PyResult<Vec<crate::balancer::accesslog::ListenerLog>> {
    use crate::balancer::accesslog::ListenerLog;
    list(d, "listener_logs")?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            if v.is_none() {
                Ok(ListenerLog::Inherit)
            } else if let Ok(on) = v.extract::<bool>() {
                Ok(if on { ListenerLog::Inherit } else { ListenerLog::Off })
            } else {
                access_log_spec(&dict(v, "a listener's access_log")?, &format!("listeners[{i}].access_log")).map(ListenerLog::Own)
            }
        })
        .collect()
}

pub(super) fn parse_config(d: &Bound<'_, PyDict>) -> PyResult<Config> {
    for k in d.keys() {
        let k: String = k.extract()?;
        if !SETTINGS_KEYS.contains(&k.as_str())
            && !FIXED_KEYS.contains(&k.as_str())
            && !super::super::l4::CONFIG_KEYS.contains(&k.as_str())
            && !POLICY_KEYS.contains(&k.as_str())
        {
            return Err(cfg_err(format!("unknown balancer setting {k:?}")));
        }
    }
    let listen =
        string(d, "listen")?.ok_or_else(|| cfg_err("listen (\"host:port\") is required"))?;
    let addr: SocketAddr = if super::super::unix::backend_path(&listen).is_some() {
        SocketAddr::from(([0, 0, 0, 0], 0)) // a Unix socket: the listeners say which
    } else {
        host_port(&listen, "listen address")?
    };
    let mut c = Config::new(addr, parse_settings(d)?);
    c.workers = int(d, "workers", c.workers)?;
    c.header_timeout = secs(d, "header_timeout", c.header_timeout)?;
    c.idle_timeout = secs(d, "idle_timeout", c.idle_timeout)?;
    c.max_header_bytes = int(d, "max_header_bytes", c.max_header_bytes)?;
    c.pool_max_idle = int(d, "pool_max_idle", c.pool_max_idle)?;
    c.pool_idle_timeout = secs(d, "pool_idle_timeout", c.pool_idle_timeout)?;
    c.max_client_connections = int(d, "max_client_connections", c.max_client_connections)?;
    c.max_open_connections = int(d, "max_open_connections", c.max_open_connections)?;
    c.tls = parse_listen_tls(d)?;
    if let Some(r) = string(d, "http_redirect")? {
        c.redirect_listen = Some(host_port(&r, "http_redirect address")?);
    }
    c.backend_tls = parse_backend_tls(d)?;
    c.access_log = parse_access_log(d)?;
    c.listener_logs = parse_listener_logs(d)?;
    if let Some((addrs, routing)) = parse_routing(d)? {
        c.listen = addrs[0].addr;
        c.listeners = addrs;
        c.routing = Some(routing);
    } else {
        let (rate_limit, error_pages) = (parse_rate_limit(d)?, parse_error_pages(d)?);
        if rate_limit.is_some() || !error_pages.is_empty() {
            let mut r = c.routing_spec();
            r.rate_limit = rate_limit;
            r.error_pages = error_pages;
            c.routing = Some(r);
        }
    }
    Ok(c)
}
