//! Pool policies beyond the algorithm, compiled per pool snapshot
//! ([`super::Upstream`]), and part of it:
//!
//! - **Backup servers** take requests only when no other server of the pool
//!   is available: the first available backup in the configured order, or
//!   all of them balanced by the pool's algorithm with `all_backups`
//!   (HAProxy's `backup` and `option allbackups`).
//! - **Slow start**: a server that came back (health check up, back from
//!   ejection or `down`/`drain`, or newly added by a reload or DNS) gets a
//!   share of its normal traffic growing linearly from 0 to 1 over its
//!   period; each time it would be picked it is passed over with the
//!   complementary probability (so it works the same with every algorithm
//!   but `consistent_hash`, where it would move keys). A ramping server is
//!   still used when nothing else is available.
//! - **Retry on** chosen response statuses and on a response timeout
//!   (HAProxy's `retry-on`): see [`super::super::attempts`].
//! - **Layer-7 passive health** (HAProxy's `observe layer7`): responses with
//!   the chosen statuses count as failures of the server in passive health.
//! - **Cookie persistence** (HAProxy's `cookie NAME insert indirect
//!   nocache`): see [`Sticky`].

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

pub use super::super::config::{PolicySpec, StickySpec};
use super::{hash64, Backend};

/// The cookie value of a server without one configured: 16 hex digits of
/// a stable hash of its name (the same across restarts and balancers).
pub fn default_cookie(server: &str) -> String {
    format!("{:016x}", hash64(server.as_bytes()))
}

/// Cookie persistence, compiled: the value of each server (by index) and
/// the `Set-Cookie` header that points a client at it.
#[derive(Debug)]
pub struct Sticky {
    pub name: Box<[u8]>,
    values: Box<[Box<[u8]>]>,
    set_cookie: Box<[Option<HeaderValue>]>,
    pub indirect: bool,
    pub nocache: bool,
}

impl Sticky {
    fn compile(spec: &StickySpec, backends: &[Arc<Backend>]) -> Result<Self, String> {
        if spec.name.is_empty() || !spec.name.bytes().all(is_token) {
            return Err(format!(
                "sticky cookie name {:?} is not a cookie name",
                spec.name
            ));
        }
        for (server, v) in &spec.values {
            if !backends.iter().any(|b| &b.name == server) {
                return Err(format!(
                    "sticky cookie for {server}: no such server in the pool"
                ));
            }
            if v.is_empty() || v.len() > 128 || !v.bytes().all(is_cookie_octet) {
                return Err(format!(
                    "server {server} cookie {v:?} must be 1 to 128 letters, digits or -._~"
                ));
            }
        }
        let mut values = Vec::with_capacity(backends.len());
        let mut set_cookie = Vec::with_capacity(backends.len());
        for b in backends {
            let v = spec
                .values
                .iter()
                .find(|(s, _)| *s == b.name)
                .map_or_else(|| default_cookie(&b.name), |(_, v)| v.clone());
            let mut h = format!("{}={}; Path={}", spec.name, v, spec.path);
            if let Some(d) = &spec.domain {
                h.push_str("; Domain=");
                h.push_str(d);
            }
            if let Some(a) = spec.max_age {
                h.push_str(&format!("; Max-Age={a}"));
            }
            if spec.httponly {
                h.push_str("; HttpOnly");
            }
            if spec.secure {
                h.push_str("; Secure");
            }
            set_cookie.push(HeaderValue::from_str(&h).ok());
            values.push(v.into_bytes().into_boxed_slice());
        }
        for (i, v) in values.iter().enumerate() {
            if values[..i].contains(v) {
                return Err(format!(
                    "two servers of the pool have the sticky cookie {:?}",
                    String::from_utf8_lossy(v)
                ));
            }
        }
        Ok(Sticky {
            name: spec.name.as_bytes().into(),
            values: values.into(),
            set_cookie: set_cookie.into(),
            indirect: spec.indirect,
            nocache: spec.nocache,
        })
    }

    /// The server (index) a cookie value points at, if any.
    pub fn server_of(&self, value: &[u8]) -> Option<usize> {
        self.values.iter().position(|v| **v == *value)
    }

    /// The `Set-Cookie` value that points a client at server `i`.
    pub fn set_cookie(&self, i: usize) -> Option<&HeaderValue> {
        self.set_cookie.get(i).and_then(Option::as_ref)
    }
}

fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_cookie_octet(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// The policies of one pool snapshot (indices are the pool's backends').
#[derive(Debug, Default)]
pub struct Policy {
    backup: Box<[bool]>,
    pub has_backups: bool,
    pub all_backups: bool,
    slow_start_ms: Box<[u64]>,
    pub has_slow_start: bool,
    retry_statuses: Box<[u16]>,
    pub retry_timeout: bool,
    error_statuses: Box<[u16]>,
    pub sticky: Option<Sticky>,
}

impl Policy {
    pub fn compile(spec: &PolicySpec, backends: &[Arc<Backend>]) -> Result<Self, String> {
        for name in spec
            .backups
            .iter()
            .chain(spec.slow_start.iter().map(|(n, _)| n))
        {
            if !backends.iter().any(|b| &b.name == name) {
                return Err(format!("server {name} is not in the pool"));
            }
        }
        for &s in spec.retry_statuses.iter().chain(&spec.error_statuses) {
            if !(100..=599).contains(&s) {
                return Err(format!("{s} is not an HTTP status"));
            }
        }
        let backup: Box<[bool]> = backends
            .iter()
            .map(|b| spec.backups.contains(&b.name))
            .collect();
        let slow_start_ms: Box<[u64]> = backends
            .iter()
            .map(|b| {
                spec.slow_start
                    .iter()
                    .find(|(n, _)| *n == b.name)
                    .map_or(0, |(_, d)| d.as_millis() as u64)
            })
            .collect();
        Ok(Policy {
            has_backups: backup.iter().any(|&b| b),
            backup,
            all_backups: spec.all_backups,
            has_slow_start: slow_start_ms.iter().any(|&p| p > 0),
            slow_start_ms,
            retry_statuses: spec.retry_statuses.clone().into(),
            retry_timeout: spec.retry_timeout,
            error_statuses: spec.error_statuses.clone().into(),
            sticky: match &spec.sticky {
                Some(s) => Some(Sticky::compile(s, backends)?),
                None => None,
            },
        })
    }

    /// Whether anything here changes how a server is chosen.
    #[inline]
    pub fn shapes_choice(&self) -> bool {
        self.has_backups || self.has_slow_start
    }

    #[inline]
    pub fn is_backup(&self, i: usize) -> bool {
        self.backup.get(i).copied().unwrap_or(false)
    }

    /// Server `i`'s share of its normal traffic now (slow start), in [0, 1].
    pub fn share(&self, i: usize, b: &Backend) -> f64 {
        match self.slow_start_ms.get(i) {
            Some(&period) if period > 0 => ramp(b.up_since_ms(), b.clock_ms(), period),
            _ => 1.0,
        }
    }

    /// Whether a response with `status` is retried on another server.
    #[inline]
    pub fn retries_status(&self, status: u16) -> bool {
        self.retry_statuses.contains(&status)
    }

    /// Whether a response with `status` counts as a failure of its server.
    #[inline]
    pub fn is_error(&self, status: u16) -> bool {
        self.error_statuses.contains(&status)
    }

    /// Record a response of server `b` in passive health: a failure when
    /// its status is one of the error statuses, else a success.
    #[inline]
    pub fn observe(&self, b: &Backend, status: u16, eject_after: u32, cooldown: Duration) {
        if !self.error_statuses.is_empty() && self.is_error(status) {
            b.record_failure(eject_after, cooldown);
        } else {
            b.record_success();
        }
    }
}

/// Slow start's share: linear from 0 when the server came up (`since`) to
/// 1 after `period` (all in ms on one clock).
pub fn ramp(since: u64, now: u64, period: u64) -> f64 {
    if period == 0 || now >= since.saturating_add(period) {
        return 1.0;
    }
    now.saturating_sub(since) as f64 / period as f64
}

/// The value of cookie `name` in `Cookie` header values (several headers,
/// several `name=value` pairs each, values possibly in double quotes, as
/// RFC 6265 §4.2.1); the first one wins. Malformed pairs are skipped.
pub fn find_cookie<'a>(
    headers: impl IntoIterator<Item = &'a [u8]>,
    name: &[u8],
) -> Option<&'a [u8]> {
    for h in headers {
        for pair in h.split(|&b| b == b';') {
            let pair = pair.trim_ascii();
            let Some(eq) = pair.iter().position(|&b| b == b'=') else {
                continue;
            };
            if pair[..eq].trim_ascii() != name {
                continue;
            }
            let v = pair[eq + 1..].trim_ascii();
            let v = match v {
                [b'"', inner @ .., b'"'] => inner,
                v => v,
            };
            return Some(v);
        }
    }
    None
}

/// A `Cookie` header value without the pairs named `name` (indirect mode);
/// None when nothing is left.
pub fn strip_cookie(header: &[u8], name: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(header.len());
    for pair in header.split(|&b| b == b';') {
        let p = pair.trim_ascii();
        if p.is_empty() {
            continue;
        }
        let n = p
            .iter()
            .position(|&b| b == b'=')
            .map_or(p, |eq| p[..eq].trim_ascii());
        if n == name {
            continue;
        }
        if !out.is_empty() {
            out.extend_from_slice(b"; ");
        }
        out.extend_from_slice(p);
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cookies_are_found_in_any_header_and_pair() {
        let hs: [&[u8]; 2] = [b"a=1; b=2", b"SERVERID=s2; c=3"];
        assert_eq!(find_cookie(hs, b"SERVERID"), Some(&b"s2"[..]));
        assert_eq!(
            find_cookie([&b"SERVERID=\"s1\""[..]], b"SERVERID"),
            Some(&b"s1"[..])
        );
        assert_eq!(
            find_cookie([&b" ;;=x; SERVERID = s3 ;"[..]], b"SERVERID"),
            Some(&b"s3"[..])
        );
        assert_eq!(
            find_cookie(
                [&b"serverid=s1; SERVERIDX=s2; XSERVERID=s3"[..]],
                b"SERVERID"
            ),
            None
        );
        assert_eq!(find_cookie([&b"SERVERID"[..]], b"SERVERID"), None);
        assert_eq!(
            find_cookie([&b"SERVERID=a; SERVERID=b"[..]], b"SERVERID"),
            Some(&b"a"[..])
        );
    }

    #[test]
    fn stripping_keeps_the_others() {
        assert_eq!(
            strip_cookie(b"a=1; SERVERID=s1; b=2", b"SERVERID").unwrap(),
            b"a=1; b=2"
        );
        assert_eq!(strip_cookie(b"SERVERID=s1", b"SERVERID"), None);
        assert_eq!(strip_cookie(b"SERVERID=s1;SERVERID=s2;", b"SERVERID"), None);
        assert_eq!(
            strip_cookie(b"x=\"a;b\"", b"SERVERID").unwrap(),
            b"x=\"a; b\""
        );
    }

    #[test]
    fn ramp_is_linear_over_the_period() {
        assert_eq!(ramp(1000, 1000, 0), 1.0);
        assert_eq!(ramp(1000, 1000, 30_000), 0.0);
        assert_eq!(ramp(1000, 16_000, 30_000), 0.5);
        assert_eq!(ramp(1000, 31_000, 30_000), 1.0);
        assert_eq!(ramp(1000, 500, 30_000), 0.0); // a clock read before `since`
        assert_eq!(ramp(u64::MAX - 5, u64::MAX, 30_000), 1.0); // saturates, never overflows
    }

    #[test]
    fn default_cookies_are_stable_and_distinct() {
        assert_eq!(default_cookie("10.0.0.1:80"), default_cookie("10.0.0.1:80"));
        assert_ne!(default_cookie("10.0.0.1:80"), default_cookie("10.0.0.2:80"));
        assert_eq!(default_cookie("a").len(), 16);
    }

    proptest! {
        // Hostile Cookie headers: huge, many pairs, any bytes: no panic, and
        // the value found is a part of the input.
        #[test]
        fn hostile_cookie_headers(hs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..2000), 0..20),
                                  name in "[A-Za-z]{1,8}") {
            let refs: Vec<&[u8]> = hs.iter().map(|h| h.as_slice()).collect();
            if let Some(v) = find_cookie(refs.iter().copied(), name.as_bytes()) {
                prop_assert!(refs.iter().any(|h| h.windows(v.len().max(1)).any(|w| v.is_empty() || w == v)));
            }
            for h in &refs {
                if let Some(s) = strip_cookie(h, name.as_bytes()) {
                    prop_assert!(find_cookie([s.as_slice()], name.as_bytes()).is_none());
                    prop_assert!(s.len() <= h.len() + h.len());
                }
            }
        }

        #[test]
        fn many_pairs(n in 0usize..5000) {
            let mut h = Vec::new();
            for i in 0..n {
                h.extend_from_slice(format!("c{i}=v{i}; ").as_bytes());
            }
            h.extend_from_slice(b"SERVERID=last");
            prop_assert_eq!(find_cookie([h.as_slice()], b"SERVERID"), Some(&b"last"[..]));
        }
    }
}
