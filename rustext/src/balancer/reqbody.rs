//! The request body hyper's path sends to a backend: the client's, read
//! ahead, counted as it goes, or nothing. Near the bottom (it needs only
//! the stats) so that both backend pools can send it. The client's body
//! comes from hyper (HTTP/1, HTTP/2) or from an HTTP/3 stream
//! ([`ClientBody`]): past this point the two are one.

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

/// Any error of a body (the pools accept any).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The receiving half of an HTTP/3 request stream.
pub type H3Recv = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// A client's request body as its connection delivers it: hyper's (HTTP/1
/// and HTTP/2) or an HTTP/3 stream's DATA frames, then its trailers.
pub enum ClientBody {
    Hyper(Incoming),
    // boxed: an HTTP/3 stream is several times the size of hyper's body, which every other request carries
    H3 { recv: Box<H3Recv>, first: Option<Bytes>, data_done: bool, done: bool },
}

impl ClientBody {
    /// An HTTP/3 request's body, with what has already arrived of it read:
    /// a request whose stream ended with its head is known to have none
    /// (as HTTP/2's END_STREAM says), so that it stays replayable.
    pub async fn h3_started(recv: H3Recv) -> Self {
        let mut body = ClientBody::H3 { recv: Box::new(recv), first: None, data_done: false, done: false };
        std::future::poll_fn(|cx| {
            if let ClientBody::H3 { recv, first, data_done, done } = &mut body {
                match recv.poll_recv_data(cx) {
                    Poll::Ready(Ok(Some(mut d))) => {
                        use bytes::Buf;
                        let n = d.remaining();
                        *first = Some(d.copy_to_bytes(n));
                    }
                    Poll::Ready(Ok(None)) => {
                        *data_done = true;
                        if let Poll::Ready(Ok(None)) = recv.poll_recv_trailers(cx) {
                            *done = true;
                        }
                    }
                    // an error shows when the body is read
                    _ => {}
                }
            }
            Poll::Ready(())
        })
        .await;
        body
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ClientBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            ClientBody::H3 { recv, first, data_done, done } => {
                if let Some(d) = first.take() {
                    return Poll::Ready(Some(Ok(Frame::data(d))));
                }
                if *done {
                    return Poll::Ready(None);
                }
                if !*data_done {
                    match recv.poll_recv_data(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => {
                            *done = true;
                            return Poll::Ready(Some(Err(e.into())));
                        }
                        Poll::Ready(Ok(Some(mut d))) => {
                            use bytes::Buf;
                            let n = d.remaining();
                            return Poll::Ready(Some(Ok(Frame::data(d.copy_to_bytes(n)))));
                        }
                        Poll::Ready(Ok(None)) => *data_done = true,
                    }
                }
                let r = recv.poll_recv_trailers(cx);
                if r.is_ready() {
                    *done = true;
                }
                match r {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Ok(Some(t))) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
                    Poll::Ready(Ok(None)) => Poll::Ready(None),
                    Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e.into()))),
                }
            }
        }
    }
    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(b) => b.is_end_stream(),
            ClientBody::H3 { first, done, .. } => first.is_none() && *done,
        }
    }
    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(b) => b.size_hint(),
            ClientBody::H3 { first: None, done: true, .. } => SizeHint::with_exact(0),
            ClientBody::H3 { .. } => SizeHint::default(),
        }
    }
}

/// The request body sent to a backend: the client's, counted, or nothing.
pub enum ReqBody {
    /// The frames read ahead (see [`prebuffer`]), then the rest of the client's body, if any.
    Client(std::collections::VecDeque<Frame<Bytes>>, Option<ClientBody>, Arc<WorkerStats>, Arc<Progress>),
    Empty,
}

/// Request bodies up to this size are read whole before anything is
/// forwarded (a body whose framing is broken is then refused with 400
/// instead of reaching a backend cut short); larger ones stream from there.
pub const PREBUFFER_LIMIT: usize = 64 * 1024;

/// What [`prebuffer`] read.
pub enum Prebuffered {
    /// Frames read ahead, and the rest of the body when it was not all read.
    Ok(std::collections::VecDeque<Frame<Bytes>>, Option<ClientBody>),
    /// The client's body is malformed (bad chunk framing, short of its length).
    Malformed,
}

/// Read the start of a request body: until its end, [`PREBUFFER_LIMIT`]
/// bytes, or `wait` (a slow uploader then streams as before).
pub async fn prebuffer(mut body: ClientBody, wait: Duration, stats: &WorkerStats) -> Prebuffered {
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
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
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
