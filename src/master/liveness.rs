//! Client liveness: when each registered client last showed a sign of life (a mount, a
//! remount, a registration, a ping or a pin), which clients never expire (an embedded
//! master's own client), and which expired clients are still being retired. Each
//! registration of a client that was unknown gets a number of its own, which pings report:
//! the same number on two answers proves that the client was not expired in between.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A registered client's liveness.
#[derive(Clone, Copy)]
enum Seen {
    /// Last sign of life (it never moves back); expired `client_ttl` later. With the number
    /// of the registration.
    At(Instant, u64),
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
    /// The last registration number handed out (numbers start at 1).
    registrations: AtomicU64,
}

impl ClientTable {
    /// Registers `client` (or refreshes it): its liveness timer (re)starts at `now`. A client
    /// kept alive by [`ClientTable::keep_alive`] stays so.
    ///
    /// A client still being retired is registered only once its retirement is over: this
    /// waits for it (retirement is in-memory work of the master, milliseconds to seconds).
    pub(crate) fn register(&self, client: ClientId, now: Instant) {
        let mut last_seen = self.last_seen.lock();
        let mut now = now;
        while matches!(last_seen.get(&client), Some(Seen::Retiring)) {
            self.retired.wait(&mut last_seen);
            // Time passed while waiting: the sign of life is when the wait ended.
            now = now.max(Instant::now());
        }
        last_seen
            .entry(client)
            .and_modify(|seen| refresh(seen, now))
            .or_insert_with(|| {
                Seen::At(now, self.registrations.fetch_add(1, Ordering::Relaxed) + 1)
            });
    }

    /// Registers `client` as alive for as long as the master runs: it is never expired.
    pub(crate) fn keep_alive(&self, client: ClientId) {
        self.last_seen.lock().insert(client, Seen::Always);
    }

    /// Refreshes a known client and returns its registration number (0 for one kept alive);
    /// `None` if the client is unknown (never registered, or expired, also while it is being
    /// retired).
    pub(crate) fn ping(&self, client: ClientId, now: Instant) -> Option<u64> {
        match self.last_seen.lock().get_mut(&client) {
            Some(Seen::Retiring) | None => None,
            Some(seen) => {
                refresh(seen, now);
                Some(match seen {
                    Seen::At(_, registration) => *registration,
                    _ => 0,
                })
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
                Seen::At(at, _) => now.saturating_duration_since(*at) >= ttl,
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

/// Moves a timed client's last sign of life to `now`, never back (a call that read the
/// clock before a slower one must not shorten the client's life).
fn refresh(seen: &mut Seen, now: Instant) {
    if let Seen::At(at, _) = seen {
        *at = (*at).max(now);
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
        assert_eq!(table.ping(kept, later), Some(0));
        assert_eq!(table.ping(timed, later), None);
        assert_eq!(table.len(), 1);
        table.retired(timed);
        assert_eq!(table.ping(timed, later), None);
    }

    #[test]
    fn a_retiring_client_registers_only_after_its_retirement() {
        let table = std::sync::Arc::new(ClientTable::default());
        let client = Uuid::random();
        let start = Instant::now();
        table.register(client, start);
        let first = table.ping(client, start).expect("registered");
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
        assert_eq!(table.ping(client, later), None);
        table.retired(client);
        registered.recv_timeout(Duration::from_secs(10)).unwrap();
        waiter.join().unwrap();
        let again = table.ping(client, later).expect("registered again");
        assert_ne!(again, first, "a new registration has a number of its own");
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn a_sign_of_life_read_earlier_never_moves_the_last_one_back() {
        let table = ClientTable::default();
        let client = Uuid::random();
        let start = Instant::now();
        table.register(client, start + Duration::from_secs(5));
        table.register(client, start);
        assert_eq!(table.ping(client, start), Some(1));
        assert!(table
            .expire(start + Duration::from_secs(5), Duration::from_secs(1))
            .is_empty());
    }
}
