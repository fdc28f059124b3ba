//! The attempt policy of one request, shared by both paths ([`super::fast`]
//! and [`super::proxy`]): which backend to try next, which requests may be
//! replayed, and the time each attempt may wait.
//!
//! - A request moves on to another backend while nothing of it was sent
//!   (connect refused, a pooled connection found closed), up to
//!   `retries + 1` attempts, each backend tried once.
//! - Once sent, only an idempotent request without a body is replayed (on a
//!   reset before any response byte); a timed-out one never is.
//! - Each attempt first takes a slot of the backend's concurrency limit,
//!   waiting up to `queue_timeout` (no slot: 503), and holds it as a
//!   [`Lease`] for as long as the exchange lasts.
//! - The response wait is `response_timeout`, cut short by `total_timeout`
//!   counted from the request's arrival.
//! - With `retry_on` (HAProxy's `retry-on`), a replayable request whose
//!   response has one of the listed statuses, or did not come in time
//!   (`response-timeout`), goes to another server while attempts are left
//!   and another server is there to take it; otherwise the last response is
//!   the answer. A request that is not replayable is never sent twice.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use super::worker::Worker;
use super::stats::bump;
use super::upstream::{Backend, Key, Upstream};

pub use super::h1::idempotent;

/// A slot of the backend's concurrency limit (none needed when unlimited),
/// waiting in its queue up to `queue_timeout`.
pub async fn acquire_slot(
    backend: &Arc<Backend>,
    queue_timeout: Duration,
) -> Result<Option<OwnedSemaphorePermit>, ()> {
    if !backend.limited() {
        return Ok(None);
    }
    match backend.limiter.clone().try_acquire_owned() {
        Ok(p) => Ok(Some(p)),
        Err(_) => match tokio::time::timeout(queue_timeout, backend.limiter.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(Some(p)),
            _ => Err(()),
        },
    }
}

/// Holds a backend slot for as long as its response streams.
pub struct Lease {
    pub(super) backend: Arc<Backend>,
    pub(super) _permit: Option<OwnedSemaphorePermit>,
}

impl Lease {
    pub fn new(backend: Arc<Backend>, permit: Option<OwnedSemaphorePermit>) -> Self {
        backend.active.fetch_add(1, Relaxed);
        Lease {
            backend,
            _permit: permit,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.backend.active.fetch_sub(1, Relaxed);
    }
}

/// What [`Attempts::next`] gives.
pub enum Next {
    /// Try this backend, holding this slot.
    Try(Arc<Backend>, Lease),
    /// The chosen backend's queue stayed full for `queue_timeout`: answer 503.
    QueueFull,
    /// No attempt left (or no backend to try): answer from the last failure.
    Done,
}

/// The attempts of one request (see the module doc).
pub struct Attempts<'a> {
    up: &'a Upstream,
    retryable: bool,
    left: usize,
    made: usize,
    tried: super::tried::Tried,
    sent: bool,
    deadline: Option<Instant>,
    /// The server a persistence cookie points at, tried first if available.
    prefer: Option<usize>,
}

impl<'a> Attempts<'a> {
    /// `replayable`: the request is idempotent, has no body and is not an
    /// upgrade, so it may be sent again after a reset.
    pub fn new(up: &'a Upstream, start: Instant, replayable: bool) -> Self {
        let s = &up.settings;
        Attempts {
            up,
            retryable: replayable,
            left: s.retries as usize + 1,
            made: 0,
            tried: Default::default(),
            sent: false,
            deadline: (!s.total_timeout.is_zero()).then(|| start + s.total_timeout),
            prefer: None,
        }
    }

    /// Attempts after the first one so far.
    pub fn retries(&self) -> u32 {
        self.made.saturating_sub(1) as u32
    }

    /// Whether the request may be replayed once sent.
    pub fn replayable(&self) -> bool {
        self.retryable
    }

    /// Whether another attempt could follow the one about to be made.
    pub fn more_after_this(&self) -> bool {
        self.left > 0
    }

    /// The next backend and its slot (a retry is counted in `w`'s stats).
    pub async fn next(&mut self, w: &Worker, key: &Key<'_>) -> Next {
        if self.left == 0 || (self.sent && !self.retryable) {
            return Next::Done; // out of attempts, or the request is gone: never replayed
        }
        let pinned = self.prefer.take().filter(|&i| {
            !self.tried.contains(i) && self.up.backends.get(i).is_some_and(|b| b.available())
        });
        let Some(i) = pinned.or_else(|| self.up.select(key, &self.tried)) else {
            return Next::Done;
        };
        self.left -= 1;
        self.tried.insert(i);
        let backend = self.up.backends[i].clone();
        if self.made > 0 {
            bump(&w.stats.retries, 1);
        }
        self.made += 1;
        let Ok(permit) = acquire_slot(&backend, self.up.settings.queue_timeout).await else {
            bump(&w.stats.no_backend, 1);
            return Next::QueueFull;
        };
        let lease = Lease::new(backend.clone(), permit);
        backend.stats.requests.fetch_add(1, Relaxed);
        Next::Try(backend, lease)
    }

    /// The attempt on `backend` failed; `sent`: the request (or part of it)
    /// reached the backend.
    pub fn failed(&mut self, backend: &Backend, sent: bool) {
        let s = &self.up.settings;
        backend.record_failure(s.eject_after, s.ejection());
        self.sent |= sent;
    }

    /// Try server `i` first (persistence), if it is available; otherwise
    /// the pool's algorithm chooses (HAProxy's `option redispatch`).
    pub fn prefer(&mut self, i: Option<usize>) {
        self.prefer = i;
    }

    /// Whether the response `status` of the attempt just made is dropped
    /// for another attempt (see the module doc); if so, the attempt counts
    /// as sent. `key` is the request's, to check another server is there.
    pub fn retry_status(&mut self, status: u16, key: &Key<'_>) -> bool {
        if self.up.policy.retries_status(status) && self.another(key) {
            self.sent = true;
            return true;
        }
        false
    }

    /// Whether a response timeout moves the request to another server.
    pub fn retry_timeout(&self, key: &Key<'_>) -> bool {
        self.up.policy.retry_timeout && self.another(key)
    }

    /// A replayable request with an attempt left and a server not tried yet.
    fn another(&self, key: &Key<'_>) -> bool {
        self.retryable && self.left > 0 && self.up.select(key, &self.tried).is_some()
    }

    /// Passive health of a response from `backend` (layer 7 when
    /// configured: an error status is a failure).
    pub fn observe(&self, backend: &Backend, status: u16) {
        let s = &self.up.settings;
        self.up.policy.observe(backend, status, s.eject_after, s.ejection());
    }

    /// How long this attempt may wait for the response head.
    pub fn response_wait(&self) -> Duration {
        let wait = self.up.settings.response_timeout;
        match self.deadline {
            Some(d) => wait.min(d.saturating_duration_since(Instant::now())),
            None => wait,
        }
    }

    /// When the whole exchange must be over (`total_timeout`), if set.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotent_methods_are_rfc_9110s() {
        for m in ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"] {
            assert!(idempotent(m.as_bytes()), "{m}");
        }
        for m in ["POST", "PATCH", "CONNECT", "get", "PROPFIND", ""] {
            assert!(!idempotent(m.as_bytes()), "{m}");
        }
    }
}
