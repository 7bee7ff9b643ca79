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
//! Bounded in entries and bytes (`MC_LOCATION_CACHE_ENTRIES`, `MC_LOCATION_CACHE_BYTES`),
//! least recently used first (a second-chance clock per shard). Thread-safe: shards behind
//! their own mutexes; a hit takes one shard lock; inserts and revocations also take the
//! revocation log's lock (always before a shard's).

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
}

/// A cached answer.
struct Entry {
    query: Arc<QueryResult>,
    /// Served until then (the cached lease, less a margin).
    serve_until: Instant,
    /// The read lease of the answer: a read must end by then (its bytes are kept that long).
    lease_until: Instant,
    bytes: usize,
    referenced: bool,
}

#[derive(Default)]
struct Shard {
    map: HashMap<String, Entry>,
    /// Keys in insertion order for the clock (may name keys since removed).
    clock: VecDeque<String>,
    bytes: usize,
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
    /// `seen` was taken (then the answer is used once, not kept).
    pub(super) fn insert(&self, key: &str, query: Arc<QueryResult>, sent: Instant, seen: Snapshot) {
        if !self.enabled || query.cache_ttl_ms == 0 {
            return;
        }
        let cached = Duration::from_millis(query.cache_ttl_ms);
        let serve_until = sent + cached - cached / 16;
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
            return;
        }
        let bytes = key.len()
            + query
                .replicas
                .iter()
                .map(|r| DESCRIPTOR_BYTES + r.buffer.transport_endpoint.len())
                .sum::<usize>();
        let mut shard = self.shard(key).lock();
        let old = shard.map.insert(
            key.to_string(),
            Entry {
                query,
                serve_until,
                lease_until,
                bytes,
                referenced: false,
            },
        );
        match old {
            Some(old) => shard.bytes -= old.bytes,
            None => shard.clock.push_back(key.to_string()),
        }
        shard.bytes += bytes;
        self.evict(&mut shard);
        drop(log);
    }

    /// Drops least recently used entries (second chance) until `shard` fits its bounds.
    fn evict(&self, shard: &mut Shard) {
        let mut turns = 2 * shard.clock.len() + 1;
        while (shard.map.len() > self.max_entries_per_shard
            || shard.bytes > self.max_bytes_per_shard)
            && turns > 0
        {
            turns -= 1;
            let Some(key) = shard.clock.pop_front() else {
                break;
            };
            match shard.map.get_mut(&key) {
                Some(entry) if entry.referenced => {
                    entry.referenced = false;
                    shard.clock.push_back(key);
                }
                Some(_) => {
                    let gone = shard.map.remove(&key).map_or(0, |e| e.bytes);
                    shard.bytes -= gone;
                }
                None => {}
            }
        }
        // Keys removed by revocations linger in the clock: compact it when they dominate.
        if shard.clock.len() > 2 * shard.map.len() + 64 {
            let map = &shard.map;
            let mut clock = std::mem::take(&mut shard.clock);
            clock.retain(|k| map.contains_key(k));
            shard.clock = clock;
        }
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
        }
    }
}
