//! The juggler.0 envelope parsers and the JSON scanner behind them: any bytes
//! never panic; `args` the scanner accepts are JSON serde_json accepts too,
//! and normalizing is idempotent. Two things RFC 8259's grammar allows (and
//! Go's and Python's decoders take) but serde_json refuses are set aside
//! before comparing: `\u` escapes of UTF-16 surrogates, paired or not, and
//! numbers beyond f64's range.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustext::juggler::{normalize_args, parse_call_payload, parse_client, parse_pub_payload, parse_server};

/// `json` with every `\uD800`–`\uDFFF` escape replaced by `\u0041`.
fn without_surrogate_escapes(json: &[u8]) -> Vec<u8> {
    let mut out = json.to_vec();
    let mut i = 0;
    while i + 1 < out.len() {
        if out[i] == b'\\' {
            if out[i + 1] == b'u' && i + 5 < out.len() {
                let hex = &out[i + 2..i + 6];
                if matches!(hex[0], b'd' | b'D') && matches!(hex[1], b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F') {
                    out[i + 2..i + 6].copy_from_slice(b"0041");
                }
            }
            i += 2; // an escape is two bytes at least: `\\` must not start another
        } else {
            i += 1;
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let _ = parse_client(data, u32::MAX);
    let _ = parse_server(data);
    let _ = parse_call_payload(data);
    let _ = parse_pub_payload(data);
    if let Ok(norm) = normalize_args(data) {
        if let Err(e) = serde_json::from_slice::<serde_json::Value>(&without_surrogate_escapes(&norm)) {
            assert!(e.to_string().contains("number out of range"), "scanner accepted invalid JSON: {e}");
        }
        assert_eq!(normalize_args(&norm).ok().as_deref(), Some(&norm[..]), "normalizing is not idempotent");
    }
});
