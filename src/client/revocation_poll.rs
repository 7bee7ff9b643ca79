//! The location cache's long poll (`cache_revocations`): one thread per client with a cache,
//! on the master connection of the client's link (not counted as the client's master calls,
//! like its pings). Each answer's revocations are applied before the next poll acknowledges
//! them; a poll that succeeds keeps the cache fresh ([`LocationCache::mark_fresh`]); a failed
//! poll, or an answer from another master life, drops the whole cache. The same start also
//! runs the cache's renewal thread ([`super::location_renewal`]).

use super::location_cache::LocationCache;
use super::location_renewal;
use crate::master::MasterApi;
use crate::types::ClientId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Pause after a failed poll before the next one.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// The running poll and renewal threads; [`RevocationPoll::stop`] (or drop) ends them within
/// one call's wait.
pub(super) struct RevocationPoll {
    stop: Arc<AtomicBool>,
    /// Detached at stop: each thread ends after its current call (a poll waits up to
    /// 100 ms) on its own, so a teardown never waits for them.
    _threads: Vec<JoinHandle<()>>,
}

impl RevocationPoll {
    /// Starts polling `master` for `client`'s revocations into `cache`, and renewing its hot
    /// keys. Errors: none (a poll thread that cannot be spawned leaves the cache without
    /// hits: it never becomes fresh; without the renewal thread hot keys expire and miss).
    pub(super) fn start(
        client: ClientId,
        master: Arc<dyn MasterApi>,
        cache: Arc<LocationCache>,
    ) -> RevocationPoll {
        let stop = Arc::new(AtomicBool::new(false));
        let (poll_stop, poll_master, poll_cache) =
            (Arc::clone(&stop), Arc::clone(&master), Arc::clone(&cache));
        let poll = std::thread::Builder::new()
            .name("mc-cache-poll".into())
            .spawn(move || run(client, &*poll_master, &poll_cache, &poll_stop))
            .map_err(|e| tracing::warn!(error = %e, "location cache poll not started; no hits"));
        let renew_stop = Arc::clone(&stop);
        let renewal = std::thread::Builder::new()
            .name("mc-cache-renew".into())
            .spawn(move || location_renewal::run(client, &*master, &cache, &renew_stop))
            .map_err(|e| tracing::warn!(error = %e, "location cache renewal not started"));
        RevocationPoll {
            stop,
            _threads: [poll, renewal].into_iter().flatten().collect(),
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
