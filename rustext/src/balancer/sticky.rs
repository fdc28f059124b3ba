//! Cookie persistence on a request and its response (hyper's path, where
//! sticky pools are served): which server the request's cookie points at,
//! the cookie removed before forwarding (indirect), and `Set-Cookie` when
//! the server that answered is not the one the client named.

use std::sync::Arc;

use http::header::{CACHE_CONTROL, COOKIE, SET_COOKIE};
use http::{HeaderMap, HeaderValue};

use super::policy::{find_cookie, strip_cookie, Sticky};
use super::upstream::{Backend, Upstream};

/// The server (index in the pool) the request's cookie points at, if it
/// names one; in indirect mode the cookie is taken out of `headers` (the
/// other cookies stay, in one `Cookie` field).
pub fn pin(st: &Sticky, headers: &mut HeaderMap) -> Option<usize> {
    let value = find_cookie(
        headers.get_all(COOKIE).iter().map(HeaderValue::as_bytes),
        &st.name,
    )?;
    let server = st.server_of(value);
    if st.indirect {
        let rest: Vec<Vec<u8>> = headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| strip_cookie(v.as_bytes(), &st.name))
            .collect();
        headers.remove(COOKIE);
        if !rest.is_empty() {
            if let Ok(v) = HeaderValue::from_bytes(&rest.join(&b"; "[..])) {
                headers.insert(COOKIE, v);
            }
        }
    }
    server
}

/// On the response of `backend`: `Set-Cookie` (and `Cache-Control:
/// private` with nocache) unless the request already pointed at it.
pub fn stick(
    st: &Sticky,
    up: &Upstream,
    backend: &Arc<Backend>,
    pinned: Option<usize>,
    headers: &mut HeaderMap,
) {
    let Some(i) = up.backends.iter().position(|b| Arc::ptr_eq(b, backend)) else {
        return;
    };
    if pinned == Some(i) {
        return;
    }
    if let Some(v) = st.set_cookie(i) {
        headers.append(SET_COOKIE, v.clone());
        if st.nocache {
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("private"));
        }
    }
}
