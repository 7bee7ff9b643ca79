//! `--load`: 64 client connections issue mixed put/get/exist/remove/ping calls against one
//! in-process master behind a real RPC server while another connection runs `remove_all`
//! over 1 M keys. Prints ping p50/p99 under that load against the idle ping of the same run,
//! and the clients expired (must be 0). Bounded: the load stops one second after the scan,
//! which may take at most [`SCAN_LIMIT`]; every other call at most [`LOAD_LIMIT`].

use crate::limits::{median, percentile};
use crate::report::Report;
use mooncake_rs::master::{MasterApi, MasterConfig, MasterService, RemoteMaster};
use mooncake_rs::master::{RemoteMasterApi, RpcMasterClient};
use mooncake_rs::rpc::Timeouts;
use mooncake_rs::types::{ClientId, ReplicateConfig, Segment, Uuid};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const OBJECTS: usize = 1_000_000;
const CONNECTIONS: usize = 64;
const LOAD_LIMIT: Duration = Duration::from_secs(45);
/// Longest `remove_all` of the 1 M keys under load (35–60 s seen on a busy 2-core VM).
const SCAN_LIMIT: Duration = Duration::from_secs(180);
/// Pause of each worker between rounds.
const PACING: Duration = Duration::from_millis(2);

/// A 1 TiB segment called `name` (epoch 1), owned by no real process.
pub(crate) fn segment(name: &str) -> Segment {
    Segment {
        id: Uuid::random(),
        name: name.into(),
        base: 1 << 30,
        size: 1 << 40,
        protocol: "tcp".into(),
        epoch: 1,
    }
}

/// One put (start + end) of a 64-byte object through `master`.
fn put(master: &dyn MasterApi, client: ClientId, keys: Vec<String>) -> Result<(), String> {
    let sizes = vec![64; keys.len()];
    let grants = master
        .batch_put_start(client, keys.clone(), sizes, ReplicateConfig::default())
        .map_err(|e| format!("put start: {e}"))?;
    let tokens = grants
        .into_iter()
        .map(|g| g.map(|g| g.token))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("put start: {e}"))?;
    master
        .batch_put_end(client, keys, tokens)
        .map_err(|e| format!("put end: {e}"))?;
    Ok(())
}

pub(crate) fn connect(addr: &str, request: Duration) -> Result<RemoteMasterApi, String> {
    let timeouts = Timeouts {
        connect: Duration::from_secs(3),
        request,
    };
    RpcMasterClient::with_timeouts(addr, timeouts)
        .map(RemoteMaster)
        .map_err(|e| format!("connect: {e}"))
}

fn timed_ping(master: &dyn MasterApi, client: ClientId) -> Result<f64, String> {
    let sent = Instant::now();
    master.ping(client).map_err(|e| format!("ping: {e}"))?;
    Ok(sent.elapsed().as_secs_f64() * 1e6)
}

/// A worker: mixed calls (paced by [`PACING`]) until `stop`; returns its ping latencies (µs).
fn worker(addr: &str, index: usize, stop: &AtomicBool) -> Result<Vec<f64>, String> {
    let master = connect(addr, LOAD_LIMIT)?;
    let client = Uuid::random();
    master
        .mount_segment(client, segment(&format!("load-{index}")))
        .map_err(|e| format!("mount: {e}"))?;
    let mut pings = Vec::new();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        pings.push(timed_ping(&master, client)?);
        let key = format!("load-{index}-{round}");
        put(&master, client, vec![key.clone()])?;
        let _ = master.batch_get_replica_list(vec![key.clone()]);
        let _ = master.batch_exist_key(vec![key.clone()]);
        let _ = master.batch_remove(vec![key], true);
        round += 1;
        // Pacing, as inference clients think between calls: 64 tight loops would only
        // measure CPU starvation on a small machine.
        std::thread::sleep(PACING);
    }
    Ok(pings)
}

/// Calls `remove_all(force)` until it answers other than `TRY_AGAIN` (a scan stops after the
/// master's `scan_budget_ms`, 20 s; at most 1 000 calls); returns the calls and the longest.
pub(crate) fn remove_all_until_done(
    master: &dyn MasterApi,
    force: bool,
) -> Result<(u32, Duration), String> {
    let (mut calls, mut longest) = (0, Duration::ZERO);
    loop {
        calls += 1;
        let call = Instant::now();
        let answer = master.remove_all(force);
        longest = longest.max(call.elapsed());
        match answer {
            Ok(_) => return Ok((calls, longest)),
            Err(mooncake_rs::error::ErrorCode::TryAgain) if calls < 1000 => {}
            Err(e) => return Err(format!("remove_all: {e}")),
        }
    }
}

/// Runs the load scenario and prints its lines.
pub fn run(report: &mut Report) -> Result<(), String> {
    let service = MasterService::new(MasterConfig::default());
    let owner = Uuid::random();
    service
        .mount_segment(owner, segment("load-owner"))
        .map_err(|e| format!("mount: {e}"))?;
    for first in (0..OBJECTS).step_by(10_000) {
        let keys = (first..OBJECTS.min(first + 10_000))
            .map(|i| format!("object-{i:08}"))
            .collect();
        put(&*service, owner, keys)?;
    }
    let rpc = crate::scenarios::serve_master(service.clone())?;
    let addr = rpc.local_addr().to_string();
    let idle_master = connect(&addr, LOAD_LIMIT)?;
    let mut idle = (0..2000)
        .map(|_| timed_ping(&idle_master, owner))
        .collect::<Result<Vec<_>, _>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|index| {
            let (addr, stop) = (addr.clone(), Arc::clone(&stop));
            std::thread::spawn(move || worker(&addr, index, &stop))
        })
        .collect();
    let heartbeat = {
        // The owner of the 1 M objects stays alive too (in process, not measured).
        let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = service.ping(owner);
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let scanner = connect(&addr, SCAN_LIMIT)?;
    let started = Instant::now();
    let (calls, longest) = remove_all_until_done(&scanner, true)?;
    // Counted by the master (only this scan removes by scanning).
    let removed = service.metrics().scan_removed;
    let scan_s = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let _ = heartbeat.join();
    let mut loaded = Vec::new();
    for handle in workers {
        loaded.extend(handle.join().map_err(|_| "worker panicked")??);
    }
    let expired = service.metrics().clients_expired;
    rpc.shutdown();
    let (idle_p50, idle_p99) = (median(&mut idle.clone()), percentile(&mut idle, 0.99));
    let name = format!("load ping p50 ({CONNECTIONS} conns, remove_all {removed} keys)");
    report.line(
        &name,
        median(&mut loaded.clone()),
        "us",
        "idle ping p50",
        idle_p50,
    );
    let name = format!(
        "load ping p99 ({} pings, scan {scan_s:.2} s in {calls} calls, longest {:.2} s)",
        loaded.len(),
        longest.as_secs_f64()
    );
    report.line(
        &name,
        percentile(&mut loaded, 0.99),
        "us",
        "idle ping p99",
        idle_p99,
    );
    report.line(
        "load clients expired",
        expired as f64,
        "count",
        "load clients",
        CONNECTIONS as f64,
    );
    Ok(())
}
