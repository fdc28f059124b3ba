use std::sync::atomic::AtomicU64;
use std::time::Instant;

use proptest::prelude::*;

use super::*;
use crate::balancer::config::Settings;
use crate::balancer::config::BackendSpec;

struct Req<'a> {
    host: Option<&'a str>,
    path: &'a str,
    method: &'a str,
    headers: Vec<(&'a str, &'a str)>,
    cert: Option<&'a str>,
}

impl View for Req<'_> {
    fn host(&self) -> Option<&[u8]> {
        self.host.map(str::as_bytes)
    }
    fn path(&self) -> &[u8] {
        self.path.as_bytes()
    }
    fn method(&self) -> &[u8] {
        self.method.as_bytes()
    }
    fn header_any(&self, name: &[u8], test: &mut dyn FnMut(&[u8]) -> bool) -> bool {
        self.headers
            .iter()
            .any(|(n, v)| n.as_bytes().eq_ignore_ascii_case(name) && test(v.as_bytes()))
    }
    fn client_cert(&self) -> Option<&str> {
        self.cert
    }
}

fn req<'a>(host: Option<&'a str>, path: &'a str) -> Req<'a> {
    Req { host, path, method: "GET", headers: Vec::new(), cert: None }
}

fn pool(name: &str, port: u16) -> PoolSpec {
    let mut settings = Settings::default();
    settings.backends.push(BackendSpec { name: format!("127.0.0.1:{port}"), weight: 1, max_connections: 0 });
    PoolSpec { name: name.into(), settings, rules: RulesSpec::default() }
}

fn route(backend: &str) -> RouteSpec {
    RouteSpec { backend: Some(backend.into()), ..Default::default() }
}

fn table(routes: Vec<RouteSpec>, default: Option<&str>) -> Table {
    let spec = RoutingSpec {
        rate_limit: None,
        error_pages: Vec::new(),
        pools: vec![pool("a", 1), pool("b", 2), pool("c", 3)],
        listeners: vec![ListenerSpec { routes, default_backend: default.map(Into::into), ..Default::default() }],
    };
    Table::new(&spec, None, Instant::now(), &AtomicU64::new(0)).unwrap()
}

fn pool_of(t: &Table, r: &Req<'_>) -> Option<&'static str> {
    let l = t.listener(0);
    l.action(l.route(r)).pool.map(|i| ["a", "b", "c"][i])
}

#[test]
fn hosts_exact_and_wildcard() {
    let t = table(
        vec![
            RouteSpec { hosts: vec!["Example.com".into()], ..route("a") },
            RouteSpec { hosts: vec!["*.example.com".into()], ..route("b") },
            RouteSpec { hosts: vec!["[::1]".into()], ..route("c") },
        ],
        None,
    );
    for (h, want) in [
        ("example.com", Some("a")),
        ("EXAMPLE.COM:8080", Some("a")),
        ("example.com.", Some("a")),
        ("www.example.com", Some("b")),
        ("a.b.Example.Com:1", Some("b")),
        ("badexample.com", None),
        (".example.com", None),
        ("[::1]:80", Some("c")),
        ("[::1]", Some("c")),
        ("", None),
    ] {
        assert_eq!(pool_of(&t, &req(Some(h), "/")), want, "{h}");
    }
    assert_eq!(pool_of(&t, &req(None, "/")), None);
}

#[test]
fn paths_methods_headers_and_order() {
    let t = table(
        vec![
            RouteSpec { paths: vec!["/exact".into()], ..route("a") },
            RouteSpec {
                path_prefixes: vec!["/api/".into()],
                methods: vec!["post".into()],
                ..route("b")
            },
            RouteSpec { path_prefixes: vec!["/api/".into()], ..route("c") },
            RouteSpec { headers: vec![("X-Canary".into(), HeaderTest::Equals("1".into()))], ..route("b") },
            RouteSpec { headers: vec![("x-user".into(), HeaderTest::Prefix("adm".into()))], ..route("a") },
            RouteSpec { headers: vec![("x-any".into(), HeaderTest::Present)], ..route("c") },
        ],
        Some("a"),
    );
    assert_eq!(pool_of(&t, &req(None, "/exact")), Some("a"));
    assert_eq!(pool_of(&t, &req(None, "/exact/no")), Some("a")); // default
    assert_eq!(pool_of(&t, &Req { method: "POST", ..req(None, "/api/x") }), Some("b"));
    assert_eq!(pool_of(&t, &req(None, "/api/x")), Some("c"));
    assert_eq!(pool_of(&t, &Req { headers: vec![("x-canary", "1")], ..req(None, "/") }), Some("b"));
    assert_eq!(pool_of(&t, &Req { headers: vec![("x-canary", "2")], ..req(None, "/") }), Some("a"));
    assert_eq!(pool_of(&t, &Req { headers: vec![("X-User", "admin")], ..req(None, "/") }), Some("a"));
    assert_eq!(pool_of(&t, &Req { headers: vec![("X-Any", "")], ..req(None, "/") }), Some("c"));
}

#[test]
fn client_certificate_conditions() {
    let t = table(
        vec![
            RouteSpec { client_cert: Some(CertTest::Subject(HeaderTest::Equals("CN=a,O=X".into()))), ..route("a") },
            RouteSpec { client_cert: Some(CertTest::Subject(HeaderTest::Prefix("CN=admin,".into()))), ..route("b") },
            RouteSpec { client_cert: Some(CertTest::Absent), paths: vec!["/anon".into()], ..route("c") },
            RouteSpec { client_cert: Some(CertTest::Subject(HeaderTest::Present)), paths: vec!["/anon".into()], ..route("a") },
        ],
        None,
    );
    let with = |cert: Option<&'static str>, path: &'static str| Req { cert, ..req(None, path) };
    assert_eq!(pool_of(&t, &with(Some("CN=a,O=X"), "/")), Some("a"));
    assert_eq!(pool_of(&t, &with(Some("CN=a,O=XY"), "/")), None);
    assert_eq!(pool_of(&t, &with(Some("CN=admin,O=X"), "/")), Some("b"));
    assert_eq!(pool_of(&t, &with(Some("CN=administrator"), "/")), None);
    assert_eq!(pool_of(&t, &with(None, "/")), None, "a subject test needs a certificate");
    assert_eq!(pool_of(&t, &with(None, "/anon")), Some("c"));
    assert_eq!(pool_of(&t, &with(Some("CN=z"), "/anon")), Some("a"));
    // a header of the same name is no certificate
    let spoofed = Req { headers: vec![("x-ssl-client-dn", "CN=a,O=X")], ..req(None, "/") };
    assert_eq!(pool_of(&t, &spoofed), None);
}

#[test]
fn rules_fold_in_order() {
    let spec = RoutingSpec {
        rate_limit: None,
        error_pages: Vec::new(),
        pools: vec![PoolSpec {
            rules: RulesSpec { request: vec![RuleSpec::Set("x-a".into(), "pool".into())], response: vec![] },
            ..pool("a", 1)
        }],
        listeners: vec![ListenerSpec {
            routes: vec![RouteSpec {
                rules: RulesSpec {
                    request: vec![RuleSpec::Add("x-b".into(), "id=%[req.id] from %[src]".into())],
                    response: vec![RuleSpec::Delete("server".into())],
                },
                ..route("a")
            }],
            rules: RulesSpec { request: vec![RuleSpec::Set("X-A".into(), "listener".into())], response: vec![] },
            ..Default::default()
        }],
    };
    let t = Table::new(&spec, None, Instant::now(), &AtomicU64::new(0)).unwrap();
    let a = t.listener(0).action(0);
    assert_eq!(&*a.request.delete, &[HeaderName::from_static("x-a")]);
    assert_eq!(a.request.add.len(), 2);
    assert_eq!(a.request.add[0].fixed.as_ref().unwrap(), "pool");
    let mut v = Vec::new();
    a.request.add[1].render(&mut v, b"ID", b"1.2.3.4");
    assert_eq!(v, b"id=ID from 1.2.3.4");
    assert!(a.response.deletes(b"Server"));
    // the default has no pool: 503
    assert!(t.listener(0).action(1).pool.is_none());
}

#[test]
fn errors_name_the_key() {
    let bad = |routes: Vec<RouteSpec>| {
        let spec = RoutingSpec {
            rate_limit: None,
            error_pages: Vec::new(),
            pools: vec![pool("a", 1)],
            listeners: vec![ListenerSpec { routes, ..Default::default() }],
        };
        Table::new(&spec, None, Instant::now(), &AtomicU64::new(0)).err().unwrap()
    };
    assert!(bad(vec![route("nope")]).contains("routes[0]: no backend named \"nope\""));
    assert!(bad(vec![RouteSpec { hosts: vec!["*".into()], ..route("a") }]).contains("routes[0].host"));
    assert!(bad(vec![RouteSpec { path_prefixes: vec!["api".into()], ..route("a") }]).contains("must start with /"));
    let r = RouteSpec {
        rules: RulesSpec { request: vec![RuleSpec::Set("x".into(), "%[nope]".into())], response: vec![] },
        ..route("a")
    };
    assert!(bad(vec![r]).contains("unknown value %[nope]"));
    let r = RouteSpec {
        rules: RulesSpec { request: vec![RuleSpec::Delete("Content-Length".into())], response: vec![] },
        ..route("a")
    };
    assert!(bad(vec![r]).contains("content-length"));
    let r = RouteSpec { redirect: Some(RedirectSpec::Https { code: 200, port: None }), backend: None, ..Default::default() };
    assert!(bad(vec![r]).contains("redirect.code"));
    assert!(bad(vec![RouteSpec::default()]).contains("needs a backend, a redirect or respond"));
}

#[test]
fn redirect_locations() {
    let mut out = Vec::new();
    Redirect::Https { code: 301, port: None }.location(&mut out, Some(b"Example.com:80"), b"/a?b");
    assert_eq!(out, b"https://Example.com/a?b");
    out.clear();
    Redirect::Https { code: 301, port: Some(8443) }.location(&mut out, Some(b"[::1]:80"), b"/");
    assert_eq!(out, b"https://[::1]:8443/");
}

#[test]
fn request_ids_are_unique_hex() {
    let ids = RequestIds::default();
    let (a, b) = (ids.generate(), ids.generate());
    assert_ne!(a, b);
    assert!(a.iter().all(u8::is_ascii_hexdigit));
    assert!(valid_request_id(&a));
    assert!(!valid_request_id(b"with space"));
    assert!(!valid_request_id(b""));
}

fn reference_host(raw: &str) -> Option<String> {
    let raw = raw.trim();
    let host = if raw.starts_with('[') {
        raw.find(']').map_or(raw, |e| &raw[..=e])
    } else {
        raw.rfind(':').map_or(raw, |i| &raw[..i])
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    (host.len() <= MAX_HOST).then(|| host.to_ascii_lowercase())
}

proptest! {
    /// The compiled matcher agrees with a naive reading of the routes.
    #[test]
    fn matcher_agrees_with_a_naive_one(
        names in proptest::collection::vec("[a-c]{1,2}(\\.[a-c]{1,2}){0,2}", 1..6),
        wild in proptest::collection::vec(proptest::bool::ANY, 6),
        prefixes in proptest::collection::vec("/[a-c]{0,3}", 1..6),
        host in "[a-cA-C]{1,2}(\\.[a-cA-C]{1,2}){0,3}\\.?(:[0-9]{1,4})?",
        path in "/[a-c/]{0,6}",
    ) {
        let n = names.len().min(prefixes.len());
        let routes: Vec<RouteSpec> = (0..n)
            .map(|i| RouteSpec {
                hosts: vec![if wild[i] { format!("*.{}", names[i]) } else { names[i].clone() }],
                path_prefixes: vec![prefixes[i].clone()],
                ..route(["a", "b", "c"][i % 3])
            })
            .collect();
        let t = table(routes, None);
        let l = t.listener(0);
        let got = l.route(&req(Some(&host), &path));
        let h = reference_host(&host).unwrap();
        let want = (0..n)
            .position(|i| {
                let host_ok = if wild[i] {
                    h.ends_with(&format!(".{}", names[i]))
                } else {
                    h == names[i]
                };
                host_ok && path.starts_with(&prefixes[i])
            })
            .unwrap_or(n);
        prop_assert_eq!(got, want);
    }

    #[test]
    fn normalize_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut buf = [0u8; MAX_HOST];
        let _ = normalize_host(&raw, &mut buf);
    }
}

#[test]
fn path_and_host_regular_expressions() {
    let t = table(
        vec![
            // unanchored unless the pattern says so, as HAProxy's path_reg
            RouteSpec { path_regex: Some(r"\.(png|jpg)$".into()), ..route("a") },
            // both a prefix and a pattern: both must hold
            RouteSpec { path_prefixes: vec!["/api/".into()], path_regex: Some(r"^/api/v\d+/".into()), ..route("b") },
            // against the normalised host: lower case, no port, case-insensitive pattern
            RouteSpec { host_regex: Some(r"^(www|API)\.example\.(com|org)$".into()), ..route("c") },
        ],
        None,
    );
    assert_eq!(pool_of(&t, &req(None, "/img/a.png")), Some("a"));
    assert_eq!(pool_of(&t, &req(None, "/img/a.png.txt")), None);
    assert_eq!(pool_of(&t, &req(None, "/api/v2/users")), Some("b"));
    assert_eq!(pool_of(&t, &req(None, "/api/vx/users")), None);
    assert_eq!(pool_of(&t, &req(None, "/v2/api/v2/")), None);
    assert_eq!(pool_of(&t, &req(Some("API.Example.org:8443"), "/")), Some("c"));
    assert_eq!(pool_of(&t, &req(Some("www.example.com."), "/")), Some("c"));
    assert_eq!(pool_of(&t, &req(Some("evil-www.example.com"), "/")), None);
    assert_eq!(pool_of(&t, &req(None, "/")), None);
}

#[test]
fn invalid_patterns_and_rewrites_name_their_key() {
    let spec = |r: RouteSpec| RoutingSpec {
        rate_limit: None,
        error_pages: Vec::new(),
        pools: vec![pool("a", 1)],
        listeners: vec![ListenerSpec { routes: vec![r], ..Default::default() }],
    };
    let err = |r: RouteSpec| Table::new(&spec(r), None, Instant::now(), &AtomicU64::new(0)).err().unwrap();
    assert!(err(RouteSpec { path_regex: Some("(".into()), ..route("a") }).starts_with("routes[0].path_regex: invalid regular expression"));
    assert!(err(RouteSpec { host_regex: Some("[z-a]".into()), ..route("a") }).starts_with("routes[0].host_regex: "));
    let rewrite = RewriteSpec { path: PathRewrite::Set("/x".into()), query: QueryRewrite::Keep };
    let redirect = Some(RedirectSpec::Https { code: 301, port: None });
    let e = err(RouteSpec { rewrite: rewrite.clone(), backend: None, redirect, ..Default::default() });
    assert!(e.contains("a rewrite needs a backend"), "{e}");
    let bad = RewriteSpec { path: PathRewrite::Replace { regex: "^/(a)".into(), replacement: "/$2".into() }, ..rewrite };
    assert!(err(RouteSpec { rewrite: bad, ..route("a") }).starts_with("routes[0].rewrite.replace_path.replacement: "));
}
