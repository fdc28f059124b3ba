//! HTTP/3 on the TLS listeners: a QUIC endpoint (quinn, h3) on the
//! listener's port over UDP, with the listener's certificates (ALPN `h3`).
//!
//! Only the transport is HTTP/3's: each request goes through hyper's path's
//! handler ([`super::proxy::handle`]), its body adapted
//! ([`super::reqbody::ClientBody`]), so routes, header rules, rate limits,
//! the balancer's own answers and the access log are those of HTTP/1 and
//! HTTP/2; the response body is the same [`super::respbody::RespBody`],
//! streamed onto the QUIC stream.
//!
//! One endpoint per listener, on the first worker: QUIC finds a
//! connection by its ids, which a `SO_REUSEPORT` group spread over workers
//! would not keep together. Its connections are registered with that
//! worker's housekeeping like any other: the idle timeout and a drain send
//! GOAWAY and let the requests in flight finish; they count against
//! `max_open_connections` and `max_client_connections` (a client's address
//! is then validated first, by a Retry, so a forged one counts nothing).

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Response};
use http_body_util::BodyExt;
use tokio::sync::watch;

use super::config::{ClientVerify, Config, ListenTls};
use super::connctl::{ConnCount, ConnCtl, Conns, OpenSlot};
use super::reqbody::ClientBody;
use super::worker::{ClientSlot, Peer, Worker};

/// Concurrent requests on one connection (as on an HTTP/2 one).
const MAX_STREAMS: u32 = 256;

type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;

/// The QUIC endpoint of a listener on `sock`: its TLS configuration
/// (`verify`: the listener's `client_verify`) with ALPN `h3` only.
pub(super) fn endpoint(
    sock: std::net::UdpSocket,
    tls: &ListenTls,
    verify: Option<ClientVerify>,
    cfg: &Config,
) -> io::Result<quinn::Endpoint> {
    let server = server_config((**tls.config_for(verify)).clone(), cfg.idle_timeout)?;
    quinn::Endpoint::new(quinn::EndpointConfig::default(), Some(server), sock, Arc::new(quinn::TokioRuntime))
}

/// The QUIC server configuration of a listener whose TLS configuration is
/// `tls` (public for the fuzz target, which feeds datagrams to an endpoint
/// configured so).
pub fn server_config(mut tls: rustls::ServerConfig, idle: Duration) -> io::Result<quinn::ServerConfig> {
    tls.alpn_protocols = vec![b"h3".to_vec()];
    // no 0-RTT: early data could be replayed to a backend
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| io::Error::other(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(MAX_STREAMS.into());
    if !idle.is_zero() {
        // the housekeeping closes an idle connection gracefully; this bound is for a silent peer
        transport.max_idle_timeout((idle * 2).try_into().ok());
    }
    server.transport_config(Arc::new(transport));
    Ok(server)
}

/// Refuses new connections once the accept loop ends (a drain, the
/// listener removed): those open finish on their own.
struct Closing(quinn::Endpoint);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.set_server_config(None);
    }
}

/// Accept the QUIC connections of listener `idx` on `sock` until the drain
/// starts (or the task is aborted: the listener is removed).
pub(super) async fn accept_loop(
    w: Arc<Worker>,
    conns: Arc<Conns>,
    sock: std::net::UdpSocket,
    idx: usize,
    mut stop: watch::Receiver<Option<Instant>>,
) {
    let shared = w.shared.clone();
    let Some(tls) = shared.config.tls.clone() else { return };
    let verify = shared.table().listener(idx).client_verify;
    let Ok(ep) = endpoint(sock, &tls, verify, &shared.config) else { return };
    let ep = Closing(ep);
    let limited = shared.config.max_open_connections > 0;
    let validate = shared.config.max_client_connections > 0;
    loop {
        let incoming = tokio::select! {
            i = ep.0.accept() => match i {
                Some(i) => i,
                None => return,
            },
            _ = stop.changed() => return,
        };
        if validate && !incoming.remote_address_validated() && incoming.may_retry() {
            let _ = incoming.retry();
            continue;
        }
        let open = if limited {
            match OpenSlot::try_take(&shared.open) {
                Some(slot) => Some(slot),
                None => {
                    incoming.refuse();
                    continue;
                }
            }
        } else {
            None
        };
        let Ok(slot) = ClientSlot::take(&shared, incoming.remote_address().ip()) else {
            w.stats.clients_refused.fetch_add(1, Relaxed);
            incoming.refuse();
            continue;
        };
        let ctl = Arc::new(ConnCtl::accepted(idx, open));
        let id = conns.add(ctl.clone());
        let (w, conns, tls) = (w.clone(), conns.clone(), tls.clone());
        tokio::spawn(async move {
            let _count = ConnCount::new(&w.stats);
            serve_conn(&w, &ctl, incoming, &tls, idx).await;
            drop(slot);
            conns.forget(id);
        });
    }
}

/// Resolves once the housekeeping asks the connection to abort (true) or,
/// unless it is `closing` already, to close (false).
async fn asked(ctl: &ConnCtl, closing: bool) -> bool {
    std::future::poll_fn(|cx| {
        *ctl.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        if ctl.abort.load(Relaxed) {
            Poll::Ready(true)
        } else if !closing && ctl.close.load(Relaxed) {
            Poll::Ready(false)
        } else {
            Poll::Pending
        }
    })
    .await
}

/// One QUIC connection: its handshake (bounded as a TLS one), then its
/// requests, each on a task of its own, until it ends or is closed.
async fn serve_conn(w: &Arc<Worker>, ctl: &Arc<ConnCtl>, incoming: quinn::Incoming, tls: &ListenTls, idx: usize) {
    // the handshake counts as reading a request head (the head timeout applies)
    ctl.reading(w.clock.now());
    let conn = tokio::select! {
        r = tokio::time::timeout(super::https::HANDSHAKE_TIMEOUT, incoming) => match r {
            Ok(Ok(c)) => c,
            _ => return,
        },
        _ = asked(ctl, false) => return,
    };
    ctl.begin();
    ctl.end();
    let mut peer = Peer::with_proto(conn.remote_address(), ctl.clone(), true);
    peer.listener = idx;
    peer.client_cert = client_cert(&conn, &tls.cert_headers);
    let peer = Arc::new(peer);
    let quic = conn.clone();
    let built = h3::server::builder()
        .max_field_section_size(w.shared.config.max_header_bytes as u64)
        .build::<_, Bytes>(h3_quinn::Connection::new(conn))
        .await;
    let Ok(mut h3c) = built else { return };
    let no_error = || h3::error::Code::H3_NO_ERROR.value().try_into().unwrap_or_default();
    let inflight = Arc::new(InFlight::default());
    let mut closing = false;
    loop {
        if closing && inflight.count.load(Relaxed) == 0 {
            // after GOAWAY, nothing left in flight: closed now, not at the idle timeout
            quic.close(no_error(), b"");
            return;
        }
        tokio::select! {
            r = h3c.accept() => match r {
                Ok(Some(resolver)) => {
                    ctl.active.store(true, Relaxed);
                    inflight.count.fetch_add(1, Relaxed);
                    let guard = Request(inflight.clone());
                    tokio::spawn(request(w.clone(), peer.clone(), resolver, guard));
                }
                // the client closed, a protocol error, or the last request after GOAWAY ended
                _ => return,
            },
            _ = inflight.ended.notified(), if closing => {}
            abort = asked(ctl, closing) => {
                if abort {
                    quic.close(no_error(), b"");
                    return;
                }
                closing = true;
                // GOAWAY: the requests accepted so far finish, no new ones
                if h3c.shutdown(1).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The requests of a connection in flight, and a wake-up when one ends.
#[derive(Default)]
struct InFlight {
    count: std::sync::atomic::AtomicUsize,
    ended: tokio::sync::Notify,
}

/// One request in flight, counted until it ends (dropped).
struct Request(Arc<InFlight>);

impl Drop for Request {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Relaxed);
        self.0.ended.notify_one();
    }
}

/// The verified client certificate of a connection (mutual TLS).
fn client_cert(
    conn: &quinn::Connection,
    names: &super::clientcert::CertHeaders,
) -> Option<Arc<super::clientcert::ClientCert>> {
    let certs = conn
        .peer_identity()?
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    let leaf = certs.first()?;
    Some(Arc::new(super::clientcert::ClientCert::new(leaf, crate::tls::sha256, names)))
}

/// One request: read its head, hand it to the shared handler, send what it answers.
async fn request(w: Arc<Worker>, peer: Arc<Peer>, resolver: Resolver, _counted: Request) {
    let Ok((req, stream)) = resolver.resolve_request().await else { return };
    let (mut send, recv) = stream.split();
    let body = ClientBody::h3_started(recv).await;
    let req = req.map(|()| body);
    let ctl = peer.ctl.clone();
    let Ok(resp) = super::proxy::handle(w, peer, req).await;
    let (mut parts, mut body) = resp.into_parts();
    // fields that belong to an HTTP/1 connection have no meaning here (RFC 9114 §4.2)
    for name in [header::CONNECTION, header::TRANSFER_ENCODING, header::UPGRADE] {
        parts.headers.remove(name);
    }
    parts.headers.remove("keep-alive");
    if send.send_response(Response::from_parts(parts, ())).await.is_err() {
        return;
    }
    while let Some(frame) = Pin::new(&mut body).frame().await {
        let Ok(frame) = frame else {
            // the backend's response broke off: so does this one
            send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
            return;
        };
        match frame.into_data() {
            Ok(d) => {
                if send.send_data(d).await.is_err() {
                    return;
                }
            }
            Err(f) => {
                if let Ok(t) = f.into_trailers() {
                    if send.send_trailers(t).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
    let _ = send.finish().await;
    ctl.active.store(true, Relaxed);
}
