//! A `mooncake_master` SIGKILLed and restarted on its journal (`--journal_dir`), with real
//! peer processes holding the replicas: what a restart keeps, what it must not keep, and
//! that no get ever returns bytes other than a committed write of its key.

mod common;

use common::{local_client, pattern, wait_until, Master, PeerClient};
use mooncake_rs::client::Client;
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A journal directory, deleted on drop.
struct JournalDir(PathBuf);

impl JournalDir {
    fn new(name: &str) -> JournalDir {
        let unique = format!(
            "mc-journal-{name}-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        );
        let path = std::env::temp_dir().join(unique);
        std::fs::create_dir_all(&path).unwrap();
        JournalDir(path)
    }

    fn flag(&self) -> String {
        format!("--journal_dir={}", self.0.display())
    }

    /// The newest log file.
    fn newest_log(&self) -> PathBuf {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&self.0)
            .unwrap()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|e| e == "mcj"))
            .collect();
        logs.sort();
        logs.pop().expect("a log file")
    }
}

impl Drop for JournalDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn on(segment: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![segment.to_string()],
        ..ReplicateConfig::default()
    }
}

/// Restarts the killed `master` on its port with its flags.
fn restart(master: &Master) -> Master {
    let extra: Vec<&str> = master.extra.iter().map(String::as_str).collect();
    Master::start_on(master.port, &extra)
}

/// Waits until every recovered segment was re-attached (or given up).
fn wait_reattached(master: &Master) {
    let done = wait_until(Duration::from_secs(15), || {
        master.gauge("recovered_segments_waiting") == 0
    });
    assert!(done, "the owners never re-attached");
}

/// What a get of `key` (written as `pattern(len, seed)`) returned.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    Exact,
    Missing(ErrorCode),
    Wrong,
}

fn read(client: &Client, key: &str, len: usize, seed: u8) -> Read {
    let mut buf = vec![0u8; len];
    match client.get_into(key, &mut buf) {
        Ok(n) if n as usize == len && buf == pattern(len, seed) => Read::Exact,
        Ok(_) => Read::Wrong,
        Err(code) => Read::Missing(code),
    }
}

/// One acknowledged write.
struct Acked {
    key: String,
    len: usize,
    seed: u8,
    at: Instant,
    removed: bool,
}

#[test]
fn a_killed_master_restarted_on_its_journal_keeps_every_durable_object_under_load() {
    let dir = JournalDir::new("load");
    let mut master = Master::start(&[&dir.flag(), "--reattach_grace_ms=20000"]);
    let addr = master.addr();
    // Room for everything the load writes: nothing is evicted, so every miss is a loss.
    let _peers = [
        PeerClient::start(&addr, "256 MB"),
        PeerClient::start(&addr, "256 MB"),
    ];
    let client = Arc::new(local_client(&addr, 0, 0));
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u8)
        .map(|writer| {
            let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut failed = 0u64;
                for i in 0..100_000u32 {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let key = format!("w{writer}-{i}");
                    let len = 1 + fastrand::usize(..16 << 10);
                    let seed = (i % 251) as u8;
                    let config = ReplicateConfig::default();
                    if client.put_from(&key, &pattern(len, seed), &config).is_err() {
                        failed += 1;
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    let removed = i % 10 == 0 && client.remove(&key, true).is_ok();
                    acked.lock().unwrap().push(Acked {
                        key,
                        len,
                        seed,
                        at: Instant::now(),
                        removed,
                    });
                }
                failed
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    master.kill();
    let killed_at = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let master = restart(&master);
    eprintln!("recovered {} objects", master.gauge("recovered_objects"));
    wait_reattached(&master);
    eprintln!("objects after re-attach: {}", master.gauge("objects"));
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Release);
    let failed: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    let (mut exact, mut lost, mut lost_durable, mut wrong, mut resurrected) = (0, 0, 0, 0, 0);
    for write in &acked {
        match read(&client, &write.key, write.len, write.seed) {
            Read::Wrong => wrong += 1,
            Read::Exact if write.removed => resurrected += 1,
            Read::Exact => exact += 1,
            Read::Missing(_) if write.removed => {}
            Read::Missing(code) => {
                lost += 1;
                // Acknowledged half a second before the kill: long durable by then.
                if write.at + Duration::from_millis(500) < killed_at {
                    lost_durable += 1;
                    eprintln!("lost {} ({code:?})", write.key);
                }
            }
        }
    }
    eprintln!(
        "acked {} (failed attempts {failed}): exact {exact}, lost {lost} (durable {lost_durable}), \
         removed-then-back {resurrected}, wrong {wrong}",
        acked.len()
    );
    assert_eq!(wrong, 0, "wrong bytes");
    assert_eq!(lost_durable, 0, "durable commits lost");
    assert!(exact > 100, "the load ran ({exact} objects)");
    assert!(
        acked.iter().any(|w| w.at > killed_at),
        "puts succeeded after the restart"
    );
    assert_eq!(master.gauge("journal_write_errors_total"), 0);
    assert_eq!(master.gauge("evicted_objects_total"), 0);
}

#[test]
fn an_owner_restarted_while_the_master_was_down_loses_exactly_its_replicas() {
    let dir = JournalDir::new("owner");
    let mut master = Master::start(&[&dir.flag(), "--reattach_grace_ms=1500"]);
    let addr = master.addr();
    let mut lost_owner = PeerClient::start(&addr, "16 MB");
    let kept_owner = PeerClient::start(&addr, "16 MB");
    let client = local_client(&addr, 0, 0);
    for i in 0..20u8 {
        let value = pattern(4096, i);
        client
            .put_from(&format!("a{i}"), &value, &on(&lost_owner.name))
            .unwrap();
        client
            .put_from(&format!("b{i}"), &value, &on(&kept_owner.name))
            .unwrap();
    }
    // A commit is acknowledged before it is durable: give the last ones a group commit.
    std::thread::sleep(Duration::from_millis(200));
    master.kill();
    lost_owner.kill();
    let master = restart(&master);
    let _fresh_owner = PeerClient::start(&addr, "16 MB");
    wait_reattached(&master);
    for i in 0..20u8 {
        assert_eq!(
            read(&client, &format!("b{i}"), 4096, i),
            Read::Exact,
            "b{i}"
        );
        let gone = read(&client, &format!("a{i}"), 4096, i);
        assert_eq!(gone, Read::Missing(ErrorCode::ObjectNotFound), "a{i}");
    }
    assert_eq!(master.gauge("recovered_objects"), 40);
    assert_eq!(master.gauge("objects"), 20);
}

#[test]
fn a_torn_journal_tail_is_cut_and_reported_and_the_rest_is_kept() {
    let dir = JournalDir::new("torn");
    let mut master = Master::start(&[&dir.flag()]);
    let addr = master.addr();
    let _peer = PeerClient::start(&addr, "16 MB");
    let client = local_client(&addr, 0, 0);
    for i in 0..10u8 {
        let value = pattern(1000, i);
        client
            .put_from(&format!("k{i}"), &value, &ReplicateConfig::default())
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    master.kill();
    // Half a frame, as a crash in the middle of a write leaves it.
    append(&dir.newest_log(), &[40, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7]);
    let master = restart(&master);
    assert_eq!(master.gauge("journal_torn_tail_bytes"), 11);
    wait_reattached(&master);
    for i in 0..10u8 {
        assert_eq!(
            read(&client, &format!("k{i}"), 1000, i),
            Read::Exact,
            "k{i}"
        );
    }
}

fn append(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut file = std::fs::File::options().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
}

#[test]
fn a_key_removed_before_a_crash_never_returns_over_reused_space() {
    let dir = JournalDir::new("reuse");
    let mut master = Master::start(&[&dir.flag()]);
    let addr = master.addr();
    // One object of 3 MiB fits; a second only where the first was.
    let _peer = PeerClient::start(&addr, "4 MB");
    let client = local_client(&addr, 0, 0);
    let len = 3 << 20;
    client
        .put_from("old", &pattern(len, 1), &ReplicateConfig::default())
        .unwrap();
    client.remove("old", true).unwrap();
    let reused = wait_until(Duration::from_secs(5), || {
        client
            .put_from("new", &pattern(len, 2), &ReplicateConfig::default())
            .is_ok()
    });
    assert!(reused, "the removed range was never reused");
    master.kill();
    let master = restart(&master);
    wait_reattached(&master);
    assert_eq!(
        read(&client, "old", len, 1),
        Read::Missing(ErrorCode::ObjectNotFound),
        "the removal was durable before its range was reused"
    );
    let new = read(&client, "new", len, 2);
    assert!(matches!(new, Read::Exact | Read::Missing(_)), "{new:?}");
}
