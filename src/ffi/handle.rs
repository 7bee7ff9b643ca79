//! What every C handle shares: an optional client behind a reader-writer lock, a poisoned
//! flag, and the NULL / poisoned / not-set-up / setting-up / already-set-up checks.
//!
//! Thread-safety: all methods take `&self`; the client is cloned out of the lock (a cheap
//! `Arc` clone), and the lock is only ever held for that clone or a state change, never while
//! a setup or an operation runs: a setup in progress leaves every other call answering at
//! once.

use crate::error::{fail, ErrorCode, Result};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where a handle is in its life cycle.
enum State<C> {
    /// Never set up, torn down, or its setup failed.
    Empty,
    /// A setup is running (without the lock held).
    SettingUp,
    /// Set up.
    Ready(C),
}

/// The state inside an opaque C handle (`mc_store`, `mc_p2p_store`).
pub(crate) struct ClientSlot<C> {
    state: RwLock<State<C>>,
    poisoned: AtomicBool,
}

impl<C: Clone> ClientSlot<C> {
    /// An empty, healthy slot.
    pub(crate) fn new() -> ClientSlot<C> {
        ClientSlot {
            state: RwLock::new(State::Empty),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Marks the handle unusable after a caught panic.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// The set-up client; `INVALID_PARAMS` with `not_set_up` as the detail when there is none
    /// (with a note when a setup is still in progress).
    pub(crate) fn client(&self, not_set_up: &str) -> Result<C> {
        match &*self.state.read() {
            State::Ready(client) => Ok(client.clone()),
            State::SettingUp => fail(
                ErrorCode::InvalidParams,
                format!("{not_set_up}; a setup is still in progress"),
            ),
            State::Empty => fail(ErrorCode::InvalidParams, not_set_up),
        }
    }

    /// The set-up client, if any (`None` also while a setup is in progress).
    pub(crate) fn current(&self) -> Option<C> {
        match &*self.state.read() {
            State::Ready(client) => Some(client.clone()),
            State::SettingUp | State::Empty => None,
        }
    }

    /// Installs the client `make` builds. `make` runs without the lock held: meanwhile other
    /// calls see the handle as not set up, a second setup fails, and a teardown does nothing.
    /// Errors: `INVALID_PARAMS` if a client is installed or a setup is in progress already
    /// (two racing setups cannot both succeed); `make`'s error, after which the handle is
    /// empty again (also if `make` panics).
    pub(crate) fn install(&self, make: impl FnOnce() -> Result<C>) -> Result<()> {
        {
            let mut state = self.state.write();
            match *state {
                State::Empty => *state = State::SettingUp,
                State::SettingUp => {
                    return fail(
                        ErrorCode::InvalidParams,
                        "a setup of this handle is already in progress",
                    )
                }
                State::Ready(_) => {
                    return fail(ErrorCode::InvalidParams, "the handle is already set up")
                }
            }
        }
        let reserved = Reserved(self);
        let client = make()?;
        *reserved.0.state.write() = State::Ready(client);
        Ok(())
    }

    /// Removes and returns the client (teardown); `None` when not set up or still setting up.
    pub(crate) fn take(&self) -> Option<C> {
        let mut state = self.state.write();
        match std::mem::replace(&mut *state, State::Empty) {
            State::Ready(client) => Some(client),
            State::SettingUp => {
                *state = State::SettingUp;
                None
            }
            State::Empty => None,
        }
    }

    /// The client of a handle being freed.
    pub(crate) fn into_client(self) -> Option<C> {
        match self.state.into_inner() {
            State::Ready(client) => Some(client),
            State::SettingUp | State::Empty => None,
        }
    }
}

/// A setup in progress: dropping it without a client installed (an error or a panic in the
/// setup) makes the slot empty again.
struct Reserved<'a, C>(&'a ClientSlot<C>);

impl<C> Drop for Reserved<'_, C> {
    fn drop(&mut self) {
        let mut state = self.0.state.write();
        if matches!(*state, State::SettingUp) {
            *state = State::Empty;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_or_panicking_setup_leaves_the_slot_empty() {
        let slot = ClientSlot::<u32>::new();
        assert_eq!(
            slot.install(|| fail(ErrorCode::RpcFail, "no master")),
            Err(ErrorCode::RpcFail)
        );
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            slot.install(|| panic!("setup panicked"))
        }));
        assert!(panicked.is_err());
        assert_eq!(slot.install(|| Ok(7)), Ok(()));
        assert_eq!(slot.install(|| Ok(8)), Err(ErrorCode::InvalidParams));
        assert_eq!(slot.take(), Some(7));
        assert_eq!(slot.current(), None);
    }

    #[test]
    fn a_setup_in_progress_is_not_set_up_and_refuses_a_second_setup() {
        let slot = ClientSlot::<u32>::new();
        let inner = slot.install(|| {
            assert_eq!(slot.current(), None);
            assert_eq!(slot.client("not set up"), Err(ErrorCode::InvalidParams));
            assert_eq!(slot.install(|| Ok(2)), Err(ErrorCode::InvalidParams));
            assert_eq!(slot.take(), None);
            Ok(1)
        });
        assert_eq!(inner, Ok(()));
        assert_eq!(slot.current(), Some(1));
    }
}
