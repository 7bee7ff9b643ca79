//! Tunables read from the environment once, when an engine is created (the variables, their
//! defaults and ranges are defined in `env.rs`).

use crate::env::{self, Knob};
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

/// Engine tunables. Plain values; copied into each component that needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Connect timeout and per-operation socket read/write timeout; on the server, the
    /// deadline of one request once it started (`MC_TRANSFER_TIMEOUT_MS`).
    pub(crate) io_timeout: Duration,
    /// Most slices one request is split into (also the most connections a caller uses to
    /// one peer at once), 1..=16 (`MC_TCP_LANES_PER_PEER`).
    pub(crate) lanes: usize,
    /// Most connections the data server holds at once; more are reset at once
    /// (`MC_TRANSFER_MAX_CONNECTIONS`).
    pub(crate) max_connections: usize,
    /// Most connections the data server holds at once from one peer IP address; more are
    /// reset at once (`MC_TRANSFER_MAX_CONNECTIONS_PER_PEER`).
    pub(crate) max_connections_per_peer: usize,
    /// How long the data server keeps a connection with no request in flight
    /// (`MC_TRANSFER_IDLE_TIMEOUT_MS`).
    pub(crate) idle_timeout: Duration,
    /// Whether the same-host channel is on (`MC_SAME_HOST`, default 1).
    pub(crate) same_host: bool,
    /// How long a refused same-host handshake is remembered (`MC_SAME_HOST_RETRY_MS`).
    pub(crate) same_host_retry: Duration,
    /// The bound of one same-host handshake (`MC_SAME_HOST_HANDSHAKE_MS`).
    pub(crate) same_host_handshake: Duration,
}

impl Default for Settings {
    /// Every tunable at its default.
    fn default() -> Settings {
        Settings::from_lookup(|knob| knob.default)
    }
}

impl Settings {
    /// Reads `MC_TRANSFER_TIMEOUT_MS` (default 60000, at least 1), `MC_TCP_LANES_PER_PEER`
    /// (default 4, 1..=16), `MC_TRANSFER_MAX_CONNECTIONS` (default 1024),
    /// `MC_TRANSFER_MAX_CONNECTIONS_PER_PEER` (default 256; both at least 1),
    /// `MC_TRANSFER_IDLE_TIMEOUT_MS` (default 300000, at least 1), `MC_SAME_HOST` (default 1),
    /// `MC_SAME_HOST_RETRY_MS` (default 5000) and `MC_SAME_HOST_HANDSHAKE_MS` (default 2000,
    /// at least 1). Unparsable values fall
    /// back to the defaults, out-of-range ones are clamped; both are logged.
    pub(crate) fn from_env() -> Settings {
        Settings::from_lookup(Knob::get)
    }

    /// The settings `value` (knob → its value) gives.
    fn from_lookup(value: impl Fn(&Knob) -> u64) -> Settings {
        let count = |knob: &Knob| usize::try_from(value(knob)).unwrap_or(usize::MAX);
        Settings {
            io_timeout: Duration::from_millis(value(&env::TRANSFER_TIMEOUT_MS)),
            lanes: count(&env::TCP_LANES_PER_PEER),
            max_connections: count(&env::TRANSFER_MAX_CONNECTIONS),
            max_connections_per_peer: count(&env::TRANSFER_MAX_CONNECTIONS_PER_PEER),
            idle_timeout: Duration::from_millis(value(&env::TRANSFER_IDLE_TIMEOUT_MS)),
            same_host: value(&env::SAME_HOST) == 1,
            same_host_retry: Duration::from_millis(value(&env::SAME_HOST_RETRY_MS)),
            same_host_handshake: Duration::from_millis(value(&env::SAME_HOST_HANDSHAKE_MS)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Settings {
        Settings::from_lookup(|knob| {
            knob.read(
                pairs
                    .iter()
                    .find(|(key, _)| *key == knob.name)
                    .map(|(_, value)| *value),
            )
        })
    }

    #[test]
    fn defaults_and_clamping() {
        let d = Settings::default();
        assert_eq!(d.io_timeout, Duration::from_secs(60));
        assert_eq!(d.lanes, 4);
        assert_eq!((d.max_connections, d.max_connections_per_peer), (1024, 256));
        assert_eq!(d.idle_timeout, Duration::from_secs(300));
        assert!(d.same_host);
        assert_eq!(d.same_host_retry, Duration::from_secs(5));
        assert_eq!(d.same_host_handshake, Duration::from_secs(2));
        let off = with(&[("MC_SAME_HOST", "0"), ("MC_SAME_HOST_RETRY_MS", "20")]);
        assert!(!off.same_host);
        assert_eq!(off.same_host_retry, Duration::from_millis(20));
        let s = with(&[
            ("MC_TRANSFER_TIMEOUT_MS", " 250 "),
            ("MC_TCP_LANES_PER_PEER", "99"),
            ("MC_TRANSFER_MAX_CONNECTIONS", "8"),
            ("MC_TRANSFER_MAX_CONNECTIONS_PER_PEER", "0"),
            ("MC_TRANSFER_IDLE_TIMEOUT_MS", "1500"),
        ]);
        assert_eq!(s.io_timeout, Duration::from_millis(250));
        assert_eq!(s.lanes, 16);
        assert_eq!((s.max_connections, s.max_connections_per_peer), (8, 1));
        assert_eq!(s.idle_timeout, Duration::from_millis(1500));
        let bad = with(&[
            ("MC_TCP_LANES_PER_PEER", "0"),
            ("MC_TRANSFER_MAX_CONNECTIONS", "-5"),
            ("MC_TRANSFER_IDLE_TIMEOUT_MS", "soon"),
        ]);
        assert_eq!(bad.lanes, 1);
        assert_eq!(bad.max_connections, 1024);
        assert_eq!(bad.idle_timeout, Duration::from_secs(300));
        assert_eq!(
            with(&[("MC_TRANSFER_TIMEOUT_MS", "0")]).io_timeout,
            Duration::from_millis(1)
        );
    }
}
