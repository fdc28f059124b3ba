use http::{header, HeaderMap, HeaderValue, StatusCode};
use proptest::prelude::*;

use super::*;

const ALL: [(Coding, u32); 3] = [(Coding::Zstd, 3), (Coding::Br, 4), (Coding::Gzip, 6)];

fn pick(v: &str) -> Option<Coding> {
    choose([v.as_bytes()], &ALL).map(|(c, _)| c)
}

fn policy() -> Policy {
    Policy {
        codings: ALL.to_vec(),
        types: vec!["text/*".into(), "application/json".into()],
        min_length: 100,
    }
}

#[test]
fn the_server_prefers_among_equals() {
    assert_eq!(pick("gzip, deflate, br, zstd"), Some(Coding::Zstd));
    assert_eq!(pick("gzip, deflate, br"), Some(Coding::Br));
    assert_eq!(pick("gzip"), Some(Coding::Gzip));
    assert_eq!(pick("x-gzip"), Some(Coding::Gzip));
    assert_eq!(pick("GZIP"), Some(Coding::Gzip));
    let gzip_first = [(Coding::Gzip, 6), (Coding::Br, 4)];
    assert_eq!(choose([&b"br, gzip"[..]], &gzip_first), Some((Coding::Gzip, 6)));
}

#[test]
fn weights_are_honoured() {
    assert_eq!(pick("gzip;q=1.0, br;q=0.5, zstd;q=0.1"), Some(Coding::Gzip));
    assert_eq!(pick("gzip;q=0.5, br;q=0.9"), Some(Coding::Br));
    assert_eq!(pick("br;q=0, gzip"), Some(Coding::Gzip));
    assert_eq!(pick("gzip ; q=0.001"), Some(Coding::Gzip));
    assert_eq!(pick("gzip;Q=0"), None);
    assert_eq!(pick("gzip;q=0.000"), None);
}

#[test]
fn star_and_identity() {
    assert_eq!(pick("*"), Some(Coding::Zstd));
    assert_eq!(pick("*;q=0.5, br;q=0.6"), Some(Coding::Br));
    assert_eq!(pick("*;q=0"), None);
    assert_eq!(pick("*, zstd;q=0, br;q=0"), Some(Coding::Gzip));
    assert_eq!(pick("identity"), None);
    assert_eq!(pick("identity;q=0"), None);
    assert_eq!(pick("identity;q=0, gzip"), Some(Coding::Gzip));
    assert_eq!(pick(""), None);
    assert_eq!(choose(std::iter::empty::<&[u8]>(), &ALL), None);
}

#[test]
fn fields_combine() {
    assert_eq!(choose([&b"gzip;q=0.2"[..], b"br;q=0.3"], &ALL), Some((Coding::Br, 4)));
}

#[test]
fn hostile_values_are_skipped_not_obeyed() {
    assert_eq!(pick("gzip;q=2"), None);
    assert_eq!(pick("gzip;q=1.5"), None);
    assert_eq!(pick("gzip;q=-1"), None);
    assert_eq!(pick("gzip;q=0.1234"), None);
    assert_eq!(pick("gzip;q="), None);
    assert_eq!(pick("gzip;q=abc, br"), Some(Coding::Br));
    assert_eq!(pick("g zip, br"), Some(Coding::Br));
    assert_eq!(pick(",,, ,;,;q=1,br"), Some(Coding::Br));
    assert_eq!(pick("gzip;level=9"), Some(Coding::Gzip));
    assert_eq!(pick("zstd\u{7f}"), None);
    // only the first MAX_ELEMENTS elements are read
    let long = format!("{}br", "x,".repeat(MAX_ELEMENTS));
    assert_eq!(pick(&long), None);
}

fn resp(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(header::HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
    }
    h
}

fn asked_with(method: &str, req: &[(&str, &str)]) -> Asked {
    asked(&policy(), method.as_bytes(), &resp(req))
}

#[test]
fn what_is_never_compressed() {
    let p = policy();
    let gz = asked_with("GET", &[("accept-encoding", "gzip")]);
    let ok = resp(&[("content-type", "text/html; charset=utf-8"), ("content-length", "1000")]);
    assert_eq!(plan(&p, gz, StatusCode::OK, &ok), Plan::Compress(Coding::Gzip, 6));
    assert_eq!(plan(&p, gz, StatusCode::NOT_FOUND, &ok), Plan::Compress(Coding::Gzip, 6));
    let head = asked_with("HEAD", &[("accept-encoding", "gzip")]);
    assert_eq!(plan(&p, head, StatusCode::OK, &ok), Plan::AsIs);
    let range = asked_with("GET", &[("accept-encoding", "gzip"), ("range", "bytes=0-1")]);
    assert_eq!(plan(&p, range, StatusCode::OK, &ok), Plan::AsIs);
    for s in [101, 204, 206, 304] {
        assert_eq!(plan(&p, gz, StatusCode::from_u16(s).unwrap(), &ok), Plan::AsIs, "{s}");
    }
    let mut h = ok.clone();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, No-Transform"));
    assert_eq!(plan(&p, gz, StatusCode::OK, &h), Plan::AsIs);
    let mut h = ok.clone();
    h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("br"));
    assert_eq!(plan(&p, gz, StatusCode::OK, &h), Plan::AsIs);
    let mut h = ok.clone();
    h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("identity"));
    assert_eq!(plan(&p, gz, StatusCode::OK, &h), Plan::Compress(Coding::Gzip, 6));
    let img = resp(&[("content-type", "image/png")]);
    assert_eq!(plan(&p, gz, StatusCode::OK, &img), Plan::AsIs);
    assert_eq!(plan(&p, gz, StatusCode::OK, &resp(&[])), Plan::AsIs);
    let small = resp(&[("content-type", "application/json"), ("content-length", "99")]);
    assert_eq!(plan(&p, gz, StatusCode::OK, &small), Plan::Vary);
    let empty = resp(&[("content-type", "application/json"), ("content-length", "0")]);
    let no_minimum = Policy { min_length: 0, ..policy() };
    assert_eq!(plan(&no_minimum, gz, StatusCode::OK, &empty), Plan::Vary);
    let streamed = resp(&[("content-type", "APPLICATION/JSON")]);
    assert_eq!(plan(&p, gz, StatusCode::OK, &streamed), Plan::Compress(Coding::Gzip, 6));
    let none = asked_with("GET", &[]);
    assert_eq!(plan(&p, none, StatusCode::OK, &ok), Plan::Vary);
}

#[test]
fn types_match_exactly_or_by_prefix() {
    let t = vec!["text/*".to_string(), "image/svg+xml".to_string()];
    assert!(type_allowed(&t, b"text/plain"));
    assert!(type_allowed(&t, b" Text/CSS ; charset=x"));
    assert!(type_allowed(&t, b"image/svg+xml"));
    assert!(!type_allowed(&t, b"image/svg"));
    assert!(!type_allowed(&t, b"text/"));
    assert!(!type_allowed(&t, b"textual/plain"));
    assert!(!type_allowed(&t, b"text/event-stream"));
    let sse = vec!["text/*".to_string(), "text/event-stream".to_string(), "application/*+json".to_string()];
    assert!(type_allowed(&sse, b"text/event-stream; charset=utf-8"));
    assert!(type_allowed(&sse, b"application/ld+json"));
    assert!(!type_allowed(&sse, b"application/json"));
    assert!(!type_allowed(&sse, b"application/+json"));
    let everything = vec!["application/*".to_string()];
    assert!(!type_allowed(&everything, b"application/grpc"));
    assert!(!type_allowed(&everything, b"application/grpc+proto"));
}

#[test]
fn the_edits_of_a_compressed_response() {
    let mut h = resp(&[
        ("content-length", "5000"),
        ("accept-ranges", "bytes"),
        ("etag", "\"abc\""),
        ("vary", "Origin"),
        ("vary", "Cookie"),
    ]);
    edit(&mut h, Coding::Br);
    assert_eq!(h[header::CONTENT_ENCODING], "br");
    assert!(!h.contains_key(header::CONTENT_LENGTH));
    assert!(!h.contains_key(header::ACCEPT_RANGES));
    assert_eq!(h[header::ETAG], "W/\"abc\"");
    assert_eq!(h.get_all(header::VARY).iter().collect::<Vec<_>>(), ["Origin, Cookie, Accept-Encoding"]);
    let mut weak = resp(&[("etag", "W/\"x\""), ("vary", "accept-encoding")]);
    edit(&mut weak, Coding::Gzip);
    assert_eq!(weak[header::ETAG], "W/\"x\"");
    assert_eq!(weak[header::VARY], "accept-encoding");
    let mut star = resp(&[("vary", "*")]);
    add_vary(&mut star);
    assert_eq!(star[header::VARY], "*");
}

proptest! {
    #[test]
    fn the_parser_never_panics_and_keeps_weights_in_range(v in proptest::collection::vec(any::<u8>(), 0..200)) {
        for (coding, q) in parse_accept([&v[..]]) {
            prop_assert!(q <= 1000);
            prop_assert!(is_token(coding));
        }
        let _ = choose([&v[..]], &ALL);
    }

    #[test]
    fn the_chosen_coding_has_the_highest_weight(
        gz in 0u16..=1000, br in 0u16..=1000, zs in 0u16..=1000,
    ) {
        let v = format!("gzip;q={}, br;q={}, zstd;q={}", q(gz), q(br), q(zs));
        let got = choose([v.as_bytes()], &ALL).map(|(c, _)| c);
        let best = gz.max(br).max(zs);
        if best == 0 {
            prop_assert_eq!(got, None);
        } else {
            let want = if zs == best { Coding::Zstd } else if br == best { Coding::Br } else { Coding::Gzip };
            prop_assert_eq!(got, Some(want));
        }
    }
}

fn q(t: u16) -> String {
    if t == 1000 { "1".into() } else { format!("0.{t:03}") }
}
