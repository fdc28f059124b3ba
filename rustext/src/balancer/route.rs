//! Routing: which backend pool serves a request, the header rules that apply
//! to it, redirects and request ids, per listener.
//!
//! The configuration ([`RoutingSpec`]) is compiled once, at start and on
//! every reload, into a [`Table`]: an immutable snapshot swapped as one
//! `Arc` (requests in flight keep the table they started with). Evaluating
//! it allocates nothing:
//!
//! - a route is a conjunction of conditions; routes are tried in order and
//!   the first that holds wins, else the listener's default;
//! - host names are lower-cased at load; the request's host is normalised
//!   once per request into a stack buffer (lower case, port and one
//!   trailing dot removed, at most 255 bytes) and looked up in a hash set of
//!   exact names, then against a short list of `*.suffix` wildcards;
//! - paths are compared raw (no percent-decoding, as HAProxy's `path_beg`),
//!   exact names and prefixes as byte slices;
//! - header names are lower-case `HeaderName`s, compared against the parsed
//!   request's header slice (fast path) or looked up in its `HeaderMap`;
//! - path and host regular expressions ([`rewrite`]) are compiled at load
//!   and run in time linear in the input; the host's is matched against the
//!   normalised host;
//! - header rules of the listener, the backend and the route are folded at
//!   load into one list of names to delete and one of headers to add.
//!
//! Matching is generic over [`View`], implemented by both request paths.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use http::{HeaderName, HeaderValue};

use super::upstream::Upstream;

pub mod rewrite;
pub use rewrite::{PathRewrite, QueryRewrite, Rewrite, RewriteSpec};

/// Longest host name considered (RFC 1035); longer matches no host condition.
pub const MAX_HOST: usize = 255;

/// A request as routing sees it.
pub trait View {
    /// The raw `Host` (or `:authority`), if any.
    fn host(&self) -> Option<&[u8]>;
    /// The target's path, without the query.
    fn path(&self) -> &[u8];
    fn method(&self) -> &[u8];
    /// Whether some field named `name` (lower case) has a value passing `test`.
    fn header_any(&self, name: &[u8], test: &mut dyn FnMut(&[u8]) -> bool) -> bool;
    /// The RFC 4514 subject of the connection's verified client
    /// certificate; None without one (always on a connection without TLS).
    fn client_cert(&self) -> Option<&str> {
        None
    }
}

impl View for super::h1::RawHead<'_, '_> {
    fn host(&self) -> Option<&[u8]> {
        self.host
    }
    fn path(&self) -> &[u8] {
        self.path
    }
    fn method(&self) -> &[u8] {
        self.method
    }
    fn header_any(&self, name: &[u8], test: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        super::h1::RawHead::header_any(self, name, test)
    }
}

/// Lower-cased host without port or trailing dot, in `buf`; None if too long.
pub fn normalize_host<'b>(raw: &[u8], buf: &'b mut [u8; MAX_HOST]) -> Option<&'b [u8]> {
    let raw = raw.trim_ascii();
    let host = if raw.first() == Some(&b'[') {
        match raw.iter().position(|&b| b == b']') {
            Some(end) => &raw[..=end],
            None => raw,
        }
    } else {
        match raw.iter().rposition(|&b| b == b':') {
            Some(i) => &raw[..i],
            None => raw,
        }
    };
    let host = host.strip_suffix(b".").unwrap_or(host);
    if host.len() > MAX_HOST {
        return None;
    }
    let out = &mut buf[..host.len()];
    for (o, &c) in out.iter_mut().zip(host) {
        *o = c.to_ascii_lowercase();
    }
    Some(out)
}

pub use super::h1::{valid_request_id, Added, Piece, Rules};
pub use super::config::{
    CertTest, ErrorPage, HeaderTest, HstsSpec, ListenerSpec, PoolSpec, RedirectSpec, RouteSpec, RoutingSpec, RuleSpec, RulesSpec,
    DEFAULT_POOL,
};

// ---------------------------------------------------------------------------
// Compiled form.

fn compile_template(v: &str, where_: &str) -> Result<(Box<[Piece]>, Option<HeaderValue>), String> {
    let mut pieces = Vec::new();
    let mut rest = v;
    let mut lit = String::new();
    while let Some(i) = rest.find("%[") {
        lit.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after
            .find(']')
            .ok_or_else(|| format!("{where_}: unterminated %[ in {v:?}"))?;
        let piece = match &after[..end] {
            "req.id" => Piece::ReqId,
            "src" => Piece::Src,
            other => {
                return Err(format!(
                    "{where_}: unknown value %[{other}] in {v:?} (expected %[req.id] or %[src])"
                ))
            }
        };
        if !lit.is_empty() {
            pieces.push(Piece::Lit(std::mem::take(&mut lit).into_bytes().into()));
        }
        pieces.push(piece);
        rest = &after[end + 1..];
    }
    lit.push_str(rest);
    if HeaderValue::from_str(&lit).is_err() || v.contains(['\r', '\n']) {
        return Err(format!("{where_}: invalid header value {v:?}"));
    }
    let fixed = if pieces.is_empty() {
        Some(HeaderValue::from_str(&lit).map_err(|_| format!("{where_}: invalid header value {v:?}"))?)
    } else {
        None
    };
    if !lit.is_empty() {
        pieces.push(Piece::Lit(lit.into_bytes().into()));
    }
    Ok((pieces.into(), fixed))
}

fn header_name(n: &str, where_: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(n.trim().as_bytes()).map_err(|_| format!("{where_}: invalid header name {n:?}"))
}

/// Fields that belong to a connection or to the balancer's framing: rules may not touch them.
fn reserved(n: &HeaderName) -> bool {
    matches!(
        n.as_str(),
        "connection" | "keep-alive" | "transfer-encoding" | "content-length" | "te" | "trailer" | "upgrade" | "host"
    )
}

/// Fold rule lists (applied in order) into one [`Rules`].
fn fold(lists: &[(&[RuleSpec], &str)]) -> Result<Rules, String> {
    let mut delete: Vec<HeaderName> = Vec::new();
    let mut add: Vec<Added> = Vec::new();
    for (list, where_) in lists {
        for r in list.iter() {
            let (name, value) = match r {
                RuleSpec::Set(n, v) | RuleSpec::Add(n, v) => (n, Some(v)),
                RuleSpec::Delete(n) => (n, None),
            };
            let name = header_name(name, where_)?;
            if reserved(&name) {
                return Err(format!("{where_}: the {name} header is the balancer's to manage"));
            }
            if !matches!(r, RuleSpec::Add(..)) {
                add.retain(|a| a.name != name);
                if !delete.contains(&name) {
                    delete.push(name.clone());
                }
            }
            if let Some(v) = value {
                let (pieces, fixed) = compile_template(v, where_)?;
                add.push(Added { name, pieces, fixed });
            }
        }
    }
    Ok(Rules {
        delete: delete.into(),
        add: add.into(),
    })
}

/// A compiled redirect.
#[derive(Clone, Debug)]
pub enum Redirect {
    Location { code: u16, location: HeaderValue },
    Https { code: u16, port: Option<u16> },
}

impl Redirect {
    pub fn code(&self) -> u16 {
        match self {
            Redirect::Location { code, .. } | Redirect::Https { code, .. } => *code,
        }
    }

    /// Write the `Location` value for a request with this host and target.
    pub fn location(&self, out: &mut Vec<u8>, host: Option<&[u8]>, target: &[u8]) {
        match self {
            Redirect::Location { location, .. } => out.extend_from_slice(location.as_bytes()),
            Redirect::Https { port, .. } => {
                out.extend_from_slice(b"https://");
                let host = host.unwrap_or(b"");
                // the host without its port
                let bare = if host.first() == Some(&b'[') {
                    host.iter().position(|&b| b == b']').map_or(host, |e| &host[..=e])
                } else {
                    host.iter().rposition(|&b| b == b':').map_or(host, |i| &host[..i])
                };
                out.extend_from_slice(bare);
                if let Some(p) = port.filter(|&p| p != 443) {
                    out.push(b':');
                    out.extend_from_slice(p.to_string().as_bytes());
                }
                out.extend_from_slice(if target.is_empty() { b"/" } else { target });
            }
        }
    }

    pub fn reason(&self) -> &'static str {
        match self.code() {
            301 => "Moved Permanently",
            302 => "Found",
            303 => "See Other",
            307 => "Temporary Redirect",
            _ => "Permanent Redirect",
        }
    }
}

/// What a request gets once routed.
#[derive(Debug)]
pub struct Action {
    /// Index into [`Table::pools`]; None with a redirect or an answer of
    /// the route's own, or with no default backend (503).
    pub pool: Option<usize>,
    pub redirect: Option<Redirect>,
    /// The route answers this itself.
    pub respond: Option<Arc<ErrorPage>>,
    pub request: Rules,
    pub response: Rules,
    /// The route's own rate limit, checked on every request it takes.
    pub rate_limit: Option<Arc<super::ratelimit::Table>>,
    /// Response compression ([`super::encode`]); None: off.
    pub compress: Option<Arc<super::encode::Policy>>,
    /// The target's rewrite when forwarded; None: as the client sent it.
    pub rewrite: Option<Rewrite>,
}

#[derive(Debug, Default)]
struct Hosts {
    exact: HashSet<Box<[u8]>>,
    /// `.example.com` for `*.example.com`.
    suffixes: Vec<Box<[u8]>>,
}

impl Hosts {
    fn matches(&self, host: &[u8]) -> bool {
        self.exact.contains(host)
            || self
                .suffixes
                .iter()
                .any(|s| host.len() > s.len() && host.ends_with(s))
    }
}

#[derive(Debug)]
enum Test {
    Present,
    Equals(Box<[u8]>),
    Prefix(Box<[u8]>),
}

impl Test {
    fn passes(&self, v: &[u8]) -> bool {
        match self {
            Test::Present => true,
            Test::Equals(x) => v == &**x,
            Test::Prefix(x) => v.starts_with(x),
        }
    }

    fn of(t: &HeaderTest) -> Self {
        match t {
            HeaderTest::Present => Test::Present,
            HeaderTest::Equals(v) => Test::Equals(v.as_bytes().into()),
            HeaderTest::Prefix(v) => Test::Prefix(v.as_bytes().into()),
        }
    }
}

#[derive(Debug)]
struct Cond {
    hosts: Option<Hosts>,
    paths: Box<[Box<[u8]>]>,
    prefixes: Box<[Box<[u8]>]>,
    methods: Box<[Box<[u8]>]>,
    headers: Box<[(Box<[u8]>, Test)]>,
    /// On the client certificate: None, no condition; `Some(None)`, none
    /// presented; `Some(Some(test))`, its subject passes `test`.
    cert: Option<Option<Test>>,
    path_regex: Option<regex::bytes::Regex>,
    /// Against the normalised host (lower case, no port).
    host_regex: Option<regex::bytes::Regex>,
}

impl Cond {
    fn holds<V: View + ?Sized>(&self, req: &V, host: Option<&[u8]>) -> bool {
        if let Some(h) = &self.hosts {
            if !host.is_some_and(|host| h.matches(host)) {
                return false;
            }
        }
        if let Some(re) = &self.host_regex {
            if !host.is_some_and(|host| re.is_match(host)) {
                return false;
            }
        }
        if !self.methods.is_empty() {
            let m = req.method();
            if !self.methods.iter().any(|x| &**x == m) {
                return false;
            }
        }
        if !self.paths.is_empty() || !self.prefixes.is_empty() {
            let p = req.path();
            if !self.paths.iter().any(|x| &**x == p) && !self.prefixes.iter().any(|x| p.starts_with(x)) {
                return false;
            }
        }
        if let Some(re) = &self.path_regex {
            if !re.is_match(req.path()) {
                return false;
            }
        }
        if let Some(want) = &self.cert {
            match (want, req.client_cert()) {
                (None, None) => {}
                (Some(test), Some(subject)) if test.passes(subject.as_bytes()) => {}
                _ => return false,
            }
        }
        self.headers.iter().all(|(name, test)| req.header_any(name, &mut |v: &[u8]| test.passes(v)))
    }
}

/// One listener's compiled routes.
#[derive(Debug)]
pub struct Listener {
    conds: Box<[Cond]>,
    /// `conds.len() + 1` actions: one per route, then the default.
    actions: Box<[Action]>,
    /// Whether some route looks at the host (else it is not normalised).
    uses_host: bool,
    pub request_id: Option<HeaderName>,
    /// `strict-transport-security` value (HTTPS listeners).
    pub hsts: Option<HeaderValue>,
    /// Client certificates asked at the handshake; None: as `[tls]` says.
    pub client_verify: Option<super::config::ClientVerify>,
    /// The routes' rate-limit tables by route identity, for the next reload to keep.
    limits: Vec<(String, Arc<super::ratelimit::Table>)>,
}

impl Listener {
    /// The index of the action for `req` (first route that holds, else the default).
    pub fn route<V: View + ?Sized>(&self, req: &V) -> usize {
        if self.conds.is_empty() {
            return 0;
        }
        let mut buf = [0u8; MAX_HOST];
        let host = if self.uses_host {
            req.host().and_then(|h| normalize_host(h, &mut buf))
        } else {
            None
        };
        self.conds
            .iter()
            .position(|c| c.holds(req, host))
            .unwrap_or(self.conds.len())
    }

    #[inline]
    pub fn action(&self, i: usize) -> &Action {
        &self.actions[i]
    }
}

/// The routing snapshot: pools and listeners, swapped whole on reload.
pub struct Table {
    pub pools: Vec<Arc<Upstream>>,
    pub names: Vec<String>,
    pub listeners: Vec<Listener>,
    /// The rate limit, its keys kept across reloads (see [`super::ratelimit`]).
    pub rate_limit: Option<Arc<super::ratelimit::Table>>,
    pub error_pages: Vec<Arc<ErrorPage>>,
}

fn valid_code(code: u16) -> bool {
    matches!(code, 301 | 302 | 303 | 307 | 308)
}

fn compile_route(
    r: &RouteSpec,
    where_: &str,
    pools: &HashMap<&str, usize>,
    listener_rules: &RulesSpec,
    pool_rules: &[&RulesSpec],
) -> Result<(Cond, Action), String> {
    let mut hosts = Hosts::default();
    for h in &r.hosts {
        let lower = h.trim().to_ascii_lowercase();
        let lower = lower.strip_suffix('.').unwrap_or(&lower);
        if let Some(suffix) = lower.strip_prefix("*.") {
            if suffix.is_empty() || suffix.contains('*') {
                return Err(format!("{where_}.host: invalid wildcard {h:?} (expected *.example.com)"));
            }
            hosts.suffixes.push(format!(".{suffix}").into_bytes().into());
        } else {
            if lower.is_empty() || lower.contains(['*', '/', ' ']) || lower.len() > MAX_HOST {
                return Err(format!("{where_}.host: invalid host {h:?} (a name, or *.example.com)"));
            }
            let mut buf = [0u8; MAX_HOST];
            let n = normalize_host(lower.as_bytes(), &mut buf).unwrap_or(b"");
            hosts.exact.insert(n.into());
        }
    }
    for p in r.paths.iter().chain(&r.path_prefixes) {
        if !p.starts_with('/') {
            return Err(format!("{where_}: path {p:?} must start with /"));
        }
    }
    for m in &r.methods {
        if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-') {
            return Err(format!("{where_}.method: invalid method {m:?}"));
        }
    }
    let mut headers = Vec::new();
    for (n, t) in &r.headers {
        let name = header_name(n, &format!("{where_}.header"))?;
        headers.push((name.as_str().as_bytes().into(), Test::of(t)));
    }
    let regex = |p: &Option<String>, key: &str, ci: bool| {
        p.as_deref().map(|p| rewrite::compile(p, ci).map_err(|e| format!("{where_}.{key}: {e}"))).transpose()
    };
    let path_regex = regex(&r.path_regex, "path_regex", false)?;
    let host_regex = regex(&r.host_regex, "host_regex", true)?;
    let rewrite = Rewrite::new(&r.rewrite).map_err(|e| format!("{where_}.rewrite.{e}"))?;
    let cond = Cond {
        path_regex,
        host_regex,
        hosts: (!r.hosts.is_empty()).then_some(hosts),
        paths: r.paths.iter().map(|p| p.as_bytes().into()).collect(),
        prefixes: r.path_prefixes.iter().map(|p| p.as_bytes().into()).collect(),
        // methods are case-sensitive (RFC 9110 §9.1); configured names are upper-cased
        methods: r.methods.iter().map(|m| m.to_ascii_uppercase().into_bytes().into()).collect(),
        headers: headers.into(),
        cert: r.client_cert.as_ref().map(|c| match c {
            CertTest::Absent => None,
            CertTest::Subject(t) => Some(Test::of(t)),
        }),
    };
    let mut action = compile_action(
        r.backend.as_deref(),
        r.redirect.as_ref(),
        where_,
        pools,
        listener_rules,
        pool_rules,
        &r.rules,
    )?;
    if r.respond.is_some() && (action.pool.is_some() || action.redirect.is_some()) {
        return Err(format!("{where_}: a route has one of a backend, a redirect or respond"));
    }
    action.respond = r.respond.clone();
    if rewrite.is_some() && action.pool.is_none() {
        return Err(format!("{where_}.rewrite: a rewrite needs a backend (it changes what is forwarded)"));
    }
    action.rewrite = rewrite;
    Ok((cond, action))
}

fn compile_action(
    backend: Option<&str>,
    redirect: Option<&RedirectSpec>,
    where_: &str,
    pools: &HashMap<&str, usize>,
    listener_rules: &RulesSpec,
    pool_rules: &[&RulesSpec],
    own: &RulesSpec,
) -> Result<Action, String> {
    let pool = match backend {
        Some(b) => Some(*pools.get(b).ok_or_else(|| {
            let mut known: Vec<&str> = pools.keys().copied().collect();
            known.sort();
            format!("{where_}: no backend named {b:?} (known: {})", known.join(", "))
        })?),
        None => None,
    };
    let redirect = match redirect {
        None => None,
        Some(RedirectSpec::Location { code, location }) => {
            if !valid_code(*code) {
                return Err(format!("{where_}.redirect.code must be 301, 302, 303, 307 or 308, got {code}"));
            }
            let location = HeaderValue::from_str(location)
                .map_err(|_| format!("{where_}.redirect.location: invalid value {location:?}"))?;
            Some(Redirect::Location { code: *code, location })
        }
        Some(RedirectSpec::Https { code, port }) => {
            if !valid_code(*code) {
                return Err(format!("{where_}.redirect.code must be 301, 302, 303, 307 or 308, got {code}"));
            }
            Some(Redirect::Https { code: *code, port: *port })
        }
    };
    if pool.is_some() && redirect.is_some() {
        return Err(format!("{where_}: a route has a backend or a redirect, not both"));
    }
    let pr = pool.map(|i| pool_rules[i]);
    let empty = RulesSpec::default();
    let pr = pr.unwrap_or(&empty);
    let w_l = format!("{where_} (listener header rules)");
    let w_b = format!("{where_} (backend header rules)");
    let request = fold(&[
        (&listener_rules.request, &w_l),
        (&pr.request, &w_b),
        (&own.request, &format!("{where_}.request_headers")),
    ])?;
    let response = fold(&[
        (&listener_rules.response, &w_l),
        (&pr.response, &w_b),
        (&own.response, &format!("{where_}.response_headers")),
    ])?;
    Ok(Action {
        pool,
        redirect,
        respond: None,
        request,
        response,
        rate_limit: None,
        compress: None,
        rewrite: None,
    })
}

impl Listener {
    fn compile(
        spec: &ListenerSpec,
        where_: &str,
        pools: &HashMap<&str, usize>,
        pool_rules: &[&RulesSpec],
        previous: Option<&Listener>,
    ) -> Result<Self, String> {
        let mut conds = Vec::with_capacity(spec.routes.len());
        let mut actions = Vec::with_capacity(spec.routes.len() + 1);
        let mut limits = Vec::new();
        for (i, r) in spec.routes.iter().enumerate() {
            let (c, mut a) = compile_route(r, &format!("{where_}routes[{i}]"), pools, &spec.rules, pool_rules)?;
            if a.pool.is_none() && a.redirect.is_none() && a.respond.is_none() {
                return Err(format!("{where_}routes[{i}]: a route needs a backend, a redirect or respond"));
            }
            if let Some(rl) = &r.rate_limit {
                let id = r.identity();
                let old = previous.and_then(|p| p.limits.iter().find(|(k, _)| *k == id)).map(|(_, t)| &**t);
                let table = Arc::new(
                    super::ratelimit::Table::new(rl, old).map_err(|e| format!("{where_}routes[{i}].{e}"))?,
                );
                a.rate_limit = Some(table.clone());
                limits.push((id, table));
            }
            a.compress = r.compress.clone();
            conds.push(c);
            actions.push(a);
        }
        let mut default = compile_action(
            spec.default_backend.as_deref(),
            None,
            &format!("{where_}default_backend"),
            pools,
            &spec.rules,
            pool_rules,
            &RulesSpec::default(),
        )?;
        default.compress = spec.compress.clone();
        actions.push(default);
        let request_id = match &spec.request_id {
            Some(n) => {
                let name = header_name(n, &format!("{where_}request_id.header"))?;
                if reserved(&name) {
                    return Err(format!("{where_}request_id.header: {name} cannot carry a request id"));
                }
                Some(name)
            }
            None => None,
        };
        let hsts = spec.hsts.as_ref().map(|h| {
            let mut v = format!("max-age={}", h.max_age);
            if h.include_subdomains {
                v.push_str("; includeSubDomains");
            }
            if h.preload {
                v.push_str("; preload");
            }
            HeaderValue::from_str(&v).expect("digits and ASCII words")
        });
        Ok(Listener {
            uses_host: conds.iter().any(|c: &Cond| c.hosts.is_some() || c.host_regex.is_some()),
            conds: conds.into(),
            actions: actions.into(),
            request_id,
            hsts,
            limits,
            client_verify: spec.client_verify,
        })
    }
}

impl Table {
    /// Compile `spec`, reusing the backends of `previous` pools of the same
    /// name (their counters, health and limits carry over).
    pub fn new(
        spec: &RoutingSpec,
        previous: Option<&Table>,
        epoch: std::time::Instant,
        ids: &std::sync::atomic::AtomicU64,
    ) -> Result<Self, String> {
        if spec.pools.is_empty() {
            return Err("at least one backend pool is needed".into());
        }
        let mut index = HashMap::new();
        for (i, p) in spec.pools.iter().enumerate() {
            if p.name.is_empty() || index.insert(p.name.as_str(), i).is_some() {
                return Err(format!("backend pool name {:?} is empty or used twice", p.name));
            }
        }
        let mut pools = Vec::with_capacity(spec.pools.len());
        for p in &spec.pools {
            let old = previous.and_then(|t| t.names.iter().position(|n| *n == p.name).map(|i| &*t.pools[i]));
            pools.push(Arc::new(
                Upstream::new(p.settings.clone(), old, epoch, ids).map_err(|e| format!("backend {:?}: {e}", p.name))?,
            ));
        }
        let pool_rules: Vec<&RulesSpec> = spec.pools.iter().map(|p| &p.rules).collect();
        let many = spec.listeners.len() > 1;
        let listeners = spec
            .listeners
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let where_ = if many { format!("listeners[{i}].") } else { String::new() };
                Listener::compile(l, &where_, &index, &pool_rules, previous.and_then(|t| t.listeners.get(i)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let rate_limit = match &spec.rate_limit {
            Some(s) => Some(Arc::new(super::ratelimit::Table::new(
                s,
                previous.and_then(|t| t.rate_limit.as_deref()),
            )?)),
            None => None,
        };
        Ok(Table {
            pools,
            names: spec.pools.iter().map(|p| p.name.clone()).collect(),
            listeners,
            rate_limit,
            error_pages: spec.error_pages.clone(),
        })
    }

    /// The page configured for `status`, if any (a few at most: a scan).
    #[inline]
    pub fn error_page(&self, status: u16) -> Option<&Arc<ErrorPage>> {
        self.error_pages.iter().find(|p| p.status == status)
    }

    /// The listener `i`'s routes (the first if out of range).
    #[inline]
    pub fn listener(&self, i: usize) -> &Listener {
        self.listeners.get(i).unwrap_or(&self.listeners[0])
    }
}

/// Request ids of one worker: a random 64-bit prefix and a counter, as 32
/// hex digits (unique across workers and restarts with overwhelming odds).
pub struct RequestIds {
    prefix: u64,
    next: std::sync::atomic::AtomicU64,
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds {
            prefix: uuid::Uuid::new_v4().as_u64_pair().0,
            next: std::sync::atomic::AtomicU64::new(1),
        }
    }
}

/// A request id, on the stack.
pub type IdBuf = [u8; 32];

impl RequestIds {
    pub fn generate(&self) -> IdBuf {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut out = [0u8; 32];
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for (i, v) in [self.prefix, n].into_iter().enumerate() {
            for k in 0..16 {
                out[i * 16 + k] = HEX[((v >> (60 - 4 * k)) & 0xf) as usize];
            }
        }
        out
    }
}

/// The `Retry-After` header of a request refused by a rate limit, as a header rule.
pub fn retry_after(wait: std::time::Duration) -> Added {
    let v = super::ratelimit::retry_after_secs(wait).to_string();
    Added {
        name: http::header::RETRY_AFTER,
        fixed: http::HeaderValue::from_str(&v).ok(),
        pieces: Box::new([Piece::Lit(v.into_bytes().into_boxed_slice())]),
    }
}

#[cfg(test)]
mod tests;
