//! The fast path's HTTP/1 response parser (a backend's bytes): any bytes never
//! panic; a head it accepts is rewritten for the client as one response head
//! whose framing matches how the body will be carried — a client reading it
//! must find the body's end where the balancer ends it, or the next response
//! on that connection is read from the middle of this one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustext::balancer::h1::{parse_response, BodyMode, ClientView, RespParse};

fn count(headers: &[httparse::Header<'_>], name: &str) -> usize {
    headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)).count()
}

fuzz_target!(|input: &[u8]| {
    let Some((&flags, data)) = input.split_first() else { return };
    let client = ClientView {
        http10: flags & 1 != 0,
        keep_alive: flags & 2 != 0,
        head_request: flags & 4 != 0,
        closing: flags & 8 != 0,
    };
    let mut out = Vec::new();
    let head = match parse_response(data, client, &mut out) {
        RespParse::Ready(head) => head,
        RespParse::Interim(n) => {
            assert!(n <= data.len());
            return;
        }
        RespParse::Partial | RespParse::Invalid => return,
    };
    assert!(head.head_len <= data.len());
    let mut theirs_h = [httparse::EMPTY_HEADER; 256];
    let mut theirs = httparse::Response::new(&mut theirs_h);
    assert!(matches!(theirs.parse(data), Ok(httparse::Status::Complete(n)) if n == head.head_len));
    assert_eq!(theirs.code, Some(head.status));
    let mut ours_h = [httparse::EMPTY_HEADER; 256];
    let mut ours = httparse::Response::new(&mut ours_h);
    match ours.parse(&out) {
        Ok(httparse::Status::Complete(n)) => assert_eq!(n, out.len(), "one head, nothing after it"),
        other => panic!("the client's head does not parse: {other:?}"),
    }
    assert_eq!(ours.code, Some(head.status));
    assert_eq!(ours.version, Some(if client.http10 { 0 } else { 1 }));
    let h = &*ours.headers;
    let te = count(h, "transfer-encoding");
    let cl: Vec<u64> = h
        .iter()
        .filter(|x| x.name.eq_ignore_ascii_case("content-length"))
        .map(|x| std::str::from_utf8(x.value).unwrap().trim().parse::<u64>().unwrap())
        .collect();
    match head.mode {
        BodyMode::Empty => assert_eq!(te, 0),
        BodyMode::Length(l) => {
            assert_eq!(te, 0);
            assert!(!cl.is_empty() && cl.iter().all(|&c| c == l), "{cl:?} vs {l}");
        }
        BodyMode::ChunkedPass | BodyMode::Chunk => {
            assert!(!client.http10, "no chunked encoding to an HTTP/1.0 client");
            assert_eq!(te, 1);
            assert!(cl.is_empty());
        }
        BodyMode::Dechunk | BodyMode::Raw => {
            assert!(te == 0 && cl.is_empty());
            assert!(!head.client_keep_alive, "a close-delimited body ends the connection");
        }
    }
    if !head.client_keep_alive {
        let close = h.iter().any(|x| {
            x.name.eq_ignore_ascii_case("connection") && x.value.eq_ignore_ascii_case(b"close")
        });
        assert!(close, "the client is told the connection closes");
    }
    assert!(count(h, "connection") <= 1, "the backend's Connection header is not passed on");
    if client.closing || (!client.keep_alive && client.http10) {
        assert!(!head.client_keep_alive);
    }
});
