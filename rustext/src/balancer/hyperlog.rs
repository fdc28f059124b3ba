//! The access-log line of an exchange on hyper's path, and of a
//! connection that ended without a complete request: what is kept of the
//! request and response until the response ends, then the record written.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, HeaderName, Request, Version};

use super::reqbody::Progress;
use super::worker::{Peer, Worker};

/// What the access log line of a hyper-path request needs, kept until its
/// response ends (built only with an access log).
pub struct HyperLog {
    pub(super) client: SocketAddr,
    pub(super) unix: bool,
    t0: Instant,
    pub(super) frontend: usize,
    pub(super) method: http::Method,
    pub(super) target: String,
    pub(super) version: &'static str,
    pub(super) req_headers: HeaderMap,
    pub(super) res_headers: HeaderMap,
    pub(super) rid: Vec<u8>,
    pub(super) pool: String,
    pub(super) server: String,
    pub term: &'static str,
    pub(super) retries: u32,
    pub(super) timings: super::accesslog::Timings,
    pub(super) status: u16,
    /// How much of the request body went to the backend.
    pub(super) progress: Option<Arc<Progress>>,
}

impl HyperLog {
    pub(super) fn new<B>(w: &Worker, peer: &Peer, req: &Request<B>, start: Instant) -> Option<Box<HyperLog>> {
        let f = w.shared.access_log.format_of(peer.listener)?;
        let mut req_headers = HeaderMap::new();
        for n in &f.req_headers {
            if let Some(v) = req.headers().get(n.as_str()) {
                if let Ok(name) = HeaderName::from_bytes(n.as_bytes()) {
                    req_headers.insert(name, v.clone());
                }
            }
        }
        Some(Box::new(HyperLog {
            client: SocketAddr::new(peer.ip, peer.port),
            unix: peer.unix,
            t0: start,
            frontend: peer.listener,
            method: req.method().clone(),
            target: req.uri().path_and_query().map_or("/", |pq| pq.as_str()).to_string(),
            version: match req.version() {
                Version::HTTP_10 => "HTTP/1.0",
                Version::HTTP_2 => "HTTP/2.0",
                Version::HTTP_3 => "HTTP/3.0",
                _ => "HTTP/1.1",
            },
            req_headers,
            res_headers: HeaderMap::new(),
            rid: Vec::new(),
            pool: String::new(),
            server: String::new(),
            term: "--",
            retries: 0,
            timings: Default::default(),
            status: 0,
            progress: None,
        }))
    }

    /// Keep the response headers the format shows.
    pub(super) fn keep_response(&mut self, w: &Worker, h: &HeaderMap) {
        let Some(f) = w.shared.access_log.format_of(self.frontend) else { return };
        for n in &f.res_headers {
            if let (Some(v), Ok(name)) = (h.get(n.as_str()), HeaderName::from_bytes(n.as_bytes())) {
                self.res_headers.insert(name, v.clone());
            }
        }
    }

    /// Write the line: `bytes` of body sent, `received` of body read.
    pub fn emit(&self, w: &Worker, bytes: u64, received: u64) {
        let received = received.max(self.progress.as_ref().map_or(0, |p| p.bytes.load(Relaxed)));
        use super::accesslog::{Headers, Record};
        let log = &w.shared.access_log;
        if !log.active() {
            return;
        }
        let mut timings = self.timings;
        timings.total = self.t0.elapsed();
        let r = Record {
            listener: self.frontend,
            client: self.client,
            unix: self.unix,
            when: std::time::SystemTime::now() - timings.total,
            frontend: w.shared.frontends.get(self.frontend).map_or("", String::as_str),
            backend: &self.pool,
            server: &self.server,
            method: self.method.as_str().as_bytes(),
            target: self.target.as_bytes(),
            version: self.version,
            status: self.status,
            bytes_sent: bytes,
            bytes_received: received,
            timings,
            retries: self.retries,
            request_id: &self.rid,
            req_headers: Headers::Map(&self.req_headers),
            res_headers: Headers::Map(&self.res_headers),
            termination: self.term,
        };
        log.log(&w.log, &r);
    }
}

/// The line of a request hyper refused itself (a malformed head: 400, too
/// large: 431), answered and closed without reaching [`handle`].
pub fn log_refused_by_hyper(w: &Worker, peer: &Peer, e: &hyper::Error) {
    if e.is_parse() || e.is_parse_too_large() {
        log_without_request(w, peer, if e.is_parse_too_large() { 431 } else { 400 }, "PR");
    } else if e.is_incomplete_message() {
        // the client closed in the middle of a request head
        log_without_request(w, peer, 400, "CR");
    }
}

/// A `<BADREQ>` line: a connection that ended without a complete request —
/// refused (`PR`), closed by the client mid-head (`CR`, 400) or before its
/// first byte (`CR`, only with `log_empty`), or cut by the header timeout
/// (`cR`, 408). HAProxy's termination states.
pub fn log_without_request(w: &Worker, peer: &Peer, status: u16, term: &'static str) {
    use super::accesslog::{Headers, Record};
    let log = &w.shared.access_log;
    if !log.active() {
        return;
    }
    let r = Record {
        listener: peer.listener,
        client: SocketAddr::new(peer.ip, peer.port),
        unix: peer.unix,
        when: std::time::SystemTime::now(),
        frontend: w.shared.frontends.get(peer.listener).map_or("", String::as_str),
        backend: "",
        server: "",
        method: b"",
        target: b"",
        version: "",
        status,
        bytes_sent: 0,
        bytes_received: 0,
        timings: Default::default(),
        retries: 0,
        request_id: b"",
        req_headers: Headers::None,
        res_headers: Headers::None,
        termination: term,
    };
    log.log(&w.log, &r);
}
