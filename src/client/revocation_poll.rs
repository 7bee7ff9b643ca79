//! The location cache's long poll (`cache_revocations`): one thread per client with a cache,
//! on the master connection of the client's link (not counted as the client's master calls,
//! like its pings). Each answer's revocations are applied before the next poll acknowledges
//! them; a poll that succeeds keeps the cache fresh ([`LocationCache::mark_fresh`]); a failed
//! poll, or an answer from another master life, drops the whole cache.

use super::location_cache::LocationCache;
use crate::master::MasterApi;
use crate::types::ClientId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Pause after a failed poll before the next one.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// The running poll; [`RevocationPoll::stop`] (or drop) ends it within one poll's wait.
pub(super) struct RevocationPoll {
    stop: Arc<AtomicBool>,
    /// Detached at stop: the thread ends after its current poll (up to 100 ms) on its own,
    /// so a teardown never waits for it.
    _thread: Option<JoinHandle<()>>,
}

impl RevocationPoll {
    /// Starts polling `master` for `client`'s revocations into `cache`. Errors: none (a
    /// thread that cannot be spawned leaves the cache without hits: it never becomes fresh).
    pub(super) fn start(
        client: ClientId,
        master: Arc<dyn MasterApi>,
        cache: Arc<LocationCache>,
    ) -> RevocationPoll {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("mc-cache-poll".into())
            .spawn(move || run(client, &*master, &cache, &stopped))
            .map_err(|e| tracing::warn!(error = %e, "location cache poll not started; no hits"))
            .ok();
        RevocationPoll {
            stop,
            _thread: thread,
        }
    }

    /// Stops the poll: its thread makes no further call once its current one returns.
    pub(super) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl Drop for RevocationPoll {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(client: ClientId, master: &dyn MasterApi, cache: &LocationCache, stop: &AtomicBool) {
    let (mut incarnation, mut acked) = (0u64, 0u64);
    while !stop.load(Ordering::Acquire) {
        let sent = Instant::now();
        match master.cache_revocations(client, incarnation, acked) {
            Ok(batch) => {
                if batch.incarnation != incarnation {
                    if incarnation != 0 {
                        tracing::info!("new master life; location cache dropped");
                    }
                    cache.clear();
                    incarnation = batch.incarnation;
                    acked = 0;
                }
                acked = cache.revoke(&batch.revocations, acked);
                cache.mark_fresh(sent);
            }
            Err(error) => {
                tracing::debug!(%error, "location cache poll failed; cache dropped");
                cache.clear();
                let until = Instant::now() + RETRY_AFTER;
                while !stop.load(Ordering::Acquire) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}
