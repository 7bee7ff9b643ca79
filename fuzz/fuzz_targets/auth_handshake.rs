//! The cluster-key handshake's decoders: hello, proof, challenge, verdict and the key file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooncake_rs::auth::protocol::fuzz(data);
});
