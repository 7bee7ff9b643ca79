//! The clients' disk tiers as the master knows them (the SSD tier, `docs/ssd-tier.md`):
//! which client owns which tier and where its read service listens, the work queued for each
//! owner (demotions of evicted objects, deletions of removed ones), and the demotions in
//! flight, each keeping the memory range it copies from allocated.
//!
//! Thread-safety: one `parking_lot::Mutex` (lock level 3 of `service.rs`: taken after at most
//! one object shard, never together with the pin table, the client table or the segment
//! registry) and a condition variable the owners' long polls wait on.

use crate::alloc::Allocation;
use crate::error::{fail, ErrorCode, Result};
use crate::types::{BufferDescriptor, ClientId, DiskMount, DiskTask, SegmentId, Uuid};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A demotion not reported within this long is given up: its memory range is released and a
/// late report is refused (the owner then deletes the record it wrote).
pub(super) const DEMOTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Most demotions in flight per tier: beyond, eviction leaves the owner's objects in memory
/// until some end (they free memory soon), so a slow owner is paced, never flooded.
const MAX_DEMOTIONS_IN_FLIGHT: usize = 256;
/// Most tasks one poll hands out (a burst of removals never makes an answer too large).
const TASKS_PER_POLL: usize = 1024;
/// Bytes a record takes beyond its value: the header block, and padding to 4 KiB.
const RECORD_BLOCK: u64 = 4096;
/// A tier fuller than this share of its capacity is trimmed (its oldest objects evicted)...
const TRIM_HIGH_WATERMARK: f64 = 0.95;
/// ...down to this share.
const TRIM_LOW_WATERMARK: f64 = 0.90;
/// Most held records one trim of one tier looks at (a tier of pinned records costs a bounded
/// scan per eviction round).
pub(super) const TRIM_SCAN: usize = 4096;
/// How long trims that free nothing wait for read leases to end before the tier counts as
/// stuck.
const TRIM_LEASE_WAIT: Duration = Duration::from_secs(1);
/// How often a stuck tier (its last trim freed nothing) is trimmed again.
const TRIM_RETRY: Duration = Duration::from_secs(1);

/// Record bytes a value of `size` bytes takes on disk (header block + padded payload).
pub(super) fn record_bytes(size: u64) -> u64 {
    RECORD_BLOCK + size.div_ceil(RECORD_BLOCK).saturating_mul(RECORD_BLOCK)
}

/// A claim on one disk record: the value's object holds one, and so do its pins and a
/// removal waiting for a read lease to end. While it lives the record is kept (a mount keeps
/// it even when the object is gone); when the last holder lets go, the record's deletion is
/// queued to its tier (nothing if the tier is not mounted then: its owner drops what the
/// master neither lists nor holds when it mounts again).
pub(crate) struct DiskHold {
    tiers: Arc<DiskTiers>,
    tier: Uuid,
    key: String,
    generation: u64,
    size: u64,
}

impl Drop for DiskHold {
    fn drop(&mut self) {
        let (tier, key) = (self.tier, &self.key);
        self.tiers.release(tier, key, self.generation, self.size);
    }
}

impl DiskTiers {
    /// A hold on the record of `key` (`size` bytes) at `location` of these tiers.
    pub(super) fn hold(
        self: &Arc<Self>,
        key: &str,
        size: u64,
        tier: Uuid,
        generation: u64,
    ) -> Arc<DiskHold> {
        let hold = Arc::new(DiskHold {
            tiers: Arc::clone(self),
            tier,
            key: key.to_string(),
            generation,
            size,
        });
        let mut inner = self.inner.lock();
        let records = inner.held.entry(tier).or_default();
        let record = records.entry(generation).or_insert_with(|| HeldRecord {
            holds: 0,
            hold: Weak::new(),
        });
        record.holds += 1;
        record.hold = Arc::downgrade(&hold);
        hold
    }
}

/// A record some [`DiskHold`]s keep.
struct HeldRecord {
    /// Live holds (one per record, but counted: a second never frees the first's record).
    holds: u32,
    /// The latest hold (its key and size, for trimming).
    hold: Weak<DiskHold>,
}

/// An object a trim may evict from a tier: the record of `key` at `generation`.
pub(super) struct TrimCandidate {
    pub key: String,
    pub generation: u64,
    pub size: u64,
}

/// One mounted tier.
struct Tier {
    client: ClientId,
    endpoint: String,
    /// The current mount (its pages mark the copies they confirm with it).
    mount: u64,
    /// The owner's attempt that started it.
    attempt: u64,
    /// Record bytes the pages of the current mount confirmed so far.
    confirmed: u64,
    capacity: u64,
    /// Record bytes held or reserved by demotions in flight (the master's estimate; the
    /// owner's own check is authoritative).
    used: u64,
    /// The largest record a demotion found no room for since the last trim.
    wanted: u64,
    /// The last trim that had to free bytes freed none (everything is leased or pinned):
    /// victims that do not fit are dropped instead of waiting for room.
    stuck: bool,
    /// When the last trim ran (a stuck tier is trimmed again only [`TRIM_RETRY`] later).
    trimmed_at: Option<Instant>,
    /// Since when trims have freed nothing while waiting for read leases to end (`None`
    /// while they free bytes).
    waiting_since: Option<Instant>,
    queue: VecDeque<DiskTask>,
}

/// What [`DiskTiers::start_demotion`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Demote {
    /// Queued as this task.
    Started(u64),
    /// The owner has no tier mounted: evict as without one.
    NoTier,
    /// The tier has no room and cannot make any (all it holds is leased or pinned): evict
    /// (the object is dropped).
    Full,
    /// The tier has no room yet; its next trim makes some: leave the object in memory.
    Trimming,
    /// The tier has [`MAX_DEMOTIONS_IN_FLIGHT`] demotions in flight: leave the object.
    Busy,
}

/// What a disk task in flight does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DiskWork {
    /// An evicted object's memory replica goes to disk; the memory goes once it commits.
    Demote,
    /// A write-through copy: the object keeps its memory replica.
    Offload,
    /// A disk object's record is loaded into a new memory replica in its owner's segment
    /// (the range the task holds), as a read asked for it often enough.
    Promote,
}

/// A disk task in flight: a demotion, a write-through copy or a promotion ([`DiskWork`]).
pub(super) struct Demotion {
    pub task: u64,
    /// The tier the record goes to.
    pub tier: Uuid,
    pub owner: ClientId,
    pub key: String,
    pub generation: u64,
    pub size: u64,
    pub started: Instant,
    pub work: DiskWork,
    /// The memory replica the task copies to disk, or the new one a promotion fills: its
    /// segment and descriptor.
    pub segment: SegmentId,
    pub buffer: BufferDescriptor,
    /// Keeps that range allocated (unreused) until the task ends.
    pub range: Arc<Allocation>,
}

#[derive(Default)]
struct Inner {
    /// Mounted tiers by identity (the directory's, stable across owner restarts).
    tiers: HashMap<Uuid, Tier>,
    /// Tiers whose owner went away (expired, or not back yet after a master restart): their
    /// objects wait, unreadable, until the tier is mounted again or the deadline passes.
    awaited: HashMap<Uuid, Instant>,
    pending: HashMap<u64, Demotion>,
    /// Held records per tier (mounted or not), by generation: write tokens are unique
    /// across keys and increase with time, so the first entries are the oldest values.
    held: HashMap<Uuid, BTreeMap<u64, HeldRecord>>,
    next_task: u64,
    next_mount: u64,
}

impl Inner {
    fn tier_of(&self, client: ClientId) -> Option<Uuid> {
        let mut mounted = self.tiers.iter();
        mounted.find(|(_, t)| t.client == client).map(|(id, _)| *id)
    }

    /// Queues `work` on (`key`, `generation`) for `owner`'s tier `tier` (mounted) and records
    /// it in flight; returns its task number.
    fn queue(
        &mut self,
        tier: Uuid,
        (owner, key, generation): (ClientId, &str, u64),
        (segment, replica, range): (SegmentId, &BufferDescriptor, Arc<Allocation>),
        work: DiskWork,
    ) -> u64 {
        let task = self.next_task();
        let (key, replica) = (key.to_string(), replica.clone());
        let message = match work {
            DiskWork::Promote => DiskTask::Promote {
                task,
                key: key.clone(),
                generation,
                replica: replica.clone(),
            },
            DiskWork::Demote | DiskWork::Offload => DiskTask::Demote {
                task,
                key: key.clone(),
                generation,
                replica: replica.clone(),
            },
        };
        if let Some(tier) = self.tiers.get_mut(&tier) {
            tier.queue.push_back(message);
        }
        let demotion = Demotion {
            task,
            tier,
            owner,
            key,
            generation,
            size: replica.size,
            started: Instant::now(),
            work,
            segment,
            buffer: replica,
            range,
        };
        self.pending.insert(task, demotion);
        task
    }

    /// A new task number: from a random start in each master's life, so a report of a task
    /// of an earlier life (its owner still ran it across the restart) never names one of
    /// this life's.
    fn next_task(&mut self) -> u64 {
        if self.next_task == 0 {
            self.next_task = fastrand::u64(1..1 << 62);
        }
        self.next_task += 1;
        self.next_task
    }
}

/// The registry of disk tiers. Owned by the master service; `Send + Sync`.
#[derive(Default)]
pub(super) struct DiskTiers {
    inner: Mutex<Inner>,
    work: Condvar,
}

impl DiskTiers {
    /// Starts a mount of tier `mount.disk` by `client`, its attempt `attempt` (replacing what
    /// the client or the tier had: an owner restarted on its directory takes the tier over;
    /// work queued for the same client and tier stays queued). Returns the mount's number.
    /// Errors: `TRY_AGAIN` when `client` already mounted the tier with this or a later attempt.
    pub(super) fn mount(&self, client: ClientId, mount: &DiskMount, attempt: u64) -> Result<u64> {
        let mut inner = self.inner.lock();
        if let Some(t) = inner.tiers.get(&mount.disk) {
            if t.client == client && t.attempt >= attempt {
                let msg = format!("mount attempt {attempt} is older than {}", t.attempt);
                return fail(ErrorCode::TryAgain, msg);
            }
        }
        let queue = match inner.tier_of(client) {
            Some(old) if old == mount.disk => inner.tiers.remove(&old).map(|t| t.queue),
            Some(old) => inner.tiers.remove(&old).and(None),
            None => None,
        };
        inner.awaited.remove(&mount.disk);
        inner.next_mount += 1;
        let number = inner.next_mount;
        inner.tiers.insert(
            mount.disk,
            Tier {
                client,
                endpoint: mount.endpoint.clone(),
                mount: number,
                attempt,
                confirmed: 0,
                capacity: mount.capacity,
                used: mount.used,
                wanted: 0,
                stuck: false,
                trimmed_at: None,
                waiting_since: None,
                queue: queue.unwrap_or_default(),
            },
        );
        self.work.notify_all();
        Ok(number)
    }

    /// Checks that mount `number` of tier `tier` by `client` is the current one. Errors:
    /// `CLIENT_NOT_FOUND` when the client has not mounted that tier; `TRY_AGAIN` when a later
    /// mount replaced that one (a page answered after its owner gave up on it).
    pub(super) fn continue_mount(&self, client: ClientId, tier: Uuid, number: u64) -> Result<()> {
        let inner = self.inner.lock();
        match inner.tiers.get(&tier) {
            Some(t) if t.client == client && t.mount == number => Ok(()),
            Some(t) if t.client == client => fail(
                ErrorCode::TryAgain,
                format!(
                    "mount {number} of tier {tier} was replaced by mount {}",
                    t.mount
                ),
            ),
            _ => fail(
                ErrorCode::ClientNotFound,
                format!("{client} is not mounting tier {tier}"),
            ),
        }
    }

    /// The current mount number of `tier` (0: not mounted).
    pub(super) fn mount_number(&self, tier: Uuid) -> u64 {
        self.inner.lock().tiers.get(&tier).map_or(0, |t| t.mount)
    }

    /// Adds `bytes` of records a page of the current mount of `tier` confirmed.
    pub(super) fn confirm(&self, tier: Uuid, bytes: u64) {
        if let Some(tier) = self.inner.lock().tiers.get_mut(&tier) {
            tier.confirmed = tier.confirmed.saturating_add(bytes);
        }
    }

    /// Ends mount `number` of `tier` (nothing if a later mount replaced it): the tier holds
    /// what its pages confirmed.
    pub(super) fn finish_mount(&self, tier: Uuid, number: u64) {
        let mut inner = self.inner.lock();
        if let Some(tier) = inner.tiers.get_mut(&tier).filter(|t| t.mount == number) {
            tier.used = tier.confirmed;
        }
    }

    /// `client` went away (expired, or closed its tier): its tier, if it had one, waits for
    /// a mount until `until`. Returns its demotions in flight, given up.
    pub(super) fn unmount(&self, client: ClientId, until: Instant) -> Vec<Demotion> {
        let mut inner = self.inner.lock();
        let tasks: Vec<u64> = inner
            .pending
            .iter()
            .filter(|(_, d)| d.owner == client)
            .map(|(task, _)| *task)
            .collect();
        let dropped = tasks
            .iter()
            .filter_map(|task| inner.pending.remove(task))
            .collect();
        if let Some(tier) = inner.tier_of(client) {
            inner.tiers.remove(&tier);
            inner.awaited.insert(tier, until);
        }
        self.work.notify_all();
        dropped
    }

    /// Tiers a restarted master found in its journal: they wait for their owners until
    /// `until` (unless mounted already).
    pub(super) fn await_tiers(&self, tiers: impl IntoIterator<Item = Uuid>, until: Instant) {
        let mut inner = self.inner.lock();
        for tier in tiers {
            if !inner.tiers.contains_key(&tier) {
                inner.awaited.insert(tier, until);
            }
        }
    }

    /// The awaited tiers whose deadline passed at `now` (forgotten here; the caller drops
    /// their objects).
    pub(super) fn expire_awaited(&self, now: Instant) -> Vec<Uuid> {
        let mut inner = self.inner.lock();
        let late: Vec<Uuid> = inner
            .awaited
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(tier, _)| *tier)
            .collect();
        for tier in &late {
            inner.awaited.remove(tier);
        }
        late
    }

    /// The tier `client` has mounted.
    pub(super) fn tier_of(&self, client: ClientId) -> Option<Uuid> {
        self.inner.lock().tier_of(client)
    }

    /// The owner of mounted tier `tier` and its read service.
    pub(super) fn resolve(&self, tier: Uuid) -> Option<(ClientId, String)> {
        let inner = self.inner.lock();
        inner
            .tiers
            .get(&tier)
            .map(|t| (t.client, t.endpoint.clone()))
    }

    /// Queues the demotion of `key` (generation `generation`) from `replica` (whose range
    /// `range` stays allocated until the demotion ends) to `owner`'s tier, if it has one with
    /// room and fewer than [`MAX_DEMOTIONS_IN_FLIGHT`] tasks in flight; `work` is
    /// [`DiskWork::Demote`] or [`DiskWork::Offload`].
    pub(super) fn start_demotion(
        &self,
        owner: ClientId,
        (key, generation): (&str, u64),
        (segment, replica, range): (SegmentId, &BufferDescriptor, Arc<Allocation>),
        work: DiskWork,
    ) -> Demote {
        let mut inner = self.inner.lock();
        let Some(tier_id) = inner.tier_of(owner) else {
            return Demote::NoTier;
        };
        let in_flight = inner.pending.values().filter(|d| d.tier == tier_id).count();
        if in_flight >= MAX_DEMOTIONS_IN_FLIGHT {
            return Demote::Busy;
        }
        let Some(tier) = inner.tiers.get_mut(&tier_id) else {
            return Demote::NoTier;
        };
        let bytes = record_bytes(replica.size);
        if bytes > tier.capacity {
            // No trim can make room for it: trimming would only empty the tier.
            return Demote::Full;
        }
        if tier.used.saturating_add(bytes) > tier.capacity {
            tier.wanted = tier.wanted.max(bytes);
            return match tier.stuck {
                true => Demote::Full,
                false => Demote::Trimming,
            };
        }
        tier.used += bytes;
        let object = (owner, key, generation);
        let task = inner.queue(tier_id, object, (segment, replica, range), work);
        self.work.notify_all();
        Demote::Started(task)
    }

    /// Queues the promotion of `key` (generation `generation`) on `owner`'s tier into
    /// `replica`, a new range `range` of the owner's segment, if the tier is mounted and has
    /// fewer than [`MAX_DEMOTIONS_IN_FLIGHT`] tasks in flight. Returns the task. Given up
    /// (expired, or its owner's tier gone), its range is freed only after the write
    /// quarantine (see `MasterService::give_up_demotions`).
    pub(super) fn start_promotion(
        &self,
        owner: ClientId,
        (key, generation): (&str, u64),
        (segment, replica, range): (SegmentId, &BufferDescriptor, Arc<Allocation>),
    ) -> Option<u64> {
        let mut inner = self.inner.lock();
        let tier_id = inner.tier_of(owner)?;
        let in_flight = inner.pending.values().filter(|d| d.tier == tier_id).count();
        if in_flight >= MAX_DEMOTIONS_IN_FLIGHT {
            return None;
        }
        let object = (owner, key, generation);
        let task = inner.queue(
            tier_id,
            object,
            (segment, replica, range),
            DiskWork::Promote,
        );
        self.work.notify_all();
        Some(task)
    }

    /// Whether a [`DiskHold`] on tier `tier`'s record at `generation` lives (a reader may
    /// still read it: the owner keeps it).
    pub(super) fn is_held(&self, tier: Uuid, generation: u64) -> bool {
        let inner = self.inner.lock();
        let records = inner.held.get(&tier);
        records.is_some_and(|records| records.contains_key(&generation))
    }

    /// The mounted tiers to trim, with the record bytes each should free: those above
    /// [`TRIM_HIGH_WATERMARK`] of their capacity, or short of room for a demotion, down to
    /// [`TRIM_LOW_WATERMARK`] (and room for that demotion).
    /// A tier below both ends its stuck state; a stuck one is due again [`TRIM_RETRY`] after
    /// its last trim (`now`).
    pub(super) fn over_watermark(&self, now: Instant) -> Vec<(Uuid, u64)> {
        let mut inner = self.inner.lock();
        let excess = |t: &mut Tier| {
            let mark = |share: f64| (t.capacity as f64 * share) as u64;
            let need = t.used.saturating_add(t.wanted);
            let over = t.used > mark(TRIM_HIGH_WATERMARK) || need > t.capacity;
            t.stuck &= over;
            let since = |at: Instant| now.saturating_duration_since(at);
            let resting = t.stuck && t.trimmed_at.is_some_and(|at| since(at) < TRIM_RETRY);
            (over && !resting).then(|| {
                t.trimmed_at = Some(now);
                need.saturating_sub(mark(TRIM_LOW_WATERMARK)).max(t.wanted)
            })
        };
        let tiers = inner.tiers.iter_mut();
        tiers
            .filter_map(|(id, t)| Some((*id, excess(t)?)))
            .collect()
    }

    /// Ends a trim of `tier` at `now` that `freed` record bytes, having seen `leased` records
    /// it could evict once their read lease ends. One that freed nothing leaves the tier stuck
    /// (victims that do not fit are dropped until a trim frees some), unless it saw leased
    /// records and trims have waited for them less than [`TRIM_LEASE_WAIT`]: hot records read
    /// again and again never stall eviction for longer.
    pub(super) fn trimmed(&self, tier: Uuid, freed: bool, leased: bool, now: Instant) {
        if let Some(tier) = self.inner.lock().tiers.get_mut(&tier) {
            let since = match freed {
                true => None,
                false => Some(tier.waiting_since.unwrap_or(now)),
            };
            tier.waiting_since = since;
            let waited = since.map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
            tier.stuck = !freed && (!leased || waited >= TRIM_LEASE_WAIT);
            tier.wanted = 0;
        }
    }

    /// The oldest records of `tier` a hold still keeps, at most `max`.
    pub(super) fn oldest(&self, tier: Uuid, max: usize) -> Vec<TrimCandidate> {
        let holds: Vec<Arc<DiskHold>> = {
            let inner = self.inner.lock();
            let records = inner.held.get(&tier).into_iter().flat_map(|r| r.values());
            records.take(max).filter_map(|r| r.hold.upgrade()).collect()
        };
        // Read (and let go of) the holds outside the lock: the last one's drop takes it.
        let candidate = |hold: &Arc<DiskHold>| TrimCandidate {
            key: hold.key.clone(),
            generation: hold.generation,
            size: hold.size,
        };
        holds.iter().map(candidate).collect()
    }

    /// Called by a [`DiskHold`] of tier `tier`'s record of `key` at `generation` when it
    /// drops; the last one queues the record's deletion (nothing if the tier is not mounted:
    /// its owner drops what the master neither lists nor holds when it mounts).
    fn release(&self, tier: Uuid, key: &str, generation: u64, size: u64) {
        let mut inner = self.inner.lock();
        if let Some(records) = inner.held.get_mut(&tier) {
            if let Some(record) = records.get_mut(&generation) {
                record.holds -= 1;
                if record.holds > 0 {
                    return;
                }
                records.remove(&generation);
            }
            if records.is_empty() {
                inner.held.remove(&tier);
            }
        }
        if let Some(tier) = inner.tiers.get_mut(&tier) {
            tier.used = tier.used.saturating_sub(record_bytes(size));
            tier.queue.push_back(DiskTask::Delete {
                key: key.to_string(),
                generation,
            });
            self.work.notify_all();
        }
    }

    /// Gives back the bytes reserved for a record of a `size`-byte value that the owner
    /// deletes (a refused demotion).
    pub(super) fn give_back(&self, tier: Uuid, size: u64) {
        if let Some(tier) = self.inner.lock().tiers.get_mut(&tier) {
            tier.used = tier.used.saturating_sub(record_bytes(size));
        }
    }

    /// Ends demotion `task` of `owner`: the demotion, if it is still in flight (its range is
    /// released when the caller drops it). A record that was not written gives its reserved
    /// bytes back.
    pub(super) fn finish_demotion(
        &self,
        owner: ClientId,
        task: u64,
        written: bool,
    ) -> Option<Demotion> {
        let mut inner = self.inner.lock();
        if inner.pending.get(&task)?.owner != owner {
            return None;
        }
        let demotion = inner.pending.remove(&task)?;
        if !written && demotion.work != DiskWork::Promote {
            if let Some(tier) = inner.tiers.get_mut(&demotion.tier) {
                tier.used = tier.used.saturating_sub(record_bytes(demotion.size));
            }
        }
        Some(demotion)
    }

    /// Gives up the tasks started before `now - DEMOTION_TIMEOUT` (the caller frees a given
    /// up promotion's range only after the write quarantine: its owner may still fill it).
    pub(super) fn expire_demotions(&self, now: Instant) -> Vec<Demotion> {
        let mut inner = self.inner.lock();
        let late: Vec<u64> = inner
            .pending
            .iter()
            .filter(|(_, d)| now.saturating_duration_since(d.started) >= DEMOTION_TIMEOUT)
            .map(|(task, _)| *task)
            .collect();
        let expired: Vec<Demotion> = late
            .iter()
            .filter_map(|task| inner.pending.remove(task))
            .collect();
        for demotion in expired.iter().filter(|d| d.work != DiskWork::Promote) {
            if let Some(tier) = inner.tiers.get_mut(&demotion.tier) {
                tier.used = tier.used.saturating_sub(record_bytes(demotion.size));
            }
        }
        expired
    }

    /// The tasks queued for `client`'s tier (at most [`TASKS_PER_POLL`]), waiting up to
    /// `wait` for one. Errors:
    /// `CLIENT_NOT_FOUND` when the client has no tier mounted (it mounts again).
    pub(super) fn take_tasks(&self, client: ClientId, wait: Duration) -> Result<Vec<DiskTask>> {
        let until = Instant::now() + wait;
        let mut inner = self.inner.lock();
        loop {
            let tier = inner.tier_of(client);
            let Some(tier) = tier.and_then(|t| inner.tiers.get_mut(&t)) else {
                return fail(
                    ErrorCode::ClientNotFound,
                    format!("{client} has no disk tier mounted"),
                );
            };
            if !tier.queue.is_empty() {
                let batch = tier.queue.len().min(TASKS_PER_POLL);
                return Ok(tier.queue.drain(..batch).collect());
            }
            if self.work.wait_until(&mut inner, until).timed_out() {
                return Ok(Vec::new());
            }
        }
    }

    /// Demotions in flight.
    pub(super) fn demotions_in_flight(&self) -> usize {
        self.inner.lock().pending.len()
    }

    /// Memory bytes the demotions in flight will release (write-through copies and
    /// promotions release none).
    pub(super) fn demoting_bytes(&self) -> u64 {
        let inner = self.inner.lock();
        let demotions = inner
            .pending
            .values()
            .filter(|d| d.work == DiskWork::Demote);
        demotions.map(|d| d.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::OffsetAllocator;

    fn mount(capacity: u64) -> DiskMount {
        DiskMount {
            disk: Uuid::random(),
            endpoint: "127.0.0.1:1".into(),
            capacity,
            used: 0,
        }
    }

    fn replica(size: u64) -> BufferDescriptor {
        BufferDescriptor {
            size,
            buffer_address: 0,
            protocol: "tcp".into(),
            transport_endpoint: "x".into(),
            epoch: 1,
        }
    }

    /// Task numbers of two masters' lives differ (a report of the previous life's task, still
    /// running at its owner, must never end a task of this one).
    #[test]
    fn task_numbers_differ_between_a_master_and_its_restart() {
        let allocator = OffsetAllocator::new(1 << 20);
        let first_task = || {
            let tiers = DiskTiers::default();
            let owner = Uuid::random();
            tiers.mount(owner, &mount(1 << 20), 1).unwrap();
            let range = Arc::new(allocator.allocate(8192).unwrap());
            let source = (SegmentId::default(), &replica(8192), range);
            match tiers.start_demotion(owner, ("k", 1), source, DiskWork::Demote) {
                Demote::Started(task) => task,
                other => panic!("{other:?}"),
            }
        };
        assert_ne!(first_task(), first_task());
    }

    #[test]
    fn demotions_respect_capacity_and_keep_their_range_until_finished() {
        let tiers = DiskTiers::default();
        let owner = Uuid::random();
        let allocator = OffsetAllocator::new(1 << 20);
        let range = Arc::new(allocator.allocate(8192).unwrap());
        assert_eq!(
            tiers.start_demotion(
                owner,
                ("k", 1),
                (SegmentId::default(), &replica(8192), Arc::clone(&range)),
                DiskWork::Demote
            ),
            Demote::NoTier
        );
        let disk = mount(record_bytes(8192));
        tiers.mount(owner, &disk, 1).unwrap();
        let Demote::Started(task) = tiers.start_demotion(
            owner,
            ("k", 1),
            (SegmentId::default(), &replica(8192), Arc::clone(&range)),
            DiskWork::Demote,
        ) else {
            panic!("room for one record");
        };
        let huge = replica(2 * record_bytes(8192));
        let oversized = tiers.start_demotion(
            owner,
            ("big", 9),
            (SegmentId::default(), &huge, Arc::clone(&range)),
            DiskWork::Demote,
        );
        assert_eq!(
            oversized,
            Demote::Full,
            "larger than the tier: no trim can help"
        );
        let second = || {
            tiers.start_demotion(
                owner,
                ("k2", 2),
                (SegmentId::default(), &replica(1), Arc::clone(&range)),
                DiskWork::Demote,
            )
        };
        assert_eq!(second(), Demote::Trimming, "waits for a trim");
        let excess = tiers.over_watermark(Instant::now());
        let low = (record_bytes(8192) as f64 * TRIM_LOW_WATERMARK) as u64;
        let need = record_bytes(8192) + record_bytes(1) - low;
        assert_eq!(excess, vec![(disk.disk, need)]);
        let now = Instant::now();
        tiers.trimmed(disk.disk, false, true, now);
        assert_eq!(second(), Demote::Trimming, "waits for the leases to end");
        tiers.trimmed(disk.disk, false, true, now + TRIM_LEASE_WAIT);
        assert_eq!(second(), Demote::Full, "not for longer: dropped");
        tiers.trimmed(disk.disk, true, false, now + TRIM_LEASE_WAIT);
        assert_eq!(
            second(),
            Demote::Trimming,
            "a trim that freed some: waits again"
        );
        tiers.trimmed(disk.disk, false, false, now + TRIM_LEASE_WAIT);
        assert_eq!(
            second(),
            Demote::Full,
            "a trim that freed nothing, no lease: dropped"
        );
        assert_eq!(Arc::strong_count(&range), 2, "the demotion holds the range");
        let tasks = tiers.take_tasks(owner, Duration::ZERO).unwrap();
        assert!(matches!(&tasks[..], [DiskTask::Demote { task: t, .. }] if *t == task));
        assert!(tiers.finish_demotion(Uuid::random(), task, true).is_none());
        let done = tiers.finish_demotion(owner, task, false).unwrap();
        drop(done);
        assert_eq!(Arc::strong_count(&range), 1, "released with the demotion");
        assert!(tiers.finish_demotion(owner, task, true).is_none(), "once");
        // The unwritten record gave its bytes back.
        assert!(matches!(
            tiers.start_demotion(
                owner,
                ("k3", 3),
                (SegmentId::default(), &replica(8192), Arc::clone(&range)),
                DiskWork::Demote
            ),
            Demote::Started(_)
        ));
        let until = Instant::now() + Duration::from_secs(60);
        assert_eq!(
            tiers.unmount(owner, until).len(),
            1,
            "k3's demotion is given up"
        );
        assert_eq!(tiers.demotions_in_flight(), 0);
        assert_eq!(tiers.resolve(disk.disk), None, "awaited, not readable");
        assert!(tiers.expire_awaited(Instant::now()).is_empty());
        assert_eq!(tiers.expire_awaited(until), vec![disk.disk]);
        assert_eq!(
            tiers.take_tasks(owner, Duration::ZERO),
            Err(ErrorCode::ClientNotFound)
        );
    }

    #[test]
    fn a_restarted_owner_takes_over_its_directory_and_a_poll_wakes_on_work() {
        let tiers = Arc::new(DiskTiers::default());
        let (old, new) = (Uuid::random(), Uuid::random());
        let disk = mount(1 << 30);
        tiers.mount(old, &disk, 1).unwrap();
        tiers.mount(new, &disk, 1).unwrap();
        assert_eq!(tiers.tier_of(old), None);
        assert_eq!(tiers.resolve(disk.disk).map(|(c, _)| c), Some(new));
        let waiter = {
            let tiers = Arc::clone(&tiers);
            std::thread::spawn(move || tiers.take_tasks(new, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(tiers.hold("k", 10, disk.disk, 5));
        let tasks = waiter.join().unwrap().unwrap();
        assert_eq!(
            tasks,
            vec![DiskTask::Delete {
                key: "k".into(),
                generation: 5
            }]
        );
    }
}
