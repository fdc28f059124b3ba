//! rustext: the native hot paths of the suite, each a sans-I/O core.
//!
//! Layout (one module, one concept):
//! - [`framing`]  length-prefixed stream splitter: feed bytes, get whole frames back.
//! - [`rpcx`]     rpcx message codec (`rpcx/`: `decode`, `encode`, `stream`, `python` bindings).
//! - [`juggler`]  juggler.0 envelope codec; `args` stay raw JSON bytes
//!   (`juggler/`: `scan` JSON scanner, `parse`, `build`, `python` bindings).
//! - [`wsdeflate`] permessage-deflate (RFC 7692): the shared compressor, the bounded inflater.
//! - [`wsframe`]  websocket frames (RFC 6455 §5), server side: the client-frame
//!   reader (bytes in, events out) and the server-frame writer.
//! - [`timer`]    min-heap of deadlines: add / cancel / pop_expired(now).
//! - [`tls`]      PEM certificates and keys, SNI certificate choice with reload, rustls configs.
//! - [`tls_alpn`] ACME TLS-ALPN-01 challenge certificates picked for `acme-tls/1` handshakes.
//! - [`grpc`]     gRPC (HTTP/2) server and client for seq's `pb.RRAPI`, batched to Python
//!   (`grpc/`: `frame`, `proto`, `server`, `client`, `python`).
//! - [`balancer`] the HTTP load balancer's data plane (tokio + hyper, own threads;
//!   `balancer/`: `config`, `server`, `fast`, `h1`, `proxy`, `upstream`, `pool`, `attempts`, `stats`, …).
//! - [`errors`]   the Python exception tree; Rust errors are enums converted only here.
//!
//! The pure-Rust cores build and test without Python (`cargo test`); the PyO3
//! bindings live behind the `python` feature, which maturin turns on, and are
//! exposed as the private module `rustext._native` behind the typed facade
//! `rustext/__init__.py`.

pub mod balancer;
pub mod framing;
pub mod grpc;
pub mod juggler;
pub mod rpcx;
pub mod timer;
pub mod tls;
pub mod tls_alpn;
pub mod wsdeflate;
pub mod wsframe;

#[cfg(feature = "python")]
pub mod errors;

#[cfg(feature = "python")]
mod python {
    use pyo3::prelude::*;

    #[pymodule]
    fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
        crate::errors::register(m)?;
        crate::framing::python::register(m)?;
        crate::rpcx::python::register(m)?;
        crate::juggler::python::register(m)?;
        crate::timer::python::register(m)?;
        crate::balancer::python::register(m)?;
        crate::grpc::python::register(m)?;
        crate::wsframe::python::register(m)?;
        crate::wsdeflate::python::register(m)?;
        Ok(())
    }
}
