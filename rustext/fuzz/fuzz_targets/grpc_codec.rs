//! seq's gRPC framing and hand-written protobuf codec: any bytes never
//! panic; a message that decodes encodes to bytes that decode to the same
//! message; the length-prefixed framing round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustext::grpc::frame::{encode_message, parse_timeout, percent_decode, unary_message};
use rustext::grpc::proto::{CurIdReply, CurIdRequest, NextIdReply, NextIdRequest, SetIdReply, SetIdRequest};

macro_rules! round_trip {
    ($ty:ty, $data:expr) => {
        if let Ok(m) = <$ty>::decode($data) {
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            assert_eq!(<$ty>::decode(&bytes).expect("what we encoded decodes"), m);
        }
    };
}

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = unary_message(data, 1 << 20) {
        let mut framed = Vec::new();
        encode_message(msg, &mut framed);
        assert_eq!(unary_message(&framed, 1 << 20).expect("framing round-trips"), msg);
    }
    round_trip!(NextIdRequest, data);
    round_trip!(NextIdReply, data);
    round_trip!(CurIdRequest, data);
    round_trip!(CurIdReply, data);
    round_trip!(SetIdRequest, data);
    round_trip!(SetIdReply, data);
    let _ = parse_timeout(data);
    let _ = percent_decode(data);
});
