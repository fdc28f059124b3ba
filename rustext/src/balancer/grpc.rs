//! gRPC through the balancer: what differs from any HTTP/2 exchange.
//!
//! Calls pass as HTTP/2 requests (trailers, `te: trailers` and streaming
//! bodies included, see [`super::proxy`]); this module answers the calls the
//! balancer cannot forward. A gRPC client reads the outcome of a call from
//! `grpc-status`, so an error of the balancer's own (no backend, a backend
//! that cannot be reached, a timeout, a refused request) is sent as gRPC's
//! "Trailers-Only" response, as Envoy and nginx's `grpc_pass` do: HTTP 200,
//! `content-type: application/grpc`, `grpc-status` and `grpc-message` in one
//! HEADERS frame ending the stream. The status follows gRPC's own mapping of
//! HTTP statuses (`doc/http-grpc-status-mapping.md` in grpc/grpc), but for a
//! timeout, which is DEADLINE_EXCEEDED.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::respbody::RespBody;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// A gRPC request: `content-type: application/grpc` or `application/grpc+…`
/// (gRPC-Web's `application/grpc-web…` too: its clients read the same
/// headers).
pub fn is_grpc(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.len() >= 16 && v[..16].eq_ignore_ascii_case(b"application/grpc")
    })
}

/// The gRPC status code for a balancer answer of HTTP status `s`.
pub fn code_for(s: StatusCode) -> u8 {
    match s.as_u16() {
        504 | 408 => 4,             // DEADLINE_EXCEEDED
        502 | 503 | 429 => 14,      // UNAVAILABLE
        431 | 413 => 8,             // RESOURCE_EXHAUSTED
        400 => 13,                  // INTERNAL
        401 => 16,                  // UNAUTHENTICATED
        403 => 7,                   // PERMISSION_DENIED
        404 => 12,                  // UNIMPLEMENTED
        _ => 2,                     // UNKNOWN
    }
}

/// `grpc-message` is percent-encoded: bytes outside printable ASCII, and `%`.
fn encode_message(text: &[u8]) -> HeaderValue {
    let mut out = Vec::with_capacity(text.len());
    for &b in text {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| HeaderValue::from_static("balancer error"))
}

/// The balancer's own error answer `resp` (status >= 400, a text body), as
/// a gRPC client expects it. Headers the balancer added (request id, HSTS)
/// stay.
pub fn error_response(resp: Response<RespBody>) -> Response<RespBody> {
    let (mut parts, body) = resp.into_parts();
    let text = match &body {
        RespBody::Full(Some(b)) => b.clone(),
        _ => Bytes::new(),
    };
    let text = text.trim_ascii_end();
    let code = code_for(parts.status);
    parts.status = StatusCode::OK;
    let h = &mut parts.headers;
    h.remove(header::CONTENT_LENGTH);
    h.remove(header::CACHE_CONTROL);
    h.remove(header::CONNECTION);
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    let message: &[u8] = if text.is_empty() { b"balancer error" } else { text };
    h.insert(GRPC_MESSAGE, encode_message(message));
    Response::from_parts(parts, RespBody::Full(None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_requests_are_told_by_content_type() {
        let mut h = HeaderMap::new();
        assert!(!is_grpc(&h));
        for (v, yes) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC", true),
            ("application/grpc-web+proto", true),
            ("application/json", false),
            ("application/grp", false),
        ] {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            assert_eq!(is_grpc(&h), yes, "{v}");
        }
    }

    #[test]
    fn errors_become_trailers_only_responses() {
        let mut r = Response::new(RespBody::Full(Some(Bytes::from_static(b"backend unavailable\n"))));
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        r.headers_mut().insert("x-request-id", HeaderValue::from_static("abc"));
        let g = error_response(r);
        assert_eq!(g.status(), StatusCode::OK);
        assert_eq!(g.headers()["content-type"], "application/grpc");
        assert_eq!(g.headers()["grpc-status"], "14");
        assert_eq!(g.headers()["grpc-message"], "backend unavailable");
        assert_eq!(g.headers()["x-request-id"], "abc");
        assert!(matches!(g.body(), RespBody::Full(None)));
        assert_eq!(code_for(StatusCode::GATEWAY_TIMEOUT), 4);
        assert_eq!(code_for(StatusCode::SERVICE_UNAVAILABLE), 14);
        assert_eq!(encode_message("50% é\n".as_bytes()), "50%25 %C3%A9%0A");
    }
}
