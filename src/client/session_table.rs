//! The client's session tables (get sessions with their pins, put sessions with their ranged
//! writes in flight): the state `sessions.rs` operates on, kept apart so the client core can
//! own it without importing the operations.
//!
//! Thread-safety: every table sits behind its own mutex; locks are never held across a
//! transfer or a master call.

use super::plan::GrantedWrite;
use crate::error::{fail, ErrorCode, Result};
use crate::master::MasterApi;
use crate::types::{ClientId, ReplicaDescriptor};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// The client's session tables. Thread-safe; locks are never held across a transfer.
#[derive(Default)]
pub(super) struct Sessions {
    pub(super) get: Mutex<HashMap<String, GetSession>>,
    pub(super) put: Mutex<HashMap<String, Arc<PutSession>>>,
}

#[derive(Clone)]
pub(super) struct GetSession {
    pub(super) replica: ReplicaDescriptor,
    pub(super) size: u64,
    pub(super) deadline: Instant,
    /// The object's pin, shared with on-stream tickets reading through the session; the
    /// object is unpinned when the session ends and the last such ticket is released.
    pub(super) pin: Arc<SessionPin>,
}

/// A master pin held by a get session; unpinned (one master call) when dropped, unless the
/// last holder took it with [`SessionPin::take_last`]. Never drop it under a session-table
/// lock.
pub(super) struct SessionPin {
    pub(super) master: Arc<dyn MasterApi>,
    pub(super) client: ClientId,
    /// `None` once taken by `take_last`.
    pub(super) pin_id: Option<u64>,
    /// When the pin was asked for (see `ClientCore::check_pins_held`).
    pub(super) pinned_at: Instant,
}

impl SessionPin {
    /// Gives up one share of `pin`. When it was the last share, returns the pin id instead
    /// of unpinning it here: the caller (an on-stream ticket's release) hands it to the
    /// stream engine's asynchronous unpinner. Otherwise the remaining holder unpins later.
    pub(super) fn take_last(pin: Arc<SessionPin>) -> Option<u64> {
        Arc::try_unwrap(pin).ok()?.pin_id.take()
    }
}

impl Drop for SessionPin {
    fn drop(&mut self) {
        let Some(pin) = self.pin_id.take() else {
            return;
        };
        if let Err(e) = self.master.unpin(self.client, vec![pin]) {
            tracing::debug!(error = %e, pin, "unpin of an ended get session failed");
        }
    }
}

pub(super) struct PutSession {
    pub(super) replicas: Vec<ReplicaDescriptor>,
    pub(super) size: u64,
    pub(super) write: GrantedWrite,
    pub(super) state: Mutex<PutState>,
    pub(super) idle: Condvar,
}

#[derive(Default)]
pub(super) struct PutState {
    pub(super) sealed: bool,
    pub(super) in_flight: usize,
    /// The first failed ranged write: the session can no longer commit.
    pub(super) failed: Option<ErrorCode>,
}

impl PutSession {
    /// Registers a ranged write unless the session is sealed, failed, or older than its
    /// write ttl (its space may have been reclaimed: `STALE_WRITE_TOKEN`).
    pub(super) fn enter(&self) -> Result<()> {
        let mut state = self.state.lock();
        if state.sealed {
            return fail(ErrorCode::InvalidParams, "put session is sealed");
        }
        if let Some(e) = state.failed {
            return fail(e, "an earlier ranged write of this put session failed");
        }
        self.write.check_writable()?;
        state.in_flight += 1;
        Ok(())
    }

    /// Ends a ranged write registered by [`PutSession::enter`]; a failed one fails the
    /// session.
    pub(super) fn leave(&self, outcome: Result<()>) {
        let mut state = self.state.lock();
        if let Err(e) = outcome {
            state.failed.get_or_insert(e);
        }
        state.in_flight -= 1;
        if state.in_flight == 0 {
            self.idle.notify_all();
        }
    }

    /// Seals the session and waits for ranged writes in flight (each is bounded by the
    /// transfer timeout); returns the first ranged write failure, if any.
    pub(super) fn seal_and_drain(&self) -> Option<ErrorCode> {
        let mut state = self.state.lock();
        state.sealed = true;
        while state.in_flight > 0 {
            self.idle.wait(&mut state);
        }
        state.failed
    }
}
