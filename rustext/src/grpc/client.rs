//! A gRPC client for `pb.RRAPI` on hyper's HTTP/2 client: one connection per
//! target (made on first use, remade after it fails), calls multiplexed as
//! streams, one tokio current-thread runtime on its own thread.
//!
//! The application submits calls ([`GrpcClient::call`], never blocks: the
//! call is queued and the runtime woken once per burst) and learns about
//! finished calls the same way the server side does: a wake-up socket made
//! readable on the empty → non-empty edge of the completion queue, and
//! [`GrpcClient::take`] returning every finished call at once.
//!
//! Every call is bounded by its timeout (sent as `grpc-timeout`, and enforced
//! here over connect + request + response). Failures come back as gRPC
//! statuses: `UNAVAILABLE` (cannot connect, connection lost, GOAWAY, HTTP
//! 502/503/504), `DEADLINE_EXCEEDED`, `INTERNAL` (malformed response), or the
//! server's own status.
//!
//! Lifecycle: [`GrpcClient::start`], [`GrpcClient::close`] (drops calls in
//! flight: their completions never come; stops the runtime and joins its
//! thread; also on drop).

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, TE};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;

use super::frame::{encode_message, format_timeout, parse_code, percent_decode, unary_message, Code};
use super::proto::{CurIdReply, CurIdRequest, NextIdReply, NextIdRequest, SetIdReply, SetIdRequest};
use super::server::{Kind, CUR_ID_PATH, NEXT_ID_PATH, SET_ID_PATH};

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub connect_timeout: Duration,
    pub max_message: usize,
    /// TLS to every target (ALPN `h2`), the server checked against the
    /// host part of its `host:port`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig { connect_timeout: Duration::from_secs(1), max_message: 4 << 20, tls: None }
    }
}

/// A call's outcome: two integers (NextID: from, to; CurID: cur, 0; SetID: success, 0) or a status.
pub type Outcome = Result<(u64, u64), (Code, String)>;

/// A finished call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub token: u64,
    pub outcome: Outcome,
}

struct Submitted {
    token: u64,
    target: usize,
    kind: Kind,
    msg: Bytes,
    timeout: Duration,
}

struct Queues {
    submitted: Vec<Submitted>,
    done: Vec<Completion>,
    /// calls running on the runtime: cancelling one aborts its task, which
    /// drops its HTTP/2 stream (the server sees RST_STREAM CANCEL)
    running: HashMap<u64, AbortHandle>,
    /// the batch being spawned: out of `submitted`, not in `running` yet
    spawning: Vec<u64>,
    /// calls of that batch cancelled meanwhile
    cancelled: HashSet<u64>,
    inflight: usize,
    closed: bool,
}

struct Shared {
    q: Mutex<Queues>,
    notify: Notify,
    wake_tx: UnixStream,
    wake_rx: UnixStream,
    targets: Vec<Target>,
    config: ClientConfig,
}

struct Target {
    authority: String,
    conn: tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finish(&self, token: u64, outcome: Outcome) {
        let mut g = self.lock();
        g.running.remove(&token);
        g.inflight = g.inflight.saturating_sub(1);
        if g.closed {
            return;
        }
        let was_empty = g.done.is_empty();
        g.done.push(Completion { token, outcome });
        if was_empty {
            let _ = (&self.wake_tx).write(&[1]);
        }
    }
}

/// A running client (see the module doc).
pub struct GrpcClient {
    shared: Arc<Shared>,
    next: AtomicU64,
    stop: watch::Sender<bool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl GrpcClient {
    /// `targets`: `host:port` each. Starts the runtime thread; connects lazily.
    pub fn start(targets: &[String], config: ClientConfig) -> io::Result<GrpcClient> {
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            q: Mutex::new(Queues {
                submitted: Vec::new(),
                done: Vec::new(),
                running: HashMap::new(),
                spawning: Vec::new(),
                cancelled: HashSet::new(),
                inflight: 0,
                closed: false,
            }),
            notify: Notify::new(),
            wake_tx,
            wake_rx,
            targets: targets
                .iter()
                .map(|t| Target { authority: t.clone(), conn: tokio::sync::Mutex::new(None) })
                .collect(),
            config,
        });
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (stop, stop_rx) = watch::channel(false);
        let sh = shared.clone();
        let thread = std::thread::Builder::new().name("grpc-client".into()).spawn(move || {
            rt.block_on(dispatch(sh, stop_rx));
            rt.shutdown_timeout(Duration::from_millis(200));
        })?;
        Ok(GrpcClient { shared, next: AtomicU64::new(1), stop, thread: Mutex::new(Some(thread)) })
    }

    pub fn targets(&self) -> usize {
        self.shared.targets.len()
    }

    pub fn wake_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.shared.wake_rx.as_raw_fd()
    }

    /// Queue a call of `kind` (`NextId`: name, range_size as i64 bits; `CurId`: name; `SetId`: name, new_id).
    /// Returns its token, or None when `target` is out of range or the client is closed.
    pub fn call(&self, target: usize, kind: Kind, name: &str, arg: u64, timeout: Duration) -> Option<u64> {
        if target >= self.shared.targets.len() || kind == Kind::Raw {
            return None;
        }
        let mut m = Vec::with_capacity(name.len() + 16);
        match kind {
            Kind::NextId => NextIdRequest { name: name.to_owned(), range_size: arg as i64 }.encode(&mut m),
            Kind::CurId => CurIdRequest { name: name.to_owned() }.encode(&mut m),
            Kind::SetId => SetIdRequest { name: name.to_owned(), new_id: arg }.encode(&mut m),
            Kind::Raw => return None,
        }
        let mut framed = Vec::with_capacity(m.len() + 5);
        encode_message(&m, &mut framed);
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        let notify = {
            let mut g = self.shared.lock();
            if g.closed {
                return None;
            }
            g.inflight += 1;
            let was_empty = g.submitted.is_empty();
            g.submitted.push(Submitted { token, target, kind, msg: framed.into(), timeout });
            was_empty
        };
        if notify {
            self.shared.notify.notify_one();
        }
        Some(token)
    }

    /// Every finished call; clears the wake-up.
    pub fn take(&self) -> Vec<Completion> {
        let mut g = self.shared.lock();
        let out = std::mem::take(&mut g.done);
        let mut buf = [0u8; 64];
        while let Ok(n) = (&self.shared.wake_rx).read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        out
    }

    /// Calls submitted and not finished.
    pub fn inflight(&self) -> usize {
        self.shared.lock().inflight
    }

    /// Give up call `token`: not sent yet, it never is; running, its task is
    /// aborted and its stream reset; its completion never comes (one already
    /// queued is dropped). False when the call had finished and was taken.
    pub fn cancel(&self, token: u64) -> bool {
        let mut g = self.shared.lock();
        if let Some(i) = g.submitted.iter().position(|s| s.token == token) {
            g.submitted.swap_remove(i);
            g.inflight = g.inflight.saturating_sub(1);
            return true;
        }
        if let Some(handle) = g.running.remove(&token) {
            handle.abort();
            g.inflight = g.inflight.saturating_sub(1);
            return true;
        }
        if let Some(i) = g.done.iter().position(|c| c.token == token) {
            g.done.swap_remove(i);
            return true;
        }
        if g.spawning.contains(&token) {
            // taken from `submitted`, its task not filed yet: the dispatcher aborts it
            g.cancelled.insert(token);
            g.inflight = g.inflight.saturating_sub(1);
            return true;
        }
        false
    }

    /// Stop: calls in flight are dropped (their completions never come), the thread is joined. Idempotent.
    pub fn close(&self) {
        {
            let mut g = self.shared.lock();
            g.closed = true;
            g.submitted.clear();
            g.done.clear();
        }
        self.stop.send_replace(true);
        self.shared.notify.notify_one();
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

impl Drop for GrpcClient {
    fn drop(&mut self) {
        self.close();
    }
}

async fn dispatch(sh: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let batch = {
            let mut g = sh.lock();
            let batch = std::mem::take(&mut g.submitted);
            g.spawning.extend(batch.iter().map(|s| s.token));
            batch
        };
        if !batch.is_empty() {
            // spawned outside the lock (the application thread submits under it); the
            // tasks cannot run before their handles are filed (this thread's runtime)
            let mut handles = Vec::with_capacity(batch.len());
            for s in batch {
                let sh2 = sh.clone();
                let token = s.token;
                let task = tokio::spawn(async move {
                    let deadline = Instant::now() + s.timeout;
                    let outcome = match tokio::time::timeout_at(deadline.into(), one_call(&sh2, &s)).await {
                        Ok(o) => o,
                        Err(_) => Err((Code::DeadlineExceeded, "deadline exceeded".into())),
                    };
                    sh2.finish(s.token, outcome);
                });
                handles.push((token, task.abort_handle()));
            }
            let mut g = sh.lock();
            g.spawning.clear();
            for (token, handle) in handles {
                if g.cancelled.remove(&token) {
                    handle.abort(); // cancelled while being spawned
                } else {
                    g.running.insert(token, handle);
                }
            }
        }
        if *stop.borrow() {
            return;
        }
        tokio::select! {
            _ = sh.notify.notified() => {}
            _ = stop.wait_for(|v| *v) => return,
        }
    }
}

async fn connection(sh: &Shared, t: &Target) -> Result<SendRequest<Full<Bytes>>, (Code, String)> {
    let mut slot = t.conn.lock().await;
    if let Some(s) = slot.as_ref() {
        if !s.is_closed() {
            return Ok(s.clone());
        }
    }
    *slot = None;
    let unavailable = |e: String| (Code::Unavailable, format!("{}: {e}", t.authority));
    let tcp = tokio::time::timeout(sh.config.connect_timeout, tokio::net::TcpStream::connect(t.authority.as_str()))
        .await
        .map_err(|_| unavailable("connect timed out".into()))?
        .map_err(|e| unavailable(format!("cannot connect: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let sender = match sh.config.tls.clone() {
        None => handshake(sh, tcp).await,
        Some(tls) => {
            let host = host_of(&t.authority);
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|_| unavailable(format!("{host:?} is not a valid TLS server name")))?;
            let stream = tokio::time::timeout(sh.config.connect_timeout, tokio_rustls::TlsConnector::from(tls).connect(name, tcp))
                .await
                .map_err(|_| unavailable("TLS handshake timed out".into()))?
                .map_err(|e| unavailable(format!("TLS handshake: {}", crate::tls::describe_io_error(&e))))?;
            handshake(sh, stream).await
        }
    }
    .map_err(unavailable)?;
    *slot = Some(sender.clone());
    Ok(sender)
}

/// The host of `host:port` (`[v6]:port` too), for TLS's server name.
fn host_of(authority: &str) -> &str {
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The HTTP/2 handshake on a connected stream; its connection task runs on the runtime.
async fn handshake<S>(sh: &Shared, io: S) -> Result<SendRequest<Full<Bytes>>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut b = http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(10)))
        .keep_alive_timeout(Duration::from_secs(5));
    let (sender, conn) = tokio::time::timeout(sh.config.connect_timeout, b.handshake(TokioIo::new(io)))
        .await
        .map_err(|_| "HTTP/2 handshake timed out".to_string())?
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

fn http_status_code(s: StatusCode) -> Code {
    match s.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

fn status_of(h: &http::HeaderMap) -> Option<(Code, String)> {
    let code = parse_code(h.get("grpc-status")?.as_bytes());
    let msg = h.get("grpc-message").map(|v| percent_decode(v.as_bytes())).unwrap_or_default();
    Some((code, msg))
}

async fn one_call(sh: &Shared, s: &Submitted) -> Outcome {
    let t = &sh.targets[s.target];
    let mut sender = connection(sh, t).await?;
    let path = match s.kind {
        Kind::NextId => NEXT_ID_PATH,
        Kind::CurId => CUR_ID_PATH,
        Kind::SetId => SET_ID_PATH,
        Kind::Raw => return Err((Code::Internal, "raw calls are not supported".into())),
    };
    let scheme = if sh.config.tls.is_some() { "https" } else { "http" };
    let req = Request::post(format!("{scheme}://{}{}", t.authority, path))
        .header(CONTENT_TYPE, HeaderValue::from_static("application/grpc"))
        .header(TE, HeaderValue::from_static("trailers"))
        .header("grpc-timeout", format_timeout(s.timeout))
        .body(Full::new(s.msg.clone()))
        .map_err(|e| (Code::Internal, format!("cannot build the request: {e}")))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| (Code::Unavailable, format!("{}: {e}", t.authority)))?;
    let (parts, body) = resp.into_parts();
    if parts.status != StatusCode::OK {
        return Err((http_status_code(parts.status), format!("HTTP status {}", parts.status)));
    }
    if let Some((code, msg)) = status_of(&parts.headers) {
        // Trailers-only response.
        if code != Code::Ok {
            return Err((code, msg));
        }
        return Err((Code::Internal, "OK status without a response message".into()));
    }
    let max = sh.config.max_message;
    let collected = Limited::new(body, max.saturating_add(5))
        .collect()
        .await
        .map_err(|e| (Code::Unavailable, format!("{}: response body: {e}", t.authority)))?;
    let (code, msg) = collected
        .trailers()
        .and_then(status_of)
        .ok_or_else(|| (Code::Internal, "response without grpc-status".to_owned()))?;
    if code != Code::Ok {
        return Err((code, msg));
    }
    let body = collected.to_bytes();
    let m = unary_message(&body, max).map_err(|e| (Code::Internal, format!("response: {e}")))?;
    let bad = |e: super::proto::DecodeError| (Code::Internal, format!("cannot parse the response message: {e}"));
    Ok(match s.kind {
        Kind::NextId => {
            let r = NextIdReply::decode(m).map_err(bad)?;
            (r.from_id, r.to_id)
        }
        Kind::CurId => (CurIdReply::decode(m).map_err(bad)?.cur_id, 0),
        Kind::SetId => (u64::from(SetIdReply::decode(m).map_err(bad)?.success), 0),
        Kind::Raw => unreachable!("refused above"),
    })
}

#[cfg(test)]
mod tests {
    use super::super::server::{Call, GrpcServer, ServerConfig};
    use super::*;

    fn wait_take(c: &GrpcClient, n: usize) -> Vec<Completion> {
        let mut out = Vec::new();
        let end = Instant::now() + Duration::from_secs(10);
        while out.len() < n && Instant::now() < end {
            out.extend(c.take());
            std::thread::sleep(Duration::from_millis(1));
        }
        out.sort_by_key(|c| c.token);
        out
    }

    /// The application side of a server, on a plain thread: answers NextID with [size, 2*size).
    fn serve_in_thread(server: &GrpcServer, stop: Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<usize> {
        let bridge = server.bridge().clone();
        std::thread::spawn(move || {
            let mut served = 0;
            while !stop.load(Ordering::Relaxed) {
                let calls = bridge.take();
                let mut replies = Vec::new();
                for q in calls {
                    match q.call {
                        Call::NextId(r) if r.name == "slow" => {} // never answered: the deadline answers
                        Call::NextId(r) if r.name == "bad" => {
                            bridge.complete(q.token, |_| super::super::server::Reply::Status(Code::OutOfRange, "no more é".into()));
                        }
                        Call::NextId(r) => replies.push((q.token, r.range_size as u64, 2 * r.range_size as u64)),
                        Call::CurId(_) => replies.push((q.token, 42, 0)),
                        Call::SetId(r) => replies.push((q.token, u64::from(r.new_id > 10), 0)),
                        Call::Raw(..) => {}
                    }
                }
                served += bridge.complete_many(replies);
                std::thread::sleep(Duration::from_micros(200));
            }
            served
        })
    }

    #[test]
    fn cancelled_calls_never_complete_and_free_their_slot() {
        let server = GrpcServer::start("127.0.0.1:0".parse().unwrap(), ServerConfig::default()).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let app = serve_in_thread(&server, stop.clone());
        let c = GrpcClient::start(&[server.local_addr().to_string()], ClientConfig::default()).unwrap();
        let sec = Duration::from_secs(30);
        // never answered by the server: only a cancel ends them
        let slow: Vec<u64> = (0..500).map(|_| c.call(0, Kind::NextId, "slow", 1, sec).unwrap()).collect();
        let quick = c.call(0, Kind::NextId, "x", 7, sec).unwrap();
        assert_eq!(wait_take(&c, 1).iter().map(|d| d.token).collect::<Vec<_>>(), vec![quick]);
        assert_eq!(c.inflight(), 500);
        for t in &slow {
            assert!(c.cancel(*t));
        }
        assert_eq!(c.inflight(), 0);
        assert!(!c.cancel(slow[0])); // once only
        assert!(!c.cancel(quick)); // finished and taken
        // the connection still serves, and no cancelled call ever completes
        let after = c.call(0, Kind::NextId, "x", 3, sec).unwrap();
        let got = wait_take(&c, 1);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].token, got[0].outcome.clone()), (after, Ok((3, 6))));
        std::thread::sleep(Duration::from_millis(50));
        assert!(c.take().is_empty());
        c.close();
        stop.store(true, Ordering::Relaxed);
        app.join().unwrap();
        server.drain();
    }

    #[test]
    fn client_and_server_interoperate() {
        let server = GrpcServer::start("127.0.0.1:0".parse().unwrap(), ServerConfig::default()).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let app = serve_in_thread(&server, stop.clone());
        let target = server.local_addr().to_string();
        let c = GrpcClient::start(&[target, "127.0.0.1:1".into()], ClientConfig::default()).unwrap();
        let sec = Duration::from_secs(5);
        let mut tokens = Vec::new();
        for i in 1..=200u64 {
            tokens.push(c.call(0, Kind::NextId, "x", i, sec).unwrap());
        }
        let got = wait_take(&c, 200);
        assert_eq!(got.len(), 200);
        for (i, g) in got.iter().enumerate() {
            let i = i as u64 + 1;
            assert_eq!(g.outcome, Ok((i, 2 * i)));
        }
        let cur = c.call(0, Kind::CurId, "x", 0, sec).unwrap();
        let set = c.call(0, Kind::SetId, "x", 11, sec).unwrap();
        let bad = c.call(0, Kind::NextId, "bad", 1, sec).unwrap();
        let slow = c.call(0, Kind::NextId, "slow", 1, Duration::from_millis(100)).unwrap();
        let down = c.call(1, Kind::CurId, "x", 0, sec).unwrap();
        let got = wait_take(&c, 5);
        let by = |t: u64| got.iter().find(|g| g.token == t).unwrap().outcome.clone();
        assert_eq!(by(cur), Ok((42, 0)));
        assert_eq!(by(set), Ok((1, 0)));
        assert_eq!(by(bad), Err((Code::OutOfRange, "no more é".into())));
        assert_eq!(by(slow).unwrap_err().0, Code::DeadlineExceeded);
        assert_eq!(by(down).unwrap_err().0, Code::Unavailable);
        assert_eq!(server.bridge().pending(), 0);
        assert!(c.call(2, Kind::CurId, "x", 0, sec).is_none());
        // drain: new calls are refused with UNAVAILABLE (GOAWAY or refusal)
        server.drain();
        let after = c.call(0, Kind::CurId, "x", 0, sec).unwrap();
        let got = wait_take(&c, 1);
        assert_eq!(got[0].token, after);
        assert_eq!(got[0].outcome.clone().unwrap_err().0, Code::Unavailable);
        c.close();
        stop.store(true, Ordering::Relaxed);
        assert!(app.join().unwrap() >= 202);
        server.close();
        assert!(server.is_closed());
    }
}
