//! hyper's service for a client connection: each request to
//! [`super::proxy`]'s handler. Apart from the drivers that serve
//! connections with it (plain HTTP/1 in [`super::serve`], cleartext HTTP/2
//! in [`super::h2c`], TLS in [`super::https`]), so that h2c and https need
//! not import serve, which starts them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::proxy::handle;
use super::worker::{Peer, Worker};

type HandleFuture = Pin<
    Box<
        dyn Future<Output = Result<hyper::Response<super::respbody::RespBody>, std::convert::Infallible>>
            + Send,
    >,
>;

/// hyper's service for a connection: [`handle`] each request.
pub(super) struct Svc {
    worker: Arc<Worker>,
    peer: Arc<Peer>,
}

impl Svc {
    pub(super) fn new(worker: Arc<Worker>, peer: Arc<Peer>) -> Self {
        Svc { worker, peer }
    }
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Svc {
    type Response = hyper::Response<super::respbody::RespBody>;
    type Error = std::convert::Infallible;
    type Future = HandleFuture;
    fn call(&self, req: hyper::Request<hyper::body::Incoming>) -> HandleFuture {
        Box::pin(handle(self.worker.clone(), self.peer.clone(), req.map(super::reqbody::ClientBody::Hyper)))
    }
}
