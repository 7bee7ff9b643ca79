//! Read paths of [`MasterService`]: replica queries, existence, pins (spec §4.2, §4.3).

use super::metrics::Counters;
use super::pins::PinRecord;
use super::service::{check_key, MasterService};
use crate::error::{fail, ErrorCode, Result};
use crate::types::{ClientId, PinnedObject, QueryResult};
use std::sync::Arc;
use std::time::Instant;

impl MasterService {
    /// Runs `then` on the readable object `key` after granting it a lease. Errors:
    /// `OBJECT_NOT_FOUND`, `REPLICA_IS_NOT_READY` (being written or no mounted replica).
    fn read_with<R>(
        &self,
        key: &str,
        then: impl FnOnce(&mut super::objects::ObjectMeta, QueryResult) -> R,
    ) -> Result<R> {
        check_key(key)?;
        let now = Instant::now();
        let mut shard = self.objects.shard(key);
        let Some(meta) = shard.get_mut(key) else {
            return fail(ErrorCode::ObjectNotFound, key);
        };
        let mounted = |tier| self.disks.resolve(tier);
        let Some(query) = meta.read(key, now, self.config.lease_ttl(), mounted) else {
            return fail(ErrorCode::ReplicaIsNotReady, key);
        };
        self.counters.leases_granted.add(1);
        self.count_disk_hit(key, meta);
        Ok(then(meta, query))
    }

    /// `GetReplicaList` for one key (grants or extends the read lease).
    pub(super) fn query(&self, key: &str) -> Result<QueryResult> {
        self.read_with(key, |_, query| query)
    }

    /// `GetLocations` for one key: as [`Self::query`]; when `cacheable` (caching is on and
    /// `client` polls for revocations) `client` also becomes a holder of the key's cached
    /// lease, which the answer's `cache_ttl_ms` states.
    pub(super) fn query_cached(
        &self,
        client: ClientId,
        key: &str,
        cacheable: bool,
    ) -> Result<QueryResult> {
        self.read_with(key, |meta, mut query| {
            if cacheable {
                let lease = self.config.location_cache_lease();
                let now = Instant::now();
                self.cache_leases
                    .hold(meta.cache_holders_mut(), client, now + lease, now);
                query.cache_ttl_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
            }
            query
        })
    }

    /// `ExistKey` for one key: `true` (and a lease) if readable, `false` if absent or not
    /// readable yet. Errors: `INVALID_PARAMS` (empty key).
    pub(super) fn exists(&self, key: &str) -> Result<bool> {
        match self.query(key) {
            Ok(_) => Ok(true),
            Err(ErrorCode::ObjectNotFound | ErrorCode::ReplicaIsNotReady) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Pins the readable object `key` for `client` (also grants a lease).
    pub(super) fn pin(&self, client: ClientId, key: &str) -> Result<PinnedObject> {
        self.read_with(key, |meta, query| {
            meta.pins = meta.pins.saturating_add(1);
            let pin_id = self.pins.insert(PinRecord {
                client,
                key: key.to_string(),
                object_id: meta.id,
                _allocations: meta.share_allocations(),
                _disk: meta.disk().map(|copy| Arc::clone(&copy.hold)),
            });
            PinnedObject {
                pin_id,
                query,
                pinned_at: None,
                pinned_by: None,
            }
        })
    }

    /// Releases `records`: the pinned generations' pin counts drop, and each record's bytes
    /// are freed if nothing else holds them.
    pub(super) fn release_pins(&self, records: Vec<PinRecord>) {
        for mut record in records {
            // Let go of the ranges first: the object's replicas may then own theirs again.
            drop(std::mem::take(&mut record._allocations));
            let mut shard = self.objects.shard(&record.key);
            if let Some(meta) = shard.get_mut(&record.key) {
                if meta.id == record.object_id {
                    meta.unpin();
                }
            }
            drop(shard);
            drop(record);
            Counters::add(&self.counters.pins_released, 1);
        }
    }
}
