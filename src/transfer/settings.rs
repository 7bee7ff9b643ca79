//! Tunables read from the environment once, when an engine is created.

use crate::env::Knob;
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
const MAX_LANES: u64 = 16;
/// Upper bound of the two connection caps (far above any sane fd limit).
const MAX_CONNECTIONS: u64 = 1 << 20;
/// Upper bound of the timeouts: a week (keeps every `Instant + timeout` far from overflow).
const MAX_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;

/// `MC_TRANSFER_TIMEOUT_MS`: the I/O timeout (Mooncake's 60 s hard batch timeout).
const TIMEOUT_MS: Knob = Knob {
    name: "MC_TRANSFER_TIMEOUT_MS",
    default: 60_000,
    min: 1,
    max: MAX_TIMEOUT_MS,
};
/// `MC_TCP_LANES_PER_PEER`: slices per request (Mooncake's name and default).
const LANES: Knob = Knob {
    name: "MC_TCP_LANES_PER_PEER",
    default: 4,
    min: 1,
    max: MAX_LANES,
};
/// `MC_TRANSFER_MAX_CONNECTIONS`: connections the data server holds at once.
const MAX_CONNS: Knob = Knob {
    name: "MC_TRANSFER_MAX_CONNECTIONS",
    default: 1024,
    min: 1,
    max: MAX_CONNECTIONS,
};
/// `MC_TRANSFER_MAX_CONNECTIONS_PER_PEER`: connections the data server holds at once from
/// one peer IP address. One client process uses up to `MC_TCP_LANES_PER_PEER` connections
/// per concurrent request and pools at most 32 idle ones per peer, so 256 leaves room for
/// several busy processes behind one address.
const MAX_CONNS_PER_PEER: Knob = Knob {
    name: "MC_TRANSFER_MAX_CONNECTIONS_PER_PEER",
    default: 256,
    min: 1,
    max: MAX_CONNECTIONS,
};
/// `MC_TRANSFER_IDLE_TIMEOUT_MS`: how long the data server keeps a connection that has no
/// request in flight (5 minutes).
const IDLE_TIMEOUT_MS: Knob = Knob {
    name: "MC_TRANSFER_IDLE_TIMEOUT_MS",
    default: 300_000,
    min: 1,
    max: MAX_TIMEOUT_MS,
};

/// `MC_SAME_HOST`: 1 maps same-host peers' segments (and serves ours to them), 0 uses TCP.
const SAME_HOST: Knob = Knob {
    name: "MC_SAME_HOST",
    default: 1,
    min: 0,
    max: 1,
};
/// `MC_SAME_HOST_RETRY_MS`: how long a refused same-host handshake is remembered before the
/// peer is asked again.
const SAME_HOST_RETRY_MS: Knob = Knob {
    name: "MC_SAME_HOST_RETRY_MS",
    default: 5_000,
    min: 0,
    max: MAX_TIMEOUT_MS,
};
/// `MC_SAME_HOST_HANDSHAKE_MS`: the bound of one same-host handshake — its connect (a full
/// listen queue is a refusal at once), each socket read and write on both ends, and how long
/// a second caller waits for a handshake to the same peer already in flight before it uses
/// TCP.
const SAME_HOST_HANDSHAKE_MS: Knob = Knob {
    name: "MC_SAME_HOST_HANDSHAKE_MS",
    default: 2_000,
    min: 1,
    max: MAX_TIMEOUT_MS,
};

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
        Settings::from_lookup(|_| None)
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
        Settings::from_lookup(|name| std::env::var(name).ok())
    }

    /// The settings `lookup` (variable name → value) gives.
    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Settings {
        let read = |knob: &Knob| knob.read(lookup(knob.name).as_deref());
        let count = |knob: &Knob| usize::try_from(read(knob)).unwrap_or(usize::MAX);
        Settings {
            io_timeout: Duration::from_millis(read(&TIMEOUT_MS)),
            lanes: count(&LANES),
            max_connections: count(&MAX_CONNS),
            max_connections_per_peer: count(&MAX_CONNS_PER_PEER),
            idle_timeout: Duration::from_millis(read(&IDLE_TIMEOUT_MS)),
            same_host: read(&SAME_HOST) == 1,
            same_host_retry: Duration::from_millis(read(&SAME_HOST_RETRY_MS)),
            same_host_handshake: Duration::from_millis(read(&SAME_HOST_HANDSHAKE_MS)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Settings {
        Settings::from_lookup(|name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
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
