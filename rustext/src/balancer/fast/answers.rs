//! The fast path's own answers (no backend, queue full, gateway errors,
//! rate limited): the configured error page or the one-line text, written
//! to the client with the exchange's edits, and counted as the request's.

use std::io::IoSlice;
use std::time::{Duration, Instant};

use super::super::config::ErrorPage;
use super::super::decide::{Answer, Counter};
use super::super::h1::{self, ClientView, Edits, Page};
use super::super::stats::bump;
use super::super::worker::Worker;
use super::{Client, Done};

/// A configured page as the codec writes it.
pub(super) fn page(p: &ErrorPage) -> Page<'_> {
    Page { status: p.status, headers: &p.headers, body: &p.body }
}

/// An answer of the balancer's own ([`super::super::decide`] says which),
/// counted and with its termination code; whether the connection goes on.
#[allow(clippy::too_many_arguments)]
pub(super) async fn reply(
    w: &Worker,
    client: &mut Client,
    resp: &mut Vec<u8>,
    view: ClientView,
    start: Instant,
    answer: Answer,
    req_id: Option<(&str, &[u8])>,
    done: &mut Done,
) -> bool {
    answer.counter.bump(&w.stats);
    done.term = answer.term;
    let own = (answer.status, answer.reason, answer.body);
    reply_with(w, client, resp, view, start, own, &Edits { add: &[], req_id, src: b"" }, done).await
}

/// [`reply`] with `edits`: its configured error page if there is one, else its text.
#[allow(clippy::too_many_arguments)]
pub(super) async fn reply_with(
    w: &Worker,
    client: &mut Client,
    resp: &mut Vec<u8>,
    view: ClientView,
    start: Instant,
    (status, reason, body): (u16, &'static str, &'static str),
    edits: &Edits<'_>,
    done: &mut Done,
) -> bool {
    let t = w.shared.table();
    let sent = match t.error_page(status) {
        Some(page) => {
            h1::page_response_with(resp, self::page(page), reason, view, edits);
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
    Counter::RateLimited.bump(&w.stats);
    let retry = super::super::route::retry_after(wait);
    let reason = http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Too Many Requests");
    done.term = "PR";
    let edits = Edits { add: std::slice::from_ref(&retry), req_id, src: b"" };
    reply_with(w, client, resp, view, start, (status, reason, super::super::ratelimit::BODY), &edits, done).await
}
