//! Tests of the codec: parsing, building, and the scanner against serde_json.

use super::*;
use proptest::prelude::*;

const U: &str = "d11bff91-58fb-4e20-87ca-8c221fccbb49";

fn call(extra: &str) -> String {
    format!(r#"{{"meta": {{"type": 1, "uuid": "{U}"}}, "payload": {{"uri": "test.echo", "timeout": 5000000000{extra}}}}}"#)
}

#[test]
fn parses_call() {
    let m = parse_client(call(r#", "args": "hello""#).as_bytes(), ALL_CLIENT_TYPES).unwrap();
    assert_eq!(m.msg_type, CALL);
    assert_eq!(m.uuid, U);
    assert_eq!(m.uri.as_deref(), Some("test.echo"));
    assert_eq!(m.timeout_ns, Some(5_000_000_000));
    assert_eq!(m.args.as_deref(), Some(&b"\"hello\""[..]));
}

#[test]
fn args_absent_and_null() {
    let m = parse_client(call("").as_bytes(), ALL_CLIENT_TYPES).unwrap();
    assert_eq!(m.args, None);
    let m = parse_client(call(r#", "args": null"#).as_bytes(), ALL_CLIENT_TYPES).unwrap();
    assert_eq!(m.args.as_deref(), Some(&b"null"[..]));
}

#[test]
fn args_normalized_like_go() {
    let m = parse_client(call(r#", "args": {"k": [1, 2, 3], "s": "a<b>&c\u2028 d"}"#).as_bytes(), ALL_CLIENT_TYPES)
        .unwrap();
    assert_eq!(
        std::str::from_utf8(m.args.as_deref().unwrap()).unwrap(),
        r#"{"k":[1,2,3],"s":"a\u003cb\u003e\u0026c\u2028 d"}"#
    );
    let raw = "\"a<b>&c\u{2028}d\"";
    let m = parse_client(call(&format!(", \"args\": {raw}")).as_bytes(), ALL_CLIENT_TYPES).unwrap();
    assert_eq!(m.args.as_deref().unwrap(), br#""a\u003cb\u003e\u0026c\u2028d""#);
}

#[test]
fn uppercase_uuid_canonical() {
    let f = r#"{"meta":{"type":1,"uuid":"DF2D1E9D-5C7A-4530-97D9-3BD1B3FE40A7"},"payload":{"uri":"x"}}"#;
    assert_eq!(parse_client(f.as_bytes(), ALL_CLIENT_TYPES).unwrap().uuid, "df2d1e9d-5c7a-4530-97d9-3bd1b3fe40a7");
}

#[test]
fn uuid_forms() {
    let c = "df2d1e9d-5c7a-4530-97d9-3bd1b3fe40a7";
    for f in [
        "df2d1e9d-5c7a-4530-97d9-3bd1b3fe40a7",
        "{df2d1e9d-5c7a-4530-97d9-3bd1b3fe40a7}",
        "urn:uuid:df2d1e9d-5c7a-4530-97d9-3bd1b3fe40a7",
        "df2d1e9d5c7a453097d93bd1b3fe40a7",
    ] {
        assert_eq!(parse_uuid(f).as_deref(), Some(c), "{f}");
    }
    for f in ["", "not-a-uuid", "df2d1e9d-5c7a-4530-97d9-3bd1b3fe40ag", "df2d1e9d+5c7a-4530-97d9-3bd1b3fe40a7"] {
        assert_eq!(parse_uuid(f), None, "{f}");
    }
}

#[test]
fn rejects_protocol_errors() {
    let bad = [
        "",
        "   ",
        "this is not json",
        "[]",
        "null",
        r#"{"meta": {"type": 99, "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}"#,
        r#"{"meta": {"type": 8, "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}"#,
        r#"{"meta": {"type": 0, "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}"#,
        r#"{"meta": {"type": "CALL", "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}"#,
        r#"{"meta": {"type": 1.0, "uuid": "05de2e0e-552e-47e3-bf19-29a1f3d2dff2"}, "payload": {}}"#,
        r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":"test.echo","timeout":1.5e9,"args":"x"}}"#,
        r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":"test.echo","timeout":"5s"}}"#,
        r#"{"meta":{"type":1,"uuid":"not-a-uuid"},"payload":{"uri":"test.echo"}}"#,
        r#"{"meta":{"type":1},"payload":{"uri":"test.echo"}}"#,
        r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"}}"#,
        r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":null}"#,
        r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":5}}"#,
        r#"{"meta":{"type":3,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"channel":"a","pattern":"yes"}}"#,
        r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":"a","args":[1,]}}"#,
        r#"{"meta":{"type":1,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"uri":"a","args":"#,
    ];
    for f in bad {
        assert!(parse_client(f.as_bytes(), ALL_CLIENT_TYPES).is_err(), "{f}");
    }
    assert_eq!(parse_client(b"\xff", ALL_CLIENT_TYPES), Err(Error::InvalidUtf8));
}

#[test]
fn forbidden_type() {
    let f = r#"{"meta":{"type":3,"uuid":"f8e3db3e-b7bf-4842-8634-5339dba4274c"},"payload":{"channel":"a"}}"#;
    let mask = allowed_mask("call, pub").unwrap();
    assert_eq!(parse_client(f.as_bytes(), mask), Err(Error::Forbidden(3)));
    assert!(parse_client(f.as_bytes(), ALL_CLIENT_TYPES).is_ok());
}

#[test]
fn trailing_value_ignored() {
    let f = format!("{}{}", call(r#","args":"first""#), call(r#","args":"second""#));
    let m = parse_client(f.as_bytes(), ALL_CLIENT_TYPES).unwrap();
    assert_eq!(m.args.as_deref(), Some(&b"\"first\""[..]));
}

#[test]
fn case_insensitive_keys_last_wins() {
    let f = format!(
        r#"{{"META":{{"Type":2,"UUID":"{U}"}},"Payload":{{"channel":"a","Channel":"b","args":1,"args":2}}}}"#
    );
    let m = parse_client(f.as_bytes(), ALL_CLIENT_TYPES).unwrap();
    assert_eq!(m.msg_type, PUB);
    assert_eq!(m.channel.as_deref(), Some("b"));
    assert_eq!(m.args.as_deref(), Some(&b"2"[..]));
}

#[test]
fn sub_unsb() {
    let f = format!(r#"{{"meta":{{"type":4,"uuid":"{U}"}},"payload":{{"channel":"cap.news.*","pattern":true}}}}"#);
    let m = parse_client(f.as_bytes(), ALL_CLIENT_TYPES).unwrap();
    assert_eq!((m.msg_type, m.channel.as_deref(), m.pattern), (UNSB, Some("cap.news.*"), true));
    let f = format!(r#"{{"meta":{{"type":3,"uuid":"{U}"}},"payload":{{}}}}"#);
    let m = parse_client(f.as_bytes(), ALL_CLIENT_TYPES).unwrap();
    assert_eq!((m.channel.as_deref(), m.pattern), (Some(""), false));
}

#[test]
fn depth_bounded() {
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 10), "]".repeat(MAX_DEPTH + 10));
    assert_eq!(normalize_args(deep.as_bytes()), Err(Error::TooDeep));
    let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
    assert!(normalize_args(ok.as_bytes()).is_ok());
}

#[test]
fn builds_frames() {
    let ack = String::from_utf8(build_ack(U, CALL, "test.echo")).unwrap();
    assert!(ack.ends_with("}}\n"));
    let m = parse_server(ack.as_bytes()).unwrap();
    assert_eq!((m.msg_type, m.for_uuid.as_str(), m.for_type, m.uri.as_deref()), (ACK, U, Some(1), Some("test.echo")));
    assert_ne!(m.uuid, U);
    let ack = build_ack(U, SUB, "a.b");
    let m = parse_server(&ack).unwrap();
    assert_eq!((m.channel.as_deref(), m.uri), (Some("a.b"), None));
    let nack = build_nack(U, CALL, "x", 500, "list capacity exceeded");
    let m = parse_server(&nack).unwrap();
    assert_eq!((m.msg_type, m.code, m.message.as_deref()), (NACK, Some(500), Some("list capacity exceeded")));
    let res = build_res(U, "x", Some(b"{\"a\":1}"));
    let m = parse_server(&res).unwrap();
    assert_eq!(m.args.as_deref(), Some(&b"{\"a\":1}"[..]));
    let ev = build_evnt(U, "c", Some("c*"), None, None);
    let m = parse_server(&ev).unwrap();
    assert_eq!((m.pattern.as_deref(), m.args.as_deref()), (Some("c*"), Some(&b"null"[..])));
    assert!(!String::from_utf8(build_evnt(U, "c", None, Some(b"1"), None)).unwrap().contains("pattern"));
}

#[test]
fn payloads() {
    let p = build_call_payload(U, U, "u", None).unwrap();
    assert_eq!(std::str::from_utf8(&p).unwrap(), format!(r#"{{"conn_uuid":"{U}","msg_uuid":"{U}","uri":"u"}}"#));
    let p = build_call_payload(U, U, "u", Some(b" { \"k\" : [1, 2] } ")).unwrap();
    let c = parse_call_payload(&p).unwrap();
    assert_eq!(c.args.as_deref(), Some(&br#"{"k":[1,2]}"#[..]));
    assert!(build_call_payload(U, U, "u", Some(b"{bad")).is_err());
    assert_eq!(c.trace, None);
    let tp = br#"{ "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" }"#;
    let p = build_call_payload_traced(U, U, "u", Some(b"1"), Some(tp)).unwrap();
    let text = std::str::from_utf8(&p).unwrap();
    assert!(text.ends_with(r#","args":1,"trace":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}"#));
    let c = parse_call_payload(&p).unwrap();
    let normalized_tp = br#"{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}"#;
    assert_eq!((c.args.as_deref(), c.trace.as_deref()), (Some(&b"1"[..]), Some(&normalized_tp[..])));
    assert!(build_call_payload_traced(U, U, "u", None, Some(b"[1]")).is_err());
    let p = build_pub_payload(U, None).unwrap();
    assert_eq!(parse_pub_payload(&p).unwrap(), (U.to_string(), None));
    let raw = format!(r#"{{"msg_uuid": "{U}", "args": {{"from": "redis"}}}}"#);
    assert_eq!(parse_pub_payload(raw.as_bytes()).unwrap().1.as_deref(), Some(&br#"{"from":"redis"}"#[..]));
}

#[test]
fn client_builders_roundtrip() {
    let f = build_call(U, "test.echo", 5, Some(b"\"x\"")).unwrap();
    let m = parse_client(&f, ALL_CLIENT_TYPES).unwrap();
    assert_eq!((m.uri.as_deref(), m.timeout_ns, m.args.as_deref()), (Some("test.echo"), Some(5), Some(&b"\"x\""[..])));
    let f = build_pub(U, "ch", None).unwrap();
    assert_eq!(parse_client(&f, ALL_CLIENT_TYPES).unwrap().args, None);
    let f = build_sub(U, "ch*", true, true);
    let m = parse_client(&f, ALL_CLIENT_TYPES).unwrap();
    assert_eq!((m.msg_type, m.pattern), (UNSB, true));
}

#[test]
fn write_str_escapes_like_go() {
    let mut out = Vec::new();
    write_str(&mut out, "a\"b\\c\n\u{1}<>&\u{2028}\u{2029}é");
    assert_eq!(std::str::from_utf8(&out).unwrap(), r#""a\"b\\c\n\u0001\u003c\u003e\u0026\u2028\u2029é""#);
}

#[test]
fn allowed_header() {
    assert_eq!(allowed_mask(""), Ok(ALL_CLIENT_TYPES));
    assert_eq!(allowed_mask("*"), Ok(ALL_CLIENT_TYPES));
    assert_eq!(allowed_mask("CALL, Pub"), Ok((1 << CALL) | (1 << PUB)));
    assert!(allowed_mask("call, nope").is_err());
}

#[test]
fn new_uuid_is_v4() {
    let u = new_uuid();
    assert_eq!(parse_uuid(&u).as_deref(), Some(u.as_str()));
    assert_eq!(&u[14..15], "4");
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(serde_json::Value::from),
        (-4000i32..4000).prop_map(|i| serde_json::Value::from(f64::from(i) / 8.0)),
        ".*".prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(".*", inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn parse_never_panics(data in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse_client(&data, ALL_CLIENT_TYPES);
        let _ = parse_server(&data);
        let _ = parse_call_payload(&data);
        let _ = parse_pub_payload(&data);
        let _ = normalize_args(&data);
    }

    #[test]
    fn parse_never_panics_on_mutated_frames(pos in 0usize..120, byte in any::<u8>()) {
        let mut f = call(r#", "args": {"k": [1, "a\u00e9", null, true]}"#).into_bytes();
        let p = pos % f.len();
        f[p] = byte;
        let _ = parse_client(&f, ALL_CLIENT_TYPES);
    }

    #[test]
    fn args_roundtrip_semantically(v in json_value(), pretty in any::<bool>()) {
        let raw = if pretty { serde_json::to_vec_pretty(&v).unwrap() } else { serde_json::to_vec(&v).unwrap() };
        let f = build_call(U, "u", 1, Some(&raw)).unwrap();
        let m = parse_client(&f, ALL_CLIENT_TYPES).unwrap();
        let back: serde_json::Value = serde_json::from_slice(m.args.as_deref().unwrap()).unwrap();
        prop_assert_eq!(&back, &v);
        // normalization is idempotent and has no insignificant whitespace left
        let again = normalize_args(m.args.as_deref().unwrap()).unwrap();
        prop_assert_eq!(again.as_slice(), m.args.as_deref().unwrap());
        let res = build_res(U, "u", m.args.as_deref());
        let s = parse_server(&res).unwrap();
        let back: serde_json::Value = serde_json::from_slice(s.args.as_deref().unwrap()).unwrap();
        prop_assert_eq!(back, v);
    }

    #[test]
    fn strings_roundtrip(s in ".*") {
        let mut out = Vec::new();
        write_str(&mut out, &s);
        let back: String = serde_json::from_slice(&out).unwrap();
        prop_assert_eq!(back, s.clone());
        let f = build_sub(U, &s, false, false);
        let m = parse_client(&f, ALL_CLIENT_TYPES).unwrap();
        prop_assert_eq!(m.channel.as_deref(), Some(s.as_str()));
    }

    #[test]
    fn validation_agrees_with_serde(data in "[\\[\\]{}\",:0-9a-tv-z \\\\.eE+-]{0,40}") {
        let ours = normalize_args(data.as_bytes()).is_ok();
        let theirs = serde_json::from_str::<serde_json::Value>(&data).is_ok();
        prop_assert_eq!(ours, theirs, "{:?}", data);
    }
}
