//! TLS material for the native servers and clients (the balancer, gRPC).
//!
//! - PEM certificates (a chain: leaf first) and private keys (PKCS#8,
//!   PKCS#1 RSA or SEC1 EC) are read with rustls' own PEM parser; a key that
//!   does not belong to its certificate is refused at load, naming the files.
//! - [`CertResolver`] picks a server certificate by SNI from the DNS names in
//!   each certificate (exact names, then `*.` wildcards of one label, then
//!   the first certificate as the default), as HAProxy does with several
//!   `crt`. Its store is replaced whole by [`CertResolver::reload`]: new
//!   handshakes get the new certificates, established connections keep the
//!   session they negotiated.
//! - [`server_config`] / [`client_config`] build rustls configurations: TLS
//!   1.2 and 1.3, ALPN, optional client certificates verified against a CA,
//!   servers verified against a CA file or the system's trust store.
//!
//! - [`ocsp`]: OCSP responses stapled to the served certificates.
//!
//! The crypto provider is aws-lc-rs, rustls' default.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

mod ocsp;

/// A certificate chain file and its private key file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertPair {
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self { cert: cert.into(), key: key.into() }
    }
}

/// Why TLS material could not be used; every variant names the file.
#[derive(Debug)]
pub enum TlsError {
    /// the file could not be read, or holds no PEM section of the kind wanted
    Pem { path: PathBuf, what: &'static str, detail: String },
    /// the key does not belong to the certificate, or is of an unsupported kind
    Key { cert: PathBuf, key: PathBuf, detail: String },
    /// a CA file whose certificates could not be used as trust anchors
    Ca { path: PathBuf, detail: String },
    /// no certificate was given to a server
    NoCertificate,
    /// rustls refused the configuration
    Config(String),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Pem { path, what, detail } => {
                write!(f, "{}: cannot read a PEM {what}: {detail}", path.display())
            }
            TlsError::Key { cert, key, detail } => {
                write!(f, "{} does not go with {}: {detail}", key.display(), cert.display())
            }
            TlsError::Ca { path, detail } => write!(f, "{}: unusable CA certificates: {detail}", path.display()),
            TlsError::NoCertificate => f.write_str("no certificate configured"),
            TlsError::Config(detail) => write!(f, "TLS configuration refused: {detail}"),
        }
    }
}

impl std::error::Error for TlsError {}

/// One line a user can act on for a failed client handshake (unknown
/// issuer, expired certificate, wrong name), the same wording as the
/// Python side's `describe_ssl_error`.
pub fn describe_io_error(e: &std::io::Error) -> String {
    use rustls::{CertificateError, Error};
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<Error>()) else {
        return e.to_string();
    };
    match tls {
        Error::InvalidCertificate(cert) => {
            let (what, hint) = match cert {
                CertificateError::UnknownIssuer => {
                    ("unable to get local issuer certificate", " (pass the CA that signed it with --tls-ca FILE)")
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    ("certificate has expired", " (renew the server's certificate)")
                }
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                    ("certificate is not valid for this name", " (connect with a name the certificate lists)")
                }
                _ => ("", ""),
            };
            if what.is_empty() {
                format!("server certificate refused: {cert:?}")
            } else {
                format!("server certificate refused: {what}{hint}")
            }
        }
        // a plain-text answer (an HTTP/1 400, an h2c preface) read as a TLS record
        Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)
        | Error::InvalidMessage(rustls::InvalidMessage::UnknownProtocolVersion) => {
            "TLS handshake failed: the server answered in clear: it does not speak TLS on this port \
             (connect without TLS)"
                .to_string()
        }
        other => format!("TLS handshake failed: {other}"),
    }
}

fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default().cloned().unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
}

/// SHA-256 of `data` by the TLS provider (a client certificate's
/// fingerprint); empty if the provider has no SHA-256 suite.
pub fn sha256(data: &[u8]) -> Vec<u8> {
    provider()
        .cipher_suites
        .iter()
        .map(|s| match s {
            rustls::SupportedCipherSuite::Tls13(t) => t.common.hash_provider,
            rustls::SupportedCipherSuite::Tls12(t) => t.common.hash_provider,
        })
        .find(|h| h.algorithm() == rustls::crypto::hash::HashAlgorithm::SHA256)
        .map(|h| h.hash(data).as_ref().to_vec())
        .unwrap_or_default()
}

/// Every certificate of a PEM file, in order (a chain: the leaf first).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_err = |detail: String| TlsError::Pem { path: path.to_path_buf(), what: "certificate", detail };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_err("no CERTIFICATE section found".into()));
    }
    Ok(certs)
}

/// Every certificate revocation list of a PEM file (`X509 CRL` sections).
pub fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let pem_err = |detail: String| TlsError::Pem { path: path.to_path_buf(), what: "CRL", detail };
    let crls = CertificateRevocationListDer::pem_file_iter(path)
        .map_err(|e| pem_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(e.to_string()))?;
    if crls.is_empty() {
        return Err(pem_err("no X509 CRL section found".into()));
    }
    Ok(crls)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 RSA or SEC1 EC).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Pem {
        path: path.to_path_buf(),
        what: "private key",
        detail: e.to_string(),
    })
}

/// A certificate chain with its key, checked to belong together.
pub fn load_certified_key(pair: &CertPair) -> Result<Arc<CertifiedKey>, TlsError> {
    let certs = load_certs(&pair.cert)?;
    let key = load_key(&pair.key)?;
    CertifiedKey::from_der(certs, key, &provider())
        .map(Arc::new)
        .map_err(|e| TlsError::Key { cert: pair.cert.clone(), key: pair.key.clone(), detail: e.to_string() })
}

/// A trust store of the certificates in a PEM file.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::Ca { path: path.to_path_buf(), detail: e.to_string() })?;
    }
    Ok(roots)
}

/// The system's trust store (the platform's certificate bundle).
pub fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(found.certs);
    roots
}

/// The certificates a server presents, indexed by the DNS names they carry.
#[derive(Debug)]
struct CertStore {
    default: Arc<CertifiedKey>,
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` is kept as `example.com`
    wildcard: HashMap<String, Arc<CertifiedKey>>,
}

impl CertStore {
    fn load(pairs: &[CertPair]) -> Result<Self, TlsError> {
        let mut keys = Vec::with_capacity(pairs.len());
        for pair in pairs {
            keys.push(load_certified_key(pair)?);
        }
        let default = keys.first().cloned().ok_or(TlsError::NoCertificate)?;
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        for key in &keys {
            for name in dns_names(key) {
                // the first certificate naming a host wins, as with HAProxy's crt order
                match name.strip_prefix("*.") {
                    Some(suffix) => wildcard.entry(suffix.to_string()).or_insert_with(|| key.clone()),
                    None => exact.entry(name).or_insert_with(|| key.clone()),
                };
            }
        }
        Ok(Self { default, exact, wildcard })
    }

    fn pick(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        if let Some(name) = sni {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if let Some(key) = self.exact.get(&name) {
                return key.clone();
            }
            if let Some((_, parent)) = name.split_once('.') {
                if let Some(key) = self.wildcard.get(parent) {
                    return key.clone();
                }
            }
        }
        self.default.clone()
    }
}

/// The DNS names (subjectAltName) of a certified key's leaf certificate, lowercased.
fn dns_names(key: &CertifiedKey) -> Vec<String> {
    let Some(leaf) = key.cert.first() else { return Vec::new() };
    match webpki::EndEntityCert::try_from(leaf) {
        Ok(cert) => cert.valid_dns_names().map(|n| n.trim_end_matches('.').to_ascii_lowercase()).collect(),
        Err(_) => Vec::new(),
    }
}

/// Server certificates chosen by SNI; reloadable while serving (see module doc).
#[derive(Debug)]
pub struct CertResolver {
    store: RwLock<Arc<CertStore>>,
    pairs: RwLock<Vec<CertPair>>,
    staples: RwLock<ocsp::Staples>,
    /// ACME TLS-ALPN-01 challenge certificates, served before `store`.
    pub acme: crate::tls_alpn::AlpnChallenges,
}

impl CertResolver {
    /// Loads every pair; the first is the default for clients without a matching SNI.
    pub fn new(pairs: Vec<CertPair>) -> Result<Self, TlsError> {
        let store = CertStore::load(&pairs)?;
        Ok(Self {
            store: RwLock::new(Arc::new(store)),
            pairs: RwLock::new(pairs),
            staples: Default::default(),
            acme: Default::default(),
        })
    }

    /// Reads the files again (new `pairs` when given); on error the current
    /// certificates stay in service.
    pub fn reload(&self, pairs: Option<Vec<CertPair>>) -> Result<(), TlsError> {
        let pairs = pairs.unwrap_or_else(|| self.pairs.read().expect("cert pairs lock").clone());
        let store = CertStore::load(&pairs)?;
        self.install(store);
        *self.pairs.write().expect("cert pairs lock") = pairs;
        Ok(())
    }

    /// The certificate a handshake naming `sni` gets.
    pub fn pick(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        self.store.read().expect("cert store lock").pick(sni)
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(challenge) = self.acme.pick(&client_hello) {
            return Some(challenge);
        }
        Some(self.pick(client_hello.server_name()))
    }
}

/// A server configuration: TLS 1.2 and 1.3, certificates from `resolver`,
/// ALPN protocols in preference order, client certificates required and
/// verified against `client_ca` when given.
pub fn server_config(
    resolver: Arc<CertResolver>,
    alpn: &[&[u8]],
    client_ca: Option<&Path>,
) -> Result<ServerConfig, TlsError> {
    server_config_verifying(resolver, alpn, client_ca, false, None)
}

/// [`server_config`], and with `optional` a client may also present no
/// certificate (one it presents is still verified: an invalid one is
/// refused); with `crl`, a certificate any of its revocation lists names is
/// refused, and so is one whose chain has a CA without a list there.
pub fn server_config_verifying(
    resolver: Arc<CertResolver>,
    alpn: &[&[u8]],
    client_ca: Option<&Path>,
    optional: bool,
    crl: Option<&Path>,
) -> Result<ServerConfig, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca {
        Some(path) => {
            let roots = Arc::new(load_roots(path)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider());
            let verifier = if optional { verifier.allow_unauthenticated() } else { verifier };
            let verifier = match crl {
                Some(crl) => verifier.with_crls(load_crls(crl)?),
                None => verifier,
            };
            let verifier = verifier
                .build()
                .map_err(|e| TlsError::Ca { path: path.to_path_buf(), detail: e.to_string() })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// How a client checks the servers it connects to.
#[derive(Clone, Debug, Default)]
pub enum ServerTrust {
    /// the system's trust store
    #[default]
    System,
    /// the certificates of a PEM file
    CaFile(PathBuf),
    /// no verification at all (an explicit opt-in, for trying things out)
    Insecure,
}

/// A client configuration: TLS 1.2 and 1.3, servers checked per `trust`,
/// an optional client certificate, ALPN protocols in preference order.
pub fn client_config(
    trust: &ServerTrust,
    client_cert: Option<&CertPair>,
    alpn: &[&[u8]],
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match trust {
        ServerTrust::System => builder.with_root_certificates(system_roots()),
        ServerTrust::CaFile(path) => builder.with_root_certificates(load_roots(path)?),
        ServerTrust::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider()))),
    };
    let mut config = match client_cert {
        Some(pair) => {
            let key = load_certified_key(pair)?;
            builder
                .with_client_auth_cert(key.cert.clone(), load_key(&pair.key)?)
                .map_err(|e| TlsError::Key { cert: pair.cert.clone(), key: pair.key.clone(), detail: e.to_string() })?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Accepts any server certificate (signatures are still checked, so the
/// handshake is well-formed); only behind an explicit `insecure` option.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_plain_text_answer_is_named_as_such() {
        for inner in [rustls::InvalidMessage::InvalidContentType, rustls::InvalidMessage::UnknownProtocolVersion] {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls::Error::InvalidMessage(inner));
            let text = describe_io_error(&e);
            assert!(text.contains("does not speak TLS on this port"), "{text}");
        }
        let other = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls::Error::DecryptError);
        assert!(!describe_io_error(&other).contains("does not speak TLS"));
    }

    /// A throwaway directory with certificates made by openssl(1).
    pub(super) struct Dir(PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn openssl(dir: &Path, args: &[&str]) {
        let ok = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(ok.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&ok.stderr));
    }

    /// Self-signed certificates `NAME.crt`/`NAME.key` for each (name, SAN) given.
    pub(super) fn certs(tag: &str, names: &[(&str, &str)]) -> Dir {
        let dir = std::env::temp_dir().join(format!("rustext-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, san) in names {
            openssl(
                &dir,
                &[
                    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", &format!("{name}.key"), "-out", &format!("{name}.crt"), "-days", "2",
                    "-subj", &format!("/CN={name}"), "-addext", &format!("subjectAltName={san}"),
                ],
            );
        }
        Dir(dir)
    }

    pub(super) fn pair(dir: &Dir, name: &str) -> CertPair {
        CertPair::new(dir.0.join(format!("{name}.crt")), dir.0.join(format!("{name}.key")))
    }

    #[test]
    fn picks_by_sni_exact_then_wildcard_then_default() {
        let dir = certs("sni", &[("a", "DNS:a.test"), ("b", "DNS:b.test,DNS:*.b.test")]);
        let resolver = CertResolver::new(vec![pair(&dir, "a"), pair(&dir, "b")]).unwrap();
        let a = resolver.pick(Some("a.test"));
        let b = resolver.pick(Some("b.test"));
        assert!(!Arc::ptr_eq(&a, &b));
        assert!(Arc::ptr_eq(&resolver.pick(Some("x.b.test")), &b));
        assert!(Arc::ptr_eq(&resolver.pick(Some("B.TEST.")), &b));
        // a wildcard covers one label only; anything else gets the first certificate
        assert!(Arc::ptr_eq(&resolver.pick(Some("y.x.b.test")), &a));
        assert!(Arc::ptr_eq(&resolver.pick(None), &a));
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_naming_both_files() {
        let dir = certs("mismatch", &[("a", "DNS:a.test"), ("b", "DNS:b.test")]);
        let wrong = CertPair::new(dir.0.join("a.crt"), dir.0.join("b.key"));
        let err = CertResolver::new(vec![wrong]).unwrap_err().to_string();
        assert!(err.contains("b.key") && err.contains("a.crt"), "{err}");
    }

    #[test]
    fn missing_and_empty_files_name_the_file() {
        let dir = certs("missing", &[]);
        std::fs::write(dir.0.join("empty.crt"), "not pem\n").unwrap();
        let err = load_certs(&dir.0.join("empty.crt")).unwrap_err().to_string();
        assert!(err.contains("empty.crt") && err.contains("certificate"), "{err}");
        let err = load_key(&dir.0.join("nope.key")).unwrap_err().to_string();
        assert!(err.contains("nope.key") && err.contains("private key"), "{err}");
    }

    #[test]
    fn reload_swaps_certificates_and_keeps_them_on_error() {
        let dir = certs("reload", &[("a", "DNS:a.test"), ("b", "DNS:b.test")]);
        let resolver = CertResolver::new(vec![pair(&dir, "a")]).unwrap();
        let before = resolver.pick(None);
        resolver.reload(Some(vec![pair(&dir, "b")])).unwrap();
        let after = resolver.pick(None);
        assert!(!Arc::ptr_eq(&before, &after));
        assert!(resolver.reload(Some(vec![CertPair::new(dir.0.join("x.crt"), dir.0.join("x.key"))])).is_err());
        assert!(Arc::ptr_eq(&resolver.pick(None), &after));
        // the files again, in place: a renewed certificate is picked up
        resolver.reload(None).unwrap();
    }

    #[test]
    fn configs_build_with_alpn_and_client_verification() {
        let dir = certs("configs", &[("a", "DNS:a.test")]);
        let resolver = Arc::new(CertResolver::new(vec![pair(&dir, "a")]).unwrap());
        let server = server_config(resolver, &[b"h2", b"http/1.1"], Some(&dir.0.join("a.crt"))).unwrap();
        assert_eq!(server.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        let client = client_config(&ServerTrust::CaFile(dir.0.join("a.crt")), Some(&pair(&dir, "a")), &[b"h2"]).unwrap();
        assert_eq!(client.alpn_protocols, vec![b"h2".to_vec()]);
        client_config(&ServerTrust::System, None, &[]).unwrap();
        client_config(&ServerTrust::Insecure, None, &[]).unwrap();
    }

    #[test]
    fn a_file_without_a_crl_is_refused_by_name() {
        let dir = certs("crl", &[("a", "DNS:a.test")]);
        let resolver = Arc::new(CertResolver::new(vec![pair(&dir, "a")]).unwrap());
        let ca = dir.0.join("a.crt");
        // a certificate is no revocation list
        let err = server_config_verifying(resolver.clone(), &[], Some(&ca), true, Some(&ca)).unwrap_err();
        assert!(err.to_string().contains("no X509 CRL section"), "{err}");
        let missing = dir.0.join("missing.pem");
        assert!(load_crls(&missing).unwrap_err().to_string().contains("missing.pem"));
        server_config_verifying(resolver, &[], Some(&ca), true, None).unwrap();
    }

    #[test]
    fn sha256_is_the_providers() {
        let h: String = sha256(b"abc").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
