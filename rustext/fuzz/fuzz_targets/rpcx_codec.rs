//! The rpcx codec: any bytes never panic; a message that decodes encodes back
//! to the same bytes' meaning (decode(encode(m)) == m); the stream splitter
//! gives the same messages whatever the cuts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustext::rpcx::{decode, frame_len, Limits, Stream};

fuzz_target!(|input: &[u8]| {
    if input.is_empty() {
        return;
    }
    let cut = usize::from(input[0]) % 32 + 1;
    let data = &input[1..];
    let limits = Limits::default();
    let _ = frame_len(data, &limits);
    if let Ok(msg) = decode(data, &limits) {
        let owned = msg.to_owned();
        if let Ok(bytes) = owned.encode() {
            let again = decode(&bytes, &limits).expect("a message we encoded decodes");
            assert_eq!(again.to_owned(), owned);
        }
    }
    let collect = |chunks: &mut dyn Iterator<Item = &[u8]>| {
        let mut stream = Stream::new(Limits::default());
        let mut out = Vec::new();
        for chunk in chunks {
            let fed = stream.feed(chunk, |m| {
                out.push(m.to_owned());
                Ok::<(), ()>(())
            });
            if fed.is_err() {
                out.push(Default::default());
                break;
            }
        }
        out
    };
    let whole = collect(&mut std::iter::once(data));
    let split = collect(&mut data.chunks(cut));
    assert_eq!(whole, split);
});
