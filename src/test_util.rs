//! Helpers shared by the crate's unit tests (compiled only for `cargo test`).

use std::time::{Duration, Instant};

/// Polls `condition` every millisecond for at most `limit`; whether it became true (it is
/// checked once more at the end, so a condition true at the limit counts).
pub(crate) fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    condition()
}
