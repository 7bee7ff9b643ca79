//! Stream-ordered put scenarios (issue 7), on an embedded store with host streams:
//!
//! 1. *Put call cost vs bytes*: the host time of one `batch_put_from_on_stream_raw` call for
//!    16 keys totalling 256 KiB and 16 keys totalling 64 MiB, the stream held while the call
//!    is timed (so the copies, which run on the stream, are excluded). Target ratio ≤ 1.1:
//!    the call reserves and enqueues, it never touches the bytes.
//! 2. *Compute + save*: 32 layers; a "compute" per layer (a busy-wait ≈ 2× one layer's save
//!    copy, writing the layer's bytes) on a compute stream, and each layer saved by an
//!    on-stream put on a save stream gated by an event recorded after the layer's compute.
//!    End to end (first compute to the last ticket final, i.e. committed) against the
//!    computes alone, paired per repetition (median of the ratios). Target ≤ 1.05× (save ≤
//!    compute per layer; "save while computing" shows whether that held).

use crate::limits::median;
use crate::report::Report;
use crate::scenarios::MIB;
use crate::stream::{bail, embedded, lock, settle, spin, sync, Blocker};
use mooncake_rs::client::{Buf, Client};
use mooncake_rs::stream::{HostEvent, HostStream, StreamRef, Ticket};
use mooncake_rs::types::ReplicateConfig;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Issues one on-stream put of `keys` from `bufs` on `stream`.
///
/// # Safety
/// The buffers stay valid and unchanged until the ticket is settled.
unsafe fn put_on(
    client: &Client,
    keys: &[String],
    bufs: Vec<Vec<Buf>>,
    stream: &HostStream,
) -> Result<Ticket, String> {
    // SAFETY: forwarded from the caller.
    unsafe {
        client.batch_put_from_on_stream_raw(
            keys,
            bufs,
            &ReplicateConfig::default(),
            StreamRef::Host(stream),
        )
    }
    .map_err(|e| format!("on-stream put: {e}"))
}

/// `count` buffers of `size` bytes laid out in `base`.
fn bufs_of(base: &[u8], count: usize, size: usize) -> Vec<Vec<Buf>> {
    (0..count)
        .map(|i| vec![Buf::new(base.as_ptr() as usize + i * size, size as u64)])
        .collect()
}

/// Scenario 1: µs per put call for 256 KiB and 64 MiB over 16 keys.
fn call_cost(report: &mut Report, quick: bool) -> Result<(), String> {
    const KEYS: usize = 16;
    let rounds = if quick { 5 } else { 11 };
    let client = embedded("bench-stream-put-a", 96 * MIB)?;
    let stream = HostStream::new()?;
    let (small, big) = (256 << 10, 64 * MIB);
    let small_src = vec![7u8; small];
    let big_src = vec![9u8; big];
    let (mut small_us, mut big_us) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        let mut tickets = Vec::new();
        let blocker = Blocker::block(&stream);
        for (src, total, out) in [
            (&small_src, small, &mut small_us),
            (&big_src, big, &mut big_us),
        ] {
            let keys: Vec<String> = (0..KEYS)
                .map(|k| format!("pc{round}-{total}-{k}"))
                .collect();
            let t = Instant::now();
            // SAFETY: the sources live until the end of this function; settled below.
            match unsafe { put_on(&client, &keys, bufs_of(src, KEYS, total / KEYS), &stream) } {
                Ok(ticket) => tickets.push(ticket),
                Err(e) => return bail(blocker, &tickets, "put call cost", e),
            }
            if round > 0 {
                out.push(t.elapsed().as_secs_f64() * 1e6); // round 0 warms up
            }
        }
        blocker.release();
        settle(&tickets, "put call cost")?;
        client
            .remove_all(true)
            .map_err(|e| format!("remove_all: {e}"))?;
    }
    let (small_med, big_med) = (median(&mut small_us), median(&mut big_us));
    report.line(
        "stream put call 16 keys 256KiB",
        small_med,
        "us",
        "stream put call 16 keys 256KiB",
        small_med,
    );
    report.line(
        "stream put call 16 keys 64MiB",
        big_med,
        "us",
        "stream put call 16 keys 256KiB",
        small_med,
    );
    client.teardown();
    Ok(())
}

/// Scenario 2: compute + save on two host streams against compute alone.
fn compute_and_save(report: &mut Report, quick: bool) -> Result<(), String> {
    const LAYERS: usize = 32;
    const LAYER: usize = 4 * MIB;
    let reps = if quick { 3 } else { 9 };
    // Room for a repetition plus read-back objects whose frees wait for their leases.
    let client = embedded("bench-stream-put-b", (2 * LAYERS + 8) * LAYER)?;
    let compute = HostStream::new()?;
    let save = HostStream::new()?;
    // Written once here so no page fault lands in a timed compute.
    let layers: Vec<Vec<u8>> = (0..LAYERS).map(|_| vec![0xA5u8; LAYER]).collect();
    let events: Vec<HostEvent> = (0..LAYERS).map(|_| HostEvent::new()).collect();
    // One layer's save alone (copy + commit), to size the compute at about twice it.
    let keys = vec!["calibrate".to_string()];
    let t = Instant::now();
    // SAFETY: `layers` lives until the end of this function; settled right away.
    let ticket = unsafe { put_on(&client, &keys, bufs_of(&layers[0], 1, LAYER), &save)? };
    settle(&[ticket], "save calibration")?;
    let save_alone = t.elapsed();
    let compute_for = save_alone * 2;
    let (mut alone, mut both, mut overlapped) = (Vec::new(), Vec::new(), Vec::new());
    let stamps = Arc::new(Mutex::new(Vec::with_capacity(2 * LAYERS)));
    for rep in 0..reps {
        client
            .remove_all(true)
            .map_err(|e| format!("remove_all: {e}"))?;
        // Computes alone.
        let t = Instant::now();
        for layer in &layers {
            let (addr, len) = (layer.as_ptr() as usize, layer.len());
            compute.launch(move || produce(addr, len, compute_for, rep));
        }
        sync(&compute, "computes alone");
        alone.push(t.elapsed().as_secs_f64() * 1e6);
        client
            .remove_all(true)
            .map_err(|e| format!("remove_all: {e}"))?;
        // Computes with each layer saved behind its event.
        let mut tickets = Vec::with_capacity(LAYERS);
        let t = Instant::now();
        for (i, (layer, event)) in layers.iter().zip(&events).enumerate() {
            let (addr, len) = (layer.as_ptr() as usize, layer.len());
            compute.launch(move || produce(addr, len, compute_for, rep));
            event.record(&compute);
            save.wait_event(event);
            let started = stamps.clone();
            save.launch(move || lock(&started).push(Instant::now()));
            let keys = vec![format!("save{rep}-{i}")];
            // SAFETY: the layer is written only by its compute, which the event orders
            // before the put's copy; it lives until the end of this function.
            match unsafe { put_on(&client, &keys, bufs_of(layer, 1, LAYER), &save) } {
                Ok(ticket) => {
                    tickets.push(ticket);
                    let ended = stamps.clone();
                    save.launch(move || lock(&ended).push(Instant::now()));
                }
                Err(e) => {
                    sync(&compute, "compute + save");
                    settle(&tickets, "compute + save")?;
                    return Err(e);
                }
            }
        }
        settle(&tickets, "compute + save")?;
        both.push(t.elapsed().as_secs_f64() * 1e6);
        sync(&save, "compute + save");
        overlapped.extend(
            lock(&stamps)
                .chunks(2)
                .filter(|p| p.len() == 2)
                .map(|p| (p[1] - p[0]).as_secs_f64() * 1e6),
        );
        lock(&stamps).clear();
        let mut check = vec![0u8; LAYER];
        client
            .get_into(&format!("save{rep}-{}", LAYERS - 1), &mut check)
            .map_err(|e| format!("read back: {e}"))?;
        if check[LAYER - 1] != (rep as u8).wrapping_add(1) {
            return Err("compute + save: the saved layer is not the computed one".into());
        }
    }
    // Timing on a shared VM comes in phases: compare each repetition's pair, then take the
    // median ratio.
    let mut ratios: Vec<f64> = both.iter().zip(&alone).map(|(b, a)| b / a).collect();
    let ratio = median(&mut ratios);
    let (alone_med, both_med) = (median(&mut alone), median(&mut both));
    report.line(
        "stream save 1 layer 4MiB (alone)",
        save_alone.as_secs_f64() * 1e6,
        "us",
        "stream layer compute (busy-wait)",
        compute_for.as_secs_f64() * 1e6,
    );
    report.line(
        "  save 1 layer while computing",
        median(&mut overlapped),
        "us",
        "stream layer compute (busy-wait)",
        compute_for.as_secs_f64() * 1e6,
    );
    report.line(
        "stream compute+save 32 layers",
        both_med,
        "us",
        "stream compute alone 32 layers",
        alone_med,
    );
    report.line(
        "  compute+save / compute, paired",
        ratio,
        "x",
        "target",
        1.05,
    );
    client.teardown();
    Ok(())
}

/// The layer's "compute": fills it with a value of this repetition, then busy-waits the rest
/// of `d`.
fn produce(addr: usize, len: usize, d: Duration, rep: usize) {
    let t = Instant::now();
    // SAFETY: the layer buffer (`len` bytes at `addr`) outlives the streams' work and only
    // this compute writes it while the save stream waits for its event.
    unsafe { std::ptr::write_bytes(addr as *mut u8, (rep as u8).wrapping_add(1), len) };
    spin(d.saturating_sub(t.elapsed()));
}

/// Runs the put scenarios.
pub fn run(report: &mut Report, quick: bool) -> Result<(), String> {
    call_cost(report, quick)?;
    compute_and_save(report, quick)
}
