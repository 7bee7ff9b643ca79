//! [`MasterService`]: the in-process master. It owns the object table, the segment registry,
//! client liveness, pins and deferred frees, and runs two background threads (eviction every
//! 10 ms, client monitor every second).
//!
//! # Lock order
//! A thread may take locks only in this order, and never more than one of a kind:
//! 1. one object shard (`ObjectTable::shard`; scans lock shards one after another);
//! 2. the segment registry (`SegmentRegistry`, a read/write lock);
//! 3. the pin table, the deferred-free queue, the client table or the write-token reserve
//!    (never two of them);
//! 4. an allocator's free lists (taken by allocating, or by dropping an `Allocation`), the
//!    free gate's queue, or the journal's pending batch (leaves).
//!
//! Nothing slow runs under a lock: no I/O, no sleeping; scans hold one shard at a time.
//! Bytes are released by dropping the last `Arc<Allocation>`: replicas, pins and deferred
//! frees each hold one, so a range is reused only when all of them are gone.

use super::cache_leases::CacheLeases;
use super::config::MasterConfig;
use super::deferred::DeferredFrees;
use super::disk_tiers::DiskTiers;
use super::durability::{Restored, TokenReserve};
use super::journal::{Journal, JournalOptions};
use super::liveness::ClientTable;
use super::metrics::{Counters, MasterMetrics};
use super::objects::{ObjectMeta, ObjectTable, Phase, ScanPosition};
use super::pins::PinTable;
use super::replicas::Released;
use super::routes::RouteTable;
use super::segments::SegmentRegistry;
use super::stripes::IdBlocks;
use super::workers::Workers;
use super::MasterApi;
use crate::error::{fail, ErrorCode, Result};
use crate::spin::deadline;
use crate::types::{
    ClientId, ClientStatus, DeploymentMode, DiskMount, DiskMountAnswer, DiskMountPage, DiskReport,
    DiskTask, P2pOwner, P2pRoute, PingResponse, PinnedObject, QueryResult, ReplicateConfig,
    RevocationBatch, Segment, SegmentId, WriteGrant, WriteToken, STORE_VERSION,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Period of the eviction thread (Mooncake's `kEvictionThreadSleepMs`).
pub(super) const EVICTION_PERIOD: Duration = Duration::from_millis(10);
/// Longest period of the client monitor (Mooncake checks every second).
const CLIENT_MONITOR_PERIOD: Duration = Duration::from_secs(1);

/// The in-process master. Thread-safe (`Send + Sync`); share it as `Arc<MasterService>`.
/// Dropping the last `Arc` stops the background threads.
pub struct MasterService {
    pub(super) config: MasterConfig,
    /// This master's view: random per start, or the etcd revision that made it leader.
    pub(super) view_version: AtomicU64,
    pub(super) objects: ObjectTable,
    pub(super) segments: SegmentRegistry,
    pub(super) clients: ClientTable,
    pub(super) pins: PinTable,
    pub(super) routes: RouteTable,
    pub(super) deferred: DeferredFrees,
    /// The clients' disk tiers and the work queued for them.
    pub(super) disks: Arc<DiskTiers>,
    pub(super) counters: Counters,
    /// The eviction round a failed allocation asked for (the highest asked): a request made
    /// while `evictions_done` was `n` asks for round `n + 1`, so a round that ends after it
    /// serves it ([`MasterService::request_eviction`]).
    pub(super) eviction_wanted: AtomicU64,
    /// Requested eviction rounds run so far (the last request each served).
    pub(super) evictions_done: AtomicU64,
    /// Held while an eviction round runs: rounds never overlap.
    pub(super) eviction_round: Mutex<()>,
    /// When the next scan for abandoned writes is due.
    pub(super) next_reclaim: Mutex<Instant>,
    /// When the next eviction scan is due.
    pub(super) eviction_backoff: Mutex<super::eviction::Backoff>,
    /// Write generations (also object ids); starts at a random value (see [`WriteToken`]),
    /// or above the journal's ceiling.
    pub(super) next_write: IdBlocks,
    pub(super) next_replica_id: IdBlocks,
    /// The journal (`--journal_dir`), if any.
    pub(super) journal: Option<Arc<Journal>>,
    /// Write tokens covered by the journal.
    pub(super) token_reserve: Mutex<TokenReserve>,
    /// Tokens below this need no look at the reserve (durable, and far from its ceiling).
    pub(super) tokens_covered: AtomicU64,
    /// What the journal gave back at start.
    pub(super) restored: Restored,
    /// When this master started (the P2P route grace counts from it).
    pub(super) started_at: Instant,
    /// Location-cache holders' revocation queues (`docs/location-cache.md`).
    pub(super) cache_leases: CacheLeases,
    /// Where the last removal scan that answered `TRY_AGAIN` stopped: the next one starts
    /// there (and goes once around the table).
    pub(super) scan_cursor: Mutex<ScanPosition>,
    pub(super) workers: Workers,
}

/// Checks a key argument: an empty key is `INVALID_PARAMS`.
pub(super) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return fail(ErrorCode::InvalidParams, "empty key");
    }
    Ok(())
}

impl MasterService {
    /// Creates a master and starts its background threads (they hold only weak references).
    /// The configuration is used as given; call [`MasterConfig::validate`] first (out-of-range
    /// ratios only make eviction more or less eager, they never panic).
    pub fn new(config: MasterConfig) -> Arc<MasterService> {
        let service = Arc::new(Self::assemble(config, SegmentRegistry::default(), None));
        service.start_workers();
        service
    }

    /// A master that journals to `journal` (see [`JournalOptions`]): it first replays what
    /// the directory holds — segments wait dormant for their owners to re-attach for
    /// `reattach_grace_ms`, committed objects on them come back — then starts its threads.
    /// A torn tail of the newest log is cut and reported (`journal_torn_tail_bytes`).
    /// Errors: `INVALID_PARAMS` in P2P mode (its owners reclaim their routes instead);
    /// `INTERNAL_ERROR` naming the file when the directory is unusable or corrupt.
    pub fn open(config: MasterConfig, journal: JournalOptions) -> Result<Arc<MasterService>> {
        if config.deployment_mode != DeploymentMode::Centralized {
            return fail(
                ErrorCode::InvalidParams,
                "a journal is kept in CENTRALIZED mode only (P2P owners reclaim their routes)",
            );
        }
        let gate = Arc::new(crate::alloc::FreeGate::default());
        let (journal, replayed) = Journal::open(journal, Arc::clone(&gate))?;
        let journal = Arc::new(journal);
        let segments = SegmentRegistry::journaled(Arc::clone(&journal), gate);
        let mut service = Self::assemble(config, segments, Some(journal));
        service.restored = service.recover(replayed.state);
        let restored = service.restored;
        tracing::info!(
            segments = restored.segments,
            objects = restored.objects,
            torn_tail = replayed.torn.is_some(),
            "master recovered from its journal"
        );
        let service = Arc::new(service);
        service.start_workers();
        Ok(service)
    }

    fn assemble(
        config: MasterConfig,
        segments: SegmentRegistry,
        journal: Option<Arc<Journal>>,
    ) -> MasterService {
        let cache_leases = CacheLeases::new(
            config.location_cache_lease(),
            Duration::from_millis(config.location_cache_start_grace_ms),
        );
        MasterService {
            config,
            // 0 names no master (an owner that cannot vouch for its keys sends it).
            view_version: AtomicU64::new(fastrand::u64(1..)),
            objects: ObjectTable::default(),
            segments,
            clients: ClientTable::default(),
            pins: PinTable::default(),
            routes: RouteTable::default(),
            deferred: DeferredFrees::default(),
            disks: Arc::new(DiskTiers::default()),
            counters: Counters::default(),
            eviction_wanted: AtomicU64::new(0),
            evictions_done: AtomicU64::new(0),
            eviction_round: Mutex::new(()),
            next_reclaim: Mutex::new(Instant::now()),
            eviction_backoff: Mutex::new(super::eviction::Backoff::new(Instant::now())),
            next_write: IdBlocks::starting_at(fastrand::u64(1..1 << 62)),
            next_replica_id: IdBlocks::starting_at(1),
            started_at: Instant::now(),
            cache_leases,
            scan_cursor: Mutex::new(ScanPosition::default()),
            workers: Workers::default(),
            journal,
            token_reserve: Mutex::new(TokenReserve::default()),
            tokens_covered: AtomicU64::new(0),
            restored: Restored::default(),
        }
    }

    fn start_workers(self: &Arc<Self>) {
        let monitor_period =
            (self.config.client_ttl() / 4).clamp(Duration::from_millis(1), CLIENT_MONITOR_PERIOD);
        let weak = Arc::downgrade(self);
        let workers = &self.workers;
        workers.spawn(
            "mc-evict",
            EVICTION_PERIOD,
            weak.clone(),
            Self::eviction_tick,
        );
        workers.spawn("mc-clients", monitor_period, weak, Self::client_tick);
    }

    /// Stops and joins the background threads, and flushes and closes the journal.
    /// Idempotent. The service keeps answering calls afterwards, but nothing is evicted,
    /// expired or freed on a timer any more, and nothing more is journaled durably.
    pub fn shutdown(&self) {
        self.workers.stop();
        if let Some(journal) = &self.journal {
            journal.shutdown();
        }
    }

    /// Sets the view (the etcd revision that made this master the leader), before it serves.
    pub fn set_view_version(&self, view: u64) {
        self.view_version.store(view, Ordering::Release);
    }

    /// The standbys copying the journal, if there is one.
    pub(crate) fn journal_followers(
        &self,
    ) -> Option<std::collections::HashMap<ClientId, super::journal::Follower>> {
        self.journal.as_ref().map(|journal| journal.followers())
    }

    /// Stops waiting for standby `follower` (see [`super::journal::Journal::drop_follower`]).
    pub(crate) fn drop_journal_follower(&self, follower: ClientId) {
        if let Some(journal) = &self.journal {
            journal.drop_follower(follower);
        }
    }

    /// Registers `client` as alive for as long as this master runs: the client monitor never
    /// expires it, whatever its pings. For the in-process client of an embedded master, which
    /// cannot be dead while its master runs (a stalled process stalls both). Idempotent.
    pub(crate) fn keep_alive(&self, client: ClientId) {
        self.clients.keep_alive(client);
    }

    /// A snapshot of sizes and counters.
    pub fn metrics(&self) -> MasterMetrics {
        let segments = self.segments.metrics();
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        MasterMetrics {
            cluster_id: self.config.cluster_id.clone(),
            objects: self.objects.len() as u64,
            p2p_keys: self.routes.len() as u64,
            p2p_claimed_keys: self.routes.claimed() as u64,
            bytes_used: segments
                .iter()
                .fold(0, |n, s| n.saturating_add(s.used_bytes)),
            bytes_total: segments
                .iter()
                .fold(0, |n, s| n.saturating_add(s.total_bytes)),
            segments,
            evicted_objects: load(&self.counters.evicted_objects),
            evicted_bytes: load(&self.counters.evicted_bytes),
            leases_granted: self.counters.leases_granted.get(),
            active_pins: self.pins.len() as u64,
            pins_released: load(&self.counters.pins_released),
            clients_alive: self.clients.len() as u64,
            clients_expired: load(&self.counters.clients_expired),
            deferred_frees_pending: self.deferred.len() as u64,
            table_scans: load(&self.counters.table_scans),
            scan_removed: load(&self.counters.scan_removed),
            scan_slots: load(&self.counters.scan_slots),
            recovered_segments_waiting: self.segments.recovered_waiting() as u64,
            recovered_objects: self.restored.objects,
            journal: self.journal.as_ref().map(|journal| journal.metrics()),
            disk: super::metrics::DiskTierMetrics {
                demotions_started: load(&self.counters.demotions_started),
                demotions_committed: load(&self.counters.demotions_committed),
                demotions_failed: load(&self.counters.demotions_failed),
                demotions_refused: load(&self.counters.demotions_refused),
                demotions_expired: load(&self.counters.demotions_expired),
                demotions_in_flight: self.disks.demotions_in_flight() as u64,
                disk_replicas_lost: load(&self.counters.disk_replicas_lost),
                demotions_skipped: load(&self.counters.demotions_skipped),
                disk_evicted_objects: load(&self.counters.disk_evicted_objects),
                disk_evicted_bytes: load(&self.counters.disk_evicted_bytes),
                disk_objects_refused: load(&self.counters.disk_objects_refused),
                offloads_started: load(&self.counters.offloads_started),
                offloads_committed: load(&self.counters.offloads_committed),
                offloads_failed: load(&self.counters.offloads_failed),
                offloads_skipped: load(&self.counters.offloads_skipped),
                memory_released: load(&self.counters.memory_released),
                promotions_started: load(&self.counters.promotions_started),
                promotions_committed: load(&self.counters.promotions_committed),
                promotions_failed: load(&self.counters.promotions_failed),
                promotions_skipped: load(&self.counters.promotions_skipped),
            },
            location_cache: self.cache_leases.metrics(),
        }
    }

    /// Prometheus text exposition of [`MasterService::metrics`].
    pub fn prometheus_text(&self) -> String {
        self.metrics().prometheus_text()
    }

    /// When space an unfinished write gives up may be reused: its writer may transfer until
    /// `put_start_release_timeout` after the start (the grant's `write_ttl_ms`), and a payload
    /// sent by then is applied at most `write_quarantine` later.
    pub(super) fn writer_quiet_after(&self, started: Instant) -> Instant {
        let release = deadline(started, self.config.put_start_release_timeout());
        deadline(release, self.config.write_quarantine())
    }

    /// Releases the replicas of an object leaving the table: an unfinished write's bytes are
    /// kept until its writer cannot reach them any more ([`Self::writer_quiet_after`]); a
    /// complete object's until its read lease ends.
    pub(super) fn retire(&self, meta: &mut ObjectMeta, now: Instant) {
        self.retire_into(meta, now, &mut Released::default());
    }

    /// As [`Self::retire`], but ranges free at once go into `released` (freed when the
    /// caller drops it, after releasing the shard).
    pub(super) fn retire_into(&self, meta: &mut ObjectMeta, now: Instant, released: &mut Released) {
        let due = match meta.phase() {
            Phase::Writing { started } => self.writer_quiet_after(started),
            Phase::Complete => meta.lease_deadline().unwrap_or(now),
        };
        match due > now {
            true => self.deferred.hold_until(due, now, meta.take_allocations()),
            false => released.extend(meta.take_allocations()),
        }
        if let Some(copy) = meta.take_disk() {
            self.deferred.hold_disk_until(due, now, copy.hold);
        }
    }

    /// Erases replicas whose mount is gone (objects left without replicas disappear) and, if
    /// `writer` is given, that client's unfinished writes. The erased replicas' space is
    /// quarantined: a transfer admitted under the old mount may still be landing in it.
    pub(super) fn purge(&self, writer: Option<ClientId>) {
        let now = Instant::now();
        let quarantine = deadline(now, self.config.write_quarantine());
        self.objects.scan_in_slices(|shard, slots| {
            let doomed: Vec<String> = shard
                .slice_mut(slots)
                .filter_map(|(key, meta)| {
                    let abandoned =
                        writer.is_some_and(|w| meta.writer == w) && meta.write_started().is_some();
                    self.deferred
                        .hold_until(quarantine, now, meta.take_dead_replicas());
                    let unreadable = meta.replicas.is_empty() && meta.disk().is_none();
                    (abandoned || unreadable).then(|| key.to_string())
                })
                .collect();
            for key in doomed {
                if let Some(mut meta) = self.take_object(shard, &key) {
                    self.retire(&mut meta, now);
                }
            }
        });
    }
}

impl Drop for MasterService {
    fn drop(&mut self) {
        self.workers.stop();
    }
}

/// Runs `op` on each input, in order.
fn each<T, R>(items: Vec<T>, op: impl FnMut(T) -> Result<R>) -> Result<Vec<Result<R>>> {
    Ok(items.into_iter().map(op).collect())
}

/// Runs `op` on each `(keys[i], tokens[i])` (a finish of write `tokens[i]`), in order.
fn each_write(
    keys: Vec<String>,
    tokens: Vec<WriteToken>,
    mut op: impl FnMut(&str, WriteToken) -> Result<()>,
) -> Result<Vec<Result<()>>> {
    check_lengths(&keys, tokens.len(), "tokens")?;
    let pairs = keys.into_iter().zip(tokens).collect();
    each(pairs, |(key, token): (String, WriteToken)| op(&key, token))
}

fn check_lengths(keys: &[String], values: usize, what: &str) -> Result<()> {
    if keys.len() != values {
        return fail(
            ErrorCode::InvalidParams,
            format!("{} keys but {values} {what}", keys.len()),
        );
    }
    Ok(())
}

impl MasterApi for MasterService {
    fn service_ready(&self) -> Result<String> {
        Ok(STORE_VERSION.to_string())
    }

    fn ping(&self, client: ClientId) -> Result<PingResponse> {
        let registration = self.clients.ping(client, Instant::now());
        let status = match registration {
            Some(_) => ClientStatus::Ok,
            None => ClientStatus::NeedRemount,
        };
        Ok(PingResponse {
            view_version: self.view_version.load(Ordering::Acquire),
            status,
            registration: registration.unwrap_or(0),
            client_ttl_ms: u64::try_from(self.config.client_ttl().as_millis()).unwrap_or(u64::MAX),
        })
    }

    fn mount_segment(&self, client: ClientId, segment: Segment) -> Result<()> {
        self.require_mode(DeploymentMode::Centralized)?;
        // Registered first so the monitor cannot expire the client between the two steps.
        self.clients.register(client, Instant::now());
        if self.segments.mount(client, segment)? {
            self.purge(None);
        }
        Ok(())
    }

    fn remount_segments(&self, client: ClientId, segments: Vec<Segment>) -> Result<()> {
        self.require_mode(DeploymentMode::Centralized)?;
        self.clients.register(client, Instant::now());
        let outcomes: Vec<Result<bool>> = segments
            .into_iter()
            .map(|segment| self.segments.mount(client, segment))
            .collect();
        if outcomes.iter().any(|outcome| outcome == &Ok(true)) {
            self.purge(None);
        }
        outcomes
            .into_iter()
            .try_for_each(|outcome| outcome.map(drop))
    }

    fn unmount_segment(&self, client: ClientId, segment: SegmentId) -> Result<()> {
        if self.segments.unmount(client, segment)? {
            self.purge(None);
        }
        Ok(())
    }

    fn batch_put_start(
        &self,
        client: ClientId,
        keys: Vec<String>,
        sizes: Vec<u64>,
        config: ReplicateConfig,
    ) -> Result<Vec<Result<WriteGrant>>> {
        self.require_mode(DeploymentMode::Centralized)?;
        check_lengths(&keys, sizes.len(), "sizes")?;
        let pairs = keys.into_iter().zip(sizes).collect();
        each(pairs, |(key, size)| {
            self.put_start(client, &key, size, &config)
        })
    }

    fn batch_put_end(
        &self,
        client: ClientId,
        keys: Vec<String>,
        tokens: Vec<WriteToken>,
    ) -> Result<Vec<Result<()>>> {
        each_write(keys, tokens, |key, token| self.put_end(client, key, token))
    }

    fn batch_put_revoke(
        &self,
        client: ClientId,
        keys: Vec<String>,
        tokens: Vec<WriteToken>,
    ) -> Result<Vec<Result<()>>> {
        each_write(keys, tokens, |key, token| {
            self.put_revoke(client, key, token)
        })
    }

    fn batch_upsert_start(
        &self,
        client: ClientId,
        keys: Vec<String>,
        sizes: Vec<u64>,
        config: ReplicateConfig,
    ) -> Result<Vec<Result<WriteGrant>>> {
        self.require_mode(DeploymentMode::Centralized)?;
        check_lengths(&keys, sizes.len(), "sizes")?;
        let pairs = keys.into_iter().zip(sizes).collect();
        each(pairs, |(key, size)| {
            self.upsert_start(client, &key, size, &config)
        })
    }

    fn batch_get_replica_list(&self, keys: Vec<String>) -> Result<Vec<Result<QueryResult>>> {
        each(keys, |key| self.query(&key))
    }

    fn batch_get_locations(
        &self,
        client: ClientId,
        keys: Vec<String>,
    ) -> Result<Vec<Result<QueryResult>>> {
        let cacheable = self.cache_leases.is_polling(client);
        each(keys, |key| self.query_cached(client, &key, cacheable))
    }

    fn renew_locations(
        &self,
        client: ClientId,
        keys: Vec<String>,
    ) -> Result<Vec<Result<QueryResult>>> {
        let refused = self.under_memory_pressure();
        self.cache_leases.count_renewals(keys.len() as u64, refused);
        match refused {
            true => each(keys, |_| Err(ErrorCode::TryAgain)),
            false => self.batch_get_locations(client, keys),
        }
    }

    fn cache_revocations(
        &self,
        client: ClientId,
        incarnation: u64,
        acked: u64,
    ) -> Result<RevocationBatch> {
        Ok(self.cache_leases.poll(client, incarnation, acked))
    }

    fn await_revocations(&self, keys: Vec<String>) -> Result<bool> {
        Ok(self
            .cache_leases
            .wait(&keys, super::cache_leases::AWAIT_SLICE))
    }

    fn batch_exist_key(&self, keys: Vec<String>) -> Result<Vec<Result<bool>>> {
        each(keys, |key| self.exists(&key))
    }

    fn batch_remove(&self, keys: Vec<String>, force: bool) -> Result<Vec<Result<()>>> {
        each(keys, |key| self.remove(&key, force))
    }

    fn remove_by_regex(&self, pattern: String, force: bool) -> Result<u64> {
        let regex = match regex::Regex::new(&pattern) {
            Ok(regex) => regex,
            Err(error) => return fail(ErrorCode::InvalidParams, error),
        };
        self.remove_where(force, |key| regex.is_match(key))
    }

    fn remove_all(&self, force: bool) -> Result<u64> {
        self.remove_where(force, |_| true)
    }

    fn batch_pin(&self, client: ClientId, keys: Vec<String>) -> Result<Vec<Result<PinnedObject>>> {
        // Every client holding pins is registered (also one without a segment), so its pins
        // are released when it stops pinging for client_ttl.
        self.clients.register(client, Instant::now());
        each(keys, |key| self.pin(client, &key))
    }

    fn mount_disk(
        &self,
        client: ClientId,
        mount: DiskMount,
        page: DiskMountPage,
    ) -> Result<DiskMountAnswer> {
        self.mount_disk_tier(client, mount, page)
    }

    fn unmount_disk(&self, client: ClientId) -> Result<()> {
        self.close_disk_tier(client);
        Ok(())
    }

    fn disk_tasks(&self, client: ClientId) -> Result<Vec<DiskTask>> {
        self.disk_tasks_of(client)
    }

    fn disk_report(&self, client: ClientId, reports: Vec<DiskReport>) -> Result<Vec<bool>> {
        self.apply_disk_reports(client, reports)
    }

    fn recovered_segments(&self, client: ClientId) -> Result<Vec<Segment>> {
        self.recovered_of(client)
    }

    fn reattach_segment(
        &self,
        client: ClientId,
        previous_epoch: u64,
        segment: Segment,
    ) -> Result<bool> {
        self.reattach(client, previous_epoch, segment)
    }

    fn journal_files(
        &self,
        follower: ClientId,
        acked_lsn: u64,
    ) -> Result<Vec<super::journal::JournalFile>> {
        let journal = self.journal_or_fail()?;
        journal.follower_ack(follower, acked_lsn);
        journal.wait_beyond(acked_lsn, super::journal::FOLLOWER_POLL);
        journal.files()
    }

    fn journal_read(&self, name: String, offset: u64, max_bytes: u64) -> Result<Vec<u8>> {
        let max = max_bytes.min(super::journal::MAX_READ);
        self.journal_or_fail()?.read_file(&name, offset, max)
    }

    fn register_client(&self, client: ClientId) -> Result<()> {
        self.require_mode(DeploymentMode::Centralized)?;
        self.clients.register(client, Instant::now());
        Ok(())
    }

    fn unpin(&self, client: ClientId, pin_ids: Vec<u64>) -> Result<()> {
        self.release_pins(self.pins.take(client, &pin_ids));
        Ok(())
    }

    fn p2p_register_owner(&self, owner: P2pOwner) -> Result<()> {
        self.register_owner(owner)
    }

    fn p2p_list_owners(&self) -> Result<Vec<P2pOwner>> {
        self.list_owners()
    }

    fn p2p_add_keys(
        &self,
        client: ClientId,
        keys: Vec<String>,
        sizes: Vec<u64>,
    ) -> Result<Vec<Result<()>>> {
        self.add_routes(client, keys, sizes)
    }

    fn p2p_reclaim_keys(
        &self,
        client: ClientId,
        view_version: u64,
        keys: Vec<String>,
        sizes: Vec<u64>,
    ) -> Result<Vec<Result<()>>> {
        self.reclaim_routes(client, view_version, keys, sizes)
    }

    fn p2p_remove_keys(&self, client: ClientId, keys: Vec<String>) -> Result<Vec<Result<()>>> {
        self.remove_routes(client, keys)
    }

    fn p2p_get_routes(&self, keys: Vec<String>) -> Result<Vec<Result<P2pRoute>>> {
        self.routes_of(keys)
    }
}
