//! Sharded, lease-bounded record tables: the owner's PendingWriteRecords and
//! PinnedKeyRecords.
//!
//! Each shard is a map `key → record` plus a deadline-ordered set, behind one
//! `parking_lot::Mutex`. The background scan pops expired records from the heads of the
//! ordered sets, one shard at a time; a stage RPC that meets an expired record removes it
//! first ([`Shard::take_expired`]). Shard locks are held only inside the prepare and
//! complete stages — never across a transfer, never across an RPC. Records removed from a
//! table are returned to the caller, which drops them (releasing their allocation handles)
//! after the lock is gone.

use parking_lot::{Mutex, MutexGuard};
use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::time::Instant;

/// The shard of `key` among `shards` (≥ 1).
pub(crate) fn shard_index(hasher: &RandomState, key: &str, shards: usize) -> usize {
    (hasher.hash_one(key) % shards.max(1) as u64) as usize
}

/// A record with a lease.
pub(crate) trait Leased {
    /// When the record expires.
    fn deadline(&self) -> Instant;
    /// Moves the deadline (renewal).
    fn set_deadline(&mut self, deadline: Instant);
}

/// One shard: records by key and the same records ordered by deadline.
pub(crate) struct Shard<R> {
    map: HashMap<String, R>,
    order: BTreeSet<(Instant, String)>,
}

impl<R: Leased> Shard<R> {
    /// Removes and returns `key`'s record if its deadline has passed.
    pub(crate) fn take_expired(&mut self, key: &str, now: Instant) -> Option<R> {
        let deadline = self.map.get(key)?.deadline();
        if deadline > now {
            return None;
        }
        self.remove(key)
    }

    /// The record of `key`, if any (expired or not).
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut R> {
        self.map.get_mut(key)
    }

    /// Inserts `record` for `key`, replacing (and returning) any previous one.
    pub(crate) fn insert(&mut self, key: &str, record: R) -> Option<R> {
        let old = self.remove(key);
        self.order.insert((record.deadline(), key.to_string()));
        self.map.insert(key.to_string(), record);
        old
    }

    /// Moves `key`'s deadline to `deadline` (no-op for an unknown key).
    pub(crate) fn renew(&mut self, key: &str, deadline: Instant) {
        if let Some(record) = self.map.get_mut(key) {
            self.order.remove(&(record.deadline(), key.to_string()));
            record.set_deadline(deadline);
            self.order.insert((deadline, key.to_string()));
        }
    }

    /// Removes `key`'s record.
    pub(crate) fn remove(&mut self, key: &str) -> Option<R> {
        let record = self.map.remove(key)?;
        self.order.remove(&(record.deadline(), key.to_string()));
        Some(record)
    }

    /// Pops every record whose deadline has passed, oldest first.
    fn pop_expired(&mut self, now: Instant, out: &mut Vec<R>) {
        while let Some((deadline, _)) = self.order.first() {
            if *deadline > now {
                break;
            }
            let Some((_, key)) = self.order.pop_first() else {
                break;
            };
            if let Some(record) = self.map.remove(&key) {
                out.push(record);
            }
        }
    }
}

/// A table of records sharded by key. Thread-safe.
pub(crate) struct RecordTable<R> {
    shards: Box<[Mutex<Shard<R>>]>,
    hasher: RandomState,
}

impl<R: Leased> RecordTable<R> {
    /// A table with `shards` (≥ 1) shards.
    pub(crate) fn new(shards: usize) -> RecordTable<R> {
        RecordTable {
            shards: (0..shards.max(1))
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        order: BTreeSet::new(),
                    })
                })
                .collect(),
            hasher: RandomState::new(),
        }
    }

    /// Locks `key`'s shard. Hold the guard only for metadata work.
    pub(crate) fn shard(&self, key: &str) -> MutexGuard<'_, Shard<R>> {
        self.shards[shard_index(&self.hasher, key, self.shards.len())].lock()
    }

    /// Removes every expired record (locking one shard at a time) and returns them; the
    /// caller drops them outside any lock.
    pub(crate) fn scan(&self, now: Instant) -> Vec<R> {
        let mut expired = Vec::new();
        for shard in self.shards.iter() {
            shard.lock().pop_expired(now, &mut expired);
        }
        expired
    }

    /// Records currently held (expired ones not yet reclaimed included).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    struct Rec(Instant, u32);
    impl Leased for Rec {
        fn deadline(&self) -> Instant {
            self.0
        }
        fn set_deadline(&mut self, deadline: Instant) {
            self.0 = deadline;
        }
    }

    #[test]
    fn scan_pops_expired_heads_and_renewal_reorders() {
        let table = RecordTable::new(1);
        let now = Instant::now();
        let ms = Duration::from_millis;
        table.shard("a").insert("a", Rec(now + ms(10), 1));
        table.shard("b").insert("b", Rec(now + ms(20), 2));
        table.shard("c").insert("c", Rec(now + ms(30), 3));
        table.shard("a").renew("a", now + ms(40));
        let gone: Vec<u32> = table.scan(now + ms(25)).iter().map(|r| r.1).collect();
        assert_eq!(gone, vec![2]);
        assert_eq!(table.len(), 2);
        let mut shard = table.shard("c");
        assert!(shard.take_expired("c", now + ms(29)).is_none());
        assert_eq!(shard.take_expired("c", now + ms(30)).map(|r| r.1), Some(3));
        assert!(shard.get_mut("a").is_some());
        assert_eq!(shard.remove("a").map(|r| r.1), Some(1));
        drop(shard);
        assert_eq!(table.len(), 0);
        assert!(table.scan(now + ms(100)).is_empty());
    }

    #[test]
    fn keys_spread_over_shards() {
        let hasher = RandomState::new();
        let used: std::collections::HashSet<usize> = (0..200)
            .map(|i| shard_index(&hasher, &format!("k{i}"), 16))
            .collect();
        assert!(used.len() > 8);
        assert_eq!(shard_index(&hasher, "x", 0), 0);
    }
}
