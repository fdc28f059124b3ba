//! One worker thread at work: its accept loops, its housekeeping tick
//! (idle and header timeouts, drain), and each client connection from accept
//! to close: the fast path first, hyper's when a request needs it.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::config::Config;
use super::fast::{self, Client, FastPool};
use super::pool::Pool;
use super::connctl::{ConnCount, ConnCtl, Conns, OpenSlot};
use super::svc::Svc;
use super::worker::{is_unix, ClientSlot, Clock, Peer, Shared, Worker};
use super::stats::WorkerStats;
use super::watched::Watched;


/// Housekeeping period: fine enough for the header timeout, at most 1 s.
fn tick_period(cfg: &Config) -> Duration {
    let mut t = Duration::from_secs(1);
    if !cfg.header_timeout.is_zero() {
        t = t.min(cfg.header_timeout / 4);
    }
    if !cfg.idle_timeout.is_zero() {
        t = t.min(cfg.idle_timeout / 4);
    }
    t.max(Duration::from_millis(10))
}

pub(super) async fn worker_main(
    shared: Arc<Shared>,
    stats: Arc<WorkerStats>,
    ls: Vec<(std::net::TcpListener, usize, bool, bool)>,
    mut stop: watch::Receiver<Option<Instant>>,
    mut cmds: tokio::sync::mpsc::UnboundedReceiver<super::listeners::Cmd>,
) {
    let cfg = &shared.config;
    let pool = Pool::new(cfg.pool_max_idle, cfg.pool_idle_timeout, cfg.backend_tls.clone());
    let worker = Arc::new(Worker {
        pool,
        fast_pool: FastPool::new(cfg.pool_max_idle, cfg.pool_idle_timeout),
        shared: shared.clone(),
        stats: stats.clone(),
        clock: Clock::default(),
        last_peer: Default::default(),
        ids: Default::default(),
        log: Default::default(),
        h2_pool: super::h2pool::H2Pool::new(cfg.backend_tls.as_ref()),
    });
    let conns = Arc::new(Conns::default());
    let mut accepting = Vec::new();
    let stop_accepting = stop.clone();
    let listen = |l: std::net::TcpListener, idx: usize, tls: bool, accept_proxy: bool| {
        // SAFETY: the listener owns its descriptor and keeps it while registered.
        let l = unsafe { AsyncFd::register_with_interest(l, Interest::READABLE) }.ok()?;
        let unix = shared.frontends.get(idx).is_some_and(|f| f.starts_with("unix:"));
        let mode = Mode { tls, accept_proxy, unix };
        Some((idx, tokio::spawn(accept_loop(worker.clone(), conns.clone(), l, idx, mode, stop_accepting.clone()))))
    };
    for (l, idx, tls, accept_proxy) in ls {
        let Some(a) = listen(l, idx, tls, accept_proxy) else { return };
        accepting.push(a);
    }
    let sweep_every = if cfg.pool_idle_timeout.is_zero() {
        Duration::from_secs(30)
    } else {
        cfg.pool_idle_timeout / 2
    };
    let mut sweep = tokio::time::interval(sweep_every.max(Duration::from_millis(100)));
    // Timeouts of client connections are enforced here, from a coarse clock,
    // rather than by a timer per connection or per request: re-arming timers
    // on every request costs a wake-up syscall each time.
    let idle = cfg.idle_timeout;
    let header = cfg.header_timeout;
    let period = tick_period(cfg);
    let mut tick = tokio::time::interval(period);
    let mut idle_checked = Instant::now();
    tick.tick().await;
    loop {
        tokio::select! {
            _ = sweep.tick() => {
                worker.pool.sweep();
                worker.h2_pool.sweep();
                worker.fast_pool.sweep(worker.clock.advance());
            }
            _ = tick.tick() => {
                let now = worker.clock.advance();
                shared.access_log.flush(&worker.log);
                let check_idle = !idle.is_zero() && idle_checked.elapsed() >= idle / 2;
                if check_idle {
                    idle_checked = Instant::now();
                }
                let map = conns.map.lock().unwrap_or_else(|e| e.into_inner());
                for ctl in map.values() {
                    if !header.is_zero() && ctl.head_overdue(now, header) {
                        ctl.ask_abort(); // slowloris: no graceful anything
                    } else if check_idle && !ctl.active.swap(false, Relaxed) {
                        // Two checks (idle/2 apart) without a read or write.
                        ctl.ask_close();
                    }
                }
            }
            Some(cmd) = cmds.recv() => match cmd {
                super::listeners::Cmd::Add { sock, idx, tls, accept_proxy } => {
                    accepting.extend(listen(sock, idx, tls, accept_proxy));
                }
                super::listeners::Cmd::Quic { sock, idx } => {
                    let quic = super::http3::accept_loop(worker.clone(), conns.clone(), sock, idx, stop_accepting.clone());
                    accepting.push((idx, tokio::spawn(quic)));
                }
                super::listeners::Cmd::Remove { idx, done } => {
                    // The accept loop goes with its socket (nothing else
                    // holds it); its connections finish what is in flight.
                    let (gone, rest): (Vec<_>, Vec<_>) = accepting.into_iter().partition(|(i, _)| *i == idx);
                    accepting = rest;
                    for (_, a) in gone {
                        a.abort();
                        let _ = a.await; // dropped, and its socket closed
                    }
                    let _ = done.send(());
                    for ctl in conns.map.lock().unwrap_or_else(|e| e.into_inner()).values() {
                        if ctl.listener.load(Relaxed) == idx {
                            ctl.ask_close();
                        }
                    }
                }
            },
            _ = stop.changed() => break,
        }
    }
    // the accept loops stop on the same signal and drop their listeners
    for (_, a) in accepting {
        let _ = a.await;
    }
    for ctl in conns.map.lock().unwrap_or_else(|e| e.into_inner()).values() {
        ctl.ask_close();
    }
    // the deadline is read again each turn: a second drain may bring it forward
    while stats.connections_active.load(Relaxed) > 0 && Instant::now() < stop.borrow().unwrap_or_else(Instant::now) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shared.access_log.flush(&worker.log);
}

/// Accept the connections of one listener (`idx`) until the drain starts.
async fn accept_loop(
    worker: Arc<Worker>,
    conns: Arc<Conns>,
    listener: AsyncFd<std::net::TcpListener>,
    idx: usize,
    mode: Mode,
    mut stop: watch::Receiver<Option<Instant>>,
) {
    let tls = mode.tls;
    let shared = worker.shared.clone();
    let stats = worker.stats.clone();
    let limited = shared.config.max_open_connections > 0;
    loop {
        if limited {
            // At max_open_connections: accept nothing (new connections wait in
            // the kernel's queue) until one closes, on any worker.
            let closed = OpenSlot::closed(&shared.open);
            if !OpenSlot::available(&shared.open) {
                tokio::select! {
                    _ = closed => continue,
                    _ = stop.changed() => break,
                }
            }
        }
        tokio::select! {
            r = listener.readable() => {
                let mut guard = match r {
                    Ok(g) => g,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                // Accept what is queued (bounded, for fairness with the
                // connections' tasks), then wait for readiness again.
                for _ in 0..ACCEPT_BATCH {
                    let open = if limited {
                        match OpenSlot::try_take(&shared.open) {
                            Some(slot) => Some(slot),
                            None => break, // at the limit: wait above
                        }
                    } else {
                        None
                    };
                    match accept(guard.get_inner()) {
                        Ok((sock, peer)) if mode.accept_proxy => {
                            // The client's address is in the header: the
                            // per-client limit applies once it is read.
                            let ctl = Arc::new(ConnCtl::accepted(idx, open));
                            let id = conns.next.fetch_add(1, Relaxed);
                            conns.map.lock().unwrap_or_else(|e| e.into_inner()).insert(id, ctl.clone());
                            tokio::spawn(serve_proxied(worker.clone(), conns.clone(), id, ctl, sock, peer, idx, tls));
                        }
                        Ok((sock, peer)) => {
                            // Unix clients have no address to count them by.
                            let slot = if mode.unix { Ok(None) } else { ClientSlot::take(&shared, peer.ip()) };
                            let Ok(slot) = slot else {
                                // over the per-client limit: closed at once, nothing read
                                stats.clients_refused.fetch_add(1, Relaxed);
                                drop(sock);
                                continue;
                            };
                            // Registered here, so a drain that starts next sees it;
                            // active from the start (an idle check right after the
                            // accept reset a client whose request was in flight).
                            let ctl = Arc::new(ConnCtl::accepted(idx, open));
                            let id = conns.next.fetch_add(1, Relaxed);
                            conns.map.lock().unwrap_or_else(|e| e.into_inner()).insert(id, ctl.clone());
                            if tls {
                                tokio::spawn(serve_tls_conn(worker.clone(), conns.clone(), id, ctl, sock, peer, slot, idx, None));
                            } else {
                                tokio::spawn(serve_conn(worker.clone(), conns.clone(), id, ctl, sock, peer, slot, idx, None));
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            guard.clear_ready();
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted
                            || e.kind() == io::ErrorKind::ConnectionAborted => {}
                        // Out of descriptors or similar: back off instead of spinning.
                        Err(_) => {
                            drop(guard);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            break;
                        }
                    }
                }
            },
            _ = stop.changed() => break,
        }
    }
}

/// Connections accepted per readiness event at most.
const ACCEPT_BATCH: usize = 32;

/// How a listener's connections start.
#[derive(Clone, Copy)]
struct Mode {
    tls: bool,
    accept_proxy: bool,
    unix: bool,
}

/// A connection to an `accept_proxy` listener: its PROXY header first
/// (within the header timeout), then served as any other, as the client
/// the header names. Without a valid header it is closed, unanswered, as
/// HAProxy does.
#[allow(clippy::too_many_arguments)]
async fn serve_proxied(
    w: Arc<Worker>,
    conns: Arc<Conns>,
    id: u64,
    ctl: Arc<ConnCtl>,
    sock: std::net::TcpStream,
    peer: SocketAddr,
    listener: usize,
    tls: bool,
) {
    let forget = |conns: &Conns| {
        conns.map.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    };
    let (sock, header) = match super::l4::read_header(sock, w.shared.config.header_timeout, &w.stats.proxy_refused).await {
        Ok(x) => x,
        Err(_) => {
            forget(&conns);
            return;
        }
    };
    // LOCAL (the sender's own health checks) and UNKNOWN: the real peer.
    let (client, local) = match header.addrs {
        Some((src, dst)) => (
            super::proxyproto::canonical(src),
            Some(super::proxyproto::canonical(dst)),
        ),
        None => (peer, None),
    };
    let slot = if local.is_none() && is_unix(&w, listener) { Ok(None) } else { ClientSlot::take(&w.shared, client.ip()) };
    let Ok(slot) = slot else {
        w.stats.clients_refused.fetch_add(1, Relaxed);
        forget(&conns);
        return;
    };
    // Boxed: this task's cell stays small (see serve_conn).
    if tls {
        Box::pin(serve_tls_conn(w, conns, id, ctl, sock, client, slot, listener, local)).await;
    } else {
        Box::pin(serve_conn(w, conns, id, ctl, sock, client, slot, listener, local)).await;
    }
}

/// `accept4` straight to a non-blocking socket (one system call), not
/// registered with the reactor: the fast path registers it only if it must wait.
fn accept(l: &std::net::TcpListener) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let fd = l.as_raw_fd();
    // SAFETY: accept4 writes at most `len` bytes of address into the storage.
    let (sock, addr) = unsafe {
        socket2::SockAddr::try_init(|storage, len| {
            let r = libc::accept4(fd, storage.cast(), len, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(std::net::TcpStream::from_raw_fd(r))
            }
        })?
    };
    let peer = addr
        .as_socket()
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
    Ok((sock, peer))
}



#[allow(clippy::too_many_arguments)]
async fn serve_tls_conn(
    w: Arc<Worker>,
    conns: Arc<Conns>,
    id: u64,
    ctl: Arc<ConnCtl>,
    sock: std::net::TcpStream,
    peer: SocketAddr,
    _slot: Option<ClientSlot>,
    listener: usize,
    local: Option<SocketAddr>,
) {
    let _count = ConnCount::new(&w.stats);
    if let Some(tls) = w.shared.config.tls.clone() {
        super::https::serve(w, ctl, sock, peer, &tls, listener, local).await;
    }
    conns.map.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
}

#[allow(clippy::too_many_arguments)]
async fn serve_conn(
    w: Arc<Worker>,
    conns: Arc<Conns>,
    id: u64,
    ctl: Arc<ConnCtl>,
    sock: std::net::TcpStream,
    peer: SocketAddr,
    _slot: Option<ClientSlot>,
    listener: usize,
    local: Option<SocketAddr>,
) {
    let _count = ConnCount::new(&w.stats);
    if !cfg!(target_os = "linux") {
        let _ = sock.set_nodelay(true);
    }
    let mut peer = Peer::cached(peer, ctl.clone(), &w.last_peer);
    peer.listener = listener;
    peer.local = local;
    if local.is_none() && is_unix(&w, listener) {
        peer.set_unix();
    }
    let peer = Arc::new(peer);
    let mut stage = if w.shared.config.backend_tls.is_some() {
        // The fast path speaks to backends over raw sockets: with TLS to
        // backends every exchange goes through hyper's path (HTTP/1, or
        // HTTP/2 for a client that starts with its preface).
        Stage::Start(Box::pin(super::h2c::read_start(w.clone(), ctl.clone(), sock)))
    } else {
        // Boxed: the task cell (128-byte aligned) stays small; a multi-KiB
        // over-aligned cell takes the allocator's slow path on every accept.
        Stage::Fast(Box::pin(fast::serve(w.clone(), peer.clone(), Client::new(sock, ctl.clone()))))
    };
    let mut closing = false;
    let mut registered = false;
    let _ = std::future::poll_fn(|cx| {
        if !registered {
            // A spawned task's waker stays the same: stored once.
            *ctl.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            registered = true;
        }
        if ctl.abort.load(Relaxed) {
            return Poll::Ready(());
        }
        loop {
            match &mut stage {
                Stage::Fast(f) => {
                    if ctl.close.load(Relaxed) && ctl.at_rest() {
                        return Poll::Ready(()); // drain or idle: nothing in flight
                    }
                    match f.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(None) => return Poll::Ready(()),
                        Poll::Ready(Some((client, prefix))) => {
                            let Ok(io) = client.into_tokio() else {
                                return Poll::Ready(());
                            };
                            stage = if super::h2c::is_preface(&prefix) {
                                Stage::H2(super::h2c::conn(&w, &ctl, &peer, io, prefix))
                            } else {
                                Stage::Hyper(hyper_conn(&w, &ctl, &peer, io, prefix))
                            };
                        }
                    }
                }
                Stage::Start(f) => {
                    if ctl.close.load(Relaxed) && ctl.at_rest() {
                        return Poll::Ready(());
                    }
                    match f.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(None) => return Poll::Ready(()),
                        Poll::Ready(Some((io, prefix))) => {
                            stage = if super::h2c::is_preface(&prefix) {
                                Stage::H2(super::h2c::conn(&w, &ctl, &peer, io, prefix))
                            } else {
                                Stage::Hyper(hyper_conn(&w, &ctl, &peer, io, prefix))
                            };
                        }
                    }
                }
                Stage::H2(conn) => {
                    if !closing && ctl.close.load(Relaxed) {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    return conn.as_mut().poll(cx).map(|_| ());
                }
                Stage::Hyper(conn) => {
                    if !closing && ctl.close.load(Relaxed) {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    return conn.as_mut().poll(cx).map(|r| {
                        if let Err(e) = r {
                            super::hyperlog::log_refused_by_hyper(&w, &peer, &e);
                        }
                    });
                }
            }
        }
    })
    .await;
    if ctl.abort.load(Relaxed) {
        // the header timeout cut a request head short
        super::hyperlog::log_without_request(&w, &peer, 408, "cR");
    }
    conns
        .map
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
}

type FastFuture = Pin<Box<dyn Future<Output = Option<(Client, Vec<u8>)>> + Send>>;
type HyperConn = Pin<Box<hyper::server::conn::http1::UpgradeableConnection<TokioIo<Watched<TcpStream, Worker>>, Svc>>>;
enum Stage {
    Fast(FastFuture),
    Hyper(HyperConn),
    /// The first bytes, read to tell HTTP/2 from HTTP/1 (without the fast path).
    Start(StartFuture),
    /// Cleartext HTTP/2 (its preface came first).
    H2(super::h2c::H2Conn),
}

type StartFuture = Pin<Box<dyn Future<Output = Option<(TcpStream, Vec<u8>)>> + Send>>;

/// The rest of a connection the fast path handed over, served by hyper.
fn hyper_conn(w: &Arc<Worker>, ctl: &Arc<ConnCtl>, peer: &Arc<Peer>, io: TcpStream, prefix: Vec<u8>) -> HyperConn {
    let cfg = &w.shared.config;
    let io = TokioIo::new(Watched::new(io, prefix, ctl.clone(), Some(w.clone())));
    let svc = Svc::new(w.clone(), peer.clone());
    let mut builder = http1::Builder::new();
    // hyper's own header timer is off: see the housekeeping in worker_main.
    builder
        .timer(TokioTimer::new())
        .max_buf_size(cfg.max_header_bytes)
        .keep_alive(true)
        // a client may shut its sending side after its request (as HAProxy allows): answer it
        .half_close(true)
        .header_read_timeout(None);
    Box::pin(builder.serve_connection(io, svc).with_upgrades())
}
