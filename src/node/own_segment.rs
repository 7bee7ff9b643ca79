//! This client's own segment: what it mounts at the master, the memory behind it, and the
//! epoch of the current mount.
//!
//! Every mount and remount gets a fresh epoch ([`crate::types::fresh_epoch`]); the transfer
//! engine is told first, so from then on it refuses any request naming an earlier mount's
//! descriptors (`STALE_SEGMENT_EPOCH`) — also those of an earlier process that served the
//! same `host:port`, whose epochs this process never had.
//!
//! The memory is a sealed memfd that same-host peers map (see the transfer engine's
//! `same_host` channel); every remount withdraws the old mount from them, gives the segment a
//! fresh file over the same addresses (so a peer's mapping of the old mount reaches only pages
//! nothing reads any more) and offers the new one.
//!
//! Thread-safety: the description sits behind a small mutex; `next_mount` may race with
//! readers, which then see the old or the new epoch, never a mix.

use crate::device::MappedRegion;
use crate::error::Result;
use crate::transfer::TransferEngine;
use crate::types::{fresh_epoch, Segment, SegmentId};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The name of the segment's memfd (in `/proc/<pid>/maps`).
pub(crate) const SEGMENT_FILE: &str = "mooncake segment";

/// How long one remount attempt waits for queued stream copies of the current mount (it runs
/// on the liveness thread, which tries again at the next `NeedRemount`).
pub(crate) const REMOUNT_WAIT: Duration = Duration::from_millis(250);

/// The mounted segment. Owns the mapping; it is unmapped when the client core is dropped.
pub(crate) struct OwnSegment {
    segment: Mutex<Segment>,
    region: Mutex<MappedRegion>,
    /// Whether the region is registered with the device runtime now (read without the region
    /// lock, which a remount holds while it waits for stream copies that may ask).
    pinned: AtomicBool,
}

impl OwnSegment {
    /// `segment` (its epoch is replaced by [`OwnSegment::next_mount`]) over `region`.
    pub(crate) fn new(segment: Segment, region: MappedRegion) -> OwnSegment {
        let pinned = AtomicBool::new(region.is_pinned());
        OwnSegment {
            segment: Mutex::new(segment),
            region: Mutex::new(region),
            pinned,
        }
    }

    /// Starts a new mount: a fresh epoch, which the engine enforces from now on. A remount
    /// (not the first mount) first withdraws the old mount from same-host peers and then,
    /// once the engine refuses the old epoch, replaces the segment's pages by a fresh memfd:
    /// empty, or with `keep_contents` a copy of the current bytes (a re-attach to a master
    /// that recovered this mount from its journal). Either way nothing that names the old
    /// epoch, or maps the old pages, reaches the new mount. The new mount is then offered to
    /// same-host peers. Returns the description to (re)mount at the master.
    ///
    /// A remount waits up to [`REMOUNT_WAIT`] for stream copies queued against the current
    /// mount (their [`TransferEngine::hold_mount`]s) to run; while any is still queued it
    /// changes nothing and fails `TRY_AGAIN` (same-host peers stay withdrawn and use TCP):
    /// the caller tries again at its next `NeedRemount`.
    ///
    /// Errors: `TRY_AGAIN` as above; the engine's (`INVALID_PARAMS` when the region is not
    /// registered); the fresh file's (`INTERNAL_ERROR`): then nothing is mounted and the
    /// caller retries later.
    pub(crate) fn next_mount(
        &self,
        engine: &TransferEngine,
        keep_contents: bool,
    ) -> Result<Segment> {
        let mut segment = self.segment.lock();
        let mut region = self.region.lock();
        let epoch = fresh_epoch();
        let remount = segment.epoch != 0;
        if remount {
            engine.retire_segment_export();
        }
        // Fresh pages between the engine's switch to the new epoch (in-flight old-epoch copies
        // are fenced off first) and the NIC's registration of the range (which must pin the
        // new pages, not the old).
        // The first mount keeps the pages it was registered with.
        let base = segment.base as usize;
        let switched = match remount {
            true => engine.set_region_epoch_with(base, epoch, REMOUNT_WAIT, || {
                region.renew_shared(SEGMENT_FILE, keep_contents)
            }),
            false => engine.set_region_epoch(base, epoch),
        };
        self.pinned.store(region.is_pinned(), Ordering::Release);
        switched?;
        segment.epoch = epoch;
        if let Some(file) = region.shared_file() {
            if engine
                .export_segment(region.addr(), region.len(), epoch, file.fd())
                .is_err()
            {
                tracing::warn!(
                    detail = %crate::error::last_error_message(),
                    "segment not offered to same-host peers; they use TCP"
                );
            }
        }
        Ok(segment.clone())
    }

    /// The description of the current mount.
    pub(crate) fn current(&self) -> Segment {
        self.segment.lock().clone()
    }

    /// The segment's id (the same for every mount).
    pub(crate) fn id(&self) -> SegmentId {
        self.segment.lock().id
    }

    /// Whether the memory is registered with the device runtime.
    pub(crate) fn is_pinned(&self) -> bool {
        self.pinned.load(Ordering::Acquire)
    }
}
