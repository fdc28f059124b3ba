//! Access logs: one line per request, in a format compiled once at load.
//!
//! A format (HAProxy's `log-format` variables, see [`compile`]) becomes a
//! list of [`Seg`]ments: literal bytes and variable ids. A request's
//! [`Record`] borrows what the request path already holds; formatting
//! appends to the worker's reusable buffer ([`LogBuf`]) without allocating.
//! Full buffers (and every housekeeping tick) go to a writer thread through
//! a bounded channel: a slow disk never blocks a forwarding loop; when the
//! channel is full the lines are dropped and counted.
//!
//! Values taken from the request or the response (target, headers, ids) are
//! escaped: in text lines, `"`, `\`, control bytes and bytes >= 0x80 become
//! `\xHH`; in JSON lines, JSON string escapes. A line never carries a
//! newline it did not get from the format itself.

mod format;
mod syslog;

pub use format::*;
pub use syslog::syslog_message;
use syslog::SyslogSender;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Where the lines of one access log go, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLogSpec {
    /// A file (appended to), `-` for standard output, or empty with `syslog`.
    pub path: String,
    pub format: String,
    /// Send each line as a syslog message instead of writing a file.
    pub syslog: Option<SyslogSpec>,
    /// Log connections closed before sending a byte (HAProxy without `option dontlognull`).
    pub log_empty: bool,
}

impl AccessLogSpec {
    /// What identifies the writer: two listeners logging to the same place
    /// (with the same syslog settings) share it.
    fn destination(&self) -> String {
        match &self.syslog {
            Some(s) => format!("syslog:{s:?}"),
            None => self.path.clone(),
        }
    }
}

/// A listener's access log: the top-level one, none, or its own.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ListenerLog {
    #[default]
    Inherit,
    Off,
    Own(AccessLogSpec),
    /// Whatever it had (a listener removed by a reload, its connections draining).
    Keep,
}

/// A syslog destination (RFC 3164 as HAProxy sends by default, or RFC 5424).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyslogSpec {
    /// `udp://host:port`, `tcp://host:port` or `unix:/dev/log` (a datagram socket).
    pub address: String,
    /// 0..=23 (`local0` is 16).
    pub facility: u8,
    pub rfc5424: bool,
    /// Over TCP: each message ends with a newline (HAProxy's `log-proto
    /// legacy`, for receivers that read lines) instead of RFC 6587's octet
    /// counting (`LEN SP MSG`, the default). The lines never hold a newline.
    pub newline_framing: bool,
    pub tag: String,
    /// Longer messages are cut (HAProxy's `len`, 1024 by default).
    pub max_length: usize,
}

const FLUSH_AT: usize = 32 * 1024;
const QUEUE: usize = 64;

enum Msg {
    Lines(Vec<u8>),
    Wake,
    Sync(SyncSender<()>),
}

/// One writer thread and its channel: a file, stdout or a syslog socket.
/// The thread ends (closing its file or socket) when the last `Sink` goes.
struct Sink {
    destination: String,
    tx: SyncSender<Msg>,
    reopen: Arc<AtomicBool>,
    /// No route names it any more: it only writes lines still buffered.
    retired: AtomicBool,
}

impl Sink {
    fn ask_reopen(&self) {
        if !self.retired.load(Relaxed) {
            self.reopen.store(true, Relaxed);
            let _ = self.tx.try_send(Msg::Wake);
        }
    }
}

/// How a listener's lines are written.
#[derive(Clone)]
struct LogRoute {
    sink: usize,
    format: Arc<Format>,
    log_empty: bool,
}

/// The formats and writers in force; swapped whole on reload.
#[derive(Clone, Default)]
struct Routes {
    /// For listeners not in `by_listener` (the HTTP-to-HTTPS redirect listener, listeners added by a reload).
    default: Option<LogRoute>,
    by_listener: Vec<Option<LogRoute>>,
    /// Writers by id: a worker's buffered lines name theirs. Ids are never
    /// reused; a closed writer's place stays `None`.
    sinks: Vec<Option<Arc<Sink>>>,
}

impl Routes {
    fn get(&self, listener: usize) -> Option<&LogRoute> {
        match self.by_listener.get(listener) {
            Some(r) => r.as_ref(),
            None => self.default.as_ref(),
        }
    }

    fn live_sinks(&self) -> impl Iterator<Item = &Arc<Sink>> {
        self.sinks.iter().flatten()
    }
}

/// Writers opened at most over a balancer's life (each reload that names a
/// new destination opens one).
const MAX_SINKS: usize = 1024;
/// How long a writer no longer named by any listener stays, for the lines
/// the workers still hold for it (they hand them over every tick).
const RETIRE_AFTER: Duration = Duration::from_secs(3);

/// Every access log of a balancer: a writer per destination, a format per
/// listener. Destinations and formats change on reload ([`AccessLog::prepare`],
/// [`AccessLog::commit`]).
pub struct AccessLog {
    routes: Arc<RwLock<Arc<Routes>>>,
    /// Some listener logs (read on every request: no lock).
    active: AtomicBool,
    pub dropped: Arc<AtomicU64>,
    pub written: Arc<AtomicU64>,
}

/// A reload's access logs, checked and with their new destinations open
/// (dropping it closes them): [`AccessLog::commit`] puts it in force.
pub struct Prepared {
    formats: std::collections::HashMap<String, Arc<Format>>,
    opened: Vec<Arc<Sink>>,
}

fn open(path: &str) -> std::io::Result<Box<dyn Write + Send>> {
    if path == "-" {
        return Ok(Box::new(std::io::stdout()));
    }
    Ok(Box::new(std::fs::OpenOptions::new().create(true).append(true).open(path)?))
}

fn spawn_writer(spec: &AccessLogSpec, written: Arc<AtomicU64>, dropped: Arc<AtomicU64>) -> Result<Sink, String> {
    let (tx, rx): (SyncSender<Msg>, Receiver<Msg>) = sync_channel(QUEUE);
    let reopen = Arc::new(AtomicBool::new(false));
    let flag = reopen.clone();
    let destination = spec.destination();
    let name = "balancer-access-log".to_string();
    let spawned = if let Some(s) = spec.syslog.clone() {
        let mut sender = SyslogSender::new(s);
        std::thread::Builder::new().name(name).spawn(move || {
            while let Ok(m) = rx.recv() {
                if flag.swap(false, Relaxed) {
                    sender.reconnect();
                }
                match m {
                    Msg::Lines(b) => {
                        let (sent, lost) = sender.send_lines(&b);
                        written.fetch_add(sent, Relaxed);
                        dropped.fetch_add(lost, Relaxed);
                    }
                    Msg::Sync(ack) => {
                        let _ = ack.try_send(());
                    }
                    Msg::Wake => {}
                }
            }
        })
    } else {
        let path = spec.path.clone();
        let mut out = open(&path).map_err(|e| format!("cannot open the access log {path}: {e}"))?;
        std::thread::Builder::new().name(name).spawn(move || {
            while let Ok(m) = rx.recv() {
                if flag.swap(false, Relaxed) {
                    let _ = out.flush();
                    if let Ok(o) = open(&path) {
                        out = o;
                    }
                }
                match m {
                    Msg::Lines(b) => {
                        if out.write_all(&b).is_ok() {
                            written.fetch_add(b.iter().filter(|&&c| c == b'\n').count() as u64, Relaxed);
                        }
                        let _ = out.flush();
                    }
                    Msg::Sync(ack) => {
                        let _ = ack.try_send(());
                    }
                    Msg::Wake => {}
                }
            }
        })
    };
    spawned.map_err(|e| format!("cannot start the access log writer: {e}"))?;
    Ok(Sink { destination, tx, reopen, retired: AtomicBool::new(false) })
}

impl AccessLog {
    /// One log for every listener (the `[access_log]` table alone).
    pub fn start(spec: &AccessLogSpec) -> Result<AccessLog, String> {
        Self::start_all(Some(spec), &[])
    }

    /// The top-level log (`top`) and each listener's (by index; listeners
    /// past the end take `top`); with neither, nothing is logged until a
    /// reload names a log.
    pub fn start_all(top: Option<&AccessLogSpec>, listeners: &[ListenerLog]) -> Result<AccessLog, String> {
        let log = AccessLog {
            routes: Arc::new(RwLock::new(Arc::new(Routes::default()))),
            active: AtomicBool::new(false),
            dropped: Arc::new(AtomicU64::new(0)),
            written: Arc::new(AtomicU64::new(0)),
        };
        let p = log.prepare(top, listeners)?;
        log.commit(p, top, listeners);
        Ok(log)
    }

    /// Whether any listener logs (else the request paths skip logging).
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Relaxed)
    }

    fn current(&self) -> Arc<Routes> {
        self.routes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Check the formats of `top` and `listeners` and open the destinations
    /// not open yet; nothing changes until [`AccessLog::commit`].
    pub fn prepare(&self, top: Option<&AccessLogSpec>, listeners: &[ListenerLog]) -> Result<Prepared, String> {
        let current = self.current();
        let mut p = Prepared { formats: Default::default(), opened: Vec::new() };
        for spec in top.into_iter().chain(listeners.iter().filter_map(|l| match l {
            ListenerLog::Own(s) => Some(s),
            _ => None,
        })) {
            if !p.formats.contains_key(&spec.format) {
                p.formats.insert(spec.format.clone(), Arc::new(compile(&spec.format)?));
            }
            let d = spec.destination();
            if current.live_sinks().any(|s| s.destination == d && !s.retired.load(Relaxed))
                || p.opened.iter().any(|s| s.destination == d)
            {
                continue;
            }
            if current.sinks.len() + p.opened.len() >= MAX_SINKS {
                return Err("too many access log destinations opened since the start: a restart is needed".into());
            }
            p.opened.push(Arc::new(spawn_writer(spec, self.written.clone(), self.dropped.clone())?));
        }
        Ok(p)
    }

    /// Put a prepared reload in force: `top` and `listeners` (by listener
    /// slot; [`ListenerLog::Keep`] for a removed listener whose connections
    /// drain) as given to [`AccessLog::prepare`]. Writers no longer named
    /// close once the lines the workers hold for them are written; the
    /// others reopen their files (logrotate).
    pub fn commit(&self, mut p: Prepared, top: Option<&AccessLogSpec>, listeners: &[ListenerLog]) {
        let mut g = self.routes.write().unwrap_or_else(|e| e.into_inner());
        let current = g.clone();
        let mut sinks = current.sinks.clone();
        let mut sink_of = |spec: &AccessLogSpec, sinks: &mut Vec<Option<Arc<Sink>>>| -> Option<usize> {
            let d = spec.destination();
            if let Some(i) = sinks.iter().position(|s| s.as_ref().is_some_and(|s| s.destination == d && !s.retired.load(Relaxed))) {
                return Some(i);
            }
            let k = p.opened.iter().position(|s| s.destination == d)?;
            sinks.push(Some(p.opened.swap_remove(k)));
            Some(sinks.len() - 1)
        };
        let mut route = |spec: &AccessLogSpec, sinks: &mut Vec<Option<Arc<Sink>>>| -> Option<LogRoute> {
            let format = match p.formats.get(&spec.format) {
                Some(f) => f.clone(),
                None => Arc::new(compile(&spec.format).ok()?),
            };
            Some(LogRoute { sink: sink_of(spec, sinks)?, format, log_empty: spec.log_empty })
        };
        let default = top.and_then(|t| route(t, &mut sinks));
        let mut by_listener = Vec::with_capacity(listeners.len());
        for (i, l) in listeners.iter().enumerate() {
            by_listener.push(match l {
                ListenerLog::Inherit => default.clone(),
                ListenerLog::Off => None,
                ListenerLog::Keep => current.by_listener.get(i).cloned().flatten().or_else(|| default.clone()),
                ListenerLog::Own(s) => route(s, &mut sinks),
            });
        }
        // writers no route names any more retire: still there for the lines
        // the workers buffered, closed a little later
        let used: std::collections::HashSet<usize> =
            default.iter().chain(by_listener.iter().flatten()).map(|r| r.sink).collect();
        let mut retiring = Vec::new();
        for (i, s) in sinks.iter().enumerate() {
            if let Some(s) = s {
                if !used.contains(&i) && !s.retired.swap(true, Relaxed) {
                    retiring.push(s.clone());
                }
            }
        }
        let active = default.is_some() || by_listener.iter().any(Option::is_some);
        let routes = Routes { default, by_listener, sinks };
        for s in routes.live_sinks() {
            s.ask_reopen();
        }
        *g = Arc::new(routes);
        drop(g);
        self.active.store(active, Relaxed);
        if !retiring.is_empty() {
            let routes = self.routes.clone();
            let _ = std::thread::Builder::new().name("balancer-access-log-retire".into()).spawn(move || {
                std::thread::sleep(RETIRE_AFTER);
                let mut g = routes.write().unwrap_or_else(|e| e.into_inner());
                let mut r = (**g).clone();
                for slot in r.sinks.iter_mut() {
                    if slot.as_ref().is_some_and(|s| retiring.iter().any(|x| Arc::ptr_eq(x, s))) {
                        *slot = None;
                    }
                }
                *g = Arc::new(r);
            });
        }
    }

    /// New formats and destinations from a reload, at once (see [`AccessLog::prepare`]).
    pub fn reconfigure(&self, top: Option<&AccessLogSpec>, listeners: &[ListenerLog]) -> Result<(), String> {
        let p = self.prepare(top, listeners)?;
        self.commit(p, top, listeners);
        Ok(())
    }

    /// Reopen the files (logrotate), with a new top-level format if given.
    pub fn reopen(&self, format: Option<&str>) -> Result<(), String> {
        if let Some(f) = format {
            let f = Arc::new(compile(f)?);
            let mut g = self.routes.write().unwrap_or_else(|e| e.into_inner());
            let mut r = (**g).clone();
            let old = r.default.as_ref().map(|d| Arc::as_ptr(&d.format));
            for x in r.by_listener.iter_mut().flatten().chain(r.default.iter_mut()) {
                if Some(Arc::as_ptr(&x.format)) == old {
                    x.format = f.clone();
                }
            }
            *g = Arc::new(r);
        }
        for s in self.current().live_sinks() {
            s.ask_reopen();
        }
        Ok(())
    }

    /// The format of `listener`'s lines (None: not logged).
    pub fn format_of(&self, listener: usize) -> Option<Arc<Format>> {
        if !self.active() {
            return None;
        }
        self.routes.read().unwrap_or_else(|e| e.into_inner()).get(listener).map(|r| r.format.clone())
    }

    /// Whether connections closed before sending a byte are logged on `listener`.
    pub fn logs_empty(&self, listener: usize) -> bool {
        self.active() && self.routes.read().unwrap_or_else(|e| e.into_inner()).get(listener).is_some_and(|r| r.log_empty)
    }

    /// Wait (bounded) until every writer wrote what it was given.
    pub fn sync(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        for s in self.current().live_sinks() {
            let (ack, done) = sync_channel(1);
            if s.tx.try_send(Msg::Sync(ack)).is_ok() {
                let _ = done.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
            }
        }
    }

    pub fn log(&self, buf: &LogBuf, r: &Record<'_>) {
        if !self.active() {
            return;
        }
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        let Some(route) = routes.get(r.listener) else { return };
        let mut g = buf.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() <= route.sink {
            g.resize_with(routes.sinks.len(), || (Vec::new(), 0));
        }
        let b = &mut g[route.sink];
        route.format.write(&mut b.0, r);
        b.1 += 1;
        if b.0.len() >= FLUSH_AT {
            self.send(&routes, route.sink, b);
        }
    }

    pub fn flush(&self, buf: &LogBuf) {
        let mut g = buf.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_empty() {
            return;
        }
        let routes = self.current();
        for (i, b) in g.iter_mut().enumerate() {
            if b.1 > 0 {
                self.send(&routes, i, b);
            }
        }
    }

    fn send(&self, routes: &Routes, sink: usize, g: &mut (Vec<u8>, u64)) {
        let Some(Some(s)) = routes.sinks.get(sink) else {
            // its writer closed (a reload removed the destination long ago)
            self.dropped.fetch_add(g.1, Relaxed);
            g.0.clear();
            g.1 = 0;
            return;
        };
        let lines = std::mem::replace(&mut g.0, Vec::with_capacity(FLUSH_AT + 4096));
        match s.tx.try_send(Msg::Lines(lines)) {
            Ok(()) => {}
            Err(TrySendError::Full(Msg::Lines(mut back))) | Err(TrySendError::Disconnected(Msg::Lines(mut back))) => {
                self.dropped.fetch_add(g.1, Relaxed);
                back.clear();
                g.0 = back;
            }
            Err(_) => {}
        }
        g.1 = 0;
    }
}

/// A worker's pending lines, one buffer per destination.
#[derive(Default)]
pub struct LogBuf(Mutex<Vec<(Vec<u8>, u64)>>);

#[cfg(test)]
mod tests;
