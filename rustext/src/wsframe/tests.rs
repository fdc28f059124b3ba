//! Tests of the frame reader and builders (unit and proptest).

use super::*;
use proptest::prelude::*;

const K: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

fn frame(fin: bool, op: u8, p: &[u8]) -> Vec<u8> {
    encode_client_frame(fin, op, p, K)
}

fn fail(code: u16, reason: &str) -> WsEvent {
    WsEvent::Fail { code, reason: reason.to_string() }
}

#[test]
fn rfc_example_masked_hello() {
    // RFC 6455 §5.7: a single-frame masked text message "Hello"
    let data = [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58];
    let mut r = FrameReader::new(0);
    assert_eq!(r.feed(&data), vec![WsEvent::Text(b"Hello".to_vec())]);
    assert_eq!(r.buffered(), 0);
}

#[test]
fn lengths_16_and_64_bit_and_byte_at_a_time() {
    let a = vec![b'a'; 300];
    let b = vec![b'b'; 70_000];
    let mut data = frame(true, 1, &a);
    data.extend(frame(true, 1, &b));
    assert_eq!(data[1] & 0x7F, 126);
    let mut r = FrameReader::new(0);
    let mut got = Vec::new();
    for byte in &data {
        got.extend(r.feed(std::slice::from_ref(byte)));
    }
    assert_eq!(got, vec![WsEvent::Text(a), WsEvent::Text(b)]);
    assert_eq!(r.buffered(), 0);
}

#[test]
fn fragments_and_interleaved_control() {
    let mut data = frame(false, 1, b"{\"a\":");
    data.extend(frame(true, 9, b"pi"));
    data.extend(frame(true, 10, b"po"));
    data.extend(frame(false, 0, b" 1"));
    data.extend(frame(true, 0, b"}"));
    let mut r = FrameReader::new(0);
    assert_eq!(
        r.feed(&data),
        vec![WsEvent::Ping(b"pi".to_vec()), WsEvent::Text(b"{\"a\": 1}".to_vec())]
    );
}

#[test]
fn protocol_errors() {
    let cases: Vec<(Vec<u8>, WsEvent)> = vec![
        (vec![0x81 | 0x40, 0x80, 0, 0, 0, 0], fail(1002, "protocol error")),
        (vec![0x81, 0x00], fail(1002, "protocol error")),
        ([frame(false, 1, b"a"), frame(true, 1, b"b")].concat(), fail(1002, "expected a continuation frame")),
        (frame(true, 0, b"a"), fail(1002, "unexpected continuation frame")),
        (frame(false, 9, b""), fail(1002, "invalid control frame")),
        (frame(true, 9, &[0; 126]), fail(1002, "invalid control frame")),
        (frame(true, 8, b"\x03"), fail(1002, "invalid close frame")),
        (frame(true, 3, b""), fail(1002, "reserved opcode 3")),
        (frame(true, 11, b""), fail(1002, "reserved opcode 11")),
    ];
    for (data, want) in cases {
        let mut r = FrameReader::new(0);
        assert_eq!(r.feed(&data), vec![want], "{data:?}");
        assert!(r.is_done());
        assert_eq!(r.buffered(), 0);
    }
}

#[test]
fn text_must_be_utf8_checked_fragment_by_fragment() {
    let euro = "€".as_bytes(); // 3 bytes
    let mut data = frame(false, 1, &euro[..1]);
    data.extend(frame(false, 0, &euro[1..]));
    data.extend(frame(true, 0, b"!"));
    assert_eq!(FrameReader::new(0).feed(&data), vec![WsEvent::Text("€!".as_bytes().to_vec())]);
    assert_eq!(FrameReader::new(0).feed(&frame(true, 1, b"\xff")), vec![fail(1007, INVALID_TEXT)]);
    // an invalid byte fails at once, before the message ends
    let mut r = FrameReader::new(0);
    assert_eq!(r.feed(&frame(false, 1, b"ok\xc0\xaf")), vec![fail(1007, INVALID_TEXT)]);
    // a character left incomplete by the last fragment
    let mut r = FrameReader::new(0);
    assert!(r.feed(&frame(false, 1, &euro[..2])).is_empty());
    assert_eq!(r.feed(&frame(true, 0, b"")), vec![fail(1007, INVALID_TEXT)]);
    // surrogates encoded in UTF-8 (CESU) are not UTF-8
    assert_eq!(FrameReader::new(0).feed(&frame(true, 1, b"\xed\xa0\x80")), vec![fail(1007, INVALID_TEXT)]);
}

#[test]
fn close_codes_and_reasons_are_checked() {
    for code in [1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999] {
        let mut p = code.to_be_bytes().to_vec();
        p.extend(b"bye");
        assert_eq!(FrameReader::new(0).feed(&frame(true, 8, &p)), vec![WsEvent::Close(p.clone())], "{code}");
    }
    for code in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535] {
        let got = FrameReader::new(0).feed(&frame(true, 8, &code.to_be_bytes()));
        assert_eq!(got, vec![fail(1002, &format!("invalid close code {code}"))]);
    }
    let mut p = 1000u16.to_be_bytes().to_vec();
    p.extend(b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80");
    assert_eq!(FrameReader::new(0).feed(&frame(true, 8, &p)), vec![fail(1007, "invalid UTF-8 in a close reason")]);
    assert_eq!(FrameReader::new(0).feed(&frame(true, 8, b"")), vec![WsEvent::Close(Vec::new())]);
}

#[test]
fn header_errors_need_the_whole_length_field() {
    // an unmasked frame with a 16-bit length is judged once the length is readable
    let mut r = FrameReader::new(0);
    assert!(r.feed(&[0x81, 126, 0]).is_empty());
    assert_eq!(r.feed(&[1]), vec![fail(1002, "protocol error")]);
}

#[test]
fn limit_counts_held_fragments_and_fires_before_the_payload() {
    let mut r = FrameReader::new(10);
    assert!(r.feed(&frame(false, 1, b"123456")).is_empty());
    // 5 more would make 11: refused from the header alone
    let next = frame(true, 0, b"12345");
    assert_eq!(r.feed(&next[..2]), vec![fail(1009, "message too big")]);
    assert!(r.feed(&next[2..]).is_empty());

    let mut r = FrameReader::new(10);
    let mut data = frame(false, 1, b"123456");
    data.extend(frame(true, 0, b"1234"));
    assert_eq!(r.feed(&data), vec![WsEvent::Text(b"1234561234".to_vec())]);
    // a huge 64-bit length does not overflow
    let mut r = FrameReader::new(10);
    let mut h = vec![0x81, 0xFF];
    h.extend((1u64 << 62).to_be_bytes());
    assert_eq!(r.feed(&h), vec![fail(1009, "message too big")]);
    let mut r = FrameReader::new(0);
    h.extend(K);
    assert!(r.feed(&h).is_empty());
    // the most significant bit of a 64-bit length must be 0 (§5.2)
    let mut h = vec![0x81, 0xFF];
    h.extend(u64::MAX.to_be_bytes());
    assert_eq!(FrameReader::new(0).feed(&h), vec![fail(1002, "protocol error")]);
}

#[test]
fn finished_after_close_or_binary() {
    let mut r = FrameReader::new(0);
    let mut data = frame(true, 8, b"\x03\xe8bye");
    data.extend(frame(true, 1, b"late"));
    assert_eq!(r.feed(&data), vec![WsEvent::Close(b"\x03\xe8bye".to_vec())]);
    assert!(r.feed(&frame(true, 1, b"x")).is_empty());
    let mut r = FrameReader::new(0);
    let mut data = frame(true, 1, b"a");
    data.extend(frame(true, 2, b"bin"));
    data.extend(frame(true, 1, b"b"));
    assert_eq!(r.feed(&data), vec![WsEvent::Text(b"a".to_vec()), WsEvent::Binary]);
    assert!(r.is_done());
    let mut r = FrameReader::new(0);
    assert_eq!(r.feed(&frame(true, 8, b"")), vec![WsEvent::Close(vec![])]);
}

#[test]
fn server_frames() {
    // RFC 6455 §5.7: a single-frame unmasked text message "Hello"
    assert_eq!(encode_text_frames(&[b"Hello"]), [0x81, 0x05, b'H', b'e', b'l', b'l', b'o']);
    let mid = vec![b'm'; 300];
    let big = vec![b'b'; 70_000];
    let out = encode_text_frames(&[&b""[..], &mid, &big]);
    assert_eq!(&out[..2], [0x81, 0]);
    assert_eq!(&out[2..6], [0x81, 126, 0x01, 0x2C]);
    assert_eq!(&out[306..316], [0x81, 127, 0, 0, 0, 0, 0, 0x01, 0x11, 0x70]);
    assert_eq!(out.len(), 2 + 4 + 300 + 10 + 70_000);
    assert_eq!(encode_close_frame(1001, b"going"), [0x88, 7, 0x03, 0xE9, b'g', b'o', b'i', b'n', b'g']);
    assert_eq!(encode_close_frame(1000, &[b'r'; 200]).len(), 2 + 125);
    let mut pong = Vec::new();
    encode_server_frame(&mut pong, 10, b"hi");
    assert_eq!(pong, [0x8A, 2, b'h', b'i']);
}

fn zframe(fin: bool, op: u8, p: &[u8]) -> Vec<u8> {
    let mut f = frame(fin, op, p);
    f[0] |= 0x40;
    f
}

fn deflating(limit: u64, takeover: bool) -> FrameReader {
    let mut r = FrameReader::new(limit);
    r.enable_deflate(takeover);
    r
}

#[test]
fn rsv1_only_where_deflate_allows_it() {
    let z = crate::wsdeflate::Deflater::new(1).compress(b"hello");
    // not agreed: any RSV bit is a protocol error
    assert_eq!(FrameReader::new(0).feed(&zframe(true, 1, &z)), vec![fail(1002, "protocol error")]);
    // agreed: RSV1 on a text frame is a compressed message
    assert_eq!(deflating(0, false).feed(&zframe(true, 1, &z)), vec![WsEvent::Text(b"hello".to_vec())]);
    // never on a continuation frame, a control frame, nor RSV2/RSV3
    let mut r = deflating(0, false);
    let mut data = frame(false, 1, b"he");
    data.extend(zframe(true, 0, b"llo"));
    assert_eq!(r.feed(&data), vec![fail(1002, "protocol error")]);
    for op in [8u8, 9, 10] {
        assert_eq!(deflating(0, false).feed(&zframe(true, op, b"")), vec![fail(1002, "protocol error")], "{op}");
    }
    for bits in [0x20u8, 0x10, 0x60, 0x50] {
        let mut f = frame(true, 1, b"x");
        f[0] |= bits;
        assert_eq!(deflating(0, false).feed(&f), vec![fail(1002, "protocol error")], "{bits:#x}");
    }
    // a binary message, compressed or not, is reported and ends the stream
    assert_eq!(deflating(0, false).feed(&zframe(true, 2, &z)), vec![WsEvent::Binary]);
}

#[test]
fn fragmented_compressed_messages_and_plain_ones_mix() {
    let text = "ünïcödé ".repeat(200);
    let z = crate::wsdeflate::Deflater::new(6).compress(text.as_bytes());
    let mut data = zframe(false, 1, &z[..1]);
    data.extend(frame(true, 9, b"ping in between"));
    data.extend(frame(false, 0, &z[1..z.len() / 2]));
    data.extend(frame(true, 0, &z[z.len() / 2..]));
    data.extend(frame(true, 1, b"plain"));
    data.extend(zframe(true, 1, &crate::wsdeflate::Deflater::new(1).compress(b"")));
    let want = vec![
        WsEvent::Ping(b"ping in between".to_vec()),
        WsEvent::Text(text.clone().into_bytes()),
        WsEvent::Text(b"plain".to_vec()),
        WsEvent::Text(Vec::new()),
    ];
    assert_eq!(deflating(0, false).feed(&data), want);
    // byte by byte, the same
    let mut r = deflating(0, true);
    let got: Vec<WsEvent> = data.chunks(1).flat_map(|c| r.feed(c)).collect();
    assert_eq!(got, want);
    assert_eq!(r.buffered(), 0);
}

#[test]
fn a_deflate_bomb_is_too_big_and_bad_data_invalid() {
    let bomb = crate::wsdeflate::Deflater::new(9).compress(&vec![b'a'; 4 << 20]);
    assert!(bomb.len() < 10_000);
    assert_eq!(deflating(1 << 16, false).feed(&zframe(true, 1, &bomb)), vec![fail(1009, "message too big")]);
    // fragmented: the inflated fragments held count too
    let mut r = deflating(1 << 16, false);
    let mut data = zframe(false, 1, &bomb[..bomb.len() / 2]);
    data.extend(frame(true, 0, &bomb[bomb.len() / 2..]));
    assert_eq!(r.feed(&data), vec![fail(1009, "message too big")]);
    assert!(r.is_done());
    assert_eq!(r.buffered(), 0);
    assert_eq!(deflating(0, false).feed(&zframe(true, 1, b"\xff\xff\xff\xff")), vec![fail(1007, "invalid compressed data")]);
    // inflated text is still checked as UTF-8
    let z = crate::wsdeflate::Deflater::new(1).compress(b"\xc0\xaf");
    assert_eq!(deflating(0, false).feed(&zframe(true, 1, &z)), vec![fail(1007, INVALID_TEXT)]);
}

#[test]
fn mask_alignment() {
    for n in 0..100 {
        let p: Vec<u8> = (0..n as u8).collect();
        let mut m = p.clone();
        apply_mask(&mut m, K);
        for (i, (a, b)) in p.iter().zip(&m).enumerate() {
            assert_eq!(a ^ K[i % 4], *b);
        }
    }
}

#[derive(Clone, Debug)]
enum F {
    Text(Vec<u8>, usize),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
}

fn arb_frame() -> impl Strategy<Value = F> {
    prop_oneof![
        // valid UTF-8, fragmented at any byte (characters split between fragments)
        4 => (any::<String>(), 0usize..4).prop_map(|(p, k)| F::Text(p.into_bytes(), k)),
        1 => proptest::collection::vec(any::<u8>(), 0..126).prop_map(F::Ping),
        1 => proptest::collection::vec(any::<u8>(), 0..126).prop_map(F::Pong),
    ]
}

/// A valid stream (text messages in `k + 1` fragments, pings, pongs) and the events it gives.
fn stream(frames: &[F], key: [u8; 4]) -> (Vec<u8>, Vec<WsEvent>) {
    let mut data = Vec::new();
    let mut want = Vec::new();
    for f in frames {
        match f {
            F::Text(p, k) => {
                let parts = k + 1;
                let step = p.len().div_ceil(parts).max(1);
                let chunks: Vec<&[u8]> = if p.is_empty() { vec![&p[..]] } else { p.chunks(step).collect() };
                for (i, c) in chunks.iter().enumerate() {
                    let op = if i == 0 { 1 } else { 0 };
                    data.extend(encode_client_frame(i + 1 == chunks.len(), op, c, key));
                }
                want.push(WsEvent::Text(p.clone()));
            }
            F::Ping(p) => {
                data.extend(encode_client_frame(true, 9, p, key));
                want.push(WsEvent::Ping(p.clone()));
            }
            F::Pong(p) => data.extend(encode_client_frame(true, 10, p, key)),
        }
    }
    (data, want)
}

proptest! {
    #[test]
    fn any_split_gives_the_same_events(
        frames in proptest::collection::vec(arb_frame(), 0..12),
        key in any::<[u8; 4]>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let (data, want) = stream(&frames, key);
        let mut whole = FrameReader::new(0);
        prop_assert_eq!(&whole.feed(&data), &want);
        prop_assert_eq!(whole.buffered(), 0);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| if data.is_empty() { 0 } else { c % data.len() }).collect();
        cuts.sort_unstable();
        let mut r = FrameReader::new(0);
        let mut got = Vec::new();
        let mut last = 0;
        for c in cuts.into_iter().chain(std::iter::once(data.len())) {
            got.extend(r.feed(&data[last..c]));
            last = c;
        }
        prop_assert_eq!(got, want);
        prop_assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
        limit in prop_oneof![Just(0u64), 0u64..200],
    ) {
        let mut r = FrameReader::new(limit);
        for c in &chunks {
            for ev in r.feed(c) {
                if let WsEvent::Fail { code, .. } = ev {
                    prop_assert!(code == 1002 || code == 1007 || code == 1009);
                    prop_assert!(r.is_done());
                }
            }
        }
    }

    #[test]
    fn compressed_streams_give_the_same_events_at_any_split(
        frames in proptest::collection::vec(arb_frame(), 0..8),
        key in any::<[u8; 4]>(),
        cut in 1usize..40,
        takeover in any::<bool>(),
    ) {
        // the same messages, compressed (each text message's first frame RSV1)
        let mut z = crate::wsdeflate::Deflater::new(6);
        let mut data = Vec::new();
        let mut want = Vec::new();
        for f in &frames {
            match f {
                F::Text(p, k) => {
                    let c = z.compress(p);
                    let step = c.len().div_ceil(k + 1).max(1);
                    let chunks: Vec<&[u8]> = c.chunks(step).collect();
                    for (i, ch) in chunks.iter().enumerate() {
                        let mut fr = encode_client_frame(i + 1 == chunks.len(), if i == 0 { 1 } else { 0 }, ch, key);
                        if i == 0 {
                            fr[0] |= 0x40;
                        }
                        data.extend(fr);
                    }
                    want.push(WsEvent::Text(p.clone()));
                }
                F::Ping(p) => {
                    data.extend(encode_client_frame(true, 9, p, key));
                    want.push(WsEvent::Ping(p.clone()));
                }
                F::Pong(p) => data.extend(encode_client_frame(true, 10, p, key)),
            }
        }
        let mut r = FrameReader::new(0);
        r.enable_deflate(takeover);
        let got: Vec<WsEvent> = data.chunks(cut).flat_map(|c| r.feed(c)).collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn arbitrary_bytes_never_panic_with_deflate(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
        limit in prop_oneof![Just(0u64), 1u64..2000],
    ) {
        let mut r = FrameReader::new(limit);
        r.enable_deflate(true);
        for c in &chunks {
            for ev in r.feed(c) {
                if let WsEvent::Text(t) = &ev {
                    prop_assert!(limit == 0 || t.len() as u64 <= limit);
                }
                if let WsEvent::Fail { code, .. } = ev {
                    prop_assert!(code == 1002 || code == 1007 || code == 1009);
                }
            }
        }
    }

    #[test]
    fn mask_round_trips(p in proptest::collection::vec(any::<u8>(), 0..100), key in any::<[u8; 4]>()) {
        let mut m = p.clone();
        apply_mask(&mut m, key);
        for (i, (a, b)) in p.iter().zip(&m).enumerate() {
            prop_assert_eq!(a ^ key[i % 4], *b);
        }
        apply_mask(&mut m, key);
        prop_assert_eq!(m, p);
    }
}
