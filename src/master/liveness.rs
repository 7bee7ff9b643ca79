//! Client liveness: when each registered client last showed a sign of life (a mount, a
//! remount, a ping or a pin), which clients never expire (an embedded master's own client),
//! and which expired clients are still being retired.
//!
//! Expiry is two steps with retirement in between ([`ClientTable::expire`], then the master
//! releases the client's segments, pins and routes, then [`ClientTable::retired`]). While a
//! client is being retired its pings answer "unknown" (it must remount) and its
//! re-registration waits until the retirement is over, so a remount or a republished route
//! can never be undone by the tail of the retirement it raced with.
//!
//! Thread-safety: one `parking_lot::Mutex` (a leaf lock) and a condition variable for the
//! re-registrations waiting on a retirement.

use crate::types::ClientId;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A registered client's liveness.
#[derive(Clone, Copy)]
enum Seen {
    /// Last sign of life; expired `client_ttl` later.
    At(Instant),
    /// Alive as long as the master runs (never expired).
    Always,
    /// Expired; its segments, pins and routes are being released.
    Retiring,
}

/// Known clients and when each last showed a sign of life.
#[derive(Default)]
pub(crate) struct ClientTable {
    last_seen: Mutex<HashMap<ClientId, Seen>>,
    /// Signalled when a retirement ends.
    retired: Condvar,
}

impl ClientTable {
    /// Registers `client` (or refreshes it): its liveness timer (re)starts at `now`. A client
    /// kept alive by [`ClientTable::keep_alive`] stays so.
    ///
    /// A client still being retired is registered only once its retirement is over: this
    /// waits for it (retirement is in-memory work of the master, milliseconds to seconds).
    pub(crate) fn register(&self, client: ClientId, now: Instant) {
        let mut last_seen = self.last_seen.lock();
        while matches!(last_seen.get(&client), Some(Seen::Retiring)) {
            self.retired.wait(&mut last_seen);
        }
        last_seen
            .entry(client)
            .and_modify(|seen| refresh(seen, now))
            .or_insert(Seen::At(now));
    }

    /// Registers `client` as alive for as long as the master runs: it is never expired.
    pub(crate) fn keep_alive(&self, client: ClientId) {
        self.last_seen.lock().insert(client, Seen::Always);
    }

    /// Refreshes a known client; `false` if the client is unknown (never registered, or
    /// expired, also while it is being retired).
    pub(crate) fn ping(&self, client: ClientId, now: Instant) -> bool {
        match self.last_seen.lock().get_mut(&client) {
            Some(Seen::Retiring) | None => false,
            Some(seen) => {
                refresh(seen, now);
                true
            }
        }
    }

    /// Marks as retiring and returns the clients not seen for `ttl`. Each must be passed to
    /// [`ClientTable::retired`] once its state is released (until then it cannot register).
    pub(crate) fn expire(&self, now: Instant, ttl: Duration) -> Vec<ClientId> {
        let mut last_seen = self.last_seen.lock();
        let expired: Vec<ClientId> = last_seen
            .iter()
            .filter(|(_, seen)| match seen {
                Seen::At(at) => now.saturating_duration_since(*at) >= ttl,
                Seen::Always | Seen::Retiring => false,
            })
            .map(|(client, _)| *client)
            .collect();
        for client in &expired {
            last_seen.insert(*client, Seen::Retiring);
        }
        expired
    }

    /// Ends `client`'s retirement: it is forgotten, and a re-registration waiting on it
    /// proceeds.
    pub(crate) fn retired(&self, client: ClientId) {
        let mut last_seen = self.last_seen.lock();
        if matches!(last_seen.get(&client), Some(Seen::Retiring)) {
            last_seen.remove(&client);
        }
        self.retired.notify_all();
    }

    /// Number of live clients (not counting those being retired).
    pub(crate) fn len(&self) -> usize {
        self.last_seen
            .lock()
            .values()
            .filter(|seen| !matches!(seen, Seen::Retiring))
            .count()
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
        table.retired(timed);
        assert!(!table.ping(timed, later));
    }

    #[test]
    fn a_retiring_client_registers_only_after_its_retirement() {
        let table = std::sync::Arc::new(ClientTable::default());
        let client = Uuid::random();
        let start = Instant::now();
        table.register(client, start);
        let later = start + Duration::from_secs(60);
        assert_eq!(table.expire(later, Duration::from_secs(1)), vec![client]);
        assert!(table.expire(later, Duration::from_secs(1)).is_empty());
        let (sender, registered) = std::sync::mpsc::channel();
        let waiter = {
            let table = table.clone();
            std::thread::spawn(move || {
                table.register(client, later);
                sender.send(()).unwrap();
            })
        };
        let early = registered.recv_timeout(Duration::from_millis(200));
        assert!(early.is_err(), "registered while still retiring");
        assert!(!table.ping(client, later));
        table.retired(client);
        registered.recv_timeout(Duration::from_secs(10)).unwrap();
        waiter.join().unwrap();
        assert!(table.ping(client, later));
        assert_eq!(table.len(), 1);
    }
}
