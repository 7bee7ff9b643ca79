//! A `remove_all` of 1 M keys through the RPC server while another client pings every
//! millisecond: the scan runs in slices (`ObjectTable::scan_in_slices`), so every ping is
//! answered within `MC_PING_TIMEOUT_MS` and the scan within `MC_RPC_TIMEOUT_MS`, and
//! `scan_removed_total` counts its progress; a scan past `scan_budget_ms` answers `TRY_AGAIN`
//! and a new call removes the rest. Its own process: the 1 M puts would disturb the timing of
//! other tests.

use mooncake_rs::error::{last_error_message, ErrorCode};
use mooncake_rs::master::RpcMasterClient;
use mooncake_rs::master::{remote, MasterApi, MasterConfig, MasterService, RemoteMaster};
use mooncake_rs::rpc::Timeouts;
use mooncake_rs::types::{ReplicateConfig, Segment, Uuid};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A knob's value in ms as the library reads it (default when unset).
fn knob_ms(name: &str, default: u64) -> Duration {
    let ms = std::env::var(name).ok().and_then(|v| v.parse().ok());
    Duration::from_millis(ms.filter(|&ms| ms > 0).unwrap_or(default))
}

/// A master with one 1 TiB segment (owned by no real process) and its owner.
fn master(config: MasterConfig) -> (std::sync::Arc<MasterService>, Uuid) {
    let service = MasterService::new(config);
    let owner = Uuid::random();
    let segment = Segment {
        id: Uuid::random(),
        name: "scan-owner".into(),
        base: 1 << 30,
        size: 1 << 40,
        protocol: "tcp".into(),
        epoch: 1,
    };
    service.mount_segment(owner, segment).unwrap();
    (service, owner)
}

/// Puts `keys` (64 B each) in one call; the owner pings after it.
fn put_keys(service: &MasterService, owner: Uuid, keys: Vec<String>) {
    let sizes = vec![64; keys.len()];
    let grants = service
        .batch_put_start(owner, keys.clone(), sizes, ReplicateConfig::default())
        .unwrap();
    let tokens = grants.into_iter().map(|g| g.unwrap().token).collect();
    let ends = service.batch_put_end(owner, keys, tokens).unwrap();
    assert!(ends.iter().all(Result::is_ok));
    service.ping(owner).unwrap();
}

/// Puts `objects` objects of 64 B, 1 000 per call.
fn fill(service: &MasterService, owner: Uuid, objects: usize) {
    for first in (0..objects).step_by(1000) {
        let keys = (first..first + 1000).map(|i| format!("scan-{i:08}"));
        put_keys(service, owner, keys.collect());
    }
}

fn connect(addr: &str, request: Duration) -> RemoteMaster<RpcMasterClient> {
    let timeouts = Timeouts {
        connect: Duration::from_secs(3),
        request,
    };
    RemoteMaster(RpcMasterClient::with_timeouts(addr, timeouts).unwrap())
}

const OBJECTS: usize = 1_000_000;

#[test]
fn a_remove_all_of_a_million_keys_never_delays_a_ping_past_its_timeout() {
    let (service, owner) = master(MasterConfig::default());
    fill(&service, owner, OBJECTS);
    let server = remote::serve("127.0.0.1:0".parse().unwrap(), service.clone()).unwrap();
    let addr = server.local_addr().to_string();
    let ping_timeout = knob_ms("MC_PING_TIMEOUT_MS", 2000);
    let rpc_timeout = knob_ms("MC_RPC_TIMEOUT_MS", 30_000);
    let stop = AtomicBool::new(false);
    let (slowest_ping, pings, scan, removed) = std::thread::scope(|scope| {
        let pinger = scope.spawn(|| {
            let master = connect(&addr, ping_timeout);
            let (mut slowest, mut pings) = (Duration::ZERO, 0u64);
            // Bounded by the scan (and the count, should it never end).
            while !stop.load(Ordering::Relaxed) && pings < 1_000_000 {
                let sent = Instant::now();
                master
                    .ping(owner)
                    .expect("a ping within MC_PING_TIMEOUT_MS");
                slowest = slowest.max(sent.elapsed());
                pings += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            (slowest, pings)
        });
        let scanner = connect(&addr, rpc_timeout);
        let started = Instant::now();
        let removed = scanner.remove_all(true);
        let scan = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        let (slowest, pings) = pinger.join().unwrap();
        (slowest, pings, scan, removed)
    });
    assert_eq!(removed, Ok(OBJECTS as u64), "within MC_RPC_TIMEOUT_MS");
    assert!(scan < rpc_timeout, "{scan:?}");
    assert!(slowest_ping < ping_timeout, "{slowest_ping:?}");
    assert!(pings > 0);
    assert_eq!(service.metrics().scan_removed, OBJECTS as u64, "progress");
    assert_eq!(service.metrics().objects, 0);
    eprintln!("remove_all of {OBJECTS}: {scan:?}; {pings} pings, the slowest {slowest_ping:?}");
    server.shutdown();
}

/// Keys of the tests whose scans run past a 1 ms budget: more than a scan gets through in it.
const KEYS: usize = 200_000;

/// A master whose scans answer within 1 ms, holding [`KEYS`] objects, and their owner.
fn filled_with_a_1_ms_budget() -> (std::sync::Arc<MasterService>, Uuid) {
    let (service, owner) = master(MasterConfig {
        scan_budget_ms: 1,
        ..MasterConfig::default()
    });
    fill(&service, owner, KEYS);
    (service, owner)
}

#[test]
fn a_scan_past_its_budget_answers_try_again_and_a_new_call_removes_the_rest() {
    let (service, _) = filled_with_a_1_ms_budget();
    let (mut calls, mut try_again) = (0, 0);
    // Each call removes at least one slice: bounded by the table's slots.
    let last = loop {
        calls += 1;
        assert!(calls < 100_000, "no progress");
        match service.remove_all(true) {
            Ok(removed) => break removed,
            Err(code) => {
                assert_eq!(code, ErrorCode::TryAgain);
                assert!(last_error_message().contains("call again"));
                try_again += 1;
            }
        }
    };
    assert!(try_again > 0, "200 000 removals take more than 1 ms");
    assert_eq!(service.metrics().scan_removed, KEYS as u64, "each key once");
    // Each call starts where the last stopped: the slots are visited about twice in all
    // (once emptied, once more by the last call's way around).
    let visited = service.metrics().scan_slots;
    assert!(
        visited < 3 * KEYS as u64,
        "{visited} slot visits for {KEYS} keys in {calls} calls"
    );
    assert!(last < KEYS as u64);
    assert_eq!(service.metrics().objects, 0);
}

/// Calls `remove` until it answers a count (at most 100 000 calls); returns that count.
fn until_done(mut remove: impl FnMut() -> Result<u64, ErrorCode>) -> u64 {
    for _ in 0..100_000 {
        match remove() {
            Ok(removed) => return removed,
            Err(code) => assert_eq!(code, ErrorCode::TryAgain),
        }
    }
    panic!("no progress");
}

#[test]
fn objects_put_between_the_calls_of_a_stopped_removal_are_removed_by_its_last_call() {
    let (service, owner) = filled_with_a_1_ms_budget();
    assert_eq!(service.remove_all(true), Err(ErrorCode::TryAgain));
    // New objects take the slots the first call emptied, behind where it stopped.
    let late: Vec<String> = (0..1000).map(|i| format!("late-{i:04}")).collect();
    put_keys(&service, owner, late.clone());
    until_done(|| service.remove_all(true));
    // A call that answers a count went once around the whole table.
    assert_eq!(service.metrics().objects, 0);
    let exist = service.batch_exist_key(late).unwrap();
    assert!(exist.iter().all(|e| *e == Ok(false)));
}

#[test]
fn two_removals_taking_turns_both_end() {
    let (service, _) = filled_with_a_1_ms_budget();
    // Keys scan-00000000..scan-00199999: the even ones and the odd ones.
    let (mut even, mut odd) = (None, None);
    for _ in 0..100_000 {
        if even.is_none() {
            even = service
                .remove_by_regex("^scan-[0-9]*[02468]$".into(), true)
                .ok();
        }
        if odd.is_none() {
            odd = service
                .remove_by_regex("^scan-[0-9]*[13579]$".into(), true)
                .ok();
        }
        if even.is_some() && odd.is_some() {
            break;
        }
    }
    assert!(even.is_some() && odd.is_some(), "a removal never ended");
    assert_eq!(service.metrics().objects, 0);
    assert_eq!(service.metrics().scan_removed, KEYS as u64);
}
