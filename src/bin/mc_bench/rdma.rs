//! `mc_bench --rdma`: our RDMA transport against perftest on the same device, in one run
//! (inside the soft-RoCE VM: `RDMA_VM_DEV`, `RDMA_VM_ADDR`, `RDMA_VM_GID_INDEX`; or set
//! `MC_BENCH_RDMA_DEV`, `MC_BENCH_RDMA_ADDR`, `MC_BENCH_RDMA_GID_INDEX`).
//!
//! Engines in this process (one device, "two nodes"): an owner with a registered 64 MiB
//! segment and two initiators sharing one registered 64 MiB buffer (zero-copy), one per
//! completion mode (`MC_RDMA_COMPLETION=poll` and `event`). Per size, rounds interleave
//! `ib_read_bw` / our get in both modes and `ib_write_bw` / our put in both modes for the same
//! bytes (the modes' order alternates between rounds); the best of the rounds is reported
//! with the spread (max/min − 1). 64 KiB runs twice: one key per call (one read or write in
//! flight; judged against perftest at its default queue depth of 128 and, like for like,
//! against perftest with one request in flight, `-t 1` / `-o 1`, in the same rounds) and 16
//! keys per call (a batch, against the default depth). 4 KiB get p50
//! in both modes is compared with `ib_read_lat`'s typical latency.

use super::report::Report;
use mooncake_rs::transfer::rdma::RdmaDevice;
use mooncake_rs::transfer::{
    DirectResolver, EngineConfig, TransferEngine, TransferOp, TransferRequest,
};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BUFFER: usize = 64 << 20;
const ROUNDS: usize = 3;
const MIB: f64 = (1 << 20) as f64;

struct Target {
    device: String,
    addr: String,
    gid_index: String,
}

fn target() -> Option<Target> {
    let var = |ours: &str, vm: &str| std::env::var(ours).or_else(|_| std::env::var(vm)).ok();
    Some(Target {
        device: var("MC_BENCH_RDMA_DEV", "RDMA_VM_DEV")?,
        addr: var("MC_BENCH_RDMA_ADDR", "RDMA_VM_ADDR")?,
        gid_index: var("MC_BENCH_RDMA_GID_INDEX", "RDMA_VM_GID_INDEX")
            .unwrap_or_else(|| "0".into()),
    })
}

/// Runs a perftest server/client pair and returns the whitespace-split fields of its result
/// line (the first line of the client's output starting with the message size).
fn perftest(
    tool: &str,
    target: &Target,
    size: usize,
    iters: usize,
    port: u16,
    extra: &[&str],
) -> Result<Vec<f64>, String> {
    let common = |cmd: &mut Command| {
        cmd.args(["-d", &target.device, "-x", &target.gid_index, "-F"])
            .args(["-s", &size.to_string(), "-n", &iters.to_string()])
            .args(extra)
            .args(["-p", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
    };
    let mut server = Command::new(tool);
    common(&mut server);
    let server = server.spawn().map_err(|e| format!("{tool}: {e}"))?;
    // The server needs a moment to listen; the client retries its connect.
    let mut output = None;
    for _ in 0..50 {
        let mut client = Command::new(tool);
        common(&mut client);
        let out = client
            .arg(&target.addr)
            .output()
            .map_err(|e| format!("{tool}: {e}"))?;
        if out.status.success() {
            output = Some(out);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    server
        .wait_with_output()
        .map_err(|e| format!("{tool}: {e}"))?;
    let out = output.ok_or_else(|| format!("{tool} client never connected"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(str::split_whitespace)
        .map(|fields| {
            fields
                .map(|f| f.parse::<f64>())
                .collect::<Result<Vec<_>, _>>()
        })
        .filter_map(Result::ok)
        .find(|fields| fields.first() == Some(&(size as f64)) && fields.len() >= 4)
        .ok_or_else(|| format!("no result line in {tool} output:\n{text}"))
}

/// The completion modes compared, by their `MC_RDMA_COMPLETION` value.
const MODES: [&str; 2] = ["poll", "event"];

/// An engine on `device` listening on `addr`, its RDMA transport in completion `mode`
/// (`MC_RDMA_COMPLETION` is read when the engine is built).
fn engine(device: &Arc<RdmaDevice>, addr: &str, mode: &str) -> Result<Arc<TransferEngine>, String> {
    std::env::set_var("MC_RDMA_COMPLETION", mode);
    let listener = TcpListener::bind((addr, 0)).map_err(|e| e.to_string())?;
    let local_name = listener
        .local_addr()
        .map_err(|e| e.to_string())?
        .to_string();
    let built = TransferEngine::new(EngineConfig {
        local_name,
        listener: Some(listener),
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: Some(Arc::clone(device).into()),
    })
    .map_err(|e| format!("engine: {e}"));
    std::env::remove_var("MC_RDMA_COMPLETION");
    built
}

/// `values[mode]` for each mode, measured by `measure(mode)` in the order that alternates
/// with `round`.
fn both_modes(
    round: usize,
    values: &mut [Vec<f64>; 2],
    mut measure: impl FnMut(usize) -> Result<f64, String>,
) -> Result<(), String> {
    for step in 0..MODES.len() {
        let mode = (step + round) % MODES.len();
        values[mode].push(measure(mode)?);
    }
    Ok(())
}

/// Moves `size`-byte requests `iters` times (all of `BUFFER` in turn) from the initiator of
/// completion mode `mode`, `batch` requests per transfer call (as a batch get or put of
/// `batch` keys hands them to the engine); MiB/s.
fn ours(
    pair: &Pair,
    mode: usize,
    op: TransferOp,
    size: usize,
    iters: usize,
    batch: usize,
) -> Result<f64, String> {
    if batch == 0 || !BUFFER.is_multiple_of(size) || batch * size > BUFFER {
        return Err(format!(
            "bad bench shape: {batch} x {size} bytes in {BUFFER}"
        ));
    }
    let started = Instant::now();
    let mut done = 0;
    while done < iters {
        let requests: Vec<TransferRequest<'_>> = (done..iters.min(done + batch))
            .map(|i| {
                let at = (i * size) % BUFFER;
                TransferRequest {
                    op,
                    local_addr: pair.local.as_ptr() as usize + at,
                    len: size as u64,
                    endpoint: pair.owner.local_name(),
                    remote_addr: (pair.segment.as_ptr() as usize + at) as u64,
                    epoch: 0,
                    send_by: None,
                }
            })
            .collect();
        done += requests.len();
        // SAFETY: both buffers are ours, registered and alive for the call; reads write
        // only `pair.local`, which nothing else touches, and the requests of one call name
        // distinct ranges of it (`batch * size` <= BUFFER).
        let results = unsafe { pair.initiators[mode].transfer(&requests) };
        if results.len() != requests.len() {
            return Err(format!(
                "{op:?} of {size}: {} results for {} requests",
                results.len(),
                requests.len()
            ));
        }
        if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
            return Err(format!("{op:?} of {size}: {e}"));
        }
    }
    Ok((size * iters) as f64 / MIB / started.elapsed().as_secs_f64())
}

/// p50 of `samples` 4 KiB gets by the initiator of mode `mode`, in µs.
fn get_p50(pair: &Pair, mode: usize, samples: usize) -> Result<f64, String> {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        ours(pair, mode, TransferOp::Read, 4096, 1, 1)?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok(super::limits::median(&mut times))
}

struct Pair {
    owner: Arc<TransferEngine>,
    /// One per [`MODES`] entry.
    initiators: [Arc<TransferEngine>; 2],
    segment: Vec<u8>,
    local: Vec<u8>,
}

/// Best value and spread (max/min − 1) of `values` (higher is better).
fn best(values: &[f64]) -> (f64, f64) {
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    (max, if min > 0.0 { max / min - 1.0 } else { 0.0 })
}

/// Runs the comparison; prints `skipped` without a device.
pub fn run(report: &mut Report) -> Result<(), String> {
    let Some(target) = target() else {
        println!("rdma: skipped (no RDMA_VM_DEV / MC_BENCH_RDMA_DEV)");
        return Ok(());
    };
    let device =
        RdmaDevice::open(&target.device).map_err(|_| mooncake_rs::error::last_error_message())?;
    let mut pair = Pair {
        owner: engine(&device, &target.addr, MODES[0])?,
        initiators: [
            engine(&device, &target.addr, MODES[0])?,
            engine(&device, &target.addr, MODES[1])?,
        ],
        segment: vec![7u8; BUFFER],
        local: vec![1u8; BUFFER],
    };
    let segment = pair.segment.as_mut_ptr() as usize;
    pair.owner
        .register(segment, BUFFER, true)
        .map_err(|e| format!("register: {e}"))?;
    let local = pair.local.as_mut_ptr() as usize;
    for initiator in &pair.initiators {
        initiator
            .register(local, BUFFER, false)
            .map_err(|e| format!("register: {e}"))?;
    }
    let mut port = 18515u16;
    // perftest's default queue depth is 128 (reads also bounded by the device's outstanding
    // reads); a single-key call has one read or write in flight, a batch call of 16 keys up
    // to 16 (one work request per 64 KiB key).
    for (size, iters, batch) in [
        (4usize << 20, 48usize, 1usize),
        (64 << 10, 1500, 1),
        (64 << 10, 1504, 16),
    ] {
        let label = match (size >= 1 << 20, batch) {
            (true, _) => format!("{} MiB", size >> 20),
            (false, 1) => format!("{} KiB", size >> 10),
            (false, n) => format!("{} KiB x{n} batch", size >> 10),
        };
        // A single-key call of less than a slice has one work request in flight: its like
        // for like is perftest with one in flight too (`-t 1`, and `-o 1` for reads), run in
        // the same rounds next to the default depth.
        let one_in_flight = batch == 1 && size < 1 << 20;
        let (mut ib_r, mut ib_w) = (vec![], vec![]);
        let (mut ib_r1, mut ib_w1) = (vec![], vec![]);
        let (mut our_r, mut our_w) = ([vec![], vec![]], [vec![], vec![]]);
        for round in 0..ROUNDS {
            for (op, tool, depth_one, limits, mine) in [
                (
                    TransferOp::Read,
                    "ib_read_bw",
                    &["-t", "1", "-o", "1"][..],
                    [&mut ib_r, &mut ib_r1],
                    &mut our_r,
                ),
                (
                    TransferOp::Write,
                    "ib_write_bw",
                    &["-t", "1"][..],
                    [&mut ib_w, &mut ib_w1],
                    &mut our_w,
                ),
            ] {
                let [deep, shallow] = limits;
                port += 1;
                deep.push(perftest(tool, &target, size, iters, port, &[])?[3]);
                if one_in_flight {
                    port += 1;
                    shallow.push(perftest(tool, &target, size, iters, port, depth_one)?[3]);
                }
                both_modes(round, mine, |mode| {
                    ours(&pair, mode, op, size, iters, batch)
                })?;
            }
        }
        let size_label = label.split(" x").next().unwrap_or(&label);
        for (what, limit, mine, ib, ib1) in [
            ("get", "ib_read_bw", &our_r, &ib_r, &ib_r1),
            ("put", "ib_write_bw", &our_w, &ib_w, &ib_w1),
        ] {
            let mut limits = vec![(format!("{limit} {size_label}"), best(ib))];
            if one_in_flight {
                limits.push((format!("{limit} {size_label} 1 in flight"), best(ib1)));
            }
            for (mode, name) in MODES.iter().enumerate() {
                let (value, spread) = best(&mine[mode]);
                for (limit_name, (limit_value, limit_spread)) in &limits {
                    report.line(
                        &format!("rdma {what} {label} {name} (MiB/s)"),
                        value,
                        "MiB/s",
                        limit_name,
                        *limit_value,
                    );
                    println!(
                        "  spread: ours ({name}) {:.1}%, {limit_name} {:.1}% (best of {ROUNDS})",
                        spread * 100.0,
                        limit_spread * 100.0
                    );
                }
            }
        }
    }
    let (mut ib_lat, mut our_lat) = (vec![], [vec![], vec![]]);
    for round in 0..ROUNDS {
        port += 1;
        // ib_read_lat fields: bytes, iterations, t_min, t_max, t_typical, ...
        ib_lat.push(perftest("ib_read_lat", &target, 4096, 1000, port, &[])?[4]);
        both_modes(round, &mut our_lat, |mode| get_p50(&pair, mode, 1000))?;
    }
    let low = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    for (mode, name) in MODES.iter().enumerate() {
        report.line(
            &format!("rdma get 4 KiB p50 {name}"),
            low(&our_lat[mode]),
            "us",
            "ib_read_lat 4 KiB typical",
            low(&ib_lat),
        );
        println!(
            "  rounds: ours ({name}) {:.1?} us, ib_read_lat {ib_lat:.1?} us",
            our_lat[mode]
        );
    }
    Ok(())
}
