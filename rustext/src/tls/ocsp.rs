//! OCSP staples of the served certificates.
//!
//! The control plane fetches and checks the responses (`balancer/ocsp.py`);
//! here a response is only attached, by the DER of the leaf it is about, to
//! the [`CertifiedKey`] that [`CertResolver`] serves, so rustls sends it to
//! clients asking for a status (TLS 1.2 `status_request`, the TLS 1.3
//! certificate entry). Attaching swaps the store like a reload: new
//! handshakes get the staple, established connections are not touched. A
//! reload keeps each staple whose leaf is still served: a renewed
//! certificate starts without one, since the old response is not about it.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::sign::CertifiedKey;

use super::{CertResolver, CertStore};

/// Staples by the DER of the leaf certificate they are about.
#[derive(Debug, Default)]
pub(super) struct Staples(HashMap<Vec<u8>, Vec<u8>>);

fn leaf(key: &CertifiedKey) -> &[u8] {
    key.cert.first().map_or(&[], |c| c.as_ref())
}

impl CertStore {
    /// A copy whose certificates carry their staple from `staples` (none for
    /// the others); a certificate listed under several names stays one.
    fn stapled(&self, staples: &Staples) -> CertStore {
        let mut done: HashMap<*const CertifiedKey, Arc<CertifiedKey>> = HashMap::new();
        let mut swap = |key: &Arc<CertifiedKey>| -> Arc<CertifiedKey> {
            done.entry(Arc::as_ptr(key))
                .or_insert_with(|| {
                    let ocsp = staples.0.get(leaf(key)).cloned();
                    if ocsp == key.ocsp {
                        return key.clone();
                    }
                    Arc::new(CertifiedKey { cert: key.cert.clone(), key: key.key.clone(), ocsp })
                })
                .clone()
        };
        CertStore {
            default: swap(&self.default),
            exact: self.exact.iter().map(|(n, k)| (n.clone(), swap(k))).collect(),
            wildcard: self.wildcard.iter().map(|(n, k)| (n.clone(), swap(k))).collect(),
        }
    }

    fn serves(&self, der: &[u8]) -> bool {
        leaf(&self.default) == der || self.exact.values().chain(self.wildcard.values()).any(|k| leaf(k) == der)
    }
}

impl CertResolver {
    /// Staples `response` (a DER OCSP response) to the served certificate
    /// whose leaf is `certificate` (DER), or removes its staple (`None`);
    /// false when no served certificate is that one (the files changed and
    /// were not reloaded yet).
    pub fn set_ocsp(&self, certificate: &[u8], response: Option<Vec<u8>>) -> bool {
        let mut staples = self.staples.write().expect("staples lock");
        let mut store = self.store.write().expect("cert store lock");
        if !store.serves(certificate) {
            return false;
        }
        match response {
            Some(r) => staples.0.insert(certificate.to_vec(), r),
            None => staples.0.remove(certificate),
        };
        *store = Arc::new(store.stapled(&staples));
        true
    }

    /// The staple served with the certificate whose leaf is `certificate`.
    pub fn ocsp(&self, certificate: &[u8]) -> Option<Vec<u8>> {
        let store = self.store.read().expect("cert store lock");
        let key = [&store.default].into_iter().chain(store.exact.values()).chain(store.wildcard.values()).find(|k| leaf(k) == certificate)?;
        key.ocsp.clone()
    }

    /// Serves `store` from now on, with the staples of the certificates it
    /// still has; the others' are forgotten.
    pub(super) fn install(&self, store: CertStore) {
        let mut staples = self.staples.write().expect("staples lock");
        staples.0.retain(|der, _| store.serves(der));
        *self.store.write().expect("cert store lock") = Arc::new(store.stapled(&staples));
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{certs, pair};
    use super::*;

    #[test]
    fn a_staple_goes_to_its_certificate_and_survives_a_reload_of_the_same_files() {
        let dir = certs("ocsp", &[("a", "DNS:a.test"), ("b", "DNS:b.test,DNS:*.b.test")]);
        let resolver = CertResolver::new(vec![pair(&dir, "a"), pair(&dir, "b")]).unwrap();
        let b = resolver.pick(Some("b.test")).cert[0].to_vec();
        assert!(resolver.set_ocsp(&b, Some(b"response".to_vec())));
        assert_eq!(resolver.pick(Some("b.test")).ocsp.as_deref(), Some(&b"response"[..]));
        // one certificate under two names stays one
        assert!(Arc::ptr_eq(&resolver.pick(Some("b.test")), &resolver.pick(Some("x.b.test"))));
        assert_eq!(resolver.pick(Some("a.test")).ocsp, None);
        resolver.reload(None).unwrap();
        assert_eq!(resolver.ocsp(&b).as_deref(), Some(&b"response"[..]));
        assert!(resolver.set_ocsp(&b, None));
        assert_eq!(resolver.pick(Some("b.test")).ocsp, None);
        assert!(!resolver.set_ocsp(b"not served", Some(b"x".to_vec())));
    }

    #[test]
    fn a_renewed_certificate_starts_without_the_old_staple() {
        let dir = certs("ocsp-renew", &[("a", "DNS:a.test"), ("b", "DNS:a.test")]);
        let resolver = CertResolver::new(vec![pair(&dir, "a")]).unwrap();
        let a = resolver.pick(None).cert[0].to_vec();
        assert!(resolver.set_ocsp(&a, Some(b"response".to_vec())));
        resolver.reload(Some(vec![pair(&dir, "b")])).unwrap();
        assert_eq!(resolver.pick(None).ocsp, None);
        assert!(!resolver.set_ocsp(&a, Some(b"response".to_vec())));
    }
}
