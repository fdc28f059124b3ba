//! TLS to backends: the client side of a backend connection, shared by the
//! HTTP/1 and HTTP/2 pools. Apart from [`super::https`] (TLS from clients,
//! a driver of hyper's path) so that the pools, below the worker state,
//! need nothing of the listeners.

use std::io;
use std::sync::Arc;

use tokio::net::TcpStream;

/// Connect to a backend over TLS, verifying it per `config` against the
/// host of its address.
pub async fn connect_backend(
    config: &Arc<rustls::ClientConfig>,
    authority: &http::uri::Authority,
    stream: TcpStream,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_string();
    let name = rustls::pki_types::ServerName::try_from(host)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    tokio_rustls::TlsConnector::from(config.clone()).connect(name, stream).await
}
