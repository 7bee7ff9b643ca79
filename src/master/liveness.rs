//! Client liveness: the last ping time of every client that mounted a segment.
//!
//! Thread-safety: one `parking_lot::Mutex`, a leaf lock.

use crate::types::ClientId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Known clients and when each last showed a sign of life.
#[derive(Default)]
pub(crate) struct ClientTable {
    last_seen: Mutex<HashMap<ClientId, Instant>>,
}

impl ClientTable {
    /// Registers `client` (or refreshes it): its liveness timer (re)starts at `now`.
    pub(crate) fn register(&self, client: ClientId, now: Instant) {
        self.last_seen.lock().insert(client, now);
    }

    /// Refreshes a known client; `false` if the client is unknown (never mounted, or expired).
    pub(crate) fn ping(&self, client: ClientId, now: Instant) -> bool {
        match self.last_seen.lock().get_mut(&client) {
            Some(seen) => {
                *seen = now;
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
            .filter(|(_, seen)| now.saturating_duration_since(**seen) >= ttl)
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
