//! The request body hyper's path sends to a backend: the client's, read
//! ahead, counted as it goes, or nothing. Near the bottom (it needs only
//! the stats) so that both backend pools can send it.

use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::stats::{bump, WorkerStats};

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
