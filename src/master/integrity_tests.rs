//! Regression tests of issue 11 ("never the wrong bytes") at the master: write tokens,
//! pre-empting upserts, quarantined reuse and segment remounts. Each names the failure it
//! proves impossible; every wait is bounded.

use super::tests::{
    end_write, fast_config, get, grant, one, put, revoke_write, setup, start, upsert, used,
    wait_until, WAIT,
};
use super::{MasterApi, MasterConfig};
use crate::error::ErrorCode;
use crate::types::{fresh_epoch, ClientStatus, Segment, Uuid};

/// Failure 1: the first of two writes of one key by one client must not commit the second,
/// and its stale revoke must not erase the second.
#[test]
fn put_end_of_a_superseded_write_does_not_commit_the_newer_one() {
    let (m, c, _) = setup(fast_config(), 1 << 20);
    let first = upsert(&m, c, "k", 4096).unwrap().token;
    let second = upsert(&m, c, "k", 4096).unwrap().token;
    assert_ne!(first, second);
    assert_eq!(
        end_write(&m, c, "k", first),
        Err(ErrorCode::StaleWriteToken),
        "the first writer's end must be refused"
    );
    assert_eq!(get(&m, "k"), Err(ErrorCode::ReplicaIsNotReady));
    assert_eq!(
        revoke_write(&m, c, "k", first),
        Err(ErrorCode::StaleWriteToken),
        "a stale revoke changes nothing"
    );
    end_write(&m, c, "k", second).unwrap();
    assert_eq!(get(&m, "k").map(|q| q.size), Ok(4096));
    assert_eq!(end_write(&m, c, "k", second), Ok(()), "idempotent");
    assert_eq!(
        end_write(&m, c, "k", first),
        Err(ErrorCode::StaleWriteToken)
    );
}

/// Failure 2: an upsert that pre-empts a write and then cannot allocate leaves no stuck key.
#[test]
fn failed_preempting_upsert_leaves_no_stuck_key() {
    let (m, a, _) = setup(MasterConfig::default(), 8192);
    let write = grant(&m, a, "k", 4096).unwrap();
    let b = Uuid::random();
    assert_eq!(upsert(&m, b, "k", 8192), Err(ErrorCode::NoAvailableHandle));
    // A's write was never pre-empted: it still commits and is readable.
    assert_eq!(end_write(&m, a, "k", write.token), Ok(()));
    assert_eq!(get(&m, "k").map(|q| q.size), Ok(4096));
}

/// Failure 3 (master half): revoked space is quarantined, not handed to the next put, and
/// comes back once the quarantine is over.
#[test]
fn revoked_space_is_not_reused_at_once() {
    let config = MasterConfig {
        write_quarantine_ms: 300,
        ..MasterConfig::default()
    };
    let (m, c, _) = setup(config, 1 << 20);
    let old = grant(&m, c, "k", 4096).unwrap();
    revoke_write(&m, c, "k", old.token).unwrap();
    let new = start(&m, c, "k2", 4096).unwrap();
    assert_ne!(
        old.replicas[0].buffer.buffer_address, new[0].buffer.buffer_address,
        "a revoked range must not be handed out while a stale payload may still land in it"
    );
    assert_eq!(used(&m), 2 * 4096, "the revoked range is still held");
    assert!(
        wait_until(WAIT, || used(&m) == 4096),
        "released after the quarantine"
    );
}

/// Failure 3/10 (master half): space of a write reclaimed at `put_start_release_timeout` is
/// also quarantined, and the reclaimed writer's late end is refused.
#[test]
fn reclaimed_write_is_quarantined_and_its_end_refused() {
    let config = MasterConfig {
        write_quarantine_ms: 400,
        ..fast_config()
    };
    let (m, c, _) = setup(config, 1 << 20);
    let old = grant(&m, c, "k", 4096).unwrap();
    assert!(wait_until(WAIT, || get(&m, "k") == Err(ErrorCode::ObjectNotFound)));
    assert_eq!(used(&m), 4096, "reclaimed but quarantined");
    put(&m, c, "k", 4096);
    assert_eq!(
        end_write(&m, c, "k", old.token),
        Err(ErrorCode::StaleWriteToken)
    );
    assert!(wait_until(WAIT, || used(&m) == 4096));
}

/// Failure 5: a segment remounted after its owner expired must not hand out ranges that pins
/// of the old mount still hold; replicas of the old mount are not readable under the new one.
#[test]
fn remounted_segment_keeps_ranges_still_pinned() {
    // No quarantine: only the pin may keep the range from being handed out again.
    let config = MasterConfig {
        client_ttl_ms: Some(100),
        write_quarantine_ms: 0,
        ..fast_config()
    };
    let (m, owner, seg) = setup(config, 1 << 20);
    let reader = Uuid::random();
    put(&m, owner, "k", 4096);
    let pinned = one(m.batch_pin(reader, vec!["k".into()])).unwrap();
    let pinned_at = pinned.query.replicas[0].buffer.buffer_address;
    assert_eq!(pinned.query.replicas[0].buffer.epoch, seg.epoch);
    // The reader is registered by its pin and stays alive by pinging; the owner does not.
    assert!(wait_until(WAIT, || {
        m.ping(reader).unwrap();
        m.metrics().clients_expired == 1
    }));
    let remount = Segment {
        epoch: fresh_epoch(),
        ..seg
    };
    m.remount_segments(owner, vec![remount.clone()]).unwrap();
    let fresh = start(&m, owner, "k2", 4096).unwrap();
    assert_ne!(
        fresh[0].buffer.buffer_address, pinned_at,
        "a pinned range of the old mount was handed out again"
    );
    assert_eq!(fresh[0].buffer.epoch, remount.epoch);
    m.unpin(reader, vec![pinned.pin_id]).unwrap();
    assert!(wait_until(WAIT, || used(&m) == 4096));
}

/// Failure 5/6: the same segment mounted again under a new epoch (its owner restarted it
/// without the master noticing) drops the old mount's replicas: their descriptors name an
/// epoch the owner no longer serves.
#[test]
fn mount_with_a_new_epoch_drops_the_old_mounts_replicas() {
    let (m, owner, seg) = setup(fast_config(), 1 << 20);
    put(&m, owner, "old", 4096);
    assert_eq!(
        m.mount_segment(owner, seg.clone()),
        Ok(()),
        "same epoch: idempotent"
    );
    assert!(get(&m, "old").is_ok());
    let again = Segment {
        epoch: fresh_epoch(),
        ..seg.clone()
    };
    m.mount_segment(owner, again.clone()).unwrap();
    assert_eq!(get(&m, "old"), Err(ErrorCode::ObjectNotFound));
    put(&m, owner, "new", 4096);
    let q = get(&m, "new").unwrap();
    assert_eq!(q.replicas[0].buffer.epoch, again.epoch);
    let moved = Segment {
        base: seg.base + 4096,
        ..again
    };
    assert_eq!(m.mount_segment(owner, moved), Err(ErrorCode::InvalidParams));
    assert_eq!(m.ping(owner).unwrap().status, ClientStatus::Ok);
}
