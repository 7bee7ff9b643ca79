//! The table of memory registered with the engine: non-overlapping `[base, base+len)` ranges
//! kept in a map sorted by base, behind a readers-writer lock. Lookups are O(log n).

use crate::error::{fail, ErrorCode, Result};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest segment epoch: epochs travel in the 7 spare bytes of the wire header.
pub const MAX_EPOCH: u64 = (1 << 56) - 1;

/// One registered range of this process's memory.
///
/// The registry records addresses only; it never owns or frees the memory. The registering
/// caller keeps the range valid until it unregisters it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRegion {
    /// First byte of the range.
    pub base: usize,
    /// Length in bytes (> 0).
    pub len: usize,
    /// Whether remote peers may read and write the range over the network (mounted segments);
    /// `false` for buffers only this process uses as transfer sources or destinations.
    pub remote_accessible: bool,
    /// The segment epoch of the current mount (`0`: none; set by
    /// [`TransferEngine::set_region_epoch`](super::TransferEngine::set_region_epoch)).
    pub epoch: u64,
    /// Whether the range is device memory (a GPU buffer a transfer endpoint registered), as
    /// the device runtime classified its first byte at registration: the data server then
    /// reaches it through the driver only, never with a host access. Looked at only for
    /// remotely accessible ranges (the only ones the data server serves); `false` otherwise.
    pub on_device: bool,
}

impl MemoryRegion {
    /// Whether `[addr, addr+len)` lies entirely inside this range (`len` may be 0).
    fn contains(&self, addr: u64, len: u64) -> bool {
        let (base, end) = (self.base as u64, self.base as u64 + self.len as u64);
        addr >= base && addr <= end && len <= end - addr
    }
}

/// A request's range named a segment epoch that is not the current one of its region (or
/// the range is no longer registered). Carries the region's epoch, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StaleEpoch(pub(crate) Option<u64>);

/// Thread-safe table of registered ranges. Share it by `Arc`.
///
/// The epoch fence: every access to segment memory on behalf of a request that names an
/// epoch runs inside [`Registry::fenced`] (a shared lock, held only for one non-blocking copy
/// or socket call), and [`Registry::set_epoch`] takes it exclusively. So once `set_epoch`
/// returns, no byte of a request naming the earlier epoch is read or written any more —
/// however long ago it was admitted.
///
/// Mount holds: work that reads or writes segment memory outside the engine, long after it
/// was admitted (a copy queued on a caller's stream), takes a [`MountHold`] of the region's
/// current epoch; [`Registry::set_epoch`] does not switch a region's epoch while a hold of it
/// exists, it waits (bounded) and otherwise refuses with `TRY_AGAIN`. So a remount never
/// gives a region fresh pages, or unregisters them from a device or a NIC, under a queued
/// copy of the previous mount. Once a switch found holds, the region is draining until the
/// switch succeeds: no new hold of it is granted (the callers take their fenced, staged path),
/// so a steady stream of holds cannot put a remount off for ever.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    regions: RwLock<BTreeMap<usize, MemoryRegion>>,
    fence: RwLock<()>,
    /// Live [`MountHold`]s per region base (entries with 0 are removed), and the regions
    /// draining for an epoch switch.
    holds: Mutex<Holds>,
    /// Signalled whenever a hold ends.
    hold_ended: Condvar,
}

#[derive(Debug, Default)]
struct Holds {
    live: HashMap<usize, u64>,
    draining: std::collections::HashSet<usize>,
}

/// A hold of one mount (one epoch) of a registered range; see [`Registry`]. Dropping it ends
/// the hold. Owned by the work that touches the memory (a stream ticket's release), `Send`.
#[derive(Debug)]
pub(crate) struct MountHold {
    registry: Arc<Registry>,
    base: usize,
}

impl Drop for MountHold {
    fn drop(&mut self) {
        let mut holds = self.registry.holds.lock();
        if let Some(count) = holds.live.get_mut(&self.base) {
            *count -= 1;
            if *count == 0 {
                holds.live.remove(&self.base);
            }
        }
        drop(holds);
        self.registry.hold_ended.notify_all();
    }
}

impl Registry {
    /// Adds `[addr, addr+len)`.
    ///
    /// Errors: `INVALID_PARAMS` when `addr` is 0, `len` is 0, the range wraps around the
    /// address space, or it overlaps a registered range.
    pub(crate) fn register(&self, addr: usize, len: usize, remote_accessible: bool) -> Result<()> {
        if addr == 0 || len == 0 {
            return fail(
                ErrorCode::InvalidParams,
                format_args!("cannot register addr {addr:#x} len {len}"),
            );
        }
        let Some(end) = addr.checked_add(len) else {
            return fail(
                ErrorCode::InvalidParams,
                format_args!("range {addr:#x}+{len} overflows the address space"),
            );
        };
        // Before the lock: classifying asks the device driver.
        let on_device = remote_accessible && crate::device::runtime().is_device(addr);
        let mut regions = self.regions.write();
        let before = regions.range(..end).next_back().map(|(_, r)| *r);
        if let Some(prev) = before.filter(|r| r.base + r.len > addr) {
            return fail(
                ErrorCode::InvalidParams,
                format_args!(
                    "range {addr:#x}+{len} overlaps registered {:#x}+{}",
                    prev.base, prev.len
                ),
            );
        }
        regions.insert(
            addr,
            MemoryRegion {
                base: addr,
                len,
                remote_accessible,
                epoch: 0,
                on_device,
            },
        );
        Ok(())
    }

    /// Sets the epoch of the range whose base is `base`, once no [`MountHold`] of it is left:
    /// waits up to `wait` for the holds to end.
    ///
    /// Errors: `INVALID_PARAMS` when no range starts at `base` or `epoch` > [`MAX_EPOCH`];
    /// `TRY_AGAIN` when holds were still there after `wait` (the epoch is unchanged).
    pub(crate) fn set_epoch(&self, base: usize, epoch: u64, wait: Duration) -> Result<()> {
        if epoch > MAX_EPOCH {
            return fail(
                ErrorCode::InvalidParams,
                format_args!("segment epoch {epoch:#x} is wider than 56 bits"),
            );
        }
        let deadline = Instant::now() + wait;
        loop {
            let fence = self.fence.write();
            let mut holds = self.holds.lock();
            let Some(&held) = holds.live.get(&base) else {
                holds.draining.remove(&base);
                drop(holds);
                return self.set_epoch_fenced(base, epoch);
            };
            holds.draining.insert(base);
            // A new hold needs the fence: release it while waiting, and look again after.
            drop(fence);
            if self.hold_ended.wait_until(&mut holds, deadline).timed_out()
                && holds.live.contains_key(&base)
            {
                return fail(
                    ErrorCode::TryAgain,
                    format_args!(
                        "{held} queued stream copies still hold the current mount of \
                         {base:#x}; its epoch changes once they ran"
                    ),
                );
            }
        }
    }

    /// The epoch switch itself; the caller holds the fence exclusively.
    fn set_epoch_fenced(&self, base: usize, epoch: u64) -> Result<()> {
        match self.regions.write().get_mut(&base) {
            Some(region) => {
                region.epoch = epoch;
                Ok(())
            }
            None => fail(
                ErrorCode::InvalidParams,
                format_args!("no registered range starts at {base:#x}"),
            ),
        }
    }

    /// Removes the range whose base is `addr`.
    ///
    /// Errors: `INVALID_PARAMS` when no range starts at `addr`.
    pub(crate) fn unregister(&self, addr: usize) -> Result<()> {
        match self.regions.write().remove(&addr) {
            Some(_) => Ok(()),
            None => fail(
                ErrorCode::InvalidParams,
                format_args!("no registered range starts at {addr:#x}"),
            ),
        }
    }

    /// Runs `access` (one short, non-blocking access to `[addr, addr+len)`) under the epoch
    /// fence, after checking that the range still lies in one registered region whose epoch
    /// is `epoch` (`None`: no check). Errors: [`StaleEpoch`], and `access` does not run.
    pub(crate) fn fenced<R>(
        &self,
        addr: u64,
        len: u64,
        epoch: Option<u64>,
        access: impl FnOnce() -> R,
    ) -> std::result::Result<R, StaleEpoch> {
        self.fenced_ranges(&[(addr, len, epoch)], access)
    }

    /// [`Registry::fenced`] for one access touching several `(addr, len, epoch)` ranges
    /// (a gathered send): every range is checked before `access` runs.
    pub(crate) fn fenced_ranges<R>(
        &self,
        ranges: &[(u64, u64, Option<u64>)],
        access: impl FnOnce() -> R,
    ) -> std::result::Result<R, StaleEpoch> {
        let _fence = self.fence.read();
        for &(addr, len, epoch) in ranges {
            let Some(epoch) = epoch else { continue };
            let current = self.within(addr, len).map(|region| region.epoch);
            if current != Some(epoch) {
                return Err(StaleEpoch(current));
            }
        }
        Ok(access())
    }

    /// Holds the mount `epoch` of the region containing `[addr, addr+len)` (see
    /// [`Registry`]) until the returned hold is dropped. Errors: [`StaleEpoch`] when the
    /// range is not inside one registered region whose epoch is `epoch`, or that region is
    /// draining for an epoch switch (no hold is taken).
    pub(crate) fn hold(
        self: &Arc<Self>,
        addr: u64,
        len: u64,
        epoch: u64,
    ) -> std::result::Result<MountHold, StaleEpoch> {
        let _fence = self.fence.read();
        let region = self.within(addr, len);
        match region {
            Some(region) if region.epoch == epoch => {
                let mut holds = self.holds.lock();
                if holds.draining.contains(&region.base) {
                    return Err(StaleEpoch(Some(region.epoch)));
                }
                *holds.live.entry(region.base).or_insert(0) += 1;
                Ok(MountHold {
                    registry: Arc::clone(self),
                    base: region.base,
                })
            }
            _ => Err(StaleEpoch(region.map(|r| r.epoch))),
        }
    }

    /// `(base, len)` of every remotely accessible range, in address order.
    pub(crate) fn remote_ranges(&self) -> Vec<(u64, u64)> {
        let regions = self.regions.read();
        let accessible = regions.values().filter(|r| r.remote_accessible);
        accessible.map(|r| (r.base as u64, r.len as u64)).collect()
    }

    /// Live mount holds, over all regions.
    pub(crate) fn holds(&self) -> u64 {
        self.holds.lock().live.values().sum()
    }

    /// The range containing byte `addr`, if any.
    pub(crate) fn containing(&self, addr: usize) -> Option<MemoryRegion> {
        self.within(addr as u64, 1)
    }

    /// The single range that contains all of `[addr, addr+len)` (`len` may be 0), if any. A
    /// span across two adjacent ranges is not inside one range and gives `None`.
    pub(crate) fn within(&self, addr: u64, len: u64) -> Option<MemoryRegion> {
        let key = usize::try_from(addr).ok()?;
        let regions = self.regions.read();
        let (_, region) = regions.range(..=key).next_back()?;
        region.contains(addr, len).then_some(*region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_rejects_bad_ranges_and_overlaps() {
        let r = Registry::default();
        assert_eq!(r.register(0, 10, true), Err(ErrorCode::InvalidParams));
        assert_eq!(r.register(100, 0, true), Err(ErrorCode::InvalidParams));
        assert_eq!(
            r.register(usize::MAX - 4, 10, true),
            Err(ErrorCode::InvalidParams)
        );
        r.register(100, 50, true).unwrap();
        for (addr, len) in [(100, 1), (90, 11), (149, 5), (120, 5), (50, 200)] {
            assert_eq!(r.register(addr, len, false), Err(ErrorCode::InvalidParams));
        }
        r.register(150, 10, false).unwrap();
        r.register(90, 10, false).unwrap();
    }

    #[test]
    fn lookups_need_one_containing_range() {
        let r = Registry::default();
        r.register(100, 50, true).unwrap();
        r.register(150, 50, false).unwrap();
        assert_eq!(r.containing(99), None);
        assert_eq!(r.containing(100).map(|m| m.base), Some(100));
        assert_eq!(r.containing(149).map(|m| m.base), Some(100));
        assert_eq!(r.containing(150).map(|m| m.remote_accessible), Some(false));
        assert_eq!(r.containing(200), None);
        assert_eq!(r.within(100, 50).map(|m| m.len), Some(50));
        assert_eq!(r.within(140, 20), None, "spans two adjacent ranges");
        assert_eq!(r.within(199, 2), None);
        assert_eq!(r.within(u64::MAX, 1), None);
        assert_eq!(r.within(120, u64::MAX), None);
    }

    #[test]
    fn unregister_by_base_only() {
        let r = Registry::default();
        r.register(100, 50, true).unwrap();
        assert_eq!(r.unregister(101), Err(ErrorCode::InvalidParams));
        r.unregister(100).unwrap();
        assert_eq!(r.unregister(100), Err(ErrorCode::InvalidParams));
        assert_eq!(r.containing(120), None);
        r.register(100, 50, true).unwrap();
    }

    #[test]
    fn a_mount_hold_keeps_the_epoch_until_it_ends() {
        let r = Arc::new(Registry::default());
        r.register(100, 50, true).unwrap();
        r.register(200, 50, true).unwrap();
        r.set_epoch(100, 7, Duration::ZERO).unwrap();
        assert!(matches!(r.hold(110, 10, 6), Err(StaleEpoch(Some(7)))));
        assert!(matches!(r.hold(140, 20, 7), Err(StaleEpoch(None))));
        let first = r.hold(110, 10, 7).unwrap();
        let second = r.hold(120, 10, 7).unwrap();
        assert_eq!(r.holds(), 2);
        // Another region is not held.
        r.set_epoch(200, 3, Duration::ZERO).unwrap();
        assert_eq!(
            r.set_epoch(100, 8, Duration::from_millis(20)),
            Err(ErrorCode::TryAgain)
        );
        assert_eq!(r.within(100, 1).unwrap().epoch, 7, "unchanged");
        // Draining: no new hold of the mount whose switch is waiting.
        assert!(matches!(r.hold(110, 10, 7), Err(StaleEpoch(Some(7)))));
        drop(first);
        assert_eq!(
            r.set_epoch(100, 8, Duration::ZERO),
            Err(ErrorCode::TryAgain)
        );
        // A waiting switch goes through once the last hold ends within its wait.
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(second);
        });
        r.set_epoch(100, 8, Duration::from_secs(10)).unwrap();
        ender.join().unwrap();
        assert_eq!((r.within(100, 1).unwrap().epoch, r.holds()), (8, 0));
        assert!(matches!(r.hold(110, 10, 7), Err(StaleEpoch(Some(8)))));
    }
}
