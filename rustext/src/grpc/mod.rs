//! gRPC for seq's public `pb.RRAPI` (rrseq.md), native so that Python does
//! not pay grpc.aio's per-call cost.
//!
//! - [`proto`]  hand-written protobuf codec of the six RRAPI messages (sans-I/O)
//! - [`frame`]  gRPC message framing, status codes, `grpc-timeout`, `grpc-message` (sans-I/O)
//! - [`server`] hyper HTTP/2 server on its own tokio thread, handing calls to
//!   the application in batches through a [`server::Bridge`]
//! - [`client`] hyper HTTP/2 client (one connection per server, multiplexed
//!   streams), completing calls in batches through a [`client::Completions`] queue
//! - `python`   the PyO3 bindings (`rustext.GrpcServer`, `rustext.GrpcClient`)

pub mod client;
pub mod frame;
pub mod proto;
pub mod server;

#[cfg(feature = "python")]
pub mod python;
