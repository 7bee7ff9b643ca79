//! The location cache's renewal thread: hot keys (hit in the second half of their cached
//! lease, see [`LocationCache::take_renewals`]) are asked of the master again in batches
//! (`renew_locations`) before they expire, so a key read all the time never pays a miss
//! once it is cached. Runs on the link's master connection, like the revocation poll; a
//! renewal the master refuses (memory pressure) or that fails leaves the entry to expire.

use super::location_cache::LocationCache;
use crate::error::ErrorCode;
use crate::master::MasterApi;
use crate::types::ClientId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the thread looks for keys to renew. Entries are queued at half their cached
/// lease (1 s of the default 2 s), so this leaves most of the second half for the renewal.
const TICK: Duration = Duration::from_millis(50);
/// Keys renewed in one request at most.
const MAX_BATCH: usize = 1024;

/// Renews `client`'s hot keys from `master` into `cache` until `stop`: the body of the
/// client's `mc-cache-renew` thread. Sends batches back to back while keys are queued, else
/// looks again after [`TICK`]; returns within one call (the RPC timeout at most) plus one
/// tick after `stop` is set.
pub(super) fn run(
    client: ClientId,
    master: &dyn MasterApi,
    cache: &LocationCache,
    stop: &AtomicBool,
) {
    let mut warned = false;
    while !stop.load(Ordering::Acquire) {
        let keys = cache.take_renewals(MAX_BATCH);
        // Checked again: a torn-down client must not become a holder once more.
        if keys.is_empty() || stop.load(Ordering::Acquire) {
            std::thread::sleep(TICK);
            continue;
        }
        let seen = cache.snapshot();
        let sent = Instant::now();
        let answers = match master.renew_locations(client, keys.clone()) {
            Ok(answers) => answers,
            Err(error) => {
                // Entries then run out and their keys miss: nothing is served wrongly.
                if !warned {
                    tracing::warn!(
                        %error,
                        "location cache renewal failed; hot keys miss once per cached lease \
                         until it works"
                    );
                    warned = true;
                }
                cache.count_renewals(0, 0, keys.len() as u64);
                continue;
            }
        };
        let (mut renewed, mut refused) = (0, 0);
        for (key, answer) in keys.iter().zip(answers) {
            match answer {
                Ok(query) => renewed += u64::from(cache.insert(key, Arc::new(query), sent, seen)),
                Err(ErrorCode::TryAgain) => refused += 1,
                // Gone or not readable: its revocation is on its way.
                Err(_) => {}
            }
        }
        cache.count_renewals(renewed, refused, 0);
    }
}
