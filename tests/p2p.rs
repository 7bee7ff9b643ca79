//! P2P (V3) deployment on 127.0.0.1 with the real binaries: a `mooncake_master
//! --deployment_mode P2P`, `mooncake_client --deployment_mode P2P` owners, and in-process
//! accessors. Every wait is bounded.

mod common;

use common::{p2p_accessor, pattern, wait_until, Master, P2pOwnerProcess};
use mooncake_rs::error::ErrorCode;
use mooncake_rs::p2p::{
    P2pClient, PeerApi, PeerInterface, RemotePeer, RequestOptions, TransferDirection,
};
use mooncake_rs::rpc::{RpcClient, Timeouts};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const FORWARD: TransferDirection = TransferDirection::Forward;
const REVERSE: TransferDirection = TransferDirection::Reverse;

fn to(owner: &P2pOwnerProcess, direction: Option<TransferDirection>) -> RequestOptions {
    RequestOptions {
        direction,
        preferred_owner: Some(owner.name.clone()),
    }
}

fn with(direction: TransferDirection) -> RequestOptions {
    RequestOptions::direction(direction)
}

fn peer(owner: &P2pOwnerProcess) -> RemotePeer<RpcClient<PeerInterface>> {
    RemotePeer(RpcClient::new(&owner.rpc_addr, Timeouts::default()))
}

fn setup(owner_flags: &[&str]) -> (Master, P2pOwnerProcess, P2pClient) {
    let master = Master::start(&["--deployment_mode=P2P"]);
    let owner = P2pOwnerProcess::start(&master.addr(), owner_flags, &[]);
    let accessor = p2p_accessor(&master.addr(), REVERSE);
    (master, owner, accessor)
}

#[test]
fn both_directions_and_mixed_requests_are_byte_exact() {
    let (_master, owner, client) = setup(&[]);
    for (i, direction) in [FORWARD, REVERSE].into_iter().enumerate() {
        for (j, size) in [1usize, 4096, 3 << 20].into_iter().enumerate() {
            let key = format!("single-{i}-{j}");
            let value = pattern(size, (i * 7 + j) as u8);
            client
                .put(&key, &value, &to(&owner, Some(direction)))
                .unwrap();
            for read in [FORWARD, REVERSE] {
                assert_eq!(
                    client.get(&key, &with(read)).unwrap(),
                    value,
                    "{key} {read:?}"
                );
                let mut exact = vec![0u8; size + 10];
                assert_eq!(
                    client.get_into(&key, &mut exact, &with(read)).unwrap(),
                    size as u64
                );
                assert_eq!(&exact[..size], &value[..]);
            }
        }
        let keys: Vec<String> = (0..8).map(|k| format!("batch-{i}-{k}")).collect();
        let values: Vec<Vec<u8>> = (0..8).map(|k| pattern(1000 + k * 4097, k as u8)).collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let value_refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let put = client.batch_put(&key_refs, &value_refs, &to(&owner, Some(direction)));
        assert!(put.iter().all(Result::is_ok), "{put:?}");
        for read in [FORWARD, REVERSE] {
            let got = client.batch_get(&key_refs, &with(read));
            for (got, want) in got.into_iter().zip(&values) {
                assert_eq!(&got.unwrap(), want);
            }
            let mut outs: Vec<Vec<u8>> = values.iter().map(|v| vec![0; v.len()]).collect();
            let mut views: Vec<&mut [u8]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
            let sizes = client.batch_get_into(&key_refs, &mut views, &with(read));
            assert!(sizes.iter().all(Result::is_ok));
            assert_eq!(outs, values);
        }
    }
    // The client default (REVERSE) applies when a request does not choose.
    let before = client.counters();
    client.put("default", b"dflt", &to(&owner, None)).unwrap();
    assert_eq!(
        client.get("default", &RequestOptions::default()).unwrap(),
        b"dflt"
    );
    let after = client.counters();
    assert_eq!(after.reverse_puts - before.reverse_puts, 1);
    assert_eq!(after.reverse_gets - before.reverse_gets, 1);
    assert_eq!(after.forward_puts, before.forward_puts);
    // Existence, size, duplicates, removal.
    assert!(client.is_exist("default").unwrap());
    assert_eq!(client.get_size("default").unwrap(), 4);
    assert_eq!(
        client.put("default", b"again", &to(&owner, Some(FORWARD))),
        Err(ErrorCode::ObjectAlreadyExists)
    );
    client.remove("default").unwrap();
    assert!(!client.is_exist("default").unwrap());
    assert_eq!(
        client.get("default", &with(FORWARD)),
        Err(ErrorCode::ObjectNotFound)
    );
    let mut small = [0u8; 2];
    assert_eq!(
        client.get_into("single-0-1", &mut small, &with(FORWARD)),
        Err(ErrorCode::InvalidParams)
    );
    let owner_side = client.owner_counters(&owner.name).unwrap();
    assert_eq!(owner_side.pin_records, owner_side.pin_records.min(64));
    assert!(owner_side.reverse_writes_served >= 9 && owner_side.reverse_reads_served >= 9);
    assert_eq!(owner_side.pending_records, 0);
}

#[test]
fn forward_write_killed_mid_transfer_is_revoked_and_reclaimed() {
    let (_master, owner, client) = setup(&[]);
    let base = client.owner_counters(&owner.name).unwrap();
    client.faults().fail_next_transfers(1);
    let value = pattern(2 << 20, 3);
    assert_eq!(
        client.put("killed", &value, &to(&owner, Some(FORWARD))),
        Err(ErrorCode::TransferFail),
        "the caller gets the original transfer error"
    );
    assert!(!client.is_exist("killed").unwrap());
    assert_eq!(
        client.get("killed", &with(REVERSE)),
        Err(ErrorCode::ObjectNotFound)
    );
    let after = client.owner_counters(&owner.name).unwrap();
    assert_eq!(after.pending_revoked - base.pending_revoked, 1);
    assert_eq!(after.pending_records, 0);
    assert_eq!(
        after.tier_bytes_used,
        base.tier_bytes_used + (2 << 20),
        "the revoked range is quarantined, not reused at once (its write may still land)"
    );
    assert_eq!(
        after.quarantined_allocations - base.quarantined_allocations,
        1
    );
    assert_eq!(client.counters().revokes_sent, 1);
    // A failed FORWARD read releases its pin with UnPinKey.
    client
        .put("read-me", &value, &to(&owner, Some(REVERSE)))
        .unwrap();
    client.faults().fail_next_transfers(1);
    assert_eq!(
        client.get("read-me", &with(FORWARD)),
        Err(ErrorCode::TransferFail)
    );
    assert_eq!(client.counters().unpins_sent, 1);
    let after = client.owner_counters(&owner.name).unwrap();
    assert_eq!(after.pins_released - base.pins_released, 1);
    assert_eq!(after.pin_records, 0);
    // The key can be written again at once.
    client
        .put("killed", &value, &to(&owner, Some(FORWARD)))
        .unwrap();
    assert_eq!(client.get("killed", &with(FORWARD)).unwrap(), value);
}

#[test]
fn lease_expiry_before_commit_and_scan_reclaim_are_counted() {
    let flags = [
        "--p2p_key_lease_duration_ms=300",
        "--p2p_key_lease_scan_interval_ms=50",
    ];
    let master = Master::start(&["--deployment_mode=P2P"]);
    let owner = P2pOwnerProcess::start(
        &master.addr(),
        &flags,
        &[(mooncake_rs::p2p::QUARANTINE_ENV, "200")],
    );
    let client = p2p_accessor(&master.addr(), REVERSE);
    let base = client.owner_counters(&owner.name).unwrap();
    client.faults().delay_commits(Duration::from_millis(600));
    let value = pattern(100_000, 9);
    assert_eq!(
        client.put("late", &value, &to(&owner, Some(FORWARD))),
        Err(ErrorCode::LeaseExpired)
    );
    client.faults().delay_commits(Duration::ZERO);
    assert!(!client.is_exist("late").unwrap());
    assert!(wait_until(Duration::from_secs(3), || {
        client.owner_counters(&owner.name).unwrap().tier_bytes_used == base.tier_bytes_used
    }));
    let after = client.owner_counters(&owner.name).unwrap();
    assert_eq!(after.pending_committed, base.pending_committed);
    assert_eq!(
        after.pending_reclaimed_by_scan + after.pending_reclaimed_in_stage
            - base.pending_reclaimed_by_scan
            - base.pending_reclaimed_in_stage,
        1
    );
    // Pins of successful FORWARD reads are never unpinned: the scan reclaims them.
    client
        .put("pinned", &value, &to(&owner, Some(REVERSE)))
        .unwrap();
    for _ in 0..3 {
        assert_eq!(client.get("pinned", &with(FORWARD)).unwrap(), value);
    }
    let pinned = client.owner_counters(&owner.name).unwrap();
    assert_eq!(pinned.pin_records, 1);
    assert_eq!(client.counters().unpins_sent, 0);
    assert!(wait_until(Duration::from_secs(3), || {
        let now = client.owner_counters(&owner.name).unwrap();
        now.pin_records == 0 && now.pins_reclaimed_by_scan > base.pins_reclaimed_by_scan
    }));
    // A raw PreWrite that is never finished is reclaimed by the scan, space included.
    let peer = peer(&owner);
    let grant = peer.pre_write("abandoned".into(), 4096).unwrap();
    assert!(grant.lease_ms == 300);
    assert!(wait_until(Duration::from_secs(3), || {
        let now = client.owner_counters(&owner.name).unwrap();
        now.pending_records == 0 && now.tier_bytes_used == pinned.tier_bytes_used
    }));
    assert_eq!(
        peer.write_commit("abandoned".into(), grant.write_operation_id),
        Err(ErrorCode::LeaseExpired)
    );
}

#[test]
fn one_prewrite_wins_stale_ids_are_rejected() {
    let (_master, owner, _client) = setup(&["--p2p_key_lease_duration_ms=400"]);
    let peer = Arc::new(peer(&owner));
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (peer, barrier) = (Arc::clone(&peer), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                peer.pre_write("contended".into(), 1024)
            })
        })
        .collect();
    let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let winners: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    assert!(outcomes
        .iter()
        .filter_map(|o| o.as_ref().err())
        .all(|e| *e == ErrorCode::ObjectReplicaBusy));
    let id = winners[0].write_operation_id;
    assert_eq!(
        peer.write_commit("contended".into(), id + 1),
        Err(ErrorCode::StaleWriteToken)
    );
    assert_eq!(
        peer.write_revoke("contended".into(), id.wrapping_sub(1)),
        Err(ErrorCode::StaleWriteToken)
    );
    // After the lease a new session starts; the old id cannot touch it.
    std::thread::sleep(Duration::from_millis(450));
    let fresh = peer.pre_write("contended".into(), 1024).unwrap();
    assert_ne!(fresh.write_operation_id, id);
    assert_eq!(
        peer.write_commit("contended".into(), id),
        Err(ErrorCode::StaleWriteToken)
    );
    peer.write_commit("contended".into(), fresh.write_operation_id)
        .unwrap();
    assert_eq!(
        peer.pre_write("contended".into(), 1024).err(),
        Some(ErrorCode::ObjectAlreadyExists)
    );
    let pin = peer.pin_key("contended".into()).unwrap();
    assert_eq!(
        peer.un_pin_key("contended".into(), pin.read_operation_id + 1),
        Err(ErrorCode::InvalidRead)
    );
    peer.un_pin_key("contended".into(), pin.read_operation_id)
        .unwrap();
    assert_eq!(
        peer.un_pin_key("contended".into(), pin.read_operation_id),
        Err(ErrorCode::LeaseExpired),
        "already clean"
    );
    assert!(peer.counters().unwrap().stale_operations_rejected >= 4);
}

#[test]
fn concurrent_forward_readers_share_one_pin() {
    let (_master, owner, client) = setup(&[]);
    let value = pattern(1 << 20, 5);
    client
        .put("hot", &value, &to(&owner, Some(FORWARD)))
        .unwrap();
    let base = client.owner_counters(&owner.name).unwrap();
    let barrier = Arc::new(Barrier::new(8));
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let (client, barrier, value) = (client.clone(), Arc::clone(&barrier), value.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..5 {
                    assert_eq!(client.get("hot", &with(FORWARD)).unwrap(), value);
                }
            })
        })
        .collect();
    readers.into_iter().for_each(|r| r.join().unwrap());
    let after = client.owner_counters(&owner.name).unwrap();
    assert_eq!(after.pins_created - base.pins_created, 1);
    assert_eq!(after.pins_renewed - base.pins_renewed, 39);
    assert_eq!(after.pin_records, 1);
    assert_eq!(client.counters().unpins_sent, 0);
}

#[test]
fn killed_owner_fails_fast_and_the_master_drops_its_keys() {
    let (_master, mut owner, client) = setup(&[]);
    client
        .put("doomed", b"bytes", &to(&owner, Some(REVERSE)))
        .unwrap();
    assert_eq!(client.get("doomed", &with(FORWARD)).unwrap(), b"bytes");
    owner.kill();
    for direction in [FORWARD, REVERSE] {
        let started = Instant::now();
        let got = client.get("doomed", &with(direction));
        assert!(
            matches!(
                got,
                Err(ErrorCode::RpcFail | ErrorCode::RpcTimeout | ErrorCode::ObjectNotFound)
            ),
            "{got:?}"
        );
        assert!(started.elapsed() < Timeouts::default().request);
    }
    // client_ttl is 2 s in the harness.
    assert!(wait_until(Duration::from_secs(6), || !client
        .is_exist("doomed")
        .unwrap_or(true)));
    assert_eq!(client.owners().unwrap().len(), 0);
}

#[test]
fn hot_key_reads_from_8_threads_do_not_serialize() {
    let master = Master::start(&["--deployment_mode=P2P"]);
    let delay = 100u64;
    let owner = P2pOwnerProcess::start(
        &master.addr(),
        &[],
        &[(mooncake_rs::p2p::DEBUG_TRANSFER_DELAY_ENV, "100")],
    );
    let client = p2p_accessor(&master.addr(), REVERSE);
    let value = pattern(64 << 10, 1);
    client
        .put("hot", &value, &to(&owner, Some(FORWARD)))
        .unwrap();
    let run = |threads: usize| {
        let barrier = Arc::new(Barrier::new(threads));
        let started = Instant::now();
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (client, barrier) = (client.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    client.get("hot", &with(REVERSE)).unwrap().len()
                })
            })
            .collect();
        let bytes: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        (bytes, started.elapsed())
    };
    let (_, one) = run(1);
    let (bytes, eight) = run(8);
    eprintln!("hot key, {delay} ms owner transfer stage: 1 thread {one:?}, 8 threads {eight:?}");
    assert_eq!(bytes, 8 * value.len());
    assert!(
        eight < Duration::from_millis(delay * 4),
        "8 reads of one key took {eight:?}: the owner serialized them"
    );
}

#[test]
fn setup_errors_are_clear() {
    let master = Master::start(&["--deployment_mode=P2P"]);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_mooncake_client"))
        .args([
            format!("--master_server_address={}", master.addr()),
            "--deployment_mode=P2P".into(),
            r#"--tiered_backend_config={"tiers":[{"type":"NVME","capacity":1}]}"#.into(),
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(
        text.contains("INVALID_PARAMS") && text.contains("NVME"),
        "{text}"
    );
    let bad = mooncake_rs::p2p::P2pClient::setup_p2p(mooncake_rs::p2p::P2pSetupConfig {
        tiered_backend_config_json: "{not json".into(),
        master_server_addr: master.addr(),
        ..Default::default()
    });
    assert_eq!(bad.err(), Some(ErrorCode::InvalidParams));
    // A centralized master refuses P2P clients, and a P2P master refuses segments.
    let centralized = Master::start(&[]);
    let refused = mooncake_rs::p2p::P2pClient::setup_p2p(mooncake_rs::p2p::P2pSetupConfig {
        tiered_backend_config_json: r#"{"tiers":[]}"#.into(),
        master_server_addr: centralized.addr(),
        ..Default::default()
    });
    assert_eq!(refused.err(), Some(ErrorCode::UnavailableInCurrentMode));
    let segment = mooncake_rs::client::Client::setup(mooncake_rs::client::SetupConfig {
        local_hostname: "127.0.0.1".into(),
        master_server_addr: master.addr(),
        ..Default::default()
    });
    assert_eq!(segment.err(), Some(ErrorCode::UnavailableInCurrentMode));
}

fn overlaps(
    a: &mooncake_rs::p2p::RemoteBufferDesc,
    b: &mooncake_rs::p2p::RemoteBufferDesc,
) -> bool {
    a.endpoint == b.endpoint && a.addr < b.addr + b.len && b.addr < a.addr + a.len
}

/// Failure 4: an expired PreWrite's range is not handed out again while the accessor's
/// write may still land in it; a commit with the old id changes nothing; the range does
/// come back once the quarantine has passed.
#[test]
fn expired_prewrite_space_is_quarantined_before_reuse() {
    let master = Master::start(&["--deployment_mode=P2P"]);
    let owner = P2pOwnerProcess::start(
        &master.addr(),
        &[
            "--p2p_key_lease_duration_ms=200",
            "--p2p_key_lease_scan_interval_ms=50",
        ],
        &[(mooncake_rs::p2p::QUARANTINE_ENV, "3000")],
    );
    let peer = peer(&owner);
    let size = 64 << 10;
    let base = peer.counters().unwrap().tier_bytes_used;
    let old = peer.pre_write("q".into(), size).unwrap();
    assert!(wait_until(Duration::from_secs(3), || {
        peer.counters().unwrap().pending_records == 0
    }));
    let fresh = peer.pre_write("q".into(), size).unwrap();
    assert!(
        !overlaps(&old.buffer, &fresh.buffer),
        "an expired PreWrite's range was handed out again at once: {:?} / {:?}",
        old.buffer,
        fresh.buffer
    );
    assert_eq!(
        peer.counters().unwrap().tier_bytes_used,
        base + 2 * size,
        "the old range is held in quarantine"
    );
    assert_eq!(
        peer.write_commit("q".into(), old.write_operation_id),
        Err(ErrorCode::StaleWriteToken)
    );
    assert_eq!(
        peer.counters().unwrap().pending_records,
        1,
        "nothing changed"
    );
    peer.write_commit("q".into(), fresh.write_operation_id)
        .unwrap();
    assert_eq!(peer.remove_data(vec!["q".into()]).unwrap(), vec![Ok(())]);
    assert!(
        wait_until(Duration::from_secs(10), || {
            peer.counters().unwrap().tier_bytes_used == base
        }),
        "the quarantined space comes back"
    );
    let again = peer.pre_write("q2".into(), size).unwrap();
    assert_eq!(
        again.buffer.addr, old.buffer.addr,
        "the old range is reusable"
    );
    peer.write_revoke("q2".into(), again.write_operation_id)
        .unwrap();
    assert_eq!(
        peer.counters().unwrap().tier_bytes_used,
        base + size,
        "a revoked PreWrite is quarantined too"
    );
}

/// Failure 9 (1): after `remove`, an accessor with a cached route gets OBJECT_NOT_FOUND over
/// FORWARD, as over REVERSE — not the removed value.
#[test]
fn removed_key_is_hidden_from_cached_forward_routes() {
    let (master, owner, writer) = setup(&[]);
    let reader = p2p_accessor(&master.addr(), FORWARD);
    let value = pattern(100_000, 4);
    writer
        .put("gone", &value, &to(&owner, Some(REVERSE)))
        .unwrap();
    assert_eq!(reader.get("gone", &with(FORWARD)).unwrap(), value);
    writer.remove("gone").unwrap();
    let mut buffer = vec![0u8; value.len()];
    assert_eq!(
        reader.get_into("gone", &mut buffer, &with(FORWARD)),
        Err(ErrorCode::ObjectNotFound)
    );
    assert_eq!(
        reader.get_into("gone", &mut buffer, &with(REVERSE)),
        Err(ErrorCode::ObjectNotFound)
    );
    assert_eq!(
        peer(&owner).pin_key("gone".into()).err(),
        Some(ErrorCode::ObjectNotFound)
    );
}

/// Failure 9 (2): remove + re-put of a hot key while FORWARD gets continue: the old values'
/// space comes back once their readers' leases end (nothing leaks), and every read returns
/// one whole generation.
#[test]
fn hot_key_remove_and_reput_does_not_leak_tier_space() {
    let flags = [
        "--p2p_key_lease_duration_ms=300",
        "--p2p_key_lease_scan_interval_ms=50",
    ];
    let (master, owner, writer) = setup(&flags);
    let size = 256 << 10;
    let generations: Vec<Vec<u8>> = (0..8).map(|g| pattern(size, g as u8 * 17 + 1)).collect();
    let base = writer.owner_counters(&owner.name).unwrap().tier_bytes_used;
    writer
        .put("hot", &generations[0], &to(&owner, Some(FORWARD)))
        .unwrap();
    let live = writer.owner_counters(&owner.name).unwrap().tier_bytes_used - base;
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, reads, generations) =
            (Arc::clone(&stop), Arc::clone(&reads), generations.clone());
        let client = p2p_accessor(&master.addr(), FORWARD);
        std::thread::spawn(move || {
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(30) {
                match client.get("hot", &with(FORWARD)) {
                    Ok(got) => {
                        assert!(generations.contains(&got), "a read mixed generations");
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(code) => assert!(
                        matches!(code, ErrorCode::ObjectNotFound | ErrorCode::LeaseExpired),
                        "{code:?}"
                    ),
                }
            }
        })
    };
    let progressed = |since: u64| {
        wait_until(Duration::from_secs(5), || {
            reads.load(Ordering::Relaxed) > since
        })
    };
    for generation in &generations[1..] {
        assert!(
            progressed(reads.load(Ordering::Relaxed)),
            "the reader is stuck"
        );
        writer.remove("hot").unwrap();
        writer
            .put("hot", generation, &to(&owner, Some(FORWARD)))
            .unwrap();
    }
    let settled = wait_until(Duration::from_secs(5), || {
        writer.owner_counters(&owner.name).unwrap().tier_bytes_used == base + live
    });
    let used = writer.owner_counters(&owner.name).unwrap().tier_bytes_used;
    assert!(
        progressed(reads.load(Ordering::Relaxed)),
        "reads continued meanwhile"
    );
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    assert!(
        settled,
        "old values leak while the key stays hot: {used} bytes used, live value {live}"
    );
}

/// Failure 9 (3): a FORWARD reader that is mid-read when the key is removed and re-put with
/// a same-size value gets the complete old bytes (its pin keeps them), never the new ones.
#[test]
fn forward_reader_mid_read_during_remove_gets_old_bytes_or_an_error() {
    let (master, owner, writer) = setup(&[]);
    let old = pattern(1 << 20, 21);
    let new = pattern(1 << 20, 99);
    writer
        .put("swap", &old, &to(&owner, Some(FORWARD)))
        .unwrap();
    let reader = p2p_accessor(&master.addr(), FORWARD);
    reader.faults().delay_reads(Duration::from_millis(500));
    let before = writer.owner_counters(&owner.name).unwrap();
    let pending = {
        let reader = reader.clone();
        std::thread::spawn(move || reader.get("swap", &with(FORWARD)))
    };
    assert!(wait_until(Duration::from_secs(3), || {
        let now = writer.owner_counters(&owner.name).unwrap();
        now.pins_created + now.pins_renewed > before.pins_created + before.pins_renewed
    }));
    writer.remove("swap").unwrap();
    writer
        .put("swap", &new, &to(&owner, Some(FORWARD)))
        .unwrap();
    match pending.join().unwrap() {
        Ok(got) => assert!(got == old, "the reader got bytes of the new value"),
        Err(code) => assert_ne!(code, ErrorCode::InternalError),
    }
    reader.faults().delay_reads(Duration::ZERO);
    assert_eq!(reader.get("swap", &with(FORWARD)).unwrap(), new);
}
