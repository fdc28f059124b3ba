//! The fast path's sockets: a client connection read without registering
//! it with tokio's reactor until an operation would block, a backend link,
//! the scatter-gather sends, and each worker's pool of idle backend links
//! and response buffers. No HTTP here: [`super::fast`] speaks it.

use std::io::{self, IoSlice};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::connctl::ConnCtl;
use super::stats::IdMap;

/// Read size for heads (client requests, backend responses).
pub(super) const HEAD_READ: usize = 16 * 1024;
/// Capacity of the per-exchange buffers backend responses are read into
/// (head and body alike, so one `recv` takes what the socket holds).
pub(super) const BODY_READ: usize = 512 * 1024;
/// Largest backend response head.
pub(super) const MAX_RESP_HEAD: usize = 64 * 1024;
/// Body buffers kept per worker for reuse.
const SCRATCH_KEEP: usize = 32;

pub(super) fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// `recv` into the spare capacity of `buf` (at least `want` bytes of it).
pub(super) fn recv_into(fd: SockRef<'_>, buf: &mut Vec<u8>, want: usize) -> io::Result<usize> {
    buf.reserve(want);
    let n = fd.recv(buf.spare_capacity_mut())?;
    // SAFETY: recv initialised the first n bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// The client's socket: raw until an operation would block, then tokio's.
/// Every read or write marks the connection active (idle timeout).
pub struct Client {
    pub(super) raw: Option<std::net::TcpStream>,
    pub(super) reg: Option<TcpStream>,
    pub(super) ctl: Arc<ConnCtl>,
    /// As HAProxy: a backend connection opened with this client's PROXY
    /// header (`send_proxy`), kept for its next requests to that backend
    /// (by id); closed with the client connection, never shared.
    pub(super) private: Option<(u64, Link)>,
}

impl Client {
    pub fn new(sock: std::net::TcpStream, ctl: Arc<ConnCtl>) -> Self {
        Client {
            raw: Some(sock),
            reg: None,
            ctl,
            private: None,
        }
    }

    pub(super) fn reg(&mut self) -> io::Result<&TcpStream> {
        if self.reg.is_none() {
            let raw = self
                .raw
                .take()
                .ok_or_else(|| io::Error::other("no socket"))?;
            self.reg = Some(TcpStream::from_std(raw)?);
        }
        Ok(self.reg.as_ref().expect("registered above"))
    }

    /// The tokio stream (for hyper).
    pub fn into_tokio(mut self) -> io::Result<TcpStream> {
        self.reg()?;
        Ok(self.reg.take().expect("registered above"))
    }

    pub(super) async fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let r = self.read_inner(buf).await;
        self.ctl.active.store(true, Relaxed);
        r
    }

    pub(super) async fn read_inner(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        if let Some(s) = &self.raw {
            match recv_into(SockRef::from(s), buf, HEAD_READ) {
                Err(e) if would_block(&e) => {}
                r => return r,
            }
        }
        let s = self.reg()?;
        read_into(s, buf, HEAD_READ).await
    }

    pub(super) async fn send(&mut self, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        let r = self.send_inner(bufs).await;
        self.ctl.active.store(true, Relaxed);
        r
    }

    pub(super) async fn send_inner(&mut self, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        IoSlice::advance_slices(&mut bufs, 0);
        if let Some(s) = &self.raw {
            while !bufs.is_empty() {
                match SockRef::from(s).send_vectored(bufs) {
                    Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                    Err(e) if would_block(&e) => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if bufs.is_empty() {
                return Ok(());
            }
        }
        let s = self.reg()?;
        send_all(s, bufs).await
    }
}

pub(super) async fn send_all(s: &TcpStream, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match s.try_io(Interest::WRITABLE, || SockRef::from(s).send_vectored(bufs)) {
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if would_block(&e) => s.writable().await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A keep-alive connection to a backend, with its read buffer.
pub struct Link {
    pub(super) s: TcpStream,
    pub(super) buf: Vec<u8>,
    /// Coarse time it went idle (pool).
    pub(super) since: u64,
    /// Opened for one client (it started with that client's PROXY header):
    /// never pooled.
    pub(super) private: bool,
}

impl Link {
    pub(super) async fn read(&mut self, want: usize) -> io::Result<usize> {
        read_into(&self.s, &mut self.buf, want).await
    }

    /// Still usable: no end of stream, no unexpected bytes. Costs a system
    /// call only when the reactor saw the socket readable.
    pub(super) fn alive(&self) -> bool {
        let mut b = [std::mem::MaybeUninit::uninit(); 1];
        match self
            .s
            .try_io(Interest::READABLE, || SockRef::from(&self.s).peek(&mut b))
        {
            Err(e) => would_block(&e),
            Ok(_) => false,
        }
    }
}

/// Read from a registered socket. A short read means the socket's queue is
/// empty: the reactor's readiness is cleared then (no system call), as an
/// `EAGAIN` would, so the next read waits for the next event instead of
/// calling `recv` just to learn that. (Edge-triggered epoll reports every
/// later arrival, and tokio ignores a clear older than the latest event.)
pub(super) async fn read_into(s: &TcpStream, buf: &mut Vec<u8>, want: usize) -> io::Result<usize> {
    loop {
        let mut offered = 0;
        match s.try_io(Interest::READABLE, || {
            buf.reserve(want);
            offered = buf.capacity() - buf.len();
            recv_into(SockRef::from(s), buf, want)
        }) {
            Err(e) if would_block(&e) => s.readable().await?,
            Ok(n) if n > 0 && n < offered => {
                let _ = s.try_io(Interest::READABLE, || {
                    Err::<(), _>(io::ErrorKind::WouldBlock.into())
                });
                return Ok(n);
            }
            r => return r,
        }
    }
}

/// The fast path's keep-alive backend connections, one pool per worker.
pub struct FastPool {
    pub(super) idle: Mutex<IdMap<Vec<Link>>>,
    pub(super) max_idle: usize,
    /// In the worker clock's milliseconds (0: none).
    pub(super) idle_timeout_ms: u64,
    pub(super) scratch: Mutex<Vec<Vec<u8>>>,
}

impl FastPool {
    pub fn new(max_idle: usize, idle_timeout: Duration) -> Self {
        FastPool {
            idle: Mutex::new(IdMap::default()),
            max_idle,
            idle_timeout_ms: idle_timeout.as_millis() as u64,
            scratch: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn fresh(&self, l: &Link, now: u64) -> bool {
        self.idle_timeout_ms == 0 || now.saturating_sub(l.since) < self.idle_timeout_ms
    }

    pub(super) fn take(&self, id: u64, now: u64) -> Option<Link> {
        let mut g = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = g.get_mut(&id)?;
        while let Some(l) = list.pop() {
            if self.fresh(&l, now) && l.alive() {
                return Some(l);
            }
        }
        None
    }

    pub(super) fn put(&self, id: u64, mut l: Link, now: u64) {
        if self.max_idle == 0 {
            return;
        }
        if l.private {
            self.give_back(std::mem::take(&mut l.buf));
            return;
        }
        self.give_back(std::mem::take(&mut l.buf));
        l.since = now;
        let mut g = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = g.entry(id).or_default();
        if list.len() < self.max_idle {
            list.push(l);
        }
    }

    /// Drop expired connections (run periodically).
    pub fn sweep(&self, now: u64) {
        let mut g = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        g.retain(|_, list| {
            list.retain(|l| self.fresh(l, now));
            !list.is_empty()
        });
    }

    pub(super) fn scratch(&self) -> Vec<u8> {
        self.scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BODY_READ))
    }

    pub(super) fn give_back(&self, mut v: Vec<u8>) {
        if v.capacity() < BODY_READ {
            return;
        }
        v.clear();
        let mut g = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() < SCRATCH_KEEP {
            g.push(v);
        }
    }
}
