//! Request rate limiting per client address or per header value, shared by
//! every worker (HAProxy's stick table with `sc_http_req_rate`, nginx's
//! `limit_req`).
//!
//! - **Algorithm.** GCRA, which is nginx's leaky bucket with `burst` and
//!   `nodelay`: each key has a theoretical arrival time `tat`; a request at
//!   `now` is allowed when `max(tat, now) - now <= burst × interval`
//!   (`interval` = period / count), and then pushes `tat` one interval on.
//!   So a quiet key takes `burst + 1` requests at once, then one per
//!   interval. A refused request does not move `tat`; it is told to come back
//!   when it would pass (`Retry-After`).
//! - **Exact across workers.** One table for the whole balancer, split in
//!   shards behind their own lock (a key's shard from its hash): two workers
//!   contend only when their keys share a shard, and a key's decision is
//!   made under its lock.
//! - **Bounded memory.** At most `max_keys` keys (split evenly over the
//!   shards); a new key in a full shard evicts that shard's least recently
//!   seen key. Keys are 64-bit SipHash digests under a random per-process
//!   key, so what a client sends never grows an entry nor aims collisions.
//! - **No clock inside.** [`Table::check`] takes `now` in nanoseconds; the
//!   caller reads the clock (tests inject it).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::stats::IdMap;

/// What a request is counted under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitKey {
    /// The client's address.
    Src,
    /// A request header's value (lower-case name); see [`Spec::missing_allow`].
    Header(http::HeaderName),
}

impl LimitKey {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "src" => Ok(LimitKey::Src),
            _ => match s.strip_prefix("header:") {
                Some(n) => http::HeaderName::from_bytes(n.trim().as_bytes())
                    .map(LimitKey::Header)
                    .map_err(|_| format!("rate_limit.key: invalid header name in {s:?}")),
                None => Err(format!(
                    "rate_limit.key must be src or header:NAME, got {s:?}"
                )),
            },
        }
    }
}

/// A rate limit as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// `count` requests per `period`.
    pub count: u64,
    pub period: Duration,
    /// Requests allowed at once above the steady rate.
    pub burst: u64,
    pub key: LimitKey,
    /// With a header key: requests without the header pass unlimited
    /// (`true`) or are counted under their client address (`false`).
    pub missing_allow: bool,
    /// Keys remembered at most (least recently seen evicted first).
    pub max_keys: usize,
    /// Status of a refused request (429 unless configured).
    pub status: u16,
    /// None: requests within the burst pass at once (nginx's `nodelay`).
    /// Some(n): requests beyond `n` early ones wait until they conform to
    /// the rate (nginx's `limit_req` without `nodelay`, `delay=n`).
    pub delay: Option<u64>,
}

impl Spec {
    pub fn validate(&self) -> Result<(), String> {
        if self.count == 0 || self.period.is_zero() {
            return Err("rate_limit.rate must be at least 1 request per period".into());
        }
        if self.interval_ns() == 0 {
            return Err("rate_limit.rate is over one request per nanosecond".into());
        }
        if self.max_keys == 0 || self.max_keys > 100_000_000 {
            return Err(format!(
                "rate_limit.max_keys must be in 1..=100000000, got {}",
                self.max_keys
            ));
        }
        if !(400..=599).contains(&self.status) {
            return Err(format!(
                "rate_limit.status must be a 4xx or 5xx status, got {}",
                self.status
            ));
        }
        Ok(())
    }

    fn interval_ns(&self) -> u64 {
        (self.period.as_nanos() / self.count as u128) as u64
    }
}

/// The verdict on one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Accepted, to be sent on after this long (delay mode).
    Delay(Duration),
    /// Refused; it would pass after this long.
    Deny(Duration),
}

const NIL: u32 = u32::MAX;

struct Node {
    key: u64,
    tat: u64,
    prev: u32,
    next: u32,
}

/// One shard: a hash map into a slab of nodes linked in recency order.
struct Lru {
    map: IdMap<u32>,
    nodes: Vec<Node>,
    head: u32,
    tail: u32,
    cap: usize,
}

impl Lru {
    fn new(cap: usize) -> Self {
        Lru {
            map: IdMap::default(),
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
            cap,
        }
    }

    fn unlink(&mut self, i: u32) {
        let (p, n) = (self.nodes[i as usize].prev, self.nodes[i as usize].next);
        if p == NIL {
            self.head = n
        } else {
            self.nodes[p as usize].next = n
        }
        if n == NIL {
            self.tail = p
        } else {
            self.nodes[n as usize].prev = p
        }
    }

    fn push_front(&mut self, i: u32) {
        self.nodes[i as usize].prev = NIL;
        self.nodes[i as usize].next = self.head;
        if self.head != NIL {
            self.nodes[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    /// The node of `key`, now the most recent; a new one (evicting the
    /// least recent when full) with `tat = 0` if it was not there.
    fn touch(&mut self, key: u64) -> &mut Node {
        let i = match self.map.get(&key) {
            Some(&i) => {
                if self.head != i {
                    self.unlink(i);
                    self.push_front(i);
                }
                i
            }
            None => {
                let i = if self.nodes.len() < self.cap {
                    self.nodes.push(Node {
                        key,
                        tat: 0,
                        prev: NIL,
                        next: NIL,
                    });
                    (self.nodes.len() - 1) as u32
                } else {
                    let i = self.tail;
                    self.unlink(i);
                    let old = self.nodes[i as usize].key;
                    self.map.remove(&old);
                    self.nodes[i as usize].key = key;
                    self.nodes[i as usize].tat = 0;
                    i
                };
                self.map.insert(key, i);
                self.push_front(i);
                i
            }
        };
        &mut self.nodes[i as usize]
    }
}

/// The keys' state: survives a reload that keeps the key and `max_keys`.
struct State {
    shards: Box<[Mutex<Lru>]>,
    hasher: RandomState,
    epoch: Instant,
}

/// A compiled rate limit (see the module doc).
pub struct Table {
    pub spec: Spec,
    interval: u64,
    tolerance: u64,
    /// Delay mode: early arrivals up to this (ns) pass at once, later ones wait.
    delay_after: Option<u64>,
    state: Arc<State>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table").field("spec", &self.spec).finish_non_exhaustive()
    }
}

impl Table {
    /// Compile `spec`; the keys of `previous` carry over when its key and
    /// `max_keys` are the same (the new rate applies to them from now on).
    pub fn new(spec: &Spec, previous: Option<&Table>) -> Result<Self, String> {
        spec.validate()?;
        let state = match previous {
            Some(p) if p.spec.key == spec.key && p.spec.max_keys == spec.max_keys => {
                p.state.clone()
            }
            _ => {
                // a few keys per shard at least, at most 64 shards
                let n = (spec.max_keys / 16)
                    .clamp(1, 64)
                    .next_power_of_two()
                    .min(64);
                let per = spec.max_keys.div_ceil(n);
                Arc::new(State {
                    shards: (0..n).map(|_| Mutex::new(Lru::new(per))).collect(),
                    hasher: RandomState::new(),
                    epoch: Instant::now(),
                })
            }
        };
        let interval = spec.interval_ns();
        Ok(Table {
            spec: spec.clone(),
            interval,
            tolerance: interval.saturating_mul(spec.burst),
            delay_after: spec.delay.map(|n| interval.saturating_mul(n)),
            state,
        })
    }

    /// The table's clock: nanoseconds since it was made.
    pub fn now(&self) -> u64 {
        self.state.epoch.elapsed().as_nanos() as u64
    }

    /// The key of a request from `ip` with `header` (the key header's
    /// first value, if the key is a header); None: not limited.
    pub fn key(&self, ip: IpAddr, header: Option<&[u8]>) -> Option<u64> {
        let mut h = self.state.hasher.build_hasher();
        match (&self.spec.key, header) {
            (LimitKey::Header(_), Some(v)) => {
                h.write_u8(1);
                h.write(v);
            }
            (LimitKey::Header(_), None) if self.spec.missing_allow => return None,
            _ => {
                h.write_u8(0);
                match ip {
                    IpAddr::V4(v) => h.write(&v.octets()),
                    IpAddr::V6(v) => h.write(&v.octets()),
                }
            }
        }
        Some(h.finish())
    }

    /// Count one request of `key` at `now` (nanoseconds, [`Table::now`]).
    pub fn check(&self, key: u64, now: u64) -> Verdict {
        let shards = &self.state.shards;
        let shard = &shards[(key >> 40) as usize & (shards.len() - 1)];
        let mut g = shard.lock().unwrap_or_else(|e| e.into_inner());
        let node = g.touch(key);
        let tat = node.tat.max(now);
        if tat - now > self.tolerance {
            return Verdict::Deny(Duration::from_nanos(tat - now - self.tolerance));
        }
        node.tat = tat + self.interval;
        // delay mode: the request waits until it conforms to the rate, but
        // for the first `delay` early ones (nginx's excess / rate)
        match self.delay_after.map(|d| (tat - now).saturating_sub(d)) {
            Some(wait) if wait > 0 => Verdict::Delay(Duration::from_nanos(wait)),
            _ => Verdict::Allow,
        }
    }

    /// Keys remembered now (all shards).
    pub fn len(&self) -> usize {
        self.state
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).map.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `Retry-After` seconds for a wait (rounded up, at least 1).
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_nanos().div_ceil(1_000_000_000).max(1) as u64
}

/// The body of a refused request.
pub const BODY: &str = "too many requests\n";

impl Table {
    /// The verdict on a raw HTTP/1 request head from `ip`.
    pub fn verdict_raw(&self, ip: IpAddr, head: &[u8]) -> Verdict {
        let header = match &self.spec.key {
            LimitKey::Header(n) => raw_header(head, n.as_str().as_bytes()),
            LimitKey::Src => None,
        };
        self.verdict(ip, header)
    }

    /// [`Table::verdict`] for a request given as a header map (hyper's path).
    pub fn verdict_headers(&self, ip: IpAddr, headers: &http::HeaderMap) -> Verdict {
        let header = match &self.spec.key {
            LimitKey::Header(n) => headers.get(n).map(http::HeaderValue::as_bytes),
            LimitKey::Src => None,
        };
        self.verdict(ip, header)
    }

    /// The verdict on a request from `ip` with the key header's value (counted if not refused).
    pub fn verdict(&self, ip: IpAddr, header: Option<&[u8]>) -> Verdict {
        match self.key(ip, header) {
            Some(key) => self.check(key, self.now()),
            None => Verdict::Allow,
        }
    }

    /// Some(wait) if refused (delays ignored: the tests' and benchmarks' view).
    pub fn deny(&self, ip: IpAddr, header: Option<&[u8]>) -> Option<Duration> {
        match self.verdict(ip, header) {
            Verdict::Deny(wait) => Some(wait),
            _ => None,
        }
    }
}

/// What the limits that apply to a request say, together: refused by the
/// first that refuses (status, wait), else delayed by the longest delay.
pub fn combined<'a>(tables: impl IntoIterator<Item = &'a Table>, mut verdict: impl FnMut(&Table) -> Verdict) -> Outcome {
    let mut delay = Duration::ZERO;
    for t in tables {
        match verdict(t) {
            Verdict::Allow => {}
            Verdict::Delay(d) => delay = delay.max(d),
            Verdict::Deny(wait) => return Outcome::Refuse(t.spec.status, wait),
        }
    }
    if delay.is_zero() {
        Outcome::Pass
    } else {
        Outcome::Wait(delay)
    }
}

/// See [`combined`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Wait(Duration),
    Refuse(u16, Duration),
}

/// The first value of header `name` (lower case) in a raw HTTP/1 request
/// head, if any (the fast path's lookup: the head was parsed already).
pub fn raw_header<'a>(head: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let mut lines = head.split(|&b| b == b'\n');
    lines.next(); // request line
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if colon == name.len() && line[..colon].eq_ignore_ascii_case(name) {
            return Some(line[colon + 1..].trim_ascii());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(count: u64, per_ms: u64, burst: u64, max_keys: usize) -> Spec {
        Spec {
            count,
            period: Duration::from_millis(per_ms),
            burst,
            key: LimitKey::Src,
            missing_allow: false,
            max_keys,
            status: 429,
            delay: None,
        }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn delay_mode_holds_early_requests_back_as_nginx() {
        // 10 r/s, burst 5, delay 2 (nginx: burst=5 delay=2): at once, the
        // first three pass, the next three wait 100, 200, 300 ms, the 7th is refused
        let mut sp = spec(10, 1000, 5, 100);
        sp.delay = Some(2);
        let t = Table::new(&sp, None).unwrap();
        let k = t.key("10.0.0.1".parse().unwrap(), None).unwrap();
        let now = 1_000 * MS;
        let got: Vec<Verdict> = (0..7).map(|_| t.check(k, now)).collect();
        assert_eq!(
            got,
            vec![
                Verdict::Allow,
                Verdict::Allow,
                Verdict::Allow,
                Verdict::Delay(Duration::from_millis(100)),
                Verdict::Delay(Duration::from_millis(200)),
                Verdict::Delay(Duration::from_millis(300)),
                Verdict::Deny(Duration::from_millis(100)),
            ]
        );
        // delay 0 (no nodelay): every request past the first waits its turn
        sp.delay = Some(0);
        let t = Table::new(&sp, None).unwrap();
        assert_eq!(t.check(k, now), Verdict::Allow);
        assert_eq!(t.check(k, now), Verdict::Delay(Duration::from_millis(100)));
        assert_eq!(t.check(k, now + 50 * MS), Verdict::Delay(Duration::from_millis(150)));
    }

    #[test]
    fn combined_refuses_by_the_first_refusal_and_waits_the_longest_delay() {
        let mut a = spec(10, 1000, 5, 100);
        a.delay = Some(0);
        let (a, b) = (Table::new(&a, None).unwrap(), Table::new(&spec(10, 1000, 0, 100), None).unwrap());
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let now = 1_000 * MS;
        let at = |t: &Table| t.check(t.key(ip, None).unwrap(), now);
        assert_eq!(combined([&a, &b], at), Outcome::Pass);
        assert_eq!(at(&a), Verdict::Delay(Duration::from_millis(100)));
        // b refuses (burst 0): the request is refused with b's status
        assert_eq!(combined([&a, &b], at), Outcome::Refuse(429, Duration::from_millis(100)));
        let c = Table::new(&spec(10, 1000, 5, 100), None).unwrap();
        assert_eq!(combined([&c, &a], at), Outcome::Wait(Duration::from_millis(300)));
    }

    #[test]
    fn burst_then_steady_rate_as_nginx() {
        // 10 r/s, burst 5: six at once, then one per 100 ms
        let t = Table::new(&spec(10, 1000, 5, 100), None).unwrap();
        let k = t.key("10.0.0.1".parse().unwrap(), None).unwrap();
        let now = 1_000 * MS;
        for i in 0..6 {
            assert_eq!(t.check(k, now), Verdict::Allow, "request {i}");
        }
        let Verdict::Deny(wait) = t.check(k, now) else {
            panic!("7th allowed")
        };
        assert_eq!(wait, Duration::from_millis(100));
        assert_eq!(retry_after_secs(wait), 1);
        assert_eq!(
            t.check(k, now + 99 * MS),
            Verdict::Deny(Duration::from_millis(1))
        );
        assert_eq!(t.check(k, now + 100 * MS), Verdict::Allow);
        assert!(matches!(t.check(k, now + 100 * MS), Verdict::Deny(_)));
        // a quiet second refills the burst
        for _ in 0..6 {
            assert_eq!(t.check(k, now + 2000 * MS), Verdict::Allow);
        }
    }

    #[test]
    fn keys_are_separate_and_burst_zero_is_strict() {
        let t = Table::new(&spec(2, 1000, 0, 100), None).unwrap();
        let a = t.key("10.0.0.1".parse().unwrap(), None).unwrap();
        let b = t.key("10.0.0.2".parse().unwrap(), None).unwrap();
        assert_eq!(t.check(a, 0), Verdict::Allow);
        assert!(matches!(t.check(a, 0), Verdict::Deny(_)));
        assert_eq!(t.check(b, 0), Verdict::Allow);
        assert_eq!(t.check(a, 500 * MS), Verdict::Allow);
    }

    #[test]
    fn header_key_and_missing_header() {
        let mut s = spec(1, 1000, 0, 100);
        s.key = LimitKey::parse("header:X-Api-Key").unwrap();
        let ip = "10.0.0.1".parse().unwrap();
        let t = Table::new(&s, None).unwrap();
        assert_ne!(t.key(ip, Some(b"k1")), t.key(ip, Some(b"k2")));
        assert_eq!(t.key(ip, None), t.key(ip, None)); // by address
        s.missing_allow = true;
        let t = Table::new(&s, None).unwrap();
        assert_eq!(t.key(ip, None), None);
        assert!(LimitKey::parse("header:bad name").is_err());
        assert!(LimitKey::parse("cookie").is_err());
    }

    #[test]
    fn least_recently_seen_key_is_evicted() {
        let t = Table::new(&spec(1, 1000, 0, 4), None).unwrap();
        assert_eq!(t.state.shards.len(), 1);
        for k in 1..=4 {
            assert_eq!(t.check(k, 0), Verdict::Allow);
        }
        assert!(matches!(t.check(1, 0), Verdict::Deny(_))); // 1 is now the most recent
        assert_eq!(t.check(5, 0), Verdict::Allow); // evicts 2
        assert_eq!(t.len(), 4);
        assert_eq!(t.check(2, 0), Verdict::Allow, "2 was forgotten"); // evicts 3
        assert!(matches!(t.check(1, 0), Verdict::Deny(_)), "1 was kept");
        assert!(matches!(t.check(4, 0), Verdict::Deny(_)), "4 was kept");
    }

    #[test]
    fn reload_keeps_state_when_the_key_is_the_same() {
        let t = Table::new(&spec(1, 1000, 0, 100), None).unwrap();
        assert_eq!(t.check(7, 0), Verdict::Allow);
        let u = Table::new(&spec(1, 2000, 0, 100), Some(&t)).unwrap();
        assert!(matches!(u.check(7, 0), Verdict::Deny(_)));
        let mut other = spec(1, 1000, 0, 100);
        other.key = LimitKey::parse("header:x-k").unwrap();
        let v = Table::new(&other, Some(&u)).unwrap();
        assert!(v.is_empty());
    }

    #[test]
    fn validates() {
        assert!(Table::new(&spec(0, 1000, 0, 10), None).is_err());
        assert!(Table::new(&spec(1, 1000, 0, 0), None).is_err());
        let mut s = spec(1, 1000, 0, 10);
        s.status = 200;
        assert!(Table::new(&s, None).is_err());
    }

    #[test]
    fn raw_header_lookup() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nX-Api-Key:  k1 \r\nx-api-key: k2\r\n\r\n";
        assert_eq!(raw_header(head, b"x-api-key"), Some(&b"k1"[..]));
        assert_eq!(raw_header(head, b"x-api"), None);
        assert_eq!(
            raw_header(b"GET / HTTP/1.1\r\n\r\nx-api-key: body", b"x-api-key"),
            None
        );
    }

    proptest! {
        // Whatever keys arrive, the table never holds more than max_keys
        // and a key never gets more than burst + 1 requests at one instant.
        #[test]
        fn bounded_and_never_over_burst(keys in proptest::collection::vec(any::<u64>(), 1..2000),
                                         max_keys in 1usize..300, burst in 0u64..5) {
            let t = Table::new(&spec(1, 1000, burst, max_keys), None).unwrap();
            let shards = t.state.shards.len();
            for &k in &keys {
                t.check(k, 0); // hostile: any key at all
                prop_assert!(t.len() <= max_keys.div_ceil(shards) * shards);
            }
            // keys of one shard, no more than it holds: exact counts
            let t = Table::new(&spec(1, 1000, burst, max_keys), None).unwrap();
            let per = t.state.shards[0].lock().unwrap().cap as u64;
            let mut allowed = std::collections::HashMap::<u64, u64>::new();
            for &k in &keys {
                if t.check(k % per, 0) == Verdict::Allow {
                    *allowed.entry(k % per).or_default() += 1;
                }
            }
            for (_, n) in allowed {
                prop_assert_eq!(n.min(burst + 1), n);
            }
        }

        #[test]
        fn raw_header_never_panics(head in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = raw_header(&head, b"x-api-key");
        }
    }

    #[test]
    fn exact_across_threads() {
        let t = Arc::new(Table::new(&spec(1, 1_000_000, 999, 1000), None).unwrap());
        let allowed = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        if t.check(42, 5) == Verdict::Allow {
                            allowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(allowed.into_inner(), 1000);
    }
}
