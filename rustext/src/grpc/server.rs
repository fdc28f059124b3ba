//! A gRPC server for `pb.RRAPI` (plus pass-through "raw" unary methods) on
//! hyper's HTTP/2 server, one tokio current-thread runtime on its own thread.
//!
//! Requests are decoded here and queued on a [`Bridge`]; the application
//! (Python's event loop) learns that the queue went non-empty through a
//! wake-up socket (one byte written only on the empty → non-empty edge),
//! takes the whole queue at once ([`Bridge::take`]) and answers each call by
//! token ([`Bridge::complete`]). The runtime thread never waits on the
//! application: a call not answered by its deadline (`grpc-timeout`, or
//! `max_wait` when the client sent none) gets `DEADLINE_EXCEEDED`; a call
//! the client cancels is forgotten (a late answer is dropped).
//!
//! Statuses produced here: `UNIMPLEMENTED` (unknown method, compressed
//! message), `INTERNAL` (malformed framing or protobuf), `RESOURCE_EXHAUSTED`
//! (message over `max_message`), `UNAVAILABLE` (draining or closed),
//! `DEADLINE_EXCEEDED`; the application adds its own through
//! [`Reply::Status`].
//!
//! Lifecycle: [`GrpcServer::start`] binds and starts; [`GrpcServer::drain`]
//! closes the listener, sends GOAWAY on every connection and refuses new
//! calls while calls already queued can still be answered;
//! [`GrpcServer::close`] fails what is left with `UNAVAILABLE`, stops the
//! runtime and joins its thread (also on drop).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame};
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::{oneshot, watch};

use super::frame::{encode_message, percent_encode, unary_message, Code, FrameError};
use super::proto::{
    CurIdReply, CurIdRequest, DecodeError, NextIdReply, NextIdRequest, SetIdReply, SetIdRequest,
};

pub const NEXT_ID_PATH: &str = "/pb.RRAPI/GRPCNextID";
pub const CUR_ID_PATH: &str = "/pb.RRAPI/GRPCCurID";
pub const SET_ID_PATH: &str = "/pb.RRAPI/GRPCSetID";

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest request message accepted (bytes).
    pub max_message: usize,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS per connection.
    pub max_concurrent_streams: u32,
    /// How long a call may wait for its answer when the client sent no `grpc-timeout`.
    pub max_wait: Duration,
    /// Full paths (`/package.Service/Method`) passed to the application as raw bytes.
    pub raw_methods: Vec<String>,
    /// TLS: every connection is a TLS handshake (ALPN `h2`) first, done on
    /// the runtime thread; certificates come from the config's resolver.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_message: 4 << 20,
            max_concurrent_streams: 4096,
            max_wait: Duration::from_secs(60),
            raw_methods: Vec::new(),
            tls: None,
        }
    }
}

/// One decoded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    NextId(NextIdRequest),
    CurId(CurIdRequest),
    SetId(SetIdRequest),
    /// Index into `raw_methods`, and the request message.
    Raw(usize, Bytes),
}

impl Call {
    fn kind(&self) -> Kind {
        match self {
            Call::NextId(_) => Kind::NextId,
            Call::CurId(_) => Kind::CurId,
            Call::SetId(_) => Kind::SetId,
            Call::Raw(..) => Kind::Raw,
        }
    }
}

/// Which reply a pending call expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    NextId,
    CurId,
    SetId,
    Raw,
}

/// A queued call, as the application takes it.
#[derive(Debug)]
pub struct Queued {
    pub token: u64,
    pub call: Call,
    /// The client's deadline (None: the client sent no `grpc-timeout`).
    pub deadline: Option<Instant>,
}

/// The answer to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    NextId(NextIdReply),
    CurId(CurIdReply),
    SetId(SetIdReply),
    Raw(Bytes),
    Status(Code, String),
}

impl Reply {
    /// The reply of kind `kind` built from two integers (NextID: from, to; CurID: cur; SetID: success != 0).
    pub fn from_ints(kind: Kind, a: u64, b: u64) -> Reply {
        match kind {
            Kind::NextId => Reply::NextId(NextIdReply { from_id: a, to_id: b }),
            Kind::CurId => Reply::CurId(CurIdReply { cur_id: a }),
            Kind::SetId => Reply::SetId(SetIdReply { success: a != 0 }),
            Kind::Raw => Reply::Status(Code::Internal, "raw method answered with integers".into()),
        }
    }
}

struct BridgeInner {
    queue: Vec<Queued>,
    pending: HashMap<u64, (Kind, oneshot::Sender<Reply>)>,
    next: u64,
    open: bool,
}

/// The queue between the runtime thread and the application (see the module doc).
pub struct Bridge {
    inner: Mutex<BridgeInner>,
    wake_tx: UnixStream,
    wake_rx: UnixStream,
}

impl Bridge {
    pub fn new() -> io::Result<Bridge> {
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        Ok(Bridge {
            inner: Mutex::new(BridgeInner {
                queue: Vec::new(),
                pending: HashMap::new(),
                next: 1,
                open: true,
            }),
            wake_tx,
            wake_rx,
        })
    }

    fn lock(&self) -> MutexGuard<'_, BridgeInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The readable end of the wake-up socket (readable while calls are queued).
    pub fn wake_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.wake_rx.as_raw_fd()
    }

    /// Queue a call; None when the server refuses new calls.
    pub fn submit(&self, call: Call, deadline: Option<Instant>) -> Option<(u64, oneshot::Receiver<Reply>)> {
        let (tx, rx) = oneshot::channel();
        let mut g = self.lock();
        if !g.open {
            return None;
        }
        let token = g.next;
        g.next += 1;
        g.pending.insert(token, (call.kind(), tx));
        let was_empty = g.queue.is_empty();
        g.queue.push(Queued { token, call, deadline });
        if was_empty {
            // Full buffer means a wake-up is already pending: nothing to do.
            let _ = (&self.wake_tx).write(&[1]);
        }
        Some((token, rx))
    }

    /// Every queued call, oldest first; clears the wake-up.
    pub fn take(&self) -> Vec<Queued> {
        let mut g = self.lock();
        let out = std::mem::take(&mut g.queue);
        let mut buf = [0u8; 64];
        while let Ok(n) = (&self.wake_rx).read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        out
    }

    /// Answer call `token` with what `make(kind)` builds; false if it is gone
    /// (answered, expired, cancelled by the client, or the server closed).
    pub fn complete(&self, token: u64, make: impl FnOnce(Kind) -> Reply) -> bool {
        let entry = self.lock().pending.remove(&token);
        match entry {
            Some((kind, tx)) => tx.send(make(kind)).is_ok(),
            None => false,
        }
    }

    /// Answer many calls under one lock.
    pub fn complete_many(&self, items: impl IntoIterator<Item = (u64, u64, u64)>) -> usize {
        let mut done = Vec::new();
        {
            let mut g = self.lock();
            for (token, a, b) in items {
                if let Some((kind, tx)) = g.pending.remove(&token) {
                    done.push((tx, Reply::from_ints(kind, a, b)));
                }
            }
        }
        let mut n = 0;
        for (tx, r) in done {
            n += usize::from(tx.send(r).is_ok());
        }
        n
    }

    fn forget(&self, token: u64) {
        self.lock().pending.remove(&token);
    }

    /// Calls queued or taken but not answered yet.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Refuse new calls (they get UNAVAILABLE).
    pub fn refuse(&self) {
        self.lock().open = false;
    }

    /// Refuse new calls and answer every pending one with `code`.
    pub fn fail_all(&self, code: Code, msg: &str) {
        let pending = {
            let mut g = self.lock();
            g.open = false;
            g.queue.clear();
            std::mem::take(&mut g.pending)
        };
        for (_, (_, tx)) in pending {
            let _ = tx.send(Reply::Status(code, msg.to_owned()));
        }
    }
}

/// Removes a call's pending entry when its stream goes away (cancelled, timed out).
struct Forget<'a> {
    bridge: &'a Bridge,
    token: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.bridge.forget(self.token);
    }
}

/// A unary gRPC response body: at most one data frame, then the trailers.
pub struct GrpcBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl GrpcBody {
    pub fn empty() -> GrpcBody {
        GrpcBody { data: None, trailers: None }
    }
}

impl Body for GrpcBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(d) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        if let Some(t) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

fn status_headers(h: &mut HeaderMap, code: Code, msg: &str) {
    h.insert("grpc-status", HeaderValue::from_static(code.as_str()));
    if !msg.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&percent_encode(msg)) {
            h.insert("grpc-message", v);
        }
    }
}

/// A "trailers-only" response carrying a non-OK status.
pub fn status_response(code: Code, msg: &str) -> Response<GrpcBody> {
    let mut r = Response::new(GrpcBody::empty());
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, GRPC);
    status_headers(h, code, msg);
    r
}

fn message_response(msg: &[u8]) -> Response<GrpcBody> {
    let mut data = Vec::with_capacity(5 + msg.len());
    encode_message(msg, &mut data);
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut r = Response::new(GrpcBody { data: Some(data.into()), trailers: Some(trailers) });
    r.headers_mut().insert(CONTENT_TYPE, GRPC);
    r
}

fn reply_response(reply: Reply) -> Response<GrpcBody> {
    let mut m = Vec::with_capacity(24);
    match reply {
        Reply::NextId(r) => r.encode(&mut m),
        Reply::CurId(r) => r.encode(&mut m),
        Reply::SetId(r) => r.encode(&mut m),
        Reply::Raw(b) => return message_response(&b),
        Reply::Status(code, msg) => return status_response(code, &msg),
    }
    message_response(&m)
}

struct Srv {
    bridge: Arc<Bridge>,
    config: ServerConfig,
}

type Failure = (Code, String);

fn bad_proto(e: DecodeError) -> Failure {
    (Code::Internal, format!("cannot parse the request message: {e}"))
}

fn bad_frame(e: FrameError) -> Failure {
    (e.code(), e.to_string())
}

async fn handle(srv: Arc<Srv>, req: Request<hyper::body::Incoming>) -> Result<Response<GrpcBody>, Infallible> {
    let is_grpc = req
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if !is_grpc {
        let mut r = Response::new(GrpcBody::empty());
        *r.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return Ok(r);
    }
    Ok(match serve(&srv, req).await {
        Ok(reply) => reply_response(reply),
        Err((code, msg)) => status_response(code, &msg),
    })
}

async fn serve(srv: &Srv, req: Request<hyper::body::Incoming>) -> Result<Reply, Failure> {
    let path = req.uri().path();
    enum M {
        Next,
        Cur,
        Set,
        Raw(usize),
    }
    let m = match path {
        NEXT_ID_PATH => M::Next,
        CUR_ID_PATH => M::Cur,
        SET_ID_PATH => M::Set,
        p => match srv.config.raw_methods.iter().position(|r| r == p) {
            Some(i) => M::Raw(i),
            None => return Err((Code::Unimplemented, format!("unknown method {p}"))),
        },
    };
    if req.method() != http::Method::POST {
        return Err((Code::Unimplemented, "gRPC needs POST".into()));
    }
    let now = Instant::now();
    let client_deadline = match req.headers().get("grpc-timeout") {
        None => None,
        Some(v) => match super::frame::parse_timeout(v.as_bytes()) {
            Some(t) => Some(now + t.min(Duration::from_secs(86_400 * 365))),
            None => return Err((Code::Internal, "malformed grpc-timeout".into())),
        },
    };
    let deadline = client_deadline.unwrap_or(now + srv.config.max_wait);
    let max = srv.config.max_message;
    let body = Limited::new(req.into_body(), max.saturating_add(5));
    let body = match tokio::time::timeout_at(deadline.into(), body.collect()).await {
        Err(_) => return Err((Code::DeadlineExceeded, "deadline exceeded reading the request".into())),
        Ok(Err(e)) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                return Err((Code::ResourceExhausted, format!("request larger than {max} bytes")));
            }
            return Err((Code::Cancelled, format!("request body: {e}")));
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    let msg = unary_message(&body, max).map_err(bad_frame)?;
    let call = match m {
        M::Next => Call::NextId(NextIdRequest::decode(msg).map_err(bad_proto)?),
        M::Cur => Call::CurId(CurIdRequest::decode(msg).map_err(bad_proto)?),
        M::Set => Call::SetId(SetIdRequest::decode(msg).map_err(bad_proto)?),
        M::Raw(i) => Call::Raw(i, body.slice(5..)),
    };
    let Some((token, rx)) = srv.bridge.submit(call, client_deadline) else {
        return Err((Code::Unavailable, "server is shutting down".into()));
    };
    let _forget = Forget { bridge: &srv.bridge, token };
    match tokio::time::timeout_at(deadline.into(), rx).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(_)) => Err((Code::Unavailable, "server closed".into())),
        Err(_) => Err((Code::DeadlineExceeded, "deadline exceeded".into())),
    }
}

/// How long a client may take to complete its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn serve_tcp(sock: tokio::net::TcpStream, srv: Arc<Srv>, stop: watch::Receiver<u8>) {
    let _ = sock.set_nodelay(true);
    match srv.config.tls.clone() {
        None => serve_conn(sock, srv, stop).await,
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls);
            // A failed or slow handshake ends this connection only.
            if let Ok(Ok(stream)) = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
                serve_conn(stream, srv, stop).await
            }
        }
    }
}

async fn serve_conn<S>(sock: S, srv: Arc<Srv>, mut stop: watch::Receiver<u8>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let streams = srv.config.max_concurrent_streams;
    let svc = service_fn(move |req| handle(srv.clone(), req));
    let mut b = http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_concurrent_streams(streams)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    let conn = b.serve_connection(TokioIo::new(sock), svc);
    tokio::pin!(conn);
    if *stop.borrow() == 0 {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = stop.wait_for(|v| *v >= 1) => {}
        }
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

async fn accept_loop(listener: tokio::net::TcpListener, srv: Arc<Srv>, stop: watch::Receiver<u8>) {
    let mut stopped = stop.clone();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((sock, _)) => {
                    tokio::spawn(serve_tcp(sock, srv.clone(), stop.clone()));
                }
                // Out of file descriptors and the like: do not spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = stopped.wait_for(|v| *v >= 1) => break,
        }
    }
    drop(listener);
    let _ = stopped.wait_for(|v| *v >= 2).await;
}

/// A running server (see the module doc).
pub struct GrpcServer {
    bridge: Arc<Bridge>,
    local_addr: SocketAddr,
    stop: watch::Sender<u8>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl GrpcServer {
    /// Bind `addr` and start the runtime thread; errors come back before any thread starts.
    pub fn start(addr: SocketAddr, config: ServerConfig) -> io::Result<GrpcServer> {
        let domain = if addr.is_ipv4() { socket2::Domain::IPV4 } else { socket2::Domain::IPV6 };
        let sock = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
        sock.set_reuse_address(true)?;
        sock.set_nonblocking(true)?;
        sock.bind(&addr.into())?;
        sock.listen(1024)?;
        let std_listener: std::net::TcpListener = sock.into();
        let local_addr = std_listener.local_addr()?;
        let bridge = Arc::new(Bridge::new()?);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let listener = {
            let _g = rt.enter();
            tokio::net::TcpListener::from_std(std_listener)?
        };
        let (stop, stop_rx) = watch::channel(0u8);
        let srv = Arc::new(Srv { bridge: bridge.clone(), config });
        let thread = std::thread::Builder::new()
            .name("grpc-server".into())
            .spawn(move || {
                rt.block_on(accept_loop(listener, srv, stop_rx));
                // Connections and calls still running are dropped here (closed sockets).
                rt.shutdown_timeout(Duration::from_millis(200));
            })?;
        Ok(GrpcServer { bridge, local_addr, stop, thread: Mutex::new(Some(thread)) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn bridge(&self) -> &Arc<Bridge> {
        &self.bridge
    }

    /// Stop accepting connections and calls; calls already queued may still be answered.
    pub fn drain(&self) {
        self.bridge.refuse();
        self.stop.send_if_modified(|v| {
            if *v < 1 {
                *v = 1;
                true
            } else {
                false
            }
        });
    }

    /// Fail what is left with UNAVAILABLE, stop the runtime and join its thread. Idempotent.
    pub fn close(&self) {
        self.bridge.fail_all(Code::Unavailable, "server closed");
        self.stop.send_replace(2);
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            // Answers already handed to hyper get a moment to be written (GOAWAY, trailers).
            let _ = t.join();
        }
    }

    pub fn is_closed(&self) -> bool {
        *self.stop.borrow() >= 2
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    /// One raw HTTP/2 request: (HTTP status, grpc-status, grpc-message) from headers or trailers.
    async fn raw(addr: SocketAddr, path: &str, ctype: &str, timeout: Option<&str>, body: Vec<u8>) -> (u16, Option<String>, String) {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut b = Request::post(format!("http://{addr}{path}")).header(CONTENT_TYPE, ctype);
        if let Some(t) = timeout {
            b = b.header("grpc-timeout", t);
        }
        let resp = send.send_request(b.body(Full::new(Bytes::from(body))).unwrap()).await.unwrap();
        let status = resp.status().as_u16();
        let (parts, body) = resp.into_parts();
        let collected = body.collect().await.unwrap();
        let h = collected.trailers().cloned().unwrap_or(parts.headers);
        let get = |k: &str| h.get(k).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        (status, get("grpc-status"), get("grpc-message").unwrap_or_default())
    }

    /// Whether the wake-up socket holds a byte (peeked: nothing is consumed).
    fn has_wakeup(fd: std::os::fd::RawFd) -> bool {
        // SAFETY: `fd` stays open (owned by the Bridge); ManuallyDrop never closes it.
        let s = std::mem::ManuallyDrop::new(unsafe { <socket2::Socket as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8];
        matches!(s.peek(&mut buf), Ok(n) if n > 0)
    }

    fn framed(msg: &[u8], flag: u8) -> Vec<u8> {
        let mut v = Vec::new();
        encode_message(msg, &mut v);
        v[0] = flag;
        v
    }

    #[test]
    fn statuses_for_bad_requests() {
        let server = GrpcServer::start("127.0.0.1:0".parse().unwrap(), ServerConfig { max_message: 64, ..Default::default() }).unwrap();
        let addr = server.local_addr();
        let bridge = server.bridge().clone();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let g = "application/grpc";
            let mut ok = Vec::new();
            NextIdRequest { name: "n".into(), range_size: 1 }.encode(&mut ok);
            let code = |c: Code| Some(c.as_str().to_owned());
            let r = raw(addr, NEXT_ID_PATH, g, None, framed(&ok, 1)).await;
            assert_eq!((r.0, r.1.clone()), (200, code(Code::Unimplemented)), "{r:?}");
            let mut two = framed(&ok, 0);
            two.extend(framed(&ok, 0));
            let r = raw(addr, NEXT_ID_PATH, g, None, two).await;
            assert_eq!(r.1, code(Code::Internal), "{r:?}");
            let r = raw(addr, NEXT_ID_PATH, g, None, framed(&[0x0a, 9], 0)).await;
            assert_eq!(r.1, code(Code::Internal));
            assert!(r.2.contains("cannot parse"), "{r:?}");
            let r = raw(addr, NEXT_ID_PATH, g, None, vec![0, 0, 0]).await;
            assert_eq!(r.1, code(Code::Internal));
            let r = raw(addr, NEXT_ID_PATH, g, None, framed(&[b'x'; 100], 0)).await;
            assert_eq!(r.1, code(Code::ResourceExhausted));
            let r = raw(addr, "/pb.RRAPI/Other", g, None, framed(&ok, 0)).await;
            assert_eq!(r.1, code(Code::Unimplemented));
            assert!(r.2.contains("/pb.RRAPI/Other"));
            let r = raw(addr, NEXT_ID_PATH, g, Some("soon"), framed(&ok, 0)).await;
            assert_eq!(r.1, code(Code::Internal));
            let r = raw(addr, NEXT_ID_PATH, "text/plain", None, framed(&ok, 0)).await;
            assert_eq!((r.0, r.1.clone()), (415, None));
            // nobody answers: the grpc-timeout does
            let r = raw(addr, NEXT_ID_PATH, "application/grpc+proto", Some("50m"), framed(&ok, 0)).await;
            assert_eq!(r.1, code(Code::DeadlineExceeded));
        });
        // only the one well-formed call reached the queue, and it is forgotten
        let q = bridge.take();
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].call, Call::NextId(NextIdRequest { name: "n".into(), range_size: 1 }));
        assert!(q[0].deadline.is_some());
        assert_eq!(bridge.pending(), 0);
        assert!(!bridge.complete(q[0].token, |k| Reply::from_ints(k, 1, 2)));
        server.close();
    }

    #[test]
    fn wake_fd_is_readable_only_while_calls_wait() {
        let b = Bridge::new().unwrap();
        let readable = || has_wakeup(b.wake_fd());
        assert!(!readable());
        let (t1, _r1) = b.submit(Call::CurId(CurIdRequest { name: "a".into() }), None).unwrap();
        let (t2, r2) = b.submit(Call::CurId(CurIdRequest { name: "b".into() }), None).unwrap();
        assert!(readable());
        let q = b.take();
        assert_eq!(q.iter().map(|q| q.token).collect::<Vec<_>>(), [t1, t2]);
        assert!(!readable());
        assert_eq!(b.pending(), 2);
        assert_eq!(b.complete_many([(t2, 7, 0), (999, 1, 1)]), 1);
        assert_eq!(r2.blocking_recv().unwrap(), Reply::CurId(CurIdReply { cur_id: 7 }));
        b.fail_all(Code::Unavailable, "bye");
        assert!(b.submit(Call::CurId(CurIdRequest::default()), None).is_none());
        assert_eq!(b.pending(), 0);
    }
}
