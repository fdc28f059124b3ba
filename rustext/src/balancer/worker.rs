//! What every worker of one balancer shares, what each worker owns, and
//! what is known of one client connection: the state both forwarding paths
//! (the fast path and hyper's) and the accept loops work on. It lives apart
//! from either path so that neither owns the other's state.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use http::HeaderValue;

use super::config::Config;
use super::connctl::{ConnCtl, OpenConns};
use super::pool::Pool;
use super::route::Table;
use super::stats::WorkerStats;

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
    pub open: Arc<OpenConns>,
    /// The access log, if configured.
    pub access_log: super::accesslog::AccessLog,
    /// Each listener's bound address, as the access log names it (`%ft`), by slot.
    pub frontends: super::listeners::Slots<String>,
    /// Each listener's bound address (the destination a PROXY header sent
    /// to a backend names, unless the client's own header gave one), by slot.
    pub bound: super::listeners::Slots<SocketAddr>,
    /// Pending ACME HTTP-01 challenges, answered before routing.
    pub acme: super::acme::Http01,
    /// The `Alt-Svc` value of each TLS listener that serves HTTP/3 too, by slot.
    pub alt_svc: super::listeners::Slots<HeaderValue>,
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

/// Whether listener `idx` is a Unix socket (by its name in `frontends`).
pub(super) fn is_unix(w: &Worker, idx: usize) -> bool {
    w.shared.frontends.get(idx).is_some_and(|f| f.starts_with("unix:"))
}

/// One worker thread's view: its own stats and backend connection pool.
pub struct Worker {
    pub shared: Arc<Shared>,
    pub stats: Arc<WorkerStats>,
    pub pool: Pool,
    /// The fast path's backend connections.
    pub fast_pool: super::fastio::FastPool,
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

impl super::h2pool::HasH2Pool for Worker {
    #[inline]
    fn h2_pool(&self) -> &super::h2pool::H2Pool {
        &self.h2_pool
    }
}

impl super::watched::HeadClock for Worker {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.now()
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
    /// The verified client certificate of a TLS connection (mutual TLS),
    /// read once after the handshake.
    pub client_cert: Option<Arc<super::clientcert::ClientCert>>,
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
            client_cert: None,
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
                    client_cert: None,
                    private: Mutex::new(None),
                };
            }
        }
        let p = Peer::new(addr, ctl);
        *g = Some((ip, p.xff.clone(), p.forwarded.clone()));
        p
    }
}
