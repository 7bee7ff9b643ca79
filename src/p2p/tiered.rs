//! The owner's TieredBackend: its storage tiers ([`crate::storage`], DRAM today) in priority
//! order, plus the table of committed (visible) keys.
//!
//! Ownership: an [`AllocationHandle`] is an `Arc` whose last drop returns its range to the
//! tier (RAII); it also keeps its tier alive. Holders are
//! the committed table, pending-write and pin records, and in-flight REVERSE transfers.
//!
//! Thread-safety: the committed table is sharded; each shard is a `parking_lot::RwLock`, so
//! lookups of a hot key share the lock and only clone an `Arc` under it. Allocator locks are
//! leaves.

use super::config::TieredConfig;
use super::records::shard_index;
use crate::error::{fail, ErrorCode, Result};
pub(crate) use crate::storage::AllocationHandle;
use crate::storage::{DramTier, Tier, TierAlloc};
use crate::transfer::TransferEngine;
use parking_lot::RwLock;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::sync::Arc;

/// Tiers and committed keys. Thread-safe; share by `Arc`.
pub(crate) struct TieredBackend {
    tiers: Vec<Arc<dyn Tier>>,
    committed: Box<[RwLock<HashMap<String, AllocationHandle>>]>,
    hasher: RandomState,
}

impl TieredBackend {
    /// Maps every tier of `config` ([`DramTier::new`]: registered with `engine` as remotely
    /// accessible, so peers' engines write into PreWrite buffers and read pinned ones).
    /// `shards` ≥ 1.
    ///
    /// Errors: `INTERNAL_ERROR` when a mapping fails; `INVALID_PARAMS` when registration fails.
    pub(crate) fn new(
        config: &TieredConfig,
        engine: &TransferEngine,
        shards: usize,
    ) -> Result<TieredBackend> {
        let mut tiers = Vec::with_capacity(config.tiers.len());
        for tier in &config.tiers {
            tiers.push(Arc::new(DramTier::new(tier.capacity, engine)?) as Arc<dyn Tier>);
        }
        Ok(TieredBackend {
            tiers,
            committed: (0..shards.max(1)).map(|_| RwLock::default()).collect(),
            hasher: RandomState::new(),
        })
    }

    /// Whether there is any tier (a client without tiers is a pure accessor).
    pub(crate) fn has_tiers(&self) -> bool {
        !self.tiers.is_empty()
    }

    /// Allocates `len` bytes in the first tier (by priority) that has room.
    ///
    /// Errors: `INVALID_PARAMS` for 0; `NO_AVAILABLE_HANDLE` when no tier has room.
    pub(crate) fn allocate(&self, len: u64) -> Result<AllocationHandle> {
        if len == 0 {
            return fail(ErrorCode::InvalidParams, "cannot store an empty value");
        }
        if let Some(handle) = self
            .tiers
            .iter()
            .find_map(|tier| TierAlloc::new_in(tier, len))
        {
            return Ok(handle);
        }
        fail(
            ErrorCode::NoAvailableHandle,
            format!("no tier has room for {len} bytes"),
        )
    }

    fn shard(&self, key: &str) -> &RwLock<HashMap<String, AllocationHandle>> {
        &self.committed[shard_index(&self.hasher, key, self.committed.len())]
    }

    /// Makes `handle` visible as `key`.
    ///
    /// Errors: `OBJECT_ALREADY_EXISTS` when `key` is already committed.
    pub(crate) fn commit(&self, key: &str, handle: AllocationHandle) -> Result<()> {
        let mut shard = self.shard(key).write();
        if shard.contains_key(key) {
            return fail(
                ErrorCode::ObjectAlreadyExists,
                format!("key {key} already exists"),
            );
        }
        shard.insert(key.to_string(), handle);
        Ok(())
    }

    /// The committed value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<AllocationHandle> {
        self.shard(key).read().get(key).cloned()
    }

    /// Whether `key` is committed.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.shard(key).read().contains_key(key)
    }

    /// Hides `key`; its bytes are freed when the last holder (a pin, a transfer) lets go.
    pub(crate) fn remove(&self, key: &str) -> Option<AllocationHandle> {
        self.shard(key).write().remove(key)
    }

    /// Hides `key` if its value satisfies `matches` (checked under the shard's lock).
    pub(crate) fn remove_if(
        &self,
        key: &str,
        matches: impl FnOnce(&AllocationHandle) -> bool,
    ) -> Option<AllocationHandle> {
        let mut shard = self.shard(key).write();
        if !shard.get(key).is_some_and(matches) {
            return None;
        }
        shard.remove(key)
    }

    /// Every committed key with its size (for re-registration with a restarted master).
    pub(crate) fn keys(&self) -> Vec<(String, u64)> {
        self.committed
            .iter()
            .flat_map(|shard| {
                let shard = shard.read();
                shard
                    .iter()
                    .map(|(k, h)| (k.clone(), h.len()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Allocated bytes over all tiers.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.tiers.iter().map(|t| t.used_bytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::p2p::config::TierConfig;
    use crate::transfer::{DirectResolver, EngineConfig};

    fn engine() -> Arc<TransferEngine> {
        TransferEngine::new(EngineConfig {
            local_name: "t".into(),
            listener: None,
            resolver: Arc::new(DirectResolver),
            memcpy_enabled: true,
            rdma: None,
        })
        .unwrap()
    }

    #[test]
    fn allocations_follow_priority_and_free_on_last_drop() {
        let config = TieredConfig {
            tiers: vec![
                TierConfig {
                    capacity: 4096,
                    priority: 10,
                },
                TierConfig {
                    capacity: 1 << 20,
                    priority: 1,
                },
            ],
        };
        let engine = engine();
        let backend = TieredBackend::new(&config, &engine, 4).unwrap();
        let first = backend.allocate(4096).unwrap();
        let second = backend.allocate(100).unwrap();
        assert_eq!(backend.used_bytes(), 4096 + 128);
        assert!(
            engine
                .region_containing(second.addr())
                .unwrap()
                .remote_accessible
        );
        backend.commit("k", Arc::clone(&first)).unwrap();
        assert_eq!(
            backend.commit("k", Arc::clone(&second)),
            Err(ErrorCode::ObjectAlreadyExists)
        );
        let reader = backend.get("k").unwrap();
        drop(first);
        drop(backend.remove("k"));
        assert_eq!(
            backend.used_bytes(),
            4096 + 128,
            "the reader still holds it"
        );
        drop(reader);
        drop(second);
        assert_eq!(backend.used_bytes(), 0);
        assert_eq!(
            backend.allocate(2 << 20).err(),
            Some(ErrorCode::NoAvailableHandle)
        );
        assert_eq!(backend.allocate(0).err(), Some(ErrorCode::InvalidParams));
    }
}
