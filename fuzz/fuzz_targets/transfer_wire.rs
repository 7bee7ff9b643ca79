//! The TCP transfer protocol's 24-byte session header and 8-byte status frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_rs::transfer::wire::{SessionHeader, Status, HEADER_LEN, STATUS_LEN};

fuzz_target!(|data: &[u8]| {
    for chunk in data.chunks_exact(HEADER_LEN) {
        let bytes: [u8; HEADER_LEN] = chunk.try_into().expect("exact chunk");
        if let Ok(header) = SessionHeader::decode(&bytes) {
            assert_eq!(SessionHeader::decode(&header.encode()), Ok(header));
        }
    }
    for chunk in data.chunks_exact(STATUS_LEN) {
        let bytes: [u8; STATUS_LEN] = chunk.try_into().expect("exact chunk");
        if let Some(status) = Status::decode(&bytes) {
            assert_eq!(status.encode(), bytes);
        }
    }
});
