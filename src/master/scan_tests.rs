//! Whole-table scans on a large table, through the RPC server: they run in slices, so calls
//! of other clients go on meanwhile.

use super::remote::{self, RpcMasterClient};
use super::tests::segment;
use super::{MasterApi, MasterConfig, MasterService, RemoteMaster};
use crate::rpc::Timeouts;
use crate::types::{ReplicateConfig, Uuid};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const OBJECTS: usize = 1_000_000;

fn connect(addr: &str, request: Duration) -> RemoteMaster<RpcMasterClient> {
    let timeouts = Timeouts {
        connect: Duration::from_secs(3),
        request,
    };
    RemoteMaster(RpcMasterClient::with_timeouts(addr, timeouts).unwrap())
}

#[test]
fn a_remove_all_of_a_million_keys_never_delays_a_ping_past_its_timeout() {
    let service = MasterService::new(MasterConfig::default());
    let owner = Uuid::random();
    service
        .mount_segment(owner, segment("scan-owner", 1 << 40))
        .unwrap();
    for first in (0..OBJECTS).step_by(1000) {
        let keys: Vec<String> = (first..first + 1000)
            .map(|i| format!("scan-{i:08}"))
            .collect();
        let grants = service
            .batch_put_start(
                owner,
                keys.clone(),
                vec![64; 1000],
                ReplicateConfig::default(),
            )
            .unwrap();
        let tokens = grants.into_iter().map(|g| g.unwrap().token).collect();
        let ends = service.batch_put_end(owner, keys, tokens).unwrap();
        assert!(ends.iter().all(Result::is_ok));
        service.ping(owner).unwrap();
    }
    let server = remote::serve("127.0.0.1:0".parse().unwrap(), service.clone()).unwrap();
    let addr = server.local_addr().to_string();
    let ping_timeout = Duration::from_millis(crate::env::PING_TIMEOUT_MS.get());
    let rpc_timeout = Duration::from_millis(crate::env::RPC_TIMEOUT_MS.get());
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

#[test]
fn a_scan_past_its_budget_answers_try_again_and_a_new_call_removes_the_rest() {
    let service = MasterService::new(MasterConfig {
        scan_budget_ms: 1,
        ..MasterConfig::default()
    });
    let owner = Uuid::random();
    service
        .mount_segment(owner, segment("budget-owner", 1 << 30))
        .unwrap();
    const KEYS: usize = 200_000;
    for first in (0..KEYS).step_by(1000) {
        let keys: Vec<String> = (first..first + 1000)
            .map(|i| format!("budget-{i:07}"))
            .collect();
        let grants = service
            .batch_put_start(
                owner,
                keys.clone(),
                vec![64; 1000],
                ReplicateConfig::default(),
            )
            .unwrap();
        let tokens = grants.into_iter().map(|g| g.unwrap().token).collect();
        service.batch_put_end(owner, keys, tokens).unwrap();
    }
    let mut calls = 0;
    let mut try_again = 0;
    // Each call removes at least one slice: bounded by the table's slots.
    let finished = loop {
        calls += 1;
        assert!(calls < 100_000, "no progress");
        match service.remove_all(true) {
            Ok(removed) => break removed,
            Err(code) => {
                assert_eq!(code, crate::error::ErrorCode::TryAgain);
                assert!(crate::error::last_error_message().contains("call again"));
                try_again += 1;
            }
        }
    };
    assert!(try_again > 0, "200 000 removals take more than 1 ms");
    assert_eq!(service.metrics().scan_removed, KEYS as u64, "each key once");
    assert!(finished < KEYS as u64);
    assert_eq!(service.metrics().objects, 0);
}
