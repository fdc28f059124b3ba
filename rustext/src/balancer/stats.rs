//! Counters kept per worker thread and summed on read.
//!
//! Each worker writes only its own [`WorkerStats`] (relaxed atomics, no
//! locks, no cache-line sharing between workers); readers add them up.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the latency histogram buckets, in microseconds (+Inf last).
pub const LATENCY_BOUNDS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];
pub const BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

/// Add to a counter that has a single writer (its worker thread): a plain
/// load and store, no locked read-modify-write; readers on other threads
/// still see whole values.
#[inline]
pub fn bump(a: &AtomicU64, n: u64) {
    a.store(a.load(Relaxed).wrapping_add(n), Relaxed);
}

/// Hashes a `u64` id to itself (ids are sequential and local: no flooding
/// to fear), for the per-worker maps keyed by connection or backend id.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A map keyed by a `u64` id.
pub type IdMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

#[derive(Default)]
#[repr(align(128))]
pub struct WorkerStats {
    pub connections_total: AtomicU64,
    pub connections_active: AtomicI64,
    pub requests: AtomicU64,
    /// Responses by class: 1xx..5xx.
    pub responses: [AtomicU64; 5],
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub retries: AtomicU64,
    /// Requests answered by the balancer itself: no backend (503).
    pub no_backend: AtomicU64,
    /// Backend transport errors answered with 502.
    pub backend_errors: AtomicU64,
    /// Backend timeouts answered with 504.
    pub timeouts: AtomicU64,
    /// Connections closed at accept: their address was at `max_client_connections`.
    pub clients_refused: AtomicU64,
    pub latency: [AtomicU64; BUCKETS],
    pub latency_sum_us: AtomicU64,
    /// Connections closed on an `accept_proxy` listener: PROXY header missing, invalid or late.
    pub proxy_refused: AtomicU64,
    /// Requests refused by the rate limit (429).
    pub rate_limited: AtomicU64,
    /// Requests held back by a rate limit in delay mode (then sent on).
    pub rate_delayed: AtomicU64,
    /// Responses compressed, and their body bytes before and after (counted as they stream).
    pub compressed: AtomicU64,
    pub compress_in: AtomicU64,
    pub compress_out: AtomicU64,
}

impl WorkerStats {
    #[inline]
    pub fn observe(&self, status: u16, elapsed: Duration) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        bump(&self.responses[class], 1);
        let us = elapsed.as_micros() as u64;
        let b = LATENCY_BOUNDS_US.partition_point(|&bound| bound < us);
        bump(&self.latency[b], 1);
        bump(&self.latency_sum_us, us);
    }
}

/// A plain sum of all workers' counters.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub connections_total: u64,
    pub connections_active: i64,
    pub requests: u64,
    pub responses: [u64; 5],
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub retries: u64,
    pub no_backend: u64,
    pub backend_errors: u64,
    pub timeouts: u64,
    pub clients_refused: u64,
    pub latency: [u64; BUCKETS],
    pub latency_sum_us: u64,
    pub proxy_refused: u64,
    pub rate_limited: u64,
    pub rate_delayed: u64,
    pub compressed: u64,
    pub compress_in: u64,
    pub compress_out: u64,
}

impl Totals {
    pub fn add(&mut self, w: &WorkerStats) {
        self.connections_total += w.connections_total.load(Relaxed);
        self.clients_refused += w.clients_refused.load(Relaxed);
        self.connections_active += w.connections_active.load(Relaxed);
        self.requests += w.requests.load(Relaxed);
        for i in 0..5 {
            self.responses[i] += w.responses[i].load(Relaxed);
        }
        self.bytes_in += w.bytes_in.load(Relaxed);
        self.bytes_out += w.bytes_out.load(Relaxed);
        self.retries += w.retries.load(Relaxed);
        self.no_backend += w.no_backend.load(Relaxed);
        self.backend_errors += w.backend_errors.load(Relaxed);
        self.timeouts += w.timeouts.load(Relaxed);
        for i in 0..BUCKETS {
            self.latency[i] += w.latency[i].load(Relaxed);
        }
        self.latency_sum_us += w.latency_sum_us.load(Relaxed);
        self.proxy_refused += w.proxy_refused.load(Relaxed);
        self.rate_limited += w.rate_limited.load(Relaxed);
        self.rate_delayed += w.rate_delayed.load(Relaxed);
        self.compressed += w.compressed.load(Relaxed);
        self.compress_in += w.compress_in.load(Relaxed);
        self.compress_out += w.compress_out.load(Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_sum() {
        let a = WorkerStats::default();
        let b = WorkerStats::default();
        a.observe(200, Duration::from_micros(50));
        a.observe(503, Duration::from_micros(100));
        b.observe(404, Duration::from_secs(60));
        let mut t = Totals::default();
        t.add(&a);
        t.add(&b);
        assert_eq!(t.responses, [0, 1, 0, 1, 1]);
        assert_eq!(t.latency[0], 2);
        assert_eq!(t.latency[BUCKETS - 1], 1);
    }
}
