//! The bodies of one exchange on hyper's path: the request body sent to a
//! backend (read ahead, counted) and the response body streamed back (its
//! backend slot and connection held until it ends, its log line written
//! then), and what one backend attempt comes back with.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;

use super::hyperlog::HyperLog;
use super::pool::{BackendConn, Fail};
use super::stats::{bump, WorkerStats};
use super::upstream::Backend;
use super::worker::{Peer, Worker};

pub type BoxError = Box<dyn StdError + Send + Sync>;

/// How far a request body got: lets the response timeout wait for a long
/// upload, and tells a client abort from a backend failure.
#[derive(Default)]
pub struct Progress {
    pub(super) frames: std::sync::atomic::AtomicU64,
    /// Body bytes passed on to the backend (the access log's `%U`).
    pub(super) bytes: std::sync::atomic::AtomicU64,
    pub(super) client_failed: std::sync::atomic::AtomicBool,
}

impl Progress {
    /// Request body frames passed on so far.
    pub fn frames(&self) -> u64 {
        self.frames.load(Relaxed)
    }
}

/// The request body sent to a backend: the client's, counted, or nothing.
pub enum ReqBody {
    /// The frames read ahead (see [`prebuffer`]), then the rest of the client's body, if any.
    Client(std::collections::VecDeque<Frame<Bytes>>, Option<Incoming>, Arc<WorkerStats>, Arc<Progress>),
    Empty,
}

/// Request bodies up to this size are read whole before anything is
/// forwarded (a body whose framing is broken is then refused with 400
/// instead of reaching a backend cut short); larger ones stream from there.
pub const PREBUFFER_LIMIT: usize = 64 * 1024;

/// What [`prebuffer`] read.
pub enum Prebuffered {
    /// Frames read ahead, and the rest of the body when it was not all read.
    Ok(std::collections::VecDeque<Frame<Bytes>>, Option<Incoming>),
    /// The client's body is malformed (bad chunk framing, short of its length).
    Malformed,
}

/// Read the start of a request body: until its end, [`PREBUFFER_LIMIT`]
/// bytes, or `wait` (a slow uploader then streams as before).
pub async fn prebuffer(mut body: Incoming, wait: Duration, stats: &WorkerStats) -> Prebuffered {
    use http_body_util::BodyExt;
    let mut frames = std::collections::VecDeque::new();
    let mut total = 0usize;
    let deadline = tokio::time::Instant::now() + wait;
    while total <= PREBUFFER_LIMIT {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    total += d.len();
                    bump(&stats.bytes_in, d.len() as u64);
                }
                frames.push_back(f);
            }
            Ok(Some(Err(_))) => return Prebuffered::Malformed,
            Ok(None) => return Prebuffered::Ok(frames, None),
            Err(_) => break,
        }
    }
    Prebuffered::Ok(frames, Some(body))
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ReqBody::Client(ahead, rest, stats, progress) => {
                if let Some(f) = ahead.pop_front() {
                    progress.frames.fetch_add(1, Relaxed);
                    if let Some(d) = f.data_ref() {
                        progress.bytes.fetch_add(d.len() as u64, Relaxed);
                    }
                    return Poll::Ready(Some(Ok(f)));
                }
                let Some(b) = rest else { return Poll::Ready(None) };
                let r = Pin::new(b).poll_frame(cx);
                match &r {
                    Poll::Ready(Some(Ok(f))) => {
                        if let Some(d) = f.data_ref() {
                            bump(&stats.bytes_in, d.len() as u64);
                            progress.bytes.fetch_add(d.len() as u64, Relaxed);
                        }
                        progress.frames.fetch_add(1, Relaxed);
                    }
                    Poll::Ready(Some(Err(_))) => progress.client_failed.store(true, Relaxed),
                    _ => {}
                }
                r
            }
            ReqBody::Empty => Poll::Ready(None),
        }
    }
    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Client(ahead, rest, _, _) => ahead.is_empty() && rest.as_ref().is_none_or(|b| b.is_end_stream()),
            ReqBody::Empty => true,
        }
    }
    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Client(ahead, rest, _, _) => {
                let n: u64 = ahead.iter().filter_map(|f| f.data_ref()).map(|d| d.len() as u64).sum();
                match rest {
                    None => SizeHint::with_exact(n),
                    Some(b) => {
                        let inner = b.size_hint();
                        let mut h = SizeHint::new();
                        // the upper bound first: set_lower refuses a lower above the upper
                        if let Some(u) = inner.upper() {
                            h.set_upper(u + n);
                        }
                        h.set_lower(inner.lower() + n);
                        h
                    }
                }
            }
            ReqBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// Holds a backend slot for as long as its response streams.
pub struct Lease {
    pub(super) backend: Arc<Backend>,
    pub(super) _permit: Option<OwnedSemaphorePermit>,
}

impl Lease {
    pub fn new(backend: Arc<Backend>, permit: Option<OwnedSemaphorePermit>) -> Self {
        backend.active.fetch_add(1, Relaxed);
        Lease {
            backend,
            _permit: permit,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.backend.active.fetch_sub(1, Relaxed);
    }
}

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

/// What a response holds of its backend until it ends: an HTTP/1
/// connection (pooled again after a clean end) or an HTTP/2 stream.
pub(super) enum Held {
    H1(BackendConn),
    // never read: dropping it frees the stream
    H2(#[allow(dead_code)] super::h2pool::Slot),
}

pub(super) enum Outcome {
    Response(Response<Incoming>, Held),
    /// Nothing was sent: the request can go to another backend as it is.
    Unsent(Request<ReqBody>, Fail),
    /// The request (or part of it) went out, then the exchange failed.
    Sent(Fail),
}
