//! RPC frames: a length-prefixed frame read from arbitrary bytes, its payload decoded as a
//! master request and response (plain and bounded), and the error-frame and outcome readers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_rs::master::{MasterRequest, MasterResponse};
use mooncake_rs::rpc::codec::{
    decode_bounded, decode_payload, encode_frame, enum_result_error, error_frame, read_frame,
};
use mooncake_rs::ErrorCode;

fuzz_target!(|data: &[u8]| {
    if let Ok(payload) = read_frame(&mut &data[..]) {
        assert!(payload.len() <= data.len());
    }
    if let Ok(request) = decode_payload::<MasterRequest>(data) {
        // What decodes re-encodes, and decodes back to the same request.
        let frame = encode_frame(&request).expect("a decoded request encodes");
        let again: MasterRequest = decode_payload(&frame[4..]).expect("re-encoded decodes");
        assert_eq!(format!("{again:?}"), format!("{request:?}"));
    }
    let _ = decode_payload::<MasterResponse>(data);
    let _ = decode_bounded::<MasterRequest>(data, 64);
    let _ = decode_bounded::<MasterResponse>(data, 64);
    let _ = enum_result_error(data);
    let _ = error_frame::<MasterResponse>(data, ErrorCode::InternalError);
});
