//! Keep-alive connections to backends, one pool per worker thread.
//!
//! A backend connection is driven inline by the request that uses it (no
//! task of its own: the client connection's task polls both sockets, as an
//! event loop would), and goes back to the pool only once its response body
//! has been read to the end; a connection left mid-message is closed, never
//! reused. Idle ones are dropped past `idle_timeout` and beyond `max_idle`
//! per backend. Only the owning worker's tasks touch a pool, so its lock is
//! never contended.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::proxy::ReqBody;
use super::upstream::Backend;

pub type Sender = SendRequest<ReqBody>;
type Driver = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// Why a backend could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fail {
    Connect,
    ConnectTimeout,
    Reset,
    Timeout,
}

/// One HTTP/1.1 connection to a backend: the request handle and the
/// connection's state machine, which whoever waits on it must poll.
pub struct BackendConn {
    pub tx: Sender,
    /// Dropped as soon as it finishes: that closes the response body
    /// channel, so a reader of a cut-off body sees the error at once.
    conn: Option<Driver>,
    done: bool,
}

impl BackendConn {
    /// Move the connection's I/O forward (write requests, read responses).
    #[inline]
    pub fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(c) = self.conn.as_mut() {
            if c.as_mut().poll(cx).is_ready() {
                self.conn = None;
                self.done = true;
            }
        }
    }

    /// Run the connection to its end on a task of its own (upgrades).
    pub fn detach(self) {
        if let Some(c) = self.conn {
            tokio::spawn(c);
        }
    }

    /// Ready for a new request (false if the connection ended meanwhile).
    async fn ready(&mut self) -> bool {
        poll_fn(|cx| {
            self.drive(cx);
            match self.tx.poll_ready(cx) {
                Poll::Ready(r) => Poll::Ready(r.is_ok()),
                Poll::Pending if self.done => Poll::Ready(false),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

struct Idle {
    bc: BackendConn,
    since: Instant,
}

pub struct Pool {
    idle: Mutex<HashMap<u64, Vec<Idle>>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl Pool {
    pub fn new(max_idle: usize, idle_timeout: Duration) -> Self {
        Pool { idle: Mutex::new(HashMap::new()), max_idle, idle_timeout }
    }

    fn fresh(&self, i: &Idle, now: Instant) -> bool {
        !i.bc.done && (self.idle_timeout.is_zero() || now.duration_since(i.since) < self.idle_timeout)
    }

    fn take(&self, id: u64) -> Option<BackendConn> {
        let mut g = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = g.get_mut(&id)?;
        let now = Instant::now();
        while let Some(i) = list.pop() {
            if self.fresh(&i, now) {
                return Some(i.bc);
            }
        }
        None
    }

    /// A pooled connection (`true`) or a new one (`false`).
    pub async fn acquire(&self, b: &Backend, connect_timeout: Duration) -> Result<(BackendConn, bool), Fail> {
        while let Some(mut bc) = self.take(b.id) {
            // One poll tells whether the backend closed it while idle.
            if bc.ready().await {
                return Ok((bc, true));
            }
        }
        self.connect(b, connect_timeout).await.map(|bc| (bc, false))
    }

    pub async fn connect(&self, b: &Backend, timeout: Duration) -> Result<BackendConn, Fail> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(b.addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => return Err(Fail::Connect),
            Err(_) => return Err(Fail::ConnectTimeout),
        };
        let _ = stream.set_nodelay(true);
        let (tx, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|_| Fail::Connect)?;
        Ok(BackendConn { tx, conn: Some(Box::pin(conn.with_upgrades())), done: false })
    }

    /// Return a connection whose exchange finished cleanly.
    pub fn put(&self, id: u64, bc: BackendConn) {
        if bc.done || self.max_idle == 0 {
            return;
        }
        let mut g = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = g.entry(id).or_default();
        if list.len() < self.max_idle {
            list.push(Idle { bc, since: Instant::now() });
        }
    }

    /// Drop expired connections (run periodically).
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut g = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        g.retain(|_, list| {
            list.retain(|i| self.fresh(i, now));
            !list.is_empty()
        });
    }
}

/// Poll `fut` while driving `bc`, so that the request goes out and the
/// response comes in on this task.
pub fn poll_with<F: Future + Unpin>(bc: &mut BackendConn, fut: &mut F, cx: &mut Context<'_>) -> Poll<F::Output> {
    bc.drive(cx);
    Pin::new(fut).poll(cx)
}
