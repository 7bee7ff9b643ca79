//! The location cache (`docs/location-cache.md`) with real clients over TCP on 127.0.0.1 and
//! an in-process master: hits skip the master, a write by another client is never hidden by a
//! cached answer, and a cached answer whose read fails is asked again. Every wait is bounded.

mod common;

use common::{local_client, pattern, wait_until};
use mooncake_rs::client::Client;
use mooncake_rs::error::{ErrorCode, Result};
use mooncake_rs::master::{
    MasterApi, MasterConfig, MasterInterface, MasterRequest, MasterResponse, MasterService,
    RemoteMaster,
};
use mooncake_rs::rpc::{Call, Interface, RpcServer};
use mooncake_rs::types::ReplicateConfig;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The tests of this binary run one at a time: one of them sets `MC_LOCATION_CACHE` for the
/// setups it makes.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn serve(master: Arc<dyn MasterApi>) -> RpcServer {
    mooncake_rs::master::remote::serve("127.0.0.1:0".parse().unwrap(), master).unwrap()
}

fn caching_master(lease_ms: u64) -> Arc<MasterService> {
    MasterService::new(MasterConfig {
        location_cache_lease_ms: lease_ms,
        ..MasterConfig::default()
    })
}

/// Reads `key` with `client` into a buffer of `len`: the bytes, or the error.
fn read(client: &Client, key: &str, len: usize) -> Result<Vec<u8>> {
    let mut out = vec![0u8; len];
    let n = client.get_into(key, &mut out)?;
    out.truncate(n as usize);
    Ok(out)
}

/// Waits until `client`'s cache serves `key` (its poll is fresh and the key was read).
fn cached(client: &Client, key: &str, len: usize) -> bool {
    wait_until(Duration::from_secs(5), || {
        let before = client.metrics().location_cache.hits;
        read(client, key, len).is_ok() && client.metrics().location_cache.hits > before
    })
}

/// A master whose revocations reach their holders [`SLOW_REVOCATION`] late (a slow network
/// or a busy holder): a write that did not wait for the acknowledgement would be
/// acknowledged while the holder still serves the old value.
struct SlowRevocations {
    inner: Arc<MasterService>,
}

const SLOW_REVOCATION: Duration = Duration::from_millis(500);

impl Call<MasterInterface> for SlowRevocations {
    fn call(&self, request: MasterRequest) -> Result<MasterResponse> {
        let answer = MasterInterface::dispatch(request, &*self.inner);
        if let MasterResponse::cache_revocations(Ok(batch)) = &answer {
            if !batch.revocations.is_empty() {
                std::thread::sleep(SLOW_REVOCATION);
            }
        }
        Ok(answer)
    }
}

#[test]
fn hits_skip_the_master_and_writes_by_other_clients_are_seen_at_once() {
    let _serial = serial();
    let master = caching_master(5_000);
    let server = serve(Arc::new(RemoteMaster(SlowRevocations {
        inner: master.clone(),
    })));
    let addr = server.local_addr().to_string();
    let owner = local_client(&addr, 16 << 20, 1 << 20);
    let reader = local_client(&addr, 0, 1 << 20);
    let config = ReplicateConfig::default();
    let (v1, v2) = (pattern(8192, 1), pattern(8192, 2));
    owner.put("k", &v1, &config).unwrap();
    owner.put("j", &pattern(100, 3), &config).unwrap();
    assert!(
        cached(&reader, "k", 8192),
        "the reader's cache never served k"
    );

    // Hits of every read family cost no master call.
    let calls = reader.metrics().master_calls;
    for _ in 0..10 {
        assert_eq!(read(&reader, "k", 8192).unwrap(), v1);
    }
    let mut a = vec![0u8; 8192];
    let mut b = [0u8; 100];
    assert_eq!(
        reader.batch_get_into(&["k", "j"], &mut [&mut a[..], &mut b[..]]),
        vec![Ok(8192), Ok(100)]
    );
    assert_eq!(
        reader.batch_get_into(&["k", "j"], &mut [&mut a[..], &mut b[..]]),
        vec![Ok(8192), Ok(100)]
    );
    let handle = reader.get_buffer("k").unwrap();
    assert_eq!(handle.as_slice(), &v1[..]);
    assert_eq!(reader.get_size("j"), Ok(100));
    assert_eq!(
        reader.metrics().master_calls - calls,
        1,
        "only j's first read asked the master"
    );

    // An upsert by the owner is acknowledged only after the reader dropped its entry (its
    // revocation arrives late): the reader's next get sees the new value.
    assert!(cached(&reader, "k", 8192));
    let started = Instant::now();
    owner.upsert("k", &v2, &config).unwrap();
    let upsert_took = started.elapsed();
    assert!(
        read(&reader, "k", 8192).unwrap() == v2,
        "the reader served the old value after the upsert was acknowledged"
    );
    assert!(
        upsert_took >= SLOW_REVOCATION && upsert_took < Duration::from_secs(3),
        "the upsert waited {upsert_took:?} for a revocation {SLOW_REVOCATION:?} late"
    );
    assert!(reader.metrics().location_cache.revocations >= 1);

    // A forced removal likewise.
    assert!(cached(&reader, "k", 8192));
    owner.remove("k", true).unwrap();
    assert_eq!(read(&reader, "k", 8192), Err(ErrorCode::ObjectNotFound));
    reader.teardown();
    owner.teardown();
}

/// A master that never delivers a revocation (a bug, or revocations lost): what keeps a
/// cached answer from returning wrong bytes is then the data path alone.
struct DeafMaster {
    inner: Arc<MasterService>,
}

impl Call<MasterInterface> for DeafMaster {
    fn call(&self, request: MasterRequest) -> Result<MasterResponse> {
        let mut answer = MasterInterface::dispatch(request, &*self.inner);
        if let MasterResponse::cache_revocations(Ok(batch)) = &mut answer {
            batch.revocations.clear();
        }
        Ok(answer)
    }
}

#[test]
fn a_cached_answer_whose_read_fails_is_asked_again_of_the_master() {
    let _serial = serial();
    let master = caching_master(60_000);
    let deaf: Arc<dyn MasterApi> = Arc::new(RemoteMaster(DeafMaster {
        inner: master.clone(),
    }));
    let server = serve(deaf);
    let addr = server.local_addr().to_string();
    let config = ReplicateConfig::default();
    let first_owner = local_client(&addr, 16 << 20, 1 << 20);
    let reader = local_client(&addr, 0, 1 << 20);
    first_owner.put("k", &pattern(4096, 1), &config).unwrap();
    assert!(cached(&reader, "k", 4096));
    // The owner goes (its segment and the object with it); the revocation never arrives.
    first_owner.teardown();
    // The cached descriptor names a segment that is gone: its read fails and the key is
    // asked again, never answered with the old bytes.
    assert_eq!(read(&reader, "k", 4096), Err(ErrorCode::ObjectNotFound));
    let stats = reader.metrics().location_cache;
    assert_eq!(stats.stale_retries, 1, "{stats:?}");
    // A new value of the key is acknowledged only once the deaf reader's cached lease ran
    // out (it never acknowledges), and is then what it reads.
    let second_owner = local_client(&addr, 16 << 20, 1 << 20);
    second_owner.put("k", &pattern(4096, 2), &config).unwrap();
    assert_eq!(read(&reader, "k", 4096).unwrap(), pattern(4096, 2));
    reader.teardown();
    second_owner.teardown();
}

#[test]
fn a_client_with_the_cache_off_asks_the_master_every_time() {
    let _serial = serial();
    let master = caching_master(5_000);
    let server = serve(master.clone());
    let addr = server.local_addr().to_string();
    let owner = local_client(&addr, 16 << 20, 1 << 20);
    owner
        .put("k", &pattern(64, 1), &ReplicateConfig::default())
        .unwrap();
    // Off for the setup below only (no other test of this binary runs meanwhile).
    std::env::set_var("MC_LOCATION_CACHE", "0");
    let reader = local_client(&addr, 0, 1 << 20);
    std::env::remove_var("MC_LOCATION_CACHE");
    let calls = reader.metrics().master_calls;
    for _ in 0..5 {
        assert_eq!(read(&reader, "k", 64).unwrap(), pattern(64, 1));
    }
    assert_eq!(reader.metrics().master_calls - calls, 5);
    let stats = reader.metrics().location_cache;
    assert!(!stats.enabled);
    assert_eq!(stats.hits, 0);
    reader.teardown();
    owner.teardown();
}

/// Reads `key` (`value`) with `reader` every 5 ms for `leases` cached leases of `lease_ms`:
/// the change of the reader's location-cache counters and its master calls meanwhile.
fn read_hot_key(
    reader: &Client,
    key: &str,
    value: &[u8],
    lease_ms: u64,
    leases: u64,
) -> (mooncake_rs::client::LocationCacheStats, u64) {
    let before = reader.metrics();
    let until = Instant::now() + Duration::from_millis(lease_ms * leases);
    for _ in 0..100_000 {
        if Instant::now() >= until {
            break;
        }
        assert!(read(reader, key, value.len()).unwrap() == value);
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = reader.metrics();
    let (b, a) = (before.location_cache, after.location_cache);
    let delta = mooncake_rs::client::LocationCacheStats {
        hits: a.hits - b.hits,
        misses: a.misses - b.misses,
        renewals: a.renewals - b.renewals,
        renewals_refused: a.renewals_refused - b.renewals_refused,
        renewals_failed: a.renewals_failed - b.renewals_failed,
        ..a
    };
    (delta, after.master_calls - before.master_calls)
}

#[test]
fn a_hot_key_is_renewed_ahead_of_expiry_and_never_misses_again() {
    let _serial = serial();
    let lease_ms = 400;
    let master = caching_master(lease_ms);
    let server = serve(master.clone());
    let addr = server.local_addr().to_string();
    let owner = local_client(&addr, 16 << 20, 1 << 20);
    let reader = local_client(&addr, 0, 1 << 20);
    let value = pattern(4096, 3);
    owner
        .put("hot", &value, &ReplicateConfig::default())
        .unwrap();
    assert!(cached(&reader, "hot", value.len()));
    let (stats, master_calls) = read_hot_key(&reader, "hot", &value, lease_ms, 6);
    assert!(stats.hits > 200, "{stats:?}");
    // Each cached lease is renewed in its second half; a renewal that loses a race with
    // the entry's end costs one miss at most now and then.
    assert!(stats.renewals >= 4, "{stats:?}");
    assert!(stats.misses <= 2, "{stats:?}");
    assert_eq!(master_calls, stats.misses);
    assert_eq!((stats.renewals_refused, stats.renewals_failed), (0, 0));
    let renewals = master.metrics().location_cache.renewals;
    assert!(renewals >= stats.renewals, "{renewals}");
    reader.teardown();
    owner.teardown();
}

#[test]
fn renewals_are_refused_under_memory_pressure_and_the_key_is_asked_again() {
    let _serial = serial();
    let lease_ms = 400;
    // Every byte in use is above the high watermark; soft-pinned objects are never evicted.
    let master = MasterService::new(MasterConfig {
        location_cache_lease_ms: lease_ms,
        eviction_high_watermark_ratio: 0.0,
        allow_evict_soft_pinned_objects: false,
        ..MasterConfig::default()
    });
    let server = serve(master.clone());
    let addr = server.local_addr().to_string();
    let owner = local_client(&addr, 16 << 20, 1 << 20);
    let reader = local_client(&addr, 0, 1 << 20);
    let value = pattern(4096, 4);
    let pinned = ReplicateConfig {
        soft_pin_action: mooncake_rs::types::SoftPinAction::Enable,
        ..ReplicateConfig::default()
    };
    owner.put("hot", &value, &pinned).unwrap();
    assert!(cached(&reader, "hot", value.len()));
    let (stats, _) = read_hot_key(&reader, "hot", &value, lease_ms, 6);
    assert!(stats.renewals_refused >= 3, "{stats:?}");
    assert_eq!(stats.renewals, 0, "{stats:?}");
    // Each cached lease ends: one miss per lease, answered and cached as usual.
    assert!(stats.misses >= 3, "{stats:?}");
    assert!(stats.hits > 100, "{stats:?}");
    let at_master = master.metrics().location_cache;
    assert!(at_master.renewals_refused >= stats.renewals_refused);
    reader.teardown();
    owner.teardown();
}
