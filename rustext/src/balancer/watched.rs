//! The client side of a connection served by hyper (HTTP/1 handed over by
//! the fast path, cleartext HTTP/2, TLS): every read and write marks the
//! connection active (idle timeout); for HTTP/1 a read also notes the start
//! of a request head (its timeout: HTTP/2 multiplexes requests, so a read
//! between two of them starts no head); and the bytes the fast path read
//! before handing the connection over are replayed first.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::net::{poll_send, poll_send_vectored};
use super::connctl::ConnCtl;

/// A client stream: writes go through [`ClientIo::send`], which a plain
/// socket does with one `send` (no write-readiness bookkeeping of tokio's
/// write path).
pub trait ClientIo: AsyncRead + AsyncWrite + Unpin {
    fn send(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self).poll_write(cx, buf)
    }
    fn send_vectored(&mut self, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(self).poll_write_vectored(cx, bufs)
    }
}

impl ClientIo for TcpStream {
    fn send(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        poll_send(self, cx, buf)
    }
    fn send_vectored(&mut self, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        poll_send_vectored(self, cx, bufs)
    }
}

impl ClientIo for tokio_rustls::server::TlsStream<TcpStream> {}

/// The coarse clock request heads are timed by: the worker's (implemented
/// there; this module sits below the worker state, which it need not know).
pub trait HeadClock {
    fn now(&self) -> u64;
}

pub struct Watched<S, C> {
    io: S,
    prefix: Vec<u8>,
    at: usize,
    ctl: Arc<ConnCtl>,
    /// Some: reads are noted for the request-head timeout (HTTP/1).
    heads: Option<Arc<C>>,
}

impl<S, C> Watched<S, C> {
    /// `io` after `prefix` (the bytes read before the handover); `heads`:
    /// the worker whose clock times request heads (HTTP/1), None for HTTP/2.
    pub fn new(io: S, prefix: Vec<u8>, ctl: Arc<ConnCtl>, heads: Option<Arc<C>>) -> Self {
        Watched { io, prefix, at: 0, ctl, heads }
    }

    fn wrote<T>(&self, r: Poll<T>) -> Poll<T> {
        if r.is_ready() {
            self.ctl.active.store(true, Relaxed);
        }
        r
    }
}

impl<S: ClientIo, C: HeadClock> AsyncRead for Watched<S, C> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.at < me.prefix.len() {
            let n = buf.remaining().min(me.prefix.len() - me.at);
            buf.put_slice(&me.prefix[me.at..me.at + n]);
            me.at += n;
            if me.at == me.prefix.len() {
                me.prefix = Vec::new();
                me.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut me.io).poll_read(cx, buf);
        if r.is_ready() {
            me.ctl.active.store(true, Relaxed);
            if let Some(w) = me.heads.as_ref().filter(|_| buf.filled().len() > before) {
                me.ctl.reading(w.now());
            }
        }
        r
    }
}

impl<S: ClientIo, C> AsyncWrite for Watched<S, C> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let r = me.io.send(cx, buf);
        me.wrote(r)
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let r = me.io.send_vectored(cx, bufs);
        me.wrote(r)
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
