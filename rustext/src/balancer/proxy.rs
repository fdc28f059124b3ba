//! One request through hyper's path: pick a backend, forward, stream back.
//! Connections come here from the fast path ([`super::fast`]) when a request
//! needs more than it handles (Upgrade, `Expect`, chunked or large bodies,
//! odd heads); the semantics are the same.
//!
//! Framing toward the client is hyper's: a response without a length goes
//! chunked to HTTP/1.1 clients and close-delimited (then `Connection: close`)
//! to HTTP/1.0 ones, which never see chunked encoding. Bodies stream frame by
//! frame in both directions; nothing is buffered whole.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{
    header, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version,
};
use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioIo;

use super::attempts::{idempotent, Attempts, Next};

use super::config::{HashKey, Proto};
use super::pool::{BackendConn, Fail};
use super::stats::bump;
use super::decide::{self, Verdict};
use super::route::{Action, Table, View};
use super::upstream::{Backend, Key};
use super::h1::valid_host;
use super::worker::{Peer, Worker};
use super::outcome::{Held, Outcome};
use super::reqbody::{ClientBody, Prebuffered, Progress, ReqBody, prebuffer};
use super::respbody::{Compressing, RespBody, Streaming};
use super::compress::Encoder;
use super::encode;
use super::hyperlog::HyperLog;


/// Headers that belong to one connection, not to the message (RFC 9110 §7.6.1).
fn is_hop_by_hop(n: &HeaderName) -> bool {
    matches!(
        n.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

fn strip_hop_by_hop(h: &mut HeaderMap) {
    // One pass over the names; most messages carry none of them or just
    // `Connection: keep-alive`, handled without allocating.
    let mut found: [Option<HeaderName>; 4] = Default::default();
    let mut n = 0;
    let mut more: Vec<HeaderName> = Vec::new();
    for name in h.keys() {
        if is_hop_by_hop(name) {
            if n < found.len() {
                found[n] = Some(name.clone());
                n += 1;
            } else {
                more.push(name.clone());
            }
        }
    }
    if n == 0 {
        return;
    }
    if let Some(conn) = h.get(header::CONNECTION) {
        let v = conn.as_bytes();
        if !v.eq_ignore_ascii_case(b"keep-alive") && !v.eq_ignore_ascii_case(b"close") {
            for t in conn.to_str().unwrap_or("").split(',') {
                let t = t.trim();
                if !t.is_empty()
                    && !t.eq_ignore_ascii_case("close")
                    && !t.eq_ignore_ascii_case("keep-alive")
                    && !crate::balancer::h1::never_nominated(t.as_bytes())
                {
                    if let Ok(name) = HeaderName::from_bytes(t.as_bytes()) {
                        more.push(name);
                    }
                }
            }
        }
    }
    for name in found.into_iter().flatten().chain(more) {
        h.remove(name);
    }
}

fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .unwrap_or("")
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const FORWARDED: HeaderName = HeaderName::from_static("forwarded");

fn append_list(h: &mut HeaderMap, name: HeaderName, item: &[u8]) {
    let joined = {
        let mut prev = h.get_all(&name).iter().peekable();
        if prev.peek().is_none() {
            None
        } else {
            let mut v = Vec::with_capacity(64);
            for p in prev {
                v.extend_from_slice(p.as_bytes());
                v.extend_from_slice(b", ");
            }
            v.extend_from_slice(item);
            HeaderValue::from_bytes(&v).ok()
        }
    };
    match joined {
        Some(v) => {
            h.insert(name, v);
        }
        None => {
            if let Ok(v) = HeaderValue::from_bytes(item) {
                h.insert(name, v);
            }
        }
    }
}

fn add_forwarded(h: &mut HeaderMap, peer: &Peer) {
    if peer.xff.is_empty() {
        // a client on a Unix socket: no address to forward (as HAProxy)
        let proto = if peer.https { "https" } else { "http" };
        h.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
        return;
    }
    // One growth of the map (hyper sizes it to the parsed headers), one
    // hash per name.
    h.reserve(3);
    if h.contains_key(&X_FORWARDED_FOR) {
        append_list(h, X_FORWARDED_FOR, peer.xff.as_bytes());
    } else {
        h.insert(X_FORWARDED_FOR, peer.xff.clone());
    }
    h.insert(X_FORWARDED_PROTO, HeaderValue::from_static(if peer.https { "https" } else { "http" }));
    if h.contains_key(&FORWARDED) {
        append_list(h, FORWARDED, peer.forwarded.as_bytes());
    } else {
        h.insert(FORWARDED, peer.forwarded.clone());
    }
}

/// Marks an answer of the balancer's own (an error page may replace it).
#[derive(Clone, Copy)]
struct OwnAnswer;

fn error_response(status: StatusCode, msg: &'static str) -> Response<RespBody> {
    let mut r = Response::new(RespBody::Full(Some(Bytes::from_static(msg.as_bytes()))));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r.extensions_mut().insert(OwnAnswer);
    r
}

/// The key authorization of a pending ACME HTTP-01 challenge (RFC 8555 §8.3).
fn acme_response(key_authorization: String) -> Response<RespBody> {
    let mut r = Response::new(RespBody::Full(Some(Bytes::from(key_authorization))));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r.extensions_mut().insert(OwnAnswer);
    r
}

/// An own answer with its configured page instead of its one-line text:
/// the page's fields replace the text's type and caching; the others
/// (`Retry-After`, the request id) stay.
fn with_page(resp: &mut Response<RespBody>, page: &super::route::ErrorPage) {
    let h = resp.headers_mut();
    h.remove(header::CONTENT_TYPE);
    h.remove(header::CACHE_CONTROL);
    for (n, v) in &page.headers {
        h.append(n.clone(), v.clone());
    }
    *resp.body_mut() = RespBody::Full(Some(page.body.clone()));
}

/// Why a request is refused before anything is forwarded (RFC 9112 §3.2,
/// §6.1, RFC 9110 §7.2): the rules hyper's parser leaves to its user.
/// Framing errors hyper finds itself (malformed lines, fields, lengths,
/// chunk sizes) never reach here: it answers 400 on its own.
pub fn refuse_reason(version: Version, headers: &HeaderMap) -> Option<&'static str> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Some("more than one Host header field\n");
    }
    match host {
        None if version == Version::HTTP_11 => return Some("an HTTP/1.1 request needs a Host header field\n"),
        Some(h) if !valid_host(h.as_bytes()) => return Some("invalid Host header field\n"),
        _ => {}
    }
    if headers.get_all(header::TRANSFER_ENCODING).iter().nth(1).is_some() {
        return Some("more than one Transfer-Encoding header field\n");
    }
    let te = headers.contains_key(header::TRANSFER_ENCODING);
    if te && headers.contains_key(header::CONTENT_LENGTH) {
        return Some("Content-Length and Transfer-Encoding together\n");
    }
    if te && version == Version::HTTP_10 {
        return Some("Transfer-Encoding in an HTTP/1.0 request\n");
    }
    if headers.get_all(header::CONTENT_LENGTH).iter().nth(1).is_some() {
        return Some("more than one Content-Length header field\n");
    }
    // a fragment never reaches here: hyper's URI parser drops it (the fast path refuses it)
    None
}


fn refused(reason: &'static str, h2: bool) -> Response<RespBody> {
    let mut r = error_response(StatusCode::BAD_REQUEST, reason);
    if !h2 {
        // what follows on the connection cannot be trusted to be framed as the client meant
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// hyper's service: every outcome is a response (errors become 502/503/504).
/// HTTP/3 requests come here too ([`super::http3`]), their body adapted.
pub async fn handle(
    w: Arc<Worker>,
    peer: Arc<Peer>,
    req: Request<ClientBody>,
) -> Result<Response<RespBody>, Infallible> {
    let start = Instant::now();
    peer.ctl.begin();
    bump(&w.stats.requests, 1);
    let t = w.shared.table();
    let listener = t.listener(peer.listener);
    let rid = listener.request_id.as_ref().map(|name| {
        let mut given = req.headers().get_all(name).iter();
        match (given.next(), given.next()) {
            (Some(v), None) if super::route::valid_request_id(v.as_bytes()) => (name.clone(), v.clone()),
            _ => {
                let id = w.ids.generate();
                (name.clone(), HeaderValue::from_bytes(&id).expect("hex digits"))
            }
        }
    });
    let grpc = req.version() == Version::HTTP_2 && super::grpc::is_grpc(req.headers());
    let mut lg = HyperLog::new(&w, &peer, &req, start);
    if let (Some(l), Some((_, v))) = (lg.as_mut(), rid.as_ref()) {
        l.rid = v.as_bytes().to_vec();
    }
    let mut resp = forward(&w, &t, &peer, req, start, rid.as_ref(), &mut lg).await;
    if !grpc && resp.extensions().get::<OwnAnswer>().is_some() {
        if let Some(page) = t.error_page(resp.status().as_u16()) {
            with_page(&mut resp, page);
        }
    }
    if let Some((name, value)) = rid {
        resp.headers_mut().insert(name, value);
    }
    if peer.https {
        if let Some(v) = &listener.hsts {
            resp.headers_mut().insert(header::STRICT_TRANSPORT_SECURITY, v.clone());
        }
        if let Some(v) = w.shared.alt_svc.get(peer.listener) {
            resp.headers_mut().insert(header::ALT_SVC, v.clone());
        }
    }
    if let RespBody::Full(_) = resp.body() {
        // Answered here (or upgraded): nothing left to stream.
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            peer.ctl.end();
        }
    }
    w.stats.observe(resp.status().as_u16(), start.elapsed());
    if let Some(mut l) = lg {
        l.status = resp.status().as_u16();
        l.keep_response(&w, resp.headers());
        match resp.body_mut() {
            RespBody::Stream(s) => s.log = Some(l),
            RespBody::Full(b) => {
                if l.term == "--" && l.status >= 400 && l.pool.is_empty() {
                    l.term = "PR";
                }
                l.emit(&w, b.as_ref().map_or(0, |b| b.len() as u64), 0);
            }
        }
    }
    if grpc && resp.status().as_u16() >= 400 && matches!(resp.body(), RespBody::Full(_)) {
        // the balancer's own error (logged and counted with its HTTP status), as gRPC says it
        resp = super::grpc::error_response(resp);
    }
    Ok(resp)
}

/// Refused by the rate limit: `status` (429) with `Retry-After`.
fn too_many_response(status: u16, wait: Duration) -> Response<RespBody> {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let mut r = error_response(code, super::ratelimit::BODY);
    if let Some(v) = super::route::retry_after(wait).fixed {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}


/// One backend attempt: a pooled connection (`held`, the client's own, for
/// a `send_proxy` server), or a new one if that connection turns out closed
/// before the request was written.
#[allow(clippy::too_many_arguments)]
async fn send(
    w: &Worker,
    b: &Backend,
    mut req: Request<ReqBody>,
    connect: Duration,
    wait: Duration,
    progress: Option<&Progress>,
    proxy_header: Option<&[u8]>,
    mut held: Option<BackendConn>,
) -> Outcome {
    let mut reused_failed = false;
    loop {
        let mut kept = held.take();
        let kept_ready = match kept.as_mut() {
            Some(bc) => bc.ready().await,
            None => false,
        };
        let got = if kept_ready {
            Ok((kept.take().expect("checked above"), true))
        } else if reused_failed || proxy_header.is_some() {
            Box::pin(w.pool.connect_with(b, connect, proxy_header)).await.map(|tx| (tx, false))
        } else {
            w.pool.acquire(b, connect).await
        };
        let (mut bc, reused) = match got {
            Ok(x) => x,
            Err(f) => return Outcome::Unsent(req, f),
        };
        let exchange = bc.tx.try_send_request(req);
        tokio::pin!(exchange);
        // The response timeout counts from the end of the upload: while the
        // request body keeps moving, the wait is extended.
        let mut seen = progress.map_or(0, |p| p.frames.load(Relaxed));
        let result = loop {
            match tokio::time::timeout(wait, exchange.as_mut()).await {
                Ok(r) => break Some(r),
                Err(_) => match progress.map(|p| p.frames.load(Relaxed)) {
                    Some(now) if now != seen => seen = now,
                    _ => break None,
                },
            }
        };
        match result {
            Some(Ok(resp)) => return Outcome::Response(resp, Held::H1(bc)),
            Some(Err(mut e)) => match e.take_message() {
                Some(r) if reused => {
                    // The backend closed an idle connection: not its failure.
                    req = r;
                    reused_failed = true;
                }
                Some(r) => return Outcome::Unsent(r, Fail::Reset),
                None => return Outcome::Sent(Fail::Reset),
            },
            None => return Outcome::Sent(Fail::Timeout),
        }
    }
}

/// A request as hyper parsed it, for routing.
struct MapView<'a> {
    headers: &'a HeaderMap,
    path: &'a str,
    method: &'a str,
    cert: Option<&'a str>,
}

impl View for MapView<'_> {
    fn host(&self) -> Option<&[u8]> {
        self.headers.get(header::HOST).map(HeaderValue::as_bytes)
    }
    fn path(&self) -> &[u8] {
        self.path.as_bytes()
    }
    fn method(&self) -> &[u8] {
        self.method.as_bytes()
    }
    fn header_any(&self, name: &[u8], test: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        // names are lower case already: a lookup without allocating
        let Ok(name) = std::str::from_utf8(name) else { return false };
        self.headers.get_all(name).iter().any(|v| test(v.as_bytes()))
    }
    fn client_cert(&self) -> Option<&str> {
        self.cert
    }
}

/// Apply header rules to `h`.
fn apply_rules(h: &mut HeaderMap, rules: &super::route::Rules, rid: Option<&(HeaderName, HeaderValue)>, src: &[u8]) {
    for d in rules.delete.iter() {
        h.remove(d);
    }
    let id = rid.map_or(&b""[..], |(_, v)| v.as_bytes());
    for a in rules.add.iter() {
        if let Some(v) = a.value(id, src) {
            h.append(a.name.clone(), v);
        }
    }
}

fn redirect_response(r: &super::route::Redirect, host: Option<&[u8]>, target: &[u8]) -> Response<RespBody> {
    let mut loc = Vec::with_capacity(64);
    r.location(&mut loc, host, target);
    let mut resp = Response::new(RespBody::Full(None));
    *resp.status_mut() = StatusCode::from_u16(r.code()).unwrap_or(StatusCode::FOUND);
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_bytes(&loc) {
        h.insert(header::LOCATION, v);
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn forward(
    w: &Arc<Worker>,
    t: &Table,
    peer: &Arc<Peer>,
    mut req: Request<ClientBody>,
    start: Instant,
    rid: Option<&(HeaderName, HeaderValue)>,
    lg: &mut Option<Box<HyperLog>>,
) -> Response<RespBody> {
    macro_rules! term {
        ($t:expr) => {
            if let Some(l) = lg.as_mut() {
                l.term = $t;
            }
        };
    }
    let upgrade = is_upgrade(req.headers());
    let mut client_upgrade = if upgrade {
        Some(hyper::upgrade::on(&mut req))
    } else {
        None
    };
    if !peer.https {
        if let Some(body) = w.shared.acme.answer(req.method().as_str().as_bytes(), req.uri().path().as_bytes()) {
            return acme_response(body);
        }
    }
    let (parts, body) = req.into_parts();
    if let Some(reason) = refuse_reason(parts.version, &parts.headers) {
        return refused(reason, parts.version >= Version::HTTP_2);
    }
    let head_bytes: usize = parts.headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
    if head_bytes > w.shared.config.max_header_bytes {
        // hyper's read buffer bounds the head only roughly: the same limit as the fast path's
        let mut r = error_response(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "request header fields too large\n");
        if parts.version < Version::HTTP_2 {
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return r;
    }
    let method = parts.method;
    let mut headers = parts.headers;
    // HTTP/3 is framed and names its host as HTTP/2 does: the same rules apply
    let version = parts.version;
    let h2 = version == Version::HTTP_2 || version == Version::HTTP_3;
    if let Some(authority) = parts.uri.authority().filter(|_| !h2) {
        // absolute-form (RFC 9112 §3.2.2): the target's authority is the host. A Host that
        // says otherwise is refused, as HAProxy does: routing (here) and a backend reading
        // Host must never see two different hosts.
        if headers
            .get(header::HOST)
            .is_some_and(|h| !h.as_bytes().eq_ignore_ascii_case(authority.as_str().as_bytes()))
        {
            return refused("Host does not match the target's authority\n", false);
        }
        if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
            headers.insert(header::HOST, v);
        }
    }
    let host_from_authority = h2 && !headers.contains_key(header::HOST);
    if host_from_authority {
        // HTTP/2 names the host in :authority; HTTP/1.1 backends want Host.
        if let Some(v) = parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
            headers.insert(header::HOST, v);
        }
    }
    let upgrade_value = if upgrade {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    };
    let listener = t.listener(peer.listener);
    let routed = decide::route(listener, &MapView {
        headers: &headers,
        path: parts.uri.path(),
        method: method.as_str(),
        cert: peer.client_cert.as_deref().map(|c| c.subject.as_str()),
    });
    let decision = decide::decide(t, peer.listener, routed, peer.ip, |n| headers.get(n).map(HeaderValue::as_bytes));
    if !decision.delay.is_zero() {
        bump(&w.stats.rate_delayed, 1);
        tokio::time::sleep(decision.delay).await;
    }
    if let Some((_, term)) = decision.own() {
        term!(term);
    }
    let action: &Action = decision.action;
    let up = match decision.verdict {
        Verdict::Forward { upstream, .. } => &**upstream,
        Verdict::Limited { status, wait } => {
            decide::Counter::RateLimited.bump(&w.stats);
            return too_many_response(status, wait);
        }
        Verdict::Redirect(r) => {
            let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
            return redirect_response(r, headers.get(header::HOST).map(HeaderValue::as_bytes), target.as_bytes());
        }
        Verdict::Page(page) => {
            let mut r = Response::new(RespBody::Full(None));
            *r.status_mut() = StatusCode::from_u16(page.status).unwrap_or(StatusCode::OK);
            with_page(&mut r, page);
            return r;
        }
        Verdict::NoRoute => return own_answer(w, lg, decide::NO_ROUTE),
    };
    if let Some(l) = lg.as_mut() {
        l.pool = decision.pool_name(t).to_owned();
    }
    let s = &up.settings;
    // compression: what the request says, read before its headers go on
    let asked = action.compress.as_deref().map(|p| encode::asked(p, method.as_str().as_bytes(), &headers));
    // the one TE an HTTP/2 request may carry, which gRPC requires (RFC 9113 §8.2.2)
    let te_trailers = s.proto == Proto::H2
        && headers.get_all(header::TE).iter().any(|v| {
            v.to_str().unwrap_or("").split(',').any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        });
    strip_hop_by_hop(&mut headers);
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if !action.request.is_empty() {
        apply_rules(&mut headers, &action.request, rid, peer.xff.as_bytes());
    }
    if let Some((name, value)) = rid {
        headers.insert(name.clone(), value.clone());
    }
    // the client certificate's identity (the listener's rules removed any the client sent)
    for (name, value) in peer.client_cert.iter().flat_map(|c| c.headers.iter()) {
        headers.insert(name.clone(), value.clone());
    }
    if let Some(v) = upgrade_value {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, v);
    }
    // X-Forwarded-Proto written by a rule (TLS ended before the balancer) wins over the balancer's own
    let ruled_proto: Option<Vec<HeaderValue>> = action
        .request
        .add
        .iter()
        .any(|a| a.name == X_FORWARDED_PROTO)
        .then(|| headers.get_all(&X_FORWARDED_PROTO).iter().cloned().collect());
    add_forwarded(&mut headers, peer);
    if let Some(values) = ruled_proto {
        headers.remove(&X_FORWARDED_PROTO);
        for v in values {
            headers.append(X_FORWARDED_PROTO, v);
        }
    }
    let client_pq = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let pq = match &action.rewrite {
        None => client_pq.clone(),
        Some(rw) => {
            let mut target = Vec::with_capacity(client_pq.as_str().len() + 16);
            let rewritten = rw.apply(client_pq.as_str().as_bytes(), &mut target).ok();
            match rewritten.and_then(|()| PathAndQuery::from_maybe_shared(bytes::Bytes::from(target)).ok()) {
                Some(pq) => pq,
                None => return own_answer(w, lg, decide::BAD_REWRITE),
            }
        }
    };
    let uri = match parts.uri.authority() {
        // HTTP/2 on both sides: the client's :authority goes on as it came (no Host)
        Some(a) if host_from_authority && s.proto == Proto::H2 => {
            headers.remove(header::HOST);
            let scheme = if w.shared.config.backend_tls.is_some() { http::uri::Scheme::HTTPS } else { http::uri::Scheme::HTTP };
            Uri::builder().scheme(scheme).authority(a.clone()).path_and_query(pq.clone()).build()
                .unwrap_or_else(|_| Uri::from(pq.clone()))
        }
        _ => Uri::from(pq.clone()),
    };

    let empty = body.is_end_stream();
    let mut body = if empty {
        None
    } else if upgrade || h2 {
        // HTTP/2 frames its bodies itself, and a streaming call (gRPC's client and
        // bidi streams) must not wait for more of its body before it is forwarded
        Some((std::collections::VecDeque::new(), Some(body)))
    } else {
        let wait = if w.shared.config.header_timeout.is_zero() { Duration::from_secs(10) } else { w.shared.config.header_timeout };
        match prebuffer(body, wait, &w.stats).await {
            Prebuffered::Ok(ahead, rest) => Some((ahead, rest)),
            Prebuffered::Malformed => return refused("malformed request body\n", h2),
        }
    };
    let progress = if empty {
        None
    } else {
        Some(Arc::new(Progress::default()))
    };
    if let Some(l) = lg.as_mut() {
        l.progress = progress.clone();
    }
    let mut attempts = Attempts::new(up, start, empty && idempotent(method.as_str().as_bytes()) && !upgrade);
    let sticky = up.policy.sticky.as_ref();
    let pinned = match sticky {
        Some(st) => super::sticky::pin(st, &mut headers),
        None => None,
    };
    attempts.prefer(pinned);
    let key_header = match &s.hash_key {
        HashKey::Header(name) => headers.get(name).map(|v| v.as_bytes().to_vec()),
        _ => None,
    };
    let key = Key {
        client_ip: peer.ip,
        // the client's path, as on the fast path
        path: client_pq.path(),
        header: key_header.as_deref(),
    };
    let mut failed: Option<Fail> = None;
    let mut pending: Option<Request<ReqBody>> = None;
    loop {
        let queued = lg.is_some().then(Instant::now);
        let (backend, lease) = match attempts.next(w, &key).await {
            Next::Try(backend, lease) => (backend, lease),
            Next::QueueFull => return own_answer(w, lg, decide::QUEUE_FULL),
            Next::Done => break,
        };
        if let (Some(l), Some(q)) = (lg.as_mut(), queued) {
            *l.timings.queue.get_or_insert(Duration::ZERO) += q.elapsed();
            l.server = backend.name.clone();
            l.retries = attempts.retries();
        }
        let sending = lg.is_some().then(Instant::now);
        let breq = match pending.take() {
            Some(r) => r,
            None => {
                // Keep a copy of the head only while a replay may still be needed.
                let keep = attempts.replayable() && attempts.more_after_this();
                let mut r = Request::new(match body.take() {
                    Some(b) => {
                        ReqBody::Client(b.0, b.1, w.stats.clone(), progress.clone().unwrap_or_default())
                    }
                    None => ReqBody::Empty,
                });
                *r.method_mut() = method.clone();
                *r.uri_mut() = uri.clone();
                *r.headers_mut() = if keep {
                    headers.clone()
                } else {
                    std::mem::take(&mut headers)
                };
                if !r.headers().contains_key(header::HOST) && r.uri().authority().is_none() {
                    // HTTP/1.0 clients may omit it; HTTP/1.1 requires one.
                    if let Ok(v) = HeaderValue::from_str(backend.authority.as_str()) {
                        r.headers_mut().insert(header::HOST, v);
                    }
                }
                r
            }
        };
        let wait = attempts.response_wait();
        let pp = backend
            .send_proxy()
            .map(|v| super::l4::header_for(v, SocketAddr::new(peer.ip, peer.port), peer.local_addr(&w.shared)));
        let outcome = if s.proto == Proto::H2 {
            super::h2pool::send(w, &backend, breq, s.connect_timeout, wait, progress.as_deref(), s.h2).await
        } else {
            // the client's own backend connection, if it has one to this backend
            let held = if pp.is_some() {
                let mut g = peer.private.lock().unwrap_or_else(|e| e.into_inner());
                match g.take() {
                    Some((id, bc)) if id == backend.id => Some(bc),
                    other => {
                        *g = other;
                        None
                    }
                }
            } else {
                None
            };
            send(w, &backend, breq, s.connect_timeout, wait, progress.as_deref(), pp.as_deref(), held).await
        };
        match outcome
        {
            Outcome::Response(mut resp, bc) => {
                if let (Some(l), Some(t)) = (lg.as_mut(), sending) {
                    // hyper's pool connects and sends as one step: Tc is not told apart
                    l.timings.response = Some(t.elapsed());
                }
                attempts.observe(&backend, resp.status().as_u16());
                let class = (resp.status().as_u16() / 100).clamp(1, 5) as usize - 1;
                backend.stats.responses[class].fetch_add(1, Relaxed);
                if attempts.retry_status(resp.status().as_u16(), &key) {
                    // retry_on: this response is dropped with its connection
                    drop((resp, bc, lease));
                    failed = Some(Fail::Reset);
                    continue;
                }
                if let Some(st) = sticky {
                    super::sticky::stick(st, up, &backend, pinned, resp.headers_mut());
                }
                if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                    if let Some(client_side) = client_upgrade.take() {
                        let backend_side = hyper::upgrade::on(&mut resp);
                        drop(bc);
                        let mut upgraded_log = lg.take();
                        let w = w.clone();
                        let tunnel_timeout = s.tunnel_timeout;
                        tokio::spawn(async move {
                            let _lease = lease;
                            let mut moved = (0, 0);
                            let mut idle = false;
                            if let (Ok(c), Ok(b)) = (client_side.await, backend_side.await) {
                                let (up, down, end) =
                                    super::tunnel::relay(TokioIo::new(c), TokioIo::new(b), tunnel_timeout).await;
                                moved = (up, down);
                                idle = end == super::tunnel::End::Idle;
                            }
                            // an upgraded connection's one line, when it ends
                            if let Some(l) = upgraded_log.as_mut() {
                                if idle && l.term == "--" {
                                    l.term = "cD"; // HAProxy's code for a timeout in the data phase
                                }
                                l.status = 101;
                                l.emit(&w, moved.1, moved.0);
                            }
                        });
                        *resp.version_mut() = Version::HTTP_11;
                        let (parts, _) = resp.into_parts();
                        return Response::from_parts(parts, RespBody::Full(None));
                    }
                }
                strip_hop_by_hop(resp.headers_mut());
                if !action.response.is_empty() {
                    apply_rules(resp.headers_mut(), &action.response, rid, peer.xff.as_bytes());
                }
                // Our side speaks 1.1 (hyper answers 1.0 clients as 1.0 itself), or 2.
                *resp.version_mut() = if h2 { version } else { Version::HTTP_11 };
                let enc = match (action.compress.as_deref(), asked) {
                    (Some(p), Some(a)) => compressing(w, p, a, &mut resp),
                    _ => None,
                };
                let (parts, inner) = resp.into_parts();
                let streaming = Streaming {
                    inner,
                    lease: Some(lease),
                    worker: w.clone(),
                    peer: peer.clone(),
                    conn: Some(bc),
                    deadline: attempts.deadline().map(|d| Box::pin(tokio::time::sleep_until(d.into()))),
                    bytes: 0,
                    eject: (s.eject_after, s.ejection()),
                    log: None,
                    enc,
                };
                return Response::from_parts(parts, RespBody::Stream(streaming));
            }
            Outcome::Unsent(r, f) => {
                attempts.failed(&backend, false);
                failed = Some(f);
                pending = Some(r);
            }
            Outcome::Sent(Fail::Timeout) if attempts.retry_timeout(&key) => {
                attempts.failed(&backend, true);
                failed = Some(Fail::Timeout);
            }
            Outcome::Sent(Fail::Timeout) => {
                attempts.failed(&backend, true);
                // A timed-out request may have had effects: never replayed.
                return own_answer(w, lg, decide::TIMED_OUT);
            }
            Outcome::Sent(_)
                if progress
                    .as_ref()
                    .is_some_and(|p| p.client_failed.load(Relaxed)) =>
            {
                // The client broke off its upload: not the backend's fault.
                term!("CD");
                return error_response(StatusCode::BAD_REQUEST, "incomplete request body\n");
            }
            Outcome::Sent(f) => {
                attempts.failed(&backend, true);
                failed = Some(f);
            }
        }
    }
    own_answer(w, lg, decide::gave_up(failed))
}

/// The encoder of a response [`encode::plan`] says to compress, its headers
/// edited; None to send it as it is (with `Vary` when another client's
/// would have been compressed).
fn compressing(w: &Worker, p: &encode::Policy, asked: encode::Asked, resp: &mut Response<Incoming>) -> Option<Box<Compressing>> {
    match encode::plan(p, asked, resp.status(), resp.headers()) {
        encode::Plan::AsIs => None,
        encode::Plan::Vary => {
            encode::add_vary(resp.headers_mut());
            None
        }
        encode::Plan::Compress(coding, level) => {
            let e = Encoder::new(coding, level).ok()?;
            encode::edit(resp.headers_mut(), coding);
            bump(&w.stats.compressed, 1);
            Some(Compressing::new(e))
        }
    }
}

/// An answer of the balancer's own ([`decide`] says which), counted and
/// with its termination code.
fn own_answer(w: &Worker, lg: &mut Option<Box<HyperLog>>, a: decide::Answer) -> Response<RespBody> {
    a.counter.bump(&w.stats);
    if let Some(l) = lg.as_mut() {
        l.term = a.term;
    }
    error_response(StatusCode::from_u16(a.status).unwrap_or(StatusCode::BAD_GATEWAY), a.body)
}

#[cfg(test)]
mod tests;
