//! Regular expressions of routes and the rewrite of a request's target.
//!
//! Patterns use the `regex` crate: matching is linear in the input (finite
//! automata, no backtracking), so a hostile path cannot make a pattern slow,
//! and a pattern's compiled size is bounded so that a configuration cannot
//! ask for unbounded memory. Everything is compiled once, when the routing
//! table is built; an invalid pattern or replacement is a configuration
//! error.
//!
//! A rewrite changes the path (strip a prefix, replace it by a template
//! with the captures of a pattern, or set it) and the query (set or remove
//! it), after routing and before forwarding, on both request paths. Its
//! result is checked here, once: a target that is not an origin-form path
//! (starting with `/`, visible ASCII, no `#`, bounded) is never forwarded,
//! and the request is answered 500 ([`super::super::decide::BAD_REWRITE`]).

use regex::bytes::{Regex, RegexBuilder};

/// Longest pattern accepted, in bytes.
pub const MAX_PATTERN: usize = 1024;
/// Bound on a compiled pattern's size (the `regex` crate's `size_limit`).
const COMPILED_LIMIT: usize = 1 << 20;
/// Longest target a rewrite may produce, path and query.
pub const MAX_TARGET: usize = 8192;

/// How a route changes the path (one of them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PathRewrite {
    #[default]
    Keep,
    /// Remove this literal prefix (the result gets a leading `/` if it lost it).
    StripPrefix(String),
    /// When `regex` matches the path, the path becomes `replacement` with
    /// `$1` / `${name}` replaced by the captures (the whole path, as
    /// HAProxy's `replace-path` and nginx's `rewrite`).
    Replace { regex: String, replacement: String },
    /// This path.
    Set(String),
}

/// How a route changes the query.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum QueryRewrite {
    #[default]
    Keep,
    Remove,
    /// This query (without `?`).
    Set(String),
}

/// A route's rewrite, as configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RewriteSpec {
    pub path: PathRewrite,
    pub query: QueryRewrite,
}

/// Compile a route's pattern, bounded in length and compiled size.
pub fn compile(pattern: &str, case_insensitive: bool) -> Result<Regex, String> {
    if pattern.len() > MAX_PATTERN {
        return Err(format!("the pattern is over {MAX_PATTERN} bytes"));
    }
    RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .size_limit(COMPILED_LIMIT)
        .dfa_size_limit(COMPILED_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => "the pattern compiles too big (simplify its repetitions)".to_string(),
            // the syntax error spans lines (the pattern, a caret, the reason): keep it on one
            e => format!("invalid regular expression: {}", e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")),
        })
}

/// A byte a rewritten target may hold: visible ASCII but `#` (no space,
/// CR, LF or other control, nothing a request line cannot carry).
fn target_byte(c: u8) -> bool {
    c.is_ascii_graphic() && c != b'#'
}

/// Check the literal parts of a path template (what the configuration fixes).
fn check_literal(s: &str, what: &str) -> Result<(), String> {
    if let Some(c) = s.bytes().find(|&c| !target_byte(c) || c == b'?') {
        return Err(format!("{what} {s:?} holds {:?}, which a path may not (the query is set apart)", c as char));
    }
    Ok(())
}

/// Check `$1` / `${name}` references of `replacement` against `re`'s groups
/// (the `regex` crate reads `$1a` as the group named `1a`: an error here).
fn check_template(re: &Regex, replacement: &str) -> Result<(), String> {
    let b = replacement.as_bytes();
    let mut literal = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'$' {
            literal.push(b[i]);
            i += 1;
            continue;
        }
        if b.get(i + 1) == Some(&b'$') {
            literal.push(b'$');
            i += 2;
            continue;
        }
        let (name, next) = if b.get(i + 1) == Some(&b'{') {
            let end = b[i + 2..]
                .iter()
                .position(|&c| c == b'}')
                .ok_or_else(|| format!("{replacement:?}: ${{ without its closing }}"))?;
            (&replacement[i + 2..i + 2 + end], i + 3 + end)
        } else {
            let n = b[i + 1..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count();
            (&replacement[i + 1..i + 1 + n], i + 1 + n)
        };
        let known = match name.parse::<usize>() {
            Ok(n) => n < re.captures_len(),
            Err(_) => re.capture_names().flatten().any(|g| g == name),
        };
        if name.is_empty() || !known {
            return Err(format!(
                "{replacement:?}: the pattern has no group {name:?} (groups are $1, ${{1}} or ${{name}}; $$ is a $)"
            ));
        }
        i = next;
    }
    let literal = String::from_utf8_lossy(&literal);
    check_literal(&literal, "the replacement")?;
    if !b.starts_with(b"/") && !b.starts_with(b"$") || b.starts_with(b"$$") {
        return Err(format!("the replacement {replacement:?} must start with / (or a group)"));
    }
    Ok(())
}

#[derive(Debug)]
enum PathOp {
    Keep,
    Strip(Box<[u8]>),
    Replace(Regex, Box<[u8]>),
    Set(Box<[u8]>),
}

#[derive(Debug)]
enum QueryOp {
    Keep,
    Remove,
    Set(Box<[u8]>),
}

/// A compiled rewrite.
#[derive(Debug)]
pub struct Rewrite {
    path: PathOp,
    query: QueryOp,
}

/// The rewritten target would not be a valid origin-form target.
#[derive(Debug, PartialEq, Eq)]
pub struct Invalid;

impl Rewrite {
    /// Compile `spec`; None when it changes nothing.
    pub fn new(spec: &RewriteSpec) -> Result<Option<Self>, String> {
        let path = match &spec.path {
            PathRewrite::Keep => PathOp::Keep,
            PathRewrite::StripPrefix(p) => {
                if !p.starts_with('/') {
                    return Err(format!("strip_prefix {p:?} must start with /"));
                }
                check_literal(p, "strip_prefix")?;
                PathOp::Strip(p.as_bytes().into())
            }
            PathRewrite::Replace { regex, replacement } => {
                let re = compile(regex, false).map_err(|e| format!("replace_path.regex: {e}"))?;
                check_template(&re, replacement).map_err(|e| format!("replace_path.replacement: {e}"))?;
                PathOp::Replace(re, replacement.as_bytes().into())
            }
            PathRewrite::Set(p) => {
                if !p.starts_with('/') {
                    return Err(format!("set_path {p:?} must start with /"));
                }
                check_literal(p, "set_path")?;
                if p.len() > MAX_TARGET {
                    return Err(format!("set_path is over {MAX_TARGET} bytes"));
                }
                PathOp::Set(p.as_bytes().into())
            }
        };
        let query = match &spec.query {
            QueryRewrite::Keep => QueryOp::Keep,
            QueryRewrite::Remove => QueryOp::Remove,
            QueryRewrite::Set(q) => {
                if let Some(c) = q.bytes().find(|&c| !target_byte(c)) {
                    return Err(format!("set_query {q:?} holds {:?}, which a query may not", c as char));
                }
                QueryOp::Set(q.as_bytes().into())
            }
        };
        if matches!((&path, &query), (PathOp::Keep, QueryOp::Keep)) {
            return Ok(None);
        }
        Ok(Some(Rewrite { path, query }))
    }

    /// Write the rewrite of `target` (path and optional `?query`) to `out`;
    /// on [`Invalid`], `out` holds a part of it (to be discarded).
    pub fn apply(&self, target: &[u8], out: &mut Vec<u8>) -> Result<(), Invalid> {
        let start = out.len();
        let (path, query) = match target.iter().position(|&c| c == b'?') {
            Some(i) => (&target[..i], Some(&target[i + 1..])),
            None => (target, None),
        };
        match &self.path {
            PathOp::Keep => out.extend_from_slice(path),
            PathOp::Set(p) => out.extend_from_slice(p),
            PathOp::Strip(prefix) => match path.strip_prefix(&**prefix) {
                Some(rest) => {
                    if !rest.starts_with(b"/") {
                        out.push(b'/');
                    }
                    out.extend_from_slice(rest);
                }
                None => out.extend_from_slice(path),
            },
            PathOp::Replace(re, replacement) => match re.captures(path) {
                Some(caps) => caps.expand(replacement, out),
                None => out.extend_from_slice(path),
            },
        }
        let new_path = &out[start..];
        if !new_path.starts_with(b"/") || new_path.iter().any(|&c| !target_byte(c) || c == b'?') {
            return Err(Invalid);
        }
        let query = match &self.query {
            QueryOp::Keep => query,
            QueryOp::Remove => None,
            QueryOp::Set(q) => Some(&**q),
        };
        if let Some(q) = query {
            out.push(b'?');
            out.extend_from_slice(q);
        }
        if out.len() - start > MAX_TARGET {
            return Err(Invalid);
        }
        Ok(())
    }
}

impl super::super::h1::TargetRewrite for Rewrite {
    fn rewrite(&self, target: &[u8], out: &mut Vec<u8>) -> bool {
        self.apply(target, out).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(path: PathRewrite, query: QueryRewrite) -> Rewrite {
        Rewrite::new(&RewriteSpec { path, query }).unwrap().unwrap()
    }

    fn run(r: &Rewrite, target: &str) -> Result<String, Invalid> {
        let mut out = b"GET ".to_vec();
        r.apply(target.as_bytes(), &mut out)?;
        Ok(String::from_utf8(out[4..].to_vec()).unwrap())
    }

    fn replace(regex: &str, replacement: &str) -> PathRewrite {
        PathRewrite::Replace { regex: regex.into(), replacement: replacement.into() }
    }

    #[test]
    fn strip_prefix_keeps_the_query_and_a_leading_slash() {
        let r = rw(PathRewrite::StripPrefix("/api".into()), QueryRewrite::Keep);
        assert_eq!(run(&r, "/api/users?id=1").unwrap(), "/users?id=1");
        assert_eq!(run(&r, "/api").unwrap(), "/");
        assert_eq!(run(&r, "/apix").unwrap(), "/x");
        assert_eq!(run(&r, "/other?a").unwrap(), "/other?a");
    }

    #[test]
    fn replace_expands_numbered_and_named_groups() {
        let r = rw(replace(r"^/old/(?P<rest>.*)$", "/new/${rest}"), QueryRewrite::Keep);
        assert_eq!(run(&r, "/old/a/b?x=1").unwrap(), "/new/a/b?x=1");
        assert_eq!(run(&r, "/else").unwrap(), "/else");
        let r = rw(replace(r"^/u/(\d+)/(\w+)", "/users/${2}/$1"), QueryRewrite::Keep);
        assert_eq!(run(&r, "/u/42/posts/extra").unwrap(), "/users/posts/42");
    }

    #[test]
    fn query_set_and_removed() {
        let r = rw(PathRewrite::Keep, QueryRewrite::Set("v=2".into()));
        assert_eq!(run(&r, "/a?v=1").unwrap(), "/a?v=2");
        assert_eq!(run(&r, "/a").unwrap(), "/a?v=2");
        let r = rw(PathRewrite::Set("/index.html".into()), QueryRewrite::Remove);
        assert_eq!(run(&r, "/x/y?q").unwrap(), "/index.html");
        assert_eq!(run(&r, "/?").unwrap(), "/index.html");
    }

    #[test]
    fn invalid_results_are_refused() {
        // a capture alone can leave the path without its leading slash
        let r = rw(replace(r"^/(.*)$", "$1"), QueryRewrite::Keep);
        assert_eq!(run(&r, "/a"), Err(Invalid));
        assert_eq!(run(&r, "//a").unwrap(), "/a");
        // or make it too long
        let r = rw(replace(r"^(.*)$", "$1$1$1$1$1$1$1$1$1"), QueryRewrite::Keep);
        assert!(run(&r, &format!("/{}", "a".repeat(1000))).is_err());
        assert!(run(&r, "/a").is_ok());
    }

    #[test]
    fn configuration_errors_are_caught_at_load() {
        let bad = |path: PathRewrite, query: QueryRewrite| Rewrite::new(&RewriteSpec { path, query }).unwrap_err();
        assert!(bad(replace("(", "/"), QueryRewrite::Keep).contains("invalid regular expression"));
        assert!(bad(replace("^/(a)", "/$2"), QueryRewrite::Keep).contains("no group"));
        assert!(bad(replace("^/(a)", "/$1a"), QueryRewrite::Keep).contains("no group \"1a\""));
        assert!(bad(replace("^/(?P<n>a)", "/${m}"), QueryRewrite::Keep).contains("no group"));
        assert!(bad(replace("^/(a)", "x$1"), QueryRewrite::Keep).contains("must start with /"));
        assert!(bad(replace("^/(a)", "/$1?q"), QueryRewrite::Keep).contains("query"));
        assert!(bad(replace("^/(a)", "/$1 x"), QueryRewrite::Keep).contains("may not"));
        assert!(bad(PathRewrite::Set("x".into()), QueryRewrite::Keep).contains("must start with /"));
        assert!(bad(PathRewrite::Set("/a\r\nX: y".into()), QueryRewrite::Keep).contains("may not"));
        assert!(bad(PathRewrite::StripPrefix("api".into()), QueryRewrite::Keep).contains("must start with /"));
        assert!(bad(PathRewrite::Keep, QueryRewrite::Set("a b".into())).contains("may not"));
        assert!(Rewrite::new(&RewriteSpec::default()).unwrap().is_none());
        assert!(Rewrite::new(&RewriteSpec { path: replace("^/(a)", "/$$/${1}b"), query: QueryRewrite::Keep }).is_ok());
    }

    #[test]
    fn patterns_are_bounded() {
        assert!(compile(&"a".repeat(MAX_PATTERN + 1), false).unwrap_err().contains("over"));
        assert!(compile("(a{100}){100}{100}", false).unwrap_err().contains("too big"));
        let re = compile("^API\\.", true).unwrap();
        assert!(re.is_match(b"api.example.com"));
        // linear time: a pattern that backtracking engines take exponential time on
        let re = compile("^(a+)+$", false).unwrap();
        assert!(!re.is_match(format!("{}b", "a".repeat(5000)).as_bytes()));
    }
}
