//! The fast path: the common HTTP/1 exchange written directly on sockets.
//!
//! A client connection starts here. Each request head is parsed by
//! [`h1`] from a per-connection buffer (one `recv` usually brings the whole
//! head and a small body), rewritten once, and sent to a pooled backend
//! connection with one `sendmsg`; the response head is rewritten the same
//! way and goes to the client with the first body bytes in one `sendmsg`,
//! the rest of the body streams through a bounded buffer. Anything the fast
//! path does not handle (Upgrade, `Expect`, chunked or large request bodies,
//! absolute-form targets, malformed or oversized heads) hands the connection,
//! with the bytes already read, to hyper ([`super::server`]) for the rest of
//! its life.
//!
//! The client socket is registered with tokio's reactor only once an
//! operation would block: a connection whose request is already there when
//! it is accepted (`ab`, HTTP/1.0) is served and closed without any epoll
//! registration of its own.
//!
//! What a request gets is decided by [`super::decide`], as on hyper's path;
//! this module only carries the decision out. Semantics are those of the
//! hyper path ([`super::proxy`]): retries of
//! idempotent body-less requests on connect failure or reset, never after
//! the response started; passive ejection; the per-backend limit with its
//! queue; response and total timeouts; the same stats.

use std::io::IoSlice;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{HashKey, Proto};
use super::decide::{self, Verdict};
use super::h1::{
    self, BodyMode, Chunks, ClientView, Edits, Forward, MethodKind, RawHead, ReqHead, ReqParse, RespHead, RespParse, Routed,
};
use super::route::{Listener, Rules, Table};
use super::pool::Fail;
use super::attempts::{Attempts, Next};
use super::worker::{Peer, Worker};
use super::stats::bump;
use super::upstream::{Backend, Key, Upstream};
use super::fastio::{read_into, send_all, BODY_READ, HEAD_READ, MAX_RESP_HEAD};
pub use super::fastio::{Client, FastPool, Link};

mod answers;
use answers::{page, reply, too_many};

/// Request bodies up to this size are read whole, then forwarded; larger
/// ones stream through hyper.
pub const MAX_FAST_BODY: u64 = 64 * 1024;

/// Serve a client connection on the fast path. `Some` hands it to hyper
/// with the bytes read but not yet handled.
pub async fn serve(
    w: Arc<Worker>,
    peer: Arc<Peer>,
    mut client: Client,
) -> Option<(Client, Vec<u8>)> {
    let ctl = peer.ctl.clone();
    let max_head = w.shared.config.max_header_bytes;
    let mut inb: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut resp: Vec<u8> = Vec::new();
    let logging = w.shared.access_log.active();
    let mut first = true; // no request served on this connection yet
    loop {
        // when the request head started to arrive (access log only)
        let mut t0: Option<Instant> = (logging && !inb.is_empty()).then(Instant::now);
        let (t, head) = loop {
            if !inb.is_empty() {
                // The snapshot current when the head is complete (reloads
                // apply to the next request of a keep-alive connection).
                let t = w.shared.table();
                match h1::parse_request_with(&inb, &mut out, |raw| {
                    // an ACME challenge is answered on hyper's path (before routing)
                    if w.shared.acme.claims(super::route::View::path(raw)) {
                        return None;
                    }
                    plan(&t, t.listener(peer.listener), raw)
                }) {
                    // a head over the limit that arrived whole in the last read: hyper's
                    // path answers 431, as for one still partial at the limit
                    ReqParse::Ready(h) if h.head_len > max_head => break (t, None),
                    ReqParse::Ready(h) => break (t, Some(h)),
                    ReqParse::Fallback => break (t, None),
                    ReqParse::Refuse => {
                        const BAD: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n\
                            content-length: 16\r\nconnection: close\r\n\r\n\
                            invalid request\n";
                        w.stats.observe(400, std::time::Duration::ZERO);
                        let mut page_buf = Vec::new();
                        let (answer, bytes) = match t.error_page(400) {
                            Some(p) => {
                                let view = ClientView { http10: false, keep_alive: false, head_request: false, closing: true };
                                h1::page_response_with(&mut page_buf, page(p), "Bad Request", view, &Edits::default());
                                (&page_buf[..], p.body.len() as u64)
                            }
                            None => (BAD, 16),
                        };
                        let _ = client.send(&mut [IoSlice::new(answer)]).await;
                        if logging {
                            let done = Done { status: 400, bytes, term: "PR", ..Done::default() };
                            log_line(&w, &peer, &inb, None, &done, b"", t0, Instant::now());
                        }
                        return None;
                    }
                    ReqParse::Partial if inb.len() >= max_head => break (t, None),
                    ReqParse::Partial => {}
                }
            } else if ctl.close.load(Relaxed) {
                return None;
            }
            match client.read(&mut inb).await {
                Ok(0) | Err(_) => {
                    if logging && !ctl.abort.load(Relaxed) {
                        // closed by the client in the middle of a head, or before its first byte
                        let mid_head = !inb.is_empty();
                        if mid_head || (first && w.shared.access_log.logs_empty(peer.listener)) {
                            super::hyperlog::log_without_request(&w, &peer, 400, "CR");
                        }
                    }
                    return None;
                }
                Ok(_) => {
                    ctl.reading(w.clock.now());
                    if logging && t0.is_none() {
                        t0 = Some(Instant::now());
                    }
                }
            }
        };
        let Some(head) = head.filter(|h| h.body_len <= MAX_FAST_BODY) else {
            return Some((client, inb));
        };
        ctl.begin();
        first = false;
        let total = head.head_len + head.body_len as usize;
        while inb.len() < total {
            match client.read(&mut inb).await {
                Ok(0) | Err(_) => {
                    ctl.end();
                    return None;
                }
                Ok(_) => {}
            }
        }
        let listener = t.listener(peer.listener);
        let begun = logging.then(Instant::now);
        let mut done = Done::default();
        let generated;
        let req_id = match &listener.request_id {
            Some(name) => Some((
                name.as_str(),
                match head.req_id {
                    Some(r) => h1::slice(&inb, r),
                    None => {
                        generated = w.ids.generate();
                        &generated[..]
                    }
                },
            )),
            None => None,
        };
        let raw_head = &inb[..head.head_len];
        let decision = decide::decide(&t, peer.listener, head.action, peer.ip, |n| {
            super::ratelimit::raw_header(raw_head, n.as_str().as_bytes())
        });
        if !decision.delay.is_zero() {
            bump(&w.stats.rate_delayed, 1);
            tokio::time::sleep(decision.delay).await;
        }
        let view = ClientView {
            http10: head.http10,
            keep_alive: head.keep_alive,
            head_request: head.method == MethodKind::Head,
            closing: peer.ctl.close.load(Relaxed),
        };
        let own = |resp: &mut Vec<u8>, done: &mut Done, status: u16, body: usize| {
            done.status = status;
            done.bytes = if view.head_request { 0 } else { body as u64 };
            done.resp_head = resp.len() - done.bytes as usize;
            done.term = decision.own().map_or("--", |(_, term)| term);
        };
        let keep = match decision.verdict {
            Verdict::Forward { upstream, .. } => {
                let response = decision.response_rules();
                exchange(
                    &w,
                    upstream,
                    &peer,
                    &mut client,
                    &head,
                    &inb[..total],
                    &mut out,
                    &mut resp,
                    &decision.request_rules().add,
                    Some(response).filter(|r| !r.is_empty()),
                    req_id,
                    &mut done,
                )
                .await
            }
            Verdict::Limited { status, wait } => too_many(&w, &mut client, &mut resp, view, status, wait, req_id, &mut done).await,
            Verdict::NoRoute => {
                bump(&w.stats.requests, 1);
                reply(&w, &mut client, &mut resp, view, Instant::now(), decide::NO_ROUTE, req_id, &mut done).await
            }
            Verdict::Redirect(r) => {
                let start = Instant::now();
                bump(&w.stats.requests, 1);
                let edits = Edits { add: &[], req_id, src: b"" };
                let (host, target) = (head.host.map(|h| h1::slice(&inb, h)), h1::slice(&inb, head.target));
                h1::redirect_response(&mut resp, (r.code(), r.reason()), |out| r.location(out, host, target), view, &edits);
                w.stats.observe(r.code(), start.elapsed());
                own(&mut resp, &mut done, r.code(), 0);
                let sent = client.send(&mut [IoSlice::new(&resp)]).await.is_ok();
                if !sent {
                    done.term = "CD";
                }
                sent && view.keep_alive && !view.closing
            }
            Verdict::Page(p) => {
                let start = Instant::now();
                bump(&w.stats.requests, 1);
                let reason = http::StatusCode::from_u16(p.status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
                h1::page_response_with(&mut resp, page(p), reason, view, &Edits { add: &[], req_id, src: b"" });
                w.stats.observe(p.status, start.elapsed());
                own(&mut resp, &mut done, p.status, p.body.len());
                let sent = client.send(&mut [IoSlice::new(&resp)]).await.is_ok();
                if !sent {
                    done.term = "CD";
                }
                sent && view.keep_alive && !view.closing
            }
        };
        if logging {
            let pool = Some(decision.pool_name(&t)).filter(|p| !p.is_empty());
            let rid = req_id.map_or(&b""[..], |(_, v)| v);
            let parsed = Parsed { head: &head, pool, rid, resp: &resp };
            log_line(&w, &peer, &inb[..head.head_len], Some(parsed), &done, &inb[head.head_len..total], t0, begun.unwrap_or_else(Instant::now));
        }
        ctl.end();
        if !keep || ctl.close.load(Relaxed) {
            return None;
        }
        inb.drain(..total);
    }
}

enum Outcome {
    /// Nothing reached the backend.
    Unsent(Fail),
    /// The request went out, then the exchange failed.
    Sent(Fail),
}

#[allow(clippy::too_many_arguments)]
async fn exchange(
    w: &Arc<Worker>,
    up: &Upstream,
    peer: &Peer,
    client: &mut Client,
    head: &ReqHead,
    req: &[u8],
    out: &mut Vec<u8>,
    resp: &mut Vec<u8>,
    add: &[super::route::Added],
    resp_rules: Option<&Rules>,
    req_id: Option<(&str, &[u8])>,
    done: &mut Done,
) -> bool {
    let logging = w.shared.access_log.active();
    let edits = Edits {
        add,
        req_id,
        src: peer.xff.as_bytes(),
    };
    let resp_edits = Edits {
        add: resp_rules.map_or(&[][..], |r| &r.add),
        req_id,
        src: peer.xff.as_bytes(),
    };
    let start = Instant::now();
    bump(&w.stats.requests, 1);
    let s = &up.settings;
    let view = ClientView {
        http10: head.http10,
        keep_alive: head.keep_alive,
        head_request: head.method == MethodKind::Head,
        closing: peer.ctl.close.load(Relaxed),
    };
    let body = &req[head.head_len..];
    let mut attempts = Attempts::new(up, start, body.is_empty() && head.method != MethodKind::Other);
    let path = std::str::from_utf8(h1::slice(req, head.path)).unwrap_or("/");
    let header = head.hash_value.map(|r| h1::slice(req, r));
    let key = Key {
        client_ip: peer.ip,
        path,
        header,
    };
    let base = out.len();
    let mut failed: Option<Fail> = None;
    loop {
        let queued = logging.then(Instant::now);
        let (backend, lease) = match attempts.next(w, &key).await {
            Next::Try(backend, lease) => (backend, lease),
            Next::QueueFull => {
                done.retries = attempts.retries();
                return reply(w, client, resp, view, start, decide::QUEUE_FULL, req_id, done).await;
            }
            Next::Done => break,
        };
        if let Some(q) = queued {
            *done.timings.queue.get_or_insert(Duration::ZERO) += q.elapsed();
            done.server = Some(backend.clone());
        }
        done.retries = attempts.retries();
        let backend = &backend;
        out.truncate(base);
        h1::finish_request_with(
            out,
            req,
            head,
            peer.xff.as_bytes(),
            peer.forwarded.as_bytes(),
            backend.authority.as_str(),
            &edits,
        );
        let wait = attempts.response_wait();
        let sending = logging.then(Instant::now);
        let pp = backend
            .send_proxy()
            .map(|v| super::l4::header_for(v, std::net::SocketAddr::new(peer.ip, peer.port), peer.local_addr(&w.shared)));
        // the client's own backend connection, if it has one to this backend
        let held = match client.private.take() {
            Some((id, l)) if pp.is_some() && id == backend.id => Some(l),
            other => {
                client.private = other;
                None
            }
        };
        match attempt_one(
            w,
            backend,
            out,
            body,
            attempts.replayable(),
            s.connect_timeout,
            wait,
            view,
            resp,
            resp_rules,
            &resp_edits,
            &mut done.timings.connect,
            pp.as_deref(),
            held,
        )
        .await
        {
            Ok((link, rh)) => {
                if let Some(t) = sending {
                    done.timings.response = Some(t.elapsed().saturating_sub(done.timings.connect.unwrap_or_default()));
                }
                done.status = rh.status;
                done.resp_head = rh.head_len;
                bump(&w.stats.bytes_in, body.len() as u64);
                attempts.observe(backend, rh.status);
                let class = (rh.status / 100).clamp(1, 5) as usize - 1;
                backend.stats.responses[class].fetch_add(1, Relaxed);
                if attempts.retry_status(rh.status, &key) {
                    // retry_on: this response is dropped with its connection
                    drop(link);
                    drop(lease);
                    failed = Some(Fail::Reset);
                    continue;
                }
                w.stats.observe(rh.status, start.elapsed());
                let mut bytes = 0u64;
                let relay = relay(w, client, link, rh, resp, backend.id, &mut bytes);
                let end = match attempts.deadline() {
                    None => relay.await,
                    Some(d) => match tokio::time::timeout_at(d.into(), relay).await {
                        Ok(e) => e,
                        Err(_) => {
                            bump(&w.stats.timeouts, 1);
                            done.term = "sD";
                            RelayEnd::Cut
                        }
                    },
                };
                done.bytes = bytes;
                match end {
                    RelayEnd::Done => {}
                    RelayEnd::BackendBroke => done.term = "SD",
                    RelayEnd::Cut if done.term == "--" => done.term = "CD",
                    RelayEnd::Cut => {}
                }
                backend.stats.bytes_out.fetch_add(bytes, Relaxed);
                bump(&w.stats.bytes_out, bytes);
                drop(lease);
                return match end {
                    RelayEnd::Done => rh.client_keep_alive,
                    RelayEnd::BackendBroke => {
                        // The backend broke mid-body; the client connection is cut.
                        backend.record_failure(s.eject_after, s.ejection());
                        false
                    }
                    RelayEnd::Cut => false,
                };
            }
            Err(Outcome::Unsent(f)) => {
                attempts.failed(backend, false);
                failed = Some(f);
            }
            Err(Outcome::Sent(Fail::Timeout)) if attempts.retry_timeout(&key) => {
                attempts.failed(backend, true);
                failed = Some(Fail::Timeout);
            }
            Err(Outcome::Sent(Fail::Timeout)) => {
                attempts.failed(backend, true);
                // A timed-out request may have had effects: never replayed.
                return reply(w, client, resp, view, start, decide::TIMED_OUT, req_id, done).await;
            }
            Err(Outcome::Sent(f)) => {
                attempts.failed(backend, true);
                failed = Some(f);
            }
        }
    }
    reply(w, client, resp, view, start, decide::gave_up(failed), req_id, done).await
}

/// How an exchange ended, for its access log line.
pub struct Done {
    pub status: u16,
    /// Body bytes sent to the client.
    pub bytes: u64,
    /// Length of the response head at the start of the response buffer (0: none there).
    pub resp_head: usize,
    pub server: Option<Arc<Backend>>,
    pub term: &'static str,
    pub retries: u32,
    pub timings: super::accesslog::Timings,
}

impl Default for Done {
    fn default() -> Self {
        Done {
            status: 0,
            bytes: 0,
            resp_head: 0,
            server: None,
            term: "--",
            retries: 0,
            timings: Default::default(),
        }
    }
}

/// A parsed request's part of its log line: the pool, the request id and
/// the response buffer (its head first, `Done::resp_head` long).
struct Parsed<'a> {
    head: &'a ReqHead,
    pool: Option<&'a str>,
    rid: &'a [u8],
    resp: &'a [u8],
}

/// The access log line of a fast-path request: `head` is the request head
/// as received, `parsed` its parse with the pool, request id and response
/// buffer (None: a request refused before it was understood).
#[allow(clippy::too_many_arguments)]
fn log_line(
    w: &Worker,
    peer: &Peer,
    head: &[u8],
    parsed: Option<Parsed<'_>>,
    done: &Done,
    body: &[u8],
    t0: Option<Instant>,
    begun: Instant,
) {
    use super::accesslog::{Headers, Record};
    let log = &w.shared.access_log;
    if !log.active() {
        return;
    }
    let now = Instant::now();
    let mut timings = done.timings;
    timings.head = t0.map(|t| begun.saturating_duration_since(t));
    timings.total = now.saturating_duration_since(t0.unwrap_or(begun));
    let req_headers = if parsed.is_some() { Headers::Raw(head) } else { Headers::None };
    let (method, target, version, pool, rid, res) = match parsed {
        Some(Parsed { head: h, pool, rid, resp }) => {
            let m = &head[..head.iter().position(|&c| c == b' ').unwrap_or(0)];
            let res = if done.resp_head > 0 && resp.len() >= done.resp_head && resp.starts_with(b"HTTP/") {
                Headers::Raw(&resp[..done.resp_head])
            } else {
                Headers::None
            };
            (m, h1::slice(head, h.target), if h.http10 { "HTTP/1.0" } else { "HTTP/1.1" }, pool.unwrap_or(""), rid, res)
        }
        None => (&b""[..], &b""[..], "", "", &b""[..], Headers::None),
    };
    let r = Record {
        listener: peer.listener,
        client: std::net::SocketAddr::new(peer.ip, peer.port),
        unix: peer.unix,
        when: std::time::SystemTime::now() - timings.total,
        frontend: w.shared.frontends.get(peer.listener).map_or("", String::as_str),
        backend: pool,
        server: done.server.as_ref().map_or("", |b| b.name.as_str()),
        method,
        target,
        version,
        status: done.status,
        bytes_sent: done.bytes,
        bytes_received: body.len() as u64,
        timings,
        retries: done.retries,
        request_id: rid,
        req_headers,
        res_headers: res,
        termination: done.term,
    };
    log.log(&w.log, &r);
}

/// The fast path's part of the decision, while the head's fields are at
/// hand: the route, and whether this path carries it out (None: hyper's
/// path does, for the rest of the connection).
pub(crate) fn plan<'t>(t: &'t Table, listener: &'t Listener, raw: &RawHead<'_, '_>) -> Option<Routed<'t>> {
    let action_index = decide::route(listener, raw);
    let action = listener.action(action_index);
    if action.compress.is_some() && raw.header_any(b"accept-encoding", &mut |_| true) {
        // a response that may be compressed: hyper's path streams it through the encoder
        return None;
    }
    let forward = match (&action.redirect, &action.respond, action.pool) {
        (None, None, Some(p)) => {
            let up = &t.pools[p];
            if up.settings.proto == Proto::H2 || up.policy.sticky.is_some() {
                // HTTP/2 to the backends, or cookie persistence (it reads and writes cookies)
                return None;
            }
            let writes_forwarding = action
                .request
                .add
                .iter()
                .any(|a| a.name == "x-forwarded-for" || a.name == "forwarded" || a.name == "x-forwarded-proto");
            if writes_forwarding {
                // a rule writes them (the balancer's own value goes after it; a rule's
                // X-Forwarded-Proto wins): done once, on hyper's path
                return None;
            }
            let hash_header = match &up.settings.hash_key {
                HashKey::Header(k) => Some(k.as_str()),
                _ => None,
            };
            Some(Forward {
                hash_header,
                rules: Some(&action.request),
                rewrite: action.rewrite.as_ref().map(|r| r as &dyn super::h1::TargetRewrite),
            })
        }
        _ => None,
    };
    Some(Routed { action: action_index, request_id: listener.request_id.as_ref().map(|n| n.as_str()), forward })
}

async fn connect(b: &Backend, timeout: Duration) -> Result<Link, Fail> {
    match tokio::time::timeout(timeout, b.connect()).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(Link {
                s,
                buf: Vec::new(),
                since: 0,
                private: false,
            })
        }
        Ok(Err(_)) => Err(Fail::Connect),
        Err(_) => Err(Fail::ConnectTimeout),
    }
}

enum HeadErr {
    /// Closed or reset before any byte of a response.
    Closed,
    Invalid,
}

async fn read_head(
    link: &mut Link,
    view: ClientView,
    resp: &mut Vec<u8>,
    rules: Option<&Rules>,
    edits: &Edits<'_>,
) -> Result<RespHead, HeadErr> {
    let mut got_any = false;
    loop {
        if !link.buf.is_empty() {
            got_any = true;
            match h1::parse_response_with(&link.buf, view, resp, rules, edits) {
                RespParse::Ready(h) => return Ok(h),
                RespParse::Interim(n) => {
                    link.buf.drain(..n);
                    continue;
                }
                RespParse::Invalid => return Err(HeadErr::Invalid),
                RespParse::Partial if link.buf.len() > MAX_RESP_HEAD => {
                    return Err(HeadErr::Invalid)
                }
                RespParse::Partial => {}
            }
        }
        match link.read(HEAD_READ).await {
            Ok(n) if n > 0 => {}
            _ if got_any => return Err(HeadErr::Invalid),
            _ => return Err(HeadErr::Closed),
        }
    }
}

/// Send the request on a pooled connection (or a new one if the pooled one
/// turns out closed before answering), read the response head.
#[allow(clippy::too_many_arguments)]
async fn attempt_one(
    w: &Worker,
    b: &Backend,
    head: &[u8],
    body: &[u8],
    retryable: bool,
    connect_timeout: Duration,
    wait: Duration,
    view: ClientView,
    resp: &mut Vec<u8>,
    rules: Option<&Rules>,
    edits: &Edits<'_>,
    tc: &mut Option<Duration>,
    proxy_header: Option<&[u8]>,
    mut held: Option<Link>,
) -> Result<(Link, RespHead), Outcome> {
    // A connection that starts with a client's PROXY header is that client's:
    // never from the shared pool, only the one it kept (`held`).
    let mut fresh_only = proxy_header.is_some();
    loop {
        let pooled = match held.take() {
            Some(l) if l.alive() => Some(l),
            Some(_) => None,
            None if fresh_only => None,
            None => w.fast_pool.take(b.id, w.clock.now()),
        };
        let reused = pooled.is_some();
        let mut link = match pooled {
            Some(l) => {
                tc.get_or_insert(Duration::ZERO);
                l
            }
            None => {
                let t = Instant::now();
                let r = connect(b, connect_timeout).await;
                *tc = Some(t.elapsed());
                r.map_err(Outcome::Unsent)?
            }
        };
        if link.buf.capacity() == 0 {
            link.buf = w.fast_pool.scratch();
        }
        // A new connection's PROXY header goes in the same sendmsg as the request.
        let pp = if reused { &[][..] } else { proxy_header.unwrap_or_default() };
        link.private = proxy_header.is_some();
        if send_all(&link.s, &mut [IoSlice::new(pp), IoSlice::new(head), IoSlice::new(body)])
            .await
            .is_err()
        {
            if reused {
                // The backend closed an idle connection: not its failure.
                fresh_only = true;
                continue;
            }
            return Err(Outcome::Sent(Fail::Reset));
        }
        match tokio::time::timeout(wait, read_head(&mut link, view, resp, rules, edits)).await {
            Ok(Ok(rh)) => return Ok((link, rh)),
            Ok(Err(HeadErr::Closed)) if reused && retryable => fresh_only = true,
            Ok(Err(_)) => return Err(Outcome::Sent(Fail::Reset)),
            Err(_) => return Err(Outcome::Sent(Fail::Timeout)),
        }
    }
}

enum RelayEnd {
    Done,
    BackendBroke,
    /// The client went away or the total timeout struck.
    Cut,
}

/// Stream the response to the client; pools the backend connection if its
/// message ended cleanly.
async fn relay(
    w: &Worker,
    client: &mut Client,
    mut link: Link,
    rh: RespHead,
    resp: &mut Vec<u8>,
    id: u64,
    bytes: &mut u64,
) -> RelayEnd {
    let pool = &w.fast_pool;
    let b0 = rh.head_len;
    let avail = link.buf.len() - b0;
    let mut reusable = rh.backend_keep_alive;
    macro_rules! to_client {
        ($($s:expr),+) => {
            if client.send(&mut [$(IoSlice::new($s)),+]).await.is_err() {
                return RelayEnd::Cut;
            }
        };
    }
    macro_rules! from_backend {
        ($buf:expr, $want:expr) => {
            match read_into(&link.s, $buf, $want).await {
                Ok(n) if n > 0 => n,
                _ => return RelayEnd::BackendBroke,
            }
        };
    }
    match rh.mode {
        BodyMode::Empty => {
            reusable &= avail == 0;
            to_client!(resp);
        }
        BodyMode::Length(n) => {
            let have = (avail as u64).min(n) as usize;
            reusable &= avail as u64 <= n;
            to_client!(resp, &link.buf[b0..b0 + have]);
            *bytes += have as u64;
            let mut left = n - have as u64;
            if left > 0 {
                let mut big = std::mem::take(&mut link.buf);
                while left > 0 {
                    big.clear();
                    from_backend!(&mut big, (left as usize).min(BODY_READ));
                    if big.len() as u64 > left {
                        big.truncate(left as usize);
                        reusable = false;
                    }
                    to_client!(&big);
                    left -= big.len() as u64;
                    *bytes += big.len() as u64;
                }
                pool.give_back(big);
            }
        }
        BodyMode::ChunkedPass => {
            let mut ch = Chunks::default();
            let Ok(c) = ch.feed(&link.buf[b0..], |d| *bytes += d.len() as u64) else {
                return RelayEnd::BackendBroke;
            };
            reusable &= c == avail;
            to_client!(resp, &link.buf[b0..b0 + c]);
            if !ch.done() {
                let mut big = std::mem::take(&mut link.buf);
                while !ch.done() {
                    big.clear();
                    from_backend!(&mut big, BODY_READ);
                    let Ok(c) = ch.feed(&big, |d| *bytes += d.len() as u64) else {
                        return RelayEnd::BackendBroke;
                    };
                    reusable &= c == big.len();
                    to_client!(&big[..c]);
                }
                pool.give_back(big);
            }
        }
        BodyMode::Dechunk => {
            let mut ch = Chunks::default();
            let head_len = resp.len();
            if ch
                .feed(&link.buf[b0..], |d| resp.extend_from_slice(d))
                .is_err()
            {
                return RelayEnd::BackendBroke;
            }
            *bytes += (resp.len() - head_len) as u64;
            to_client!(resp);
            let mut big = std::mem::take(&mut link.buf);
            while !ch.done() {
                big.clear();
                from_backend!(&mut big, BODY_READ);
                resp.clear();
                if ch.feed(&big, |d| resp.extend_from_slice(d)).is_err() {
                    return RelayEnd::BackendBroke;
                }
                *bytes += resp.len() as u64;
                to_client!(resp);
            }
            pool.give_back(big);
            reusable = false;
        }
        BodyMode::Chunk | BodyMode::Raw => {
            let chunk = rh.mode == BodyMode::Chunk;
            let mut hdr = Vec::with_capacity(16);
            if avail > 0 {
                if chunk {
                    h1::chunk_header(&mut hdr, avail);
                }
                let tail: &[u8] = if chunk { b"\r\n" } else { b"" };
                to_client!(resp, &hdr, &link.buf[b0..], tail);
                *bytes += avail as u64;
            } else {
                to_client!(resp);
            }
            let mut big = std::mem::take(&mut link.buf);
            loop {
                big.clear();
                match read_into(&link.s, &mut big, BODY_READ).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(_) => return RelayEnd::BackendBroke,
                }
                hdr.clear();
                if chunk {
                    h1::chunk_header(&mut hdr, big.len());
                }
                let tail: &[u8] = if chunk { b"\r\n" } else { b"" };
                to_client!(&hdr, &big, tail);
                *bytes += big.len() as u64;
            }
            pool.give_back(big);
            if chunk {
                to_client!(b"0\r\n\r\n");
            }
            reusable = false;
        }
    }
    if reusable && link.private {
        // kept by its client (its buffer back to the worker while idle)
        pool.give_back(std::mem::take(&mut link.buf));
        client.private = Some((id, link));
    } else if reusable {
        pool.put(id, link, w.clock.now());
    } else {
        pool.give_back(std::mem::take(&mut link.buf));
    }
    RelayEnd::Done
}
