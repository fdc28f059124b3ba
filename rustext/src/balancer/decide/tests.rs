use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use super::*;
use crate::balancer::config::{BackendSpec, Settings};
use crate::balancer::h1::{finish_request_with, parse_request_with, slice, Edits, ReqParse};
use crate::balancer::ratelimit::Spec as LimitSpec;
use crate::balancer::route::{
    ListenerSpec, PoolSpec, RedirectSpec, RouteSpec, RoutingSpec, RuleSpec, RulesSpec, Table,
};

const IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

/// `at_once` requests pass at once, then one an hour.
fn limit(at_once: u64) -> LimitSpec {
    LimitSpec {
        count: 1,
        period: Duration::from_secs(3600),
        burst: at_once - 1,
        key: LimitKey::Src,
        missing_allow: false,
        max_keys: 100,
        status: 429,
        delay: None,
    }
}

/// Routes: `/old` redirects, `/page` answers itself, `*.example.com` goes to
/// pool `a` with header rules; no default backend.
fn spec() -> RoutingSpec {
    let mut settings = Settings::default();
    settings.backends.push(BackendSpec { name: "127.0.0.1:1".into(), weight: 1, max_connections: 0 });
    RoutingSpec {
        rate_limit: None,
        error_pages: Vec::new(),
        pools: vec![PoolSpec { name: "a".into(), settings, rules: RulesSpec::default() }],
        listeners: vec![ListenerSpec {
            routes: vec![
                RouteSpec {
                    paths: vec!["/old".into()],
                    redirect: Some(RedirectSpec::Location { code: 301, location: "/new".into() }),
                    ..Default::default()
                },
                RouteSpec {
                    paths: vec!["/page".into()],
                    respond: Some(Arc::new(ErrorPage::new(403, vec![], b"no\n".to_vec()).unwrap())),
                    ..Default::default()
                },
                RouteSpec {
                    hosts: vec!["*.example.com".into()],
                    backend: Some("a".into()),
                    rules: RulesSpec {
                        request: vec![RuleSpec::Delete("x-secret".into()), RuleSpec::Set("x-env".into(), "p".into())],
                        response: vec![],
                    },
                    ..Default::default()
                },
            ],
            request_id: Some("x-request-id".into()),
            ..Default::default()
        }],
    }
}

fn table(spec: &RoutingSpec) -> Table {
    Table::new(spec, None, Instant::now(), &AtomicU64::new(0)).unwrap()
}

/// Parse and decide as the fast path does.
fn parse<'t>(t: &'t Table, raw: &[u8], out: &mut Vec<u8>) -> (crate::balancer::h1::ReqHead, Decision<'t>) {
    let ReqParse::Ready(h) = parse_request_with(raw, out, |r| crate::balancer::fast::plan(t, t.listener(0), r)) else {
        panic!("not parsed")
    };
    let head = &raw[..h.head_len];
    let d = decide(t, 0, h.action, IP, |n| crate::balancer::ratelimit::raw_header(head, n.as_str().as_bytes()));
    (h, d)
}

#[test]
fn routes_deletes_and_adds_without_touching_the_rest() {
    let t = table(&spec());
    let raw = b"GET /x HTTP/1.1\r\nHost: WWW.example.com:80\r\nX-Secret: s\r\nX-Env: d\r\nX-Request-ID: abc\r\nA: b\r\n\r\n";
    let mut out = Vec::new();
    let (h, d) = parse(&t, raw, &mut out);
    assert!(matches!(d.verdict, Verdict::Forward { pool: 0, .. }));
    assert_eq!((d.pool_name(&t), d.own()), ("a", None));
    assert_eq!(slice(raw, h.req_id.unwrap()), b"abc");
    let edits = Edits { add: &d.request_rules().add, req_id: Some(("x-request-id", b"abc")), src: b"1.2.3.4" };
    finish_request_with(&mut out, raw, &h, b"1.2.3.4", b"for=1.2.3.4;proto=http", "b:1", &edits);
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains("X-Secret") && !text.contains("X-Env: d") && text.contains("A: b\r\n"), "{text}");
    assert!(text.contains("x-env: p\r\nx-request-id: abc\r\n"), "{text}");
    assert_eq!(text.matches("X-Request-ID").count() + text.matches("x-request-id").count(), 1, "{text}");
}

#[test]
fn own_answers_write_nothing_for_a_backend() {
    let t = table(&spec());
    let mut out = Vec::new();
    let (_, d) = parse(&t, b"GET /old HTTP/1.1\r\nHost: a\r\n\r\n", &mut out);
    assert!(matches!(d.verdict, Verdict::Redirect(_)) && out.is_empty());
    assert_eq!((d.pool_name(&t), d.own()), ("", Some((301, "LR"))));
    let (_, d) = parse(&t, b"GET /page HTTP/1.1\r\nHost: a\r\n\r\n", &mut out);
    assert!(matches!(d.verdict, Verdict::Page(p) if p.body.as_ref() == b"no\n") && out.is_empty());
    assert_eq!(d.own(), Some((403, "PR")));
    let (h, d) = parse(&t, b"GET /x HTTP/1.1\r\nHost: other\r\n\r\n", &mut out);
    assert!(matches!(d.verdict, Verdict::NoRoute) && out.is_empty() && h.req_id.is_none());
    assert_eq!(d.own(), Some((503, "PR")));
}

#[test]
fn a_routes_empty_page_takes_the_error_page_of_its_status() {
    let mut s = spec();
    s.listeners[0].routes[1].respond = Some(Arc::new(ErrorPage::new(403, vec![], vec![]).unwrap()));
    s.error_pages.push(Arc::new(ErrorPage::new(403, vec![], b"<p>forbidden</p>".to_vec()).unwrap()));
    let t = table(&s);
    let (_, d) = parse(&t, b"GET /page HTTP/1.1\r\nHost: a\r\n\r\n", &mut Vec::new());
    assert!(matches!(d.verdict, Verdict::Page(p) if p.body.as_ref() == b"<p>forbidden</p>"));
}

#[test]
fn the_balancers_limit_counts_every_request_and_a_pools_only_those_it_serves() {
    let mut s = spec();
    s.rate_limit = Some(limit(3));
    s.pools[0].settings.policy.rate_limit = Some(limit(1));
    let t = table(&s);
    let mut out = Vec::new();
    // the redirect is not the pool's: only the balancer's limit counts it
    let (_, d) = parse(&t, b"GET /old HTTP/1.1\r\nHost: a\r\n\r\n", &mut out);
    assert!(matches!(d.verdict, Verdict::Redirect(_)));
    let fwd = b"GET /x HTTP/1.1\r\nHost: www.example.com\r\n\r\n";
    let (_, d) = parse(&t, fwd, &mut out);
    assert!(matches!(d.verdict, Verdict::Forward { .. }));
    // the pool's limit (1) refuses the second; the refusal names its status and a wait
    let (_, d) = parse(&t, fwd, &mut out);
    assert!(matches!(d.verdict, Verdict::Limited { status: 429, wait } if wait > Duration::ZERO));
    assert_eq!((d.pool_name(&t), d.own()), ("", Some((429, "PR"))));
    // the balancer's (3) was spent by the three above: even a redirect is refused now
    let (_, d) = parse(&t, b"GET /old HTTP/1.1\r\nHost: a\r\n\r\n", &mut out);
    assert!(matches!(d.verdict, Verdict::Limited { .. }));
}

#[test]
fn hypers_view_gets_the_same_decision() {
    use http::{HeaderMap, HeaderValue};
    struct MapView<'a>(&'a HeaderMap, &'a str);
    impl View for MapView<'_> {
        fn host(&self) -> Option<&[u8]> {
            self.0.get("host").map(HeaderValue::as_bytes)
        }
        fn path(&self) -> &[u8] {
            self.1.as_bytes()
        }
        fn method(&self) -> &[u8] {
            b"GET"
        }
        fn header_any(&self, name: &[u8], test: &mut dyn FnMut(&[u8]) -> bool) -> bool {
            self.0.get_all(std::str::from_utf8(name).unwrap()).iter().any(|v| test(v.as_bytes()))
        }
    }
    let t = table(&spec());
    for (host, path) in [("www.example.com", "/x"), ("a", "/old"), ("a", "/page"), ("other", "/x")] {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_str(host).unwrap());
        let a = route(t.listener(0), &MapView(&h, path));
        let hyper = decide(&t, 0, a, IP, |n| h.get(n).map(HeaderValue::as_bytes));
        let raw = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
        let (_, fast) = parse(&t, raw.as_bytes(), &mut Vec::new());
        assert_eq!((hyper.pool_name(&t), hyper.own()), (fast.pool_name(&t), fast.own()), "{host}{path}");
    }
}

#[test]
fn attempts_that_ran_out_are_answered_by_their_last_failure() {
    assert_eq!((gave_up(None).status, gave_up(None).term), (503, "SC"));
    assert_eq!((gave_up(Some(Fail::Connect)).status, gave_up(Some(Fail::Connect)).term), (502, "SC"));
    assert_eq!((gave_up(Some(Fail::Reset)).status, gave_up(Some(Fail::Reset)).term), (502, "SH"));
    assert_eq!(gave_up(Some(Fail::ConnectTimeout)).term, "sC");
    assert_eq!(gave_up(Some(Fail::Timeout)), TIMED_OUT);
    assert_eq!(gave_up(Some(Fail::Timeout)).counter, Counter::Timeouts);
    assert_eq!(QUEUE_FULL.counter, Counter::None);
}
