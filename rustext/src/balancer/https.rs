//! HTTPS on the balancer: TLS termination of client connections and the
//! plain-HTTP listener that redirects to HTTPS (TLS to backends:
//! [`super::backend_tls`]).
//!
//! A TLS connection never takes the fast path (it reads and writes raw
//! sockets): after the handshake (rustls, on the worker's runtime, bounded
//! by [`HANDSHAKE_TIMEOUT`]) it is served by hyper, HTTP/2 when the client
//! chose `h2` by ALPN and HTTP/1.1 otherwise, with the same request handler
//! as plain connections and `X-Forwarded-Proto: https`. Idle, slow-header and
//! drain handling go through the connection's `ConnCtl` as on the plain path.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::config::ListenTls;
use super::connctl::ConnCtl;
use super::worker::{Peer, Worker};
use super::watched::Watched;

/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

type Tls = tokio_rustls::server::TlsStream<TcpStream>;
type H1 = http1::UpgradeableConnection<TokioIo<Watched<Tls, Worker>>, super::svc::Svc>;
type H2 = http2::Connection<TokioIo<Watched<Tls, Worker>>, super::svc::Svc, TokioExecutor>;

enum Conn {
    H1(Pin<Box<H1>>),
    H2(Pin<Box<H2>>),
}

impl Conn {
    fn graceful_shutdown(&mut self) {
        match self {
            Conn::H1(c) => c.as_mut().graceful_shutdown(),
            Conn::H2(c) => c.as_mut().graceful_shutdown(),
        }
    }
    fn poll(&mut self, cx: &mut Context<'_>, w: &Worker, peer: &Peer) -> Poll<()> {
        match self {
            Conn::H1(c) => c.as_mut().poll(cx).map(|r| {
                if let Err(e) = r {
                    super::hyperlog::log_refused_by_hyper(w, peer, &e);
                }
            }),
            Conn::H2(c) => c.as_mut().poll(cx).map(|_| ()),
        }
    }
}

/// Serve one accepted connection over TLS until it ends, is closed by the
/// housekeeping (idle, drain: gracefully) or aborted (slow headers).
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve(
    w: Arc<Worker>,
    ctl: Arc<ConnCtl>,
    sock: std::net::TcpStream,
    addr: SocketAddr,
    tls: &ListenTls,
    listener: usize,
    local: Option<SocketAddr>,
) {
    let Ok(sock) = TcpStream::from_std(sock) else { return };
    // the listener's client_verify, as the routing snapshot has it now (a reload changes it for new connections)
    let verify = w.shared.table().listener(listener).client_verify;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config_for(verify).clone());
    // The handshake counts as reading the request head: a client that
    // stalls in it is dropped by the head timeout or by this bound.
    ctl.reading(w.clock.now());
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock));
    let stream = tokio::select! {
        r = handshake => match r {
            Ok(Ok(s)) => s,
            _ => return, // refused or timed out: this connection only
        },
        _ = aborted(&ctl) => return,
    };
    if stream.get_ref().1.alpn_protocol() == Some(crate::tls_alpn::ACME_TLS_1) {
        // a TLS-ALPN-01 validation: the handshake was the answer (RFC 8737 §3)
        let mut stream = stream;
        let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, tokio::io::AsyncWriteExt::shutdown(&mut stream)).await;
        return;
    }
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
    let mut peer = Peer::with_proto(addr, ctl.clone(), true);
    peer.listener = listener;
    peer.local = local;
    peer.client_cert = client_cert(stream.get_ref().1, &tls.cert_headers);
    if local.is_none() && super::worker::is_unix(&w, listener) {
        peer.set_unix();
    }
    let peer = Arc::new(peer);
    let io = TokioIo::new(Watched::new(stream, Vec::new(), ctl.clone(), (!h2).then(|| w.clone())));
    let svc = super::svc::Svc::new(w.clone(), peer.clone());
    let cfg = &w.shared.config;
    let mut conn = if h2 {
        let mut b = http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .max_concurrent_streams(256)
            .max_header_list_size(cfg.max_header_bytes as u32)
            .keep_alive_interval(None);
        Conn::H2(Box::pin(b.serve_connection(io, svc)))
    } else {
        let mut b = http1::Builder::new();
        b.timer(TokioTimer::new())
            .max_buf_size(cfg.max_header_bytes)
            .keep_alive(true)
            .half_close(true)
            .header_read_timeout(None);
        Conn::H1(Box::pin(b.serve_connection(io, svc).with_upgrades()))
    };
    let mut closing = false;
    let mut registered = false;
    std::future::poll_fn(|cx| {
        if !registered {
            *ctl.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            registered = true;
        }
        if ctl.abort.load(Relaxed) {
            return Poll::Ready(());
        }
        if !closing && ctl.close.load(Relaxed) {
            closing = true;
            conn.graceful_shutdown();
        }
        conn.poll(cx, &w, &peer)
    })
    .await;
}

/// The identity of the client's verified certificate (mutual TLS), once
/// per connection; None when it presented none.
fn client_cert(
    tls: &rustls::ServerConnection,
    names: &super::clientcert::CertHeaders,
) -> Option<Arc<super::clientcert::ClientCert>> {
    let leaf = tls.peer_certificates()?.first()?;
    Some(Arc::new(super::clientcert::ClientCert::new(leaf, crate::tls::sha256, names)))
}

/// Resolves once the housekeeping asks this connection to abort.
async fn aborted(ctl: &Arc<ConnCtl>) {
    std::future::poll_fn(|cx| {
        *ctl.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        if ctl.abort.load(Relaxed) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// The answer of the redirect listener: `308` to the same host and path on
/// HTTPS (`https_port` unless 443), or `400` without a usable Host.
pub fn redirect_response<B>(req: &Request<B>, https_port: u16) -> Response<http_body_util::Full<bytes::Bytes>> {
    use http_body_util::Full;
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().host())
        .and_then(host_without_port);
    let Some(host) = host else {
        let mut r = Response::new(Full::new(bytes::Bytes::from_static(b"a Host header is required\n")));
        *r.status_mut() = StatusCode::BAD_REQUEST;
        return r;
    };
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let location = if https_port == 443 {
        format!("https://{host}{path}")
    } else {
        format!("https://{host}:{https_port}{path}")
    };
    let mut r = Response::new(Full::new(bytes::Bytes::new()));
    *r.status_mut() = StatusCode::PERMANENT_REDIRECT;
    match HeaderValue::from_str(&location) {
        Ok(v) => {
            r.headers_mut().insert(header::LOCATION, v);
        }
        Err(_) => *r.status_mut() = StatusCode::BAD_REQUEST,
    }
    r
}

/// The key authorization of a pending ACME HTTP-01 challenge, answered by
/// the redirect listener before it redirects anything.
fn acme_response(key_authorization: String) -> Response<http_body_util::Full<bytes::Bytes>> {
    let mut r = Response::new(http_body_util::Full::new(bytes::Bytes::from(key_authorization)));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

/// `example.com:80` → `example.com`, `[::1]:80` → `[::1]`; None for an
/// empty or malformed host (nothing to redirect to).
fn host_without_port(h: &str) -> Option<&str> {
    let host = if h.starts_with('[') {
        &h[..h.find(']')? + 1]
    } else {
        h.rsplit_once(':').map_or(h, |(host, port)| if port.bytes().all(|b| b.is_ascii_digit()) { host } else { h })
    };
    let ok = !host.is_empty()
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._[]:".contains(&b));
    ok.then_some(host)
}

/// The redirect listener's access log line (handed to the writer at once:
/// this listener has no housekeeping tick, and redirects are few).
fn log_redirect<B>(shared: &super::worker::Shared, buf: &super::accesslog::LogBuf, frontend: &str, client: SocketAddr,
                   req: &Request<B>, resp: &Response<http_body_util::Full<bytes::Bytes>>, start: std::time::Instant) {
    use super::accesslog::{Headers, Record, Timings};
    let log = &shared.access_log;
    if !log.active() {
        return;
    }
    let total = start.elapsed();
    let r = Record {
        listener: usize::MAX, // not a configured listener: the top-level log
        client,
        unix: false,
        when: std::time::SystemTime::now() - total,
        frontend,
        backend: "",
        server: "",
        method: req.method().as_str().as_bytes(),
        target: req.uri().path_and_query().map_or("/", |p| p.as_str()).as_bytes(),
        version: if req.version() == http::Version::HTTP_10 { "HTTP/1.0" } else { "HTTP/1.1" },
        status: resp.status().as_u16(),
        bytes_sent: 0,
        bytes_received: 0,
        timings: Timings { total, ..Default::default() },
        retries: 0,
        request_id: b"",
        req_headers: Headers::Map(req.headers()),
        res_headers: Headers::Map(resp.headers()),
        termination: if resp.status().is_success() || resp.status() == StatusCode::PERMANENT_REDIRECT { "LR" } else { "PR" },
    };
    log.log(buf, &r);
    log.flush(buf);
}

/// Run the redirect listener until `stop` (a drain) arrives.
pub async fn redirect_loop(listener: std::net::TcpListener, https_port: u16, shared: Arc<super::worker::Shared>,
                           mut stop: watch::Receiver<Option<std::time::Instant>>) {
    let frontend: Arc<str> = listener.local_addr().map_or_else(|_| String::new(), |a| a.to_string()).into();
    let buf = Arc::new(super::accesslog::LogBuf::default());
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((sock, client)) = r else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let (shared, buf, frontend) = (shared.clone(), buf.clone(), frontend.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let start = std::time::Instant::now();
                        let acme = shared.acme.answer(req.method().as_str().as_bytes(), req.uri().path().as_bytes());
                        let resp = match acme {
                            Some(body) => acme_response(body),
                            None => redirect_response(&req, https_port),
                        };
                        log_redirect(&shared, &buf, &frontend, client, &req, &resp, start);
                        async move { Ok::<_, std::convert::Infallible>(resp) }
                    });
                    let mut b = http1::Builder::new();
                    b.timer(TokioTimer::new()).header_read_timeout(Some(Duration::from_secs(10)));
                    let _ = tokio::time::timeout(Duration::from_secs(60), b.serve_connection(TokioIo::new(sock), svc)).await;
                });
            }
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_keep_host_and_path() {
        let req = Request::get("/a/b?c=1").header("host", "example.com:8080").body(()).unwrap();
        let r = redirect_response(&req, 8443);
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(r.headers()[header::LOCATION], "https://example.com:8443/a/b?c=1");
        let r = redirect_response(&Request::get("/").header("host", "[::1]:80").body(()).unwrap(), 443);
        assert_eq!(r.headers()[header::LOCATION], "https://[::1]/");
    }

    #[test]
    fn a_bad_host_gets_400() {
        for h in ["", "evil.com\r\nx", "a b", ":80"] {
            let req = Request::get("/").header("host", HeaderValue::from_bytes(h.as_bytes()).unwrap_or(HeaderValue::from_static("a b"))).body(()).unwrap();
            assert_eq!(redirect_response(&req, 443).status(), StatusCode::BAD_REQUEST, "{h:?}");
        }
        assert_eq!(redirect_response(&Request::get("/").body(()).unwrap(), 443).status(), StatusCode::BAD_REQUEST);
    }
}
