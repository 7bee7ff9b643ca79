//! Claims of expired P2P owners: the keys (and sizes) an owner held when the master expired
//! it. When the owner comes back it may route a key again only if nothing wrote, took or
//! removed that key meanwhile; otherwise its value was superseded (a newer put may have gone
//! elsewhere and even been removed since), and routing it again would serve a stale value.
//!
//! A claim ends when the key is routed by anyone (a later write), when its owner reclaims its
//! keys after re-registering (whatever it did not reclaim is forgotten), or when it is older
//! than the master's claim age (see [`ExpiredClaims::prune`]). A claim that ended is refused,
//! so the owner drops the value: losing a cached value is safe, serving a superseded one is
//! not.
//!
//! Plain data, no lock: it lives inside the route table's lock, so a claim and the routes it
//! competes with change together.

use crate::types::ClientId;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// The keys of expired owners that no one has routed since.
#[derive(Default)]
pub(super) struct ExpiredClaims {
    by_key: HashMap<String, (ClientId, u64)>,
    by_owner: HashMap<ClientId, (Instant, HashSet<String>)>,
}

impl ExpiredClaims {
    /// Records that `owner` held `keys` (with their sizes) when it expired at `now`. A claim of
    /// an earlier expiry of the same owner keeps its original time.
    pub(super) fn record(
        &mut self,
        owner: ClientId,
        keys: impl IntoIterator<Item = (String, u64)>,
        now: Instant,
    ) {
        let (_, owned) = self
            .by_owner
            .entry(owner)
            .or_insert_with(|| (now, HashSet::new()));
        for (key, size) in keys {
            owned.insert(key.clone());
            self.by_key.insert(key, (owner, size));
        }
        if owned.is_empty() {
            self.by_owner.remove(&owner);
        }
    }

    /// Ends the claim on `key`, whoever holds it (the key is being routed anew).
    pub(super) fn end(&mut self, key: &str) {
        if let Some((owner, _)) = self.by_key.remove(key) {
            if let Some((_, owned)) = self.by_owner.get_mut(&owner) {
                owned.remove(key);
                if owned.is_empty() {
                    self.by_owner.remove(&owner);
                }
            }
        }
    }

    /// Whether `owner` still claims `key` (of any size).
    pub(super) fn holds_any(&self, owner: ClientId, key: &str) -> bool {
        self.by_key
            .get(key)
            .is_some_and(|(holder, _)| *holder == owner)
    }

    /// Whether `owner` still claims `key` with exactly `size` bytes.
    pub(super) fn holds(&self, owner: ClientId, key: &str, size: u64) -> bool {
        self.by_key.get(key) == Some(&(owner, size))
    }

    /// Forgets every claim of `owner` (it has reclaimed what it could).
    pub(super) fn forget_owner(&mut self, owner: ClientId) {
        if let Some((_, owned)) = self.by_owner.remove(&owner) {
            for key in owned {
                self.by_key.remove(&key);
            }
        }
    }

    /// Forgets the claims of owners that expired before `cutoff`; returns how many keys went.
    pub(super) fn prune(&mut self, cutoff: Instant) -> usize {
        let old: Vec<ClientId> = self
            .by_owner
            .iter()
            .filter(|(_, (at, _))| *at < cutoff)
            .map(|(owner, _)| *owner)
            .collect();
        let before = self.by_key.len();
        for owner in old {
            self.forget_owner(owner);
        }
        before - self.by_key.len()
    }

    /// Number of claimed keys.
    pub(super) fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Uuid;
    use std::time::Duration;

    #[test]
    fn claims_end_with_a_new_route_a_reclaim_or_their_age() {
        let (a, b) = (Uuid::random(), Uuid::random());
        let t0 = Instant::now();
        let mut claims = ExpiredClaims::default();
        claims.record(a, [("x".to_string(), 8), ("y".to_string(), 9)], t0);
        claims.record(b, [("z".to_string(), 1)], t0 + Duration::from_secs(5));
        assert!(claims.holds(a, "x", 8));
        assert!(!claims.holds(a, "x", 7), "another size is another value");
        assert!(!claims.holds(b, "x", 8), "another owner");
        assert!(claims.holds_any(a, "x") && !claims.holds_any(b, "x"));
        claims.end("x");
        assert!(!claims.holds(a, "x", 8));
        assert_eq!(claims.len(), 2);
        assert_eq!(
            claims.prune(t0 + Duration::from_secs(1)),
            1,
            "a's claim on y"
        );
        assert!(claims.holds(b, "z", 1));
        claims.forget_owner(b);
        assert_eq!(claims.len(), 0);
        assert!(claims.by_owner.is_empty());
        claims.record(a, [], t0);
        assert!(claims.by_owner.is_empty(), "no empty owner entries");
    }
}
