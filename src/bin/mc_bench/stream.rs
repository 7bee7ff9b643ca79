//! Stream scenarios (seed 000, `mooncake_rs::stream`), all on an embedded store with resident
//! data and host streams (no GPU needed):
//!
//! 1. *Call cost vs bytes*: the host time of one `batch_get_into_on_stream_raw` call for 64 keys
//!    totalling 1 MiB and 64 keys totalling 256 MiB. The stream is held by a launched item
//!    while the call is timed, so the time excludes the copies (they run after the release).
//!    The call must not depend on the bytes: target ratio 256 MiB / 1 MiB ≤ 1.1. The 1 MiB
//!    call is shown against the blocking `batch_get_into` of the same keys.
//! 2. *Session layer calls*: one `batch_get_session_start`, then one
//!    `batch_get_into_multi_buffer_ranges_on_stream_raw` per layer (32 layers × 16 keys): µs
//!    per layer call against an on-stream batch call of the same keys (which pins through the
//!    master), and the master calls made by the layer calls, which must be 0 (the bench fails
//!    otherwise).
//! 3. *Layerwise pipeline*: 32 layers loaded (session ranges, 8 keys × 512 KiB per layer) on
//!    one host stream; a "compute" (a busy-wait calibrated to the median layer load) per layer
//!    on another, each gated by a host event recorded after the layer's load. Per-layer load
//!    and compute times are taken alone, in stream order (stamps enqueued between items);
//!    then both streams run together, everything enqueued before the load stream starts.
//!    `ideal = load_0 + Σ max(load_i, compute_i)`; target ideal / measured ≥ 0.95.

use crate::limits::median;
use crate::report::Report;
use crate::scenarios::MIB;
use mooncake_rs::client::{Buf, Client, SetupConfig};
use mooncake_rs::stream::{HostEvent, HostStream, StreamRef, Ticket, TICKET_PENDING};
use mooncake_rs::types::ReplicateConfig;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest wait for a ticket or a stream; past it the bench exits (see [`settle`]).
const WAIT: Duration = Duration::from_secs(60);

/// A launched item that holds `stream` until [`Blocker::release`] or drop (or 60 s).
pub(crate) struct Blocker(mpsc::Sender<()>);

impl Blocker {
    pub(crate) fn block(stream: &HostStream) -> Blocker {
        let (open, opened) = mpsc::channel::<()>();
        stream.launch(move || {
            // A message or a dropped sender both release the stream.
            let _ = opened.recv_timeout(WAIT);
        });
        Blocker(open)
    }

    pub(crate) fn release(self) {
        let _ = self.0.send(());
    }
}

/// Waits for every one of `tickets`; each must end with status 0. A ticket still pending
/// after [`WAIT`] means a stream may still write into buffers this process would free: the
/// bench exits at once rather than unwinding.
pub(crate) fn settle(tickets: &[Ticket], what: &str) -> Result<(), String> {
    let mut first_error = None;
    for ticket in tickets {
        match ticket.wait(Some(WAIT)) {
            0 => {}
            TICKET_PENDING => {
                eprintln!("mc_bench: {what}: a ticket is still pending after {WAIT:?}");
                std::process::exit(1);
            }
            code => {
                first_error.get_or_insert(code);
            }
        }
    }
    match first_error {
        None => Ok(()),
        Some(code) => Err(format!("{what}: ticket status {code}")),
    }
}

/// Leaves a held window after a failed call: releases the stream, waits for the calls
/// already issued (their copies write into buffers the caller is about to free) and returns
/// the error.
pub(crate) fn bail<T>(
    blocker: Blocker,
    tickets: &[Ticket],
    what: &str,
    error: impl std::fmt::Display,
) -> Result<T, String> {
    drop(blocker);
    settle(tickets, what)?;
    Err(format!("{what}: {error}"))
}

pub(crate) fn sync(stream: &HostStream, what: &str) {
    if !stream.synchronize(Some(WAIT)) {
        eprintln!("mc_bench: {what}: stream not done after {WAIT:?}");
        std::process::exit(1);
    }
}

pub(crate) fn embedded(name: &str, segment: usize) -> Result<Client, String> {
    Client::setup(SetupConfig {
        local_hostname: name.into(),
        global_segment_size: segment as u64,
        local_buffer_size: 0,
        master_server_addr: "embedded".into(),
        ..SetupConfig::default()
    })
    .map_err(|e| format!("embedded setup: {e}"))
}

/// A pre-faulted destination of `len` bytes.
fn dest(len: usize) -> Vec<u8> {
    vec![0xAA; len]
}

/// `count` keys named `prefix<i>` whose values are produced by `value(i)`.
fn put_keys(
    client: &Client,
    prefix: &str,
    count: usize,
    value: impl Fn(usize) -> Vec<u8>,
) -> Result<(Vec<String>, Vec<Vec<u8>>), String> {
    let mut keys = Vec::with_capacity(count);
    let mut values = Vec::with_capacity(count);
    for i in 0..count {
        let key = format!("{prefix}{i}");
        let v = value(i);
        client
            .put_from(&key, &v, &ReplicateConfig::default())
            .map_err(|e| format!("put_from {key}: {e}"))?;
        keys.push(key);
        values.push(v);
    }
    Ok((keys, values))
}

/// One `Buf` per key: `size` bytes each, back to back from `base`.
fn key_bufs(base: &mut [u8], keys: usize, size: usize) -> Vec<Vec<Buf>> {
    let at = base.as_mut_ptr() as usize;
    (0..keys)
        .map(|i| vec![Buf::new(at + i * size, size as u64)])
        .collect()
}

/// Checks that `dst` holds `values` back to back.
fn check_back_to_back(dst: &[u8], values: &[Vec<u8>], what: &str) -> Result<(), String> {
    let mut at = 0;
    for (i, v) in values.iter().enumerate() {
        if dst[at..at + v.len()] != v[..] {
            return Err(format!("{what}: key {i} read back wrong bytes"));
        }
        at += v.len();
    }
    Ok(())
}

/// Keys with their values, read by on-stream calls into one destination (back to back).
struct KeySet<'a> {
    keys: &'a [String],
    values: &'a [Vec<u8>],
}

/// Host times (µs) of one on-stream call of a [`KeySet`]: per window, the first call (after
/// the previous window's copies) and the second (back to back with the first).
#[derive(Default)]
struct CallTimes {
    first: Vec<f64>,
    second: Vec<f64>,
}

/// Times on-stream `batch_get_into` calls of each set into `dst`: `reps` rounds, each making
/// one window per set in turn. In a window the stream is held (the copies run after the
/// timing) and two identical calls are made. The first call finds the caches as the previous
/// window's copies left them (a host stream copies through the CPU caches; a device stream's
/// DMA does not); the second shows the steady cost of back-to-back calls, as in a layer
/// loop. Alternating the sets gives every set the same cache history. One untimed window per
/// set comes first and its bytes are checked.
fn on_stream_calls(
    client: &Client,
    stream: &HostStream,
    sets: &[KeySet<'_>],
    dst: &mut [u8],
    reps: usize,
) -> Result<Vec<CallTimes>, String> {
    let mut times: Vec<CallTimes> = sets.iter().map(|_| CallTimes::default()).collect();
    for rep in 0..=reps {
        for (set, times) in sets.iter().zip(times.iter_mut()) {
            let size = set.values[0].len();
            let bytes = set.keys.len() * size;
            if rep == 0 {
                dst[..bytes].fill(0);
            }
            let blocker = Blocker::block(stream);
            let mut tickets = Vec::with_capacity(2);
            let mut us = [0.0; 2];
            for t_us in &mut us {
                let bufs = key_bufs(dst, set.keys.len(), size);
                let t = Instant::now();
                // SAFETY: `dst` outlives `settle` below, which waits until the stream
                // passed the call; the per-key ranges do not overlap, and the two calls'
                // identical copies run one after the other in stream order.
                let ticket = unsafe {
                    client.batch_get_into_on_stream_raw(
                        set.keys,
                        bufs,
                        false,
                        StreamRef::Host(stream),
                    )
                };
                *t_us = t.elapsed().as_secs_f64() * 1e6;
                match ticket {
                    Ok(ticket) => tickets.push(ticket),
                    Err(e) => return bail(blocker, &tickets, "on-stream get", e),
                }
            }
            blocker.release();
            settle(&tickets, "on-stream get")?;
            if rep == 0 {
                check_back_to_back(&dst[..bytes], set.values, "on-stream get")?;
            } else {
                times.first.push(us[0]);
                times.second.push(us[1]);
            }
        }
    }
    Ok(times)
}

/// Scenario 1: call cost for 1 MiB vs 256 MiB over 64 keys.
fn call_cost(report: &mut Report, quick: bool) -> Result<(), String> {
    const KEYS: usize = 64;
    let reps = if quick { 9 } else { 21 };
    let client = embedded("bench-stream-a", 320 * MIB)?;
    let small = MIB / KEYS;
    let large = 256 * MIB / KEYS;
    let (small_keys, small_values) =
        put_keys(&client, "sa-", KEYS, |i| vec![i as u8 ^ 0x5A; small])?;
    let (large_keys, large_values) =
        put_keys(&client, "sb-", KEYS, |i| vec![i as u8 ^ 0xA5; large])?;
    let mut dst = dest(256 * MIB);
    let stream = HostStream::new()?;

    // The blocking call of the same 64 keys, 1 MiB (copies included): the reference.
    let mut blocking = Vec::with_capacity(reps);
    for _ in 0..=reps {
        let mut views: Vec<&mut [u8]> = dst[..MIB].chunks_mut(small).collect();
        let t = Instant::now();
        let results = client.batch_get_into(&small_keys, &mut views);
        blocking.push(t.elapsed().as_secs_f64() * 1e6);
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            return Err(format!("batch_get_into: {e}"));
        }
    }
    blocking.remove(0);
    let blocking = median(&mut blocking);

    let sets = [
        KeySet {
            keys: &large_keys,
            values: &large_values,
        },
        KeySet {
            keys: &small_keys,
            values: &small_values,
        },
    ];
    let mut times = on_stream_calls(&client, &stream, &sets, &mut dst, reps)?;
    let (large, small) = times.split_at_mut(1);
    let (large, small) = (&mut large[0], &mut small[0]);
    let us_small = median(&mut small.second);
    report.line(
        "stream call 64 keys 1MiB",
        us_small,
        "us",
        "blocking batch get 64x16KiB",
        blocking,
    );
    report.line(
        "stream call 64 keys 256MiB",
        median(&mut large.second),
        "us",
        "stream call 64 keys 1MiB",
        us_small,
    );
    // On this VM the call times are bimodal (~50 or ~75 µs for both sizes, in phases), so the
    // medians' ratio moves by ±15 % between runs; the fastest calls are stable to a few %.
    let fastest = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    report.line(
        "  fastest call 64 keys 256MiB",
        fastest(&large.second),
        "us",
        "fastest call 64 keys 1MiB",
        fastest(&small.second),
    );
    let cold_small = median(&mut small.first);
    report.line(
        "  1st call in window 256MiB",
        median(&mut large.first),
        "us",
        "1st call in window 1MiB",
        cold_small,
    );
    drop(stream);
    client.teardown();
    Ok(())
}

/// Scenario 2: per-layer ranged calls inside get sessions; no master call.
fn session_layers(report: &mut Report, quick: bool) -> Result<(), String> {
    const KEYS: usize = 16;
    const LAYERS: usize = 32;
    const LAYER: usize = 32 << 10;
    let reps = if quick { 3 } else { 9 };
    let client = embedded("bench-stream-b", 32 * MIB)?;
    let (keys, values) = put_keys(&client, "sl-", KEYS, |k| layered(k, LAYERS, LAYER))?;
    let stream = HostStream::new()?;
    let mut whole = dest(KEYS * LAYERS * LAYER);

    // Reference: the on-stream batch call of the same keys (pins through the master).
    let before = client.metrics().master_calls;
    let set = KeySet {
        keys: &keys,
        values: &values,
    };
    let mut times = on_stream_calls(&client, &stream, &[set], &mut whole, reps)?;
    let batch = median(&mut times[0].second);
    // Two calls per window, one untimed window first.
    let batch_calls = (client.metrics().master_calls - before) as f64 / (2 * (reps + 1)) as f64;

    let started = client.batch_get_session_start(&keys);
    if let Some(Err(e)) = started.iter().find(|r| r.is_err()) {
        return Err(format!("batch_get_session_start: {e}"));
    }
    let mut out = dest(KEYS * LAYERS * LAYER); // layer-major: [layer][key][LAYER]
    let base = out.as_mut_ptr() as usize;
    // The reference calls' pins go back through the unpinner after their tickets settled:
    // let those unpin calls land before the window opens, or they are counted in it.
    unpins_flushed(&client)?;
    let before = client.metrics().master_calls;
    let mut samples = Vec::with_capacity(reps * LAYERS);
    for rep in 0..reps {
        out.fill(0);
        let blocker = Blocker::block(&stream);
        let mut tickets = Vec::with_capacity(LAYERS);
        for layer in 0..LAYERS {
            let bufs: Vec<Vec<Buf>> = (0..KEYS)
                .map(|k| vec![Buf::new(base + (layer * KEYS + k) * LAYER, LAYER as u64)])
                .collect();
            let offsets = vec![vec![(layer * LAYER) as u64]; KEYS];
            let t = Instant::now();
            // SAFETY: `out` outlives `settle` below; the ranges are disjoint.
            let ticket = unsafe {
                client.batch_get_into_multi_buffer_ranges_on_stream_raw(
                    &keys,
                    bufs,
                    &offsets,
                    StreamRef::Host(&stream),
                )
            };
            samples.push(t.elapsed().as_secs_f64() * 1e6);
            match ticket {
                Ok(ticket) => tickets.push(ticket),
                Err(e) => return bail(blocker, &tickets, "ranges on stream", e),
            }
        }
        blocker.release();
        settle(&tickets, "session ranges on stream")?;
        if rep == 0 {
            check_layer_major(&out, &values, LAYERS, LAYER, "session ranges on stream")?;
        }
    }
    let calls = client.metrics().master_calls - before;
    client
        .batch_get_session_end(&keys)
        .map_err(|e| format!("batch_get_session_end: {e}"))?;
    report.line(
        "stream session layer call 16 keys",
        median(&mut samples),
        "us",
        "stream call 16 keys (pins)",
        batch,
    );
    report.line(
        "  master calls per layer call",
        calls as f64 / (reps * LAYERS) as f64,
        "count",
        "per stream call 16 keys",
        batch_calls,
    );
    drop(stream);
    client.teardown();
    if calls != 0 {
        return Err(format!(
            "session layer calls made {calls} master calls (must be 0)"
        ));
    }
    Ok(())
}

/// Waits (at most 10 s) until every released ticket's pins went back to the master.
fn unpins_flushed(client: &Client) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = client.metrics().stream;
        // pins_held drops only after the release queued its unpins (unpins_pending).
        if m.pins_held == 0 && m.unpins_pending == 0 && m.tickets_outstanding == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the unpinner did not flush in 10 s ({} pins pending, {} tickets outstanding)",
                m.unpins_pending, m.tickets_outstanding
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A value of `layers` layers of `layer` bytes; each layer's bytes depend on the key, the
/// layer and the position.
fn layered(key: usize, layers: usize, layer: usize) -> Vec<u8> {
    let mut v = vec![0u8; layers * layer];
    for (l, chunk) in v.chunks_mut(layer).enumerate() {
        let seed = (key * 31 + l * 7 + 1) as u8;
        for (j, b) in chunk.iter_mut().enumerate() {
            *b = seed.wrapping_add((j >> 9) as u8);
        }
    }
    v
}

/// Checks a layer-major destination (`[layer][key][layer bytes]`) against per-key values.
fn check_layer_major(
    out: &[u8],
    values: &[Vec<u8>],
    layers: usize,
    layer: usize,
    what: &str,
) -> Result<(), String> {
    let keys = values.len();
    for l in 0..layers {
        for (k, v) in values.iter().enumerate() {
            let got = &out[(l * keys + k) * layer..][..layer];
            if got != &v[l * layer..][..layer] {
                return Err(format!("{what}: key {k} layer {l} read back wrong bytes"));
            }
        }
    }
    Ok(())
}

/// Locks `m`, also after a panic elsewhere (stamps stay usable).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Enqueues an item that records the time it runs at.
fn stamp(stream: &HostStream, stamps: &Arc<Mutex<Vec<Instant>>>) {
    let stamps = stamps.clone();
    stream.launch(move || lock(&stamps).push(Instant::now()));
}

/// Differences of consecutive stamps, in µs (and clears them).
fn intervals(stamps: &Arc<Mutex<Vec<Instant>>>) -> Vec<f64> {
    let mut s = lock(stamps);
    let out = s
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6)
        .collect();
    s.clear();
    out
}

/// The layer's "compute": a busy-wait of `d`.
pub(crate) fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// One repetition of the pipeline scenario (µs).
struct PipelineRun {
    /// Per layer: the load alone, the compute alone, the load while the computes run.
    load: Vec<f64>,
    compute: Vec<f64>,
    overlapped: Vec<f64>,
    /// Per layer: the compute while the loads run (longer than alone when the thread lost its
    /// CPU meanwhile).
    computing: Vec<f64>,
    /// Per layer: from the moment its compute could start (its load and the previous compute
    /// done) to the moment it did: the streams' hand-off, plus any time the thread waited for
    /// a CPU.
    handoff: Vec<f64>,
    /// From the first load's start to the last compute's end, both running.
    measured: f64,
}

/// The seed's bound for a layerwise pipeline: `load_0 + Σ max(load_i, compute_i)`.
fn ideal(load: &[f64], compute: &[f64]) -> f64 {
    load[0]
        + load
            .iter()
            .zip(compute)
            .map(|(l, c)| l.max(*c))
            .sum::<f64>()
}

/// Per layer, the median over `runs` of `field`.
fn per_layer(runs: &[PipelineRun], field: impl Fn(&PipelineRun) -> &Vec<f64>) -> Vec<f64> {
    let layers = runs.first().map_or(0, |r| field(r).len());
    (0..layers)
        .map(|i| median(&mut runs.iter().map(|r| field(r)[i]).collect::<Vec<_>>()))
        .collect()
}

/// Scenario 3: layerwise load/compute pipeline on two host streams.
fn pipeline(report: &mut Report, memcpy: f64, quick: bool) -> Result<(), String> {
    const KEYS: usize = 8;
    const LAYERS: usize = 32;
    const PART: usize = 512 << 10; // per key and layer: 4 MiB per layer
    let reps = if quick { 3 } else { 7 };
    let client = embedded("bench-stream-c", 160 * MIB)?;
    let (keys, values) = put_keys(&client, "pl-", KEYS, |k| layered(k, LAYERS, PART))?;
    let started = client.batch_get_session_start(&keys);
    if let Some(Err(e)) = started.iter().find(|r| r.is_err()) {
        return Err(format!("batch_get_session_start: {e}"));
    }
    let load = HostStream::new()?;
    let compute = HostStream::new()?;
    let events: Vec<HostEvent> = (0..LAYERS).map(|_| HostEvent::new()).collect();
    let mut out = dest(KEYS * LAYERS * PART);
    let base = out.as_mut_ptr() as usize;
    let load_stamps = Arc::new(Mutex::new(Vec::with_capacity(LAYERS + 1)));
    let compute_stamps = Arc::new(Mutex::new(Vec::with_capacity(LAYERS + 1)));

    // Issues layer `layer`'s load on `load` (the caller keeps `out` alive until settled).
    let issue = |layer: usize| {
        let bufs: Vec<Vec<Buf>> = (0..KEYS)
            .map(|k| vec![Buf::new(base + (layer * KEYS + k) * PART, PART as u64)])
            .collect();
        let offsets = vec![vec![(layer * PART) as u64]; KEYS];
        // SAFETY: `out` lives until the end of this function and every ticket is settled
        // before it is read or dropped; the ranges are disjoint.
        unsafe {
            client.batch_get_into_multi_buffer_ranges_on_stream_raw(
                &keys,
                bufs,
                &offsets,
                StreamRef::Host(&load),
            )
        }
    };

    let mut runs = Vec::with_capacity(reps);
    // The compute is calibrated once, on the first repetition's loads (which are not counted).
    let mut compute_for = Duration::ZERO;
    for rep in 0..=reps {
        // Loads alone.
        let blocker = Blocker::block(&load);
        stamp(&load, &load_stamps);
        let mut tickets = Vec::with_capacity(LAYERS);
        for layer in 0..LAYERS {
            match issue(layer) {
                Ok(ticket) => tickets.push(ticket),
                Err(e) => return bail(blocker, &tickets, "pipeline loads", e),
            }
            stamp(&load, &load_stamps);
        }
        blocker.release();
        sync(&load, "pipeline loads");
        settle(&tickets, "pipeline loads")?;
        let load_us = intervals(&load_stamps);
        if rep == 0 {
            compute_for = Duration::from_secs_f64(median(&mut load_us.clone()) / 1e6);
        }

        // Computes alone.
        let blocker = Blocker::block(&compute);
        stamp(&compute, &compute_stamps);
        for _ in 0..LAYERS {
            compute.launch(move || spin(compute_for));
            stamp(&compute, &compute_stamps);
        }
        blocker.release();
        sync(&compute, "pipeline computes");
        let compute_us = intervals(&compute_stamps);

        // Both, each compute gated by its layer's load.
        out.fill(0);
        let blocker = Blocker::block(&load);
        stamp(&load, &load_stamps);
        let mut tickets = Vec::with_capacity(LAYERS);
        for (layer, event) in events.iter().enumerate() {
            match issue(layer) {
                Ok(ticket) => tickets.push(ticket),
                Err(e) => return bail(blocker, &tickets, "pipeline", e),
            }
            event.record(&load);
            stamp(&load, &load_stamps);
            compute.wait_event(event);
            stamp(&compute, &compute_stamps);
            compute.launch(move || spin(compute_for));
            stamp(&compute, &compute_stamps);
        }
        blocker.release();
        sync(&compute, "pipeline");
        sync(&load, "pipeline");
        settle(&tickets, "pipeline")?;
        check_layer_major(&out, &values, LAYERS, PART, "pipeline")?;
        // load_stamps: start, then the end of each load; compute_stamps: start and end of
        // each compute.
        let (loads, computes) = (lock(&load_stamps).clone(), lock(&compute_stamps).clone());
        lock(&compute_stamps).clear();
        let measured = (computes[2 * LAYERS - 1] - loads[0]).as_secs_f64() * 1e6;
        // How long each compute started after it could have: after its load and after the
        // previous compute.
        let handoff = (0..LAYERS)
            .map(|i| {
                let ready = match i {
                    0 => loads[1],
                    _ => loads[i + 1].max(computes[2 * i - 1]),
                };
                computes[2 * i]
                    .saturating_duration_since(ready)
                    .as_secs_f64()
                    * 1e6
            })
            .collect();
        let computing = (0..LAYERS)
            .map(|i| (computes[2 * i + 1] - computes[2 * i]).as_secs_f64() * 1e6)
            .collect();
        let overlapped = intervals(&load_stamps);
        if rep > 0 {
            runs.push(PipelineRun {
                load: load_us,
                compute: compute_us,
                overlapped,
                computing,
                handoff,
                measured,
            });
        }
    }
    client
        .batch_get_session_end(&keys)
        .map_err(|e| format!("batch_get_session_end: {e}"))?;
    // Per layer, the median over the repetitions: a thread that lost its CPU for a few ms
    // in one pass then inflates neither the ideal nor the diagnostics.
    let load_us = per_layer(&runs, |r| &r.load);
    let compute_us = per_layer(&runs, |r| &r.compute);
    let measured = median(&mut runs.iter().map(|r| r.measured).collect::<Vec<_>>());
    let mut handoff: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.handoff.iter().copied())
        .collect();
    let layer_bytes = KEYS * PART;
    let load_med = median(&mut load_us.clone());
    report.line(
        "stream layer load 4MiB (alone)",
        load_med,
        "us",
        "memcpy 1 thread, 4MiB time",
        layer_bytes as f64 / memcpy / 1e3,
    );
    let compute_med = median(&mut compute_us.clone());
    report.line(
        "stream layer compute (busy-wait)",
        compute_med,
        "us",
        "layer load 4MiB alone",
        load_med,
    );
    report.line(
        "  layer load while computing",
        median(&mut per_layer(&runs, |r| &r.overlapped)),
        "us",
        "layer load 4MiB alone",
        load_med,
    );
    report.line(
        "  layer compute while loading",
        median(&mut per_layer(&runs, |r| &r.computing)),
        "us",
        "layer compute alone",
        compute_med,
    );
    let handoff_max = handoff.iter().copied().fold(0.0, f64::max);
    report.line(
        "  compute start after ready p50",
        median(&mut handoff),
        "us",
        "layer load 4MiB alone",
        load_med,
    );
    report.line(
        "  compute start after ready max",
        handoff_max,
        "us",
        "layer load 4MiB alone",
        load_med,
    );
    report.line(
        "stream pipeline 32 layers",
        measured,
        "us",
        "serial sum(load+compute)",
        load_us.iter().sum::<f64>() + compute_us.iter().sum::<f64>(),
    );
    report.line(
        "stream pipeline ideal/measured",
        ideal(&load_us, &compute_us),
        "us",
        "stream pipeline 32 layers",
        measured,
    );
    drop((load, compute));
    client.teardown();
    drop(out);
    Ok(())
}

/// Runs the stream scenarios.
pub fn run(report: &mut Report, memcpy: f64, quick: bool) -> Result<(), String> {
    call_cost(report, quick)?;
    session_layers(report, quick)?;
    pipeline(report, memcpy, quick)?;
    crate::stream_put::run(report, quick)
}
