//! Counting handshakes and logging refusals without letting a scanner flood the log: a
//! refused peer (by IP address; all Unix-socket peers as one) is logged at most once a minute.
//!
//! Thread-safety: the counters are process-wide atomics (every server of the process adds to
//! them; `/metrics` and the client metrics show them); the log limiter is a small mutexed map,
//! bounded in entries.

use super::protocol::Refusal;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often one peer's refusals are logged at most.
const LOG_EVERY: Duration = Duration::from_secs(60);
/// Peers the limiter remembers (older entries are dropped when it is full).
const LOG_PEERS: usize = 4096;

static ACCEPTED: AtomicU64 = AtomicU64::new(0);
static REFUSED: [AtomicU64; Refusal::ALL.len()] = [const { AtomicU64::new(0) }; Refusal::ALL.len()];
static CLIENT_FAILED: AtomicU64 = AtomicU64::new(0);
static OPEN_LISTENERS: AtomicU64 = AtomicU64::new(0);
static RETIRED_CLOSED: AtomicU64 = AtomicU64::new(0);
/// When each peer was last logged; `None` stands for every peer without an address (the
/// same-host and standalone Unix sockets, whose peers are this host's processes).
static LOGGED: Mutex<Option<HashMap<Option<IpAddr>, Instant>>> = Mutex::new(None);

/// A snapshot of this process's handshake counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuthCounters {
    /// Handshakes this process's servers accepted.
    pub accepted: u64,
    /// Handshakes they refused, by reason, in the order of [`Refusal::ALL`].
    pub refused: [u64; Refusal::ALL.len()],
    /// Handshakes this process failed as a client (the server refused, or proved nothing).
    pub client_failed: u64,
    /// Listeners this process opened beyond loopback without a cluster key (each warned).
    pub open_listeners: u64,
    /// Connections its servers closed because the key they were admitted with was retired.
    pub retired_closed: u64,
}

impl AuthCounters {
    /// Refusals for one reason.
    pub fn refused_for(&self, reason: Refusal) -> u64 {
        self.refused[index(reason)]
    }

    /// All refusals.
    pub fn refused_total(&self) -> u64 {
        self.refused.iter().sum()
    }
}

/// The counters in Prometheus' text format: `mooncake_auth_handshakes_total{result=...}`
/// (`accepted` and each refusal reason) and `mooncake_auth_client_failures_total`.
pub fn prometheus_text() -> String {
    let now = counters();
    let mut text = String::from(
        "# HELP mooncake_auth_handshakes_total Cluster-key handshakes this process's servers accepted or refused, by result (tls_failed: TLS did not complete).\n# TYPE mooncake_auth_handshakes_total counter\n",
    );
    text += &format!(
        "mooncake_auth_handshakes_total{{result=\"accepted\"}} {}\n",
        now.accepted
    );
    for reason in Refusal::ALL {
        let count = now.refused_for(reason);
        text += &format!(
            "mooncake_auth_handshakes_total{{result=\"{}\"}} {count}\n",
            reason.label()
        );
    }
    text += "# HELP mooncake_auth_client_failures_total Cluster-key handshakes this process failed as a client.\n# TYPE mooncake_auth_client_failures_total counter\n";
    text += &format!(
        "mooncake_auth_client_failures_total {}\n",
        now.client_failed
    );
    text += "# HELP mooncake_auth_open_listeners_total Listeners this process opened beyond loopback without a cluster key.\n# TYPE mooncake_auth_open_listeners_total counter\n";
    text += &format!(
        "mooncake_auth_open_listeners_total {}\n",
        now.open_listeners
    );
    text += "# HELP mooncake_auth_retired_connections_closed_total Connections closed because the cluster key they were admitted with was retired.\n# TYPE mooncake_auth_retired_connections_closed_total counter\n";
    text + &format!(
        "mooncake_auth_retired_connections_closed_total {}\n",
        now.retired_closed
    )
}

fn index(reason: Refusal) -> usize {
    Refusal::ALL.iter().position(|r| *r == reason).unwrap_or(0)
}

/// The counters now.
pub fn counters() -> AuthCounters {
    let mut refused = [0; Refusal::ALL.len()];
    for (slot, counter) in refused.iter_mut().zip(&REFUSED) {
        *slot = counter.load(Ordering::Relaxed);
    }
    AuthCounters {
        accepted: ACCEPTED.load(Ordering::Relaxed),
        refused,
        client_failed: CLIENT_FAILED.load(Ordering::Relaxed),
        open_listeners: OPEN_LISTENERS.load(Ordering::Relaxed),
        retired_closed: RETIRED_CLOSED.load(Ordering::Relaxed),
    }
}

/// Counts a handshake a server accepted (for servers that drive [`super::protocol`]
/// themselves, as the same-host poll loop does).
pub fn accepted() {
    ACCEPTED.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn client_failed() {
    CLIENT_FAILED.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn retired_closed() {
    RETIRED_CLOSED.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn open_listener() {
    OPEN_LISTENERS.fetch_add(1, Ordering::Relaxed);
}

/// Counts a refusal by a `role` server of a connection from `peer`, and logs it unless that
/// peer's address was logged within the last minute.
pub fn refused(reason: Refusal, role: &str, peer: Option<IpAddr>) {
    REFUSED[index(reason)].fetch_add(1, Ordering::Relaxed);
    if should_log(peer, Instant::now()) {
        let peer = peer.map_or_else(|| "a local peer".to_owned(), |ip| ip.to_string());
        tracing::warn!(%peer, role, reason = reason.label(), "refused a connection: cluster-key or TLS handshake failed (further refusals of this peer are not logged for a minute)");
    }
}

/// Whether a refusal of `peer` at `now` is to be logged (records it when so).
fn should_log(peer: Option<IpAddr>, now: Instant) -> bool {
    let mut logged = LOGGED.lock();
    should_log_in(logged.get_or_insert_with(HashMap::new), peer, now)
}

/// [`should_log`] with the map of when each peer was last logged.
fn should_log_in(
    logged: &mut HashMap<Option<IpAddr>, Instant>,
    peer: Option<IpAddr>,
    now: Instant,
) -> bool {
    if logged
        .get(&peer)
        .is_some_and(|at| now.duration_since(*at) < LOG_EVERY)
    {
        return false;
    }
    if logged.len() >= LOG_PEERS {
        logged.retain(|_, at| now.duration_since(*at) < LOG_EVERY);
        if logged.len() >= LOG_PEERS {
            return false; // a flood of distinct peers: the counters still count them
        }
    }
    logged.insert(peer, now);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_logged_once_a_minute() {
        let peer: IpAddr = "192.0.2.77".parse().unwrap();
        let now = Instant::now();
        let mut logged = HashMap::new();
        let mut log = |peer, at| should_log_in(&mut logged, peer, at);
        assert!(log(Some(peer), now));
        assert!(!log(Some(peer), now + Duration::from_secs(30)));
        assert!(log(Some(peer), now + LOG_EVERY + Duration::from_secs(1)));
        // Unix-socket peers (no address) share one entry: logged once a minute too.
        assert!(log(None, now));
        assert!(!log(None, now + Duration::from_secs(30)));
        let before = counters();
        refused(Refusal::BadProof, "test", Some(peer));
        let after = counters();
        assert!(after.refused_for(Refusal::BadProof) > before.refused_for(Refusal::BadProof));
    }
}
