//! Re-registering a remounted range under new rkeys without ever reissuing an rkey a stale
//! writer may still hold.
//!
//! A remount gives the segment fresh pages and new MRs. Providers may hand a new MR the key
//! of one just deregistered (mlx5's 8-bit key variant and its MR cache can; rxe hides it with
//! cyclic indices): a stale writer's one-sided WRITE under the old rkey would then land in the
//! new mount. So the new MRs are registered while the old ones still exist, and the old ones
//! are kept — pinning only the old mount's orphaned pages, which this process no longer
//! reads or writes — for `MC_RDMA_MR_QUARANTINE_MS` (default 120 s, the master's default
//! write quarantine), past the last moment a writer granted under the old mount may send.
//! Meanwhile a stale writer's WRITE lands in those pages, and a stale reader still reads the
//! old mount's bytes (those of its committed objects) instead of being refused by the NIC.
//! The cost: during the quarantine the segment's memory is pinned twice.
//!
//! A re-registration over the same pages (no remount) needs none of this: there the old MRs
//! are dropped first, so the NIC refuses their rkeys.
//!
//! Thread-safety: [`replace`] may be called from any thread; each retirement is dropped by
//! a thread of its own ("mc-rdma-retired") when its quarantine ends.

use crate::error::Result;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// Replaces `old` by what `register` makes. With a `quarantine`, the successor is registered
/// while `old` exists and `old` is retired for `quarantine`; with none, `old` is dropped first
/// (its rkeys are refused by the NIC from then on). Returns the successor, or `register`'s
/// error (the old registrations are retired or dropped either way: the range is then
/// unregistered).
pub(crate) fn replace<R: Send + 'static>(
    old: R,
    register: impl FnOnce() -> Result<R>,
    quarantine: Duration,
) -> Result<R> {
    if quarantine.is_zero() {
        drop(old);
        return register();
    }
    let new = register();
    retire(old, quarantine);
    new
}

/// Drops `old` once `quarantine` has passed, on a thread of its own. Should no thread start,
/// `old` is kept for good (its pages stay pinned; logged): deregistering it early could let a
/// stale writer's rkey reach a later registration.
fn retire<R: Send + 'static>(old: R, quarantine: Duration) {
    let slot = Arc::new(Mutex::new(Some(old)));
    let held = Arc::clone(&slot);
    let spawned = std::thread::Builder::new()
        .name("mc-rdma-retired".into())
        .spawn(move || {
            std::thread::sleep(quarantine);
            drop(held.lock().take());
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no thread to end a retired RDMA registration: kept for good");
        std::mem::forget(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// A provider that reuses keys: every registration gets the lowest key not in use.
    #[derive(Default)]
    struct ReusingProvider {
        live: Mutex<BTreeSet<u32>>,
    }

    struct FakeMr {
        key: u32,
        provider: Arc<ReusingProvider>,
    }

    impl Drop for FakeMr {
        fn drop(&mut self) {
            self.provider.live.lock().remove(&self.key);
        }
    }

    fn register(provider: &Arc<ReusingProvider>) -> Result<FakeMr> {
        let mut live = provider.live.lock();
        let key = (1..).find(|k| !live.contains(k)).unwrap();
        live.insert(key);
        Ok(FakeMr {
            key,
            provider: Arc::clone(provider),
        })
    }

    #[test]
    fn a_replaced_registration_never_gets_the_old_key_and_the_old_one_outlives_its_quarantine() {
        let provider = Arc::new(ReusingProvider::default());
        let old = register(&provider).unwrap();
        let old_key = old.key;
        let quarantine = Duration::from_millis(200);
        let new = replace(old, || register(&provider), quarantine).unwrap();
        assert_ne!(new.key, old_key, "the new mount got the old mount's rkey");
        assert!(
            provider.live.lock().contains(&old_key),
            "the old registration is gone before its quarantine"
        );
        let freed = crate::test_util::wait_until(Duration::from_secs(10), || {
            !provider.live.lock().contains(&old_key)
        });
        assert!(
            freed,
            "the old registration outlived its quarantine for good"
        );
        assert!(provider.live.lock().contains(&new.key));
    }

    #[test]
    fn a_failed_registration_still_retires_the_old_one() {
        let provider = Arc::new(ReusingProvider::default());
        let old = register(&provider).unwrap();
        let old_key = old.key;
        let refused = replace(
            old,
            || crate::error::fail(crate::error::ErrorCode::TransferFail, "refused"),
            Duration::from_millis(100),
        );
        assert!(refused.is_err());
        assert!(
            provider.live.lock().contains(&old_key),
            "kept while quarantined"
        );
        assert!(crate::test_util::wait_until(
            Duration::from_secs(10),
            || { !provider.live.lock().contains(&old_key) }
        ));
    }
}
