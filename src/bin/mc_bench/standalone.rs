//! `mc_bench --standalone`: a dummy's 4 MiB get through its real client (a child process
//! serving dummies, objects in its segment) against one-thread memcpy of the same copies
//! (from [`KEYS`] source blocks into 16 rotating destinations, as the gets), judged with
//! `interleave::judge` (limit, scenario, … for the same duration each; medians, ratios and
//! spreads). Two dummy lines: into shared memory (zero-copy: one memcpy in the real client)
//! and into ordinary memory (staged: a second copy in the dummy); and zero-copy gets from
//! [`THREADS`] threads of the dummy at once against as many threads of memcpy (the threads'
//! GB/s summed; each thread has its own destinations), which shows that one dummy's calls
//! run concurrently (`MC_DUMMY_CONNECTIONS`; set it to 1 to see them serialised).

use crate::interleave::judge;
use crate::limits::{copy_between_gbps, Pool};
use crate::report::Report;
use crate::scenarios::{gbps, spawn_child, Rounds, MIB};
use mooncake_rs::client::{parse_size, Buf, Client, SetupConfig};
use mooncake_rs::master::{MasterConfig, MasterService};
use mooncake_rs::standalone::ShmPool;
use mooncake_rs::types::ReplicateConfig;
use std::io::Read;
use std::time::{Duration, Instant};

const SIZE: usize = 4 * MIB;
const KEYS: usize = 32;
/// Destination blocks the gets rotate over.
const DESTINATIONS: usize = 16;
/// Threads of the concurrent line (each rotates over its share of [`DESTINATIONS`]).
const THREADS: usize = 2;

/// Child mode: a real client with a segment on `args[0]`'s master that serves dummies;
/// prints `READY <name>` and serves until stdin closes.
pub fn serve_real_client(args: &[String]) -> i32 {
    let (Some(master), Some(size)) = (args.first(), args.get(1)) else {
        eprintln!("usage: mc_bench --serve-real-client <master addr> <segment size>");
        return 2;
    };
    let Ok(size) = parse_size(size) else {
        eprintln!("bad size {size}");
        return 2;
    };
    let setup = Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: size,
        local_buffer_size: 0,
        master_server_addr: master.clone(),
        ..SetupConfig::default()
    });
    let client = match setup {
        Ok(c) => c,
        Err(e) => {
            eprintln!("real client setup failed: {e}");
            return 1;
        }
    };
    let server = match client.serve_dummies(master, 0) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("cannot serve dummies: {e}");
            return 1;
        }
    };
    println!("READY {}", client.get_hostname());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(server);
    client.teardown();
    0
}

/// GB/s of 4 MiB gets for `duration`, each into `dst(i)`.
fn gets(client: &Client, duration: Duration, dst: impl Fn(usize) -> usize) -> Result<f64, String> {
    let (mut bytes, mut i) = (0u64, 0usize);
    let start = Instant::now();
    while start.elapsed() < duration {
        let key = format!("sa{}", i % KEYS);
        // SAFETY: `dst(i)` is SIZE writable bytes owned by the caller for the whole run.
        let got = unsafe {
            client.get_into_raw(&[key], vec![vec![Buf::new(dst(i), SIZE as u64)]], false)
        };
        match got.first() {
            Some(Ok(_)) => {}
            other => return Err(format!("dummy get: {other:?}")),
        }
        bytes += SIZE as u64;
        i += 1;
    }
    Ok(gbps(bytes, start.elapsed().as_secs_f64()))
}

/// The sum of `per_thread(t)` for `t` in `0..THREADS`, run at once on scoped threads (each
/// returns its own GB/s over the same duration).
fn summed<F>(per_thread: F) -> Result<f64, String>
where
    F: Fn(usize) -> Result<f64, String> + Sync,
{
    std::thread::scope(|scope| {
        let running: Vec<_> = (0..THREADS)
            .map(|t| {
                let per_thread = &per_thread;
                scope.spawn(move || per_thread(t))
            })
            .collect();
        running.into_iter().try_fold(0.0, |sum, thread| {
            let gbps = thread
                .join()
                .map_err(|_| "a benchmark thread panicked".to_string())??;
            Ok(sum + gbps)
        })
    })
}

/// The scenario; see the module doc.
pub fn run(report: &mut Report, rounds: Rounds) -> Result<(), String> {
    let duration = rounds.duration;
    let service = MasterService::new(MasterConfig::default());
    let rpc = crate::scenarios::serve_master(service.clone())?;
    let master = rpc.local_addr().to_string();
    let (_real, name) = spawn_child(&["--serve-real-client", &master, "512 MB"])?;
    let client = Client::setup_dummy(0, 16 * MIB as u64, &name).map_err(|e| {
        format!(
            "setup_dummy: {e}: {}",
            mooncake_rs::error::last_error_message()
        )
    })?;
    let shared = ShmPool::global()
        .alloc((DESTINATIONS * SIZE) as u64, "bench")
        .map_err(|e| format!("shm: {e}"))?;
    let value = vec![5u8; SIZE];
    for k in 0..KEYS {
        client
            .put_from(&format!("sa{k}"), &value, &ReplicateConfig::default())
            .map_err(|e| format!("put: {e}"))?;
    }
    let mut heap = Pool::new(DESTINATIONS, SIZE, 0);
    let heap_addrs: Vec<usize> = heap
        .bufs
        .iter_mut()
        .map(|b| b.as_mut_ptr() as usize)
        .collect();
    // The limit's sources and destinations: as many blocks as the gets read and write.
    let limit_src = Pool::new(KEYS, SIZE, 5);
    let mut limit_dst = Pool::new(DESTINATIONS, SIZE, 0);
    let limit_name = format!("memcpy {KEYS} -> {DESTINATIONS} x 4MiB");
    let mut limit = || Ok(copy_between_gbps(&limit_src, &mut limit_dst, duration));
    judge(
        report,
        &rounds.judged("dummy get 4MiB zero-copy", "GB/s", &limit_name),
        &mut limit,
        || {
            gets(&client, duration, |i| {
                shared.addr() + (i % DESTINATIONS) * SIZE
            })
        },
    )?;
    judge(
        report,
        &rounds.judged("dummy get 4MiB staged", "GB/s", &limit_name),
        &mut limit,
        || gets(&client, duration, |i| heap_addrs[i % DESTINATIONS]),
    )?;
    let share = DESTINATIONS / THREADS;
    let limit_dsts: Vec<std::sync::Mutex<Pool>> = (0..THREADS)
        .map(|_| std::sync::Mutex::new(Pool::new(share, SIZE, 0)))
        .collect();
    let mut limit = || {
        summed(|t| {
            let mut dst = limit_dsts[t].lock().map_err(|_| "limit pool poisoned")?;
            Ok(copy_between_gbps(&limit_src, &mut dst, duration))
        })
    };
    judge(
        report,
        &rounds.judged(
            &format!("dummy get 4MiB zero-copy, {THREADS} threads"),
            "GB/s",
            &format!("memcpy {THREADS} threads, {KEYS} -> {share} x 4MiB each"),
        ),
        &mut limit,
        || {
            summed(|t| {
                gets(&client, duration, |i| {
                    shared.addr() + (t * share + i % share) * SIZE
                })
            })
        },
    )?;
    let stats = client.dummy_stats().unwrap_or_default();
    eprintln!(
        "  link: {} bytes zero-copy, {} bytes staged, {} connections",
        stats.zero_copy_bytes, stats.staged_bytes, stats.connections
    );
    client.teardown();
    drop(heap);
    Ok(())
}
