//! The one decision on a request, for both forwarding paths.
//!
//! Sans-I/O: from a request head (any [`View`]) and the routing snapshot it
//! decides the route and pool, the header edits, the rate-limit verdict and
//! the balancer's own answers (redirect, the route's page, 429, 503); from
//! how the attempts on backends ended, the answer to give and the log's
//! termination code. The fast path ([`super::fast`], bytes) and hyper's path
//! ([`super::proxy`], `http` types) only carry the decision out, so they
//! cannot disagree on what a request gets. The retry plan is
//! [`super::attempts`], also shared.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use super::pool::Fail;
use super::ratelimit::{self, LimitKey};
use super::route::{Action, ErrorPage, Listener, Redirect, Rules, Table, View};
use super::upstream::Upstream;

/// An answer the balancer gives itself, with the one-line text used when
/// no error page is configured for its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub reason: &'static str,
    pub body: &'static str,
    /// The access log's termination code (HAProxy's two letters).
    pub term: &'static str,
    /// The counter it adds to.
    pub counter: Counter,
}

/// Which of the balancer's counters an answer adds to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    None,
    NoBackend,
    BackendErrors,
    Timeouts,
    RateLimited,
}

impl Counter {
    /// Add one to this counter of `stats`.
    pub fn bump(self, stats: &super::stats::WorkerStats) {
        let c = match self {
            Counter::None => return,
            Counter::NoBackend => &stats.no_backend,
            Counter::BackendErrors => &stats.backend_errors,
            Counter::Timeouts => &stats.timeouts,
            Counter::RateLimited => &stats.rate_limited,
        };
        super::stats::bump(c, 1);
    }
}

const fn answer(status: u16, reason: &'static str, body: &'static str, term: &'static str, counter: Counter) -> Answer {
    Answer { status, reason, body, term, counter }
}

/// No route took the request and the listener has no default backend
/// (HAProxy answers 503 too).
pub const NO_ROUTE: Answer = answer(503, "Service Unavailable", "no backend for this request\n", "PR", Counter::NoBackend);
/// Every server of the pool is down, drained or ejected.
pub const NO_BACKEND: Answer = answer(503, "Service Unavailable", "no backend available\n", "SC", Counter::NoBackend);
/// The pool's queue (`max_queue`) is full.
pub const QUEUE_FULL: Answer = answer(503, "Service Unavailable", "backend queue full\n", "sQ", Counter::None);
/// A route's rewrite made a target that is not a valid origin-form path
/// (HAProxy answers 500 when a rule fails too).
pub const BAD_REWRITE: Answer =
    answer(500, "Internal Server Error", "the rewritten request target is invalid\n", "PR", Counter::None);
/// A request that reached a backend timed out and may not be replayed.
pub const TIMED_OUT: Answer = answer(504, "Gateway Timeout", "backend timeout\n", "sH", Counter::Timeouts);

/// The answer once the attempts ran out: `failed` is the last attempt's
/// failure (None: there was no server to try).
pub fn gave_up(failed: Option<Fail>) -> Answer {
    match failed {
        Some(Fail::ConnectTimeout) => answer(504, "Gateway Timeout", "backend timeout\n", "sC", Counter::Timeouts),
        Some(Fail::Timeout) => TIMED_OUT,
        Some(Fail::Connect) => answer(502, "Bad Gateway", "backend unavailable\n", "SC", Counter::BackendErrors),
        Some(Fail::Reset) => answer(502, "Bad Gateway", "backend unavailable\n", "SH", Counter::BackendErrors),
        None => NO_BACKEND,
    }
}

/// What a request gets.
pub enum Verdict<'t> {
    /// To a server of pool `pool` (an index into [`Table::pools`]).
    Forward { pool: usize, upstream: &'t Arc<Upstream> },
    /// The route redirects.
    Redirect(&'t Redirect),
    /// The route answers with this page (an empty body replaced by the
    /// error page of its status, if there is one).
    Page(&'t ErrorPage),
    /// A rate limit refuses: `status` with `Retry-After: wait`.
    Limited { status: u16, wait: Duration },
    /// No route and no default backend.
    NoRoute,
}

/// The decision on one request head.
pub struct Decision<'t> {
    pub action: &'t Action,
    pub verdict: Verdict<'t>,
    /// Wait this long first (a rate limit in delay mode); zero mostly.
    pub delay: Duration,
}

impl<'t> Decision<'t> {
    /// The pool's name in the access log ("" when no pool serves it).
    pub fn pool_name(&self, t: &'t Table) -> &'t str {
        match self.verdict {
            Verdict::Forward { pool, .. } => &t.names[pool],
            _ => "",
        }
    }

    /// The status and termination code of an answer of the balancer's own
    /// (None when forwarding).
    pub fn own(&self) -> Option<(u16, &'static str)> {
        match &self.verdict {
            Verdict::Forward { .. } => None,
            Verdict::Redirect(r) => Some((r.code(), "LR")),
            Verdict::Page(p) => Some((p.status, if p.status >= 400 { "PR" } else { "LR" })),
            Verdict::Limited { status, .. } => Some((*status, "PR")),
            Verdict::NoRoute => Some((NO_ROUTE.status, NO_ROUTE.term)),
        }
    }

    /// The header edits of the request when forwarded (empty otherwise).
    pub fn request_rules(&self) -> &'t Rules {
        &self.action.request
    }

    /// The header edits of the backend's response.
    pub fn response_rules(&self) -> &'t Rules {
        &self.action.response
    }
}

/// The action index for `req` on `listener` (pure: nothing counted).
pub fn route<V: View + ?Sized>(listener: &Listener, req: &V) -> usize {
    listener.route(req)
}

/// The decision on a request routed to `action` of `listener`, from `ip`;
/// `header` gives the first value of a field (a rate limit's key). The rate
/// limits (the balancer's, the route's, then the pool's when forwarding)
/// count the request here, once.
pub fn decide<'t, 'h>(
    t: &'t Table,
    listener: usize,
    action: usize,
    ip: IpAddr,
    header: impl Fn(&http::HeaderName) -> Option<&'h [u8]>,
) -> Decision<'t> {
    let action = t.listener(listener).action(action);
    let forward = match (&action.redirect, &action.respond, action.pool) {
        (None, None, Some(pool)) => Some(pool),
        _ => None,
    };
    let pool_limit = forward.and_then(|p| t.pools[p].rate_limit.as_deref());
    let limits = [t.rate_limit.as_deref(), action.rate_limit.as_deref(), pool_limit].into_iter().flatten();
    let verdict_of = |rl: &ratelimit::Table| {
        let key = match &rl.spec.key {
            LimitKey::Header(n) => header(n),
            LimitKey::Src => None,
        };
        rl.verdict(ip, key)
    };
    let mut delay = Duration::ZERO;
    let verdict = match ratelimit::combined(limits, verdict_of) {
        ratelimit::Outcome::Refuse(status, wait) => Verdict::Limited { status, wait },
        outcome => {
            if let ratelimit::Outcome::Wait(d) = outcome {
                delay = d;
            }
            match (&action.redirect, &action.respond, forward) {
                (Some(r), _, _) => Verdict::Redirect(r),
                (None, Some(page), _) => {
                    // the route's own answer (HAProxy's http-request return / deny);
                    // without a body, the error page of its status if there is one
                    let page = if page.body.is_empty() { t.error_page(page.status).map_or(&**page, |p| &**p) } else { &**page };
                    Verdict::Page(page)
                }
                (None, None, Some(pool)) => Verdict::Forward { pool, upstream: &t.pools[pool] },
                (None, None, None) => Verdict::NoRoute,
            }
        }
    };
    Decision { action, verdict, delay }
}

#[cfg(test)]
mod tests;
