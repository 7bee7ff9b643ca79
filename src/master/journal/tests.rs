use super::*;
use crate::alloc::OffsetAllocator;
use crate::types::Uuid;

fn options(dir: &std::path::Path) -> JournalOptions {
    JournalOptions::new(dir)
}

/// Logs of 4 KiB, compacted past 16 KiB: many rotations and compactions in a short test.
fn small_files(dir: &std::path::Path) -> JournalOptions {
    JournalOptions {
        rotate_bytes: 4 << 10,
        compact_bytes: 16 << 10,
        ..options(dir)
    }
}

fn open(options: &JournalOptions) -> (Journal, Replayed) {
    Journal::open(options.clone(), Arc::new(FreeGate::default())).unwrap()
}

fn commit(key: &str, id: u64, segment: Uuid, epoch: u64) -> Record {
    Record::Commit {
        key: key.into(),
        object: record::tests::object(id, segment, epoch),
    }
}

fn mount(client: Uuid, segment: Uuid, epoch: u64) -> Record {
    Record::Mount {
        client,
        segment: record::tests::segment(segment, epoch),
        adopted_from: None,
    }
}

fn logs_of(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    list(dir)
        .unwrap()
        .logs
        .into_iter()
        .map(|l| l.path)
        .collect()
}

#[test]
fn what_was_durable_comes_back_after_a_reopen() {
    let dir = crate::test_util::TempDir::new("journal-reopen");
    let options = options(dir.path());
    let (client, seg) = (Uuid::random(), Uuid::random());
    {
        let (journal, replayed) = open(&options);
        assert!(replayed.state.objects.is_empty());
        journal.append(&mount(client, seg, 7));
        for id in 1..=50 {
            journal.append(&commit(&format!("k{id}"), id, seg, 7));
        }
        let last = journal.append(&Record::Remove { key: "k3".into() });
        journal.wait_durable(last).unwrap();
        assert!(journal.metrics().flushes >= 1);
    }
    let (journal, replayed) = open(&options);
    assert_eq!(replayed.torn, None);
    assert_eq!(replayed.state.objects.len(), 49);
    assert!(!replayed.state.objects.contains_key("k3"));
    assert_eq!(replayed.state.segments[&seg].segment.epoch, 7);
    assert_eq!(journal.metrics().replayed_records, 52);
    // LSNs continue after the replayed ones.
    let next = journal.append(&Record::TokenCeiling(9));
    assert_eq!(next, 53);
}

#[test]
fn a_torn_tail_is_cut_reported_and_never_half_applied() {
    let dir = crate::test_util::TempDir::new("journal-torn");
    let options = options(dir.path());
    let (client, seg) = (Uuid::random(), Uuid::random());
    {
        let (journal, _) = open(&options);
        journal.append(&mount(client, seg, 7));
        let lsn = journal.append(&commit("whole", 1, seg, 7));
        journal.wait_durable(lsn).unwrap();
    }
    let log = logs_of(dir.path()).pop().unwrap();
    let whole_len = std::fs::metadata(&log).unwrap().len();
    // A record cut in the middle, as a crash during its write leaves it.
    let mut torn = Vec::new();
    frame::encode_frame(3, &commit("torn", 2, seg, 7), &mut torn);
    let mut file = File::options().append(true).open(&log).unwrap();
    file.write_all(&torn[..torn.len() - 5]).unwrap();
    drop(file);
    let (_journal, replayed) = open(&options);
    let cut = replayed.torn.expect("reported");
    assert_eq!((cut.path, cut.kept), (log.clone(), whole_len));
    assert_eq!(cut.cut, torn.len() as u64 - 5);
    assert!(replayed.state.objects.contains_key("whole"));
    assert!(!replayed.state.objects.contains_key("torn"));
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        whole_len,
        "cut on disk"
    );
}

#[test]
fn damage_before_the_newest_log_stops_the_open() {
    let dir = crate::test_util::TempDir::new("journal-damage");
    let options = options(dir.path());
    let seg = Uuid::random();
    for round in 0..2u64 {
        let (journal, _) = open(&options);
        let lsn = journal.append(&commit(&format!("k{round}"), round + 1, seg, 1));
        journal.wait_durable(lsn).unwrap();
    }
    let first = logs_of(dir.path()).remove(0);
    let mut bytes = std::fs::read(&first).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&first, bytes).unwrap();
    let opened = Journal::open(options, Arc::new(FreeGate::default()));
    assert_eq!(opened.err(), Some(ErrorCode::InternalError));
    assert!(
        crate::error::last_error_message().contains("is not the newest log"),
        "{}",
        crate::error::last_error_message()
    );
}

#[test]
fn compaction_folds_closed_logs_into_a_snapshot_that_replays_the_same() {
    let dir = crate::test_util::TempDir::new("journal-compact");
    let options = small_files(dir.path());
    let (client, seg) = (Uuid::random(), Uuid::random());
    let mut expected = JournalState::default();
    {
        let (journal, _) = open(&options);
        let mut apply = |record: Record| {
            expected.apply(record.clone());
            journal.append(&record)
        };
        apply(mount(client, seg, 7));
        let mut last = 0;
        for id in 1..=3000u64 {
            last = apply(commit(&format!("key-{}", id % 700), id, seg, 7));
            if id % 5 == 0 {
                last = apply(Record::Remove {
                    key: format!("key-{}", (id * 7) % 700),
                });
            }
            if id % 100 == 0 {
                journal.wait_durable(last).unwrap();
            }
        }
        journal.wait_durable(last).unwrap();
        // Generous: the loops end as soon as compaction is done; a 10 s bound failed once
        // in a lib run on a 2-core VM loaded by a chaos soak's leftover processes.
        let until = Instant::now() + Duration::from_secs(60);
        while journal.metrics().compactions == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(journal.metrics().compactions >= 1, "compacted");
        while journal.shared.compacting.load(Ordering::Acquire) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let listing = list(dir.path()).unwrap();
    assert!(listing.snapshot.is_some());
    assert!(
        listing.logs.len() < 10,
        "folded logs are deleted: {listing:?}"
    );
    let (_journal, replayed) = open(&options);
    expected.settle();
    assert_eq!(replayed.state, expected);
}

#[test]
fn a_dropped_range_is_reused_only_after_the_records_before_it_are_durable() {
    let dir = crate::test_util::TempDir::new("journal-gate");
    let gate = Arc::new(FreeGate::default());
    let (journal, _) = Journal::open(options(dir.path()), Arc::clone(&gate)).unwrap();
    let allocator = OffsetAllocator::gated(64, Some(Arc::clone(&gate)));
    let range = allocator.allocate(64).unwrap();
    // The flusher takes this lock after a sync and before it releases the gate.
    let hold_release = journal.hold_release();
    let removal = journal.append(&Record::Remove { key: "k".into() });
    drop(range);
    assert_eq!(gate.held(), 1);
    assert_eq!(
        allocator.used(),
        64,
        "not free while its removal may not be durable"
    );
    assert!(allocator.allocate(64).is_none());
    drop(hold_release);
    journal.wait_durable(removal).unwrap();
    let freed = crate::test_util::wait_until(Duration::from_secs(5), || allocator.used() == 0);
    assert!(freed, "freed once durable");
    assert_eq!(gate.held(), 0);
}

#[test]
fn logs_closed_during_a_compaction_are_folded_after_a_burst_ends() {
    let dir = crate::test_util::TempDir::new("journal-burst");
    let options = small_files(dir.path());
    let (client, seg) = (Uuid::random(), Uuid::random());
    let (journal, _) = open(&options);
    journal.append(&mount(client, seg, 7));
    // One burst, no waits: logs close faster than a compaction folds them.
    let mut last = 0;
    for id in 1..=30_000u64 {
        last = journal.append(&commit(&format!("key-{}", id % 700), id, seg, 7));
    }
    journal.wait_durable(last).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    // Bytes in closed logs (all but the newest) once no compaction runs.
    let closed = || {
        let logs = list(dir.path()).unwrap().logs;
        let bytes: u64 = logs
            .iter()
            .rev()
            .skip(1)
            .map(|log| file_len(&log.path))
            .sum();
        (!journal.shared.compacting.load(Ordering::Acquire)).then_some(bytes)
    };
    while closed().is_none_or(|bytes| bytes >= options.compact_bytes) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let left = closed();
    assert!(
        left.is_some_and(|bytes| bytes < options.compact_bytes),
        "closed logs past compact_bytes stayed after the burst: {left:?} bytes"
    );
}

#[test]
fn a_dropped_journal_leaves_no_compaction_running() {
    // A compaction left running past the drop read and deleted files under the next open
    // (the official CI once failed the reopen above with INTERNAL_ERROR that way).
    for round in 0..20 {
        let dir = crate::test_util::TempDir::new("journal-drop-compacting");
        let options = small_files(dir.path());
        let seg = Uuid::random();
        let (journal, _) = open(&options);
        journal.append(&mount(Uuid::random(), seg, 7));
        let mut last = 0;
        for id in 1..=400u64 {
            last = journal.append(&commit(&format!("key-{id}"), id, seg, 7));
        }
        journal.wait_durable(last).unwrap();
        let shared = Arc::clone(&journal.shared);
        drop(journal);
        assert!(
            !shared.compacting.load(Ordering::Acquire),
            "round {round}: a compaction still runs after the drop"
        );
    }
}
