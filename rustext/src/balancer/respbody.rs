//! The response body hyper's path sends to the client: its own answer, or
//! the backend's streamed back, with the backend slot and connection held
//! until it ends and its log line written then; compressed on the way when
//! [`super::encode`] said so ([`super::compress`]'s encoder). Above the
//! worker state, the attempt policy and the access log, all of which it
//! finishes with.

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
use super::compress::Encoder;
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
    /// The encoder of a compressed response.
    pub(super) enc: Option<Box<Compressing>>,
}

/// A compressed response's state between frames.
pub struct Compressing {
    pub(super) encoder: Encoder,
    /// The coded stream is complete (its end sent, or about to be).
    done: bool,
    /// The backend's trailers, sent after the coded stream's end.
    trailers: Option<Frame<Bytes>>,
}

impl Compressing {
    pub(super) fn new(encoder: Encoder) -> Box<Self> {
        Box::new(Compressing { encoder, done: false, trailers: None })
    }
}

/// Input compressed before a flush even while the backend keeps sending:
/// a bound on the output held and on the time the client waits.
const FLUSH_AFTER: u64 = 64 * 1024;

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
            if let Some(c) = &self.enc {
                bump(&self.worker.stats.compress_in, c.encoder.bytes_in);
                bump(&self.worker.stats.compress_out, c.encoder.bytes_out);
            }
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

impl Streaming {
    /// The backend broke mid-body; the client connection is cut.
    fn broken(&mut self, e: hyper::Error) -> BoxError {
        if let Some(l) = &self.lease {
            l.backend.record_failure(self.eject.0, self.eject.1);
        }
        if let Some(l) = self.log.as_mut() {
            l.term = "SD";
        }
        self.finish(false);
        Box::new(e)
    }
}

fn coder_failed(s: &mut Streaming, e: std::io::Error) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    if let Some(l) = s.log.as_mut() {
        l.term = "PD"; // the balancer's own failure in the data phase (HAProxy's P)
    }
    s.finish(false);
    Poll::Ready(Some(Err(Box::new(e))))
}

/// A compressed response's next frame: what the backend has sent so far,
/// compressed, flushed when it pauses (it answers Pending) or after
/// [`FLUSH_AFTER`] bytes, then the end of the coded stream, then the
/// backend's trailers if it sent any.
fn poll_compressed(s: &mut Streaming, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    let mut taken: u64 = 0;
    loop {
        let c = s.enc.as_mut().expect("called for a compressed response");
        if c.done {
            if let Some(t) = c.trailers.take() {
                return Poll::Ready(Some(Ok(t)));
            }
            s.finish(true);
            return Poll::Ready(None);
        }
        if taken >= FLUSH_AFTER {
            return match c.encoder.flush() {
                Ok(out) => {
                    s.bytes += out.len() as u64;
                    Poll::Ready(Some(Ok(Frame::data(out))))
                }
                Err(e) => coder_failed(s, e),
            };
        }
        match Pin::new(&mut s.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => match f.into_data() {
                Ok(d) => {
                    taken += d.len() as u64;
                    if let Err(e) = c.encoder.write(&d) {
                        return coder_failed(s, e);
                    }
                }
                Err(f) => {
                    if let (Some(t), Some(l)) = (f.trailers_ref(), s.log.as_mut()) {
                        l.keep_response(&s.worker, t);
                    }
                    let c = s.enc.as_mut().expect("checked above");
                    c.trailers = f.into_trailers().ok().map(Frame::trailers);
                    return end_coded(s);
                }
            },
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(s.broken(e)))),
            Poll::Ready(None) => return end_coded(s),
            Poll::Pending if taken > 0 => {
                // the backend pauses: what it sent goes out now, decodable
                return match c.encoder.flush() {
                    Ok(out) if out.is_empty() => Poll::Pending,
                    Ok(out) => {
                        s.bytes += out.len() as u64;
                        Poll::Ready(Some(Ok(Frame::data(out))))
                    }
                    Err(e) => coder_failed(s, e),
                };
            }
            Poll::Pending => return Poll::Pending,
        }
    }
}

/// The backend's body ended: the coded stream's end goes out.
fn end_coded(s: &mut Streaming) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    let c = s.enc.as_mut().expect("called for a compressed response");
    c.done = true;
    match c.encoder.finish() {
        Ok(out) => {
            s.bytes += out.len() as u64;
            Poll::Ready(Some(Ok(Frame::data(out))))
        }
        Err(e) => coder_failed(s, e),
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
                if s.enc.is_some() {
                    return poll_compressed(s, cx);
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
                    Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(s.broken(e)))),
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
            RespBody::Stream(s) => match &s.enc {
                Some(c) => c.done && c.trailers.is_none() && s.inner.is_end_stream(),
                None => s.inner.is_end_stream(),
            },
        }
    }
    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            // the coded length is known at its end only
            RespBody::Stream(s) if s.enc.is_some() => SizeHint::default(),
            RespBody::Stream(s) => s.inner.size_hint(),
        }
    }
}

