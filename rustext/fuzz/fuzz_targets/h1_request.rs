//! The balancer's fast-path HTTP/1 request parser: any bytes never panic; a
//! head it accepts lies within the input, and the head it writes for the
//! backend (with the forwarding headers) parses as one request with the same
//! method, target and body length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustext::balancer::h1::{finish_request, parse_request, ReqParse};

fuzz_target!(|data: &[u8]| {
    let mut out = Vec::new();
    let ReqParse::Ready(head) = parse_request(data, Some("x-user"), &mut out) else { return };
    assert!(head.head_len <= data.len());
    finish_request(&mut out, data, &head, b"10.0.0.1", b"for=10.0.0.1;proto=http", "backend:80");
    let mut client = [httparse::EMPTY_HEADER; 128];
    let mut theirs = httparse::Request::new(&mut client);
    assert!(matches!(theirs.parse(data), Ok(httparse::Status::Complete(_))));
    let mut backend = [httparse::EMPTY_HEADER; 160];
    let mut ours = httparse::Request::new(&mut backend);
    match ours.parse(&out) {
        Ok(httparse::Status::Complete(n)) => assert_eq!(n, out.len(), "one head, nothing after it"),
        other => panic!("the backend head does not parse: {other:?}"),
    }
    assert_eq!(ours.method, theirs.method);
    assert_eq!(ours.path, theirs.path);
    let lengths: Vec<&[u8]> = ours
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| h.value)
        .collect();
    assert!(lengths.len() <= 1);
    let forwarded = lengths.first().map_or(0, |v| std::str::from_utf8(v).unwrap().trim().parse::<u64>().unwrap());
    assert_eq!(forwarded, head.body_len);
    assert!(!ours.headers.iter().any(|h| h.name.eq_ignore_ascii_case("transfer-encoding")));
    assert_eq!(ours.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("host")).count(), 1);
});
