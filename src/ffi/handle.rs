//! What every C handle shares: an optional client behind a reader-writer lock, a poisoned
//! flag, and the NULL / poisoned / not-set-up / already-set-up checks.
//!
//! Thread-safety: all methods take `&self`; the client is cloned out of the lock (a cheap
//! `Arc` clone), so no lock is held while an operation runs.

use crate::error::{fail, ErrorCode, Result};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// The state inside an opaque C handle (`mc_store`, `mc_p2p_store`).
pub(crate) struct ClientSlot<C> {
    client: RwLock<Option<C>>,
    poisoned: AtomicBool,
}

impl<C: Clone> ClientSlot<C> {
    /// An empty, healthy slot.
    pub(crate) fn new() -> ClientSlot<C> {
        ClientSlot {
            client: RwLock::new(None),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Marks the handle unusable after a caught panic.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// The set-up client; `INVALID_PARAMS` with `not_set_up` as the detail when there is none.
    pub(crate) fn client(&self, not_set_up: &str) -> Result<C> {
        match &*self.client.read() {
            Some(client) => Ok(client.clone()),
            None => fail(ErrorCode::InvalidParams, not_set_up),
        }
    }

    /// The set-up client, if any.
    pub(crate) fn current(&self) -> Option<C> {
        self.client.read().clone()
    }

    /// Installs the client `make` builds; `INVALID_PARAMS` if one is installed already (the
    /// write lock is held while `make` runs, so two racing setups cannot both succeed).
    pub(crate) fn install(&self, make: impl FnOnce() -> Result<C>) -> Result<()> {
        let mut slot = self.client.write();
        if slot.is_some() {
            return fail(ErrorCode::InvalidParams, "the handle is already set up");
        }
        *slot = Some(make()?);
        Ok(())
    }

    /// Removes and returns the client (teardown).
    pub(crate) fn take(&self) -> Option<C> {
        self.client.write().take()
    }

    /// The client of a handle being freed.
    pub(crate) fn into_client(self) -> Option<C> {
        self.client.into_inner()
    }
}

/// The handle at `ptr`, unless it is NULL (`INVALID_PARAMS`) or poisoned (`INTERNAL_ERROR`).
///
/// The caller promises that a non-NULL `ptr` is a live handle not yet freed.
pub(crate) fn checked<'a, H, C: Clone>(
    ptr: *const H,
    slot: impl Fn(&H) -> &ClientSlot<C>,
) -> Result<&'a H> {
    // SAFETY: NULL is checked by `as_ref`; otherwise the caller passes a live handle.
    let Some(handle) = (unsafe { ptr.as_ref() }) else {
        return fail(ErrorCode::InvalidParams, "store is NULL");
    };
    if slot(handle).poisoned.load(Ordering::Acquire) {
        return fail(
            ErrorCode::InternalError,
            "handle poisoned by an earlier panic",
        );
    }
    Ok(handle)
}
