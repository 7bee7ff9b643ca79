//! A master restarted on its journal: what comes back, what does not, and when space is
//! reused. Each test opens a master on a temporary directory, drops it (its journal flushes
//! what is pending, as a crash after the last group commit would leave it) and opens
//! another on the same directory.

use super::tests::{fast_config, grant, one, segment};
use super::{JournalOptions, MasterApi, MasterConfig, MasterService};
use crate::error::ErrorCode;
use crate::test_util::{wait_until, TempDir};
use crate::types::{ClientId, ReplicateConfig, Segment, Uuid, WriteToken};
use std::sync::Arc;
use std::time::Duration;

fn open(dir: &TempDir, config: MasterConfig) -> Arc<MasterService> {
    MasterService::open(config, JournalOptions::new(dir.path())).unwrap()
}

fn put(m: &MasterService, client: ClientId, key: &str, size: u64) -> WriteToken {
    let token = grant(m, client, key, size).unwrap().token;
    one(m.batch_put_end(client, vec![key.into()], vec![token])).unwrap();
    token
}

fn query(m: &MasterService, key: &str) -> crate::error::Result<crate::types::QueryResult> {
    one(m.batch_get_replica_list(vec![key.into()]))
}

fn with_epoch(segment: &Segment, epoch: u64) -> Segment {
    Segment {
        epoch,
        ..segment.clone()
    }
}

/// A master with one owner and `keys` committed objects of 1000 bytes; returns the owner,
/// its segment and each key's replica address.
fn populated(dir: &TempDir, keys: usize) -> (ClientId, Segment, Vec<(String, u64)>) {
    let master = open(dir, fast_config());
    let owner = Uuid::random();
    let seg = segment("h1", 1 << 20);
    master.mount_segment(owner, seg.clone()).unwrap();
    let mut placed = Vec::new();
    for i in 0..keys {
        let key = format!("key-{i}");
        put(&master, owner, &key, 1000);
        let address = query(&master, &key).unwrap().replicas[0]
            .buffer
            .buffer_address;
        placed.push((key, address));
    }
    (owner, seg, placed)
}

#[test]
fn committed_objects_come_back_when_their_owner_reattaches_the_same_memory() {
    let dir = TempDir::new("restart-reattach");
    let (owner, seg, placed) = populated(&dir, 20);
    {
        let master = open(&dir, fast_config());
        one(master.batch_remove(vec!["key-3".into()], false)).unwrap();
    }
    let master = open(&dir, fast_config());
    assert_eq!(master.metrics().recovered_objects, 19);
    assert_eq!(
        query(&master, "key-0").err(),
        Some(ErrorCode::ReplicaIsNotReady),
        "unreadable until the owner re-attaches"
    );
    assert_eq!(master.recovered_segments(owner).unwrap(), vec![seg.clone()]);
    assert!(master
        .recovered_segments(Uuid::random())
        .unwrap()
        .is_empty());
    let fresh = with_epoch(&seg, seg.epoch + 1);
    assert_eq!(
        master.reattach_segment(owner, seg.epoch + 7, fresh.clone()),
        Ok(false),
        "another epoch: not the memory the journal describes"
    );
    assert_eq!(
        master.reattach_segment(Uuid::random(), seg.epoch, fresh.clone()),
        Ok(false)
    );
    assert_eq!(
        master.reattach_segment(owner, seg.epoch, fresh.clone()),
        Ok(true)
    );
    for (key, address) in &placed {
        if key == "key-3" {
            assert_eq!(query(&master, key).err(), Some(ErrorCode::ObjectNotFound));
            continue;
        }
        let replica = &query(&master, key).unwrap().replicas[0].buffer;
        assert_eq!(replica.buffer_address, *address, "{key}: same place");
        assert_eq!(replica.epoch, fresh.epoch, "{key}: under the new epoch");
    }
    assert_eq!(master.metrics().recovered_segments_waiting, 0);
    // The rest of the segment takes new objects, never over a recovered one.
    let next = grant(&master, owner, "new", 1000).unwrap();
    let at = next.replicas[0].buffer.buffer_address;
    let kept = placed.iter().filter(|(key, _)| key != "key-3");
    assert!(
        kept.clone().all(|(_, address)| *address != at),
        "{at:#x} is taken"
    );
    // A third life: the re-attach was journaled, so the objects follow the new epoch.
    drop(master);
    let master = open(&dir, fast_config());
    let recovered = master.recovered_segments(owner).unwrap();
    assert_eq!(recovered, vec![fresh.clone()]);
    assert_eq!(master.metrics().recovered_objects, 19);
}

#[test]
fn an_owner_with_fresh_memory_loses_its_replicas_and_one_that_never_comes_back_too() {
    let dir = TempDir::new("restart-fresh");
    let (owner, seg, _) = populated(&dir, 5);
    {
        let master = open(&dir, fast_config());
        master
            .remount_segments(owner, vec![with_epoch(&seg, seg.epoch + 1)])
            .unwrap();
        assert_eq!(
            query(&master, "key-0").err(),
            Some(ErrorCode::ObjectNotFound)
        );
        assert_eq!(master.metrics().objects, 0);
    }
    let master = open(&dir, fast_config());
    assert_eq!(
        master.metrics().recovered_objects,
        0,
        "the fresh mount was journaled"
    );
    drop(master);

    let dir = TempDir::new("restart-grace");
    populated(&dir, 5);
    let config = MasterConfig {
        reattach_grace_ms: 100,
        ..fast_config()
    };
    let master = open(&dir, config.clone());
    assert_eq!(master.metrics().recovered_objects, 5);
    let gone = wait_until(Duration::from_secs(5), || master.metrics().objects == 0);
    assert!(gone, "given up after the grace");
    assert_eq!(master.metrics().recovered_segments_waiting, 0);
    drop(master);
    assert_eq!(open(&dir, config).metrics().recovered_objects, 0);
}

#[test]
fn a_range_is_reused_only_after_its_removal_is_durable_so_a_removed_key_never_returns() {
    let dir = TempDir::new("restart-reuse");
    // Eviction off: a full segment would otherwise evict "old" before the remover runs.
    let no_eviction = MasterConfig {
        eviction_high_watermark_ratio: 1.0,
        eviction_ratio: 0.0,
        ..fast_config()
    };
    let master = open(&dir, no_eviction.clone());
    let owner = Uuid::random();
    // Room for exactly one 4 KiB object.
    let seg = segment("h1", 4096);
    master.mount_segment(owner, seg.clone()).unwrap();
    put(&master, owner, "old", 4096);
    // A loaded machine may start the remover this late.
    std::thread::sleep(Duration::from_millis(100));
    let journal = master.journal.clone().unwrap();
    // Hold the flusher between its sync and the release of the gate.
    let held = journal.hold_release();
    let remover = {
        let master = Arc::clone(&master);
        std::thread::spawn(move || one(master.batch_remove(vec!["old".into()], true)))
    };
    let gone = wait_until(Duration::from_secs(5), || {
        query(&master, "old").err() == Some(ErrorCode::ObjectNotFound)
    });
    assert!(gone, "removed from the table");
    assert_eq!(
        grant(&master, owner, "new", 4096).err(),
        Some(ErrorCode::NoAvailableHandle),
        "the range waits for the removal to be durable"
    );
    assert!(!remover.is_finished(), "acknowledged before it was durable");
    drop(held);
    assert_eq!(remover.join().unwrap(), Ok(()));
    let reused = wait_until(Duration::from_secs(5), || {
        grant(&master, owner, "new", 4096).is_ok()
    });
    assert!(
        reused,
        "reused once the removal is durable: {:?} {:?}",
        grant(&master, owner, "new", 4096).err(),
        journal.metrics()
    );
    let token = super::tests::current_token(&master, "new");
    one(master.batch_put_end(owner, vec!["new".into()], vec![token])).unwrap();
    drop((master, journal));
    let master = open(&dir, no_eviction);
    master
        .reattach_segment(owner, seg.epoch, with_epoch(&seg, seg.epoch + 1))
        .unwrap();
    assert_eq!(query(&master, "old").err(), Some(ErrorCode::ObjectNotFound));
    assert!(query(&master, "new").is_ok());
}

#[test]
fn an_in_place_upsert_cut_short_by_a_restart_leaves_no_old_value() {
    let dir = TempDir::new("restart-upsert");
    let (owner, seg, placed) = populated(&dir, 1);
    {
        let master = open(&dir, fast_config());
        master
            .reattach_segment(owner, seg.epoch, with_epoch(&seg, seg.epoch + 1))
            .unwrap();
        let rewrite = one(master.batch_upsert_start(
            owner,
            vec!["key-0".into()],
            vec![1000],
            ReplicateConfig::default(),
        ))
        .unwrap();
        assert_eq!(
            rewrite.replicas[0].buffer.buffer_address, placed[0].1,
            "in place"
        );
        // The master stops here: the rewrite may have half-landed in the old bytes.
    }
    let master = open(&dir, fast_config());
    assert_eq!(master.metrics().recovered_objects, 0);
    assert_eq!(
        query(&master, "key-0").err(),
        Some(ErrorCode::ObjectNotFound)
    );
}

#[test]
fn write_tokens_of_a_restarted_master_start_above_every_earlier_one() {
    let dir = TempDir::new("restart-tokens");
    let (owner, _, _) = populated(&dir, 0);
    let mut last = 0;
    for _ in 0..3 {
        let master = open(&dir, fast_config());
        let seg = segment("h2", 1 << 16);
        master.mount_segment(owner, seg).unwrap();
        let token = grant(&master, owner, "k", 64).unwrap().token.0;
        assert!(token > last, "{token} after {last}");
        last = token;
    }
}

#[test]
fn a_journal_in_p2p_mode_or_on_a_bad_directory_is_refused() {
    let p2p = MasterConfig {
        deployment_mode: crate::types::DeploymentMode::P2p,
        ..MasterConfig::default()
    };
    let dir = TempDir::new("restart-p2p");
    let refused = MasterService::open(p2p, JournalOptions::new(dir.path()));
    assert_eq!(refused.err(), Some(ErrorCode::InvalidParams));
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let refused = MasterService::open(MasterConfig::default(), JournalOptions::new(&file));
    assert_eq!(refused.err(), Some(ErrorCode::InternalError));
}

#[test]
fn two_journaled_objects_on_one_range_never_both_come_back() {
    let dir = TempDir::new("restart-overlap");
    let (owner, seg, _) = populated(&dir, 1);
    {
        // A damaged journal: a second key naming the first one's range.
        let master = open(&dir, fast_config());
        let journal = master.journal.clone().unwrap();
        let mut forged = master
            .objects
            .shard("key-0")
            .get("key-0")
            .unwrap()
            .record(std::time::Instant::now());
        forged.id += 1;
        let lsn = journal.append(&super::journal::Record::Commit {
            key: "forged".into(),
            object: forged,
        });
        journal.wait_durable(lsn).unwrap();
    }
    let master = open(&dir, fast_config());
    assert_eq!(master.restored.overlapping_replicas, 1);
    assert_eq!(master.metrics().recovered_objects, 1);
    master
        .reattach_segment(owner, seg.epoch, with_epoch(&seg, seg.epoch + 1))
        .unwrap();
    let served = ["key-0", "forged"].map(|key| query(&master, key).is_ok());
    assert_eq!(served.iter().filter(|&&ok| ok).count(), 1, "{served:?}");
}
