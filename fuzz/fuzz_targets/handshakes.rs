//! The handshakes: the same-host hello and welcome, the RDMA handshake's request payload and
//! the reply its initiator reads.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooncake_rs::transfer::fuzz_handshakes(data);
});
