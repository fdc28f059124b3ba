//! Cleartext HTTP/2 from clients (h2c with prior knowledge, RFC 9113 §3.3),
//! as HAProxy's `bind ... proto h2` and nginx's `listen ... http2` give it,
//! found by its connection preface: what gRPC clients on insecure channels
//! and `curl --http2-prior-knowledge` send.
//!
//! Detection costs the HTTP/1 fast path nothing: the preface's request line
//! (`PRI * HTTP/2.0`) is not one the fast path parses, so the connection is
//! handed over as for any head it does not handle, and only then are the
//! bytes read compared with the preface. An h2c connection is served by
//! hyper's HTTP/2 server with the same request handler as every other
//! connection; its reads and writes keep it active (idle timeout), but
//! reads between its requests do not start a "request head" (HTTP/2 has
//! none to time out: a stalled client holds one stream, not the connection).

use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::connctl::ConnCtl;
use super::worker::{Peer, Worker};
use super::svc::Svc;
use super::watched::Watched;

/// The client connection preface of HTTP/2 (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the first bytes of a connection are (the start of) the HTTP/2
/// preface. Enough of it to tell it from an HTTP/1 request line: `PRI * HTTP/2`.
pub fn is_preface(first: &[u8]) -> bool {
    let n = first.len().min(PREFACE.len());
    n >= 12 && first[..n] == PREFACE[..n]
}

/// Concurrent streams a client may open on one connection.
pub const MAX_STREAMS: u32 = 256;

pub(super) type H2Conn = Pin<Box<http2::Connection<TokioIo<Watched<TcpStream, Worker>>, Svc, TokioExecutor>>>;

/// Serve the rest of a connection whose first bytes (`prefix`, read by the
/// fast path) are the HTTP/2 preface.
pub(super) fn conn(w: &Arc<Worker>, ctl: &Arc<ConnCtl>, peer: &Arc<Peer>, io: TcpStream, prefix: Vec<u8>) -> H2Conn {
    let cfg = &w.shared.config;
    // the preface is not a request head: no head timeout runs until a request ends
    ctl.begin();
    ctl.end();
    let io = TokioIo::new(Watched::new(io, prefix, ctl.clone(), None));
    let mut b = http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(cfg.max_header_bytes as u32)
        .keep_alive_interval(None);
    Box::pin(b.serve_connection(io, Svc::new(w.clone(), peer.clone())))
}

/// Read a connection's first bytes until they tell HTTP/2 from HTTP/1, for
/// connections that skip the fast path (with TLS to backends); they are
/// handed on with the stream, to be replayed. None: the client left first.
/// A client that stalls is closed by the housekeeping (request-head and idle
/// timeouts), as on the fast path.
pub async fn read_start(
    w: Arc<Worker>,
    ctl: Arc<ConnCtl>,
    io: std::net::TcpStream,
) -> Option<(TcpStream, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut io = TcpStream::from_std(io).ok()?;
    let mut buf = Vec::with_capacity(4096);
    loop {
        match io.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {
                ctl.active.store(true, Relaxed);
                ctl.reading(w.clock.now());
            }
        }
        let n = buf.len().min(PREFACE.len());
        if n >= 12 || buf[..n] != PREFACE[..n] {
            return Some((io, buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_and_only_it() {
        assert!(is_preface(PREFACE));
        assert!(is_preface(b"PRI * HTTP/2.0\r\n"));
        assert!(is_preface(b"PRI * HTTP/2"));
        let mut more = PREFACE.to_vec();
        more.extend_from_slice(&[0, 0, 0, 4]);
        assert!(is_preface(&more));
        for other in [&b"GET / HTTP/1.1\r\n"[..], b"PRI * HTTP/1.1\r\n", b"PRI", b"", b"PRI * HTTP/2.1\r\n\r\n"] {
            assert!(!is_preface(other), "{other:?}");
        }
    }
}
