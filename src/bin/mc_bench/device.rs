//! Device scenarios (only with a device runtime, i.e. a real GPU; skipped otherwise):
//! device ↔ local segment through the store (put_from / get_into with device pointers)
//! against the driver's own copy between device memory and pinned host memory, measured in
//! the same run. Target ratio ≥ 0.9.

use crate::report::Report;
use mooncake_rs::client::{Buf, Client, SetupConfig, WriteMode};
use mooncake_rs::device::{self, memcpy_safe, DeviceAlloc, MappedRegion};
use mooncake_rs::types::ReplicateConfig;
use std::time::{Duration, Instant};

const SIZE: usize = 4 << 20;

fn gbps(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Repeats `op` for about `duration`; GB/s at `SIZE` bytes per call.
fn rate(
    duration: Duration,
    mut op: impl FnMut(usize) -> Result<(), String>,
) -> Result<f64, String> {
    let (start, mut n) = (Instant::now(), 0usize);
    while start.elapsed() < duration {
        op(n)?;
        n += 1;
    }
    Ok(gbps((n * SIZE) as u64, start.elapsed().as_secs_f64()))
}

/// Runs the device scenarios, or says why they are skipped.
pub fn run(report: &mut Report, duration: Duration) -> Result<(), String> {
    let info = device::runtime().info();
    if info.runtime == "none" {
        eprintln!("mc_bench: device scenarios skipped (no device runtime)");
        return Ok(());
    }
    let dev = DeviceAlloc::new(SIZE).map_err(|e| format!("device allocation: {e}"))?;
    let pinned = MappedRegion::pinned(SIZE as u64, "bench").map_err(|e| e.to_string())?;
    if !pinned.is_pinned() {
        eprintln!("mc_bench: pinned baseline is pageable (host registration unavailable)");
    }
    let (d, h) = (dev.addr() as *mut u8, pinned.addr() as *mut u8);
    // SAFETY (both closures): SIZE-byte device and host ranges that live for the loop.
    let h2d = rate(duration, |_| unsafe { memcpy_safe(d, h, SIZE) }.map(drop))?;
    let d2h = rate(duration, |_| unsafe { memcpy_safe(h, d, SIZE) }.map(drop))?;
    report.limit("pinned driver copy H2D 4MiB", h2d, "GB/s");
    report.limit("pinned driver copy D2H 4MiB", d2h, "GB/s");

    let client = Client::setup(SetupConfig {
        local_hostname: "bench-device".into(),
        global_segment_size: 256 << 20,
        local_buffer_size: 0,
        master_server_addr: "embedded".into(),
        ..SetupConfig::default()
    })
    .map_err(|e| format!("embedded setup: {e}"))?;
    let cfg = ReplicateConfig::default();
    let buf = Buf::new(dev.addr(), SIZE as u64);
    let before = client.metrics().paths.device_to_local_segment;
    let put = rate(duration, |i| {
        let key = format!("d{}", i % 32);
        let _ = client.remove(&key, true);
        // SAFETY: device memory of SIZE bytes, alive for the call.
        let mut r = unsafe { client.write_raw(&[&key], vec![vec![buf]], &cfg, WriteMode::Put) };
        r.pop()
            .unwrap_or(Ok(()))
            .map_err(|e| format!("put_from device: {e}"))
    })?;
    let put_path = client.metrics().paths.device_to_local_segment;
    report.line(
        "device put_from 4MiB -> segment",
        put,
        "GB/s",
        "pinned driver copy D2H 4MiB",
        d2h,
    );
    let copies = (put_path.copied_bytes - before.copied_bytes) as f64
        / (put_path.bytes - before.bytes).max(1) as f64;
    report.line(
        "device put_from copies/op",
        copies,
        "count",
        "one copy",
        1.0,
    );

    let keys = (put_path.ops - before.ops).min(32) as usize;
    let get = rate(duration, |i| {
        let key = format!("d{}", i % keys.max(1));
        // SAFETY: device memory of SIZE bytes, alive for the call.
        let mut r = unsafe { client.get_into_raw(&[&key], vec![vec![buf]], false) };
        r.pop()
            .unwrap_or(Ok(0))
            .map(drop)
            .map_err(|e| format!("get_into device: {e}"))
    })?;
    report.line(
        "device get_into 4MiB <- segment",
        get,
        "GB/s",
        "pinned driver copy H2D 4MiB",
        h2d,
    );
    client.teardown();
    Ok(())
}
