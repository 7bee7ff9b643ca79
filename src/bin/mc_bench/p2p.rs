//! P2P (V3) scenarios: FORWARD vs REVERSE put/get throughput for 1 MiB and 16 MiB values
//! between two processes (against raw loopback TCP), PreWrite→WriteCommit and PinKey round
//! trips (against the raw 64-byte round trip), and hot-key read scaling with 1–8 threads.

use crate::interleave::judge;
use crate::limits::{Pool, RawTcp};
use crate::report::Report;
use crate::scenarios::{gbps, p50_for, raw_gbps, raw_rtt, spawn_child, Rounds, MIB};
use mooncake_rs::master::{MasterConfig, MasterService};
use mooncake_rs::p2p::{
    P2pClient, P2pSetupConfig, PeerApi, PeerInterface, RemotePeer, RequestOptions,
    TransferDirection,
};
use mooncake_rs::rpc::{RpcClient, Timeouts};
use mooncake_rs::types::DeploymentMode;
use std::io::Read;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const TIERS: &str =
    r#"{"tiers":[{"type":"DRAM","capacity":1073741824,"priority":100,"allocator_type":"OFFSET"}]}"#;

/// Child mode: a P2P owner of `args[0]`'s master with a 1 GiB DRAM tier; prints
/// `READY <name> <rpc addr>`, serves until stdin closes.
pub fn serve_owner(args: &[String]) -> i32 {
    let Some(master) = args.first() else {
        eprintln!("usage: mc_bench --serve-p2p-owner <master addr>");
        return 2;
    };
    let client = match P2pClient::setup_p2p(P2pSetupConfig {
        tiered_backend_config_json: TIERS.into(),
        local_buffer_size: 0,
        master_server_addr: master.clone(),
        ..P2pSetupConfig::default()
    }) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("P2P owner setup failed: {e}");
            return 1;
        }
    };
    let rpc = client.owner_info().map(|o| o.rpc_addr).unwrap_or_default();
    println!("READY {} {rpc}", client.hostname());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    client.teardown();
    0
}

fn name(direction: TransferDirection) -> &'static str {
    match direction {
        TransferDirection::Forward => "FORWARD",
        TransferDirection::Reverse => "REVERSE",
    }
}

/// GB/s of puts of `size`-byte values (fresh keys; removal untimed) for about `duration`.
fn put_rate(
    client: &P2pClient,
    options: &RequestOptions,
    size: usize,
    duration: Duration,
) -> Result<f64, String> {
    let src = Pool::new(2, size, 4);
    let (mut busy, mut bytes, mut i) = (0.0, 0u64, 0usize);
    let start = Instant::now();
    while start.elapsed() < duration {
        let key = format!("bench-put-{i}");
        let t = Instant::now();
        client
            .put(&key, &src.bufs[i % 2], options)
            .map_err(|e| format!("p2p put: {e}"))?;
        busy += t.elapsed().as_secs_f64();
        bytes += size as u64;
        client
            .remove(&key)
            .map_err(|e| format!("p2p remove: {e}"))?;
        i += 1;
    }
    Ok(gbps(bytes, busy))
}

/// GB/s of gets of `key` (`size` bytes) from `threads` threads for about `duration`.
fn get_rate(
    client: &P2pClient,
    key: &str,
    size: usize,
    direction: TransferDirection,
    threads: usize,
    duration: Duration,
) -> Result<f64, String> {
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (client, barrier, key) = (client.clone(), Arc::clone(&barrier), key.to_string());
            std::thread::spawn(move || -> Result<u64, String> {
                let mut buf = vec![0u8; size];
                let options = RequestOptions::direction(direction);
                barrier.wait();
                let (start, mut bytes) = (Instant::now(), 0u64);
                while start.elapsed() < duration {
                    client
                        .get_into(&key, &mut buf, &options)
                        .map_err(|e| format!("p2p get: {e}"))?;
                    bytes += size as u64;
                }
                Ok(bytes)
            })
        })
        .collect();
    let start = Instant::now();
    let mut bytes = 0;
    for worker in workers {
        bytes += worker.join().map_err(|_| "reader panicked")??;
    }
    Ok(gbps(bytes, start.elapsed().as_secs_f64()))
}

/// Runs the P2P scenarios against an in-process P2P master and one owner child process.
pub fn run(report: &mut Report, rounds: Rounds) -> Result<(), String> {
    let duration = rounds.duration;
    let mut raw = RawTcp::connect().map_err(|e| format!("raw tcp: {e}"))?;
    let service = MasterService::new(MasterConfig {
        deployment_mode: DeploymentMode::P2p,
        ..MasterConfig::default()
    });
    let rpc = crate::scenarios::serve_master(service.clone())?;
    let master = rpc.local_addr().to_string();
    let (owner, line) = spawn_child(&["--serve-p2p-owner", &master])?;
    let (owner_name, owner_rpc) = line.split_once(' ').ok_or("owner READY line")?;
    let client = P2pClient::setup_p2p(P2pSetupConfig {
        tiered_backend_config_json: r#"{"tiers":[]}"#.into(),
        local_buffer_size: 64 * MIB as u64,
        master_server_addr: master.clone(),
        ..P2pSetupConfig::default()
    })
    .map_err(|e| format!("accessor setup: {e}"))?;
    let directions = [TransferDirection::Forward, TransferDirection::Reverse];
    for (size, label, limit_name) in [
        (MIB, "1MiB", "raw tcp 1 stream 1MiB"),
        (16 * MIB, "16MiB", "raw tcp 1 stream 16MiB"),
    ] {
        let key = format!("bench-get-{label}");
        let value = vec![5u8; size];
        let to_owner = RequestOptions {
            direction: Some(TransferDirection::Forward),
            preferred_owner: Some(owner_name.to_string()),
        };
        client
            .put(&key, &value, &to_owner)
            .map_err(|e| format!("p2p put {key}: {e}"))?;
        for direction in directions {
            let options = RequestOptions {
                direction: Some(direction),
                ..to_owner.clone()
            };
            let scenario = format!("p2p {} put {label}", name(direction));
            judge(
                report,
                &rounds.judged(&scenario, "GB/s", limit_name),
                raw_gbps(&mut raw, size, duration),
                || put_rate(&client, &options, size, duration),
            )?;
            let scenario = format!("p2p {} get {label}", name(direction));
            judge(
                report,
                &rounds.judged(&scenario, "GB/s", limit_name),
                raw_gbps(&mut raw, size, duration),
                || get_rate(&client, &key, size, direction, 1, duration),
            )?;
        }
    }
    let peer = RemotePeer(RpcClient::<PeerInterface>::new(
        owner_rpc,
        Timeouts::default(),
    ));
    let mut staged = 0usize;
    judge(
        report,
        &rounds.judged(
            "p2p PreWrite+WriteCommit p50",
            "us",
            "2 x raw tcp 64B rtt p50",
        ),
        raw_rtt(&mut raw, 64, duration, 2.0),
        || {
            p50_for(duration, |_| {
                let key = format!("bench-stage-{staged}");
                staged += 1;
                let grant = peer
                    .pre_write(key.clone(), 4096)
                    .map_err(|e| format!("PreWrite: {e}"))?;
                peer.write_commit(key, grant.write_operation_id)
                    .map_err(|e| format!("WriteCommit: {e}"))
            })
        },
    )?;
    judge(
        report,
        &rounds.judged("p2p PinKey p50", "us", "raw tcp 64B rtt p50"),
        raw_rtt(&mut raw, 64, duration, 1.0),
        || {
            p50_for(duration, |i| {
                peer.pin_key(format!("bench-stage-{}", i % 64))
                    .map(|_| ())
                    .map_err(|e| format!("PinKey: {e}"))
            })
        },
    )?;
    for direction in directions {
        let mut single = 0.0;
        for threads in [1, 2, 4, 8] {
            let rate = get_rate(&client, "bench-get-1MiB", MIB, direction, threads, duration)?;
            if threads == 1 {
                single = rate;
            }
            let scenario = format!("p2p {} hot key 1MiB x{threads}", name(direction));
            report.line(&scenario, rate, "GB/s", "same path, 1 thread", single);
        }
    }
    client.teardown();
    drop(owner);
    rpc.shutdown();
    service.shutdown();
    Ok(())
}
