//! This client's own segment: what it mounts at the master, the memory behind it, and the
//! epoch of the current mount.
//!
//! Every mount and remount gets a fresh epoch ([`crate::types::fresh_epoch`]); the transfer
//! engine is told first, so from then on it refuses any request naming an earlier mount's
//! descriptors (`STALE_SEGMENT_EPOCH`) — also those of an earlier process that served the
//! same `host:port`, whose epochs this process never had.
//!
//! Thread-safety: the description sits behind a small mutex; `next_mount` may race with
//! readers, which then see the old or the new epoch, never a mix.

use crate::device::MappedRegion;
use crate::error::Result;
use crate::transfer::TransferEngine;
use crate::types::{fresh_epoch, Segment, SegmentId};
use parking_lot::Mutex;

/// The mounted segment. Owns the mapping; it is unmapped when the client core is dropped.
pub(super) struct OwnSegment {
    segment: Mutex<Segment>,
    region: MappedRegion,
}

impl OwnSegment {
    /// `segment` (its epoch is replaced by [`OwnSegment::next_mount`]) over `region`.
    pub(super) fn new(segment: Segment, region: MappedRegion) -> OwnSegment {
        OwnSegment {
            segment: Mutex::new(segment),
            region,
        }
    }

    /// Starts a new mount: a fresh epoch, which the engine enforces from now on. Returns the
    /// description to (re)mount at the master. Errors: the engine's (`INVALID_PARAMS` when
    /// the region is not registered).
    pub(super) fn next_mount(&self, engine: &TransferEngine) -> Result<Segment> {
        let mut segment = self.segment.lock();
        let epoch = fresh_epoch();
        engine.set_region_epoch(segment.base as usize, epoch)?;
        segment.epoch = epoch;
        Ok(segment.clone())
    }

    /// The description of the current mount.
    pub(super) fn current(&self) -> Segment {
        self.segment.lock().clone()
    }

    /// The segment's id (the same for every mount).
    pub(super) fn id(&self) -> SegmentId {
        self.segment.lock().id
    }

    /// Whether the memory is registered with the device runtime.
    pub(super) fn is_pinned(&self) -> bool {
        self.region.is_pinned()
    }
}
