//! Write paths of [`MasterService`]: put/upsert start, put end and revoke (spec §4.2, §4.9).

use super::objects::{ObjectMeta, Range, Replica, Replicas, Shard};
use super::service::{check_key, MasterService};
use crate::error::{fail, ErrorCode, Result};
use crate::spin::deadline;
use crate::types::{ClientId, ReplicateConfig, SoftPinAction, WriteGrant, WriteToken};
use std::time::{Duration, Instant};

impl MasterService {
    /// Argument checks shared by put and upsert. Errors: `INVALID_PARAMS`.
    fn check_write(&self, key: &str, size: u64, config: &ReplicateConfig) -> Result<()> {
        check_key(key)?;
        let problem = if size == 0 {
            "size 0"
        } else if config.replica_num == 0 {
            "replica_num 0"
        } else if config.prefer_alloc_in_same_node {
            "prefer_alloc_in_same_node is not supported"
        } else if config.soft_pin_ttl_ms.is_some()
            && config.soft_pin_action != SoftPinAction::Enable
        {
            "soft_pin_ttl_ms without SoftPinAction::Enable"
        } else if config.soft_pin_ttl_ms > Some(self.config.max_kv_soft_pin_ttl_ms) {
            "soft_pin_ttl_ms above max_kv_soft_pin_ttl"
        } else {
            return Ok(());
        };
        fail(ErrorCode::InvalidParams, format!("{key}: {problem}"))
    }

    fn default_soft_pin(&self) -> Duration {
        Duration::from_millis(self.config.default_kv_soft_pin_ttl_ms)
    }

    /// Allocates replicas; `NO_AVAILABLE_HANDLE` (and a request for eviction) if none fit.
    fn place(&self, size: u64, config: &ReplicateConfig) -> Result<Replicas> {
        let placed = self.segments.place(size, config);
        if placed.is_empty() {
            if !self.segments.is_empty() && self.request_eviction() {
                // The eviction round starts now, not at the end of its period: a full pool
                // with an SSD tier is a stream of demotions, paced by this.
                self.workers.nudge();
            }
            return fail(
                ErrorCode::NoAvailableHandle,
                format!("no segment has {size} free bytes"),
            );
        }
        let replicas = placed.into_iter().map(|p| Replica {
            id: self.next_replica_id.next(),
            place: p.place,
            range: Range::Owned(p.allocation),
        });
        Ok(replicas.collect())
    }

    /// The grant of `meta`'s current write.
    fn grant(&self, meta: &ObjectMeta) -> WriteGrant {
        let ttl = self.config.put_start_release_timeout().as_millis();
        WriteGrant {
            token: meta.write,
            replicas: meta.processing_descriptors(),
            write_ttl_ms: u64::try_from(ttl).unwrap_or(u64::MAX),
            revoking: meta.revoking,
        }
    }

    /// Creates `key` as a new object being written by `client` into `replicas` (any
    /// previous entry is replaced; the caller retired it).
    fn start_new(
        &self,
        shard: &mut Shard,
        client: ClientId,
        key: &str,
        size: u64,
        replicas: Replicas,
        config: &ReplicateConfig,
    ) -> WriteGrant {
        let now = Instant::now();
        let mut meta = ObjectMeta::new(
            self.next_write_token(),
            size,
            client,
            replicas,
            config,
            self.default_soft_pin(),
            now,
        );
        // A new object has no holders yet, but its key may: revocations of an earlier object
        // of the key (pre-empted, removed, evicted) still unacknowledged, or holders of an
        // earlier master life.
        meta.revoking =
            self.cache_leases.in_grace(now) || self.cache_leases.may_be_pending(key, now);
        let grant = self.grant(&meta);
        shard.insert(key.to_string(), meta);
        grant
    }

    /// `PutStart` for one key. A complete key, or one being written for less than
    /// `put_start_discard_timeout`, is `OBJECT_ALREADY_EXISTS`; an older unfinished write is
    /// discarded (its bytes are held until `put_start_release_timeout` after its start, since
    /// its writer may still be writing) and the new writer gets fresh space.
    pub(super) fn put_start(
        &self,
        client: ClientId,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
    ) -> Result<WriteGrant> {
        self.check_write(key, size, config)?;
        self.check_journal()?;
        let now = Instant::now();
        let mut shard = self.objects.shard(key);
        match shard.get(key).map(ObjectMeta::write_started) {
            None => {}
            Some(None) => return fail(ErrorCode::ObjectAlreadyExists, key),
            Some(Some(started))
                if now.saturating_duration_since(started)
                    < self.config.put_start_discard_timeout() =>
            {
                return fail(
                    ErrorCode::ObjectAlreadyExists,
                    format!("{key} is being written"),
                );
            }
            Some(Some(_)) => {}
        }
        // Space first: when none fits, the discarded write (if any) is left as it was.
        let replicas = self.place(size, config)?;
        if let Some(mut stale) = self.take_object(&mut shard, key) {
            self.retire(&mut stale, now);
        }
        let grant = self.start_new(&mut shard, client, key, size, replicas, config);
        drop(shard);
        self.wait_removals_safe(key)?;
        Ok(grant)
    }

    /// `UpsertStart` for one key: see [`crate::master::MasterApi::batch_upsert_start`].
    /// - absent: as a put;
    /// - being written: the write is preempted (its bytes retired as for a discarded put);
    /// - pinned: `OBJECT_REPLICA_BUSY`;
    /// - same size, unleased, all replicas mounted: rewritten in place;
    /// - otherwise new replicas are allocated (on failure the old value stays) and the old
    ///   bytes are freed when the current read lease ends.
    ///
    /// The object is unreadable (`REPLICA_IS_NOT_READY`) until `put_end`; its hard pin is kept.
    /// Every upsert start is a new write with a new token: the pre-empted or overwritten
    /// write's token is stale from now on. With a journal, the old value's removal is
    /// journaled first and the grant waits until it is safe (`INTERNAL_ERROR` if it is not
    /// within [`super::JournalOptions::safe_wait`]; the write is then abandoned).
    pub(super) fn upsert_start(
        &self,
        client: ClientId,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
    ) -> Result<WriteGrant> {
        self.check_write(key, size, config)?;
        self.check_journal()?;
        let now = Instant::now();
        let mut shard = self.objects.shard(key);
        if let Some(meta) = shard.get_mut(key) {
            if meta.write_started().is_none() {
                if meta.pins > 0 {
                    return fail(ErrorCode::ObjectReplicaBusy, format!("{key} is pinned"));
                }
                // Not in place while holders of an earlier master life may still read it.
                let in_place = meta.size == size
                    && !meta.has_lease(now)
                    && !self.cache_leases.in_grace(now)
                    && !meta.replicas.is_empty()
                    && meta.replicas.iter().all(|r| r.allocation().is_live());
                let fresh = match in_place {
                    true => None,
                    false => Some(self.place(size, config)?),
                };
                self.forget_committed(key, meta);
                // A disk copy goes once the current read lease ends (readers may be on it).
                if let Some(copy) = meta.take_disk() {
                    let until = meta.lease_deadline().unwrap_or(now);
                    self.deferred.hold_disk_until(until, now, copy.hold);
                }
                if let Some(fresh) = fresh {
                    let old: Vec<_> = std::mem::replace(&mut meta.replicas, fresh)
                        .into_iter()
                        .map(|r| r.range)
                        .collect();
                    let until = meta.lease_deadline().unwrap_or(now);
                    self.deferred.hold_until(until, now, old);
                    meta.size = size;
                }
                meta.restart_write(client, self.next_write_token(), now);
                meta.revoking = self.revoke_cached(key, meta, now)
                    || self.cache_leases.in_grace(now)
                    || self.cache_leases.may_be_pending(key, now);
                meta.apply_soft_pin_action(config, self.default_soft_pin());
                let grant = self.grant(meta);
                drop(shard);
                // The old value's removal is safe before anything is written (in place: over
                // its bytes).
                self.wait_removals_safe(key)?;
                return Ok(grant);
            }
        }
        // Pre-empting a write (or creating the key): space first, so a failed allocation
        // leaves the write in progress untouched.
        let replicas = self.place(size, config)?;
        if let Some(mut preempted) = self.take_object(&mut shard, key) {
            self.retire(&mut preempted, now);
        }
        let grant = self.start_new(&mut shard, client, key, size, replicas, config);
        drop(shard);
        self.wait_removals_safe(key)?;
        Ok(grant)
    }

    /// The key's object if `client` may finish write `token` of it. Errors:
    /// `OBJECT_NOT_FOUND`, `ILLEGAL_CLIENT` (another client's write), `STALE_WRITE_TOKEN`
    /// (another write of the key started since, or this one was reclaimed and the key
    /// re-created).
    fn written_by<'a>(
        shard: &'a mut Shard,
        client: ClientId,
        key: &str,
        token: WriteToken,
    ) -> Result<&'a mut ObjectMeta> {
        let Some(meta) = shard.get_mut(key) else {
            return fail(ErrorCode::ObjectNotFound, key);
        };
        if meta.writer != client {
            return fail(ErrorCode::IllegalClient, format!("{key}: not the writer"));
        }
        if meta.write != token {
            return fail(
                ErrorCode::StaleWriteToken,
                format!(
                    "{key}: write {} was superseded by {}",
                    token.0, meta.write.0
                ),
            );
        }
        Ok(meta)
    }

    /// `PutEnd` for one key: write `token`'s object becomes readable, unleased. Idempotent
    /// once complete. Errors: see [`Self::written_by`]; `REVOCATION_PENDING` (nothing
    /// changes) while location caches holding the old value have neither acknowledged their
    /// revocation nor reached the end of their lease (`await_revocations`, then end again).
    pub(super) fn put_end(&self, client: ClientId, key: &str, token: WriteToken) -> Result<()> {
        check_key(key)?;
        let now = Instant::now();
        let mut shard = self.objects.shard(key);
        let meta = Self::written_by(&mut shard, client, key, token)?;
        if meta.write_started().is_some() && meta.revoking {
            if !self.cache_leases.wait(&[key.to_string()], Duration::ZERO) {
                return fail(
                    ErrorCode::RevocationPending,
                    format!("{key}: location caches still hold the old value"),
                );
            }
            meta.revoking = false;
        }
        if meta.write_started().is_some() {
            meta.complete(now);
            self.journal_commit(key, meta, now);
            if self.config.offload_at_put {
                self.start_offload(&mut shard, key);
            }
        }
        Ok(())
    }

    /// `PutRevoke` for one key: write `token` stops and the key is erased — also for an
    /// upsert, whose old value is then gone. Its space is reused only `write_quarantine`
    /// from now: a payload the writer gave up on may still be in flight. Errors: see
    /// [`Self::written_by`]; `INVALID_WRITE` (complete).
    pub(super) fn put_revoke(&self, client: ClientId, key: &str, token: WriteToken) -> Result<()> {
        check_key(key)?;
        let now = Instant::now();
        let mut shard = self.objects.shard(key);
        let meta = Self::written_by(&mut shard, client, key, token)?;
        if meta.write_started().is_none() {
            return fail(
                ErrorCode::InvalidWrite,
                format!("{key}: no write in progress"),
            );
        }
        if let Some(mut revoked) = self.take_object(&mut shard, key) {
            let due = deadline(now, self.config.write_quarantine());
            self.deferred
                .hold_until(due, now, revoked.take_allocations());
        }
        Ok(())
    }
}
