//! Location-cache leases at the master (`cache_leases.rs`): who becomes a holder, what a
//! write of a held key waits for, and the revocation poll. Every wait is bounded.

use super::tests::{end, end_write, fast_config, one, setup, upsert};
use super::{MasterApi, MasterConfig, MasterService};
use crate::error::ErrorCode;
use crate::types::{ClientId, RevocationBatch, Uuid};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A master with caching on (`cache_ms` cached leases under a 10 s read lease) and one
/// committed 100-byte object `k`.
fn held_master(cache_ms: u64) -> (Arc<MasterService>, ClientId) {
    let config = MasterConfig {
        default_kv_lease_ttl_ms: 10_000,
        location_cache_lease_ms: cache_ms,
        ..slow_writes()
    };
    let (master, writer, _) = setup(config, 1 << 20);
    one(master.batch_put_start(writer, vec!["k".into()], vec![100], Default::default())).unwrap();
    end(&master, writer, "k").unwrap();
    (master, writer)
}

/// [`fast_config`] with writes that stay theirs' for 5 s (they outlive the waits here).
fn slow_writes() -> MasterConfig {
    MasterConfig {
        put_start_discard_timeout_ms: Some(5_000),
        put_start_release_timeout_ms: Some(5_000),
        ..fast_config()
    }
}

/// A first poll of `client` (no revocations waiting: answers after the poll's wait).
fn first_poll(master: &MasterService, client: ClientId) -> RevocationBatch {
    master.cache_revocations(client, 0, 0).unwrap()
}

#[test]
fn only_a_client_that_polls_for_revocations_is_given_a_cached_lease() {
    let (master, _) = held_master(2_000);
    let reader = Uuid::random();
    let answer = one(master.batch_get_locations(reader, vec!["k".into()])).unwrap();
    assert_eq!(answer.cache_ttl_ms, 0, "no poll yet: not cacheable");
    first_poll(&master, reader);
    let answer = one(master.batch_get_locations(reader, vec!["k".into()])).unwrap();
    assert_eq!((answer.cache_ttl_ms, answer.lease_ttl_ms), (2_000, 10_000));
    // Capped by the read lease.
    let (capped, _) = held_master(60_000);
    first_poll(&capped, reader);
    let answer = one(capped.batch_get_locations(reader, vec!["k".into()])).unwrap();
    assert_eq!(answer.cache_ttl_ms, 10_000);
    // Caching off at the master: never cacheable.
    let (off, _) = held_master(0);
    first_poll(&off, reader);
    let answer = one(off.batch_get_locations(reader, vec!["k".into()])).unwrap();
    assert_eq!(answer.cache_ttl_ms, 0);
    assert_eq!(
        one(off.batch_get_locations(reader, vec!["absent".into()])),
        Err(ErrorCode::ObjectNotFound)
    );
}

#[test]
fn an_upsert_of_a_held_key_ends_only_after_the_holder_acknowledged() {
    let (master, writer) = held_master(5_000);
    let reader = Uuid::random();
    let batch = first_poll(&master, reader);
    one(master.batch_get_locations(reader, vec!["k".into()])).unwrap();
    let grant = upsert(&master, writer, "k", 100).unwrap();
    assert!(grant.revoking, "the writer is told to wait");
    assert_eq!(
        end_write(&master, writer, "k", grant.token),
        Err(ErrorCode::RevocationPending)
    );
    assert_eq!(master.await_revocations(vec!["k".into()]), Ok(false));
    // The holder's next poll carries the revocation; the one after acknowledges it.
    let delivered = master
        .cache_revocations(reader, batch.incarnation, 0)
        .unwrap();
    assert_eq!(delivered.revocations.len(), 1);
    assert_eq!(delivered.revocations[0].key, "k");
    assert_eq!(
        end_write(&master, writer, "k", grant.token),
        Err(ErrorCode::RevocationPending),
        "delivered is not acknowledged"
    );
    let ack = delivered.revocations[0].seq;
    master
        .cache_revocations(reader, batch.incarnation, ack)
        .unwrap();
    assert_eq!(master.await_revocations(vec!["k".into()]), Ok(true));
    end_write(&master, writer, "k", grant.token).unwrap();
    let metrics = master.metrics();
    assert_eq!(
        (
            metrics.location_cache.revocations_sent,
            metrics.location_cache.revocations_acked
        ),
        (1, 1)
    );
    assert!(metrics.prometheus_text().contains(
        "mooncake_master_location_cache_revocations_acked_total{cluster=\"mooncake_cluster\"} 1"
    ));
}

#[test]
fn a_holder_that_never_answers_delays_a_write_by_at_most_its_lease() {
    let (master, writer) = held_master(300);
    let silent = Uuid::random();
    first_poll(&master, silent);
    one(master.batch_get_locations(silent, vec!["k".into()])).unwrap();
    let started = Instant::now();
    let grant = upsert(&master, writer, "k", 100).unwrap();
    assert_eq!(
        end_write(&master, writer, "k", grant.token),
        Err(ErrorCode::RevocationPending)
    );
    let mut rounds = 0;
    while !master.await_revocations(vec!["k".into()]).unwrap() {
        rounds += 1;
        assert!(rounds < 50, "still pending after {:?}", started.elapsed());
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(2_000),
        "waited {waited:?} for a 300 ms lease"
    );
    end_write(&master, writer, "k", grant.token).unwrap();
    assert_eq!(master.metrics().location_cache.revocations_expired, 1);
}

#[test]
fn a_forced_removal_revokes_and_every_removal_of_unheld_keys_needs_no_wait() {
    let (master, writer) = held_master(5_000);
    let reader = Uuid::random();
    let batch = first_poll(&master, reader);
    one(master.batch_get_locations(reader, vec!["k".into()])).unwrap();
    assert_eq!(
        one(master.batch_remove(vec!["k".into()], false)),
        Err(ErrorCode::ObjectHasLease),
        "a held key is leased: only a forced removal takes it"
    );
    one(master.batch_remove(vec!["k".into()], true)).unwrap();
    assert_eq!(master.await_revocations(vec!["k".into()]), Ok(false));
    assert_eq!(master.await_revocations(vec![]), Ok(false));
    assert_eq!(master.await_revocations(vec!["other".into()]), Ok(true));
    let delivered = master
        .cache_revocations(reader, batch.incarnation, 0)
        .unwrap();
    master
        .cache_revocations(reader, batch.incarnation, delivered.revocations[0].seq)
        .unwrap();
    assert_eq!(master.await_revocations(vec![]), Ok(true));
    // remove_all of keys nobody holds sends nothing.
    one(master.batch_put_start(writer, vec!["j".into()], vec![10], Default::default())).unwrap();
    end(&master, writer, "j").unwrap();
    assert_eq!(master.remove_all(true), Ok(1));
    assert_eq!(master.await_revocations(vec![]), Ok(true));
}

#[test]
fn a_lost_poll_answer_is_sent_again_and_another_lifes_acknowledgement_is_ignored() {
    let (master, writer) = held_master(5_000);
    let reader = Uuid::random();
    let batch = first_poll(&master, reader);
    one(master.batch_get_locations(reader, vec!["k".into()])).unwrap();
    upsert(&master, writer, "k", 100).unwrap();
    let lost = master
        .cache_revocations(reader, batch.incarnation, 0)
        .unwrap();
    assert_eq!(lost.revocations.len(), 1);
    // The client never saw it: it acknowledges nothing new and gets it again.
    let again = master
        .cache_revocations(reader, batch.incarnation, 0)
        .unwrap();
    assert_eq!(again.revocations, lost.revocations);
    // An acknowledgement naming another master life does not count.
    master
        .cache_revocations(reader, batch.incarnation ^ 1, lost.revocations[0].seq)
        .unwrap();
    assert_eq!(master.await_revocations(vec!["k".into()]), Ok(false));
}

#[test]
fn writes_wait_out_the_start_grace_of_a_master() {
    let config = MasterConfig {
        location_cache_start_grace_ms: 300,
        ..slow_writes()
    };
    let started = Instant::now();
    let (master, writer, _) = setup(config, 1 << 20);
    let grant = one(master.batch_put_start(writer, vec!["n".into()], vec![10], Default::default()))
        .unwrap();
    assert!(grant.revoking);
    if started.elapsed() < Duration::from_millis(250) {
        assert_eq!(
            end_write(&master, writer, "n", grant.token),
            Err(ErrorCode::RevocationPending)
        );
    }
    let mut rounds = 0;
    while !master.await_revocations(vec!["n".into()]).unwrap() {
        rounds += 1;
        assert!(rounds < 50);
    }
    assert!(started.elapsed() >= Duration::from_millis(300));
    end_write(&master, writer, "n", grant.token).unwrap();
    // After the grace, writes of unheld keys neither wait nor are told to.
    let grant = one(master.batch_put_start(writer, vec!["m".into()], vec![10], Default::default()))
        .unwrap();
    assert!(!grant.revoking);
    end_write(&master, writer, "m", grant.token).unwrap();
}

#[test]
fn renewals_are_granted_as_lookups_and_refused_above_the_eviction_watermark() {
    let (master, _) = held_master(2_000);
    let reader = Uuid::random();
    first_poll(&master, reader);
    let renewed = one(master.renew_locations(reader, vec!["k".into()])).unwrap();
    assert_eq!((renewed.size, renewed.cache_ttl_ms), (100, 2_000));
    assert_eq!(
        one(master.renew_locations(reader, vec!["absent".into()])),
        Err(ErrorCode::ObjectNotFound)
    );

    // A soft-pinned object (never evicted) fills three quarters of a segment whose high
    // watermark is one half: renewals are refused and grant nothing.
    let config = MasterConfig {
        default_kv_lease_ttl_ms: 10_000,
        location_cache_lease_ms: 2_000,
        eviction_high_watermark_ratio: 0.5,
        allow_evict_soft_pinned_objects: false,
        ..slow_writes()
    };
    let (full, writer, _) = setup(config, 1 << 20);
    let pinned = crate::types::ReplicateConfig {
        soft_pin_action: crate::types::SoftPinAction::Enable,
        ..Default::default()
    };
    one(full.batch_put_start(writer, vec!["big".into()], vec![3 << 18], pinned)).unwrap();
    end(&full, writer, "big").unwrap();
    first_poll(&full, reader);
    let granted_before = full.metrics().location_cache.holders_granted;
    assert_eq!(
        full.renew_locations(reader, vec!["big".into(), "absent".into()]),
        Ok(vec![Err(ErrorCode::TryAgain), Err(ErrorCode::TryAgain)])
    );
    let metrics = full.metrics().location_cache;
    assert_eq!(
        (
            metrics.renewals,
            metrics.renewals_refused,
            metrics.holders_granted
        ),
        (2, 2, granted_before)
    );
    // A plain lookup still answers (and may be cached): only renewals are refused.
    let looked_up = one(full.batch_get_locations(reader, vec!["big".into()])).unwrap();
    assert_eq!(looked_up.cache_ttl_ms, 2_000);
}

#[test]
fn a_write_that_preempts_a_revoking_write_still_waits_for_the_revocation() {
    let (master, writer) = held_master(5_000);
    let reader = Uuid::random();
    let batch = first_poll(&master, reader);
    one(master.batch_get_locations(reader, vec!["k".into()])).unwrap();
    let first = upsert(&master, writer, "k", 100).unwrap();
    assert!(first.revoking);
    // Another client's upsert pre-empts the first write: a new object of the same key,
    // whose old value the reader may still serve until it acknowledges.
    let other = Uuid::random();
    let second = upsert(&master, other, "k", 200).unwrap();
    assert!(second.revoking, "the pre-empting write must wait too");
    assert_eq!(
        end_write(&master, other, "k", second.token),
        Err(ErrorCode::RevocationPending)
    );
    let delivered = master
        .cache_revocations(reader, batch.incarnation, 0)
        .unwrap();
    let acked = delivered.revocations.iter().map(|r| r.seq).max().unwrap();
    master
        .cache_revocations(reader, batch.incarnation, acked)
        .unwrap();
    assert_eq!(end_write(&master, other, "k", second.token), Ok(()));
}

#[test]
fn a_new_object_of_a_key_whose_revocation_is_pending_waits_for_it() {
    let (master, writer) = held_master(5_000);
    let reader = Uuid::random();
    first_poll(&master, reader);
    one(master.batch_get_locations(reader, vec!["k".into()])).unwrap();
    // A forced removal revokes; a put of the key right after (by a client that did not wait)
    // must not be acknowledged while the reader may still serve the removed value.
    assert_eq!(one(master.batch_remove(vec!["k".into()], true)), Ok(()));
    let grant =
        one(master.batch_put_start(writer, vec!["k".into()], vec![100], Default::default()))
            .unwrap();
    assert!(grant.revoking);
    assert_eq!(
        end_write(&master, writer, "k", grant.token),
        Err(ErrorCode::RevocationPending)
    );
}
