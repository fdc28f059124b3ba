//! The fast path's own answers (no backend, queue full, gateway errors,
//! rate limited): the configured error page or the one-line text, written
//! to the client with the exchange's edits, and counted as the request's.

use std::io::IoSlice;
use std::time::{Duration, Instant};

use super::super::h1::{self, ClientView, Edits};
use super::super::stats::bump;
use super::super::worker::Worker;
use super::{Client, Done};

/// An answer the balancer gives itself: status, reason, body.
pub(super) type OwnAnswer = (u16, &'static str, &'static str);
pub(super) const QUEUE_FULL: OwnAnswer = (503, "Service Unavailable", "backend queue full\n");
pub(super) const NO_BACKEND: OwnAnswer = (503, "Service Unavailable", "no backend available\n");
/// No route took the request and the listener has no default backend (HAProxy answers 503 too).
pub(super) const NO_ROUTE: OwnAnswer = (503, "Service Unavailable", "no backend for this request\n");
pub(super) const BAD_GATEWAY: OwnAnswer = (502, "Bad Gateway", "backend unavailable\n");
pub(super) const GATEWAY_TIMEOUT: OwnAnswer = (504, "Gateway Timeout", "backend timeout\n");

/// Answer from the balancer itself; whether the connection goes on.
#[allow(clippy::too_many_arguments)]
pub(super) async fn reply(
    w: &Worker,
    client: &mut Client,
    resp: &mut Vec<u8>,
    view: ClientView,
    start: Instant,
    answer: OwnAnswer,
    req_id: Option<(&str, &[u8])>,
    done: &mut Done,
) -> bool {
    reply_with(w, client, resp, view, start, answer, &Edits { add: &[], req_id, src: b"" }, done).await
}

/// [`reply`] with `edits`: its configured error page if there is one, else its text.
#[allow(clippy::too_many_arguments)]
pub(super) async fn reply_with(
    w: &Worker,
    client: &mut Client,
    resp: &mut Vec<u8>,
    view: ClientView,
    start: Instant,
    (status, reason, body): OwnAnswer,
    edits: &Edits<'_>,
    done: &mut Done,
) -> bool {
    let t = w.shared.table();
    let sent = match t.error_page(status) {
        Some(page) => {
            h1::page_response_with(resp, page, reason, view, edits);
            page.body.len()
        }
        None => {
            h1::simple_response_with(resp, status, reason, body, view, edits);
            body.len()
        }
    };
    w.stats.observe(status, start.elapsed());
    done.status = status;
    done.bytes = sent as u64;
    done.resp_head = resp.len() - if view.head_request { 0 } else { sent };
    client.send(&mut [IoSlice::new(resp)]).await.is_ok() && view.keep_alive && !view.closing
}

/// Refused by the rate limit: `status` (429) with `Retry-After`; whether
/// the connection goes on.
#[allow(clippy::too_many_arguments)]
pub(super) async fn too_many(
    w: &Worker,
    client: &mut Client,
    resp: &mut Vec<u8>,
    view: ClientView,
    status: u16,
    wait: Duration,
    req_id: Option<(&str, &[u8])>,
    done: &mut Done,
) -> bool {
    let start = Instant::now();
    bump(&w.stats.requests, 1);
    bump(&w.stats.rate_limited, 1);
    let retry = super::super::route::retry_after(wait);
    let reason = http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Too Many Requests");
    done.term = "PR";
    let edits = Edits { add: std::slice::from_ref(&retry), req_id, src: b"" };
    reply_with(w, client, resp, view, start, (status, reason, super::super::ratelimit::BODY), &edits, done).await
}
