//! Tunables read from the environment once, when an engine is created.

use std::time::Duration;

/// Smallest part a request is split into for parallel lanes.
pub(crate) const MIN_SLICE: u64 = 1 << 20;
/// Largest slice that is pipelined with other small slices to the same peer; larger ones
/// get a connection each.
pub(crate) const PIPELINE_MAX_SLICE: usize = 64 << 10;
/// Most slices in one pipelined group before another lane is used.
pub(crate) const PIPELINE_GROUP_SLICES: usize = 32;
/// Payload bytes per pipelined group before another lane is used.
pub(crate) const PIPELINE_GROUP_BYTES: usize = 256 << 10;
/// Upper bound of `MC_TCP_LANES_PER_PEER`.
const MAX_LANES: usize = 16;
/// Default of `MC_TCP_LANES_PER_PEER`.
const DEFAULT_LANES: usize = 4;
/// Default of `MC_TRANSFER_TIMEOUT_MS` (Mooncake's 60 s hard batch timeout).
const DEFAULT_TIMEOUT_MS: u64 = 60_000;

/// Engine tunables. Plain values; copied into each component that needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Connect timeout and per-operation socket read/write timeout.
    pub(crate) io_timeout: Duration,
    /// Most slices one request is split into (also the most connections a caller uses to
    /// one peer at once), 1..=16.
    pub(crate) lanes: usize,
}

impl Settings {
    /// Reads `MC_TRANSFER_TIMEOUT_MS` (default 60000, at least 1) and `MC_TCP_LANES_PER_PEER`
    /// (default 4, clamped to 1..=16). Unparsable values fall back to the defaults.
    pub(crate) fn from_env() -> Settings {
        Settings::from_values(
            std::env::var("MC_TRANSFER_TIMEOUT_MS").ok().as_deref(),
            std::env::var("MC_TCP_LANES_PER_PEER").ok().as_deref(),
        )
    }

    fn from_values(timeout_ms: Option<&str>, lanes: Option<&str>) -> Settings {
        let timeout_ms = timeout_ms
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_TIMEOUT_MS)
            .max(1);
        let lanes = lanes
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(DEFAULT_LANES)
            .clamp(1, MAX_LANES);
        Settings {
            io_timeout: Duration::from_millis(timeout_ms),
            lanes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_clamping() {
        let d = Settings::from_values(None, None);
        assert_eq!(d.io_timeout, Duration::from_secs(60));
        assert_eq!(d.lanes, 4);
        let s = Settings::from_values(Some(" 250 "), Some("99"));
        assert_eq!(s.io_timeout, Duration::from_millis(250));
        assert_eq!(s.lanes, 16);
        assert_eq!(Settings::from_values(Some("x"), Some("0")).lanes, 1);
        assert_eq!(
            Settings::from_values(Some("0"), None)
                .io_timeout
                .as_millis(),
            1
        );
    }
}
