//! Managed buffers of a [`super::TransferEndpoint`] (upstream's `allocate_managed_buffer` /
//! `free_managed_buffer`): registered host memory the endpoint owns and hands out in pieces.
//!
//! Pieces come from pools of [`POOL_BYTES`] (pinned with the device runtime when there is
//! one, registered once with the engine, sub-allocated by [`OffsetAllocator`]); a request
//! larger than a pool gets a pool of its own, unregistered when it is freed. Pools that hold
//! small pieces stay until the endpoint drops them (as upstream's slabs).
//!
//! Quarantine: a freed piece's bytes (and a freed dedicated pool's mapping) are reused (or
//! unmapped) only after the quarantine, the data server's deadline of one request: a peer's
//! TCP write the server admitted before the free may still be landing in them.
//!
//! Thread-safety: one mutex around the table; registrations are made under it.

use crate::alloc::{Allocation, OffsetAllocator};
use crate::device::MappedRegion;
use crate::error::{fail, ErrorCode, Result};
use crate::transfer::TransferEngine;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of a shared pool.
pub(crate) const POOL_BYTES: u64 = 64 << 20;

/// A registered mapping and the allocator of its bytes.
struct Pool {
    region: MappedRegion,
    allocator: Arc<OffsetAllocator>,
    /// A pool made for one large piece: dropped with it.
    dedicated: bool,
}

/// One piece handed out: its pool and its allocation (freed on drop).
struct Piece {
    pool: usize,
    len: u64,
    _allocation: Option<Allocation>,
}

/// What a free leaves in quarantine, held only to be dropped when due: a piece (its
/// allocation goes back to its pool), or a dedicated pool's mapping (already unregistered;
/// unmapped then).
struct Retired {
    _piece: Option<Piece>,
    _mapping: Option<MappedRegion>,
}

/// The endpoint's pools, the pieces handed out (by address) and the quarantined frees.
pub(crate) struct ManagedBuffers {
    table: Mutex<Table>,
    quarantine: Duration,
}

#[derive(Default)]
struct Table {
    pools: HashMap<usize, Pool>,
    pieces: HashMap<usize, Piece>,
    /// Oldest first, with the instant each may go.
    retired: VecDeque<(Instant, Retired)>,
}

impl Table {
    /// Drops the quarantined frees that are due at `now`.
    fn reap(&mut self, now: Instant) {
        while self.retired.front().is_some_and(|(due, _)| *due <= now) {
            self.retired.pop_front();
        }
    }
}

impl ManagedBuffers {
    /// An empty table whose frees are quarantined for `quarantine`.
    pub(crate) fn new(quarantine: Duration) -> ManagedBuffers {
        ManagedBuffers {
            table: Mutex::new(Table::default()),
            quarantine,
        }
    }

    /// A zero-filled (on first use) piece of `len` bytes, registered with `engine` for
    /// remote access; its address, and whether a pool was registered for it.
    ///
    /// Errors: `INVALID_PARAMS` for `len` 0; `INTERNAL_ERROR` when no memory can be mapped;
    /// the engine's registration errors.
    pub(crate) fn allocate(&self, engine: &TransferEngine, len: u64) -> Result<(usize, bool)> {
        if len == 0 {
            return fail(ErrorCode::InvalidParams, "a managed buffer of 0 bytes");
        }
        let mut table = self.table.lock();
        table.reap(Instant::now());
        if len <= POOL_BYTES {
            for (&base, pool) in table.pools.iter().filter(|(_, p)| !p.dedicated) {
                if let Some(allocation) = pool.allocator.allocate(len) {
                    let addr = base + allocation.offset() as usize;
                    let piece = Piece {
                        pool: base,
                        len,
                        _allocation: Some(allocation),
                    };
                    table.pieces.insert(addr, piece);
                    return Ok((addr, false));
                }
            }
        }
        let dedicated = len > POOL_BYTES;
        let size = if dedicated { len } else { POOL_BYTES };
        let region = MappedRegion::pinned(size, "transfer engine managed buffer")?;
        let base = region.addr();
        engine.register(base, region.len(), true)?;
        let allocator = OffsetAllocator::new(size);
        let allocation = match dedicated {
            true => None,
            false => allocator.allocate(len),
        };
        table.pools.insert(
            base,
            Pool {
                region,
                allocator,
                dedicated,
            },
        );
        let piece = Piece {
            pool: base,
            len,
            _allocation: allocation,
        };
        table.pieces.insert(base, piece);
        Ok((base, true))
    }

    /// The base of the pool of its own that the piece at `addr` of `len` bytes has, `None`
    /// for a piece of a shared pool: the caller unregisters such a pool before
    /// [`free`](Self::free).
    ///
    /// Errors: `INVALID_PARAMS` when no piece starts at `addr` or `len` is not its length.
    pub(crate) fn dedicated_pool(&self, addr: usize, len: u64) -> Result<Option<usize>> {
        let table = self.table.lock();
        match table.pieces.get(&addr) {
            None => fail(
                ErrorCode::InvalidParams,
                format_args!("{addr:#x} is not a managed buffer of this engine"),
            ),
            Some(piece) if piece.len != len => fail(
                ErrorCode::InvalidParams,
                format_args!(
                    "managed buffer {addr:#x} has {} bytes, not {len}",
                    piece.len
                ),
            ),
            Some(piece) => Ok(table
                .pools
                .get(&piece.pool)
                .filter(|pool| pool.dedicated)
                .map(|_| piece.pool)),
        }
    }

    /// Gives back the piece at `addr` of `len` bytes (checked as in
    /// [`dedicated_pool`](Self::dedicated_pool), whose pool the caller unregistered if it has
    /// one of its own): its bytes, or its pool's mapping, go into quarantine.
    ///
    /// Errors: as `dedicated_pool` (nothing is freed then).
    pub(crate) fn free(&self, addr: usize, len: u64) -> Result<()> {
        self.dedicated_pool(addr, len)?;
        let mut table = self.table.lock();
        let now = Instant::now();
        table.reap(now);
        let Some(piece) = table.pieces.remove(&addr) else {
            return fail(
                ErrorCode::InvalidParams,
                format_args!("{addr:#x} was freed meanwhile"),
            );
        };
        let due = now + self.quarantine;
        let dedicated = table.pools.get(&piece.pool).is_some_and(|p| p.dedicated);
        let mapping = match dedicated {
            true => table.pools.remove(&piece.pool).map(|pool| pool.region),
            false => None,
        };
        let retired = Retired {
            _piece: Some(piece),
            _mapping: mapping,
        };
        table.retired.push_back((due, retired));
        Ok(())
    }

    /// Whether `addr` is the base of one of the pools (registered by this table).
    pub(crate) fn owns_pool(&self, addr: usize) -> bool {
        self.table.lock().pools.contains_key(&addr)
    }

    /// Unregisters every pool from `engine` and unmaps it, quarantined ones too (the endpoint
    /// is closing: call it once its engine no longer serves peers).
    pub(crate) fn release_all(&self, engine: &TransferEngine) {
        let mut table = self.table.lock();
        table.pieces.clear();
        table.retired.clear();
        for (base, _) in table.pools.drain() {
            let _ = engine.unregister(base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::test_support::embedded_engine as engine;

    #[test]
    fn small_pieces_share_a_pool_and_a_large_one_gets_its_own() {
        let engine = engine();
        let managed = ManagedBuffers::new(Duration::ZERO);
        let (a, new_pool) = managed.allocate(&engine, 4096).unwrap();
        assert!(new_pool);
        let (b, new_pool) = managed.allocate(&engine, 100).unwrap();
        assert!(!new_pool);
        assert_ne!(a, b);
        let region = engine.region_containing(a).unwrap();
        assert!(region.remote_accessible);
        assert_eq!(engine.region_containing(b).unwrap().base, region.base);
        let (big, _) = managed.allocate(&engine, POOL_BYTES + 1).unwrap();
        assert!(managed.owns_pool(big) && !managed.owns_pool(b));
        assert_eq!(engine.region_containing(big).unwrap().base, big);
        assert!(managed.table.lock().pools[&big].region.len() as u64 > POOL_BYTES);
        assert_eq!(managed.table.lock().pieces.len(), 3);
        assert_eq!(managed.dedicated_pool(big, POOL_BYTES + 1), Ok(Some(big)));
        assert_eq!(managed.dedicated_pool(a, 4096), Ok(None));
        engine.unregister(big).unwrap();
        managed.free(big, POOL_BYTES + 1).unwrap();
        assert!(!managed.owns_pool(big));
        managed.free(a, 4096).unwrap();
        assert_eq!(
            managed.allocate(&engine, 4096).unwrap(),
            (a, false),
            "reused"
        );
        managed.release_all(&engine);
        assert!(engine.region_containing(b).is_none());
    }

    #[test]
    fn bad_frees_and_sizes_are_refused_and_free_nothing() {
        let engine = engine();
        let managed = ManagedBuffers::new(Duration::ZERO);
        assert_eq!(
            managed.allocate(&engine, 0).err(),
            Some(ErrorCode::InvalidParams)
        );
        let (a, _) = managed.allocate(&engine, 64).unwrap();
        assert_eq!(managed.free(a, 65).err(), Some(ErrorCode::InvalidParams));
        assert_eq!(
            managed.free(a + 8, 64).err(),
            Some(ErrorCode::InvalidParams)
        );
        assert_eq!(managed.table.lock().pieces.len(), 1);
        managed.free(a, 64).unwrap();
        assert_eq!(
            managed.free(a, 64).err(),
            Some(ErrorCode::InvalidParams),
            "twice"
        );
    }

    #[test]
    fn freed_bytes_are_reused_only_after_the_quarantine() {
        let engine = engine();
        let managed = ManagedBuffers::new(Duration::from_millis(200));
        let (a, _) = managed.allocate(&engine, 4096).unwrap();
        managed.free(a, 4096).unwrap();
        let (b, _) = managed.allocate(&engine, 4096).unwrap();
        assert_ne!(a, b, "a peer's admitted write may still land in a");
        std::thread::sleep(Duration::from_millis(250));
        let (c, _) = managed.allocate(&engine, 4096).unwrap();
        assert_eq!(c, a, "reused after the quarantine");
        let (big, _) = managed.allocate(&engine, POOL_BYTES + 1).unwrap();
        engine.unregister(big).unwrap();
        managed.free(big, POOL_BYTES + 1).unwrap();
        assert_eq!(
            managed.table.lock().retired.len(),
            1,
            "its mapping stays for now"
        );
        managed.release_all(&engine);
        assert!(managed.table.lock().retired.is_empty());
    }
}
