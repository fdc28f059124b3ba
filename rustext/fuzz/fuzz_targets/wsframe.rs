//! The websocket frame reader (client frames, RFC 6455): any bytes, cut at
//! any points, never panic; the events do not depend on the cuts; a finished
//! reader stays finished; what it holds is bounded by the read limit. The cut
//! byte's high bit turns permessage-deflate on (context takeover on or off by
//! the limit byte's low bit): compressed messages inflate to at most the limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustext::wsframe::{FrameReader, WsEvent};

fuzz_target!(|input: &[u8]| {
    if input.len() < 3 {
        return;
    }
    let limit = u64::from(input[0]) * 16; // 0 (none) up to 4080 bytes
    let deflate = input[1] & 0x80 != 0;
    let cut = usize::from(input[1] & 0x7F) % 16 + 1;
    let data = &input[2..];
    let reader = || {
        let mut r = FrameReader::new(limit);
        if deflate {
            r.enable_deflate(input[0] & 1 == 1);
        }
        r
    };
    // a compressed frame may exceed its inflated size by a little (as the reader allows)
    let slack = if deflate { 64 + (limit >> 10) } else { 0 };

    let mut whole = reader();
    let want = whole.feed(data);

    let mut split = reader();
    let mut got = Vec::new();
    for chunk in data.chunks(cut) {
        got.extend(split.feed(chunk));
        if limit != 0 {
            // a partial frame header (up to 14 bytes) plus at most `limit` bytes of message
            assert!(split.buffered() as u64 <= limit + slack + 14 + cut as u64 + 4, "held {} with limit {limit}", split.buffered());
        }
    }
    assert_eq!(got, want);
    for ev in &want {
        match ev {
            WsEvent::Text(t) => {
                assert!(std::str::from_utf8(t).is_ok());
                assert!(limit == 0 || t.len() as u64 <= limit);
            }
            WsEvent::Ping(p) => assert!(p.len() <= 125),
            WsEvent::Close(p) => assert!(p.len() != 1 && p.len() <= 125),
            WsEvent::Fail { code, .. } => assert!(matches!(code, 1002 | 1007 | 1009)),
            WsEvent::Binary => {}
        }
    }
    if whole.is_done() {
        assert!(whole.feed(data).is_empty());
        assert_eq!(whole.buffered(), 0);
    }
});
