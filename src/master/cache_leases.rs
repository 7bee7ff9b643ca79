//! Location-cache leases (`docs/location-cache.md`): which clients may serve a key's replica
//! list from their own cache, the revocations queued for them, and the wait of a write for
//! those revocations.
//!
//! A client asks for cacheable answers with `batch_get_locations`; the master records it as a
//! *holder* of each key it answered (in the object's record, with the holder's deadline:
//! [`CacheLeases::lease`] from the answer, never past the object's read lease) — but only
//! while the client keeps its revocation poll open ([`CacheLeases::is_polling`]), so a client
//! that cannot hear revocations is never a holder. When a key's value changes or goes (an
//! upsert, a removal of any kind, an object leaving the table), every live holder is sent a
//! revocation ([`CacheLeases::revoke`]) through its long poll (`cache_revocations`), and the
//! writer, before its write is acknowledged, waits (`await_revocations`) until each holder
//! acknowledged or its lease ran out: a partitioned holder delays a write by at most one
//! cache lease, and never serves the old value after the write is acknowledged.
//!
//! Holders granted by an earlier life of the master (before a restart or a failover) are not
//! known, but they stop serving once their poll has not succeeded for
//! [`crate::types::LOCATION_CACHE_FRESH_MS`]: for a start grace after [`CacheLeases::new`]
//! (`location_cache_start_grace_ms`), every write waits for that grace to end.
//!
//! Thread-safety: every method takes `&self`; the client table is behind a `RwLock` read on
//! the grant path, each client's queue behind its own mutex; waits sleep on one condvar that
//! every acknowledgement notifies.

use super::metrics::LocationCacheMetrics;
use crate::types::{ClientId, Revocation, RevocationBatch};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one `cache_revocations` poll waits for a revocation before answering empty, while
/// the polling clients are at most half the server's poll threads (with more, each waits
/// proportionally less, down to [`MIN_POLL_WAIT`], so a waiting poll never sits behind parked
/// ones for long).
pub(crate) const POLL_WAIT: Duration = Duration::from_millis(100);
const MIN_POLL_WAIT: Duration = Duration::from_millis(5);
/// How long one `await_revocations` call waits before answering "still pending".
pub(crate) const AWAIT_SLICE: Duration = Duration::from_millis(100);
/// A client counts as polling while its last poll ended (or started) this recently.
const POLL_FRESH: Duration = Duration::from_millis(1000);
/// A queue whose client has not polled for this long is forgotten by [`CacheLeases::sweep`].
const IDLE_QUEUE: Duration = Duration::from_secs(30);
/// Revocations one poll answer carries at most.
const MAX_BATCH: usize = 4096;

/// One holder of a cached lease on a key: the client and when its lease ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub client: ClientId,
    pub until: Instant,
}

/// A revocation sent and not yet acknowledged.
#[derive(Debug)]
struct Pending {
    seq: u64,
    key: String,
    until: Instant,
    /// Global issue number (a wait for "every revocation so far" ignores later ones).
    issued: u64,
}

/// One client's revocation queue.
#[derive(Debug, Default)]
struct Queue {
    /// Sequence number of the next revocation (the first is 1).
    next_seq: u64,
    /// Every revocation up to this one is acknowledged.
    acked: u64,
    /// Sent, or waiting to be sent, and not acknowledged; in `seq` order.
    pending: VecDeque<Pending>,
    /// Highest `seq` already handed to a poll.
    delivered: u64,
    /// When the last poll started or ended (ms since the table's start).
    last_poll_ms: u64,
}

/// Counters of the location-cache leases (`/metrics`, see [`LocationCacheMetrics`]).
#[derive(Debug, Default)]
pub(crate) struct CacheLeaseCounters {
    pub holders_granted: AtomicU64,
    pub revocations_sent: AtomicU64,
    pub revocations_acked: AtomicU64,
    /// Revocations a writer stopped waiting for because the holder's lease ran out.
    pub revocations_expired: AtomicU64,
    /// Writes that waited for at least one revocation, and their total wait.
    pub writes_waited: AtomicU64,
    pub write_wait_us: AtomicU64,
    /// Keys asked for in `renew_locations`, and those refused under memory pressure.
    pub renewals: AtomicU64,
    pub renewals_refused: AtomicU64,
}

/// The master's location-cache lease table. See the module documentation.
pub(crate) struct CacheLeases {
    /// Cache lease length; zero: no cacheable answers at all.
    lease: Duration,
    /// Writes wait until this long after `started` (see the module documentation).
    grace: Duration,
    /// Random per master start: a poll naming another incarnation's acknowledgement is not
    /// one for this master's queue.
    incarnation: u64,
    started: Instant,
    clients: RwLock<HashMap<ClientId, Arc<Mutex<Queue>>>>,
    /// Keys with revocations sent, until the last of their holders' leases: a new object of
    /// such a key (a write that pre-empts another, a put after a removal or an eviction) must
    /// wait for them as the write that sent them does. Pruned when looked up and by
    /// [`Self::sweep`].
    outstanding: Mutex<HashMap<String, Instant>>,
    issued: AtomicU64,
    /// Notified on every acknowledgement and every new revocation.
    changed: Condvar,
    changed_lock: Mutex<()>,
    pub(crate) counters: CacheLeaseCounters,
}

impl CacheLeases {
    /// A table granting `lease`-long cached leases (zero: none) whose writes wait out `grace`
    /// after now.
    pub(crate) fn new(lease: Duration, grace: Duration) -> CacheLeases {
        CacheLeases {
            lease,
            grace,
            incarnation: fastrand::u64(1..),
            started: Instant::now(),
            clients: RwLock::new(HashMap::new()),
            outstanding: Mutex::new(HashMap::new()),
            issued: AtomicU64::new(0),
            changed: Condvar::new(),
            changed_lock: Mutex::new(()),
            counters: CacheLeaseCounters::default(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn queue(&self, client: ClientId) -> Option<Arc<Mutex<Queue>>> {
        self.clients.read().get(&client).cloned()
    }

    fn queue_or_new(&self, client: ClientId) -> Arc<Mutex<Queue>> {
        if let Some(queue) = self.queue(client) {
            return queue;
        }
        let mut clients = self.clients.write();
        Arc::clone(clients.entry(client).or_insert_with(|| {
            Arc::new(Mutex::new(Queue {
                next_seq: 1,
                ..Queue::default()
            }))
        }))
    }

    /// Whether `client` may be made a holder now: caching is on and its revocation poll is
    /// open (a poll started or ended within the last second).
    pub(crate) fn is_polling(&self, client: ClientId) -> bool {
        if self.lease.is_zero() {
            return false;
        }
        match self.queue(client) {
            Some(queue) => {
                self.now_ms().saturating_sub(queue.lock().last_poll_ms)
                    <= POLL_FRESH.as_millis() as u64
            }
            None => false,
        }
    }

    /// Records `client` among `holders` until `until` (replacing its earlier entry) and
    /// forgets holders whose lease is over at `now`.
    pub(crate) fn hold(
        &self,
        holders: &mut Vec<Holder>,
        client: ClientId,
        until: Instant,
        now: Instant,
    ) {
        holders.retain(|h| h.client != client && h.until > now);
        holders.push(Holder { client, until });
        self.counters
            .holders_granted
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Sends a revocation of `key` to every holder whose lease is still running at `now`.
    /// Returns whether any was sent (the writer must then wait, see [`Self::wait`]).
    pub(crate) fn revoke(&self, key: &str, holders: Vec<Holder>, now: Instant) -> bool {
        let mut sent = false;
        let last = holders
            .iter()
            .map(|h| h.until)
            .filter(|&until| until > now)
            .max();
        if let Some(last) = last {
            let mut outstanding = self.outstanding.lock();
            let until = outstanding.entry(key.to_string()).or_insert(last);
            *until = (*until).max(last);
        }
        for holder in holders.into_iter().filter(|h| h.until > now) {
            let queue = self.queue_or_new(holder.client);
            let mut queue = queue.lock();
            let seq = queue.next_seq;
            queue.next_seq += 1;
            queue.pending.push_back(Pending {
                seq,
                key: key.to_string(),
                until: holder.until,
                issued: self.issued.fetch_add(1, Ordering::Relaxed) + 1,
            });
            sent = true;
            self.counters
                .revocations_sent
                .fetch_add(1, Ordering::Relaxed);
        }
        if sent {
            self.notify();
        }
        sent
    }

    /// How long a poll may park now (see [`POLL_WAIT`]).
    fn poll_wait(&self) -> Duration {
        let pollers = self.clients.read().len().max(1) as u32;
        let share = (crate::rpc::server::POLL_THREADS / 2) as u32;
        match pollers <= share {
            true => POLL_WAIT,
            false => (POLL_WAIT * share / pollers).max(MIN_POLL_WAIT),
        }
    }

    /// Whether a write must wait before its acknowledgement even without a revocation: the
    /// grace after this master's start is not over (holders of an earlier life are unknown).
    pub(crate) fn in_grace(&self, now: Instant) -> bool {
        !self.lease.is_zero() && now < self.started + self.grace
    }

    fn notify(&self) {
        let _guard = self.changed_lock.lock();
        self.changed.notify_all();
    }

    /// The long poll of `client` (`cache_revocations`): applies its acknowledgement of every
    /// revocation up to `acked` (ignored when `incarnation` is another master life's), then
    /// answers the revocations not yet delivered, waiting up to [`POLL_WAIT`] for one.
    pub(crate) fn poll(&self, client: ClientId, incarnation: u64, acked: u64) -> RevocationBatch {
        let queue = self.queue_or_new(client);
        let deadline = Instant::now() + self.poll_wait();
        {
            let mut q = queue.lock();
            q.last_poll_ms = self.now_ms();
            let acked = match incarnation == self.incarnation {
                true => acked.min(q.delivered),
                false => 0,
            };
            if acked > q.acked {
                q.acked = acked;
                let before = q.pending.len();
                q.pending.retain(|p| p.seq > acked);
                let gone = (before - q.pending.len()) as u64;
                self.counters
                    .revocations_acked
                    .fetch_add(gone, Ordering::Relaxed);
                self.notify();
            }
            // What the client has not acknowledged it may never have received (a lost
            // answer): send it again.
            q.delivered = q.acked;
        }
        loop {
            {
                let mut q = queue.lock();
                let from = q.delivered;
                let fresh: Vec<Revocation> = q
                    .pending
                    .iter()
                    .filter(|p| p.seq > from)
                    .take(MAX_BATCH)
                    .map(|p| Revocation {
                        seq: p.seq,
                        key: p.key.clone(),
                    })
                    .collect();
                let now = Instant::now();
                if !fresh.is_empty() || now >= deadline {
                    if let Some(last) = fresh.last() {
                        q.delivered = last.seq;
                    }
                    q.last_poll_ms = self.now_ms();
                    return RevocationBatch {
                        incarnation: self.incarnation,
                        revocations: fresh,
                    };
                }
            }
            let mut guard = self.changed_lock.lock();
            // Re-checked under the queue lock above; a notify between that check and this
            // wait is caught by the short slice.
            self.changed
                .wait_for(&mut guard, Duration::from_millis(5).min(POLL_WAIT));
        }
    }

    /// Whether a revocation of `key` may still be unacknowledged at `now` (one was sent and
    /// its holders' leases have not all ended): a new write of the key must then wait
    /// ([`Self::wait`]) before it is acknowledged. O(1).
    pub(crate) fn may_be_pending(&self, key: &str, now: Instant) -> bool {
        let mut outstanding = self.outstanding.lock();
        match outstanding.get(key) {
            Some(&until) if until > now => true,
            Some(_) => {
                outstanding.remove(key);
                false
            }
            None => false,
        }
    }

    /// Whether revocations of `keys` (every revocation issued so far when `keys` is empty)
    /// are all acknowledged or past their holder's lease, and the start grace is over. Waits
    /// up to `slice` for that; `true` once it is so.
    pub(crate) fn wait(&self, keys: &[String], slice: Duration) -> bool {
        let started = Instant::now();
        let horizon = self.issued.load(Ordering::Acquire);
        let mut waited = false;
        loop {
            let now = Instant::now();
            if !self.in_grace(now) && !self.any_pending(keys, horizon, now) {
                if waited {
                    self.counters.writes_waited.fetch_add(1, Ordering::Relaxed);
                    let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                    self.counters.write_wait_us.fetch_add(us, Ordering::Relaxed);
                }
                return true;
            }
            if now.duration_since(started) >= slice {
                return false;
            }
            waited = true;
            let mut guard = self.changed_lock.lock();
            self.changed.wait_for(&mut guard, Duration::from_millis(1));
        }
    }

    /// Whether a revocation issued at or before `horizon`, of one of `keys` (any key when
    /// empty), is neither acknowledged nor past its holder's lease at `now`. Revocations
    /// found past their lease are dropped (counted as expired).
    fn any_pending(&self, keys: &[String], horizon: u64, now: Instant) -> bool {
        let queues: Vec<Arc<Mutex<Queue>>> = self.clients.read().values().cloned().collect();
        let mut pending = false;
        for queue in queues {
            let mut q = queue.lock();
            let before = q.pending.len();
            q.pending.retain(|p| p.until > now);
            let expired = (before - q.pending.len()) as u64;
            if expired > 0 {
                self.counters
                    .revocations_expired
                    .fetch_add(expired, Ordering::Relaxed);
            }
            pending |= q
                .pending
                .iter()
                .any(|p| p.issued <= horizon && (keys.is_empty() || keys.contains(&p.key)));
        }
        pending
    }

    /// Counts `keys` renewal requests, all refused when `refused`.
    pub(crate) fn count_renewals(&self, keys: u64, refused: bool) {
        self.counters.renewals.fetch_add(keys, Ordering::Relaxed);
        if refused {
            self.counters
                .renewals_refused
                .fetch_add(keys, Ordering::Relaxed);
        }
    }

    /// A snapshot of the counters.
    pub(crate) fn metrics(&self) -> LocationCacheMetrics {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LocationCacheMetrics {
            holders_granted: load(&c.holders_granted),
            revocations_sent: load(&c.revocations_sent),
            revocations_acked: load(&c.revocations_acked),
            revocations_expired: load(&c.revocations_expired),
            writes_waited: load(&c.writes_waited),
            write_wait_us: load(&c.write_wait_us),
            renewals: load(&c.renewals),
            renewals_refused: load(&c.renewals_refused),
        }
    }

    /// Forgets the queues of clients that stopped polling [`IDLE_QUEUE`] ago, unless a
    /// revocation sent to one is still within its holder's lease (writers wait for those).
    pub(crate) fn sweep(&self, now: Instant) {
        self.outstanding.lock().retain(|_, until| *until > now);
        let now_ms = self.now_ms();
        let idle = IDLE_QUEUE.as_millis() as u64;
        self.clients.write().retain(|_, queue| {
            let q = queue.lock();
            now_ms.saturating_sub(q.last_poll_ms) < idle || q.pending.iter().any(|p| p.until > now)
        });
    }
}
