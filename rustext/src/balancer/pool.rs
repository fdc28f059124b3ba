//! Keep-alive connections to backends, one pool per worker thread.
//!
//! Each backend connection runs as a task of the worker's runtime (measured
//! faster than driving it inline from the client's task for small and
//! medium responses) and goes back to the pool only once its response body
//! has been read to the end; a connection left mid-message is closed, never
//! reused. Idle ones are dropped past `idle_timeout` and beyond `max_idle`
//! per backend. Only the owning worker's tasks touch a pool, so its lock is
//! never contended.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use super::net::SendStream;
use super::reqbody::ReqBody;
use super::upstream::Backend;

pub type Sender = SendRequest<ReqBody>;

/// Why a backend could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fail {
    Connect,
    ConnectTimeout,
    Reset,
    Timeout,
}

/// One HTTP/1.1 connection to a backend (its I/O runs on its own task).
pub struct BackendConn {
    pub tx: Sender,
    /// Opened for one client (it started with that client's PROXY header):
    /// never pooled.
    pub private: bool,
}

impl BackendConn {
    /// Ready for a new request (false if the connection ended meanwhile).
    pub(super) async fn ready(&mut self) -> bool {
        if self.tx.is_ready() {
            return true;
        }
        // Just returned: its task has yet to see the end of the previous
        // exchange, one scheduler turn away; or it was closed.
        self.tx.ready().await.is_ok()
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
    /// TLS to backends (None: plain TCP).
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl Pool {
    pub fn new(max_idle: usize, idle_timeout: Duration, tls: Option<std::sync::Arc<rustls::ClientConfig>>) -> Self {
        Pool {
            idle: Mutex::new(HashMap::new()),
            max_idle,
            idle_timeout,
            tls,
        }
    }

    fn fresh(&self, i: &Idle, now: Instant) -> bool {
        !i.bc.tx.is_closed()
            && (self.idle_timeout.is_zero() || now.duration_since(i.since) < self.idle_timeout)
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
    pub async fn acquire(
        &self,
        b: &Backend,
        connect_timeout: Duration,
    ) -> Result<(BackendConn, bool), Fail> {
        while let Some(mut bc) = self.take(b.id) {
            if bc.ready().await {
                return Ok((bc, true));
            }
        }
        // boxed: connecting (TLS, handshake) would otherwise grow every request's future
        Box::pin(self.connect(b, connect_timeout)).await.map(|bc| (bc, false))
    }

    pub async fn connect(&self, b: &Backend, timeout: Duration) -> Result<BackendConn, Fail> {
        self.connect_with(b, timeout, None).await
    }

    /// A new connection, starting with `proxy_header` if given (before TLS,
    /// if any); such a connection is private to its client.
    pub async fn connect_with(&self, b: &Backend, timeout: Duration, proxy_header: Option<&[u8]>) -> Result<BackendConn, Fail> {
        let mut stream = match tokio::time::timeout(timeout, b.connect()).await {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => return Err(Fail::Connect),
            Err(_) => return Err(Fail::ConnectTimeout),
        };
        let _ = stream.set_nodelay(true);
        if let Some(h) = proxy_header {
            use tokio::io::AsyncWriteExt;
            stream.write_all(h).await.map_err(|_| Fail::Connect)?;
        }
        let tx = match &self.tls {
            None => {
                let (tx, conn) = http1::Builder::new()
                    .handshake(TokioIo::new(SendStream(stream)))
                    .await
                    .map_err(|_| Fail::Connect)?;
                tokio::spawn(async move {
                    let _ = conn.with_upgrades().await;
                });
                tx
            }
            Some(tls) => {
                let stream = tokio::time::timeout(timeout, super::backend_tls::connect_backend(tls, &b.authority, stream))
                    .await
                    .map_err(|_| Fail::ConnectTimeout)?
                    .map_err(|_| Fail::Connect)?;
                let (tx, conn) = http1::Builder::new()
                    .handshake(TokioIo::new(stream))
                    .await
                    .map_err(|_| Fail::Connect)?;
                tokio::spawn(async move {
                    let _ = conn.with_upgrades().await;
                });
                tx
            }
        };
        Ok(BackendConn { tx, private: proxy_header.is_some() })
    }

    /// Return a connection whose exchange finished cleanly.
    pub fn put(&self, id: u64, bc: BackendConn) {
        if bc.tx.is_closed() || self.max_idle == 0 || bc.private {
            return;
        }
        let mut g = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = g.entry(id).or_default();
        if list.len() < self.max_idle {
            list.push(Idle {
                bc,
                since: Instant::now(),
            });
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
