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
use crate::types::{BufferDescriptor, ClientId, DiskMount, DiskTask, Uuid};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A demotion not reported within this long is given up: its memory range is released and a
/// late report is refused (the owner then deletes the record it wrote).
pub(super) const DEMOTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes a record takes beyond its value: the header block, and padding to 4 KiB.
const RECORD_BLOCK: u64 = 4096;

/// Record bytes a value of `size` bytes takes on disk (header block + padded payload).
pub(super) fn record_bytes(size: u64) -> u64 {
    RECORD_BLOCK + size.div_ceil(RECORD_BLOCK).saturating_mul(RECORD_BLOCK)
}

/// One mounted tier.
struct Tier {
    disk: Uuid,
    endpoint: String,
    capacity: u64,
    /// Record bytes held or reserved by demotions in flight (the master's estimate; the
    /// owner's own check is authoritative).
    used: u64,
    queue: VecDeque<DiskTask>,
}

/// A demotion in flight.
pub(super) struct Demotion {
    pub task: u64,
    pub owner: ClientId,
    pub key: String,
    pub generation: u64,
    pub size: u64,
    pub started: Instant,
    /// Keeps the memory range allocated (unreused) until the demotion ends.
    _range: Arc<Allocation>,
}

#[derive(Default)]
struct Inner {
    by_client: HashMap<ClientId, Tier>,
    pending: HashMap<u64, Demotion>,
    next_task: u64,
}

/// The registry of disk tiers. Owned by the master service; `Send + Sync`.
#[derive(Default)]
pub(super) struct DiskTiers {
    inner: Mutex<Inner>,
    work: Condvar,
}

impl DiskTiers {
    /// Mounts `mount` for `client`, replacing any tier the client had. Returns the client
    /// that had the same directory mounted before (an owner restarted on it), if another.
    pub(super) fn mount(&self, client: ClientId, mount: &DiskMount) -> Option<ClientId> {
        let mut inner = self.inner.lock();
        let previous = inner
            .by_client
            .iter()
            .find(|(other, tier)| **other != client && tier.disk == mount.disk)
            .map(|(other, _)| *other);
        if let Some(other) = previous {
            inner.by_client.remove(&other);
        }
        inner.by_client.insert(
            client,
            Tier {
                disk: mount.disk,
                endpoint: mount.endpoint.clone(),
                capacity: mount.capacity,
                used: mount.used,
                queue: VecDeque::new(),
            },
        );
        self.work.notify_all();
        previous
    }

    /// Forgets `client`'s tier (the client expired); its demotions in flight are given up.
    /// Returns whether it had one.
    pub(super) fn unmount(&self, client: ClientId) -> bool {
        let mut inner = self.inner.lock();
        inner.pending.retain(|_, d| d.owner != client);
        let had = inner.by_client.remove(&client).is_some();
        self.work.notify_all();
        had
    }

    /// Gives back the bytes reserved for a record of a `size`-byte value that the owner
    /// deletes (a refused demotion).
    pub(super) fn give_back(&self, owner: ClientId, size: u64) {
        if let Some(tier) = self.inner.lock().by_client.get_mut(&owner) {
            tier.used = tier.used.saturating_sub(record_bytes(size));
        }
    }

    /// The read service of `client`'s tier.
    pub(super) fn endpoint(&self, client: ClientId) -> Option<String> {
        let inner = self.inner.lock();
        inner.by_client.get(&client).map(|t| t.endpoint.clone())
    }

    /// Queues the demotion of `key` (generation `generation`, `size` bytes) from `replica`
    /// (whose range `range` stays allocated until the demotion ends) to `owner`'s tier, if it
    /// has one with room. Returns the task number.
    pub(super) fn start_demotion(
        &self,
        owner: ClientId,
        key: &str,
        generation: u64,
        replica: &BufferDescriptor,
        range: Arc<Allocation>,
    ) -> Option<u64> {
        let mut inner = self.inner.lock();
        inner.next_task += 1;
        let task = inner.next_task;
        let tier = inner.by_client.get_mut(&owner)?;
        let bytes = record_bytes(replica.size);
        if tier.used.saturating_add(bytes) > tier.capacity {
            return None;
        }
        tier.used += bytes;
        tier.queue.push_back(DiskTask::Demote {
            task,
            key: key.to_string(),
            generation,
            replica: replica.clone(),
        });
        inner.pending.insert(
            task,
            Demotion {
                task,
                owner,
                key: key.to_string(),
                generation,
                size: replica.size,
                started: Instant::now(),
                _range: range,
            },
        );
        self.work.notify_all();
        Some(task)
    }

    /// Queues the deletion of `owner`'s record of `key` at `generation` (nothing if the owner
    /// has no tier any more: it wipes what this master does not list when it mounts again).
    pub(super) fn queue_delete(&self, owner: ClientId, key: &str, generation: u64, size: u64) {
        let mut inner = self.inner.lock();
        if let Some(tier) = inner.by_client.get_mut(&owner) {
            tier.used = tier.used.saturating_sub(record_bytes(size));
            tier.queue.push_back(DiskTask::Delete {
                key: key.to_string(),
                generation,
            });
            self.work.notify_all();
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
        if !written {
            if let Some(tier) = inner.by_client.get_mut(&owner) {
                tier.used = tier.used.saturating_sub(record_bytes(demotion.size));
            }
        }
        Some(demotion)
    }

    /// Gives up the demotions started before `now - DEMOTION_TIMEOUT`.
    pub(super) fn expire_demotions(&self, now: Instant) -> Vec<Demotion> {
        let mut inner = self.inner.lock();
        let late: Vec<u64> = inner
            .pending
            .iter()
            .filter(|(_, d)| now.saturating_duration_since(d.started) >= DEMOTION_TIMEOUT)
            .map(|(task, _)| *task)
            .collect();
        late.iter()
            .filter_map(|task| inner.pending.remove(task))
            .collect()
    }

    /// The tasks queued for `client`, waiting up to `wait` for one. Errors: `CLIENT_NOT_FOUND`
    /// when the client has no tier mounted (it mounts again).
    pub(super) fn take_tasks(&self, client: ClientId, wait: Duration) -> Result<Vec<DiskTask>> {
        let until = Instant::now() + wait;
        let mut inner = self.inner.lock();
        loop {
            let Some(tier) = inner.by_client.get_mut(&client) else {
                return fail(
                    ErrorCode::ClientNotFound,
                    format!("{client} has no disk tier mounted"),
                );
            };
            if !tier.queue.is_empty() {
                return Ok(tier.queue.drain(..).collect());
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

    /// Memory bytes the demotions in flight will release.
    pub(super) fn demoting_bytes(&self) -> u64 {
        self.inner.lock().pending.values().map(|d| d.size).sum()
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
            view_version: 0,
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

    #[test]
    fn demotions_respect_capacity_and_keep_their_range_until_finished() {
        let tiers = DiskTiers::default();
        let owner = Uuid::random();
        let allocator = OffsetAllocator::new(1 << 20);
        let range = Arc::new(allocator.allocate(8192).unwrap());
        assert_eq!(
            tiers.start_demotion(owner, "k", 1, &replica(8192), Arc::clone(&range)),
            None,
            "no tier mounted"
        );
        tiers.mount(owner, &mount(record_bytes(8192)));
        let task = tiers
            .start_demotion(owner, "k", 1, &replica(8192), Arc::clone(&range))
            .expect("room for one record");
        assert_eq!(
            tiers.start_demotion(owner, "k2", 2, &replica(1), Arc::clone(&range)),
            None,
            "the tier is full"
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
        assert!(tiers
            .start_demotion(owner, "k3", 3, &replica(8192), Arc::clone(&range))
            .is_some());
        assert!(tiers.unmount(owner));
        assert_eq!(tiers.demotions_in_flight(), 0);
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
        assert_eq!(tiers.mount(old, &disk), None);
        assert_eq!(tiers.mount(new, &disk), Some(old));
        assert_eq!(tiers.endpoint(old), None);
        let waiter = {
            let tiers = Arc::clone(&tiers);
            std::thread::spawn(move || tiers.take_tasks(new, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(20));
        tiers.queue_delete(new, "k", 5, 10);
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
