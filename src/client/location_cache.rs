//! The client's location cache (`docs/location-cache.md`): key → the master's replica list,
//! served without a master round trip while the answer's cached lease runs.
//!
//! Rules that keep a hit as good as a fresh answer:
//! - an entry's deadline is `sent + cache_ttl_ms − margin`, `sent` read before its request
//!   left (so it ends before the master's record of the lease);
//! - a hit needs a fresh revocation poll: the last poll that succeeded was sent less than
//!   [`LOCATION_CACHE_FRESH_MS`] ago (a client cut off from its master stops serving);
//! - an answer is cached only if no revocation of its key arrived since its request was sent
//!   ([`LocationCache::snapshot`] / [`LocationCache::insert`]), and nothing cleared the cache
//!   meanwhile;
//! - misses are never cached; the whole cache is dropped on a poll failure, a new master life
//!   (incarnation), a view change and this client's remount.
//!
//! Hot keys are renewed off the hot path: a hit in the second half of an entry's cached
//! lease queues the key once ([`LocationCache::take_renewals`]); the client's renewal thread
//! asks the master for those keys in one batch (`renew_locations`) and caches the answers
//! under the same rules as any other.
//!
//! Bounded in entries and bytes (`MC_LOCATION_CACHE_ENTRIES`, `MC_LOCATION_CACHE_BYTES`),
//! least recently used first (a second-chance clock per shard). Thread-safe: shards behind
//! their own mutexes; a hit takes one shard lock (and, once per entry, the renewal queue's
//! after it); inserts and revocations also take the revocation log's lock (always before a
//! shard's).

use crate::types::{QueryResult, Revocation, LOCATION_CACHE_FRESH_MS};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SHARDS: usize = 16;
/// Revocations remembered for answers still in flight when they arrived.
const LOG_LEN: usize = 4096;
/// Estimated bytes of one replica descriptor besides its strings.
const DESCRIPTOR_BYTES: usize = 96;
/// Keys waiting for renewal at most (more hot keys than this renew later, on a miss).
const MAX_RENEWALS_QUEUED: usize = 4096;

/// Counters of one client's location cache (`ClientMetrics::location_cache`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LocationCacheStats {
    /// Whether the cache is on (`MC_LOCATION_CACHE`).
    pub enabled: bool,
    /// Keys held now.
    pub entries: u64,
    /// Gets answered from the cache.
    pub hits: u64,
    /// Gets that asked the master (not cached, expired, or the poll not fresh).
    pub misses: u64,
    /// Entries dropped by a revocation from the master.
    pub revocations: u64,
    /// Entries found past their deadline.
    pub expiries: u64,
    /// Whole-cache drops (poll failure, new master life, remount).
    pub clears: u64,
    /// Answers not cached because a revocation or a clear overtook them.
    pub refused_inserts: u64,
    /// Hits whose read failed and were asked again of the master.
    pub stale_retries: u64,
    /// Hot entries renewed ahead of their expiry (answers of `renew_locations` cached).
    pub renewals: u64,
    /// Renewals the master refused (its segments above the eviction high watermark): those
    /// entries expire and the key's next get asks the master.
    pub renewals_refused: u64,
    /// Keys of renewal calls that failed (the master unreachable, or one that does not know
    /// `renew_locations`): those entries expire too.
    pub renewals_failed: u64,
}

/// A cached answer.
struct Entry {
    query: Arc<QueryResult>,
    /// Served until then (the cached lease, less a margin).
    serve_until: Instant,
    /// The read lease of the answer: a read must end by then (its bytes are kept that long).
    lease_until: Instant,
    /// A hit from then on queues the key for renewal (half the cached lease).
    renew_from: Instant,
    /// Queued for renewal already (once per entry).
    renewal_queued: bool,
    bytes: usize,
    referenced: bool,
    /// Its slot in the shard's clock (a slot with another mark is a leftover).
    mark: u64,
}

#[derive(Default)]
struct Shard {
    map: HashMap<String, Entry>,
    /// (key, mark) in insertion order for the clock; a slot whose mark is not its entry's
    /// (the key was dropped, and maybe cached again since) is skipped and compacted away.
    clock: VecDeque<(String, u64)>,
    next_mark: u64,
    bytes: usize,
}

impl Shard {
    /// Whether `slot` is the live clock slot of its key.
    fn is_live(&self, slot: &(String, u64)) -> bool {
        self.map.get(&slot.0).is_some_and(|e| e.mark == slot.1)
    }
}

/// What a request saw before it was sent: the cache generation and the last revocation.
#[derive(Clone, Copy, Debug)]
pub(super) struct Snapshot {
    generation: u64,
    seq: u64,
}

/// Revocations applied recently, to refuse answers that were in flight when they arrived.
#[derive(Default)]
struct RevocationLog {
    generation: u64,
    /// Highest sequence number applied.
    last: u64,
    /// Sequence number below which the log no longer knows the keys.
    floor: u64,
    recent: VecDeque<(u64, String)>,
}

/// See the module documentation.
pub(super) struct LocationCache {
    enabled: bool,
    hasher: RandomState,
    shards: Vec<Mutex<Shard>>,
    max_entries_per_shard: usize,
    max_bytes_per_shard: usize,
    log: Mutex<RevocationLog>,
    /// When this cache was made (the clock of `fresh_since_ns`).
    origin: Instant,
    /// Send time (ns after `origin`) of the last poll that succeeded; 0: none yet.
    fresh_since_ns: AtomicU64,
    /// Hot keys to renew (see the module documentation), at most [`MAX_RENEWALS_QUEUED`].
    renewals: Mutex<Vec<String>>,
    stats: StatsCounters,
}

#[derive(Default)]
struct StatsCounters {
    hits: AtomicU64,
    misses: AtomicU64,
    revocations: AtomicU64,
    expiries: AtomicU64,
    clears: AtomicU64,
    refused_inserts: AtomicU64,
    stale_retries: AtomicU64,
    renewals: AtomicU64,
    renewals_refused: AtomicU64,
    renewals_failed: AtomicU64,
}

fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl LocationCache {
    /// A cache, on when `enabled`, holding at most `max_entries` keys and `max_bytes`.
    pub(super) fn new(enabled: bool, max_entries: usize, max_bytes: usize) -> LocationCache {
        LocationCache {
            enabled,
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            max_entries_per_shard: max_entries.div_ceil(SHARDS).max(1),
            max_bytes_per_shard: max_bytes.div_ceil(SHARDS).max(1),
            log: Mutex::new(RevocationLog::default()),
            origin: Instant::now(),
            fresh_since_ns: AtomicU64::new(0),
            renewals: Mutex::new(Vec::new()),
            stats: StatsCounters::default(),
        }
    }

    /// From the environment (`MC_LOCATION_CACHE`, `MC_LOCATION_CACHE_ENTRIES`,
    /// `MC_LOCATION_CACHE_BYTES`).
    pub(super) fn from_env() -> LocationCache {
        let size = |knob: &crate::env::Knob| usize::try_from(knob.get()).unwrap_or(usize::MAX);
        LocationCache::new(
            crate::env::LOCATION_CACHE.flag(),
            size(&crate::env::LOCATION_CACHE_ENTRIES),
            size(&crate::env::LOCATION_CACHE_BYTES),
        )
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    fn ns_since_origin(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether the last successful poll was sent recently enough to serve hits at `now`.
    fn is_fresh(&self, now: Instant) -> bool {
        let since = self.fresh_since_ns.load(Ordering::Acquire);
        since != 0
            && self.ns_since_origin(now).saturating_sub(since)
                < Duration::from_millis(LOCATION_CACHE_FRESH_MS).as_nanos() as u64
    }

    /// Records that a poll sent at `sent` succeeded (its revocations applied).
    pub(super) fn mark_fresh(&self, sent: Instant) {
        let ns = self.ns_since_origin(sent).max(1);
        self.fresh_since_ns.fetch_max(ns, Ordering::AcqRel);
    }

    /// The cached answer for `key` and the end of its read lease, if it may be served at
    /// `now`; counts a hit or a miss.
    pub(super) fn lookup(&self, key: &str, now: Instant) -> Option<(Arc<QueryResult>, Instant)> {
        if !self.enabled {
            return None;
        }
        let found = match self.is_fresh(now) {
            true => {
                let mut shard = self.shard(key).lock();
                match shard.map.get_mut(key) {
                    Some(entry) if now < entry.serve_until => {
                        entry.referenced = true;
                        if now >= entry.renew_from && !entry.renewal_queued {
                            let mut queue = self.renewals.lock();
                            if queue.len() < MAX_RENEWALS_QUEUED {
                                entry.renewal_queued = true;
                                queue.push(key.to_string());
                            }
                        }
                        Some((Arc::clone(&entry.query), entry.lease_until))
                    }
                    Some(_) => {
                        let gone = shard.map.remove(key).map_or(0, |e| e.bytes);
                        shard.bytes -= gone;
                        bump(&self.stats.expiries, 1);
                        None
                    }
                    None => None,
                }
            }
            false => None,
        };
        bump(
            match found {
                Some(_) => &self.stats.hits,
                None => &self.stats.misses,
            },
            1,
        );
        found
    }

    /// What a request about to be sent must present to [`Self::insert`] its answers.
    pub(super) fn snapshot(&self) -> Snapshot {
        let log = self.log.lock();
        Snapshot {
            generation: log.generation,
            seq: log.last,
        }
    }

    /// Caches `query` for `key` (its request was sent at `sent`) for its `cache_ttl_ms` less
    /// a sixteenth, unless it is not cacheable or a revocation of `key` or a clear came after
    /// `seen` was taken (then the answer is used once, not kept). Returns whether it was
    /// cached.
    pub(super) fn insert(
        &self,
        key: &str,
        query: Arc<QueryResult>,
        sent: Instant,
        seen: Snapshot,
    ) -> bool {
        if !self.enabled || query.cache_ttl_ms == 0 {
            return false;
        }
        let cached = Duration::from_millis(query.cache_ttl_ms);
        let serve_until = sent + cached - cached / 16;
        let renew_from = sent + cached / 2;
        let lease_until = sent + Duration::from_millis(query.lease_ttl_ms);
        let log = self.log.lock();
        let overtaken = log.generation != seen.generation
            || log.floor > seen.seq
            || log
                .recent
                .iter()
                .any(|(seq, k)| *seq > seen.seq && k == key);
        if overtaken {
            bump(&self.stats.refused_inserts, 1);
            return false;
        }
        let bytes = key.len()
            + query
                .replicas
                .iter()
                .map(|r| DESCRIPTOR_BYTES + r.buffer.transport_endpoint.len())
                .sum::<usize>();
        let mut shard = self.shard(key).lock();
        let shard = &mut *shard;
        let mark = match shard.map.get(key) {
            Some(old) => old.mark,
            None => {
                shard.next_mark += 1;
                shard.clock.push_back((key.to_string(), shard.next_mark));
                shard.next_mark
            }
        };
        let old = shard.map.insert(
            key.to_string(),
            Entry {
                query,
                serve_until,
                lease_until,
                renew_from,
                renewal_queued: false,
                bytes,
                referenced: false,
                mark,
            },
        );
        if let Some(old) = old {
            shard.bytes -= old.bytes;
        }
        shard.bytes += bytes;
        self.evict(shard);
        drop(log);
        true
    }

    /// Drops least recently used entries (second chance) until `shard` fits its bounds.
    fn evict(&self, shard: &mut Shard) {
        let mut turns = 2 * shard.clock.len() + 1;
        while (shard.map.len() > self.max_entries_per_shard
            || shard.bytes > self.max_bytes_per_shard)
            && turns > 0
        {
            turns -= 1;
            let Some(slot) = shard.clock.pop_front() else {
                break;
            };
            if !shard.is_live(&slot) {
                continue;
            }
            match shard.map.get_mut(&slot.0) {
                Some(entry) if entry.referenced => {
                    entry.referenced = false;
                    shard.clock.push_back(slot);
                }
                _ => {
                    let gone = shard.map.remove(&slot.0).map_or(0, |e| e.bytes);
                    shard.bytes -= gone;
                }
            }
        }
        // Slots of dropped keys linger in the clock: compact it when they dominate.
        if shard.clock.len() > 2 * shard.map.len() + 64 {
            let mut clock = std::mem::take(&mut shard.clock);
            clock.retain(|slot| shard.is_live(slot));
            shard.clock = clock;
        }
    }

    /// Up to `max` keys queued for renewal by hits (oldest first), taken off the queue, less
    /// those no longer cached (revoked, dropped or evicted since they were queued).
    pub(super) fn take_renewals(&self, max: usize) -> Vec<String> {
        let mut taken = {
            let mut queue = self.renewals.lock();
            let count = max.min(queue.len());
            let rest = queue.split_off(count);
            std::mem::replace(&mut *queue, rest)
        };
        // The queue's lock is released: a hit takes a shard's lock before the queue's.
        taken.retain(|key| self.shard(key).lock().map.contains_key(key));
        taken
    }

    /// Counts renewals: `renewed` cached, `refused` by the master, `failed` in calls that
    /// failed.
    pub(super) fn count_renewals(&self, renewed: u64, refused: u64, failed: u64) {
        bump(&self.stats.renewals, renewed);
        bump(&self.stats.renewals_refused, refused);
        bump(&self.stats.renewals_failed, failed);
    }

    /// Drops `key` (a read of its cached answer failed; the caller asks the master again).
    pub(super) fn forget(&self, key: &str) {
        let mut shard = self.shard(key).lock();
        if let Some(entry) = shard.map.remove(key) {
            shard.bytes -= entry.bytes;
        }
        bump(&self.stats.stale_retries, 1);
    }

    /// Applies revocations from the master: each key is dropped and remembered; returns the
    /// highest sequence number applied (to acknowledge), or `acked` when none is higher.
    pub(super) fn revoke(&self, revocations: &[Revocation], acked: u64) -> u64 {
        let mut log = self.log.lock();
        let mut highest = acked;
        for revocation in revocations {
            let mut shard = self.shard(&revocation.key).lock();
            if let Some(entry) = shard.map.remove(&revocation.key) {
                shard.bytes -= entry.bytes;
                bump(&self.stats.revocations, 1);
            }
            drop(shard);
            log.recent
                .push_back((revocation.seq, revocation.key.clone()));
            if log.recent.len() > LOG_LEN {
                if let Some((seq, _)) = log.recent.pop_front() {
                    log.floor = log.floor.max(seq);
                }
            }
            highest = highest.max(revocation.seq);
        }
        log.last = log.last.max(highest);
        highest
    }

    /// Drops every entry and stops hits until the next successful poll; answers in flight
    /// are not cached. Sequence numbers start again (a new master life).
    pub(super) fn clear(&self) {
        let mut log = self.log.lock();
        log.generation += 1;
        log.last = 0;
        log.floor = 0;
        log.recent.clear();
        self.fresh_since_ns.store(0, Ordering::Release);
        self.renewals.lock().clear();
        for shard in &self.shards {
            let mut shard = shard.lock();
            shard.map.clear();
            shard.clock.clear();
            shard.bytes = 0;
        }
        bump(&self.stats.clears, 1);
    }

    /// A snapshot of the counters.
    pub(super) fn stats(&self) -> LocationCacheStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LocationCacheStats {
            enabled: self.enabled,
            entries: self.shards.iter().map(|s| s.lock().map.len() as u64).sum(),
            hits: get(&self.stats.hits),
            misses: get(&self.stats.misses),
            revocations: get(&self.stats.revocations),
            expiries: get(&self.stats.expiries),
            clears: get(&self.stats.clears),
            refused_inserts: get(&self.stats.refused_inserts),
            stale_retries: get(&self.stats.stale_retries),
            renewals: get(&self.stats.renewals),
            renewals_refused: get(&self.stats.renewals_refused),
            renewals_failed: get(&self.stats.renewals_failed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{BufferDescriptor, ReplicaDescriptor, ReplicaStatus};

    fn answer(size: u64, cache_ttl_ms: u64) -> Arc<QueryResult> {
        Arc::new(QueryResult {
            size,
            replicas: vec![ReplicaDescriptor {
                id: 1,
                buffer: BufferDescriptor {
                    size,
                    buffer_address: 0x1000,
                    protocol: "tcp".into(),
                    transport_endpoint: "127.0.0.1:1".into(),
                    epoch: 9,
                },
                status: ReplicaStatus::Complete,
                disk: None,
            }],
            lease_ttl_ms: 10_000,
            cache_ttl_ms,
        })
    }

    fn fresh_cache(entries: usize) -> LocationCache {
        let cache = LocationCache::new(true, entries, 1 << 30);
        cache.mark_fresh(Instant::now());
        cache
    }

    fn revocation(seq: u64, key: &str) -> Revocation {
        Revocation {
            seq,
            key: key.into(),
        }
    }

    #[test]
    fn a_hit_needs_a_fresh_poll_and_a_running_cached_lease() {
        let cache = LocationCache::new(true, 100, 1 << 20);
        let sent = Instant::now();
        cache.insert("k", answer(7, 1_000), sent, cache.snapshot());
        assert!(
            cache.lookup("k", sent).is_none(),
            "no poll has succeeded yet"
        );
        cache.mark_fresh(sent);
        let (query, lease_until) = cache.lookup("k", sent).expect("a hit");
        assert_eq!(query.size, 7);
        assert_eq!(lease_until, sent + Duration::from_millis(10_000));
        // Served until the cached lease less a sixteenth; the poll must be fresh too.
        let late = sent + Duration::from_millis(1_000 - 1_000 / 16);
        cache.mark_fresh(late);
        assert!(cache.lookup("k", late).is_none(), "past the cached lease");
        let stale_poll = late + Duration::from_millis(LOCATION_CACHE_FRESH_MS);
        cache.insert("j", answer(1, 60_000), late, cache.snapshot());
        assert!(cache.lookup("j", stale_poll).is_none(), "poll not fresh");
        let stats = cache.stats();
        assert_eq!(
            (stats.hits, stats.misses, stats.expiries, stats.entries),
            (1, 3, 1, 1)
        );
    }

    #[test]
    fn hits_in_the_second_half_of_a_cached_lease_queue_one_renewal() {
        let cache = fresh_cache(100);
        let hit = |key: &str, at: Instant| {
            cache.mark_fresh(at);
            cache.lookup(key, at).is_some()
        };
        let ms = Duration::from_millis;
        let sent = Instant::now();
        cache.insert("hot", answer(1, 1_000), sent, cache.snapshot());
        assert!(hit("hot", sent + ms(499)));
        assert!(cache.take_renewals(16).is_empty(), "not half way yet");
        for _ in 0..3 {
            assert!(hit("hot", sent + ms(500)));
        }
        assert_eq!(cache.take_renewals(16), vec!["hot".to_string()]);
        assert!(hit("hot", sent + ms(600)));
        assert!(cache.take_renewals(16).is_empty(), "queued once per entry");
        // The renewed answer is a new entry: its own second half queues it again.
        let renewed = sent + ms(600);
        cache.insert("hot", answer(1, 1_000), renewed, cache.snapshot());
        assert!(hit("hot", renewed + ms(100)));
        assert!(cache.take_renewals(16).is_empty());
        assert!(hit("hot", renewed + ms(500)));
        assert_eq!(cache.take_renewals(16), vec!["hot".to_string()]);
        // At most `max` per take, oldest first; a key revoked since it was queued is not
        // renewed; a clear forgets the rest.
        for key in ["a", "b", "c", "d"] {
            cache.insert(key, answer(1, 1_000), renewed, cache.snapshot());
            assert!(hit(key, renewed + ms(500)));
        }
        assert_eq!(cache.take_renewals(2), vec!["a".to_string(), "b".into()]);
        cache.revoke(&[revocation(1, "c")], 0);
        assert_eq!(cache.take_renewals(1), Vec::<String>::new());
        cache.clear();
        assert!(cache.take_renewals(16).is_empty());
    }

    #[test]
    fn an_answer_overtaken_by_its_keys_revocation_or_a_clear_is_not_kept() {
        let cache = fresh_cache(100);
        let now = Instant::now();
        let before = cache.snapshot();
        assert_eq!(cache.revoke(&[revocation(1, "k")], 0), 1);
        cache.insert("k", answer(1, 1_000), now, before);
        cache.insert("other", answer(2, 1_000), now, before);
        assert!(cache.lookup("k", now).is_none());
        assert!(cache.lookup("other", now).is_some());
        // An answer asked after the revocation is kept.
        cache.insert("k", answer(3, 1_000), now, cache.snapshot());
        assert_eq!(cache.lookup("k", now).unwrap().0.size, 3);
        // A revocation drops the entry.
        assert_eq!(cache.revoke(&[revocation(2, "k")], 1), 2);
        assert!(cache.lookup("k", now).is_none());
        // A clear drops everything, stops hits and refuses answers asked before it.
        let before = cache.snapshot();
        cache.clear();
        cache.mark_fresh(now);
        cache.insert("late", answer(4, 1_000), now, before);
        assert!(cache.lookup("late", now).is_none());
        assert!(cache.lookup("other", now).is_none());
        // Uncacheable answers are never kept.
        cache.insert("never", answer(5, 0), now, cache.snapshot());
        assert!(cache.lookup("never", now).is_none());
        let stats = cache.stats();
        assert_eq!(
            (stats.revocations, stats.clears, stats.refused_inserts),
            (1, 1, 2)
        );
    }

    #[test]
    fn a_revocation_log_that_forgot_an_answers_window_refuses_it() {
        let cache = fresh_cache(100);
        let before = cache.snapshot();
        let flood: Vec<Revocation> = (1..=LOG_LEN as u64 + 10)
            .map(|seq| revocation(seq, &format!("x{seq}")))
            .collect();
        cache.revoke(&flood, 0);
        cache.insert("k", answer(1, 1_000), Instant::now(), before);
        assert!(cache.lookup("k", Instant::now()).is_none());
    }

    #[test]
    fn the_least_recently_used_entries_go_first() {
        let cache = fresh_cache(SHARDS); // one entry per shard
        let now = Instant::now();
        let keys: Vec<String> = (0..200).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            cache.insert(key, answer(1, 1_000), now, cache.snapshot());
        }
        assert!(cache.stats().entries <= SHARDS as u64);
        // Bytes bound too.
        let small = LocationCache::new(true, 1_000, SHARDS * 200);
        small.mark_fresh(now);
        for key in &keys {
            small.insert(key, answer(1, 1_000), now, small.snapshot());
        }
        let per_entry = 96 + "127.0.0.1:1".len() + "key-100".len();
        assert!(small.stats().entries <= (SHARDS * 200 / per_entry) as u64 + SHARDS as u64);
        // A referenced entry gets a second chance over an unreferenced one.
        let two = fresh_cache(2 * SHARDS);
        let same_shard: Vec<String> = keys
            .iter()
            .filter(|k| (two.hasher.hash_one(k.as_str()) as usize).is_multiple_of(SHARDS))
            .take(3)
            .cloned()
            .collect();
        two.insert(&same_shard[0], answer(1, 1_000), now, two.snapshot());
        two.insert(&same_shard[1], answer(1, 1_000), now, two.snapshot());
        assert!(two.lookup(&same_shard[0], now).is_some());
        two.insert(&same_shard[2], answer(1, 1_000), now, two.snapshot());
        assert!(two.lookup(&same_shard[0], now).is_some(), "used: kept");
        assert!(two.lookup(&same_shard[1], now).is_none(), "unused: evicted");
    }

    #[test]
    fn a_disabled_cache_never_serves() {
        let cache = LocationCache::new(false, 100, 1 << 20);
        cache.mark_fresh(Instant::now());
        cache.insert("k", answer(1, 1_000), Instant::now(), cache.snapshot());
        assert!(cache.lookup("k", Instant::now()).is_none());
        assert_eq!(cache.stats().entries, 0);
    }
}

#[cfg(test)]
mod clock_tests {
    use super::*;

    /// A key cached, expired and cached again, over and over, leaves a bounded clock (it
    /// once grew by one slot per round, and every insert then scanned it whole: gets that
    /// missed every time slowed from 59 to 92 µs in 2.4 s).
    #[test]
    fn a_key_cached_again_after_expiring_keeps_one_clock_slot() {
        let cache = LocationCache::new(true, 1_000, 1 << 30);
        let start = Instant::now();
        let answer = Arc::new(QueryResult {
            size: 1,
            replicas: Vec::new(),
            lease_ttl_ms: 10_000,
            cache_ttl_ms: 1,
        });
        for round in 0..1_000u64 {
            let sent = start + Duration::from_millis(2 * round);
            cache.mark_fresh(sent);
            cache.insert("k", Arc::clone(&answer), sent, cache.snapshot());
            // Past its 1 ms lease: dropped as expired.
            assert!(cache.lookup("k", sent + Duration::from_millis(1)).is_none());
        }
        let slots: usize = cache.shards.iter().map(|s| s.lock().clock.len()).sum();
        assert!(slots <= 2 + 64 + 1, "{slots} clock slots for one key");
    }
}
