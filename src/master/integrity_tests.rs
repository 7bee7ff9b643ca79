//! Regression tests of issue 11 ("never the wrong bytes") at the master: write tokens,
//! pre-empting upserts, quarantined reuse and segment remounts. Each names the failure it
//! proves impossible; every wait is bounded.

use super::tests::{end, fast_config, get, one, put, setup, start, upsert, used, wait_until, WAIT};
use super::{MasterApi, MasterConfig};
use crate::error::ErrorCode;
use crate::types::{ReplicateConfig, Uuid};

/// Failure 1: the first of two writes of one key by one client must not commit the second.
#[test]
fn put_end_of_a_superseded_write_does_not_commit_the_newer_one() {
    let (m, c, _) = setup(fast_config(), 1 << 20);
    upsert(&m, c, "k", 4096).unwrap();
    upsert(&m, c, "k", 4096).unwrap();
    let first_end = end(&m, c, "k");
    assert_ne!(first_end, Ok(()), "the first writer's end must be refused");
    assert_eq!(get(&m, "k"), Err(ErrorCode::ReplicaIsNotReady));
}

/// Failure 2: an upsert that pre-empts a write and then cannot allocate leaves no stuck key.
#[test]
fn failed_preempting_upsert_leaves_no_stuck_key() {
    let (m, a, _) = setup(MasterConfig::default(), 8192);
    start(&m, a, "k", 4096).unwrap();
    let b = Uuid::random();
    assert_eq!(upsert(&m, b, "k", 8192), Err(ErrorCode::NoAvailableHandle));
    // A's write was never pre-empted: it still commits and is readable.
    assert_eq!(end(&m, a, "k"), Ok(()));
    assert_eq!(get(&m, "k").map(|q| q.size), Ok(4096));
}

/// Failure 3 (master half): revoked space is quarantined, not handed to the next put.
#[test]
fn revoked_space_is_not_reused_at_once() {
    let (m, c, _) = setup(MasterConfig::default(), 1 << 20);
    let old = start(&m, c, "k", 4096).unwrap();
    one(m.batch_put_revoke(c, vec!["k".into()])).unwrap();
    let new = start(&m, c, "k2", 4096).unwrap();
    assert_ne!(
        old[0].buffer.buffer_address, new[0].buffer.buffer_address,
        "a revoked range must not be handed out while a stale payload may still land in it"
    );
}

/// Failure 5: a segment remounted after its owner expired must not hand out ranges that pins
/// of the old mount still hold.
#[test]
fn remounted_segment_keeps_ranges_still_pinned() {
    let config = MasterConfig {
        client_ttl_ms: Some(100),
        ..fast_config()
    };
    let (m, owner, seg) = setup(config, 1 << 20);
    let reader = Uuid::random();
    put(&m, owner, "k", 4096);
    let pinned = one(m.batch_pin(reader, vec!["k".into()])).unwrap();
    let pinned_at = pinned.query.replicas[0].buffer.buffer_address;
    assert!(wait_until(WAIT, || m.metrics().clients_expired == 1));
    m.remount_segments(owner, vec![seg]).unwrap();
    let fresh = one(m.batch_put_start(
        owner,
        vec!["k2".into()],
        vec![4096],
        ReplicateConfig::default(),
    ))
    .unwrap();
    assert_ne!(
        fresh[0].buffer.buffer_address, pinned_at,
        "a pinned range of the old mount was handed out again"
    );
    m.unpin(reader, vec![pinned.pin_id]).unwrap();
    assert!(used(&m) > 0);
}
