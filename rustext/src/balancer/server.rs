//! Listeners, worker threads and the lifecycle of a running balancer.
//!
//! `workers` threads each run a current-thread tokio runtime with its own
//! `SO_REUSEPORT` listener on the same address (the kernel spreads
//! connections), its own backend connection pool and its own stats, so the
//! request path shares nothing between threads but the upstream snapshot.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::watch;

use super::config::Config;
use super::route::{RoutingSpec, Table};
use super::worker::Shared;
use super::stats::{Totals, WorkerStats};
use super::upstream::AdminState;
use super::serve::worker_main;

/// A running balancer. Dropping it drains with a zero deadline.
pub struct Balancer {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    /// The listener of each slot (None: removed by a reload); see [`super::listeners`].
    slots: Mutex<Vec<Option<super::config::ListenAddr>>>,
    /// The slot of each configured listener, in the configured order.
    order: Mutex<Vec<usize>>,
    /// Each worker's listener commands.
    cmds: Vec<tokio::sync::mpsc::UnboundedSender<super::listeners::Cmd>>,
    /// The bound address of the HTTP-to-HTTPS redirect listener.
    redirect_addr: Option<SocketAddr>,
    /// `Some(deadline)` once draining started.
    stop: watch::Sender<Option<Instant>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    update_lock: Mutex<()>,
    /// The routing of the last update (None: as configured at start).
    spec: Mutex<Option<RoutingSpec>>,
    /// The Unix sockets it bound, removed once it stopped (or their listener removed).
    unix_paths: Mutex<Vec<(usize, std::path::PathBuf)>>,
    /// Per slot, a copy of each distinct socket the workers accept on: what
    /// a binary upgrade hands over. Dropped with the listener, and when the
    /// drain starts (a socket nobody accepts on must refuse, not queue).
    sockets: Mutex<std::collections::HashMap<usize, Vec<std::net::TcpListener>>>,
    /// A copy of the redirect listener's socket, handed over likewise.
    redirect_sock: Mutex<Option<std::net::TcpListener>>,
}

/// The handover key of the HTTP-to-HTTPS redirect listener (configured address).
fn redirect_key(addr: SocketAddr) -> String {
    format!("redirect:{addr}")
}

/// A listener opened for the workers.
struct Opened {
    /// Per worker, the sockets it accepts on.
    per_worker: Vec<Vec<std::net::TcpListener>>,
    /// A copy of each distinct socket (see `Balancer::sockets`).
    distinct: Vec<std::net::TcpListener>,
    bound: SocketAddr,
}

/// Snapshot of one backend for the control plane.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    /// The pool it belongs to (`default` without named backends).
    pub pool: String,
    pub name: String,
    pub weight: u32,
    pub state: &'static str,
    pub active: i64,
    pub requests: u64,
    pub failures: u64,
    pub ejections: u64,
    pub responses: [u64; 5],
    pub bytes_out: u64,
}

fn set_quickack(sock: &Socket, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = libc::c_int::from(on);
    // SAFETY: a valid socket and an int-sized option value.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    // Accepted sockets inherit it on Linux: no setsockopt per connection.
    sock.set_tcp_nodelay(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(4096)?;
    // Like HAProxy's tcp-smart-accept: no pure ACK for the request, the
    // response carries it (one segment fewer per connection, paid by the
    // client's CPU on loopback). Must follow listen(), which resets it;
    // accepted sockets inherit it.
    set_quickack(&sock, false)?;
    Ok(sock.into())
}

/// The UDP socket of a TLS listener's HTTP/3, at the port its TCP socket
/// got (`SO_REUSEPORT`: a binary upgrade's new process binds it while the
/// old one drains).
fn quic_socket(la: &super::config::ListenAddr, bound: SocketAddr) -> Result<Option<std::net::UdpSocket>, String> {
    if !(la.tls && la.http3) || la.unix.is_some() {
        return Ok(None);
    }
    let open = || -> io::Result<std::net::UdpSocket> {
        let sock = Socket::new(Domain::for_address(bound), Type::DGRAM, Some(Protocol::UDP))?;
        sock.set_reuse_address(true)?;
        sock.set_reuse_port(true)?;
        if bound.is_ipv6() {
            sock.set_only_v6(true)?;
        }
        sock.set_nonblocking(true)?;
        sock.bind(&bound.into())?;
        Ok(sock.into())
    };
    open().map(Some).map_err(|e| format!("cannot listen on UDP {bound} for HTTP/3: {} (http3 = false serves \
                                           this listener without it)", os_reason(&e)))
}

/// Hand a listener's HTTP/3 socket to the first worker, which runs its QUIC
/// endpoint (one socket: QUIC routes a connection's datagrams by its ids,
/// which a `SO_REUSEPORT` group spread over workers would not keep together).
fn start_quic(shared: &Shared, cmds: &[tokio::sync::mpsc::UnboundedSender<super::listeners::Cmd>], idx: usize,
              sock: std::net::UdpSocket, bound: SocketAddr) {
    if let Ok(v) = http::HeaderValue::from_str(&format!("h3=\":{}\"; ma=86400", bound.port())) {
        shared.alt_svc.set(idx, v);
    }
    if let Some(tx) = cmds.first() {
        let _ = tx.send(super::listeners::Cmd::Quic { sock, idx });
    }
}

/// Open one listener: one socket per worker (`SO_REUSEPORT`), or for a
/// Unix socket one socket shared by all; or, when `given` (a binary
/// upgrade), accept on the sockets handed over by the previous process.
fn bind_listener(la: &super::config::ListenAddr, workers: usize, given: Option<&[RawFd]>) -> Result<Opened, String> {
    if let Some(fds) = given {
        return adopt(la, workers, fds);
    }
    let (distinct, bound) = if let Some(u) = &la.unix {
        let at = |e: io::Error| format!("cannot listen on unix:{}: {}", u.path.display(), os_reason(&e));
        (vec![super::unix::bind(u).map_err(at)?], SocketAddr::from(([0, 0, 0, 0], 0)))
    } else {
        let cannot = |addr: SocketAddr, e: io::Error| format!("cannot listen on {addr}: {}", os_reason(&e));
        check_free(la.addr).map_err(|e| cannot(la.addr, e))?;
        let first = listener(la.addr).map_err(|e| cannot(la.addr, e))?;
        let bound = first.local_addr().map_err(|e| e.to_string())?;
        let mut socks = vec![first];
        for _ in 1..workers {
            socks.push(listener(bound).map_err(|e| cannot(bound, e))?);
        }
        (socks, bound)
    };
    spread(la, workers, distinct, bound)
}

/// Give each worker its share of `distinct` (every socket is accepted on by
/// some worker: a socket of a `SO_REUSEPORT` group that nobody accepts on
/// would keep its share of the connections waiting), and keep a copy of each.
fn spread(la: &super::config::ListenAddr, workers: usize, distinct: Vec<std::net::TcpListener>, bound: SocketAddr) -> Result<Opened, String> {
    let at = |e: io::Error| format!("cannot listen on {}: {}", super::listeners::key(la), os_reason(&e));
    let n = distinct.len().max(1);
    let mut per_worker: Vec<Vec<std::net::TcpListener>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, s) in distinct.iter().enumerate() {
        per_worker[i % workers].push(s.try_clone().map_err(at)?);
    }
    // fewer sockets than workers: the rest share them
    for (w, socks) in per_worker.iter_mut().enumerate().skip(n) {
        socks.push(distinct[w % n].try_clone().map_err(at)?);
    }
    Ok(Opened { per_worker, distinct, bound })
}

/// The listening sockets handed over for `la` (copies of `fds`, which stay
/// the caller's), checked to be listening where `la` says.
fn adopt(la: &super::config::ListenAddr, workers: usize, fds: &[RawFd]) -> Result<Opened, String> {
    let key = super::listeners::key(la);
    let wrong = |why: &str| format!("cannot take over {key}: the socket handed over {why}");
    if fds.is_empty() {
        return Err(wrong("is missing"));
    }
    let mut distinct = Vec::with_capacity(fds.len());
    let mut bound = SocketAddr::from(([0, 0, 0, 0], 0));
    for &fd in fds {
        // SAFETY: the caller keeps `fd` open for this call; we take a copy.
        let owned = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
            .try_clone_to_owned()
            .map_err(|e| wrong(&format!("cannot be used: {}", os_reason(&e))))?;
        let sock = Socket::from(owned);
        if !sock.is_listener().unwrap_or(false) || sock.r#type().ok() != Some(Type::STREAM) {
            return Err(wrong("is not a listening stream socket"));
        }
        let local = sock.local_addr().map_err(|e| wrong(&os_reason(&e)))?;
        match &la.unix {
            Some(u) => {
                if local.as_pathname() != Some(u.path.as_path()) {
                    return Err(wrong("listens elsewhere"));
                }
            }
            None => {
                let at = local.as_socket().ok_or_else(|| wrong("is not a TCP socket"))?;
                let same = at == la.addr || (la.addr.port() == 0 && at.ip() == la.addr.ip());
                if !same {
                    return Err(wrong(&format!("listens on {at}")));
                }
                bound = at;
            }
        }
        sock.set_nonblocking(true).map_err(|e| wrong(&os_reason(&e)))?;
        distinct.push(std::net::TcpListener::from(sock));
    }
    spread(la, workers, distinct, bound)
}

/// Fail like a plain listener would if `addr` is taken: the workers' own
/// listeners set `SO_REUSEPORT`, with which a second balancer (or anything
/// else listening with it) could silently share the port instead.
fn check_free(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    probe.bind(&addr.into())
}

/// "address already in use": an I/O error as a user reads it, without the
/// "(os error N)" suffix.
fn os_reason(e: &io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => text.to_string(),
    }
}

impl Balancer {
    /// Bind the listeners and start the workers; errors are returned before
    /// any thread starts.
    ///
    /// `inherited`: listening sockets handed over by the process this one
    /// replaces, by listener (`listeners::key`); those listeners accept on
    /// them instead of binding. The descriptors stay the caller's.
    pub fn start(config: Config, inherited: &std::collections::HashMap<String, Vec<RawFd>>) -> Result<Balancer, String> {
        config.validate()?;
        let epoch = Instant::now();
        let ids = AtomicU64::new(0);
        let table = Table::new(&config.routing_spec(), None, epoch, &ids)?;
        let cannot = |addr: SocketAddr, e: io::Error| format!("cannot listen on {addr}: {}", os_reason(&e));
        // per worker, one socket per listener (SO_REUSEPORT spreads connections)
        let mut per_worker: Vec<Vec<(std::net::TcpListener, usize, bool, bool)>> =
            (0..config.workers).map(|_| Vec::new()).collect();
        let mut local_addrs = Vec::new();
        let mut unix_paths = Vec::new();
        let mut sockets = std::collections::HashMap::new();
        let mut quic = Vec::new();
        for (idx, la) in config.listen_addrs().into_iter().enumerate() {
            let opened = bind_listener(&la, config.workers, inherited.get(&super::listeners::key(&la)).map(Vec::as_slice))?;
            if let Some(u) = quic_socket(&la, opened.bound)? {
                quic.push((idx, u, opened.bound));
            }
            if let Some(u) = &la.unix {
                unix_paths.push((idx, u.path.clone()));
            }
            local_addrs.push(opened.bound);
            for (w, socks) in per_worker.iter_mut().zip(opened.per_worker) {
                w.extend(socks.into_iter().map(|sock| (sock, idx, la.tls, la.accept_proxy)));
            }
            sockets.insert(idx, opened.distinct);
        }
        let local_addr = local_addrs[0];
        let https_port = config
            .listen_addrs()
            .iter()
            .zip(&local_addrs)
            .find(|(l, _)| l.tls)
            .map_or(local_addr.port(), |(_, a)| a.port());
        let redirect = match config.redirect_listen {
            Some(addr) if inherited.contains_key(&redirect_key(addr)) => {
                let la = super::config::ListenAddr { addr, tls: false, http3: false, accept_proxy: false, unix: None };
                let mut o = adopt(&la, 1, &inherited[&redirect_key(addr)])?;
                let l = o.distinct.swap_remove(0);
                Some((l, o.bound))
            }
            Some(addr) => {
                check_free(addr).map_err(|e| cannot(addr, e))?;
                let l = listener(addr).map_err(|e| cannot(addr, e))?;
                let bound = l.local_addr().map_err(|e| e.to_string())?;
                Some((l, bound))
            }
            None => None,
        };
        let redirect_addr = redirect.as_ref().map(|(_, a)| *a);
        let redirect_copy = match &redirect {
            Some((l, _)) => Some(l.try_clone().map_err(|e| format!("cannot copy the redirect listener: {e}"))?),
            None => None,
        };
        let workers: Vec<Arc<WorkerStats>> = (0..config.workers)
            .map(|_| Arc::new(WorkerStats::default()))
            .collect();
        let access_log = super::accesslog::AccessLog::start_all(config.access_log.as_ref(), &config.listener_logs)?;
        let frontends = super::listeners::Slots::new(
            config.listen_addrs().iter().zip(&local_addrs).map(|(l, a)| super::listeners::display(l, *a)).collect(),
        );
        let bound = super::listeners::Slots::new(local_addrs.clone());
        let open = Arc::new(super::connctl::OpenConns::new(config.max_open_connections));
        let shared = Arc::new(Shared {
            access_log,
            frontends,
            bound,
            alt_svc: super::listeners::Slots::new(Vec::new()),
            config,
            table: RwLock::new(Arc::new(table)),
            workers: workers.clone(),
            epoch,
            ids,
            per_client: Mutex::new(std::collections::HashMap::new()),
            open,
            acme: Default::default(),
        });
        let (stop, stop_rx) = watch::channel(None);
        let mut threads = Vec::new();
        let mut cmds = Vec::new();
        for (i, (l, stats)) in per_worker.into_iter().zip(workers).enumerate() {
            let shared = shared.clone();
            let stop_rx = stop_rx.clone();
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            cmds.push(tx);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot build a runtime: {e}"))?;
            let t = std::thread::Builder::new()
                .name(format!("balancer-{i}"))
                .spawn(move || rt.block_on(worker_main(shared, stats, l, stop_rx, rx)))
                .map_err(|e| format!("cannot start a worker thread: {e}"))?;
            threads.push(t);
        }
        if let Some((l, _)) = redirect {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot build a runtime: {e}"))?;
            let port = https_port;
            let stop_rx = stop_rx.clone();
            let shared = shared.clone();
            let t = std::thread::Builder::new()
                .name("balancer-redirect".into())
                .spawn(move || {
                    let _g = rt.enter();
                    rt.block_on(super::https::redirect_loop(l, port, shared, stop_rx));
                    rt.shutdown_timeout(Duration::from_millis(100));
                })
                .map_err(|e| format!("cannot start the redirect thread: {e}"))?;
            threads.push(t);
        }
        for (idx, sock, bound) in quic {
            start_quic(&shared, &cmds, idx, sock, bound);
        }
        let n = local_addrs.len();
        Ok(Balancer {
            local_addr,
            slots: Mutex::new(shared.config.listen_addrs().into_iter().map(Some).collect()),
            order: Mutex::new((0..n).collect()),
            cmds,
            shared,
            redirect_addr,
            stop,
            threads: Mutex::new(threads),
            update_lock: Mutex::new(()),
            spec: Mutex::new(None),
            unix_paths: Mutex::new(unix_paths),
            sockets: Mutex::new(sockets),
            redirect_sock: Mutex::new(redirect_copy),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Every listener's bound address, in the configured order (the first
    /// is `local_addr` until a reload changes the listeners).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        order.iter().filter_map(|&i| self.shared.bound.get(i).copied()).collect()
    }

    /// Every listener as the access log names it (`unix:/path` for a Unix
    /// socket), in the configured order.
    pub fn frontends(&self) -> Vec<String> {
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        order.iter().filter_map(|&i| self.shared.frontends.get(i).cloned()).collect()
    }

    /// Add the listeners of `addrs` that are not open, close those that are
    /// no longer listed (their connections finish the request in flight),
    /// keep the others as they are (same sockets), then apply `routing`,
    /// whose listeners are in the order of `addrs`. Nothing changes if a new
    /// listener cannot be opened.
    pub fn update_listeners(&self, addrs: Vec<super::config::ListenAddr>, mut routing: RoutingSpec) -> Result<(), String> {
        if addrs.len() != routing.listeners.len() {
            return Err("routing: one route table per listener".into());
        }
        let _g = self.update_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let plan = super::listeners::plan(&slots, &addrs);
        let added = plan.slots.iter().filter(|s| s.is_none()).count();
        if slots.len() + added > super::listeners::MAX_SLOTS {
            return Err("too many listeners opened since the start: a restart is needed".into());
        }
        // Open every new listener first: a failure leaves everything as it was.
        let workers = self.cmds.len();
        let mut opened = Vec::new();
        for (la, slot) in addrs.iter().zip(&plan.slots) {
            if slot.is_none() && la.tls && self.shared.config.tls.is_none() {
                return Err("a new HTTPS listener needs the certificates of [tls], which a running balancer \
                            started without cannot take: restart it"
                    .into());
            }
        }
        for (la, slot) in addrs.iter().zip(&plan.slots) {
            if slot.is_none() {
                let o = bind_listener(la, workers, None)?;
                let udp = quic_socket(la, o.bound)?;
                opened.push((la.clone(), o, udp));
            }
        }
        // The route tables by slot: kept and new listeners get theirs from
        // `routing`, removed ones keep their last (their connections drain).
        let previous = self.routing_locked();
        let mut by_slot: Vec<_> = (0..slots.len())
            .map(|i| previous.listeners.get(i).cloned().unwrap_or_else(|| routing.listeners[0].clone()))
            .collect();
        let mut order = Vec::with_capacity(addrs.len());
        for (pos, slot) in plan.slots.iter().enumerate() {
            let idx = match slot {
                Some(i) => *i,
                None => {
                    by_slot.push(routing.listeners[pos].clone());
                    by_slot.len() - 1
                }
            };
            by_slot[idx] = routing.listeners[pos].clone();
            order.push(idx);
        }
        routing.listeners = by_slot;
        // The new table is checked before anything changes.
        let old = self.shared.table();
        let table = Table::new(&routing, Some(&old), self.shared.epoch, &self.shared.ids)?;
        let mut opened = opened.into_iter();
        for slot in &plan.slots {
            if slot.is_some() {
                continue;
            }
            let (la, o, udp) = opened.next().expect("one opened per new listener");
            let bound = o.bound;
            let idx = slots.len();
            self.shared.bound.set(idx, bound);
            self.shared.frontends.set(idx, super::listeners::display(&la, bound));
            if let Some(u) = &la.unix {
                self.unix_paths.lock().unwrap_or_else(|e| e.into_inner()).push((idx, u.path.clone()));
            }
            for (tx, socks) in self.cmds.iter().zip(o.per_worker) {
                for sock in socks {
                    let _ = tx.send(super::listeners::Cmd::Add { sock, idx, tls: la.tls, accept_proxy: la.accept_proxy });
                }
            }
            self.sockets.lock().unwrap_or_else(|e| e.into_inner()).insert(idx, o.distinct);
            if let Some(u) = udp {
                start_quic(&self.shared, &self.cmds, idx, u, bound);
            }
            slots.push(Some(la));
        }
        for &idx in &plan.remove {
            slots[idx] = None;
            self.sockets.lock().unwrap_or_else(|e| e.into_inner()).remove(&idx);
            let (done, acks) = std::sync::mpsc::channel();
            let mut told = 0;
            for tx in &self.cmds {
                told += usize::from(tx.send(super::listeners::Cmd::Remove { idx, done: done.clone() }).is_ok());
            }
            // Once this returns, the removed listener refuses new connections.
            for _ in 0..told {
                if acks.recv_timeout(Duration::from_secs(5)).is_err() {
                    break;
                }
            }
            let mut paths = self.unix_paths.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = paths.iter().position(|(i, _)| *i == idx) {
                let (_, path) = paths.remove(p);
                // the workers close their sockets as they get the command; the name goes now
                let _ = std::fs::remove_file(path);
            }
        }
        *self.order.lock().unwrap_or_else(|e| e.into_inner()) = order;
        *self.spec.lock().unwrap_or_else(|e| e.into_inner()) = Some(routing);
        *self.shared.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        Ok(())
    }

    pub fn redirect_addr(&self) -> Option<SocketAddr> {
        self.redirect_addr
    }

    /// Reopen the access log file (logrotate), with a new format if given.
    pub fn reopen_access_log(&self, format: Option<&str>) -> Result<(), String> {
        self.shared.access_log.reopen(format)
    }

    /// A reload's access logs checked and their new destinations (files,
    /// syslog servers) opened; nothing changes until
    /// [`Balancer::commit_access_log`]. `listeners` in the configured order.
    pub fn prepare_access_log(
        &self,
        top: Option<&super::accesslog::AccessLogSpec>,
        listeners: &[super::accesslog::ListenerLog],
    ) -> Result<super::accesslog::Prepared, String> {
        self.shared.access_log.prepare(top, listeners)
    }

    /// Put prepared access logs in force, once the reload's listeners are:
    /// new formats and destinations apply from here, the files are reopened
    /// (logrotate), destinations no longer named are closed.
    pub fn commit_access_log(
        &self,
        p: super::accesslog::Prepared,
        top: Option<&super::accesslog::AccessLogSpec>,
        listeners: &[super::accesslog::ListenerLog],
    ) {
        // `listeners` is in the configured order; the log's table is by slot
        // (a removed listener's slot keeps its log while its connections drain)
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut by_slot = vec![super::accesslog::ListenerLog::Keep; order.iter().max().map_or(0, |m| m + 1)];
        for (pos, &slot) in order.iter().enumerate() {
            by_slot[slot] = listeners.get(pos).cloned().unwrap_or_default();
        }
        self.shared.access_log.commit(p, top, &by_slot)
    }

    /// Access log lines (written, dropped because the writer fell behind).
    pub fn access_log_counts(&self) -> (u64, u64) {
        let l = &self.shared.access_log;
        (l.written.load(Relaxed), l.dropped.load(Relaxed))
    }

    /// Read the certificate files again: new handshakes get the new
    /// certificates, established connections keep theirs; on error the
    /// current ones stay in service.
    pub fn reload_tls(&self) -> Result<(), String> {
        match &self.shared.config.tls {
            Some(tls) => tls.certs.reload(None).map_err(|e| e.to_string()),
            None => Err("this balancer does not serve TLS".into()),
        }
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The pending ACME HTTP-01 challenges (see [`super::acme`]).
    pub fn acme_http01(&self) -> &super::acme::Http01 {
        &self.shared.acme
    }

    pub fn running(&self) -> bool {
        self.stop.borrow().is_none()
    }

    /// Replace pools, policy and routes; in-flight requests finish on the
    /// old snapshot. `routing` has a route table per listener slot (as
    /// [`Balancer::routing`] gives); [`Balancer::update_listeners`] changes the listeners.
    pub fn update(&self, routing: RoutingSpec) -> Result<(), String> {
        let _g = self.update_lock.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.slots.lock().unwrap_or_else(|e| e.into_inner()).len();
        if routing.listeners.len() != n {
            return Err(format!(
                "the balancer has {n} listener(s); adding or removing listeners goes through a reload"
            ));
        }
        self.update_locked(routing)
    }

    fn routing_locked(&self) -> RoutingSpec {
        self.spec
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| self.shared.config.routing_spec())
    }

    fn update_locked(&self, routing: RoutingSpec) -> Result<(), String> {
        let old = self.shared.table();
        let new = Table::new(&routing, Some(&old), self.shared.epoch, &self.shared.ids)?;
        *self.spec.lock().unwrap_or_else(|e| e.into_inner()) = Some(routing);
        // Backends that left may still serve requests; stop new ones to them.
        *self
            .shared
            .table
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(new);
        Ok(())
    }

    /// The routing in force.
    pub fn routing(&self) -> RoutingSpec {
        self.spec
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| self.shared.config.routing_spec())
    }

    /// The backends named `name`, in every pool (or in `pool`).
    fn each_backend(&self, name: &str, pool: Option<&str>, f: impl Fn(&super::upstream::Backend)) -> Result<(), String> {
        let t = self.shared.table();
        let mut found = false;
        for (p, n) in t.pools.iter().zip(&t.names) {
            if pool.is_some_and(|want| want != n) {
                continue;
            }
            if let Some(b) = p.find(name) {
                f(b);
                found = true;
            }
        }
        if found {
            Ok(())
        } else {
            Err(format!("no backend named {name:?}"))
        }
    }

    /// Administrative state: "up", "drain" or "down" (in every pool listing it).
    pub fn set_backend_state(&self, name: &str, state: &str) -> Result<(), String> {
        let s = AdminState::parse(state)?;
        self.each_backend(name, None, |b| b.set_admin(s))
    }

    /// Health as seen by active checks (independent of the admin state), in
    /// `pool` or in every pool listing the backend.
    pub fn set_backend_health(&self, name: &str, healthy: bool, pool: Option<&str>) -> Result<(), String> {
        self.each_backend(name, pool, |b| b.set_healthy(healthy))
    }

    /// Whether passive health has the backend out (in `pool`, or in any pool).
    pub fn backend_ejected(&self, name: &str, pool: Option<&str>) -> Result<bool, String> {
        let out = std::sync::atomic::AtomicBool::new(false);
        self.each_backend(name, pool, |b| {
            if b.ejected() {
                out.store(true, Relaxed);
            }
        })?;
        Ok(out.load(Relaxed))
    }

    pub fn set_backend_weight(&self, name: &str, weight: u32) -> Result<(), String> {
        let mut routing = self.routing();
        let mut found = false;
        for p in &mut routing.pools {
            for spec in p.settings.backends.iter_mut().filter(|b| b.name == name) {
                spec.weight = weight;
                found = true;
            }
        }
        if !found {
            return Err(format!("no backend named {name:?}"));
        }
        // Rebuilt so that the hash ring follows the weight.
        self.update(routing)
    }

    pub fn backends(&self) -> Vec<BackendInfo> {
        let t = self.shared.table();
        t.pools
            .iter()
            .zip(&t.names)
            .flat_map(|(up, pool)| up.backends.iter().map(move |b| (pool, b)))
            .map(|(pool, b)| BackendInfo {
                pool: pool.clone(),
                name: b.name.clone(),
                weight: b.weight.load(Relaxed),
                state: b.state_name(),
                active: b.active.load(Relaxed),
                requests: b.stats.requests.load(Relaxed),
                failures: b.stats.failures.load(Relaxed),
                ejections: b.stats.ejections.load(Relaxed),
                responses: std::array::from_fn(|i| b.stats.responses[i].load(Relaxed)),
                bytes_out: b.stats.bytes_out.load(Relaxed),
            })
            .collect()
    }

    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for w in &self.shared.workers {
            t.add(w);
        }
        t
    }

    pub fn per_worker(&self) -> Vec<Totals> {
        self.shared
            .workers
            .iter()
            .map(|w| {
                let mut t = Totals::default();
                t.add(w);
                t
            })
            .collect()
    }

    /// Copies of every listener's sockets, in the configured order, for the
    /// process that takes them over: (key, tls, sockets). Empty once draining.
    pub fn listener_sockets(&self) -> io::Result<Vec<(String, bool, Vec<std::os::fd::OwnedFd>)>> {
        let _g = self.update_lock.lock().unwrap_or_else(|e| e.into_inner());
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        let sockets = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for &idx in order.iter() {
            let (Some(Some(la)), Some(socks)) = (slots.get(idx), sockets.get(&idx)) else { continue };
            let fds = socks.iter().map(|s| std::os::fd::AsFd::as_fd(s).try_clone_to_owned()).collect::<io::Result<_>>()?;
            out.push((super::listeners::key(la), la.tls, fds));
        }
        if let (Some(addr), Some(l)) = (self.shared.config.redirect_listen, &*self.redirect_sock.lock().unwrap_or_else(|e| e.into_inner())) {
            out.push((redirect_key(addr), false, vec![std::os::fd::AsFd::as_fd(l).try_clone_to_owned()?]));
        }
        Ok(out)
    }

    /// The listeners were handed over: leave their Unix socket files in
    /// place on exit (the new process accepts on them).
    pub fn handed_over(&self) {
        self.unix_paths.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Stop accepting, let in-flight exchanges finish within `timeout`, then
    /// stop the workers. Blocks; idempotent; a call with a sooner deadline
    /// (from another thread) shortens a drain under way.
    pub fn drain(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        self.sockets.lock().unwrap_or_else(|e| e.into_inner()).clear();
        *self.redirect_sock.lock().unwrap_or_else(|e| e.into_inner()) = None;
        // a drain already under way keeps its deadline unless this one is sooner
        // (a second Ctrl-C: drain(0) while a graceful drain waits)
        self.stop.send_if_modified(|v| match v {
            Some(current) if *current <= deadline => false,
            _ => {
                *v = Some(deadline);
                true
            }
        });
        let threads: Vec<_> =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        let joined = !threads.is_empty();
        for t in threads {
            let _ = t.join();
        }
        if joined {
            // the workers handed over their last lines: let the writer write them (bounded)
            self.shared.access_log.sync(Duration::from_secs(2));
        }
        if joined {
            for (_, p) in self.unix_paths.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.drain(Duration::ZERO);
    }
}

#[cfg(test)]
mod tests;
