//! What the worker's housekeeping knows of one client connection and may
//! ask of it ([`ConnCtl`]), and the count of open client connections
//! ([`OpenSlot`], `max_open_connections`). Below the worker state (which
//! holds them) and the socket wrappers of both paths (which mark their
//! connection active), so that neither needs to import the other.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::stats::{IdMap, WorkerStats};

/// Client connections open over every listener, counted when
/// `max_open_connections` is set; the accept loops wait on `closed` at the limit.
pub struct OpenConns {
    count: std::sync::atomic::AtomicUsize,
    closed: tokio::sync::Notify,
    /// `max_open_connections`.
    limit: usize,
}

impl OpenConns {
    pub fn new(limit: usize) -> Self {
        OpenConns { count: Default::default(), closed: Default::default(), limit }
    }
}

/// One client connection counted against `max_open_connections` (taken
/// before its accept, so the limit is never passed); uncounted on drop.
pub struct OpenSlot(Arc<OpenConns>);

impl OpenSlot {
    /// A slot for one more connection, or None at the limit.
    pub fn try_take(open: &Arc<OpenConns>) -> Option<OpenSlot> {
        let limit = open.limit;
        let count = &open.count;
        let mut n = count.load(Relaxed);
        loop {
            if n >= limit {
                return None;
            }
            match count.compare_exchange_weak(n, n + 1, std::sync::atomic::Ordering::AcqRel, Relaxed) {
                Ok(_) => return Some(OpenSlot(open.clone())),
                Err(now) => n = now,
            }
        }
    }

    /// Whether one more connection may be accepted now.
    pub fn available(open: &OpenConns) -> bool {
        open.count.load(Relaxed) < open.limit
    }

    /// Resolves once a connection closes (create it before checking the
    /// limit: a close between the two still wakes it).
    pub fn closed(open: &OpenConns) -> tokio::sync::futures::Notified<'_> {
        open.closed.notified()
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        let s = &self.0;
        if s.count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) >= s.limit {
            s.closed.notify_waiters();
        }
    }
}

/// What the worker's housekeeping knows of one client connection, and what
/// it may ask of it.
#[derive(Default)]
pub struct ConnCtl {
    /// Set by every read or write (idle timeout).
    pub active: AtomicBool,
    /// A request is being handled (from its head to the end of its response).
    busy: AtomicBool,
    /// Coarse time the current request head started to arrive (0: none).
    head_since: AtomicU64,
    /// Finish the exchange in flight, then close.
    pub close: AtomicBool,
    /// Close now (slowloris).
    pub abort: AtomicBool,
    /// The listener slot it was accepted on (closed with its listener).
    pub listener: std::sync::atomic::AtomicUsize,
    pub waker: Mutex<Option<std::task::Waker>>,
    /// Its place under `max_open_connections`, given back when the last
    /// holder (the connection's task, the worker's map) lets go.
    pub open: Option<OpenSlot>,
}

impl ConnCtl {
    /// A connection just accepted on listener slot `listener`: active from
    /// the start (an idle check right after the accept must not close it
    /// before its request is read).
    pub fn accepted(listener: usize, open: Option<OpenSlot>) -> ConnCtl {
        let ctl = ConnCtl { open, ..ConnCtl::default() };
        ctl.listener.store(listener, Relaxed);
        ctl.active.store(true, Relaxed);
        ctl
    }

    /// Bytes arrived: outside a request they start a request head.
    #[inline]
    pub fn reading(&self, now: u64) {
        if !self.busy.load(Relaxed) && self.head_since.load(Relaxed) == 0 {
            self.head_since.store(now, Relaxed);
        }
    }
    #[inline]
    pub fn begin(&self) {
        self.busy.store(true, Relaxed);
        self.head_since.store(0, Relaxed);
    }
    #[inline]
    pub fn end(&self) {
        self.busy.store(false, Relaxed);
    }
    /// Between requests with no byte of the next one read.
    pub fn at_rest(&self) -> bool {
        !self.busy.load(Relaxed) && self.head_since.load(Relaxed) == 0
    }
    pub fn head_overdue(&self, now: u64, limit: Duration) -> bool {
        let since = self.head_since.load(Relaxed);
        since != 0
            && !self.busy.load(Relaxed)
            && now.saturating_sub(since) > limit.as_millis() as u64
    }
    fn wake(&self) {
        if let Some(w) = self
            .waker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            w.wake_by_ref();
        }
    }
    pub fn ask_close(&self) {
        self.close.store(true, Relaxed);
        self.wake();
    }
    pub fn ask_abort(&self) {
        self.abort.store(true, Relaxed);
        self.wake();
    }
}

/// The live client connections of one worker: the housekeeping task closes
/// idle ones and, on drain, all of them (so a connection's own task polls
/// nothing but its connection).
#[derive(Default)]
pub struct Conns {
    pub next: AtomicU64,
    pub map: Mutex<IdMap<Arc<ConnCtl>>>,
}

impl Conns {
    /// Register a connection: the housekeeping sees it from now on.
    pub fn add(&self, ctl: Arc<ConnCtl>) -> u64 {
        let id = self.next.fetch_add(1, Relaxed);
        self.map.lock().unwrap_or_else(|e| e.into_inner()).insert(id, ctl);
        id
    }
    pub fn forget(&self, id: u64) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }
}

/// Counts a client connection for as long as it lives.
pub struct ConnCount(Arc<WorkerStats>);
impl ConnCount {
    pub fn new(stats: &Arc<WorkerStats>) -> Self {
        stats.connections_total.fetch_add(1, Relaxed);
        stats.connections_active.fetch_add(1, Relaxed);
        ConnCount(stats.clone())
    }
}
impl Drop for ConnCount {
    fn drop(&mut self) {
        self.0.connections_active.fetch_sub(1, Relaxed);
    }
}
