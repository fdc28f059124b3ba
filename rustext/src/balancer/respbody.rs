//! The response body hyper's path sends to the client: its own answer, or
//! the backend's streamed back, with the backend slot and connection held
//! until it ends and its log line written then. Above the worker state,
//! the attempt policy and the access log, all of which it finishes with.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Sleep;

use super::attempts::Lease;
use super::hyperlog::HyperLog;
use super::outcome::Held;
use super::stats::bump;
use super::worker::{Peer, Worker};

pub type BoxError = Box<dyn StdError + Send + Sync>;

/// The response body sent to the client.
pub enum RespBody {
    Stream(Streaming),
    Full(Option<Bytes>),
}

pub struct Streaming {
    pub(super) inner: Incoming,
    pub(super) lease: Option<Lease>,
    pub(super) worker: Arc<Worker>,
    pub(super) peer: Arc<Peer>,
    /// The backend connection, pooled again if the body ends cleanly.
    pub(super) conn: Option<Held>,
    pub(super) deadline: Option<Pin<Box<Sleep>>>,
    pub(super) bytes: u64,
    pub(super) eject: (u32, Duration),
    /// The access log line, written when the body ends.
    pub(super) log: Option<Box<HyperLog>>,
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

