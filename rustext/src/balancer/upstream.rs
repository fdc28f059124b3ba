//! Backends and the choice among them.
//!
//! An [`Upstream`] is an immutable snapshot of the pool (backends, policy);
//! replacing it at run time swaps one `Arc` while in-flight requests keep the
//! snapshot they started with. A [`Backend`] survives reloads when its name is
//! unchanged, so its counters, health and connection limit carry over.

pub mod policy;

use std::net::IpAddr;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::config::{Algorithm, BackendSpec, HashKey, Settings};

/// Administrative state of a backend (health is separate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminState {
    /// Takes traffic when healthy.
    Enabled = 0,
    /// No new requests; in-flight ones finish.
    Drain = 1,
    /// Marked down by the operator or a health check.
    Disabled = 2,
}

impl AdminState {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "up" | "enabled" | "enable" | "ready" => Ok(AdminState::Enabled),
            "drain" | "draining" => Ok(AdminState::Drain),
            "down" | "disabled" | "disable" | "maint" => Ok(AdminState::Disabled),
            _ => Err(format!(
                "unknown backend state {s:?} (expected up, drain or down)"
            )),
        }
    }
    fn from_u8(v: u8) -> Self {
        match v {
            0 => AdminState::Enabled,
            1 => AdminState::Drain,
            _ => AdminState::Disabled,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            AdminState::Enabled => "up",
            AdminState::Drain => "drain",
            AdminState::Disabled => "down",
        }
    }
}

/// Counters of one backend (shared by all workers, relaxed atomics).
#[derive(Default)]
pub struct BackendStats {
    pub requests: AtomicU64,
    pub failures: AtomicU64,
    pub responses: [AtomicU64; 5],
    pub bytes_out: AtomicU64,
    pub ejections: AtomicU64,
}

pub struct Backend {
    /// Unique within a balancer: keys the per-worker connection pools.
    pub id: u64,
    pub name: String,
    /// Resolved once, when the backend is configured.
    pub addr: std::net::SocketAddr,
    pub authority: http::uri::Authority,
    pub weight: AtomicU32,
    admin: AtomicU8,
    /// Set by active health checks (Python); `true` until told otherwise.
    healthy: AtomicBool,
    fails: AtomicU32,
    /// Passive ejection deadline, in ms since `epoch` (0 = not ejected).
    ejected_until: AtomicU64,
    epoch: Instant,
    /// Requests in flight to this backend (all workers).
    pub active: AtomicI64,
    max_conns: AtomicUsize,
    pub limiter: Arc<Semaphore>,
    pub stats: BackendStats,
    /// The PROXY header its new connections start with: 0 none, 1 v1, 2 v2
    /// (set on every reload, see [`Backend::send_proxy`]).
    send_proxy: AtomicU8,
    /// When it last came into service, in ms since `epoch` (slow start).
    up_since: AtomicU64,
    /// The Unix socket it listens on (`unix:/path`); `addr` is then unused.
    pub unix: Option<std::path::PathBuf>,
}

/// Permits of an "unlimited" limiter; Semaphore::MAX_PERMITS is far larger.
const UNLIMITED: usize = 1 << 24;

impl Backend {
    /// Connect to it, over TCP or its Unix socket.
    pub async fn connect(&self) -> std::io::Result<tokio::net::TcpStream> {
        match &self.unix {
            Some(path) => super::unix::connect(path).await,
            None => tokio::net::TcpStream::connect(self.addr).await,
        }
    }

    pub fn new(
        id: u64,
        spec: &BackendSpec,
        default_max: usize,
        epoch: Instant,
    ) -> Result<Self, String> {
        let addr = super::config::parse_backend_addr(&spec.name)?;
        let unix = super::unix::backend_path(&spec.name);
        let authority: http::uri::Authority = if unix.is_some() {
            // the Host of HTTP/1.0 requests that sent none, and the TLS server name
            http::uri::Authority::from_static("localhost")
        } else {
            spec.name
                .parse()
                .map_err(|_| format!("backend address {:?} must be host:port", spec.name))?
        };
        let max = if spec.max_connections > 0 {
            spec.max_connections
        } else {
            default_max
        };
        let permits = if max == 0 { UNLIMITED } else { max };
        Ok(Backend {
            id,
            addr,
            name: spec.name.clone(),
            authority,
            weight: AtomicU32::new(spec.weight),
            admin: AtomicU8::new(AdminState::Enabled as u8),
            healthy: AtomicBool::new(true),
            fails: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            epoch,
            active: AtomicI64::new(0),
            max_conns: AtomicUsize::new(permits),
            limiter: Arc::new(Semaphore::new(permits)),
            stats: BackendStats::default(),
            send_proxy: AtomicU8::new(0),
            up_since: AtomicU64::new(epoch.elapsed().as_millis() as u64 + 1),
            unix,
        })
    }

    /// Whether (and which) PROXY header its new connections start with.
    /// Such connections are private to the client connection they were
    /// opened for: they never go back to a shared pool.
    #[inline]
    pub fn send_proxy(&self) -> Option<super::proxyproto::Version> {
        match self.send_proxy.load(Relaxed) {
            1 => Some(super::proxyproto::Version::V1),
            2 => Some(super::proxyproto::Version::V2),
            _ => None,
        }
    }

    fn set_send_proxy(&self, settings: &Settings) {
        use super::proxyproto::Version;
        let v = settings
            .send_proxy_servers
            .iter()
            .find(|(n, _)| *n == self.name)
            .map_or(settings.send_proxy, |(_, v)| *v);
        self.send_proxy.store(match v { None => 0, Some(Version::V1) => 1, Some(Version::V2) => 2 }, Relaxed);
    }

    /// Resize the concurrency limit in place (waiters keep their place).
    pub fn set_max_connections(&self, max: usize) {
        let want = if max == 0 { UNLIMITED } else { max };
        let have = self.max_conns.swap(want, Relaxed);
        if want > have {
            self.limiter.add_permits(want - have);
        } else if have > want {
            // Takes back idle permits now; busy ones are reclaimed as they return.
            let mut left = have - want;
            left -= self.limiter.forget_permits(left);
            if left > 0 {
                let sem = self.limiter.clone();
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    handle.spawn(async move {
                        if let Ok(p) = sem.acquire_many(left as u32).await {
                            p.forget();
                        }
                    });
                }
            }
        }
    }

    /// Whether requests to it take a slot of `limiter`.
    #[inline]
    pub fn limited(&self) -> bool {
        self.max_conns.load(Relaxed) != UNLIMITED
    }

    pub fn admin(&self) -> AdminState {
        AdminState::from_u8(self.admin.load(Relaxed))
    }
    pub fn set_admin(&self, s: AdminState) {
        let was = self.admin.swap(s as u8, Relaxed);
        if s == AdminState::Enabled && was != s as u8 {
            self.up_since.store(self.now_ms(), Relaxed);
        }
    }
    pub fn healthy(&self) -> bool {
        self.healthy.load(Relaxed)
    }
    pub fn set_healthy(&self, up: bool) {
        let was = self.healthy.swap(up, Relaxed);
        // back in service: from down, or from an ejection the check ends (marked down)
        if up && (!was || self.ejected()) {
            self.up_since.store(self.now_ms(), Relaxed);
        }
        if up {
            self.fails.store(0, Relaxed);
            self.ejected_until.store(0, Relaxed);
        }
    }
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }
    /// The backend's clock (ms), for [`Backend::up_since_ms`].
    pub fn clock_ms(&self) -> u64 {
        self.now_ms()
    }
    /// When it last came into service (health up, enabled, back from
    /// ejection, or created), on [`Backend::clock_ms`]'s clock.
    pub fn up_since_ms(&self) -> u64 {
        let since = self.up_since.load(Relaxed);
        let until = self.ejected_until.load(Relaxed);
        since.max(until)
    }
    pub fn ejected(&self) -> bool {
        let until = self.ejected_until.load(Relaxed);
        until != 0 && self.now_ms() < until
    }
    /// Takes new requests: enabled, healthy, not ejected, weight > 0.
    #[inline]
    pub fn available(&self) -> bool {
        self.admin.load(Relaxed) == AdminState::Enabled as u8
            && self.healthy.load(Relaxed)
            && self.weight.load(Relaxed) > 0
            && !self.ejected()
    }
    /// A transport failure (connect, reset, timeout): passive health.
    pub fn record_failure(&self, eject_after: u32, cooldown: Duration) {
        self.stats.failures.fetch_add(1, Relaxed);
        let n = self.fails.fetch_add(1, Relaxed) + 1;
        if eject_after > 0 && n >= eject_after && !self.ejected() {
            // Duration::MAX: until a health check ends it (set_healthy)
            let ms = u64::try_from(cooldown.as_millis()).unwrap_or(u64::MAX);
            self.ejected_until.store(self.now_ms().saturating_add(ms), Relaxed);
            self.fails.store(0, Relaxed);
            self.stats.ejections.fetch_add(1, Relaxed);
        }
    }
    #[inline]
    pub fn record_success(&self) {
        if self.fails.load(Relaxed) != 0 {
            self.fails.store(0, Relaxed);
        }
    }
    pub fn state_name(&self) -> &'static str {
        match self.admin() {
            AdminState::Enabled if !self.healthy() => "down",
            AdminState::Enabled if self.ejected() => "ejected",
            s => s.name(),
        }
    }
}

/// What the request offers to the hash.
pub struct Key<'a> {
    pub client_ip: IpAddr,
    pub path: &'a str,
    /// The value of the hash header (`HashKey::Header`), if the request has it.
    pub header: Option<&'a [u8]>,
}

/// A snapshot of the pool and its policy.
pub struct Upstream {
    pub backends: Vec<Arc<Backend>>,
    pub settings: Settings,
    rr: AtomicUsize,
    swrr: Mutex<Vec<i64>>,
    ring: Vec<(u64, u32)>,
    /// Backups, slow start, retry-on, layer-7 health, persistence.
    pub policy: super::policy::Policy,
    /// The pool's own rate limit, its keys kept across reloads.
    pub rate_limit: Option<Arc<super::ratelimit::Table>>,
}

/// Points per unit of weight on the ketama ring.
const POINTS_PER_WEIGHT: u32 = 100;

impl Upstream {
    /// Build a snapshot, reusing `previous` backends with the same name.
    pub fn new(
        settings: Settings,
        previous: Option<&Upstream>,
        epoch: Instant,
        ids: &AtomicU64,
    ) -> Result<Self, String> {
        settings.validate()?;
        let mut backends = Vec::with_capacity(settings.backends.len());
        for spec in &settings.backends {
            let old = previous.and_then(|p| p.backends.iter().find(|b| b.name == spec.name));
            let b = match old {
                Some(b) => {
                    b.weight.store(spec.weight, Relaxed);
                    let max = if spec.max_connections > 0 {
                        spec.max_connections
                    } else {
                        settings.max_connections
                    };
                    b.set_max_connections(max);
                    b.clone()
                }
                None => Arc::new(Backend::new(
                    ids.fetch_add(1, Relaxed),
                    spec,
                    settings.max_connections,
                    epoch,
                )?),
            };
            b.set_send_proxy(&settings);
            backends.push(b);
        }
        let ring = if settings.algorithm == Algorithm::ConsistentHash {
            build_ring(&backends)
        } else {
            Vec::new()
        };
        let n = backends.len();
        let policy = super::policy::Policy::compile(&settings.policy, &backends)?;
        let rate_limit = match &settings.policy.rate_limit {
            Some(spec) => Some(Arc::new(super::ratelimit::Table::new(
                spec,
                previous.and_then(|p| p.rate_limit.as_deref()),
            )?)),
            None => None,
        };
        Ok(Upstream {
            backends,
            settings,
            rr: AtomicUsize::new(0),
            swrr: Mutex::new(vec![0; n]),
            ring,
            policy,
            rate_limit,
        })
    }

    pub fn find(&self, name: &str) -> Option<&Arc<Backend>> {
        self.backends.iter().find(|b| b.name == name)
    }

    /// Choose a backend index, skipping those in `tried`; backups only
    /// when no other server is available, ramping servers (slow start) in
    /// proportion to their share (see [`super::policy`]).
    pub fn select(&self, key: &Key<'_>, tried: &super::tried::Tried) -> Option<usize> {
        let p = &self.policy;
        if !p.shapes_choice() {
            return self.select_among(key, tried, &|_| true);
        }
        let hashed = self.settings.algorithm == Algorithm::ConsistentHash;
        let ramping = |i: usize| {
            hashed || !p.has_slow_start || {
                let share = p.share(i, &self.backends[i]);
                share >= 1.0 || ((fast_random() >> 11) as f64 / (1u64 << 53) as f64) < share
            }
        };
        let usable = |i: usize| !tried.contains(i) && self.backends[i].available();
        // (checked first so that the algorithms' rotation is not spent on an empty pass)
        let primary_left = !p.has_backups || (0..self.backends.len()).any(|i| !p.is_backup(i) && usable(i));
        if primary_left {
            let found = self.select_among(key, tried, &|i| !p.is_backup(i) && ramping(i));
            if found.is_some() || !p.has_slow_start {
                return found;
            }
            return self.select_among(key, tried, &|i| !p.is_backup(i));
        }
        if p.all_backups {
            self.select_among(key, tried, &|i| p.is_backup(i))
        } else {
            (0..self.backends.len()).find(|&i| p.is_backup(i) && usable(i))
        }
    }

    /// [`Upstream::select`] among the servers `among` admits.
    fn select_among(&self, key: &Key<'_>, tried: &super::tried::Tried, among: &dyn Fn(usize) -> bool) -> Option<usize> {
        let n = self.backends.len();
        if n == 0 {
            return None;
        }
        let ok = |i: usize| !tried.contains(i) && self.backends[i].available() && among(i);
        match self.settings.algorithm {
            Algorithm::RoundRobin => {
                let start = self.rr.fetch_add(1, Relaxed);
                (0..n).map(|k| (start + k) % n).find(|&i| ok(i))
            }
            Algorithm::WeightedRoundRobin => {
                // Nginx's smooth weighted round robin.
                let mut cur = self.swrr.lock().unwrap_or_else(|e| e.into_inner());
                let mut total = 0i64;
                let mut best: Option<usize> = None;
                for i in 0..n {
                    if !ok(i) {
                        continue;
                    }
                    let w = self.backends[i].weight.load(Relaxed) as i64;
                    cur[i] += w;
                    total += w;
                    if best.is_none_or(|b| cur[i] > cur[b]) {
                        best = Some(i);
                    }
                }
                if let Some(b) = best {
                    cur[b] -= total;
                }
                best
            }
            Algorithm::LeastConnections => {
                let start = self.rr.fetch_add(1, Relaxed);
                let mut best: Option<(usize, i64, i64)> = None;
                for k in 0..n {
                    let i = (start + k) % n;
                    if !ok(i) {
                        continue;
                    }
                    let b = &self.backends[i];
                    let (a, w) = (b.active.load(Relaxed).max(0), b.weight.load(Relaxed) as i64);
                    // a/w < ba/bw without division
                    if best.is_none_or(|(_, ba, bw)| a * bw < ba * w) {
                        best = Some((i, a, w));
                    }
                }
                best.map(|(i, _, _)| i)
            }
            Algorithm::RandomTwo => {
                let avail: Vec<usize> = (0..n).filter(|&i| ok(i)).collect();
                match avail.len() {
                    0 => None,
                    1 => Some(avail[0]),
                    m => {
                        let r = fast_random();
                        let x = (r % m as u64) as usize;
                        let mut y = ((r >> 32) % (m as u64 - 1)) as usize;
                        if y >= x {
                            y += 1;
                        }
                        let (bx, by) = (&self.backends[avail[x]], &self.backends[avail[y]]);
                        let lx = bx.active.load(Relaxed) * by.weight.load(Relaxed) as i64;
                        let ly = by.active.load(Relaxed) * bx.weight.load(Relaxed) as i64;
                        Some(if ly < lx { avail[y] } else { avail[x] })
                    }
                }
            }
            Algorithm::ConsistentHash => {
                let h = match &self.settings.hash_key {
                    HashKey::ClientIp => hash_ip(key.client_ip),
                    HashKey::Path => hash64(key.path.as_bytes()),
                    HashKey::Header(_) => match key.header {
                        Some(v) => hash64(v),
                        None => hash_ip(key.client_ip),
                    },
                };
                ring_lookup(&self.ring, h, ok)
            }
        }
    }
}

fn hash_ip(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(v) => hash64(&v.octets()),
        IpAddr::V6(v) => hash64(&v.octets()),
    }
}

/// FNV-1a with a splitmix64 finalizer: stable across runs and platforms.
pub fn hash64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    mix(h)
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// Ketama ring: `weight * POINTS_PER_WEIGHT` points per backend, sorted.
fn build_ring(backends: &[Arc<Backend>]) -> Vec<(u64, u32)> {
    let mut ring = Vec::new();
    for (i, b) in backends.iter().enumerate() {
        let pts = b.weight.load(Relaxed).max(1) * POINTS_PER_WEIGHT;
        for p in 0..pts {
            ring.push((hash64(format!("{}-{}", b.name, p).as_bytes()), i as u32));
        }
    }
    ring.sort_unstable();
    ring
}

/// First point clockwise from `h` whose backend is usable; a backend that is
/// down only moves its own keys (to their next points).
fn ring_lookup(ring: &[(u64, u32)], h: u64, ok: impl Fn(usize) -> bool) -> Option<usize> {
    if ring.is_empty() {
        return None;
    }
    let start = ring.partition_point(|&(p, _)| p < h);
    let mut checked = 0u64;
    for k in 0..ring.len() {
        let i = ring[(start + k) % ring.len()].1 as usize;
        if i < 64 && checked & (1 << i) != 0 {
            continue;
        }
        if ok(i) {
            return Some(i);
        }
        if i < 64 {
            checked |= 1 << i;
        }
    }
    None
}

thread_local! {
    static RNG: std::cell::Cell<u64> = std::cell::Cell::new({
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        mix(t ^ (&t as *const u64 as u64)) | 1
    });
}

/// xorshift64* per thread: the two random choices need speed, not secrecy.
fn fast_random() -> u64 {
    RNG.with(|c| {
        let mut x = c.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        c.set(x);
        x.wrapping_mul(0x2545F4914F6CDD1D)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::tried::Tried;

    fn up(names: &[(&str, u32)], alg: Algorithm) -> Upstream {
        let settings = Settings {
            backends: names
                .iter()
                .map(|(n, w)| BackendSpec {
                    name: n.to_string(),
                    weight: *w,
                    max_connections: 0,
                })
                .collect(),
            algorithm: alg,
            hash_key: HashKey::Path,
            ..Settings::default()
        };
        Upstream::new(settings, None, Instant::now(), &AtomicU64::new(0)).unwrap()
    }

    fn key<'a>(path: &'a str, _h: &'a http::HeaderMap) -> Key<'a> {
        Key {
            client_ip: "10.0.0.1".parse().unwrap(),
            path,
            header: None,
        }
    }

    fn counts(u: &Upstream, n: usize) -> Vec<usize> {
        let h = http::HeaderMap::new();
        let mut c = vec![0; u.backends.len()];
        for i in 0..n {
            let p = format!("/k{i}");
            c[u.select(&key(&p, &h), &Tried::default()).unwrap()] += 1;
        }
        c
    }

    const THREE: [(&str, u32); 3] = [("127.0.0.1:1", 5), ("127.0.0.1:2", 1), ("127.0.0.1:3", 1)];

    #[test]
    fn round_robin_is_even_and_skips_down() {
        let u = up(&THREE, Algorithm::RoundRobin);
        assert_eq!(counts(&u, 300), vec![100, 100, 100]);
        u.backends[1].set_admin(AdminState::Drain);
        assert_eq!(counts(&u, 300)[1], 0);
    }

    #[test]
    fn smooth_weighted_sequence() {
        let u = up(&THREE, Algorithm::WeightedRoundRobin);
        let h = http::HeaderMap::new();
        let seq: Vec<usize> = (0..7)
            .map(|_| u.select(&key("/", &h), &Tried::default()).unwrap())
            .collect();
        // nginx's documented order for weights 5,1,1: a a b a c a a
        assert_eq!(seq, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn least_connections_prefers_idle() {
        let u = up(
            &[("127.0.0.1:1", 1), ("127.0.0.1:2", 1)],
            Algorithm::LeastConnections,
        );
        u.backends[0].active.store(5, Relaxed);
        assert_eq!(counts(&u, 10), vec![0, 10]);
    }

    #[test]
    fn random_two_spreads() {
        let u = up(
            &[("127.0.0.1:1", 1), ("127.0.0.1:2", 1), ("127.0.0.1:3", 1)],
            Algorithm::RandomTwo,
        );
        let c = counts(&u, 3000);
        assert!(c.iter().all(|&x| x > 600), "{c:?}");
    }

    #[test]
    fn consistent_hash_moves_only_the_lost_keys() {
        let names = [
            ("127.0.0.1:1", 1),
            ("127.0.0.1:2", 1),
            ("127.0.0.1:3", 1),
            ("127.0.0.1:4", 1),
        ];
        let u = up(&names, Algorithm::ConsistentHash);
        let h = http::HeaderMap::new();
        let before: Vec<usize> = (0..2000)
            .map(|i| u.select(&key(&format!("/u{i}"), &h), &Tried::default()).unwrap())
            .collect();
        let c = counts(&u, 4000);
        assert!(c.iter().all(|&x| x > 600), "{c:?}");
        u.backends[2].set_healthy(false);
        for (i, &b) in before.iter().enumerate() {
            let now = u.select(&key(&format!("/u{i}"), &h), &Tried::default()).unwrap();
            if b != 2 {
                assert_eq!(now, b, "key {i} moved although its backend is up");
            } else {
                assert_ne!(now, 2);
            }
        }
    }

    #[test]
    fn tried_backends_are_skipped_and_ejection_expires() {
        let u = up(
            &[("127.0.0.1:1", 1), ("127.0.0.1:2", 1)],
            Algorithm::RoundRobin,
        );
        let h = http::HeaderMap::new();
        for _ in 0..4 {
            assert_eq!(u.select(&key("/", &h), &Tried::of(&[0])), Some(1));
        }
        assert_eq!(u.select(&key("/", &h), &Tried::of(&[0, 1])), None);
        let b = &u.backends[0];
        b.record_failure(2, Duration::from_millis(30));
        assert!(b.available());
        b.record_failure(2, Duration::from_millis(30));
        assert!(!b.available());
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.available());
    }

    #[test]
    fn pools_over_64_servers_do_not_wrap_the_tried_set() {
        let names: Vec<(String, u32)> = (1..=100).map(|p| (format!("127.0.0.1:{p}"), 1)).collect();
        let names: Vec<(&str, u32)> = names.iter().map(|(n, w)| (n.as_str(), *w)).collect();
        let u = up(&names, Algorithm::RoundRobin);
        let h = http::HeaderMap::new();
        for (i, b) in u.backends.iter().enumerate() {
            if i != 0 && i != 64 {
                b.set_admin(AdminState::Drain);
            }
        }
        // 0 tried (and failed): 64 is still there to try
        for _ in 0..4 {
            assert_eq!(u.select(&key("/", &h), &Tried::of(&[0])), Some(64));
        }
        assert_eq!(u.select(&key("/", &h), &Tried::of(&[0, 64])), None);
    }

    fn with_policy(names: &[(&str, u32)], alg: Algorithm, policy: crate::balancer::policy::PolicySpec) -> Upstream {
        let mut s = up(names, alg).settings.clone();
        s.policy = policy;
        Upstream::new(s, None, Instant::now(), &AtomicU64::new(0)).unwrap()
    }

    #[test]
    fn backups_take_over_only_when_no_other_server_is_available() {
        let p = crate::balancer::policy::PolicySpec {
            backups: vec!["127.0.0.1:2".into(), "127.0.0.1:3".into()],
            ..Default::default()
        };
        let u = with_policy(&THREE, Algorithm::RoundRobin, p.clone());
        assert_eq!(counts(&u, 30), vec![30, 0, 0]);
        u.backends[0].set_healthy(false);
        assert_eq!(counts(&u, 30), vec![0, 30, 0]); // the first backup only
        let all = with_policy(&THREE, Algorithm::LeastConnections, crate::balancer::policy::PolicySpec { all_backups: true, ..p });
        all.backends[0].set_admin(AdminState::Drain);
        let c = counts(&all, 30);
        assert!(c[0] == 0 && c[1] >= 5 && c[2] >= 5, "{c:?}"); // both backups
        // a tried primary does not bring the backups in while another primary is there
        let h = http::HeaderMap::new();
        let two = with_policy(
            &[("127.0.0.1:1", 1), ("127.0.0.1:2", 1), ("127.0.0.1:3", 1)],
            Algorithm::RoundRobin,
            crate::balancer::policy::PolicySpec { backups: vec!["127.0.0.1:3".into()], ..Default::default() },
        );
        assert_eq!(two.select(&key("/", &h), &Tried::of(&[0])), Some(1));
        assert_eq!(two.select(&key("/", &h), &Tried::of(&[0, 1])), Some(2));
    }

    #[test]
    fn a_new_server_with_slow_start_gets_almost_nothing_at_first() {
        let p = crate::balancer::policy::PolicySpec {
            slow_start: vec![("127.0.0.1:2".into(), Duration::from_secs(600))],
            ..Default::default()
        };
        for alg in [Algorithm::RoundRobin, Algorithm::WeightedRoundRobin, Algorithm::LeastConnections, Algorithm::RandomTwo] {
            let u = with_policy(&[("127.0.0.1:1", 1), ("127.0.0.1:2", 1)], alg, p.clone());
            let c = counts(&u, 2000);
            assert!(c[1] < 20, "{alg:?}: {c:?}"); // a share of ~0 for the first seconds of ten minutes
            // alone, a ramping server still takes the requests
            u.backends[0].set_healthy(false);
            assert_eq!(counts(&u, 10), vec![0, 10]);
        }
    }

    #[test]
    fn reload_keeps_backend_identity() {
        let u = up(&THREE, Algorithm::RoundRobin);
        u.backends[0].active.store(3, Relaxed);
        let mut s = u.settings.clone();
        s.backends[0].weight = 9;
        s.backends.remove(1);
        let v = Upstream::new(s, Some(&u), Instant::now(), &AtomicU64::new(10)).unwrap();
        assert!(Arc::ptr_eq(&u.backends[0], &v.backends[0]));
        assert_eq!(v.backends[0].weight.load(Relaxed), 9);
        assert_eq!(v.backends.len(), 2);
    }
}
