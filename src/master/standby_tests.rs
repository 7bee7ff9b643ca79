//! A standby's copy of a leader's journal: what a promoted standby starts from, and the
//! leader waiting for the standby before it reuses freed space.

use super::standby::JournalCopy;
use super::tests::{fast_config, grant, one, segment};
use super::{JournalOptions, MasterApi, MasterConfig, MasterService};
use crate::error::ErrorCode;
use crate::test_util::TempDir;
use crate::types::{ClientId, Segment, Uuid};
use std::sync::Arc;

fn put(m: &MasterService, client: ClientId, key: &str, size: u64) {
    let token = grant(m, client, key, size).unwrap().token;
    one(m.batch_put_end(client, vec![key.into()], vec![token])).unwrap();
}

/// A journaled master that never evicts (the tests fill segments on purpose).
fn leader(dir: &TempDir, small_files: bool) -> Arc<MasterService> {
    let mut options = JournalOptions::new(dir.path());
    if small_files {
        options.rotate_bytes = 8 << 10;
        options.compact_bytes = 32 << 10;
    }
    let config = MasterConfig {
        eviction_high_watermark_ratio: 1.0,
        ..fast_config()
    };
    MasterService::open(config, options).unwrap()
}

fn promote(copy: &JournalCopy, owner: ClientId, seg: &Segment) -> Arc<MasterService> {
    let promoted = MasterService::open(fast_config(), JournalOptions::new(copy.dir())).unwrap();
    let fresh = Segment {
        epoch: seg.epoch + 1,
        ..seg.clone()
    };
    assert_eq!(promoted.reattach_segment(owner, seg.epoch, fresh), Ok(true));
    promoted
}

fn exists(m: &MasterService, key: &str) -> bool {
    one(m.batch_exist_key(vec![key.into()])).unwrap()
}

#[test]
fn a_promoted_standby_serves_what_the_leader_committed_through_rotations_and_compactions() {
    let (leader_dir, standby_dir) = (TempDir::new("ha-leader"), TempDir::new("ha-standby"));
    let master = leader(&leader_dir, true);
    let owner = Uuid::random();
    let seg = segment("h1", 64 << 20);
    master.mount_segment(owner, seg.clone()).unwrap();
    let mut copy = JournalCopy::start(standby_dir.path()).unwrap();
    copy.sync_once(&*master).unwrap();
    // The standby copies all along, as a standby's loop does (writes and removals wait for it).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let copier = {
        let (master, stop) = (Arc::clone(&master), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                copy.sync_once(&*master).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            copy
        })
    };
    for round in 0..20 {
        for i in 0..100 {
            put(&master, owner, &format!("k{round}-{i}"), 1000);
        }
        for i in (0..100).step_by(3) {
            one(master.batch_remove(vec![format!("k{round}-{i}")], true)).unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let mut copy = copier.join().unwrap();
    let journal = master.journal.clone().unwrap();
    let durable = crate::test_util::wait_until(std::time::Duration::from_secs(5), || {
        copy.sync_once(&*master).unwrap();
        copy.acked() >= journal.metrics().durable_lsn && journal.metrics().records > 0
    });
    assert!(durable, "the copy caught up");
    assert!(
        journal.metrics().compactions > 0,
        "the leader compacted meanwhile"
    );
    let objects = master.metrics().objects;
    drop((master, journal));
    let promoted = promote(&copy, owner, &seg);
    assert_eq!(promoted.metrics().objects, objects);
    assert!(exists(&promoted, "k19-1"));
    assert!(!exists(&promoted, "k19-0"), "removed");
}

#[test]
fn a_leader_reuses_freed_space_only_after_its_standby_holds_the_removal() {
    let (leader_dir, standby_dir) = (TempDir::new("ha-gate"), TempDir::new("ha-gate-standby"));
    let master = leader(&leader_dir, false);
    let owner = Uuid::random();
    let seg = segment("h1", 4096);
    master.mount_segment(owner, seg.clone()).unwrap();
    put(&master, owner, "old", 4096);
    let mut copy = JournalCopy::start(standby_dir.path()).unwrap();
    copy.sync_once(&*master).unwrap();
    // The removal is acknowledged only once the standby holds it.
    let remover = {
        let master = Arc::clone(&master);
        std::thread::spawn(move || one(master.batch_remove(vec!["old".into()], true)))
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(
        !remover.is_finished(),
        "acknowledged before the standby held it"
    );
    assert_eq!(
        grant(&master, owner, "new", 4096).err(),
        Some(ErrorCode::NoAvailableHandle),
        "durable here, not yet at the standby"
    );
    // The standby copies the removal; its next report releases the range and the remover.
    copy.sync_once(&*master).unwrap();
    copy.sync_once(&*master).unwrap();
    assert_eq!(remover.join().unwrap(), Ok(()));
    assert!(grant(&master, owner, "new", 4096).is_ok());
    // Dropped from the followers (the HA layer recorded it out of sync): no more waiting.
    let journal = master.journal.clone().unwrap();
    assert_eq!(journal.followers().len(), 1);
    journal.drop_follower(copy.member());
    assert!(journal.followers().is_empty());
}

#[test]
fn a_standby_refuses_a_leader_whose_files_do_not_extend_its_copy_and_bad_names() {
    let (leader_dir, standby_dir) = (TempDir::new("ha-other"), TempDir::new("ha-other-standby"));
    let master = leader(&leader_dir, false);
    let owner = Uuid::random();
    master.mount_segment(owner, segment("h1", 1 << 20)).unwrap();
    put(&master, owner, "k", 100);
    let mut copy = JournalCopy::start(standby_dir.path()).unwrap();
    let synced = crate::test_util::wait_until(std::time::Duration::from_secs(5), || {
        copy.sync_once(&*master).unwrap();
        copy.acked() >= 2
    });
    assert!(synced);
    drop(master);
    // Another history in the leader's directory: shorter files under the same names.
    for entry in std::fs::read_dir(leader_dir.path()).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "mcj") {
            std::fs::write(entry.path(), b"").unwrap();
        }
    }
    let other = leader(&leader_dir, false);
    assert_eq!(
        copy.sync_once(&*other).err(),
        Some(ErrorCode::InternalError)
    );
    assert_eq!(
        other.journal_read("../member-id".into(), 0, 10).err(),
        Some(ErrorCode::InvalidParams)
    );
    let plain = MasterService::new(fast_config());
    assert_eq!(
        plain.journal_files(owner, 0).err(),
        Some(ErrorCode::UnavailableInCurrentMode)
    );
}
