//! A route's rewrite (`balancer.routing.Rewrite`) as the routing table reads it.

use pyo3::prelude::*;

/// `balancer.routing.Rewrite`
#[derive(FromPyObject)]
pub(super) struct Rewrite {
    #[pyo3(attribute)]
    strip_prefix: Option<String>,
    #[pyo3(attribute)]
    replace_path: Option<ReplacePath>,
    #[pyo3(attribute)]
    set_path: Option<String>,
    #[pyo3(attribute)]
    set_query: Option<String>,
    #[pyo3(attribute)]
    remove_query: bool,
}

/// `balancer.routing.ReplacePath`
#[derive(FromPyObject)]
struct ReplacePath {
    #[pyo3(attribute)]
    regex: String,
    #[pyo3(attribute)]
    replacement: String,
}

pub(super) fn spec(r: Option<Rewrite>) -> crate::balancer::route::RewriteSpec {
    use crate::balancer::route::{PathRewrite, QueryRewrite, RewriteSpec};
    let Some(r) = r else { return RewriteSpec::default() };
    // one path change at most (the dataclass refuses more)
    let path = match (r.strip_prefix, r.replace_path, r.set_path) {
        (Some(p), ..) => PathRewrite::StripPrefix(p),
        (None, Some(rp), _) => PathRewrite::Replace { regex: rp.regex, replacement: rp.replacement },
        (None, None, Some(p)) => PathRewrite::Set(p),
        (None, None, None) => PathRewrite::Keep,
    };
    let query = match (r.set_query, r.remove_query) {
        (Some(q), _) => QueryRewrite::Set(q),
        (None, true) => QueryRewrite::Remove,
        (None, false) => QueryRewrite::Keep,
    };
    RewriteSpec { path, query }
}
