//! HTTP/2 to backends (pools with `proto = "h2"`): multiplexed connections,
//! a few per backend per worker, each carrying many requests at once.
//!
//! - Plain backends get h2c with prior knowledge (the connection preface
//!   right away, as HAProxy's `proto h2`); TLS backends are offered ALPN `h2`
//!   and spoken to in HTTP/2.
//! - A connection takes new streams up to the backend's
//!   `SETTINGS_MAX_CONCURRENT_STREAMS` (read from its first SETTINGS frame,
//!   [`super::h2settings`], which a new connection waits for before its
//!   first request) or the pool's `h2_max_streams` ([`H2Limits`], 100 by
//!   default), whichever is lower; then another one is opened, up to the
//!   pool's `h2_connections` (8). Past that, requests go to the least loaded
//!   connection (hyper queues them beyond the backend's own limit, which is
//!   never exceeded).
//! - A connection that ended (GOAWAY, reset, idle close by the backend) is
//!   dropped from the pool at the next pick; a request it refused before
//!   sending goes on a new connection, once, like a stale HTTP/1 one.
//! - One connection is opened at a time per backend per worker: requests
//!   that arrive meanwhile wait for it (within the connect timeout) instead
//!   of each opening their own.
//!
//! Only the owning worker's tasks touch a pool, so its lock is never contended.

pub use super::config::H2Limits;
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{header, Request, Uri};
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::h2settings::{Sniffed, Sniffer};
use super::net::SendStream;
use super::pool::Fail;
use super::outcome::{Held, Outcome, Slot};
use super::reqbody::{Progress, ReqBody};
use super::upstream::Backend;

/// Receive windows: large enough that a stream's window never throttles a
/// response on a fast network (hyper's defaults, stated).
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONN_WINDOW: u32 = 5 * 1024 * 1024;

/// One multiplexed connection.
#[derive(Clone)]
struct Conn {
    tx: SendRequest<ReqBody>,
    /// Streams in flight on it (requests not yet done with their response).
    streams: Arc<AtomicU32>,
    /// The backend's limit once known (its first SETTINGS frame).
    limit: Arc<AtomicU32>,
    /// The pool's own limit when it was opened.
    cap: u32,
    /// Streams ever opened on it, and that count at the last sweep: a
    /// connection that opened none between two sweeps is idle.
    opened: u64,
    swept: u64,
}

impl Conn {
    fn capacity(&self) -> u32 {
        self.limit.load(Relaxed).min(self.cap)
    }
}

#[derive(Default)]
struct Entry {
    conns: Vec<Conn>,
    /// Held while a connection to this backend is being opened.
    connecting: Arc<tokio::sync::Mutex<()>>,
}

/// The HTTP/2 connections of one worker, by backend id.
pub struct H2Pool {
    backends: Mutex<HashMap<u64, Entry>>,
    /// TLS to backends, offering ALPN `h2` only (None: h2c).
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl H2Pool {
    /// `tls`: the balancer's backend TLS configuration, if any (its ALPN is
    /// replaced by `h2`).
    pub fn new(tls: Option<&Arc<rustls::ClientConfig>>) -> Self {
        let tls = tls.map(|c| {
            let mut c = (**c).clone();
            c.alpn_protocols = vec![b"h2".to_vec()];
            Arc::new(c)
        });
        H2Pool {
            backends: Mutex::new(HashMap::new()),
            tls,
        }
    }

    /// A stream on an open connection with room (or, with every connection
    /// open and full, on the least loaded one); None when a new connection
    /// should be opened.
    fn pick(&self, id: u64, limits: H2Limits) -> Option<(SendRequest<ReqBody>, Slot)> {
        let mut g = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        let e = g.get_mut(&id)?;
        e.conns.retain(|c| !c.tx.is_closed());
        let load = |c: &Conn| c.streams.load(Relaxed);
        let i = match e.conns.iter().position(|c| load(c) < c.capacity()) {
            Some(i) => i,
            None if e.conns.len() >= limits.connections => {
                (0..e.conns.len()).min_by_key(|&i| load(&e.conns[i]))?
            }
            None => return None,
        };
        let c = &mut e.conns[i];
        c.opened += 1;
        let (tx, streams) = (c.tx.clone(), c.streams.clone());
        streams.fetch_add(1, Relaxed);
        Some((tx, Slot(streams)))
    }

    fn connecting(&self, id: u64) -> Arc<tokio::sync::Mutex<()>> {
        let mut g = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        g.entry(id).or_default().connecting.clone()
    }

    /// A stream to `b`: on an open connection (`true`) or a new one.
    async fn acquire(&self, b: &Backend, timeout: Duration, limits: H2Limits) -> Result<(SendRequest<ReqBody>, Slot, bool), Fail> {
        if let Some((tx, slot)) = self.pick(b.id, limits) {
            return Ok((tx, slot, true));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let lock = self.connecting(b.id);
        let Ok(_opening) = tokio::time::timeout_at(deadline, lock.lock_owned()).await else {
            return Err(Fail::ConnectTimeout);
        };
        // another request may have opened one while this one waited
        if let Some((tx, slot)) = self.pick(b.id, limits) {
            return Ok((tx, slot, true));
        }
        // boxed: the rare path's futures (TLS, handshake) would otherwise grow
        // every request's future, which is moved whole at least once
        let conn = Box::pin(self.connect(b, deadline, limits)).await?;
        conn.streams.fetch_add(1, Relaxed);
        let got = (conn.tx.clone(), Slot(conn.streams.clone()), false);
        let mut g = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        g.entry(b.id).or_default().conns.push(conn);
        Ok(got)
    }

    async fn connect(&self, b: &Backend, deadline: tokio::time::Instant, limits: H2Limits) -> Result<Conn, Fail> {
        let stream = match tokio::time::timeout_at(deadline, TcpStream::connect(b.addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => return Err(Fail::Connect),
            Err(_) => return Err(Fail::ConnectTimeout),
        };
        let _ = stream.set_nodelay(true);
        let limit = Arc::new(AtomicU32::new(limits.streams));
        let settled = Arc::new(tokio::sync::Notify::new());
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONN_WINDOW)
            .initial_max_send_streams(limits.streams as usize);
        let tx = match &self.tls {
            None => {
                let io = TokioIo::new(Sniffing::new(SendStream(stream), limit.clone(), settled.clone()));
                let (tx, conn) = tokio::time::timeout_at(deadline, builder.handshake(io))
                    .await
                    .map_err(|_| Fail::ConnectTimeout)?
                    .map_err(|_| Fail::Connect)?;
                tokio::spawn(conn);
                tx
            }
            Some(tls) => {
                let stream = tokio::time::timeout_at(deadline, super::backend_tls::connect_backend(tls, &b.authority, stream))
                    .await
                    .map_err(|_| Fail::ConnectTimeout)?
                    .map_err(|_| Fail::Connect)?;
                let io = TokioIo::new(Sniffing::new(stream, limit.clone(), settled.clone()));
                let (tx, conn) = tokio::time::timeout_at(deadline, builder.handshake(io))
                    .await
                    .map_err(|_| Fail::ConnectTimeout)?
                    .map_err(|_| Fail::Connect)?;
                tokio::spawn(conn);
                tx
            }
        };
        // Until its SETTINGS arrive a backend's stream limit is unknown (HTTP/2
        // lets a client assume none): streams sent meanwhile over a lower limit
        // would be refused. Servers send them at once; one that does not is no
        // working HTTP/2 server.
        if tokio::time::timeout_at(deadline, settled.notified()).await.is_err() {
            return Err(Fail::ConnectTimeout);
        }
        Ok(Conn {
            tx,
            streams: Arc::new(AtomicU32::new(0)),
            limit,
            cap: limits.streams,
            opened: 1,
            swept: 0,
        })
    }

    /// Forget connections that ended, and close those that stayed idle
    /// since the last sweep (run every half `pool_idle_timeout`): backends
    /// that left the configuration, or quiet ones, keep no connection open.
    pub fn sweep(&self) {
        let mut g = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        g.retain(|_, e| {
            e.conns.retain_mut(|c| {
                let idle = c.opened == c.swept && c.streams.load(Relaxed) == 0;
                c.swept = c.opened;
                !c.tx.is_closed() && !idle
            });
            !e.conns.is_empty() || Arc::strong_count(&e.connecting) > 1
        });
    }
}

/// A request as HTTP/2 sends it: the target in absolute form (`:scheme`,
/// `:authority` from the client's Host, else the backend's address), no
/// `Host` header (RFC 9113 §8.3.1). Idempotent: a request moving on to
/// another backend keeps its authority.
fn as_h2(mut req: Request<ReqBody>, b: &Backend, tls: bool) -> Request<ReqBody> {
    if req.uri().authority().is_some() {
        return req;
    }
    let authority = req
        .headers_mut()
        .remove(header::HOST)
        .and_then(|h| Authority::try_from(h.as_bytes()).ok())
        .unwrap_or_else(|| b.authority.clone());
    let mut parts = std::mem::take(req.uri_mut()).into_parts();
    parts.scheme = Some(if tls { Scheme::HTTPS } else { Scheme::HTTP });
    parts.authority = Some(authority);
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    *req.uri_mut() = Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"));
    *req.version_mut() = http::Version::HTTP_2;
    req
}

/// What holds a worker's [`H2Pool`]: the worker (implemented there; this
/// module sits below the worker state, which owns the pool).
pub trait HasH2Pool {
    fn h2_pool(&self) -> &H2Pool;
}

impl<T: HasH2Pool> HasH2Pool for Arc<T> {
    #[inline]
    fn h2_pool(&self) -> &H2Pool {
        (**self).h2_pool()
    }
}

/// One attempt on an HTTP/2 backend; the semantics of [`super::proxy`]'s
/// HTTP/1 attempt (the response wait extended while the upload moves, a
/// request refused by a stale connection sent again on a new one).
pub(super) async fn send(
    w: &impl HasH2Pool,
    b: &Backend,
    req: Request<ReqBody>,
    connect: Duration,
    wait: Duration,
    progress: Option<&Progress>,
    limits: H2Limits,
) -> Outcome {
    let pool = w.h2_pool();
    let mut req = as_h2(req, b, pool.tls.is_some());
    let mut fresh_only = false;
    loop {
        let got = if fresh_only {
            // a connection of the pool refused it unsent: a new one
            let deadline = tokio::time::Instant::now() + connect;
            Box::pin(pool.connect(b, deadline, limits)).await.map(|c| {
                c.streams.fetch_add(1, Relaxed);
                let got = (c.tx.clone(), Slot(c.streams.clone()), false);
                let mut g = pool.backends.lock().unwrap_or_else(|e| e.into_inner());
                g.entry(b.id).or_default().conns.push(c);
                got
            })
        } else {
            pool.acquire(b, connect, limits).await
        };
        let (mut tx, slot, reused) = match got {
            Ok(x) => x,
            Err(f) => return Outcome::Unsent(req, f),
        };
        let exchange = tx.try_send_request(req);
        tokio::pin!(exchange);
        let mut seen = progress.map_or(0, |p| p.frames());
        let result = loop {
            match tokio::time::timeout(wait, exchange.as_mut()).await {
                Ok(r) => break Some(r),
                Err(_) => match progress.map(|p| p.frames()) {
                    Some(now) if now != seen => seen = now,
                    _ => break None,
                },
            }
        };
        match result {
            Some(Ok(resp)) => return Outcome::Response(resp, Held::H2(slot)),
            Some(Err(mut e)) => match e.take_message() {
                Some(r) if reused && !fresh_only => {
                    req = r;
                    fresh_only = true;
                }
                Some(r) => return Outcome::Unsent(r, Fail::Reset),
                None => return Outcome::Sent(Fail::Reset),
            },
            None => return Outcome::Sent(Fail::Timeout),
        }
    }
}

/// A backend stream that shows its first bytes to a [`Sniffer`] and stores
/// the stream limit it finds; after that, reads pass straight through.
struct Sniffing<S> {
    io: S,
    sniffer: Option<Box<Sniffer>>,
    limit: Arc<AtomicU32>,
    /// Told once the first frame was read (or the connection ended first).
    settled: Arc<tokio::sync::Notify>,
}

impl<S> Sniffing<S> {
    fn new(io: S, limit: Arc<AtomicU32>, settled: Arc<tokio::sync::Notify>) -> Self {
        Sniffing {
            io,
            sniffer: Some(Box::default()),
            limit,
            settled,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sniffing<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut me.io).poll_read(cx, buf);
        if let (Poll::Ready(res), Some(s)) = (&r, me.sniffer.as_mut()) {
            let new = &buf.filled()[before..];
            let done = match res {
                Ok(()) if !new.is_empty() => s.feed(new),
                _ => Sniffed::Done(None), // closed or failed before its SETTINGS
            };
            if let Sniffed::Done(found) = done {
                if let Some(n) = found {
                    me.limit.store(n.max(1), Relaxed);
                }
                me.sniffer = None;
                me.settled.notify_one();
            }
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Sniffing<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
