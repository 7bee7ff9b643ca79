//! Behaviour tests of [`MasterService`] through [`MasterApi`]. Timeouts are configured at
//! millisecond scale; every wait is bounded.

use super::{MasterApi, MasterConfig, MasterService};
use crate::error::{ErrorCode, Result};
use crate::types::{
    ClientId, ClientStatus, ReplicaDescriptor, ReplicaStatus, ReplicateConfig, Segment,
    SoftPinAction, Uuid, WriteGrant, WriteToken, STORE_VERSION,
};
use std::sync::Arc;
use std::time::Duration;

pub(super) const BASE: u64 = 0x1000_0000;

pub(super) fn segment(name: &str, size: u64) -> Segment {
    Segment {
        id: Uuid::random(),
        name: name.to_string(),
        base: BASE,
        size,
        protocol: "tcp".to_string(),
        epoch: crate::types::fresh_epoch(),
    }
}

pub(super) fn fast_config() -> MasterConfig {
    MasterConfig {
        default_kv_lease_ttl_ms: 40,
        put_start_discard_timeout_ms: Some(40),
        put_start_release_timeout_ms: Some(150),
        write_quarantine_ms: 50,
        ..MasterConfig::default()
    }
}

/// A master with one client owning one segment `"h1"` of `size` bytes.
pub(super) fn setup(config: MasterConfig, size: u64) -> (Arc<MasterService>, ClientId, Segment) {
    let master = MasterService::new(config);
    let client = Uuid::random();
    let seg = segment("h1", size);
    master.mount_segment(client, seg.clone()).unwrap();
    (master, client, seg)
}

pub(super) fn one<T>(answer: Result<Vec<Result<T>>>) -> Result<T> {
    let mut all = answer?;
    assert_eq!(all.len(), 1);
    all.remove(0)
}

pub(super) fn start(
    m: &MasterService,
    c: ClientId,
    key: &str,
    size: u64,
) -> Result<Vec<ReplicaDescriptor>> {
    grant(m, c, key, size).map(|g| g.replicas)
}

/// The whole grant of a put start with the default config.
pub(super) fn grant(m: &MasterService, c: ClientId, key: &str, size: u64) -> Result<WriteGrant> {
    one(m.batch_put_start(c, vec![key.into()], vec![size], ReplicateConfig::default()))
}

/// The token of `key`'s latest write start (a never-issued one when the key is absent), for
/// tests that finish "the current write" as a well-behaved writer does.
pub(super) fn current_token(m: &MasterService, key: &str) -> WriteToken {
    m.objects
        .shard(key)
        .get(key)
        .map_or(WriteToken(0), |meta| meta.write)
}

pub(super) fn start_with(
    m: &MasterService,
    c: ClientId,
    key: &str,
    size: u64,
    config: ReplicateConfig,
) -> Result<Vec<ReplicaDescriptor>> {
    one(m.batch_put_start(c, vec![key.into()], vec![size], config)).map(|g| g.replicas)
}

pub(super) fn upsert(m: &MasterService, c: ClientId, key: &str, size: u64) -> Result<WriteGrant> {
    one(m.batch_upsert_start(c, vec![key.into()], vec![size], ReplicateConfig::default()))
}

/// `PutEnd` of `key`'s current write.
pub(super) fn end(m: &MasterService, c: ClientId, key: &str) -> Result<()> {
    end_write(m, c, key, current_token(m, key))
}

/// `PutEnd` of write `token` of `key`.
pub(super) fn end_write(
    m: &MasterService,
    c: ClientId,
    key: &str,
    token: WriteToken,
) -> Result<()> {
    one(m.batch_put_end(c, vec![key.into()], vec![token]))
}

/// `PutRevoke` of write `token` of `key`.
pub(super) fn revoke_write(
    m: &MasterService,
    c: ClientId,
    key: &str,
    token: WriteToken,
) -> Result<()> {
    one(m.batch_put_revoke(c, vec![key.into()], vec![token]))
}

pub(super) fn put(m: &MasterService, c: ClientId, key: &str, size: u64) {
    start(m, c, key, size).unwrap();
    end(m, c, key).unwrap();
}

pub(super) fn get(m: &MasterService, key: &str) -> Result<crate::types::QueryResult> {
    one(m.batch_get_replica_list(vec![key.into()]))
}

pub(super) fn remove(m: &MasterService, key: &str, force: bool) -> Result<()> {
    one(m.batch_remove(vec![key.into()], force))
}

pub(super) fn used(m: &MasterService) -> u64 {
    m.metrics().bytes_used
}

pub(super) use crate::test_util::wait_until;

pub(super) const WAIT: Duration = Duration::from_secs(2);

#[test]
fn put_end_get_round_trip() {
    let (m, c, seg) = setup(MasterConfig::default(), 1 << 20);
    assert_eq!(m.service_ready(), Ok(STORE_VERSION.to_string()));
    let replicas = start(&m, c, "k", 1000).unwrap();
    assert_eq!(replicas.len(), 1);
    let r = &replicas[0];
    assert_eq!(r.status, ReplicaStatus::Processing);
    assert_eq!(r.buffer.size, 1000);
    assert_eq!(r.buffer.buffer_address, BASE);
    assert_eq!(r.buffer.protocol, "tcp");
    assert_eq!(r.buffer.transport_endpoint, seg.name);
    assert_eq!(get(&m, "k"), Err(ErrorCode::ReplicaIsNotReady));
    assert_eq!(
        m.batch_exist_key(vec!["k".into(), "nope".into()]),
        Ok(vec![Ok(false), Ok(false)])
    );
    end(&m, c, "k").unwrap();
    assert_eq!(end(&m, c, "k"), Ok(()), "idempotent");
    // No lease after a put: a plain remove works at once; re-put, then read.
    remove(&m, "k", false).unwrap();
    put(&m, c, "k", 1000);
    let q = get(&m, "k").unwrap();
    assert_eq!((q.size, q.lease_ttl_ms), (1000, 10_000));
    assert_eq!(q.replicas[0].status, ReplicaStatus::Complete);
    assert_eq!(get(&m, "missing"), Err(ErrorCode::ObjectNotFound));
    assert_eq!(get(&m, ""), Err(ErrorCode::InvalidParams));
    assert_eq!(m.batch_exist_key(vec!["k".into()]), Ok(vec![Ok(true)]));
    assert_eq!(used(&m), 1024);
}

#[test]
fn invalid_writes_are_rejected() {
    let (m, c, _) = setup(MasterConfig::default(), 1 << 20);
    let base = ReplicateConfig::default();
    let cases = [
        ("", 10, base.clone()),
        ("k", 0, base.clone()),
        (
            "k",
            10,
            ReplicateConfig {
                replica_num: 0,
                ..base.clone()
            },
        ),
        (
            "k",
            10,
            ReplicateConfig {
                prefer_alloc_in_same_node: true,
                ..base.clone()
            },
        ),
        (
            "k",
            10,
            ReplicateConfig {
                soft_pin_ttl_ms: Some(5),
                ..base.clone()
            },
        ),
        (
            "k",
            10,
            ReplicateConfig {
                soft_pin_action: SoftPinAction::Enable,
                soft_pin_ttl_ms: Some(86_400_001),
                ..base.clone()
            },
        ),
    ];
    for (key, size, config) in cases {
        assert_eq!(
            start_with(&m, c, key, size, config),
            Err(ErrorCode::InvalidParams)
        );
    }
    assert_eq!(
        m.batch_put_start(c, vec!["a".into()], vec![], base.clone()),
        Err(ErrorCode::InvalidParams)
    );
    let dup = m
        .batch_put_start(c, vec!["x".into(), "x".into()], vec![8, 8], base)
        .unwrap();
    assert!(dup[0].is_ok());
    assert_eq!(dup[1], Err(ErrorCode::ObjectAlreadyExists));
    assert_eq!(end(&m, Uuid::random(), "x"), Err(ErrorCode::IllegalClient));
    assert_eq!(end(&m, c, "y"), Err(ErrorCode::ObjectNotFound));
}

#[test]
fn duplicate_put_keeps_the_old_value() {
    let (m, c, _) = setup(MasterConfig::default(), 1 << 20);
    put(&m, c, "k", 100);
    assert_eq!(start(&m, c, "k", 200), Err(ErrorCode::ObjectAlreadyExists));
    assert_eq!(get(&m, "k").unwrap().size, 100);
    start(&m, c, "w", 100).unwrap();
    assert_eq!(start(&m, c, "w", 100), Err(ErrorCode::ObjectAlreadyExists));
}

#[test]
fn stale_put_is_taken_over_and_its_space_released_later() {
    let (m, c1, _) = setup(fast_config(), 1 << 20);
    let c2 = Uuid::random();
    let first = start(&m, c1, "k", 1000).unwrap();
    assert_eq!(
        start(&m, c2, "k", 1000),
        Err(ErrorCode::ObjectAlreadyExists)
    );
    std::thread::sleep(Duration::from_millis(50));
    let second = start(&m, c2, "k", 1000).unwrap();
    assert_ne!(
        first[0].buffer.buffer_address,
        second[0].buffer.buffer_address
    );
    assert_eq!(used(&m), 2048, "the discarded write's bytes are held");
    assert_eq!(end(&m, c1, "k"), Err(ErrorCode::IllegalClient));
    end(&m, c2, "k").unwrap();
    assert!(
        wait_until(WAIT, || used(&m) == 1024),
        "released after the timeout"
    );
    assert_eq!(get(&m, "k").unwrap().size, 1000);
}

#[test]
fn abandoned_put_is_reclaimed() {
    let (m, c, _) = setup(fast_config(), 1 << 20);
    start(&m, c, "k", 1000).unwrap();
    assert!(wait_until(WAIT, || get(&m, "k") == Err(ErrorCode::ObjectNotFound)));
    assert!(
        wait_until(WAIT, || used(&m) == 0),
        "freed after the quarantine"
    );
}

#[test]
fn revoke_frees_and_checks_the_writer() {
    let (m, c, _) = setup(fast_config(), 1 << 20);
    start(&m, c, "k", 100).unwrap();
    let revoke = |client, key: &str| revoke_write(&m, client, key, current_token(&m, key));
    assert_eq!(revoke(Uuid::random(), "k"), Err(ErrorCode::IllegalClient));
    assert_eq!(revoke(c, "k"), Ok(()));
    assert!(
        wait_until(WAIT, || used(&m) == 0),
        "freed after the quarantine"
    );
    assert_eq!(revoke(c, "k"), Err(ErrorCode::ObjectNotFound));
    put(&m, c, "k", 100);
    assert_eq!(revoke(c, "k"), Err(ErrorCode::InvalidWrite));
}

#[test]
fn lease_blocks_remove_force_wins_bytes_freed_at_expiry() {
    let config = MasterConfig {
        default_kv_lease_ttl_ms: 100,
        ..fast_config()
    };
    let (m, c, _) = setup(config, 1 << 20);
    put(&m, c, "k", 4096);
    get(&m, "k").unwrap();
    assert_eq!(remove(&m, "k", false), Err(ErrorCode::ObjectHasLease));
    assert_eq!(m.remove_by_regex("k".into(), false), Ok(0));
    assert_eq!(remove(&m, "k", true), Ok(()));
    assert_eq!(get(&m, "k"), Err(ErrorCode::ObjectNotFound));
    assert_eq!(used(&m), 4096, "bytes kept while the lease runs");
    assert_eq!(m.metrics().deferred_frees_pending, 1);
    assert!(wait_until(WAIT, || used(&m) == 0));
    assert_eq!(m.metrics().deferred_frees_pending, 0);
    // Being written: not removable even with force; duplicates: first wins.
    start(&m, c, "w", 10).unwrap();
    assert_eq!(remove(&m, "w", true), Err(ErrorCode::ReplicaIsNotReady));
    put(&m, c, "d", 10);
    let both = m.batch_remove(vec!["d".into(), "d".into()], false).unwrap();
    assert_eq!(both, vec![Ok(()), Err(ErrorCode::ObjectNotFound)]);
}

#[test]
fn regex_and_remove_all_count_what_they_remove() {
    let (m, c, _) = setup(MasterConfig::default(), 1 << 20);
    for key in ["a1", "a2", "b1"] {
        put(&m, c, key, 64);
    }
    start(&m, c, "b2", 64).unwrap();
    get(&m, "a2").unwrap();
    assert_eq!(m.remove_by_regex("^a".into(), false), Ok(1));
    assert_eq!(
        m.remove_by_regex("[".into(), false),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(
        m.remove_all(false),
        Ok(1),
        "b1; a2 leased, b2 being written"
    );
    assert_eq!(m.remove_all(true), Ok(1), "a2");
    assert_eq!(get(&m, "b2"), Err(ErrorCode::ReplicaIsNotReady));
}

#[test]
fn eviction_takes_least_recently_used_and_spares_protected_objects() {
    // 100 slots of 64 bytes; the high watermark is 90 %.
    let (m, c, _) = setup(MasterConfig::default(), 64 * 100);
    let hard = ReplicateConfig {
        with_hard_pin: true,
        ..ReplicateConfig::default()
    };
    let soft = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        ..ReplicateConfig::default()
    };
    start_with(&m, c, "hard", 64, hard).unwrap();
    end(&m, c, "hard").unwrap();
    start_with(&m, c, "soft", 64, soft).unwrap();
    end(&m, c, "soft").unwrap();
    put(&m, c, "leased", 64);
    put(&m, c, "pinned", 64);
    let pin = one(m.batch_pin(c, vec!["pinned".into()])).unwrap();
    get(&m, "leased").unwrap();
    let keys: Vec<String> = (0..94).map(|i| format!("o{i:02}")).collect();
    for key in &keys {
        put(&m, c, key, 64);
    }
    assert!(wait_until(WAIT, || {
        let metrics = m.metrics();
        metrics.evicted_objects > 0 && metrics.bytes_used * 10 <= metrics.bytes_total * 9
    }));
    for key in ["hard", "soft", "leased", "pinned"] {
        assert!(get(&m, key).is_ok(), "{key} survives");
    }
    let alive: Vec<bool> = keys.iter().map(|k| get(&m, k).is_ok()).collect();
    let evicted = alive.iter().filter(|a| !**a).count();
    assert!(evicted > 0);
    assert!(
        alive[..evicted].iter().all(|a| !a),
        "oldest first: {alive:?}"
    );
    assert!(alive[evicted..].iter().all(|a| *a));
    let metrics = m.metrics();
    assert_eq!(metrics.evicted_objects as usize, evicted);
    assert_eq!(metrics.evicted_bytes as usize, evicted * 64);
    m.unpin(c, vec![pin.pin_id]).unwrap();
}

#[test]
fn failed_allocation_triggers_eviction() {
    let config = MasterConfig {
        eviction_high_watermark_ratio: 1.0,
        ..MasterConfig::default()
    };
    let (m, c, _) = setup(config, 64 * 20);
    for i in 0..20 {
        put(&m, c, &format!("k{i}"), 64);
    }
    assert_eq!(start(&m, c, "more", 64), Err(ErrorCode::NoAvailableHandle));
    assert!(wait_until(WAIT, || start(&m, c, "more", 64).is_ok()));
    assert_eq!(
        get(&m, "k0"),
        Err(ErrorCode::ObjectNotFound),
        "oldest went first"
    );
}

#[test]
fn pinned_bytes_survive_forced_remove_until_unpin() {
    let (m, c, _) = setup(fast_config(), 2048);
    let reader = Uuid::random();
    put(&m, c, "a", 1024);
    let pinned = one(m.batch_pin(reader, vec!["a".into()])).unwrap();
    assert_eq!(pinned.query.size, 1024);
    assert_eq!(
        one(m.batch_pin(reader, vec!["zz".into()])).err(),
        Some(ErrorCode::ObjectNotFound)
    );
    assert_eq!(upsert(&m, c, "a", 1024), Err(ErrorCode::ObjectReplicaBusy));
    assert_eq!(remove(&m, "a", true), Ok(()));
    assert_eq!(get(&m, "a"), Err(ErrorCode::ObjectNotFound));
    std::thread::sleep(Duration::from_millis(60)); // lease over; deferred frees processed
    assert_eq!(used(&m), 1024, "pinned bytes stay allocated");
    put(&m, c, "b", 1024);
    assert_eq!(start(&m, c, "c", 1024), Err(ErrorCode::NoAvailableHandle));
    m.unpin(c, vec![pinned.pin_id]).unwrap(); // not the pin's owner: ignored
    m.unpin(reader, vec![9_999_999]).unwrap();
    assert_eq!(used(&m), 2048);
    assert_eq!(m.metrics().active_pins, 1);
    m.unpin(reader, vec![pinned.pin_id]).unwrap();
    assert_eq!(used(&m), 1024);
    assert!(wait_until(WAIT, || start(&m, c, "c", 1024).is_ok()));
    let metrics = m.metrics();
    assert_eq!((metrics.active_pins, metrics.pins_released), (0, 1));
}

#[test]
fn expired_client_loses_its_segment_objects_pins_and_writes() {
    let config = MasterConfig {
        client_ttl_ms: Some(150),
        ..fast_config()
    };
    let (m, c1, _) = setup(config, 1 << 20);
    let c2 = Uuid::random();
    m.mount_segment(c2, segment("h2", 1 << 20)).unwrap();
    let on = |name: &str| ReplicateConfig {
        preferred_segments: vec![name.to_string()],
        ..ReplicateConfig::default()
    };
    for (client, key, name) in [
        (c1, "c1_on_h1", "h1"),
        (c1, "c1_on_h2", "h2"),
        (c2, "c2_on_h2", "h2"),
    ] {
        let replicas = start_with(&m, client, key, 100, on(name)).unwrap();
        assert_eq!(replicas[0].buffer.transport_endpoint, name);
        end(&m, client, key).unwrap();
    }
    one(m.batch_pin(c1, vec!["c2_on_h2".into()])).unwrap();
    start_with(&m, c1, "inflight", 100, on("h2")).unwrap();
    assert!(wait_until(WAIT, || {
        m.ping(c2).unwrap();
        m.metrics().clients_expired == 1
    }));
    assert_eq!(m.ping(c1).unwrap().status, ClientStatus::NeedRemount);
    assert_eq!(m.ping(c2).unwrap().status, ClientStatus::Ok);
    assert_eq!(get(&m, "c1_on_h1"), Err(ErrorCode::ObjectNotFound));
    assert!(get(&m, "c1_on_h2").is_ok());
    assert!(get(&m, "c2_on_h2").is_ok());
    assert_eq!(get(&m, "inflight"), Err(ErrorCode::ObjectNotFound));
    let metrics = m.metrics();
    assert_eq!((metrics.active_pins, metrics.clients_alive), (0, 1));
    assert_eq!(metrics.segments.len(), 1);
    // Coming back: remount an empty segment.
    m.remount_segments(c1, vec![segment("h1", 1 << 20)])
        .unwrap();
    assert_eq!(m.ping(c1).unwrap().status, ClientStatus::Ok);
    assert_eq!(m.metrics().segments.len(), 2);
}

#[test]
fn unmount_erases_objects_left_without_replicas() {
    let (m, c, seg_a) = setup(MasterConfig::default(), 1 << 20);
    let seg_b = segment("h2", 1 << 20);
    m.mount_segment(c, seg_b.clone()).unwrap();
    m.mount_segment(c, seg_b.clone()).unwrap();
    assert_eq!(
        m.mount_segment(Uuid::random(), seg_b),
        Err(ErrorCode::SegmentAlreadyExists)
    );
    let two = ReplicateConfig {
        replica_num: 3,
        ..ReplicateConfig::default()
    };
    let replicas = start_with(&m, c, "two", 100, two).unwrap();
    assert_eq!(replicas.len(), 2, "one per segment name");
    end(&m, c, "two").unwrap();
    let only_a = ReplicateConfig {
        preferred_segment: "h1".into(),
        ..ReplicateConfig::default()
    };
    start_with(&m, c, "one", 100, only_a.clone()).unwrap();
    end(&m, c, "one").unwrap();
    start_with(&m, c, "writing", 100, only_a).unwrap();
    assert_eq!(
        m.unmount_segment(Uuid::random(), seg_a.id),
        Err(ErrorCode::IllegalClient)
    );
    m.unmount_segment(c, seg_a.id).unwrap();
    m.unmount_segment(c, seg_a.id).unwrap();
    m.unmount_segment(c, Uuid::random()).unwrap();
    assert_eq!(get(&m, "one"), Err(ErrorCode::ObjectNotFound));
    assert_eq!(get(&m, "two").unwrap().replicas.len(), 1);
    assert_eq!(end(&m, c, "writing"), Err(ErrorCode::ObjectNotFound));
}

#[test]
fn placement_uses_preferred_and_distinct_names() {
    let m = MasterService::new(MasterConfig::default());
    let c = Uuid::random();
    assert_eq!(start(&m, c, "k", 10), Err(ErrorCode::NoAvailableHandle));
    for name in ["a", "a", "b", "c"] {
        m.mount_segment(c, segment(name, 1 << 16)).unwrap();
    }
    let config = ReplicateConfig {
        replica_num: 10,
        preferred_segments: vec!["c".into(), "b".into()],
        ..ReplicateConfig::default()
    };
    let replicas = start_with(&m, c, "k", 10, config).unwrap();
    let names: Vec<&str> = replicas
        .iter()
        .map(|r| r.buffer.transport_endpoint.as_str())
        .collect();
    assert_eq!(names, ["c", "b", "a"]);
    let ids: std::collections::HashSet<u64> = replicas.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), 3);
    // Larger than any segment: nothing placed.
    assert_eq!(
        start(&m, c, "big", 1 << 17),
        Err(ErrorCode::NoAvailableHandle)
    );
}

#[test]
fn upsert_in_place_reallocate_preempt_and_revoke() {
    let (m, c, _) = setup(fast_config(), 1 << 20);
    assert!(upsert(&m, c, "new", 128).is_ok(), "absent key: like put");
    end(&m, c, "new").unwrap();
    let hard = ReplicateConfig {
        with_hard_pin: true,
        ..ReplicateConfig::default()
    };
    let first = start_with(&m, c, "k", 128, hard).unwrap();
    end(&m, c, "k").unwrap();
    // In place: same size, no lease.
    let again = upsert(&m, c, "k", 128).unwrap().replicas;
    assert_eq!(
        again[0].buffer.buffer_address,
        first[0].buffer.buffer_address
    );
    assert_eq!(again[0].status, ReplicaStatus::Processing);
    assert_eq!(get(&m, "k"), Err(ErrorCode::ReplicaIsNotReady));
    end(&m, c, "k").unwrap();
    assert!(m.objects.shard("k").get("k").is_some_and(|o| o.hard_pinned));
    // Leased: reallocated; old bytes freed when the lease ends.
    get(&m, "k").unwrap();
    let moved = upsert(&m, c, "k", 128).unwrap().replicas;
    assert_ne!(
        moved[0].buffer.buffer_address,
        first[0].buffer.buffer_address
    );
    assert_eq!(used(&m), 128 * 3);
    end(&m, c, "k").unwrap();
    assert!(wait_until(WAIT, || used(&m) == 128 * 2));
    // Size change: reallocated.
    let bigger = upsert(&m, c, "k", 256).unwrap().replicas;
    assert_eq!(bigger[0].buffer.size, 256);
    end(&m, c, "k").unwrap();
    assert_eq!(get(&m, "k").unwrap().size, 256);
    // Preempting an in-flight put.
    start(&m, c, "p", 64).unwrap();
    let other = Uuid::random();
    upsert(&m, other, "p", 64).unwrap();
    assert_eq!(end(&m, c, "p"), Err(ErrorCode::IllegalClient));
    end(&m, other, "p").unwrap();
    // Revoking an in-place upsert leaves the key removed.
    upsert(&m, c, "new", 128).unwrap();
    revoke_write(&m, c, "new", current_token(&m, "new")).unwrap();
    assert_eq!(get(&m, "new"), Err(ErrorCode::ObjectNotFound));
}

#[test]
fn ping_metrics_and_shutdown() {
    let (m, c, _) = setup(MasterConfig::default(), 1 << 20);
    let first = m.ping(c).unwrap();
    assert_eq!(first.status, ClientStatus::Ok);
    let stranger = m.ping(Uuid::random()).unwrap();
    assert_eq!(stranger.status, ClientStatus::NeedRemount);
    assert_eq!(stranger.view_version, first.view_version);
    put(&m, c, "k", 10);
    get(&m, "k").unwrap();
    let metrics = m.metrics();
    assert_eq!(
        (metrics.objects, metrics.leases_granted, metrics.bytes_used),
        (1, 1, 64)
    );
    let text = m.prometheus_text();
    assert!(text.contains("mooncake_master_objects{cluster=\"mooncake_cluster\"} 1"));
    assert!(text.contains(
        "mooncake_master_segment_used_bytes{cluster=\"mooncake_cluster\",segment=\"h1\""
    ));
    assert!(serde_json::to_string(&metrics).is_ok());
    m.shutdown();
    m.shutdown();
    assert!(get(&m, "k").is_ok(), "still answers after shutdown");
}

#[test]
fn concurrent_put_get_remove_smoke() {
    let (m, c, _) = setup(
        MasterConfig {
            default_kv_lease_ttl_ms: 5,
            ..fast_config()
        },
        1 << 20,
    );
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for _ in 0..500 {
                    let key = format!("k{}", fastrand::u8(..32));
                    match fastrand::u8(..4) {
                        0 => {
                            if start(&m, c, &key, 1 + fastrand::u64(..4096)).is_ok() {
                                let _ = end(&m, c, &key);
                            }
                        }
                        1 => {
                            let _ = get(&m, &key);
                        }
                        2 => {
                            let _ = remove(&m, &key, fastrand::bool());
                        }
                        _ => {
                            let _ = upsert(&m, c, &key, 64)
                                .and_then(|g| end_write(&m, c, &key, g.token));
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    m.remove_all(true).unwrap();
    assert!(wait_until(WAIT, || used(&m) == 0));
}

#[test]
fn absurd_values_never_panic() {
    let config = MasterConfig {
        default_kv_lease_ttl_ms: u64::MAX,
        put_start_discard_timeout_ms: Some(0),
        put_start_release_timeout_ms: Some(u64::MAX),
        eviction_ratio: f64::NAN,
        ..MasterConfig::default()
    };
    let (m, c, _) = setup(config, 1 << 20);
    let overflowing = segment("huge", u64::MAX);
    assert_eq!(
        m.mount_segment(c, overflowing),
        Err(ErrorCode::InvalidParams)
    );
    let near_max = Segment {
        base: 1,
        ..segment("big", u64::MAX - 1)
    };
    m.mount_segment(c, near_max).unwrap();
    assert_eq!(
        start(&m, c, "k", u64::MAX),
        Err(ErrorCode::NoAvailableHandle)
    );
    start(&m, c, "k", 1 << 40).unwrap();
    start(&m, c, "k", 1 << 40).unwrap(); // takeover with an unbounded release timeout
    end(&m, c, "k").unwrap();
    assert_eq!(get(&m, "k").unwrap().lease_ttl_ms, u64::MAX);
    remove(&m, "k", true).unwrap();
    let sizes = vec![u64::MAX; 3];
    let keys = vec!["a".to_string(), String::new(), "c".to_string()];
    let answers = m
        .batch_upsert_start(c, keys, sizes, ReplicateConfig::default())
        .unwrap();
    assert_eq!(answers.len(), 3);
    assert_eq!(answers[1], Err(ErrorCode::InvalidParams));
    let metrics = m.metrics();
    assert!(metrics.bytes_total >= metrics.bytes_used);
}

#[test]
fn an_unbounded_release_timeout_in_seconds_never_panics_maintenance() {
    // `--put_start_release_timeout_sec` takes any u64; u64::MAX seconds does not fit in an
    // `Instant`, so every deadline the reclaim scan computes from it must be capped.
    let config = MasterConfig {
        put_start_release_timeout_s: u64::MAX,
        put_start_release_timeout_ms: None,
        ..MasterConfig::default()
    };
    let (m, c, _) = setup(config, 1 << 20);
    start(&m, c, "unfinished", 4096).unwrap();
    m.eviction_tick();
    m.eviction_tick();
    // The write is not due (its timeout is practically endless) and is still in progress.
    assert_eq!(end(&m, c, "unfinished"), Ok(()));
    assert!(get(&m, "unfinished").is_ok());
}
#[test]
fn a_full_table_with_nothing_evictable_is_not_rescanned_every_tick() {
    let (m, c, _) = setup(fast_config(), 1 << 20);
    let keys: Vec<String> = (0..15).map(|i| format!("pinned-{i}")).collect();
    for key in &keys {
        put(&m, c, key, 64 << 10);
    }
    let pins: Vec<u64> = m
        .batch_pin(c, keys.clone())
        .unwrap()
        .into_iter()
        .map(|pin| pin.unwrap().pin_id)
        .collect();
    // Above the 90 % watermark with every object pinned: rounds find nothing to evict.
    std::thread::sleep(Duration::from_millis(200));
    let before = m.metrics().table_scans;
    std::thread::sleep(Duration::from_secs(1));
    let scans = m.metrics().table_scans - before;
    assert!(scans <= 12, "{scans} full-table scans in one second");
    assert_eq!(m.metrics().evicted_objects, 0);
    // Once something is evictable again, eviction resumes within the back-off bound.
    m.unpin(c, pins).unwrap();
    assert!(wait_until(Duration::from_secs(5), || m
        .metrics()
        .evicted_objects
        > 0));
}
