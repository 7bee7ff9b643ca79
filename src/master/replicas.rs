//! A memory replica as the object table stores it: where its mount is addressed and under
//! which epoch ([`Place`], shared by the mount's replicas), and its range ([`Range`], held in
//! the replica until something else needs a handle of its own).

use crate::alloc::Allocation;
use crate::types::{BufferDescriptor, ReplicaDescriptor, ReplicaStatus, Segment, SegmentId};
use std::sync::Arc;

/// How a mount's replicas are addressed: one copy of the segment's name and protocol for all
/// of them, made at mount (and again when a re-attach gives them a new epoch). Immutable;
/// `Send + Sync`.
#[derive(Debug)]
pub(crate) struct Place {
    pub segment: SegmentId,
    /// The segment's base address in its owner.
    pub base: u64,
    pub protocol: String,
    /// The owner's segment name (its transport endpoint).
    pub endpoint: String,
    /// The mount's epoch (the owner refuses descriptors of another).
    pub epoch: u64,
}

impl Place {
    /// The place of the mount of `segment`.
    pub(crate) fn of(segment: &Segment) -> Arc<Place> {
        Arc::new(Place {
            segment: segment.id,
            base: segment.base,
            protocol: segment.protocol.clone(),
            endpoint: segment.name.clone(),
            epoch: segment.epoch,
        })
    }

    /// This place under `epoch` (a replica restored from the journal under an older one).
    pub(crate) fn with_epoch(&self, epoch: u64) -> Arc<Place> {
        Arc::new(Place {
            segment: self.segment,
            base: self.base,
            protocol: self.protocol.clone(),
            endpoint: self.endpoint.clone(),
            epoch,
        })
    }

    /// The descriptor of `size` bytes at `offset` in this place.
    pub(crate) fn buffer(&self, offset: u64, size: u64) -> BufferDescriptor {
        BufferDescriptor {
            size,
            buffer_address: self.base.saturating_add(offset),
            protocol: self.protocol.clone(),
            transport_endpoint: self.endpoint.clone(),
            epoch: self.epoch,
        }
    }
}

/// A replica's range: owned by the replica, or shared once a pin, a disk task or a deferred
/// free took a handle of its own (the range is freed when the last handle goes).
pub(crate) enum Range {
    Owned(Allocation),
    Shared(Arc<Allocation>),
}

impl Range {
    /// The range `shared`, owned again when no one else holds it.
    pub(crate) fn from_shared(shared: Arc<Allocation>) -> Range {
        match Arc::try_unwrap(shared) {
            Ok(owned) => Range::Owned(owned),
            Err(shared) => Range::Shared(shared),
        }
    }

    pub(crate) fn get(&self) -> &Allocation {
        match self {
            Range::Owned(allocation) => allocation,
            Range::Shared(allocation) => allocation,
        }
    }

    /// A handle of its own on the range (the replica shares it from now on).
    pub(crate) fn share(&mut self) -> Arc<Allocation> {
        match self {
            Range::Shared(shared) => Arc::clone(shared),
            Range::Owned(owned) => {
                // SAFETY: the allocation is moved out and `self` overwritten with its new
                // home with nothing between them that can unwind (an allocation failure
                // aborts), so it is neither dropped twice nor leaked.
                let shared = Arc::new(unsafe { std::ptr::read(owned) });
                unsafe { std::ptr::write(self, Range::Shared(Arc::clone(&shared))) };
                shared
            }
        }
    }

    /// Owned again if no one else holds the range any more (a pin released).
    pub(crate) fn reclaim(&mut self) {
        if let Range::Shared(shared) = self {
            // SAFETY: as in `share`: moved out and overwritten with nothing between them
            // that can unwind (`from_shared` does not panic).
            let shared = unsafe { std::ptr::read(shared) };
            unsafe { std::ptr::write(self, Range::from_shared(shared)) };
        }
    }
}

/// Ranges let go of together: dropping the batch returns those no one else holds to their
/// allocators in one pass ([`crate::alloc::release_all`]). A scan collects what it removes
/// under a shard's lock and drops the batch after the lock is released, so the shard is not
/// held while its objects' ranges are freed. Owned by one caller; dropping it takes each
/// allocator's lock once.
#[derive(Default)]
pub(crate) struct Released(Vec<Range>);

impl Released {
    /// Adds `ranges` to the batch (taking the vector itself when the batch is empty).
    pub(crate) fn extend(&mut self, mut ranges: Vec<Range>) {
        match self.0.is_empty() {
            true => std::mem::swap(&mut self.0, &mut ranges),
            false => self.0.append(&mut ranges),
        }
    }
}

impl Drop for Released {
    fn drop(&mut self) {
        let owned = std::mem::take(&mut self.0)
            .into_iter()
            .filter_map(|range| match range {
                Range::Owned(allocation) => Some(allocation),
                // Freed here if this was the last handle, else when the last one goes.
                Range::Shared(shared) => Arc::try_unwrap(shared).ok(),
            })
            .collect();
        crate::alloc::release_all(owned);
    }
}

/// One memory replica of an object.
pub(crate) struct Replica {
    pub id: u64,
    /// The mount the range was placed on (a re-attach moves it to the new epoch's place).
    pub place: Arc<Place>,
    pub range: Range,
}

impl Replica {
    /// The segment the replica is in.
    pub(crate) fn segment(&self) -> SegmentId {
        self.place.segment
    }

    /// The replica's range.
    pub(crate) fn allocation(&self) -> &Allocation {
        self.range.get()
    }

    /// Where a client writes or reads the object's `size` bytes.
    pub(crate) fn buffer(&self, size: u64) -> BufferDescriptor {
        self.place.buffer(self.allocation().offset(), size)
    }

    /// The replica's descriptor for the object's `size` bytes, with `status`.
    pub(crate) fn descriptor(&self, size: u64, status: ReplicaStatus) -> ReplicaDescriptor {
        ReplicaDescriptor {
            id: self.id,
            buffer: self.buffer(size),
            status,
            disk: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::OffsetAllocator;

    #[test]
    fn a_shared_range_is_freed_by_its_last_holder() {
        let allocator = OffsetAllocator::new(1 << 20);
        let mut range = Range::Owned(allocator.allocate(100).unwrap());
        assert_eq!(allocator.used(), 128);
        let pin = range.share();
        let again = range.share();
        assert!(matches!(range, Range::Shared(_)));
        assert_eq!((range.get().offset(), range.get().size()), (0, 128));
        drop(range);
        drop(again);
        assert_eq!(allocator.used(), 128, "the pin still holds it");
        drop(pin);
        assert_eq!(allocator.used(), 0);
        // Owned again when no one else holds it.
        let shared = Arc::new(allocator.allocate(64).unwrap());
        assert!(matches!(Range::from_shared(shared), Range::Owned(_)));
        assert_eq!(allocator.used(), 0);
        let mut range = Range::Owned(allocator.allocate(64).unwrap());
        let pin = range.share();
        range.reclaim();
        assert!(matches!(range, Range::Shared(_)), "the pin holds it");
        drop(pin);
        range.reclaim();
        assert!(matches!(range, Range::Owned(_)));
        assert_eq!(allocator.used(), 64);
        drop(range);
        assert_eq!(allocator.used(), 0);
    }
}
