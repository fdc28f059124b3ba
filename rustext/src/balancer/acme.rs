//! ACME HTTP-01 challenges (RFC 8555 §8.3) answered by the balancer itself.
//!
//! The control plane (Python, `balancer.acme`) sets a token's key
//! authorization while an order is pending and removes it once the CA has
//! validated; a plain-HTTP request for `/.well-known/acme-challenge/TOKEN`
//! is then answered before any routing, on every plain listener and on the
//! HTTP-to-HTTPS redirect listener, so that a CA reaching port 80 gets its
//! answer whatever the routes say. Sans-I/O: [`Http01::answer`] maps a
//! method and path to the body to send; the paths carry it out (the fast
//! path hands such a request to hyper's path, which answers it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::RwLock;

/// The path prefix of HTTP-01 challenges.
pub const PREFIX: &[u8] = b"/.well-known/acme-challenge/";

/// The pending HTTP-01 tokens: token → key authorization.
#[derive(Debug, Default)]
pub struct Http01 {
    tokens: RwLock<HashMap<String, String>>,
    /// Whether any token is pending (a request's path is looked at only then).
    any: AtomicBool,
}

impl Http01 {
    /// Answer `token` with `key_authorization` from now on.
    pub fn set(&self, token: &str, key_authorization: &str) {
        let mut t = self.tokens.write().unwrap_or_else(|e| e.into_inner());
        t.insert(token.to_owned(), key_authorization.to_owned());
        self.any.store(true, Relaxed);
    }

    /// Stop answering `token` (unknown tokens are ignored).
    pub fn remove(&self, token: &str) {
        let mut t = self.tokens.write().unwrap_or_else(|e| e.into_inner());
        t.remove(token);
        self.any.store(!t.is_empty(), Relaxed);
    }

    /// Whether a request for `path` is a challenge this table may answer
    /// (cheap: no lock unless a token is pending).
    pub fn claims(&self, path: &[u8]) -> bool {
        self.any.load(Relaxed) && path.starts_with(PREFIX)
    }

    /// The body answering `GET`/`HEAD` of `path` (None: not a pending
    /// challenge; the request is routed as any other).
    pub fn answer(&self, method: &[u8], path: &[u8]) -> Option<String> {
        if !self.claims(path) || !(method == b"GET" || method == b"HEAD") {
            return None;
        }
        let token = std::str::from_utf8(&path[PREFIX.len()..]).ok()?;
        self.tokens.read().unwrap_or_else(|e| e.into_inner()).get(token).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_pending_tokens_only() {
        let t = Http01::default();
        assert!(!t.claims(b"/.well-known/acme-challenge/abc"));
        t.set("abc", "abc.thumb");
        assert_eq!(t.answer(b"GET", b"/.well-known/acme-challenge/abc").as_deref(), Some("abc.thumb"));
        assert_eq!(t.answer(b"HEAD", b"/.well-known/acme-challenge/abc").as_deref(), Some("abc.thumb"));
        assert_eq!(t.answer(b"POST", b"/.well-known/acme-challenge/abc"), None);
        assert_eq!(t.answer(b"GET", b"/.well-known/acme-challenge/other"), None);
        assert_eq!(t.answer(b"GET", b"/abc"), None);
        t.remove("abc");
        assert!(!t.claims(b"/.well-known/acme-challenge/abc"));
        assert_eq!(t.answer(b"GET", b"/.well-known/acme-challenge/abc"), None);
    }
}
