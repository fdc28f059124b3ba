//! Typed configuration of the data plane, validated once before use.
//!
//! `python/schema.rs` fills these from the dataclasses of
//! `balancer/config.py`, which hold the defaults, the accepted names and the
//! checks users see; the `Default` impls here serve the unit tests only.
//! Durations of zero mean "none".

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use crate::tls::CertResolver;

/// HTTPS termination on the listener: certificates picked by SNI (the
/// resolver, reloadable), TLS 1.2 and 1.3, ALPN `h2` then `http/1.1`.
#[derive(Clone)]
pub struct ListenTls {
    pub certs: Arc<CertResolver>,
    /// As `tls.client_verify` says.
    pub config: Arc<rustls::ServerConfig>,
    /// With `tls.client_ca`: the configurations of a listener's own
    /// `client_verify`, by [`ClientVerify`] (off, optional, required).
    pub by_verify: Option<[Arc<rustls::ServerConfig>; 3]>,
    /// The request headers a verified client certificate fills in.
    pub cert_headers: Arc<super::clientcert::CertHeaders>,
}

impl ListenTls {
    /// The configuration of a listener whose `client_verify` is `v` (None: the `[tls]` one).
    pub fn config_for(&self, v: Option<ClientVerify>) -> &Arc<rustls::ServerConfig> {
        match (v, &self.by_verify) {
            (Some(v), Some(by)) => &by[v as usize],
            _ => &self.config,
        }
    }
}

/// Whether an HTTPS listener asks clients for a certificate (with `tls.client_ca`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientVerify {
    Off = 0,
    Optional = 1,
    Required = 2,
}

impl std::fmt::Debug for ListenTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListenTls { .. }")
    }
}

/// How a backend is chosen for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    RoundRobin,
    WeightedRoundRobin,
    LeastConnections,
    RandomTwo,
    ConsistentHash,
}

impl Algorithm {
    /// The algorithm of a canonical name (`balancer.config` turns aliases into those).
    pub fn from_name(s: &str) -> Option<Self> {
        Some(match s {
            "round_robin" => Algorithm::RoundRobin,
            "weighted_round_robin" => Algorithm::WeightedRoundRobin,
            "least_connections" => Algorithm::LeastConnections,
            "random_two" => Algorithm::RandomTwo,
            "consistent_hash" => Algorithm::ConsistentHash,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::RoundRobin => "round_robin",
            Algorithm::WeightedRoundRobin => "weighted_round_robin",
            Algorithm::LeastConnections => "least_connections",
            Algorithm::RandomTwo => "random_two",
            Algorithm::ConsistentHash => "consistent_hash",
        }
    }
}

/// What the consistent hash is computed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HashKey {
    ClientIp,
    Path,
    /// A request header (lower-case name); requests without it hash on the client IP.
    Header(http::HeaderName),
}

impl HashKey {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "client_ip" => Ok(HashKey::ClientIp),
            "path" => Ok(HashKey::Path),
            _ => match s.strip_prefix("header:") {
                Some(name) => http::HeaderName::from_bytes(name.trim().as_bytes())
                    .map(HashKey::Header)
                    .map_err(|_| format!("invalid header name in hash key {s:?}")),
                None => Err(format!(
                    "unknown hash key {s:?} (expected client_ip, path or header:NAME)"
                )),
            },
        }
    }

    pub fn describe(&self) -> String {
        match self {
            HashKey::ClientIp => "client_ip".into(),
            HashKey::Path => "path".into(),
            HashKey::Header(h) => format!("header:{h}"),
        }
    }
}

/// One backend server as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendSpec {
    /// `host:port` as written; the backend's identity across reloads.
    pub name: String,
    pub weight: u32,
    /// Per-backend limit of concurrent requests (0 = the pool default).
    pub max_connections: usize,
}

/// Everything that may change at run time (`update`): backends and policy.
#[derive(Clone, Debug)]
pub struct Settings {
    pub backends: Vec<BackendSpec>,
    pub algorithm: Algorithm,
    pub hash_key: HashKey,
    /// Backend connect timeout.
    pub connect_timeout: Duration,
    /// Time a backend has to send the response head.
    pub response_timeout: Duration,
    /// Whole-exchange deadline, response body included (zero = none).
    pub total_timeout: Duration,
    /// Extra attempts on other backends for idempotent body-less requests.
    pub retries: u32,
    /// Consecutive failures that eject a backend (0 = never).
    pub eject_after: u32,
    pub eject_cooldown: Duration,
    /// An ejection lasts until an active health check ends it (HAProxy's
    /// `on-error mark-down`), not `eject_cooldown`.
    pub eject_until_checked: bool,
    /// Default per-backend limit of concurrent requests (0 = unlimited).
    pub max_connections: usize,
    /// How long a request may wait for a backend slot before a 503.
    pub queue_timeout: Duration,
    /// New backend connections start with a PROXY protocol header (HAProxy's
    /// `send-proxy` / `send-proxy-v2`); None: off.
    pub send_proxy: Option<super::proxyproto::Version>,
    /// Per-server choices that override `send_proxy` (server name, choice).
    pub send_proxy_servers: Vec<(String, Option<super::proxyproto::Version>)>,
    /// Inactivity (both directions) that closes an upgraded connection
    /// (zero = none). The control plane applies HAProxy's default when unset.
    pub tunnel_timeout: Duration,
    /// Backups, slow start, retry-on, layer-7 health, persistence.
    pub policy: PolicySpec,
    /// The protocol spoken to the pool's backends.
    pub proto: Proto,
    /// With `proto = h2`: streams per connection and connections per server.
    pub h2: H2Limits,
}

/// The HTTP version spoken to a pool's backends: HTTP/1.1, or HTTP/2 (h2c
/// with prior knowledge to plain backends, ALPN `h2` over TLS), as HAProxy's
/// `server ... proto h2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    H2,
}

impl Proto {
    /// The protocol of a canonical name (`h1` or `h2`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "h1" => Ok(Proto::H1),
            "h2" => Ok(Proto::H2),
            other => Err(format!("unknown proto {other:?} (expected h1 or h2)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Proto::H1 => "h1",
            Proto::H2 => "h2",
        }
    }
}

/// One listening address, and whether it terminates TLS (with the
/// certificates of [`Config::tls`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenAddr {
    pub addr: SocketAddr,
    pub tls: bool,
    /// With `tls`: HTTP/3 over QUIC on the same port (UDP) as well.
    pub http3: bool,
    /// Connections start with a PROXY protocol header (v1 or v2), which
    /// gives the client's address (HAProxy's `accept-proxy`).
    pub accept_proxy: bool,
    /// A Unix socket instead of `addr` (`unix:/path`).
    pub unix: Option<super::unix::UnixListen>,
}

/// Fixed for the life of a running balancer (listener, threads, pools).
#[derive(Clone, Debug)]
pub struct Config {
    /// Every listener (at least one), in the configured order.
    pub listeners: Vec<ListenAddr>,
    /// The backend pools and each listener's routes (reloadable).
    pub routing: RoutingSpec,
    pub workers: usize,
    /// Client request-head read timeout (slowloris guard).
    pub header_timeout: Duration,
    /// Keep-alive client connection idle timeout.
    pub idle_timeout: Duration,
    /// Largest accepted request head (bytes, >= 8192); larger gets a 431.
    pub max_header_bytes: usize,
    /// Idle keep-alive connections kept per backend per worker.
    pub pool_max_idle: usize,
    pub pool_idle_timeout: Duration,
    /// Client connections open at once from one client address (0 = no limit).
    pub max_client_connections: usize,
    /// Client connections open at once over every listener (0 = no limit);
    /// past it the listeners stop accepting until one closes (HAProxy's maxconn).
    pub max_open_connections: usize,
    /// The certificates of the HTTPS listeners (None: plain HTTP only).
    pub tls: Option<ListenTls>,
    /// A plain-HTTP listener whose every answer is a redirect to HTTPS.
    pub redirect_listen: Option<SocketAddr>,
    /// TLS to the backends, servers verified per this configuration (None: plain).
    pub backend_tls: Option<Arc<rustls::ClientConfig>>,
    /// One line per request (None: no access log).
    pub access_log: Option<super::accesslog::AccessLogSpec>,
    /// Each listener's own access log, by index (shorter: the rest inherit `access_log`).
    pub listener_logs: Vec<super::accesslog::ListenerLog>,
}

/// The defaults of `balancer.config`, for unit tests that build settings by hand.
#[cfg(test)]
impl Default for Settings {
    fn default() -> Self {
        Settings {
            backends: Vec::new(),
            algorithm: Algorithm::RoundRobin,
            hash_key: HashKey::ClientIp,
            connect_timeout: Duration::from_secs(3),
            response_timeout: Duration::from_secs(30),
            total_timeout: Duration::ZERO,
            retries: 2,
            eject_after: 3,
            eject_cooldown: Duration::from_secs(10),
            eject_until_checked: false,
            max_connections: 0,
            queue_timeout: Duration::from_secs(5),
            send_proxy: None,
            send_proxy_servers: Vec::new(),
            tunnel_timeout: Duration::ZERO,
            policy: Default::default(),
            proto: Proto::H1,
            h2: H2Limits { streams: 100, connections: 8 },
        }
    }
}

impl Config {
    /// One plain listener at `listen` whose requests all go to one pool
    /// (`settings`), the rest as `balancer.config`'s defaults: for unit tests.
    #[cfg(test)]
    pub fn new(listen: SocketAddr, settings: Settings) -> Self {
        Config {
            listeners: vec![ListenAddr { addr: listen, tls: false, http3: false, accept_proxy: false, unix: None }],
            routing: RoutingSpec::single(settings, 1),
            workers: 1,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_header_bytes: 65536,
            pool_max_idle: 64,
            pool_idle_timeout: Duration::from_secs(60),
            max_client_connections: 0,
            max_open_connections: 0,
            tls: None,
            redirect_listen: None,
            backend_tls: None,
            access_log: None,
            listener_logs: Vec::new(),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.workers == 0 || self.workers > 1024 {
            return Err(format!("workers must be in 1..=1024, got {}", self.workers));
        }
        if self.max_header_bytes < 8192 {
            return Err(format!(
                "max_header_bytes must be >= 8192, got {}",
                self.max_header_bytes
            ));
        }
        if self.redirect_listen.is_some() && self.tls.is_none() {
            return Err("an HTTP-to-HTTPS redirect needs TLS on the listener (certificates)".into());
        }
        if self.listeners.iter().any(|l| l.tls) && self.tls.is_none() {
            return Err("a listener with tls = true needs certificates ([tls] certificates)".into());
        }
        if let Some(a) = &self.access_log {
            super::accesslog::compile(&a.format).map_err(|e| format!("access_log.format: {e}"))?;
        }
        if self.listeners.is_empty() || self.routing.listeners.len() != self.listeners.len() {
            return Err("routing: one route table per listener".into());
        }
        for p in &self.routing.pools {
            p.settings.validate().map_err(|e| format!("backend {:?}: {e}", p.name))?;
        }
        Ok(())
    }

    /// Every listener, in the configured order.
    pub fn listen_addrs(&self) -> Vec<ListenAddr> {
        self.listeners.clone()
    }

    /// The routing as configured.
    pub fn routing_spec(&self) -> RoutingSpec {
        self.routing.clone()
    }
}

impl Settings {
    /// How long passive failures eject a backend: `eject_cooldown`, or for
    /// ever (until a health check ends it) with `eject_until_checked`.
    pub fn ejection(&self) -> Duration {
        if self.eject_until_checked {
            Duration::MAX
        } else {
            self.eject_cooldown
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for b in &self.backends {
            if !seen.insert(b.name.as_str()) {
                return Err(format!("backend {} listed twice", b.name));
            }
            if b.weight > 10_000 {
                return Err(format!(
                    "backend {} weight {} is over 10000",
                    b.name, b.weight
                ));
            }
            parse_backend_addr(&b.name)?;
        }
        if self.retries > 16 {
            return Err(format!("retries must be <= 16, got {}", self.retries));
        }
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err("connect_timeout and response_timeout must be > 0".into());
        }
        Ok(())
    }
}

/// Check a `host:port` backend address (resolving names once, to fail early).
pub fn parse_backend_addr(name: &str) -> Result<SocketAddr, String> {
    if let Some(path) = super::unix::backend_path(name) {
        // a Unix socket: no IP address (see `Backend::unix`)
        super::unix::check_path(name, &path)?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], 0)));
    }
    if name.contains('/') || name.contains('@') {
        return Err(format!("backend address {name:?} must be host:port"));
    }
    name.parse::<http::uri::Authority>()
        .map_err(|_| format!("backend address {name:?} must be host:port"))?;
    match name.to_socket_addrs() {
        Ok(mut it) => it
            .next()
            .ok_or_else(|| format!("backend address {name:?} resolves to nothing")),
        Err(e) => Err(format!("backend address {name:?} is invalid: {e}")),
    }
}

/// Cookie persistence as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StickySpec {
    /// The cookie's name (`SERVERID`).
    pub name: String,
    /// Cookie values by server name; a server not listed gets one derived
    /// from its name ([`default_cookie`]).
    pub values: Vec<(String, String)>,
    /// Remove the cookie from requests before forwarding them.
    pub indirect: bool,
    /// Responses that set the cookie are marked `Cache-Control: private`.
    pub nocache: bool,
    pub httponly: bool,
    pub secure: bool,
    /// `Max-Age` in seconds (None: a session cookie).
    pub max_age: Option<u64>,
    pub domain: Option<String>,
    pub path: String,
}

/// The policies of one pool as configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicySpec {
    /// Servers (by name) used only when no other is available.
    pub backups: Vec<String>,
    /// Balance over every backup rather than the first available.
    pub all_backups: bool,
    /// Slow start period per server (by name); absent or zero: none.
    pub slow_start: Vec<(String, Duration)>,
    /// Response statuses after which a replayable request goes to another server.
    pub retry_statuses: Vec<u16>,
    /// A replayable request whose response did not come in time goes to another server.
    pub retry_timeout: bool,
    /// Response statuses counted as failures in passive health (empty: layer 4 only).
    pub error_statuses: Vec<u16>,
    pub sticky: Option<StickySpec>,
    /// A rate limit of this pool's own (after routing; the top-level one applies first).
    pub rate_limit: Option<super::ratelimit::Spec>,
}

/// How a pool uses HTTP/2 connections to each of its servers, per worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct H2Limits {
    /// Concurrent streams on a connection before another one is opened
    /// (lower when the backend says so).
    pub streams: u32,
    /// Connections per server; past them requests share the least loaded one.
    pub connections: usize,
}


// ---------------------------------------------------------------------------
// Routing as configured (validated and compiled by route::Table::new).

/// A header condition: the field is present, equals a value, or starts with one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderTest {
    Present,
    Equals(String),
    Prefix(String),
}

/// A route's condition on the connection's client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertTest {
    /// The client presented none (or the connection is not TLS).
    Absent,
    /// A verified certificate whose RFC 4514 subject passes this test.
    Subject(HeaderTest),
}

/// Where a redirect goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedirectSpec {
    /// A fixed `Location`.
    Location { code: u16, location: String },
    /// The same host and target over HTTPS (on `port` if given).
    Https { code: u16, port: Option<u16> },
}

/// One header rule: `set` replaces, `add` appends, `delete` removes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleSpec {
    Set(String, String),
    Add(String, String),
    Delete(String),
}

/// Request and response header rules of a listener, backend or route.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RulesSpec {
    pub request: Vec<RuleSpec>,
    pub response: Vec<RuleSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteSpec {
    /// Exact names and `*.suffix` wildcards (any matches).
    pub hosts: Vec<String>,
    /// Exact paths (any matches, or any prefix).
    pub paths: Vec<String>,
    pub path_prefixes: Vec<String>,
    pub methods: Vec<String>,
    /// All must hold.
    pub headers: Vec<(String, HeaderTest)>,
    /// On the verified client certificate (None: no condition).
    pub client_cert: Option<CertTest>,
    /// A regular expression the path must match (unanchored, as HAProxy's `path_reg`).
    pub path_regex: Option<String>,
    /// A regular expression the normalised host must match (case-insensitive).
    pub host_regex: Option<String>,
    /// The backend pool (by name), or
    pub backend: Option<String>,
    /// a redirect answered by the balancer, or
    pub redirect: Option<RedirectSpec>,
    /// an answer of the balancer's own (HAProxy's `http-request return` /
    /// `deny`, nginx's `return`).
    pub respond: Option<Arc<ErrorPage>>,
    pub rules: RulesSpec,
    /// The target's rewrite when forwarded.
    pub rewrite: super::route::RewriteSpec,
    /// A request rate limit of this route's own (nginx's `limit_req` in a `location`).
    pub rate_limit: Option<super::ratelimit::Spec>,
    /// Response compression of this route (the listener's when the route says nothing); None: off.
    pub compress: Option<Arc<super::encode::Policy>>,
}

impl RouteSpec {
    /// What identifies a route across reloads (its conditions): a reload
    /// keeps the rate-limit counts of a route whose conditions are the same,
    /// wherever it moved in the list.
    pub(super) fn identity(&self) -> String {
        format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
            self.hosts, self.paths, self.path_prefixes, self.methods, self.headers, self.client_cert, self.path_regex, self.host_regex
        )
    }
}

/// HSTS on an HTTPS listener's responses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HstsSpec {
    pub max_age: u64,
    pub include_subdomains: bool,
    pub preload: bool,
}

/// The reloadable part of one listener.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerSpec {
    pub routes: Vec<RouteSpec>,
    /// Requests no route takes; None: 503.
    pub default_backend: Option<String>,
    /// Request id header name: kept if valid, else generated; echoed back.
    pub request_id: Option<String>,
    pub hsts: Option<HstsSpec>,
    pub rules: RulesSpec,
    /// Response compression of requests no route takes; None: off.
    pub compress: Option<Arc<super::encode::Policy>>,
    /// Client certificates on this HTTPS listener; None: as `[tls]` says.
    pub client_verify: Option<ClientVerify>,
}

/// One backend pool.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    pub name: String,
    pub settings: Settings,
    pub rules: RulesSpec,
}

/// Everything routing: pools and the listeners' routes (reloadable).
#[derive(Clone, Debug)]
pub struct RoutingSpec {
    pub pools: Vec<PoolSpec>,
    pub listeners: Vec<ListenerSpec>,
    /// One request rate limit over every listener (None: none).
    pub rate_limit: Option<super::ratelimit::Spec>,
    /// Pages answered instead of the balancer's own short texts, by status.
    pub error_pages: Vec<Arc<ErrorPage>>,
}

/// A page the balancer answers with instead of its own one-line text for a
/// status (`[error_pages]`, HAProxy's `errorfile`): its header fields
/// (`content-type` among them; never framing or connection fields) and body.
#[derive(Debug, PartialEq, Eq)]
pub struct ErrorPage {
    pub status: u16,
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    pub body: bytes::Bytes,
}

impl ErrorPage {
    /// Checked: a status the balancer may answer, fields that do not frame
    /// the message (the balancer writes those), a body of at most 64 KiB.
    pub fn new(status: u16, headers: Vec<(String, String)>, body: Vec<u8>) -> Result<ErrorPage, String> {
        if !(200..=599).contains(&status) {
            return Err(format!("{status} is not a status the balancer answers with (200..=599)"));
        }
        if body.len() > 64 * 1024 {
            return Err(format!("the page for {status} is over 64 KiB"));
        }
        let mut fields = Vec::with_capacity(headers.len());
        for (n, v) in headers {
            let name = http::HeaderName::from_bytes(n.as_bytes())
                .map_err(|_| format!("the page for {status}: {n:?} is not a header name"))?;
            if matches!(
                name.as_str(),
                "content-length" | "transfer-encoding" | "connection" | "keep-alive" | "upgrade" | "trailer" | "te"
            ) {
                continue; // the balancer frames its answers itself
            }
            let value = http::HeaderValue::from_str(&v)
                .map_err(|_| format!("the page for {status}: the value of {n} is not a header value"))?;
            fields.push((name, value));
        }
        Ok(ErrorPage { status, headers: fields, body: body.into() })
    }
}

/// The name of the pool of a configuration without named backends.
pub const DEFAULT_POOL: &str = "default";

impl RoutingSpec {
    /// One pool named `default`, one listener sending everything to it.
    #[cfg(test)]
    pub fn single(settings: Settings, listeners: usize) -> Self {
        RoutingSpec {
            pools: vec![PoolSpec {
                name: DEFAULT_POOL.into(),
                settings,
                rules: RulesSpec::default(),
            }],
            listeners: (0..listeners.max(1))
                .map(|_| ListenerSpec {
                    default_backend: Some(DEFAULT_POOL.into()),
                    ..Default::default()
                })
                .collect(),
            rate_limit: None,
            error_pages: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names() {
        assert_eq!(
            Algorithm::from_name("least_connections"),
            Some(Algorithm::LeastConnections)
        );
        // aliases are balancer.config's business: only canonical names here
        assert_eq!(Algorithm::from_name("least_conn"), None);
        assert!(HashKey::parse("ip").is_err());
        assert!(Proto::parse("http/1.1").is_err());
        assert_eq!(HashKey::parse("path").unwrap(), HashKey::Path);
        assert!(matches!(
            HashKey::parse("header:X-User").unwrap(),
            HashKey::Header(_)
        ));
        assert!(HashKey::parse("header:bad name").is_err());
    }

    #[test]
    fn validates() {
        let mut s = Settings::default();
        s.backends.push(BackendSpec {
            name: "127.0.0.1:80".into(),
            weight: 1,
            max_connections: 0,
        });
        let mut c = Config::new("127.0.0.1:0".parse().unwrap(), s.clone());
        assert!(c.validate().is_ok());
        c.max_header_bytes = 100;
        assert!(c.validate().is_err());
        s.backends.push(s.backends[0].clone());
        assert!(s.validate().unwrap_err().contains("twice"));
        assert!(parse_backend_addr("nope").is_err());
        assert!(parse_backend_addr("127.0.0.1:99999").is_err());
    }
}
