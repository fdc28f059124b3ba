//! ACME TLS-ALPN-01 challenges (RFC 8737) in the server's certificate choice.
//!
//! While an order is pending, the control plane gives a challenge
//! certificate per host name (self-signed, with the critical
//! id-pe-acmeIdentifier extension holding the key authorization's digest);
//! a ClientHello naming that host and offering only the `acme-tls/1`
//! protocol gets it instead of the host's certificate. The connection is
//! closed right after the handshake (RFC 8737 §3: no application data).
//! Any other handshake is untouched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ClientHello;
use rustls::sign::CertifiedKey;

/// The ALPN protocol of TLS-ALPN-01 validation.
pub const ACME_TLS_1: &[u8] = b"acme-tls/1";

/// Challenge certificates by host name (lowercase, no trailing dot).
#[derive(Debug, Default)]
pub struct AlpnChallenges {
    by_name: RwLock<HashMap<String, Arc<CertifiedKey>>>,
    /// Whether any challenge is pending (a handshake takes no lock otherwise).
    any: AtomicBool,
}

impl AlpnChallenges {
    /// Serve `cert_pem`/`key_pem` to `acme-tls/1` handshakes naming `name`.
    pub fn set(&self, name: &str, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), String> {
        let certs = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("challenge certificate: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("challenge key: {e}"))?;
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        // not `CertifiedKey::from_der`: its check that the key matches parses the
        // certificate with webpki, which refuses the critical acmeIdentifier extension
        let signer = provider.key_provider.load_private_key(key).map_err(|e| format!("challenge key: {e}"))?;
        let certified = CertifiedKey::new(certs, signer);
        let mut map = self.by_name.write().unwrap_or_else(|e| e.into_inner());
        map.insert(normal(name), Arc::new(certified));
        self.any.store(true, Relaxed);
        Ok(())
    }

    /// Stop answering challenges for `name`.
    pub fn remove(&self, name: &str) {
        let mut map = self.by_name.write().unwrap_or_else(|e| e.into_inner());
        map.remove(&normal(name));
        self.any.store(!map.is_empty(), Relaxed);
    }

    /// The challenge certificate for this handshake, if it is a validation:
    /// a pending name, and `acme-tls/1` as the only protocol offered.
    pub fn pick(&self, hello: &ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if !self.any.load(Relaxed) {
            return None;
        }
        let mut offered = hello.alpn()?;
        if offered.next()? != ACME_TLS_1 || offered.next().is_some() {
            return None;
        }
        let name = normal(hello.server_name()?);
        self.by_name.read().unwrap_or_else(|e| e.into_inner()).get(&name).cloned()
    }
}

fn normal(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}
