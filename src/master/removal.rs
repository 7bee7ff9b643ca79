//! Remove paths of [`MasterService`] (spec §4.4): the key disappears at once; bytes still
//! under a read lease are freed when it ends, pinned bytes when the last pin goes.

use super::metrics::Counters;
use super::replicas::Released;
use super::service::{check_key, MasterService};
use crate::error::{fail, ErrorCode, Result};
use std::cell::Cell;
use std::time::Instant;

impl MasterService {
    /// Removes one key. Errors: `OBJECT_NOT_FOUND`, `REPLICA_IS_NOT_READY` (being written,
    /// even with `force`), `OBJECT_HAS_LEASE` (leased and not `force`); with a journal,
    /// `INTERNAL_ERROR` when the removal is not safe (durable, copied by the standbys) within
    /// [`super::JournalOptions::safe_wait`] (the key is gone here, but may come back after a
    /// failover).
    pub(super) fn remove(&self, key: &str, force: bool) -> Result<()> {
        check_key(key)?;
        let now = Instant::now();
        let mut shard = self.objects.shard(key);
        let Some(meta) = shard.get(key) else {
            return fail(ErrorCode::ObjectNotFound, key);
        };
        if meta.write_started().is_some() {
            return fail(
                ErrorCode::ReplicaIsNotReady,
                format!("{key} is being written"),
            );
        }
        if !force && meta.has_lease(now) {
            return fail(ErrorCode::ObjectHasLease, key);
        }
        let mut released = Released::default();
        if let Some(mut meta) = self.take_object(&mut shard, key) {
            self.retire_into(&mut meta, now, &mut released);
        }
        drop(shard);
        drop(released);
        // Acknowledged only once the removal survives a failover.
        self.wait_removals_safe(key)
    }

    /// Removes every complete object whose key satisfies `wanted` and that is unleased (or
    /// `force`); others are skipped silently. Returns how many were removed. A call goes once
    /// around the table from where the last stopped call stopped (any start is as good: an
    /// answer of a count means the call visited every slot), so the calls of one long
    /// removal visit the emptied slots about once, not once each. Errors: `TRY_AGAIN` when
    /// the scan ran out of its budget (`scan_budget_ms`) first and had removed something:
    /// what it removed stays removed (counted in `scan_removed_total`), a new call removes
    /// the rest. A call that removed nothing goes on past its budget (so every call that
    /// stops has made progress, and the calls end).
    pub(super) fn remove_where(&self, force: bool, wanted: impl Fn(&str) -> bool) -> Result<u64> {
        let now = Instant::now();
        let until = crate::spin::deadline(now, self.config.scan_budget());
        let removed = Cell::new(0);
        let stop = || removed.get() > 0 && Instant::now() >= until;
        let from = *self.scan_cursor.lock();
        let stopped = self
            .objects
            .scan_in_slices_around(from, stop, |shard, slots| {
                Counters::add(
                    &self.counters.scan_slots,
                    u64::from(slots.end - slots.start),
                );
                let doomed: Vec<String> = shard
                    .slice(slots)
                    .filter(|(key, meta)| {
                        meta.write_started().is_none()
                            && (force || !meta.has_lease(now))
                            && wanted(key)
                    })
                    .map(|(key, _)| key.to_string())
                    .collect();
                // Freed after the slice's lock is released.
                let mut released = Released::default();
                for key in doomed {
                    if let Some(mut meta) = self.take_object(shard, &key) {
                        self.retire_into(&mut meta, now, &mut released);
                        removed.set(removed.get() + 1);
                        Counters::add(&self.counters.scan_removed, 1);
                    }
                }
                released
            });
        if let Some(journal) = &self.journal {
            // Acknowledged only once the removals survive a failover (best effort: the count
            // is the answer; a journal that is stuck is reported by its own metrics).
            let _ = self.wait_durable(Some(journal.last_appended()));
        }
        let removed = removed.get();
        if let Some(at) = stopped {
            *self.scan_cursor.lock() = at;
            let budget = self.config.scan_budget_ms;
            return fail(
                ErrorCode::TryAgain,
                format!("the scan removed {removed} objects in its {budget} ms and stopped: call again for the rest"),
            );
        }
        Ok(removed)
    }
}
