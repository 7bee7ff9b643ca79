//! [`Reaper`]: the thread that drops cached mappings whose owner hung up its handshake
//! connection (the owner died, or retired the mount at a remount), so the pages of a gone
//! mount are unmapped at once, even if no request names that peer again.

use super::hangup::wait_for_hangups;
use super::peers::Cache;
use crate::error::{fail, ErrorCode, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest wait between two looks at the cache (new mappings also wake the thread at once).
const ROUND: Duration = Duration::from_secs(1);

/// The reaper thread of one cache. Ownership: owns the thread and its wake-up eventfd; drop
/// stops and joins it (within one poll). Thread-safety: [`Reaper::nudge`] takes `&self`.
pub(super) struct Reaper {
    wake: Arc<OwnedFd>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Starts watching `cache`'s mappings. Errors: `INTERNAL_ERROR` when the eventfd or the
    /// thread cannot be made.
    pub(super) fn start(cache: Arc<Cache>) -> Result<Reaper> {
        // SAFETY: plain eventfd creation; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return fail(
                ErrorCode::InternalError,
                format!("eventfd: {}", std::io::Error::last_os_error()),
            );
        }
        // SAFETY: a fresh descriptor, owned from here on.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let stopping = Arc::new(AtomicBool::new(false));
        let (thread_wake, thread_stopping) = (Arc::clone(&wake), Arc::clone(&stopping));
        let thread = std::thread::Builder::new()
            .name("mc-same-host-reaper".into())
            .spawn(move || {
                while !thread_stopping.load(Ordering::SeqCst) {
                    reap_once(&cache, thread_wake.as_raw_fd());
                }
            });
        match thread {
            Ok(thread) => Ok(Reaper {
                wake,
                stopping,
                thread: Some(thread),
            }),
            Err(e) => fail(
                ErrorCode::InternalError,
                format!("cannot start the same-host reaper: {e}"),
            ),
        }
    }

    /// Makes the thread look at the cache again now (after a new mapping was cached).
    pub(super) fn nudge(&self) {
        let one = 1u64;
        // SAFETY: an 8-byte write of a u64 to our eventfd (non-blocking; a full counter only
        // means a wake-up is pending anyway).
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.nudge();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Waits (at most one round) for an owner of a cached mapping to hang up and drops those
/// that did.
fn reap_once(cache: &Cache, wake: std::os::fd::RawFd) {
    let mapped = cache.mapped();
    let connections: Vec<_> = mapped.iter().map(|(_, peer)| peer.connection()).collect();
    let hung_up = wait_for_hangups(&connections, wake, ROUND);
    for ((endpoint, peer), gone) in mapped.iter().zip(hung_up) {
        if gone {
            cache.forget(endpoint, peer);
        }
    }
}
