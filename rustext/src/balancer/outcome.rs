//! What one backend attempt on hyper's path comes back with ([`Outcome`],
//! HTTP/1 and HTTP/2 alike), and what its response holds of the backend
//! until it ends ([`Held`]: a connection of [`super::pool`], or a [`Slot`]
//! of an HTTP/2 connection). Between the pools and the response body: the
//! HTTP/2 pool makes slots, the response body drops them.

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use super::pool::{BackendConn, Fail};
use super::reqbody::ReqBody;

/// A stream of a connection, counted until the response ends (dropped).
pub struct Slot(pub(super) Arc<AtomicU32>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// What a response holds of its backend until it ends: an HTTP/1
/// connection (pooled again after a clean end) or an HTTP/2 stream.
pub(super) enum Held {
    H1(BackendConn),
    // never read: dropping it frees the stream
    H2(#[allow(dead_code)] Slot),
}

pub(super) enum Outcome {
    Response(Response<Incoming>, Held),
    /// Nothing was sent: the request can go to another backend as it is.
    Unsent(Request<ReqBody>, Fail),
    /// The request (or part of it) went out, then the exchange failed.
    Sent(Fail),
}
