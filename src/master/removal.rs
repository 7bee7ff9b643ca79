//! Remove paths of [`MasterService`] (spec §4.4): the key disappears at once; bytes still
//! under a read lease are freed when it ends, pinned bytes when the last pin goes.

use super::metrics::Counters;
use super::objects::ScanPosition;
use super::service::{check_key, MasterService};
use crate::error::{fail, ErrorCode, Result};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// How long after a `remove_all` or `remove_by_regex` answered `TRY_AGAIN` the same request
/// resumes where it stopped; later it starts over.
pub(super) const SCAN_RESUME_WINDOW: Duration = Duration::from_secs(60);

/// What a removal scan removes: a pattern (`None`: every key) and whether leased objects go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ScanRequest {
    pub pattern: Option<String>,
    pub force: bool,
}

/// Where the last removal scan that answered `TRY_AGAIN` stopped, and for which request.
pub(super) struct ScanResume {
    request: ScanRequest,
    at: ScanPosition,
    stopped: Instant,
}

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
        if let Some(mut meta) = self.take_object(&mut shard, key) {
            self.retire(&mut meta, now);
        }
        drop(shard);
        // Acknowledged only once the removal survives a failover.
        self.wait_removals_safe(key)
    }

    /// Removes every complete object whose key satisfies `wanted` (the scan `request`) and
    /// that is unleased (or `force`); others are skipped silently. Returns how many were
    /// removed. Errors: `TRY_AGAIN` when the scan ran out of its budget (`scan_budget_ms`)
    /// first: what it removed stays removed (counted in `scan_removed_total`); the same
    /// request made again within [`SCAN_RESUME_WINDOW`] resumes where this one stopped (each
    /// call visits at least one slice, so the calls end), any other starts at the table's
    /// start. Objects put while the calls go on may or may not be removed.
    pub(super) fn remove_where(
        &self,
        request: ScanRequest,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<u64> {
        let now = Instant::now();
        let until = crate::spin::deadline(now, self.config.scan_budget());
        let from = self.scan_resume.lock().take().and_then(|resume| {
            let current = resume.request == request
                && now.saturating_duration_since(resume.stopped) < SCAN_RESUME_WINDOW;
            current.then_some(resume.at)
        });
        let force = request.force;
        let removed = Cell::new(0);
        let stop = || Instant::now() >= until;
        let from = from.unwrap_or_default();
        let stopped = self
            .objects
            .scan_in_slices_from(from, stop, |shard, slots| {
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
                for key in doomed {
                    if let Some(mut meta) = self.take_object(shard, &key) {
                        self.retire(&mut meta, now);
                        removed.set(removed.get() + 1);
                        Counters::add(&self.counters.scan_removed, 1);
                    }
                }
            });
        if let Some(journal) = &self.journal {
            // Acknowledged only once the removals survive a failover (best effort: the count
            // is the answer; a journal that is stuck is reported by its own metrics).
            let _ = self.wait_durable(Some(journal.last_appended()));
        }
        let removed = removed.get();
        if let Some(at) = stopped {
            *self.scan_resume.lock() = Some(ScanResume {
                request,
                at,
                stopped: Instant::now(),
            });
            let budget = self.config.scan_budget_ms;
            return fail(
                ErrorCode::TryAgain,
                format!("the scan removed {removed} objects in its {budget} ms and stopped: call again for the rest"),
            );
        }
        Ok(removed)
    }
}
