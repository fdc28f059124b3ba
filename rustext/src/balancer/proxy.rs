//! One request through hyper's path: pick a backend, forward, stream back.
//! Connections come here from the fast path ([`super::fast`]) when a request
//! needs more than it handles (Upgrade, `Expect`, chunked or large bodies,
//! odd heads); the semantics are the same.
//!
//! Framing toward the client is hyper's: a response without a length goes
//! chunked to HTTP/1.1 clients and close-delimited (then `Connection: close`)
//! to HTTP/1.0 ones, which never see chunked encoding. Bodies stream frame by
//! frame in both directions; nothing is buffered whole.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{
    header, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version,
};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::sync::OwnedSemaphorePermit;

use super::attempts::{idempotent, Attempts, Next};
use tokio::time::Sleep;

use super::config::{Config, HashKey, Proto};
use super::pool::{BackendConn, Fail, Pool};
use super::stats::{bump, WorkerStats};
use super::route::{Action, Table, View};
use super::upstream::{Backend, Key, Upstream};

pub type BoxError = Box<dyn StdError + Send + Sync>;

/// State shared by every worker of one balancer.
pub struct Shared {
    pub config: Config,
    /// Pools and routes, swapped whole on reload.
    pub table: RwLock<Arc<Table>>,
    pub workers: Vec<Arc<WorkerStats>>,
    pub epoch: Instant,
    /// Source of backend ids (pool keys).
    pub ids: std::sync::atomic::AtomicU64,
    /// Open client connections per client address (with `max_client_connections`).
    pub per_client: Mutex<std::collections::HashMap<IpAddr, u32>>,
    /// Open client connections over every listener (with `max_open_connections`).
    pub open: OpenConns,
    /// The access log, if configured.
    pub access_log: super::accesslog::AccessLog,
    /// Each listener's bound address, as the access log names it (`%ft`), by slot.
    pub frontends: super::listeners::Slots<String>,
    /// Each listener's bound address (the destination a PROXY header sent
    /// to a backend names, unless the client's own header gave one), by slot.
    pub bound: super::listeners::Slots<SocketAddr>,
}

/// Client connections open over every listener, counted when
/// `max_open_connections` is set; the accept loops wait on `closed` at the limit.
#[derive(Default)]
pub struct OpenConns {
    count: std::sync::atomic::AtomicUsize,
    closed: tokio::sync::Notify,
}

/// One client connection counted against `max_open_connections` (taken
/// before its accept, so the limit is never passed); uncounted on drop.
pub struct OpenSlot(Arc<Shared>);

impl OpenSlot {
    /// A slot for one more connection, or None at the limit.
    pub fn try_take(shared: &Arc<Shared>) -> Option<OpenSlot> {
        let limit = shared.config.max_open_connections;
        let count = &shared.open.count;
        let mut n = count.load(Relaxed);
        loop {
            if n >= limit {
                return None;
            }
            match count.compare_exchange_weak(n, n + 1, std::sync::atomic::Ordering::AcqRel, Relaxed) {
                Ok(_) => return Some(OpenSlot(shared.clone())),
                Err(now) => n = now,
            }
        }
    }

    /// Whether one more connection may be accepted now.
    pub fn available(shared: &Shared) -> bool {
        shared.open.count.load(Relaxed) < shared.config.max_open_connections
    }

    /// Resolves once a connection closes (create it before checking the
    /// limit: a close between the two still wakes it).
    pub fn closed(shared: &Shared) -> tokio::sync::futures::Notified<'_> {
        shared.open.closed.notified()
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        let s = &self.0;
        if s.open.count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) >= s.config.max_open_connections {
            s.open.closed.notify_waiters();
        }
    }
}

/// A client address already at `max_client_connections`.
#[derive(Debug)]
pub struct OverClientLimit;

/// A client connection counted against its address's limit; uncounted on drop.
pub struct ClientSlot {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl ClientSlot {
    /// A slot for a new connection from `ip`, or None when that address
    /// already has `max_client_connections` open (0: no limit, no slot needed).
    pub fn take(shared: &Arc<Shared>, ip: IpAddr) -> Result<Option<ClientSlot>, OverClientLimit> {
        let limit = shared.config.max_client_connections;
        if limit == 0 {
            return Ok(None);
        }
        let mut map = shared.per_client.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n as usize >= limit {
            return Err(OverClientLimit);
        }
        *n += 1;
        Ok(Some(ClientSlot { shared: shared.clone(), ip }))
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut map = self.shared.per_client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

impl Shared {
    #[inline]
    pub fn table(&self) -> Arc<Table> {
        self.table
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// One worker thread's view: its own stats and backend connection pool.
pub struct Worker {
    pub shared: Arc<Shared>,
    pub stats: Arc<WorkerStats>,
    pub pool: Pool,
    /// The fast path's backend connections.
    pub fast_pool: super::fast::FastPool,
    pub clock: Clock,
    /// The forwarding headers of the last client address seen: clients
    /// that open a connection per request (HTTP/1.0, `ab`) mostly come from
    /// a few addresses, and formatting an IP costs more than the lookup.
    pub last_peer: PeerCache,
    /// Generates this worker's request ids.
    pub ids: super::route::RequestIds,
    /// This worker's access log lines not yet handed to the writer.
    pub log: super::accesslog::LogBuf,
    /// HTTP/2 connections to the backends of `proto = "h2"` pools.
    pub h2_pool: super::h2pool::H2Pool,
}

#[derive(Default)]
pub struct PeerCache(Mutex<Option<(IpAddr, HeaderValue, HeaderValue)>>);

/// A coarse clock advanced by the worker's housekeeping tick (ms, from 1).
pub struct Clock {
    start: Instant,
    ms: AtomicU64,
}

impl Default for Clock {
    fn default() -> Self {
        Clock {
            start: Instant::now(),
            ms: AtomicU64::new(1),
        }
    }
}

impl Clock {
    #[inline]
    pub fn now(&self) -> u64 {
        self.ms.load(Relaxed)
    }
    pub fn advance(&self) -> u64 {
        let ms = self.start.elapsed().as_millis() as u64 + 1;
        self.ms.store(ms, Relaxed);
        ms
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

/// Per client connection, computed once: the peer and its forwarding headers.
pub struct Peer {
    pub ip: IpAddr,
    pub port: u16,
    pub xff: HeaderValue,
    pub forwarded: HeaderValue,
    pub ctl: Arc<ConnCtl>,
    /// The client came over TLS (X-Forwarded-Proto / Forwarded proto=https).
    pub https: bool,
    /// The listener it connected to (its routes).
    pub listener: usize,
    /// The address the client connected to, when a PROXY header said it
    /// (else the listener's: see [`Peer::local_addr`]).
    pub local: Option<SocketAddr>,
    /// The client came over a Unix socket (no PROXY header): it has no
    /// address; logged as `unix` (HAProxy's `%ci`), none forwarded.
    pub unix: bool,
    /// As HAProxy: a backend connection opened with this client's PROXY
    /// header (`send_proxy`), kept for its next requests to that backend
    /// (by id); closed with the client connection, never shared.
    pub private: Mutex<Option<(u64, super::pool::BackendConn)>>,
}

impl Peer {
    /// The address the client connected to (a PROXY header sent to a backend names it).
    pub fn local_addr(&self, shared: &Shared) -> SocketAddr {
        self.local
            .or_else(|| shared.bound.get(self.listener).copied())
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    pub fn new(addr: SocketAddr, ctl: Arc<ConnCtl>) -> Self {
        Peer::with_proto(addr, ctl, false)
    }

    pub fn with_proto(addr: SocketAddr, ctl: Arc<ConnCtl>, https: bool) -> Self {
        let ip = addr.ip();
        let text = ip.to_string();
        let proto = if https { "https" } else { "http" };
        let forwarded = match ip {
            IpAddr::V4(_) => format!("for={text};proto={proto}"),
            IpAddr::V6(_) => format!("for=\"[{text}]\";proto={proto}"),
        };
        Peer {
            ip,
            port: addr.port(),
            xff: HeaderValue::from_str(&text).expect("an IP is a valid header value"),
            forwarded: HeaderValue::from_str(&forwarded)
                .expect("for=IP;proto=http is a valid header value"),
            ctl,
            https,
            listener: 0,
            local: None,
            unix: false,
            private: Mutex::new(None),
        }
    }

    /// A client on a Unix socket: as HAProxy, no address to forward (no
    /// X-Forwarded-For or Forwarded value appended), logged as `unix`.
    pub fn set_unix(&mut self) {
        self.xff = HeaderValue::from_static("");
        self.forwarded = HeaderValue::from_static("");
        self.unix = true;
    }

    /// As `new`, reusing the header values when the address is the cached one.
    pub fn cached(addr: SocketAddr, ctl: Arc<ConnCtl>, cache: &PeerCache) -> Self {
        let ip = addr.ip();
        let mut g = cache.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((cip, xff, fwd)) = g.as_ref() {
            if *cip == ip {
                return Peer {
                    ip,
                    port: addr.port(),
                    xff: xff.clone(),
                    forwarded: fwd.clone(),
                    ctl,
                    https: false,
                    listener: 0,
                    local: None,
                    unix: false,
                    private: Mutex::new(None),
                };
            }
        }
        let p = Peer::new(addr, ctl);
        *g = Some((ip, p.xff.clone(), p.forwarded.clone()));
        p
    }
}

/// Headers that belong to one connection, not to the message (RFC 9110 §7.6.1).
fn is_hop_by_hop(n: &HeaderName) -> bool {
    matches!(
        n.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

fn strip_hop_by_hop(h: &mut HeaderMap) {
    // One pass over the names; most messages carry none of them or just
    // `Connection: keep-alive`, handled without allocating.
    let mut found: [Option<HeaderName>; 4] = Default::default();
    let mut n = 0;
    let mut more: Vec<HeaderName> = Vec::new();
    for name in h.keys() {
        if is_hop_by_hop(name) {
            if n < found.len() {
                found[n] = Some(name.clone());
                n += 1;
            } else {
                more.push(name.clone());
            }
        }
    }
    if n == 0 {
        return;
    }
    if let Some(conn) = h.get(header::CONNECTION) {
        let v = conn.as_bytes();
        if !v.eq_ignore_ascii_case(b"keep-alive") && !v.eq_ignore_ascii_case(b"close") {
            for t in conn.to_str().unwrap_or("").split(',') {
                let t = t.trim();
                if !t.is_empty()
                    && !t.eq_ignore_ascii_case("close")
                    && !t.eq_ignore_ascii_case("keep-alive")
                    && !crate::balancer::h1::never_nominated(t.as_bytes())
                {
                    if let Ok(name) = HeaderName::from_bytes(t.as_bytes()) {
                        more.push(name);
                    }
                }
            }
        }
    }
    for name in found.into_iter().flatten().chain(more) {
        h.remove(name);
    }
}

fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .unwrap_or("")
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const FORWARDED: HeaderName = HeaderName::from_static("forwarded");

fn append_list(h: &mut HeaderMap, name: HeaderName, item: &[u8]) {
    let joined = {
        let mut prev = h.get_all(&name).iter().peekable();
        if prev.peek().is_none() {
            None
        } else {
            let mut v = Vec::with_capacity(64);
            for p in prev {
                v.extend_from_slice(p.as_bytes());
                v.extend_from_slice(b", ");
            }
            v.extend_from_slice(item);
            HeaderValue::from_bytes(&v).ok()
        }
    };
    match joined {
        Some(v) => {
            h.insert(name, v);
        }
        None => {
            if let Ok(v) = HeaderValue::from_bytes(item) {
                h.insert(name, v);
            }
        }
    }
}

fn add_forwarded(h: &mut HeaderMap, peer: &Peer) {
    if peer.xff.is_empty() {
        // a client on a Unix socket: no address to forward (as HAProxy)
        let proto = if peer.https { "https" } else { "http" };
        h.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
        return;
    }
    // One growth of the map (hyper sizes it to the parsed headers), one
    // hash per name.
    h.reserve(3);
    if h.contains_key(&X_FORWARDED_FOR) {
        append_list(h, X_FORWARDED_FOR, peer.xff.as_bytes());
    } else {
        h.insert(X_FORWARDED_FOR, peer.xff.clone());
    }
    h.insert(X_FORWARDED_PROTO, HeaderValue::from_static(if peer.https { "https" } else { "http" }));
    if h.contains_key(&FORWARDED) {
        append_list(h, FORWARDED, peer.forwarded.as_bytes());
    } else {
        h.insert(FORWARDED, peer.forwarded.clone());
    }
}

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

/// How far a request body got: lets the response timeout wait for a long
/// upload, and tells a client abort from a backend failure.
#[derive(Default)]
pub struct Progress {
    frames: std::sync::atomic::AtomicU64,
    /// Body bytes passed on to the backend (the access log's `%U`).
    bytes: std::sync::atomic::AtomicU64,
    client_failed: std::sync::atomic::AtomicBool,
}

impl Progress {
    /// Request body frames passed on so far.
    pub fn frames(&self) -> u64 {
        self.frames.load(Relaxed)
    }
}

/// The request body sent to a backend: the client's, counted, or nothing.
pub enum ReqBody {
    /// The frames read ahead (see [`prebuffer`]), then the rest of the client's body, if any.
    Client(std::collections::VecDeque<Frame<Bytes>>, Option<Incoming>, Arc<WorkerStats>, Arc<Progress>),
    Empty,
}

/// Request bodies up to this size are read whole before anything is
/// forwarded (a body whose framing is broken is then refused with 400
/// instead of reaching a backend cut short); larger ones stream from there.
pub const PREBUFFER_LIMIT: usize = 64 * 1024;

/// What [`prebuffer`] read.
pub enum Prebuffered {
    /// Frames read ahead, and the rest of the body when it was not all read.
    Ok(std::collections::VecDeque<Frame<Bytes>>, Option<Incoming>),
    /// The client's body is malformed (bad chunk framing, short of its length).
    Malformed,
}

/// Read the start of a request body: until its end, [`PREBUFFER_LIMIT`]
/// bytes, or `wait` (a slow uploader then streams as before).
pub async fn prebuffer(mut body: Incoming, wait: Duration, stats: &WorkerStats) -> Prebuffered {
    use http_body_util::BodyExt;
    let mut frames = std::collections::VecDeque::new();
    let mut total = 0usize;
    let deadline = tokio::time::Instant::now() + wait;
    while total <= PREBUFFER_LIMIT {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    total += d.len();
                    bump(&stats.bytes_in, d.len() as u64);
                }
                frames.push_back(f);
            }
            Ok(Some(Err(_))) => return Prebuffered::Malformed,
            Ok(None) => return Prebuffered::Ok(frames, None),
            Err(_) => break,
        }
    }
    Prebuffered::Ok(frames, Some(body))
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ReqBody::Client(ahead, rest, stats, progress) => {
                if let Some(f) = ahead.pop_front() {
                    progress.frames.fetch_add(1, Relaxed);
                    if let Some(d) = f.data_ref() {
                        progress.bytes.fetch_add(d.len() as u64, Relaxed);
                    }
                    return Poll::Ready(Some(Ok(f)));
                }
                let Some(b) = rest else { return Poll::Ready(None) };
                let r = Pin::new(b).poll_frame(cx);
                match &r {
                    Poll::Ready(Some(Ok(f))) => {
                        if let Some(d) = f.data_ref() {
                            bump(&stats.bytes_in, d.len() as u64);
                            progress.bytes.fetch_add(d.len() as u64, Relaxed);
                        }
                        progress.frames.fetch_add(1, Relaxed);
                    }
                    Poll::Ready(Some(Err(_))) => progress.client_failed.store(true, Relaxed),
                    _ => {}
                }
                r
            }
            ReqBody::Empty => Poll::Ready(None),
        }
    }
    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Client(ahead, rest, _, _) => ahead.is_empty() && rest.as_ref().is_none_or(|b| b.is_end_stream()),
            ReqBody::Empty => true,
        }
    }
    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Client(ahead, rest, _, _) => {
                let n: u64 = ahead.iter().filter_map(|f| f.data_ref()).map(|d| d.len() as u64).sum();
                match rest {
                    None => SizeHint::with_exact(n),
                    Some(b) => {
                        let inner = b.size_hint();
                        let mut h = SizeHint::new();
                        // the upper bound first: set_lower refuses a lower above the upper
                        if let Some(u) = inner.upper() {
                            h.set_upper(u + n);
                        }
                        h.set_lower(inner.lower() + n);
                        h
                    }
                }
            }
            ReqBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// Holds a backend slot for as long as its response streams.
pub struct Lease {
    backend: Arc<Backend>,
    _permit: Option<OwnedSemaphorePermit>,
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

/// The response body sent to the client.
pub enum RespBody {
    Stream(Streaming),
    Full(Option<Bytes>),
}

pub struct Streaming {
    inner: Incoming,
    lease: Option<Lease>,
    worker: Arc<Worker>,
    peer: Arc<Peer>,
    /// The backend connection, pooled again if the body ends cleanly.
    conn: Option<Held>,
    deadline: Option<Pin<Box<Sleep>>>,
    bytes: u64,
    eject: (u32, Duration),
    /// The access log line, written when the body ends.
    log: Option<Box<HyperLog>>,
}

impl Streaming {
    fn finish(&mut self, clean: bool) {
        if let Some(lease) = self.lease.take() {
            if let Some(mut l) = self.log.take() {
                if !clean && l.term == "--" {
                    l.term = "CD";
                }
                l.emit(&self.worker, self.bytes, 0);
            }
            self.peer.ctl.end();
            lease.backend.stats.bytes_out.fetch_add(self.bytes, Relaxed);
            bump(&self.worker.stats.bytes_out, self.bytes);
            self.bytes = 0;
            if let Some(Held::H1(bc)) = self.conn.take() {
                if clean && bc.private {
                    if !bc.tx.is_closed() {
                        *self.peer.private.lock().unwrap_or_else(|e| e.into_inner()) = Some((lease.backend.id, bc));
                    }
                } else if clean {
                    self.worker.pool.put(lease.backend.id, bc);
                }
            }
        }
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        // hyper stops polling a body of known length at its last byte.
        let clean = self.inner.is_end_stream();
        self.finish(clean);
    }
}

#[derive(Debug)]
struct TotalTimeout;
impl std::fmt::Display for TotalTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("total timeout exceeded while streaming the response")
    }
}
impl StdError for TotalTimeout {}

impl Body for RespBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RespBody::Full(b) => Poll::Ready(b.take().map(|d| Ok(Frame::data(d)))),
            RespBody::Stream(s) => {
                if let Some(d) = s.deadline.as_mut() {
                    if d.as_mut().poll(cx).is_ready() {
                        bump(&s.worker.stats.timeouts, 1);
                        if let Some(l) = s.log.as_mut() {
                            l.term = "sD";
                        }
                        s.finish(false);
                        return Poll::Ready(Some(Err(Box::new(TotalTimeout))));
                    }
                }
                match Pin::new(&mut s.inner).poll_frame(cx) {
                    Poll::Ready(Some(Ok(f))) => {
                        if let Some(d) = f.data_ref() {
                            s.bytes += d.len() as u64;
                        } else if let (Some(t), Some(l)) = (f.trailers_ref(), s.log.as_mut()) {
                            // gRPC's status and trailing metadata: logged as response headers
                            l.keep_response(&s.worker, t);
                        }
                        Poll::Ready(Some(Ok(f)))
                    }
                    Poll::Ready(Some(Err(e))) => {
                        // The backend broke mid-body; the client connection is cut.
                        if let Some(l) = &s.lease {
                            l.backend.record_failure(s.eject.0, s.eject.1);
                        }
                        if let Some(l) = s.log.as_mut() {
                            l.term = "SD";
                        }
                        s.finish(false);
                        Poll::Ready(Some(Err(Box::new(e))))
                    }
                    Poll::Ready(None) => {
                        s.finish(true);
                        Poll::Ready(None)
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Full(b) => b.is_none(),
            RespBody::Stream(s) => s.inner.is_end_stream(),
        }
    }
    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            RespBody::Stream(s) => s.inner.size_hint(),
        }
    }
}

/// Marks an answer of the balancer's own (an error page may replace it).
#[derive(Clone, Copy)]
struct OwnAnswer;

fn error_response(status: StatusCode, msg: &'static str) -> Response<RespBody> {
    let mut r = Response::new(RespBody::Full(Some(Bytes::from_static(msg.as_bytes()))));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r.extensions_mut().insert(OwnAnswer);
    r
}

/// An own answer with its configured page instead of its one-line text:
/// the page's fields replace the text's type and caching; the others
/// (`Retry-After`, the request id) stay.
fn with_page(resp: &mut Response<RespBody>, page: &super::route::ErrorPage) {
    let h = resp.headers_mut();
    h.remove(header::CONTENT_TYPE);
    h.remove(header::CACHE_CONTROL);
    for (n, v) in &page.headers {
        h.append(n.clone(), v.clone());
    }
    *resp.body_mut() = RespBody::Full(Some(page.body.clone()));
}

/// Why a request is refused before anything is forwarded (RFC 9112 §3.2,
/// §6.1, RFC 9110 §7.2): the rules hyper's parser leaves to its user.
/// Framing errors hyper finds itself (malformed lines, fields, lengths,
/// chunk sizes) never reach here: it answers 400 on its own.
pub fn refuse_reason(version: Version, headers: &HeaderMap) -> Option<&'static str> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Some("more than one Host header field\n");
    }
    match host {
        None if version == Version::HTTP_11 => return Some("an HTTP/1.1 request needs a Host header field\n"),
        Some(h) if !valid_host(h.as_bytes()) => return Some("invalid Host header field\n"),
        _ => {}
    }
    if headers.get_all(header::TRANSFER_ENCODING).iter().nth(1).is_some() {
        return Some("more than one Transfer-Encoding header field\n");
    }
    let te = headers.contains_key(header::TRANSFER_ENCODING);
    if te && headers.contains_key(header::CONTENT_LENGTH) {
        return Some("Content-Length and Transfer-Encoding together\n");
    }
    if te && version == Version::HTTP_10 {
        return Some("Transfer-Encoding in an HTTP/1.0 request\n");
    }
    if headers.get_all(header::CONTENT_LENGTH).iter().nth(1).is_some() {
        return Some("more than one Content-Length header field\n");
    }
    // a fragment never reaches here: hyper's URI parser drops it (the fast path refuses it)
    None
}

/// `uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2): a reg-name or
/// IPv4 address (unreserved, pct-encoded, sub-delims), or an IP literal in
/// brackets; the port all digits. Empty is allowed (a target without an
/// authority). No userinfo, spaces or controls.
pub fn valid_host(h: &[u8]) -> bool {
    let (host, port) = if h.first() == Some(&b'[') {
        let Some(end) = h.iter().position(|&b| b == b']') else { return false };
        let lit = &h[1..end];
        if lit.is_empty() || !lit.iter().all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.') {
            return false;
        }
        match &h[end + 1..] {
            [] => (&h[..0], None),
            [b':', port @ ..] => (&h[..0], Some(port)),
            _ => return false,
        }
    } else {
        match h.iter().rposition(|&b| b == b':') {
            Some(i) => (&h[..i], Some(&h[i + 1..])),
            None => (h, None),
        }
    };
    let reg_name = host.iter().all(|&b| {
        b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(&b)
    });
    reg_name && port.is_none_or(|p| p.iter().all(u8::is_ascii_digit))
}

fn refused(reason: &'static str, h2: bool) -> Response<RespBody> {
    let mut r = error_response(StatusCode::BAD_REQUEST, reason);
    if !h2 {
        // what follows on the connection cannot be trusted to be framed as the client meant
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// What the access log line of a hyper-path request needs, kept until its
/// response ends (built only with an access log).
pub struct HyperLog {
    client: SocketAddr,
    unix: bool,
    t0: Instant,
    frontend: usize,
    method: http::Method,
    target: String,
    version: &'static str,
    req_headers: HeaderMap,
    res_headers: HeaderMap,
    rid: Vec<u8>,
    pool: String,
    server: String,
    pub term: &'static str,
    retries: u32,
    timings: super::accesslog::Timings,
    status: u16,
    /// How much of the request body went to the backend.
    progress: Option<Arc<Progress>>,
}

impl HyperLog {
    fn new(w: &Worker, peer: &Peer, req: &Request<Incoming>, start: Instant) -> Option<Box<HyperLog>> {
        let f = w.shared.access_log.format_of(peer.listener)?;
        let mut req_headers = HeaderMap::new();
        for n in &f.req_headers {
            if let Some(v) = req.headers().get(n.as_str()) {
                if let Ok(name) = HeaderName::from_bytes(n.as_bytes()) {
                    req_headers.insert(name, v.clone());
                }
            }
        }
        Some(Box::new(HyperLog {
            client: SocketAddr::new(peer.ip, peer.port),
            unix: peer.unix,
            t0: start,
            frontend: peer.listener,
            method: req.method().clone(),
            target: req.uri().path_and_query().map_or("/", |pq| pq.as_str()).to_string(),
            version: match req.version() {
                Version::HTTP_10 => "HTTP/1.0",
                Version::HTTP_2 => "HTTP/2.0",
                _ => "HTTP/1.1",
            },
            req_headers,
            res_headers: HeaderMap::new(),
            rid: Vec::new(),
            pool: String::new(),
            server: String::new(),
            term: "--",
            retries: 0,
            timings: Default::default(),
            status: 0,
            progress: None,
        }))
    }

    /// Keep the response headers the format shows.
    fn keep_response(&mut self, w: &Worker, h: &HeaderMap) {
        let Some(f) = w.shared.access_log.format_of(self.frontend) else { return };
        for n in &f.res_headers {
            if let (Some(v), Ok(name)) = (h.get(n.as_str()), HeaderName::from_bytes(n.as_bytes())) {
                self.res_headers.insert(name, v.clone());
            }
        }
    }

    /// Write the line: `bytes` of body sent, `received` of body read.
    pub fn emit(&self, w: &Worker, bytes: u64, received: u64) {
        let received = received.max(self.progress.as_ref().map_or(0, |p| p.bytes.load(Relaxed)));
        use super::accesslog::{Headers, Record};
        let log = &w.shared.access_log;
        if !log.active() {
            return;
        }
        let mut timings = self.timings;
        timings.total = self.t0.elapsed();
        let r = Record {
            listener: self.frontend,
            client: self.client,
            unix: self.unix,
            when: std::time::SystemTime::now() - timings.total,
            frontend: w.shared.frontends.get(self.frontend).map_or("", String::as_str),
            backend: &self.pool,
            server: &self.server,
            method: self.method.as_str().as_bytes(),
            target: self.target.as_bytes(),
            version: self.version,
            status: self.status,
            bytes_sent: bytes,
            bytes_received: received,
            timings,
            retries: self.retries,
            request_id: &self.rid,
            req_headers: Headers::Map(&self.req_headers),
            res_headers: Headers::Map(&self.res_headers),
            termination: self.term,
        };
        log.log(&w.log, &r);
    }
}

/// The line of a request hyper refused itself (a malformed head: 400, too
/// large: 431), answered and closed without reaching [`handle`].
pub fn log_refused_by_hyper(w: &Worker, peer: &Peer, e: &hyper::Error) {
    if e.is_parse() || e.is_parse_too_large() {
        log_without_request(w, peer, if e.is_parse_too_large() { 431 } else { 400 }, "PR");
    } else if e.is_incomplete_message() {
        // the client closed in the middle of a request head
        log_without_request(w, peer, 400, "CR");
    }
}

/// A `<BADREQ>` line: a connection that ended without a complete request —
/// refused (`PR`), closed by the client mid-head (`CR`, 400) or before its
/// first byte (`CR`, only with `log_empty`), or cut by the header timeout
/// (`cR`, 408). HAProxy's termination states.
pub fn log_without_request(w: &Worker, peer: &Peer, status: u16, term: &'static str) {
    use super::accesslog::{Headers, Record};
    let log = &w.shared.access_log;
    if !log.active() {
        return;
    }
    let r = Record {
        listener: peer.listener,
        client: SocketAddr::new(peer.ip, peer.port),
        unix: peer.unix,
        when: std::time::SystemTime::now(),
        frontend: w.shared.frontends.get(peer.listener).map_or("", String::as_str),
        backend: "",
        server: "",
        method: b"",
        target: b"",
        version: "",
        status,
        bytes_sent: 0,
        bytes_received: 0,
        timings: Default::default(),
        retries: 0,
        request_id: b"",
        req_headers: Headers::None,
        res_headers: Headers::None,
        termination: term,
    };
    log.log(&w.log, &r);
}

/// hyper's service: every outcome is a response (errors become 502/503/504).
pub async fn handle(
    w: Arc<Worker>,
    peer: Arc<Peer>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, Infallible> {
    let start = Instant::now();
    peer.ctl.begin();
    bump(&w.stats.requests, 1);
    let t = w.shared.table();
    let listener = t.listener(peer.listener);
    let rid = listener.request_id.as_ref().map(|name| {
        let mut given = req.headers().get_all(name).iter();
        match (given.next(), given.next()) {
            (Some(v), None) if super::route::valid_request_id(v.as_bytes()) => (name.clone(), v.clone()),
            _ => {
                let id = w.ids.generate();
                (name.clone(), HeaderValue::from_bytes(&id).expect("hex digits"))
            }
        }
    });
    let grpc = req.version() == Version::HTTP_2 && super::grpc::is_grpc(req.headers());
    let mut lg = HyperLog::new(&w, &peer, &req, start);
    if let (Some(l), Some((_, v))) = (lg.as_mut(), rid.as_ref()) {
        l.rid = v.as_bytes().to_vec();
    }
    let limited = limit(&w, t.rate_limit.as_deref(), req.headers(), peer.ip).await.err();
    let mut resp = match limited {
        Some(refused) => refused,
        None => forward(&w, &t, &peer, req, start, rid.as_ref(), &mut lg).await,
    };
    if !grpc && resp.extensions().get::<OwnAnswer>().is_some() {
        if let Some(page) = t.error_page(resp.status().as_u16()) {
            with_page(&mut resp, page);
        }
    }
    if let Some((name, value)) = rid {
        resp.headers_mut().insert(name, value);
    }
    if peer.https {
        if let Some(v) = &listener.hsts {
            resp.headers_mut().insert(header::STRICT_TRANSPORT_SECURITY, v.clone());
        }
    }
    if let RespBody::Full(_) = resp.body() {
        // Answered here (or upgraded): nothing left to stream.
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            peer.ctl.end();
        }
    }
    w.stats.observe(resp.status().as_u16(), start.elapsed());
    if let Some(mut l) = lg {
        l.status = resp.status().as_u16();
        l.keep_response(&w, resp.headers());
        match resp.body_mut() {
            RespBody::Stream(s) => s.log = Some(l),
            RespBody::Full(b) => {
                if l.term == "--" && l.status >= 400 && l.pool.is_empty() {
                    l.term = "PR";
                }
                l.emit(&w, b.as_ref().map_or(0, |b| b.len() as u64), 0);
            }
        }
    }
    if grpc && resp.status().as_u16() >= 400 && matches!(resp.body(), RespBody::Full(_)) {
        // the balancer's own error (logged and counted with its HTTP status), as gRPC says it
        resp = super::grpc::error_response(resp);
    }
    Ok(resp)
}

/// Refused by the rate limit: `status` (429) with `Retry-After`.
/// The rate limits `tables` on a request: waits out a delay (delay mode),
/// or gives the refusal to answer.
async fn limit<'a>(
    w: &Worker,
    tables: impl IntoIterator<Item = &'a super::ratelimit::Table>,
    headers: &HeaderMap,
    ip: std::net::IpAddr,
) -> Result<(), Response<RespBody>> {
    match super::ratelimit::combined(tables, |rl| rl.verdict_headers(ip, headers)) {
        super::ratelimit::Outcome::Pass => Ok(()),
        super::ratelimit::Outcome::Wait(d) => {
            bump(&w.stats.rate_delayed, 1);
            tokio::time::sleep(d).await;
            Ok(())
        }
        super::ratelimit::Outcome::Refuse(status, wait) => {
            bump(&w.stats.rate_limited, 1);
            Err(too_many_response(status, wait))
        }
    }
}

fn too_many_response(status: u16, wait: Duration) -> Response<RespBody> {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let mut r = error_response(code, super::ratelimit::BODY);
    if let Some(v) = super::ratelimit::retry_after(wait).fixed {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// What a response holds of its backend until it ends: an HTTP/1
/// connection (pooled again after a clean end) or an HTTP/2 stream.
pub(super) enum Held {
    H1(BackendConn),
    // never read: dropping it frees the stream
    H2(#[allow(dead_code)] super::h2pool::Slot),
}

pub(super) enum Outcome {
    Response(Response<Incoming>, Held),
    /// Nothing was sent: the request can go to another backend as it is.
    Unsent(Request<ReqBody>, Fail),
    /// The request (or part of it) went out, then the exchange failed.
    Sent(Fail),
}

/// One backend attempt: a pooled connection (`held`, the client's own, for
/// a `send_proxy` server), or a new one if that connection turns out closed
/// before the request was written.
#[allow(clippy::too_many_arguments)]
async fn send(
    w: &Worker,
    b: &Backend,
    mut req: Request<ReqBody>,
    connect: Duration,
    wait: Duration,
    progress: Option<&Progress>,
    proxy_header: Option<&[u8]>,
    mut held: Option<BackendConn>,
) -> Outcome {
    let mut reused_failed = false;
    loop {
        let mut kept = held.take();
        let kept_ready = match kept.as_mut() {
            Some(bc) => bc.ready().await,
            None => false,
        };
        let got = if kept_ready {
            Ok((kept.take().expect("checked above"), true))
        } else if reused_failed || proxy_header.is_some() {
            Box::pin(w.pool.connect_with(b, connect, proxy_header)).await.map(|tx| (tx, false))
        } else {
            w.pool.acquire(b, connect).await
        };
        let (mut bc, reused) = match got {
            Ok(x) => x,
            Err(f) => return Outcome::Unsent(req, f),
        };
        let exchange = bc.tx.try_send_request(req);
        tokio::pin!(exchange);
        // The response timeout counts from the end of the upload: while the
        // request body keeps moving, the wait is extended.
        let mut seen = progress.map_or(0, |p| p.frames.load(Relaxed));
        let result = loop {
            match tokio::time::timeout(wait, exchange.as_mut()).await {
                Ok(r) => break Some(r),
                Err(_) => match progress.map(|p| p.frames.load(Relaxed)) {
                    Some(now) if now != seen => seen = now,
                    _ => break None,
                },
            }
        };
        match result {
            Some(Ok(resp)) => return Outcome::Response(resp, Held::H1(bc)),
            Some(Err(mut e)) => match e.take_message() {
                Some(r) if reused => {
                    // The backend closed an idle connection: not its failure.
                    req = r;
                    reused_failed = true;
                }
                Some(r) => return Outcome::Unsent(r, Fail::Reset),
                None => return Outcome::Sent(Fail::Reset),
            },
            None => return Outcome::Sent(Fail::Timeout),
        }
    }
}

/// A request as hyper parsed it, for routing.
struct MapView<'a> {
    headers: &'a HeaderMap,
    path: &'a str,
    method: &'a str,
}

impl View for MapView<'_> {
    fn host(&self) -> Option<&[u8]> {
        self.headers.get(header::HOST).map(HeaderValue::as_bytes)
    }
    fn path(&self) -> &[u8] {
        self.path.as_bytes()
    }
    fn method(&self) -> &[u8] {
        self.method.as_bytes()
    }
    fn header_any(&self, name: &[u8], test: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        // names are lower case already: a lookup without allocating
        let Ok(name) = std::str::from_utf8(name) else { return false };
        self.headers.get_all(name).iter().any(|v| test(v.as_bytes()))
    }
}

/// Apply header rules to `h`.
fn apply_rules(h: &mut HeaderMap, rules: &super::route::Rules, rid: Option<&(HeaderName, HeaderValue)>, src: &[u8]) {
    for d in rules.delete.iter() {
        h.remove(d);
    }
    let id = rid.map_or(&b""[..], |(_, v)| v.as_bytes());
    for a in rules.add.iter() {
        if let Some(v) = a.value(id, src) {
            h.append(a.name.clone(), v);
        }
    }
}

fn redirect_response(r: &super::route::Redirect, host: Option<&[u8]>, target: &[u8]) -> Response<RespBody> {
    let mut loc = Vec::with_capacity(64);
    r.location(&mut loc, host, target);
    let mut resp = Response::new(RespBody::Full(None));
    *resp.status_mut() = StatusCode::from_u16(r.code()).unwrap_or(StatusCode::FOUND);
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_bytes(&loc) {
        h.insert(header::LOCATION, v);
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn forward(
    w: &Arc<Worker>,
    t: &Table,
    peer: &Arc<Peer>,
    mut req: Request<Incoming>,
    start: Instant,
    rid: Option<&(HeaderName, HeaderValue)>,
    lg: &mut Option<Box<HyperLog>>,
) -> Response<RespBody> {
    macro_rules! term {
        ($t:expr) => {
            if let Some(l) = lg.as_mut() {
                l.term = $t;
            }
        };
    }
    let upgrade = is_upgrade(req.headers());
    let mut client_upgrade = if upgrade {
        Some(hyper::upgrade::on(&mut req))
    } else {
        None
    };
    let (parts, body) = req.into_parts();
    if let Some(reason) = refuse_reason(parts.version, &parts.headers) {
        return refused(reason, parts.version == Version::HTTP_2);
    }
    let head_bytes: usize = parts.headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
    if head_bytes > w.shared.config.max_header_bytes {
        // hyper's read buffer bounds the head only roughly: the same limit as the fast path's
        let mut r = error_response(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "request header fields too large\n");
        if parts.version != Version::HTTP_2 {
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return r;
    }
    let method = parts.method;
    let mut headers = parts.headers;
    let h2 = parts.version == Version::HTTP_2;
    if let Some(authority) = parts.uri.authority().filter(|_| !h2) {
        // absolute-form (RFC 9112 §3.2.2): the target's authority is the host. A Host that
        // says otherwise is refused, as HAProxy does: routing (here) and a backend reading
        // Host must never see two different hosts.
        if headers
            .get(header::HOST)
            .is_some_and(|h| !h.as_bytes().eq_ignore_ascii_case(authority.as_str().as_bytes()))
        {
            return refused("Host does not match the target's authority\n", false);
        }
        if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
            headers.insert(header::HOST, v);
        }
    }
    let host_from_authority = h2 && !headers.contains_key(header::HOST);
    if host_from_authority {
        // HTTP/2 names the host in :authority; HTTP/1.1 backends want Host.
        if let Some(v) = parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
            headers.insert(header::HOST, v);
        }
    }
    let upgrade_value = if upgrade {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    };
    let listener = t.listener(peer.listener);
    let action: &Action = listener.action(listener.route(&MapView {
        headers: &headers,
        path: parts.uri.path(),
        method: method.as_str(),
    }));
    let limits = [action.rate_limit.as_deref(), action.pool.and_then(|p| t.pools[p].rate_limit.as_deref())];
    if let Err(refused) = limit(w, limits.into_iter().flatten(), &headers, peer.ip).await {
        term!("PR");
        return refused;
    }
    if let Some(r) = &action.redirect {
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        term!("LR");
        return redirect_response(r, headers.get(header::HOST).map(HeaderValue::as_bytes), target.as_bytes());
    }
    if let Some(page) = &action.respond {
        // the route's own answer (HAProxy's http-request return / deny);
        // without a body, the error page of its status if there is one
        let page = if page.body.is_empty() { t.error_page(page.status).unwrap_or(page) } else { page };
        if page.status >= 400 {
            term!("PR");
        } else {
            term!("LR");
        }
        let mut r = Response::new(RespBody::Full(None));
        *r.status_mut() = StatusCode::from_u16(page.status).unwrap_or(StatusCode::OK);
        with_page(&mut r, page);
        return r;
    }
    let Some(pool) = action.pool else {
        bump(&w.stats.no_backend, 1);
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "no backend for this request\n");
    };
    let up: &Upstream = &t.pools[pool];
    if let Some(l) = lg.as_mut() {
        l.pool = t.names[pool].clone();
    }
    let s = &up.settings;
    // the one TE an HTTP/2 request may carry, which gRPC requires (RFC 9113 §8.2.2)
    let te_trailers = s.proto == Proto::H2
        && headers.get_all(header::TE).iter().any(|v| {
            v.to_str().unwrap_or("").split(',').any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        });
    strip_hop_by_hop(&mut headers);
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if !action.request.is_empty() {
        apply_rules(&mut headers, &action.request, rid, peer.xff.as_bytes());
    }
    if let Some((name, value)) = rid {
        headers.insert(name.clone(), value.clone());
    }
    if let Some(v) = upgrade_value {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, v);
    }
    // X-Forwarded-Proto written by a rule (TLS ended before the balancer) wins over the balancer's own
    let ruled_proto: Option<Vec<HeaderValue>> = action
        .request
        .add
        .iter()
        .any(|a| a.name == X_FORWARDED_PROTO)
        .then(|| headers.get_all(&X_FORWARDED_PROTO).iter().cloned().collect());
    add_forwarded(&mut headers, peer);
    if let Some(values) = ruled_proto {
        headers.remove(&X_FORWARDED_PROTO);
        for v in values {
            headers.append(X_FORWARDED_PROTO, v);
        }
    }
    let pq = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let uri = match parts.uri.authority() {
        // HTTP/2 on both sides: the client's :authority goes on as it came (no Host)
        Some(a) if host_from_authority && s.proto == Proto::H2 => {
            headers.remove(header::HOST);
            let scheme = if w.shared.config.backend_tls.is_some() { http::uri::Scheme::HTTPS } else { http::uri::Scheme::HTTP };
            Uri::builder().scheme(scheme).authority(a.clone()).path_and_query(pq.clone()).build()
                .unwrap_or_else(|_| Uri::from(pq.clone()))
        }
        _ => Uri::from(pq.clone()),
    };

    let empty = body.is_end_stream();
    let mut body = if empty {
        None
    } else if upgrade || h2 {
        // HTTP/2 frames its bodies itself, and a streaming call (gRPC's client and
        // bidi streams) must not wait for more of its body before it is forwarded
        Some((std::collections::VecDeque::new(), Some(body)))
    } else {
        let wait = if w.shared.config.header_timeout.is_zero() { Duration::from_secs(10) } else { w.shared.config.header_timeout };
        match prebuffer(body, wait, &w.stats).await {
            Prebuffered::Ok(ahead, rest) => Some((ahead, rest)),
            Prebuffered::Malformed => return refused("malformed request body\n", h2),
        }
    };
    let progress = if empty {
        None
    } else {
        Some(Arc::new(Progress::default()))
    };
    if let Some(l) = lg.as_mut() {
        l.progress = progress.clone();
    }
    let mut attempts = Attempts::new(up, start, empty && idempotent(method.as_str().as_bytes()) && !upgrade);
    let sticky = up.policy.sticky.as_ref();
    let pinned = match sticky {
        Some(st) => super::sticky::pin(st, &mut headers),
        None => None,
    };
    attempts.prefer(pinned);
    let key_header = match &s.hash_key {
        HashKey::Header(name) => headers.get(name).map(|v| v.as_bytes().to_vec()),
        _ => None,
    };
    let key = Key {
        client_ip: peer.ip,
        path: pq.path(),
        header: key_header.as_deref(),
    };
    let mut failed: Option<Fail> = None;
    let mut pending: Option<Request<ReqBody>> = None;
    loop {
        let queued = lg.is_some().then(Instant::now);
        let (backend, lease) = match attempts.next(w, &key).await {
            Next::Try(backend, lease) => (backend, lease),
            Next::QueueFull => {
                term!("sQ");
                return error_response(StatusCode::SERVICE_UNAVAILABLE, "backend queue full\n");
            }
            Next::Done => break,
        };
        if let (Some(l), Some(q)) = (lg.as_mut(), queued) {
            *l.timings.queue.get_or_insert(Duration::ZERO) += q.elapsed();
            l.server = backend.name.clone();
            l.retries = attempts.retries();
        }
        let sending = lg.is_some().then(Instant::now);
        let breq = match pending.take() {
            Some(r) => r,
            None => {
                // Keep a copy of the head only while a replay may still be needed.
                let keep = attempts.replayable() && attempts.more_after_this();
                let mut r = Request::new(match body.take() {
                    Some(b) => {
                        ReqBody::Client(b.0, b.1, w.stats.clone(), progress.clone().unwrap_or_default())
                    }
                    None => ReqBody::Empty,
                });
                *r.method_mut() = method.clone();
                *r.uri_mut() = uri.clone();
                *r.headers_mut() = if keep {
                    headers.clone()
                } else {
                    std::mem::take(&mut headers)
                };
                if !r.headers().contains_key(header::HOST) && r.uri().authority().is_none() {
                    // HTTP/1.0 clients may omit it; HTTP/1.1 requires one.
                    if let Ok(v) = HeaderValue::from_str(backend.authority.as_str()) {
                        r.headers_mut().insert(header::HOST, v);
                    }
                }
                r
            }
        };
        let wait = attempts.response_wait();
        let pp = backend
            .send_proxy()
            .map(|v| super::l4::header_for(v, SocketAddr::new(peer.ip, peer.port), peer.local_addr(&w.shared)));
        let outcome = if s.proto == Proto::H2 {
            super::h2pool::send(w, &backend, breq, s.connect_timeout, wait, progress.as_deref(), s.h2).await
        } else {
            // the client's own backend connection, if it has one to this backend
            let held = if pp.is_some() {
                let mut g = peer.private.lock().unwrap_or_else(|e| e.into_inner());
                match g.take() {
                    Some((id, bc)) if id == backend.id => Some(bc),
                    other => {
                        *g = other;
                        None
                    }
                }
            } else {
                None
            };
            send(w, &backend, breq, s.connect_timeout, wait, progress.as_deref(), pp.as_deref(), held).await
        };
        match outcome
        {
            Outcome::Response(mut resp, bc) => {
                if let (Some(l), Some(t)) = (lg.as_mut(), sending) {
                    // hyper's pool connects and sends as one step: Tc is not told apart
                    l.timings.response = Some(t.elapsed());
                }
                attempts.observe(&backend, resp.status().as_u16());
                let class = (resp.status().as_u16() / 100).clamp(1, 5) as usize - 1;
                backend.stats.responses[class].fetch_add(1, Relaxed);
                if attempts.retry_status(resp.status().as_u16(), &key) {
                    // retry_on: this response is dropped with its connection
                    drop((resp, bc, lease));
                    failed = Some(Fail::Reset);
                    continue;
                }
                if let Some(st) = sticky {
                    super::sticky::stick(st, up, &backend, pinned, resp.headers_mut());
                }
                if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                    if let Some(client_side) = client_upgrade.take() {
                        let backend_side = hyper::upgrade::on(&mut resp);
                        drop(bc);
                        let mut upgraded_log = lg.take();
                        let w = w.clone();
                        let tunnel_timeout = s.tunnel_timeout;
                        tokio::spawn(async move {
                            let _lease = lease;
                            let mut moved = (0, 0);
                            let mut idle = false;
                            if let (Ok(c), Ok(b)) = (client_side.await, backend_side.await) {
                                let (up, down, end) =
                                    super::tunnel::relay(TokioIo::new(c), TokioIo::new(b), tunnel_timeout).await;
                                moved = (up, down);
                                idle = end == super::tunnel::End::Idle;
                            }
                            // an upgraded connection's one line, when it ends
                            if let Some(l) = upgraded_log.as_mut() {
                                if idle && l.term == "--" {
                                    l.term = "cD"; // HAProxy's code for a timeout in the data phase
                                }
                                l.status = 101;
                                l.emit(&w, moved.1, moved.0);
                            }
                        });
                        *resp.version_mut() = Version::HTTP_11;
                        let (parts, _) = resp.into_parts();
                        return Response::from_parts(parts, RespBody::Full(None));
                    }
                }
                strip_hop_by_hop(resp.headers_mut());
                if !action.response.is_empty() {
                    apply_rules(resp.headers_mut(), &action.response, rid, peer.xff.as_bytes());
                }
                // Our side speaks 1.1 (hyper answers 1.0 clients as 1.0 itself), or 2.
                *resp.version_mut() = if h2 { Version::HTTP_2 } else { Version::HTTP_11 };
                let (parts, inner) = resp.into_parts();
                let streaming = Streaming {
                    inner,
                    lease: Some(lease),
                    worker: w.clone(),
                    peer: peer.clone(),
                    conn: Some(bc),
                    deadline: attempts.deadline().map(|d| Box::pin(tokio::time::sleep_until(d.into()))),
                    bytes: 0,
                    eject: (s.eject_after, s.ejection()),
                    log: None,
                };
                return Response::from_parts(parts, RespBody::Stream(streaming));
            }
            Outcome::Unsent(r, f) => {
                attempts.failed(&backend, false);
                failed = Some(f);
                pending = Some(r);
            }
            Outcome::Sent(Fail::Timeout) if attempts.retry_timeout(&key) => {
                attempts.failed(&backend, true);
                failed = Some(Fail::Timeout);
            }
            Outcome::Sent(Fail::Timeout) => {
                attempts.failed(&backend, true);
                // A timed-out request may have had effects: never replayed.
                bump(&w.stats.timeouts, 1);
                term!("sH");
                return error_response(StatusCode::GATEWAY_TIMEOUT, "backend timeout\n");
            }
            Outcome::Sent(_)
                if progress
                    .as_ref()
                    .is_some_and(|p| p.client_failed.load(Relaxed)) =>
            {
                // The client broke off its upload: not the backend's fault.
                term!("CD");
                return error_response(StatusCode::BAD_REQUEST, "incomplete request body\n");
            }
            Outcome::Sent(f) => {
                attempts.failed(&backend, true);
                failed = Some(f);
            }
        }
    }
    match failed {
        Some(f @ (Fail::ConnectTimeout | Fail::Timeout)) => {
            bump(&w.stats.timeouts, 1);
            term!(if matches!(f, Fail::ConnectTimeout) { "sC" } else { "sH" });
            error_response(StatusCode::GATEWAY_TIMEOUT, "backend timeout\n")
        }
        Some(f) => {
            bump(&w.stats.backend_errors, 1);
            term!(if matches!(f, Fail::Connect) { "SC" } else { "SH" });
            error_response(StatusCode::BAD_GATEWAY, "backend unavailable\n")
        }
        None => {
            bump(&w.stats.no_backend, 1);
            term!("SC");
            error_response(StatusCode::SERVICE_UNAVAILABLE, "no backend available\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_forwarded() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::HOST, HeaderValue::from_static("example.com"));
        h.insert("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        strip_hop_by_hop(&mut h);
        add_forwarded(
            &mut h,
            &Peer::new("10.0.0.2:5".parse().unwrap(), Arc::default()),
        );
        assert!(h.get("x-secret").is_none() && h.get(header::TRANSFER_ENCODING).is_none());
        assert_eq!(h[header::HOST], "example.com");
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 10.0.0.2");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["forwarded"], "for=10.0.0.2;proto=http");
        let mut h6 = HeaderMap::new();
        add_forwarded(
            &mut h6,
            &Peer::new("[::1]:5".parse().unwrap(), Arc::default()),
        );
        assert_eq!(h6["forwarded"], "for=\"[::1]\";proto=http");
        let cache = PeerCache::default();
        for a in ["10.0.0.2:5", "10.0.0.2:6", "[::1]:7", "10.0.0.3:5"] {
            let addr: SocketAddr = a.parse().unwrap();
            let (c, n) = (
                Peer::cached(addr, Arc::default(), &cache),
                Peer::new(addr, Arc::default()),
            );
            assert_eq!((c.ip, &c.xff, &c.forwarded), (n.ip, &n.xff, &n.forwarded));
        }
    }

    #[test]
    fn many_hop_by_hop_headers() {
        let mut h = HeaderMap::new();
        for n in ["te", "trailer", "upgrade", "keep-alive", "proxy-connection", "x-a"] {
            h.insert(HeaderName::from_static(n), HeaderValue::from_static("1"));
        }
        h.insert(header::CONNECTION, HeaderValue::from_static("close, x-a"));
        h.insert(header::HOST, HeaderValue::from_static("h"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        let mut k = HeaderMap::new();
        k.insert(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        k.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut k);
        assert_eq!(k.len(), 1);
        let mut n = HeaderMap::new();
        n.insert(header::CONNECTION, HeaderValue::from_static("Host, Content-Length, x-a"));
        n.insert(header::HOST, HeaderValue::from_static("h"));
        n.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        n.insert("x-a", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut n);
        assert!(n.contains_key(header::HOST) && n.contains_key(header::CONTENT_LENGTH) && n.len() == 2, "{n:?}");
    }

    #[test]
    fn upgrade_detection() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert!(!is_upgrade(&h));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(is_upgrade(&h));
    }
}
