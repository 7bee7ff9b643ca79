//! What an HA master's RPC server serves ([`Role`]): the master service while this process
//! leads *and* its etcd lease is fresh by its own clock, otherwise
//! `UNAVAILABLE_IN_CURRENT_STATUS` for every call (a standby, a deposed leader, a leader
//! whose lease could not be renewed in time).
//!
//! The fence: the lease deadline is taken from the moment a renewal was *sent* (etcd counts
//! from when it receives it, which is later), shortened by [`FENCE_MARGIN`], and checked
//! before and after each call, so a leader stops answering before etcd can expire its lease
//! and elect another — also a leader that was stopped (SIGSTOP) and wakes after the fact.
//!
//! Thread-safety: `Send + Sync`; the deadline is an atomic, the service behind a lock taken
//! shared per call.

use crate::error::{fail, ErrorCode, Result};
use crate::master::{MasterInterface, MasterRequest, MasterResponse, MasterService};
use crate::rpc::{Call, Interface};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The part of a lease a leader does not use: 10 % (clock rates) and 100 ms.
pub(crate) fn fenced(ttl: Duration) -> Duration {
    (ttl.mul_f64(0.9)).saturating_sub(FENCE_MARGIN)
}

/// Fixed part of the margin a leader keeps from its lease's end.
pub(crate) const FENCE_MARGIN: Duration = Duration::from_millis(100);

/// See the module documentation.
pub struct Role {
    service: RwLock<Option<Arc<MasterService>>>,
    /// Nanoseconds after `base` until which the leader may answer (0: not leading).
    valid_until: AtomicU64,
    base: Instant,
}

impl Default for Role {
    fn default() -> Self {
        Role {
            service: RwLock::new(None),
            valid_until: AtomicU64::new(0),
            base: Instant::now(),
        }
    }
}

impl Role {
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Starts serving `service`, fenced at `until`.
    pub(crate) fn lead(&self, service: Arc<MasterService>, until: Instant) {
        *self.service.write() = Some(service);
        self.extend(until);
    }

    /// Moves the fence to `until` (never back).
    pub(crate) fn extend(&self, until: Instant) {
        self.valid_until
            .fetch_max(self.nanos(until), Ordering::AcqRel);
    }

    /// When the fence falls.
    pub(crate) fn fence(&self) -> Instant {
        self.base + Duration::from_nanos(self.valid_until.load(Ordering::Acquire))
    }

    /// Stops serving; returns the service that was served.
    pub(crate) fn stand_down(&self) -> Option<Arc<MasterService>> {
        self.valid_until.store(0, Ordering::Release);
        self.service.write().take()
    }

    /// Whether this process serves now.
    pub fn is_leading(&self) -> bool {
        self.check().is_ok()
    }

    /// The service while the fence stands.
    pub fn service(&self) -> Option<Arc<MasterService>> {
        self.check().ok()
    }

    fn check(&self) -> Result<Arc<MasterService>> {
        let service = self.service.read().clone();
        match service {
            Some(service)
                if self.nanos(Instant::now()) < self.valid_until.load(Ordering::Acquire) =>
            {
                Ok(service)
            }
            _ => fail(
                ErrorCode::UnavailableInCurrentStatus,
                "this master is not the leader (a standby, or its lease lapsed)",
            ),
        }
    }
}

/// The [`Call`] the RPC server dispatches through (see [`Role`]).
pub struct RoleCall(pub Arc<Role>);

impl Call<MasterInterface> for RoleCall {
    fn call(&self, request: MasterRequest) -> Result<MasterResponse> {
        let service = self.0.check()?;
        let response = MasterInterface::dispatch(request, &*service);
        // A lease that lapsed during the call: its answer is not given.
        self.0.check()?;
        Ok(response)
    }
}
