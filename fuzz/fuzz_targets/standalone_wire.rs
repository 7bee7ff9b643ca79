//! The frames between a dummy and its real client (`standalone/wire.rs`): headers, every
//! request kind's body, answers.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooncake_rs::standalone::fuzz_frames(data);
});
