//! Client liveness: when each registered client last showed a sign of life (a mount, a
//! remount, a ping or a pin), and which clients never expire (an embedded master's own
//! client).
//!
//! Thread-safety: one `parking_lot::Mutex`, a leaf lock.

use crate::types::ClientId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A registered client's liveness.
#[derive(Clone, Copy)]
enum Seen {
    /// Last sign of life; expired `client_ttl` later.
    At(Instant),
    /// Alive as long as the master runs (never expired).
    Always,
}

/// Known clients and when each last showed a sign of life.
#[derive(Default)]
pub(crate) struct ClientTable {
    last_seen: Mutex<HashMap<ClientId, Seen>>,
}

impl ClientTable {
    /// Registers `client` (or refreshes it): its liveness timer (re)starts at `now`. A client
    /// kept alive by [`ClientTable::keep_alive`] stays so.
    pub(crate) fn register(&self, client: ClientId, now: Instant) {
        self.last_seen
            .lock()
            .entry(client)
            .and_modify(|seen| refresh(seen, now))
            .or_insert(Seen::At(now));
    }

    /// Registers `client` as alive for as long as the master runs: it is never expired.
    pub(crate) fn keep_alive(&self, client: ClientId) {
        self.last_seen.lock().insert(client, Seen::Always);
    }

    /// Refreshes a known client; `false` if the client is unknown (never registered, or
    /// expired).
    pub(crate) fn ping(&self, client: ClientId, now: Instant) -> bool {
        match self.last_seen.lock().get_mut(&client) {
            Some(seen) => {
                refresh(seen, now);
                true
            }
            None => false,
        }
    }

    /// Forgets and returns the clients not seen for `ttl`.
    pub(crate) fn expire(&self, now: Instant, ttl: Duration) -> Vec<ClientId> {
        let mut last_seen = self.last_seen.lock();
        let expired: Vec<ClientId> = last_seen
            .iter()
            .filter(|(_, seen)| match seen {
                Seen::At(at) => now.saturating_duration_since(*at) >= ttl,
                Seen::Always => false,
            })
            .map(|(client, _)| *client)
            .collect();
        for client in &expired {
            last_seen.remove(client);
        }
        expired
    }

    /// Number of live clients.
    pub(crate) fn len(&self) -> usize {
        self.last_seen.lock().len()
    }
}

/// Moves a timed client's last sign of life to `now`.
fn refresh(seen: &mut Seen, now: Instant) {
    if let Seen::At(at) = seen {
        *at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Uuid;

    #[test]
    fn a_kept_alive_client_never_expires_and_stays_kept_alive() {
        let table = ClientTable::default();
        let (timed, kept) = (Uuid::random(), Uuid::random());
        let start = Instant::now();
        table.register(timed, start);
        table.keep_alive(kept);
        table.register(kept, start);
        let later = start + Duration::from_secs(60);
        assert_eq!(table.expire(later, Duration::from_secs(1)), vec![timed]);
        assert!(table.ping(kept, later));
        assert!(!table.ping(timed, later));
        assert_eq!(table.len(), 1);
    }
}
