//! Rotating the cluster key while the pool serves: a master, a peer and this process read the
//! same key file (its own test binary: one key per process), a writer and a reader run all
//! along, and the file goes from key A to A+B, B+A, then B alone, each step held longer than
//! the second in which processes re-read their file. No call may fail, the processes move
//! their connections to B while A is still accepted, and afterwards a process with B joins
//! and one with A alone is refused.

mod common;

use common::{Launched, Master, PeerClient};
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::types::ReplicateConfig;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const A: &str = "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a";
const B: &str = "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b";
/// How long each step of the rotation is held: past the once-a-second re-read of every process.
const STEP: Duration = Duration::from_millis(2500);

fn write_keys(path: &Path, keys: &[&str]) {
    std::fs::write(path, keys.join("\n") + "\n").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mc-key-rotation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_key_rotated_under_load_fails_no_call() {
    let key = dir().join("cluster.key");
    write_keys(&key, &[A]);
    let flag = format!("--cluster_key_file={}", key.display());
    let master = Master::start(&[&flag]);
    let _peer = PeerClient::spawn(
        &master.addr(),
        "64 MB",
        "P2PHANDSHAKE",
        std::slice::from_ref(&flag),
        &[("MC_SAME_HOST", "0")],
    );
    let client = Arc::new(
        Client::setup(SetupConfig {
            local_hostname: "127.0.0.1".into(),
            global_segment_size: 0,
            local_buffer_size: 16 << 20,
            master_server_addr: master.addr(),
            cluster_key_file: key.display().to_string(),
            ..SetupConfig::default()
        })
        .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (calls, failures) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (client, stop) = (Arc::clone(&client), Arc::clone(&stop));
        let (calls, failures) = (Arc::clone(&calls), Arc::clone(&failures));
        std::thread::spawn(move || {
            // 16 KiB every 5 ms: removed space waits out the write quarantine before reuse.
            let value = vec![0x3cu8; 16 << 10];
            let mut back = vec![0u8; value.len()];
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) && i < 1_000_000 {
                let key = format!("r-{}", i % 64);
                let put = client.put(&key, &value, &ReplicateConfig::default());
                let got = client.get_into(&key, &mut back);
                let removed = client.remove(&key, true);
                let failed = put.is_err() || got.is_err() || removed.is_err() || back != value;
                if failed && failures.fetch_add(1, Ordering::Relaxed) == 0 {
                    let detail = mooncake_rs::error::last_error_message();
                    eprintln!("first failure: {i} {put:?} {got:?} {removed:?}: {detail}");
                }
                calls.fetch_add(3, Ordering::Relaxed);
                i += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    // The master's accepted handshakes at the end of each step (A, A+B, B+A, B).
    let accepted = || -> u64 {
        let metrics = master.http_get("/metrics");
        let line = "mooncake_auth_handshakes_total{result=\"accepted\"} ";
        let found = metrics.lines().find_map(|l| l.strip_prefix(line));
        found.expect("the accepted count").trim().parse().unwrap()
    };
    let mut handshakes = Vec::new();
    for keys in [&[A, B][..], &[B, A], &[B]] {
        std::thread::sleep(STEP);
        handshakes.push(accepted());
        write_keys(&key, keys);
    }
    std::thread::sleep(STEP);
    handshakes.push(accepted());
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let calls = calls.load(Ordering::Relaxed);
    assert!(calls > 30, "the load ran: {calls} calls");
    assert_eq!(failures.load(Ordering::Relaxed), 0, "of {calls} calls");
    // Once B connects, the processes stop reusing connections proven with A: the master
    // accepted new handshakes (with B) during the B+A step.
    assert!(handshakes[2] > handshakes[1], "{handshakes:?}");
    // A process with B alone joins; one with A alone is refused.
    let new_key = dir().join("b.key");
    write_keys(&new_key, &[B]);
    let joined = PeerClient::spawn(
        &master.addr(),
        "16 MB",
        "P2PHANDSHAKE",
        &[format!("--cluster_key_file={}", new_key.display())],
        &[("MC_SAME_HOST", "0")],
    );
    drop(joined);
    let old_key = dir().join("a.key");
    write_keys(&old_key, &[A]);
    let mut args = common::peer_args(&master.addr(), "16 MB", "P2PHANDSHAKE");
    args.push(format!("--cluster_key_file={}", old_key.display()));
    let mut refused = Launched::spawn(env!("CARGO_BIN_EXE_mooncake_client"), &args);
    assert!(
        refused.stderr_shows("AUTH_FAILED", Duration::from_secs(20)),
        "{}",
        refused.stderr()
    );
    assert_eq!(refused.terminate(), Some(1));
}
