//! Tests of the rpcx codec (no Python).
use super::*;
use proptest::prelude::*;

fn sample() -> Message {
    Message {
        header: Header { serialize: 1, seq: 1, ..Header::default() },
        service_path: "Arith".into(),
        service_method: "Mul".into(),
        metadata: vec![],
        payload: br#"{"A":10,"B":20}"#.to_vec(),
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn request_json_vector() {
    let wire = hex("08000010000000000000000100000027000000054172697468000000034d756c000000000000000f7b2241223a31302c2242223a32307d");
    assert_eq!(sample().encode().unwrap(), wire);
    assert_eq!(decode(&wire, &Limits::default()).unwrap().to_owned(), sample());
}

#[test]
fn rejects() {
    let wire = sample().encode().unwrap();
    let l = Limits::default();
    assert_eq!(decode(&[], &l), Err(RpcxError::Truncated("header")));
    assert_eq!(decode(&[9], &l), Err(RpcxError::BadMagic(9)));
    assert!(matches!(decode(&wire[..wire.len() - 1], &l), Err(RpcxError::Truncated(_))));
    let mut long = wire.clone();
    long.push(0);
    assert_eq!(decode(&long, &l), Err(RpcxError::Trailing(1)));
    let small = Limits { max_message_len: 16, ..l };
    assert!(matches!(decode(&wire, &small), Err(RpcxError::TooLong { .. })));
}

#[test]
fn gzip_roundtrip_and_bomb_limit() {
    let mut m = sample();
    m.header.compress = COMPRESS_GZIP;
    m.payload = vec![b'x'; 100_000];
    let wire = m.encode().unwrap();
    assert!(wire.len() < 2000);
    assert_eq!(decode(&wire, &Limits::default()).unwrap().to_owned(), m);
    let tight = Limits { max_decompressed: 99_999, ..Limits::default() };
    assert_eq!(decode(&wire, &tight), Err(RpcxError::DecompressedTooLarge(99_999)));
}

#[test]
fn duplicate_keys_last_wins() {
    let mut m = sample();
    m.metadata = vec![("a".into(), "1".into()), ("b".into(), "x".into()), ("a".into(), "2".into())];
    let wire = m.encode().unwrap();
    let d = decode(&wire, &Limits::default()).unwrap();
    assert_eq!(d.metadata, vec![("b", "x"), ("a", "2")]);
}

#[test]
fn stream_splits_and_fails_fast_on_garbage() {
    let mut wire = sample().encode().unwrap();
    wire.extend(sample().encode().unwrap());
    let mut s = Stream::new(Limits::default());
    let mut n = 0;
    for c in wire.chunks(7) {
        s.feed(c, |m| {
            assert_eq!(m.service_path, "Arith");
            n += 1;
            Ok::<(), ()>(())
        })
        .unwrap();
    }
    assert_eq!(n, 2);
    let mut s = Stream::new(Limits::default());
    assert_eq!(s.feed(b"G", |_| Ok::<(), ()>(())), Err(StreamError::Rpcx(RpcxError::BadMagic(b'G'))));
}

#[test]
fn encode_rejects_bad_fields() {
    let mut m = sample();
    m.header.compress = 2;
    assert_eq!(m.encode(), Err(RpcxError::UnsupportedCompressor(2)));
    m.header.compress = 0;
    m.header.serialize = 16;
    assert!(matches!(m.encode(), Err(RpcxError::Invalid(_))));
}

fn arb_message() -> impl Strategy<Value = Message> {
    (
        (any::<bool>(), any::<bool>(), any::<bool>(), 0u8..2, 0u8..4, 0u8..16, any::<u64>()),
        ".{0,20}",
        ".{0,20}",
        proptest::collection::vec(("[a-z]{1,3}", ".{0,8}"), 0..6),
        proptest::collection::vec(any::<u8>(), 0..500),
    )
        .prop_map(|((response, heartbeat, oneway, compress, status, serialize, seq), p, me, meta, payload)| {
            let mut metadata: Vec<(String, String)> = meta;
            // decode keeps one pair per key: generate unique keys.
            let mut seen = std::collections::HashSet::new();
            metadata.retain(|(k, _)| seen.insert(k.clone()));
            Message {
                header: Header { response, heartbeat, oneway, compress, status, serialize, seq },
                service_path: p,
                service_method: me,
                metadata,
                payload,
            }
        })
}

proptest! {
    #[test]
    fn decode_encode_roundtrip(m in arb_message()) {
        let wire = m.encode().unwrap();
        prop_assert_eq!(decode(&wire, &Limits::default()).unwrap().to_owned(), m);
    }

    #[test]
    fn stream_any_chunking(ms in proptest::collection::vec(arb_message(), 0..6), chunk in 1usize..100) {
        let mut wire = Vec::new();
        for m in &ms { wire.extend(m.encode().unwrap()); }
        let mut s = Stream::new(Limits::default());
        let mut got = Vec::new();
        for c in wire.chunks(chunk) {
            s.feed(c, |m| { got.push(m.to_owned()); Ok::<(), ()>(()) }).unwrap();
        }
        prop_assert_eq!(got, ms);
    }

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        let limits = Limits { max_message_len: 256, max_decompressed: 1024 };
        let _ = decode(&data, &limits);
        let mut d = data.clone();
        if !d.is_empty() { d[0] = MAGIC; }
        let _ = decode(&d, &limits);
        let mut s = Stream::new(limits);
        let _ = s.feed(&d, |_| Ok::<(), ()>(()));
        prop_assert!(s.buffered() <= HEADER_LEN + 256);
    }

    #[test]
    fn mutated_frames_never_panic(m in arb_message(), pos in any::<usize>(), byte in any::<u8>()) {
        let mut wire = m.encode().unwrap();
        let i = pos % wire.len();
        wire[i] = byte;
        let _ = decode(&wire, &Limits { max_message_len: 4096, max_decompressed: 4096 });
    }
}
