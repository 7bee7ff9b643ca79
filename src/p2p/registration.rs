//! An owner's standing with the master: whether the master still routes this owner's keys to
//! it, as far as the owner can know. The master expires an owner that did not ping for its
//! client TTL and drops its routes; another owner may then take any of its keys, and the
//! master may have restarted and forgotten it. Until the owner has re-registered (and dropped
//! every key the master refused), accessors holding an old route could read a value that a
//! newer put has replaced.
//!
//! So an owner serves reads only while *confirmed*: within [`FENCE_AFTER`] of sending the
//! last ping the master answered as usual (or the re-registration it accepted). Because
//! the master expires an owner no earlier than its client TTL after the last ping it
//! received, an owner it expired is unconfirmed whenever it runs again, provided the TTL
//! is at least [`FENCE_AFTER`] (the master's `--client_ttl` is whole seconds, default 10;
//! the soak and the test harness use 2). Thread-safe: one leaf lock and one atomic.

use crate::error::{fail, ErrorCode, Result};
use crate::node::PING_INTERVAL;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long after sending its last confirmed ping an owner still serves reads: twice the
/// ping interval, at most the master's client TTL.
pub const FENCE_AFTER: Duration = Duration::from_secs(2);

/// The `mooncake_master` binary's default `--p2p_route_grace_ms`: [`FENCE_AFTER`] plus one
/// ping interval. An owner of a restarted master's previous life last confirmed before that
/// master died, so by the grace's end it has either reclaimed its keys (its next ping found
/// the new master) or fenced itself; a key is routed anew only after that.
pub const MASTER_ROUTE_GRACE: Duration = FENCE_AFTER.saturating_add(PING_INTERVAL);

/// The owner's confirmation state. Created confirmed (the owner registers at setup).
pub(crate) struct Registration {
    confirmed_at: Mutex<Instant>,
    /// Set when the master forgot us; cleared once all our keys were published again.
    republish: AtomicBool,
    /// The `view_version` of the master that last confirmed us: a master with the same view
    /// expired us (and keeps our claims), one with another view restarted.
    view: AtomicU64,
    /// That master's client TTL in ms (0: it named none).
    ttl_ms: AtomicU64,
}

impl Registration {
    /// Created confirmed, with view 0 until the setup's first ping confirms it.
    pub(crate) fn new() -> Registration {
        Registration {
            confirmed_at: Mutex::new(Instant::now()),
            republish: AtomicBool::new(false),
            view: AtomicU64::new(0),
            ttl_ms: AtomicU64::new(0),
        }
    }

    /// The master with view `view` (client TTL `ttl_ms`) knew this owner and all its keys as
    /// of `sent_at` (when the ping or the re-registration it answered was sent). Never moves
    /// the confirmation back.
    pub(crate) fn confirm(&self, sent_at: Instant, view: u64, ttl_ms: u64) {
        let mut confirmed = self.confirmed_at.lock();
        self.view.store(view, Ordering::Release);
        self.ttl_ms.store(ttl_ms, Ordering::Release);
        if sent_at > *confirmed {
            *confirmed = sent_at;
        }
    }

    /// The view of the master that last confirmed this owner.
    pub(crate) fn view(&self) -> u64 {
        self.view.load(Ordering::Acquire)
    }

    /// Whether the master that last confirmed this owner cannot have expired it by `at`: less
    /// than that master's client TTL (less a margin for clock rates; [`FENCE_AFTER`] when it
    /// named none) passed since the confirmed ping was sent. Every key the owner held was then
    /// still its own at that master, whenever it stopped answering (a restart, a failover to
    /// another master of its group).
    pub(crate) fn vouches_at(&self, at: Instant) -> bool {
        let ttl = match self.ttl_ms.load(Ordering::Acquire) {
            0 => FENCE_AFTER,
            ms => Duration::from_millis(ms),
        };
        let ttl = ttl.saturating_sub(crate::node::ttl_margin(ttl));
        at.saturating_duration_since(*self.confirmed_at.lock()) < ttl
    }

    /// The master answered that it does not know this owner: its keys must be published again
    /// before it is confirmed.
    pub(crate) fn forgotten(&self) {
        self.republish.store(true, Ordering::Release);
    }

    /// Whether the keys still have to be published again.
    pub(crate) fn must_republish(&self) -> bool {
        self.republish.load(Ordering::Acquire)
    }

    /// All keys were published again.
    pub(crate) fn republished(&self) {
        self.republish.store(false, Ordering::Release);
    }

    /// Errors: `OBJECT_NOT_FOUND` (the accessor then asks the master for a fresh route) while
    /// unconfirmed for [`FENCE_AFTER`] or longer, or while a master that forgot us has not yet
    /// answered the reclaim of our keys.
    pub(crate) fn check_serving(&self) -> Result<()> {
        if self.must_republish() {
            return fail(
                ErrorCode::ObjectNotFound,
                "the master forgot this owner; it serves no reads until it reclaimed its keys",
            );
        }
        let age = self.confirmed_at.lock().elapsed();
        if age >= FENCE_AFTER {
            return fail(
                ErrorCode::ObjectNotFound,
                format!(
                    "this owner is unconfirmed by the master for {age:?}; it serves no reads until it re-registered"
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_vouches_for_its_keys_while_its_last_master_cannot_have_expired_it() {
        let registration = Registration::new();
        let at = Instant::now();
        registration.confirm(at, 5, 10_000);
        assert!(
            registration.vouches_at(at + Duration::from_secs(5)),
            "a failover's length"
        );
        assert!(
            !registration.vouches_at(at + Duration::from_millis(9_800)),
            "the margin"
        );
        assert!(!registration.vouches_at(at + Duration::from_secs(10)));
        registration.confirm(at, 6, 0);
        assert!(
            !registration.vouches_at(at + FENCE_AFTER),
            "no TTL named: FENCE_AFTER"
        );
    }

    #[test]
    fn reads_stop_once_unconfirmed_and_resume_when_confirmed() {
        let registration = Registration::new();
        assert!(registration.check_serving().is_ok());
        let long_ago = Instant::now() - FENCE_AFTER;
        *registration.confirmed_at.lock() = long_ago;
        assert_eq!(registration.check_serving(), Err(ErrorCode::ObjectNotFound));
        registration.confirm(long_ago - Duration::from_secs(1), 7, 0);
        assert!(registration.check_serving().is_err(), "moved back");
        registration.confirm(Instant::now(), 8, 0);
        assert!(registration.check_serving().is_ok());
        assert_eq!(registration.view(), 8);
        assert!(registration.vouches_at(Instant::now()));
        assert!(!registration.vouches_at(Instant::now() + FENCE_AFTER));
        registration.forgotten();
        assert!(registration.must_republish());
        assert_eq!(registration.check_serving(), Err(ErrorCode::ObjectNotFound));
        registration.republished();
        assert!(!registration.must_republish());
    }
}
