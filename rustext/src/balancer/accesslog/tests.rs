use super::*;
use std::time::UNIX_EPOCH;
use proptest::prelude::*;

fn record<'a>(target: &'a [u8], head: &'a [u8]) -> Record<'a> {
    Record {
        listener: 0,
        client: "10.1.2.3:4567".parse().unwrap(),
        unix: false,
        when: UNIX_EPOCH + Duration::from_millis(1_764_197_989_123),
        frontend: "127.0.0.1:8080",
        backend: "api",
        server: "127.0.0.1:9001",
        method: b"GET",
        target,
        version: "HTTP/1.1",
        status: 200,
        bytes_sent: 5,
        bytes_received: 0,
        timings: Timings { head: Some(Duration::from_millis(1)), total: Duration::from_millis(7), ..Default::default() },
        retries: 0,
        request_id: b"abc",
        req_headers: Headers::Raw(head),
        res_headers: Headers::None,
        termination: "--",
    }
}

fn line(fmt: &str, r: &Record<'_>) -> String {
    let mut out = Vec::new();
    compile(fmt).unwrap().write(&mut out, r);
    String::from_utf8(out).unwrap()
}

#[test]
fn syslog_headers() {
    let mut s = SyslogSpec { address: "udp://127.0.0.1:514".into(), facility: 16, rfc5424: false, newline_framing: false, tag: "lb".into(), max_length: 1024 };
    let when = UNIX_EPOCH + Duration::from_millis(1_764_205_509_123); // 2025-11-27T01:05:09.123Z
    let mut out = Vec::new();
    syslog_message(&mut out, &s, "host1", 42, when, b"GET / 200");
    assert_eq!(out, b"<134>Nov 27 01:05:09 lb[42]: GET / 200");
    let early = UNIX_EPOCH + Duration::from_secs(1_764_547_200); // 2025-12-01: the day is space-padded
    syslog_message(&mut out, &s, "host1", 42, early, b"x");
    assert_eq!(out, b"<134>Dec  1 00:00:00 lb[42]: x");
    s.rfc5424 = true;
    s.facility = 3;
    syslog_message(&mut out, &s, "host1", 42, when, b"GET / 200");
    assert_eq!(out, b"<30>1 2025-11-27T01:05:09.123Z host1 lb 42 - - GET / 200");
    s.max_length = 60;
    syslog_message(&mut out, &s, "host1", 42, when, &[b'y'; 100]);
    assert_eq!(out.len(), 60);
}

#[test]
fn compiles_segments() {
    let f = compile("%ci:%cp \"%r\" %[req.hdr(User-Agent)] 100%%").unwrap();
    assert_eq!(f.segs[0], Seg::Var(Var::ClientIp));
    assert_eq!(f.segs[1], Seg::Lit(b":".to_vec()));
    assert_eq!(f.segs[5], Seg::Lit(b"\" ".to_vec()));
    assert_eq!(f.segs[6], Seg::Var(Var::ReqHeader("user-agent".into())));
    assert_eq!(f.segs[7], Seg::Lit(b" 100%".to_vec()));
    assert_eq!(f.req_headers, vec!["user-agent".to_string()]);
    // the longest name wins: %tsc is not %t then "sc"; %ST is not %s then "T"
    assert_eq!(compile("%tsc").unwrap().segs, vec![Seg::Var(Var::TerminationCookie)]);
    assert_eq!(compile("%ts").unwrap().segs, vec![Seg::Var(Var::Termination)]);
    assert_eq!(compile("%ST").unwrap().segs, vec![Seg::Var(Var::Status)]);
    assert_eq!(compile("%{+Q}r").unwrap().segs, vec![Seg::Var(Var::RequestLine)]);
}

#[test]
fn refuses_bad_formats() {
    assert!(compile("%zz").unwrap_err().contains("unknown variable %zz"));
    assert!(compile("%[req.hdr(x)").unwrap_err().contains("unbalanced '['"));
    assert!(compile("%{+Q r").unwrap_err().contains("unbalanced '{'"));
    assert!(compile("%[nope]").unwrap_err().contains("unknown variable %[nope]"));
    assert!(compile("a % b").is_err());
    assert!(compile("a\nb").is_err());
}

#[test]
fn formats_a_line() {
    let r = record(b"/a/b?x=1", b"GET / HTTP/1.1\r\nUser-Agent: curl/8\r\n\r\n");
    assert_eq!(
        line(DEFAULT_FORMAT, &r),
        "10.1.2.3:4567 [26/Nov/2025:22:59:49.123] 127.0.0.1:8080 api/127.0.0.1:9001 1/-1/-1/-1/7 200 5 0 ---- 0 abc \"GET /a/b?x=1 HTTP/1.1\"\n"
    );
    assert_eq!(line("%HP|%HQ|%[req.hdr(user-agent)]|%[time.iso]", &r), "/a/b|?x=1|curl/8|2025-11-26T22:59:49.123Z\n");
    let j = line("json", &r);
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(v["status"], 200);
    assert_eq!(v["query"], "?x=1");
    assert_eq!(v["time_response_ms"], -1);
}

#[test]
fn names_a_unix_client_as_haproxy_does() {
    let mut r = record(b"/", b"GET / HTTP/1.1\r\n\r\n");
    r.unix = true;
    r.listener = 1;
    assert!(line(DEFAULT_FORMAT, &r).starts_with("unix:2 ["));
    let v: serde_json::Value = serde_json::from_str(&line("json", &r)).unwrap();
    assert_eq!((v["client_ip"].as_str(), v["client_port"].as_u64()), (Some("unix"), Some(2)));
}

#[test]
fn escapes_values() {
    let r = record(b"/\"q\"\\\x01\xff", b"GET / HTTP/1.1\r\nX: a\"b\r\n\r\n");
    assert_eq!(line("%HP %[req.hdr(x)]", &r), "/\\x22q\\x22\\x5c\\x01\\xff a\\x22b\n");
    let j = line("json", &r);
    let v: serde_json::Value = serde_json::from_str(j.trim_end()).unwrap();
    assert_eq!(v["path"], "/\"q\"\\\u{1}\u{ff}");
}

proptest! {
    #[test]
    fn no_value_brings_a_newline(v in proptest::collection::vec(any::<u8>(), 0..64)) {
        for fmt in ["%HP %[req.hdr(x)] %r", "json"] {
            let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
            head.extend(v.iter().filter(|&&c| c != b'\n' && c != b'\r'));
            head.extend_from_slice(b"\r\n\r\n");
            let r = record(&v, &head);
            let mut out = Vec::new();
            compile(fmt).unwrap().write(&mut out, &r);
            prop_assert_eq!(out.iter().filter(|&&c| c == b'\n' || c == b'\r').count(), 1);
            prop_assert_eq!(out.last(), Some(&b'\n'));
            if fmt == "json" {
                let parsed: serde_json::Value = serde_json::from_slice(&out).unwrap();
                prop_assert!(parsed.is_object());
            }
        }
    }
}
