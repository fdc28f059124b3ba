//! The PROXY protocol on the wire: reading the header an `accept_proxy`
//! listener's connections start with, and writing the one a `send_proxy`
//! backend connection starts with. The bytes are [`proxyproto`]'s business.
//!
//! The header is peeked, parsed, then consumed to its exact length (as
//! HAProxy does), so whatever follows it — an HTTP request, a TLS
//! ClientHello — is left in the socket for the path that serves the
//! connection, and the socket goes on as a plain `std` stream.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::proxyproto::{self, Header, Version};

/// Why an `accept_proxy` connection was closed before anything was served.
#[derive(Debug)]
pub enum Refused {
    Header(proxyproto::Error),
    /// The header did not arrive within the header timeout.
    Timeout,
    /// The client closed or reset first.
    Closed,
}

fn recv(s: &TcpStream, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: a valid socket; at most `buf.len()` bytes are written into `buf`.
    let n = unsafe { libc::recv(s.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Read the PROXY header of a just-accepted connection. `limit` bounds the
/// wait (zero: none). The socket is handed back after the header, with
/// nothing else consumed. A refused connection is counted in `refused`
/// before it is closed (so whoever sees it closed sees it counted).
pub async fn read_header(
    sock: std::net::TcpStream,
    limit: Duration,
    refused: &std::sync::atomic::AtomicU64,
) -> Result<(std::net::TcpStream, Header), Refused> {
    // Usually the header is already there: read it without registering the
    // socket with the reactor (two epoll_ctl calls saved per connection).
    match at_once(&sock) {
        Some(Ok(h)) => return Ok((sock, h)),
        Some(Err(e)) => {
            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(e);
        }
        None => {}
    }
    let s = TcpStream::from_std(sock).map_err(|_| Refused::Closed)?;
    let got = if limit.is_zero() {
        peek_header(&s).await
    } else {
        tokio::time::timeout(limit, peek_header(&s)).await.unwrap_or(Err(Refused::Timeout))
    };
    let header = match got {
        Ok(h) => h,
        Err(e) => {
            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(e);
        }
    };
    let s = s.into_std().map_err(|_| Refused::Closed)?;
    Ok((s, header))
}

/// The header if it is all in the socket now (None: wait for more).
fn at_once(sock: &std::net::TcpStream) -> Option<Result<Header, Refused>> {
    let mut buf = [0u8; 232];
    // SAFETY: a valid socket; at most `buf.len()` bytes are written into `buf`.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK) };
    if n <= 0 {
        return None; // nothing yet (or closed: the waiting path tells)
    }
    match proxyproto::parse(&buf[..n as usize]) {
        Ok(Some((h, len))) => {
            // SAFETY: as above; the `len` bytes are in the socket (just peeked).
            let got = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), len, 0) };
            Some(if got == len as isize { Ok(h) } else { Err(Refused::Closed) })
        }
        Ok(None) => None,
        Err(e) => Some(Err(Refused::Header(e))),
    }
}

async fn peek_header(s: &TcpStream) -> Result<Header, Refused> {
    // Most headers are short; a v2 header with TLVs may need the larger buffer.
    let mut buf = vec![0u8; 232];
    let mut seen: Option<usize> = None;
    loop {
        s.readable().await.map_err(|_| Refused::Closed)?;
        // Readiness is cleared only when nothing new arrived since the last
        // peek, so a header split over segments waits for the next one
        // instead of peeking the same bytes in a loop.
        let r = s.try_io(Interest::READABLE, || {
            let n = recv(s, &mut buf, libc::MSG_PEEK)?;
            if Some(n) == seen && n != 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        let n = match r {
            Ok(0) => return Err(Refused::Closed),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(Refused::Closed),
        };
        seen = Some(n);
        match proxyproto::parse(&buf[..n]) {
            Ok(Some((h, len))) => {
                // Consume exactly the header: it is all in the socket already.
                let mut got = 0;
                while got < len {
                    let mut tmp = [0u8; 512];
                    let want = (len - got).min(tmp.len());
                    match s.try_io(Interest::READABLE, || recv(s, &mut tmp[..want], 0)) {
                        Ok(0) => return Err(Refused::Closed),
                        Ok(k) => got += k,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            s.readable().await.map_err(|_| Refused::Closed)?;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => return Err(Refused::Closed),
                    }
                }
                return Ok(h);
            }
            Ok(None) => {
                if n == buf.len() {
                    if buf.len() >= proxyproto::MAX_HEADER {
                        return Err(Refused::Header(proxyproto::Error::TooLong));
                    }
                    buf.resize(proxyproto::MAX_HEADER, 0);
                    seen = None;
                }
            }
            Err(e) => return Err(Refused::Header(e)),
        }
    }
}

/// The header a `send_proxy` backend connection starts with, for a client
/// at `src` that connected to `dst`.
pub fn header_for(version: Version, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    proxyproto::encode(version, proxyproto::canonical(src), proxyproto::canonical(dst))
}
