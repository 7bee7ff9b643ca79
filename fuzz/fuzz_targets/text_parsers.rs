//! The text parsers: size strings, the tiered-backend JSON, the P2P direction, percent
//! decoding and query parameters.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_rs::client::parse_size;
use mooncake_rs::p2p::config::{TieredConfig, TransferDirection};
use mooncake_rs::rpc::http::{percent_decode, percent_encode};
use mooncake_rs::rpc::HttpRequest;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(size) = parse_size(text) {
        // A plain number round-trips exactly.
        if text.trim().bytes().all(|b| b.is_ascii_digit()) {
            assert_eq!(parse_size(&size.to_string()), Ok(size));
        }
    }
    let _ = TieredConfig::parse(text);
    let _ = TransferDirection::parse(text);
    if let Some(decoded) = percent_decode(text) {
        assert_eq!(percent_decode(&percent_encode(&decoded)), Some(decoded));
    }
    let request = HttpRequest {
        query: text.to_string(),
        ..HttpRequest::default()
    };
    let _ = request.query_param("key");
});
