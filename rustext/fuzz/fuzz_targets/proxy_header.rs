//! The PROXY protocol v1/v2 reader (`accept_proxy`: the first bytes of a
//! connection, before anything else is trusted): any bytes never panic; a
//! header it accepts lies within the input, and every shorter beginning of it
//! asks for more bytes (never an error, never a different header), so a
//! header is read the same whatever the reads' cuts; the bytes after it are
//! left to the application untouched.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustext::balancer::proxyproto::{parse, MAX_HEADER};

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(Some((header, n))) => {
            assert!(n > 0 && n <= data.len() && n <= MAX_HEADER);
            for cut in 0..n {
                assert_eq!(parse(&data[..cut]), Ok(None), "a beginning of {cut} of {n} bytes");
            }
            assert_eq!(parse(&data[..n]), Ok(Some((header, n))));
            let mut more = data[..n].to_vec();
            more.extend_from_slice(b"GET / HTTP/1.1\r\n");
            assert_eq!(parse(&more), Ok(Some((header, n))));
        }
        Ok(None) => assert!(data.len() < MAX_HEADER),
        Err(_) => {}
    }
});
