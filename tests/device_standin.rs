//! Device-memory paths without a GPU: stand-in driver libraries (`tests/standin/*.c`, built
//! here with `cc`, test-only) are loaded as `libcuda.so` / `libascendcl.so` through
//! `LD_LIBRARY_PATH` in a child process (this test binary, re-run on one `child_*` test).
//! Their "device memory" is a PROT_NONE mapping, so any host memcpy on a device pointer
//! crashes the child; only the driver copy reaches it.
//!
//! Each `child_*` test is `#[ignore]`d: its parent test runs it by name (`--ignored`) in a
//! fresh process, against whichever driver the loader finds there. `scripts/gpu-check` runs the CUDA path checks
//! (`child_cuda_local_paths`, `child_cuda_remote_paths`) against a real GPU this way.

mod common;

use common::pattern;
use common::standin::*;
use mooncake_rs::client::{Client, WriteMode};
use mooncake_rs::device::{self, DeviceAlloc, DeviceStats};
use mooncake_rs::ffi::config::*;
use mooncake_rs::ffi::store::*;
use mooncake_rs::ffi::store_c::*;
use mooncake_rs::ffi::store_get::*;
use mooncake_rs::ffi::store_put::*;
use mooncake_rs::ffi::store_session::*;
use mooncake_rs::transfer::{PathStats, TransferOp};
use mooncake_rs::transfer_api::{EndpointConfig, TransferEndpoint, TransferPart};
use mooncake_rs::types::ReplicateConfig;
use std::ffi::{c_void, CString};
use std::path::Path;
use std::process::Command;
use std::ptr::null;

#[test]
fn cuda_every_api_path_accepts_device_pointers() {
    child("cuda_local_paths", &cuda(), &[]);
}

#[test]
fn cuda_remote_paths_stage_device_memory_only() {
    // Two clients of one process: keep them on the TCP paths this test counts.
    child("cuda_remote_paths", &cuda(), &[("MC_SAME_HOST", "0")]);
}

#[test]
fn cuda_transfer_endpoints_move_device_memory_through_the_driver() {
    child("cuda_transfer_endpoint", &cuda(), &[]);
}

#[test]
fn standin_device_memory_is_not_host_readable() {
    // The negative control: a plain host read of a "device" pointer kills the child.
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_host_read_crashes",
            "--exact",
            "--ignored",
            "--test-threads=1",
        ])
        .env("LD_LIBRARY_PATH", cuda())
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{:?}", out.status);
}

#[test]
fn registration_failure_is_not_fatal() {
    child(
        "cuda_register_fails",
        &cuda(),
        &[("FAKE_FAIL_HOST_REGISTER", "1")],
    );
}

#[test]
fn pin_budget_is_respected() {
    // The local buffer (4 MiB, mapped first) fits; the segment (32 MiB) would not.
    let budget = (8 * MIB).to_string();
    child(
        "cuda_pin_budget",
        &cuda(),
        &[("MC_STORE_PIN_MEMORY_MAX_BYTES", &budget)],
    );
}

#[test]
fn missing_symbol_disables_only_its_feature() {
    let dir = build(
        "cuda_standin.c",
        "libcuda.so",
        "cuda-noreg",
        &["-DSTANDIN_NO_HOST_REGISTER"],
    );
    let log = child("cuda_no_register_symbols", &dir, &[]);
    assert_eq!(
        log.matches("CUDA host registration disabled").count(),
        1,
        "{log}"
    );
}

#[test]
fn absent_libcuda_falls_back_to_host_only() {
    let empty = Path::new(env!("CARGO_TARGET_TMPDIR")).join("standin-empty");
    std::fs::create_dir_all(&empty).unwrap();
    let log = child("no_runtime", &empty, &[]);
    // SAFETY: only tries to open candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        assert_eq!(log.matches("no device runtime").count(), 1, "{log}");
    }
}

#[test]
fn ascend_paths_use_acl() {
    child(
        "ascend_paths",
        &ascend(),
        &[("MC_DEVICE_RUNTIME", "ascend")],
    );
}

// ---------------------------------------------------------------- child side

fn delta(after: PathStats, before: PathStats) -> (u64, u64, u64) {
    (
        after.ops - before.ops,
        after.bytes - before.bytes,
        after.copied_bytes - before.copied_bytes,
    )
}

fn cfg() -> ReplicateConfig {
    ReplicateConfig::default()
}

/// Device put → local segment and local segment → device get, through the Rust raw API,
/// every `mc_*` put/get family and the `mooncake_store_*` API, with exact counters.
#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_local_paths() {
    assert_eq!(device::runtime().info().runtime, "cuda");
    let client = embedded(64 * MIB, 16 * MIB);
    assert!(
        DeviceStats::snapshot().host_registrations >= 2,
        "segment and local buffer pinned"
    );
    // Seed rows "GPU -> local segment" and "reads into device memory": one driver copy
    // each (the other two are the test's own fill and read-back of device memory).
    let driver_before = DeviceStats::snapshot().driver_copy_bytes;
    let n = round_trip_device(&client, MIB as usize + 3);
    assert_eq!(
        DeviceStats::snapshot().driver_copy_bytes - driver_before,
        4 * n
    );
    let size = n as usize;
    let value = pattern(size, 1);

    // Seed row "CPU -> local segment": one copy, also for the copying put (no staging).
    for (key, copying) in [("cpu-from", false), ("cpu-copying", true)] {
        let before = client.metrics();
        let host_before = DeviceStats::snapshot().host_copy_bytes;
        if copying {
            client.put(key, &value, &cfg()).unwrap();
        } else {
            client.put_from(key, &value, &cfg()).unwrap();
        }
        let after = client.metrics();
        assert_eq!(
            delta(
                after.paths.host_to_local_segment,
                before.paths.host_to_local_segment
            ),
            (1, n, n),
            "{key}"
        );
        assert_eq!(
            DeviceStats::snapshot().host_copy_bytes - host_before,
            n,
            "{key}: one copy"
        );
    }

    // Seed row "get_buffer": exactly one copy, owned by the caller.
    let before = client.metrics();
    let handle = client.get_buffer("cpu-from").unwrap();
    assert_eq!(handle.as_slice(), &value[..]);
    let after = client.metrics();
    assert_eq!(
        (
            after.get_buffer.ops - before.get_buffer.ops,
            after.get_buffer.copied_bytes - before.get_buffer.copied_bytes
        ),
        (1, n)
    );
    assert_eq!(
        delta(
            after.paths.local_segment_to_host,
            before.paths.local_segment_to_host
        ),
        (1, n, n)
    );
    drop(handle);
    client.teardown();
    drop(client);
    c_api_with_device_pointers();
    let lib = c"libcuda.so";
    assert_eq!(
        standin_counter(lib, c"fake_host_registered"),
        standin_counter(lib, c"fake_host_unregistered"),
        "every pinned region unpinned at teardown"
    );
}

/// Every `mc_*` and `mooncake_store_*` put/get path with device sources and destinations.
fn c_api_with_device_pointers() {
    let store = mc_store_new();
    let mut config = std::mem::MaybeUninit::<mc_setup_config_t>::uninit();
    mc_setup_config_init(config.as_mut_ptr());
    // SAFETY: initialised above.
    let mut config = unsafe { config.assume_init() };
    config.local_hostname = c"standin-c".as_ptr();
    config.global_segment_size = 64 * MIB;
    config.local_buffer_size = 16 * MIB;
    config.master_server_addr = c"embedded".as_ptr();
    assert_eq!(mc_store_setup(store, &config), 0);
    let size = 64 * 1024 + 5;
    let values: Vec<Vec<u8>> = (0..4).map(|i| pattern(size, 10 + i)).collect();
    let devs: Vec<DeviceAlloc> = values.iter().map(|v| device_with(v)).collect();
    let ptr = |i: usize| devs[i].addr() as *const c_void;
    let key = |name: &str| CString::new(name).unwrap();
    let halves = |i: usize| [ptr(i), (devs[i].addr() + size / 2) as *const c_void];
    let half_sizes = [size / 2, size - size / 2];

    // Writes: every family, keyed by family name; `expect[k]` = value index.
    let mut expect: Vec<(CString, usize)> = Vec::new();
    type Single<'a> = &'a dyn Fn(*const std::ffi::c_char, usize) -> std::ffi::c_int;
    let singles: [(&str, usize, Single); 7] = [
        ("put", 0, &|k, i| {
            mc_store_put(store, k, ptr(i), size, null())
        }),
        ("put_from", 1, &|k, i| {
            mc_store_put_from(store, k, ptr(i), size, null())
        }),
        ("upsert", 2, &|k, i| {
            mc_store_upsert(store, k, ptr(i), size, null())
        }),
        ("upsert_from", 3, &|k, i| {
            mc_store_upsert_from(store, k, ptr(i), size, null())
        }),
        ("mooncake_put", 2, &|k, i| {
            mooncake_store_put_from(store.cast(), k, ptr(i).cast_mut(), size, null())
        }),
        ("put_parts", 0, &|k, i| {
            mc_store_put_parts(store, k, halves(i).as_ptr(), half_sizes.as_ptr(), 2, null())
        }),
        ("upsert_parts", 1, &|k, i| {
            mc_store_upsert_parts(store, k, halves(i).as_ptr(), half_sizes.as_ptr(), 2, null())
        }),
    ];
    for (family, i, write) in singles {
        let k = key(family);
        assert_eq!(write(k.as_ptr(), i), 0, "{family}");
        expect.push((k, i));
    }
    let sizes = [size; 2];
    for (family, first) in [
        "put_batch",
        "upsert_batch",
        "batch_put_from",
        "batch_upsert_from",
        "multi_put",
        "multi_upsert",
        "mooncake_batch",
    ]
    .iter()
    .zip([0usize, 2, 1, 3, 0, 2, 1])
    {
        let keys = [key(&format!("{family}-a")), key(&format!("{family}-b"))];
        let kp = [keys[0].as_ptr(), keys[1].as_ptr()];
        let bufs = [ptr(first), ptr((first + 1) % 4)];
        let mut results = [7; 2];
        let rc = match *family {
            "put_batch" => {
                mc_store_put_batch(store, kp.as_ptr(), bufs.as_ptr(), sizes.as_ptr(), 2, null())
            }
            "upsert_batch" => {
                mc_store_upsert_batch(store, kp.as_ptr(), bufs.as_ptr(), sizes.as_ptr(), 2, null())
            }
            "batch_put_from" => mc_store_batch_put_from(
                store,
                kp.as_ptr(),
                bufs.as_ptr(),
                sizes.as_ptr(),
                2,
                null(),
                results.as_mut_ptr(),
            ),
            "batch_upsert_from" => mc_store_batch_upsert_from(
                store,
                kp.as_ptr(),
                bufs.as_ptr(),
                sizes.as_ptr(),
                2,
                null(),
                results.as_mut_ptr(),
            ),
            "mooncake_batch" => {
                let mut kp = kp;
                let mut bufs = bufs.map(|b| b.cast_mut());
                mooncake_store_batch_put_from(
                    store.cast(),
                    kp.as_mut_ptr(),
                    bufs.as_mut_ptr(),
                    sizes.as_ptr(),
                    2,
                    null(),
                    results.as_mut_ptr(),
                )
            }
            _ => {
                let lists = [[bufs[0]], [bufs[1]]];
                let lp = [lists[0].as_ptr(), lists[1].as_ptr()];
                let sz = [[size], [size]];
                let sp = [sz[0].as_ptr(), sz[1].as_ptr()];
                let counts = [1usize, 1];
                let f = if *family == "multi_put" {
                    mc_store_batch_put_from_multi_buffers
                } else {
                    mc_store_batch_upsert_from_multi_buffers
                };
                f(
                    store,
                    kp.as_ptr(),
                    2,
                    lp.as_ptr(),
                    sp.as_ptr(),
                    counts.as_ptr(),
                    null(),
                    results.as_mut_ptr(),
                )
            }
        };
        assert_eq!(rc, 0, "{family}");
        assert!(
            results == [7, 7] || results == [0, 0],
            "{family}: {results:?}"
        );
        let [a, b] = keys;
        expect.push((a, first));
        expect.push((b, (first + 1) % 4));
    }
    let k = key("session_put");
    let mut one = [9];
    assert_eq!(
        mc_store_batch_put_session_start(
            store,
            [k.as_ptr()].as_ptr(),
            [size as u64].as_ptr(),
            1,
            null(),
            one.as_mut_ptr()
        ),
        0
    );
    let (lists, offs) = ([halves(3)], [[0u64, (size / 2) as u64]]);
    let mut ranged = [0i64];
    assert_eq!(
        mc_store_batch_put_from_multi_buffer_ranges(
            store,
            [k.as_ptr()].as_ptr(),
            1,
            [lists[0].as_ptr()].as_ptr(),
            [half_sizes.as_ptr()].as_ptr(),
            [offs[0].as_ptr()].as_ptr(),
            [2usize].as_ptr(),
            ranged.as_mut_ptr()
        ),
        0
    );
    assert_eq!(ranged, [size as i64]);
    assert_eq!(
        mc_store_batch_put_session_end(store, [k.as_ptr()].as_ptr(), 1, one.as_mut_ptr()),
        0
    );
    expect.push((k, 3));

    // Reads into device memory: every get family.
    let out = DeviceAlloc::new(size).unwrap();
    let check = |i: usize, what: &str| assert_eq!(read_device(&out), values[i], "{what}");
    for (k, i) in &expect {
        assert_eq!(
            mc_store_get_into(store, k.as_ptr(), out.addr() as *mut c_void, size),
            size as i64,
            "{k:?}"
        );
        check(*i, "get_into");
        assert_eq!(
            mooncake_store_get_into(store.cast(), k.as_ptr(), out.addr() as *mut c_void, size),
            size as i64
        );
        check(*i, "mooncake get_into");
    }
    let (k, i) = &expect[1];
    let kp = [k.as_ptr()];
    let mut results = [0i64];
    let outs = [out.addr() as *mut c_void];
    assert_eq!(
        mc_store_batch_get_into(
            store,
            kp.as_ptr(),
            outs.as_ptr(),
            [size].as_ptr(),
            1,
            results.as_mut_ptr()
        ),
        0
    );
    assert_eq!(results, [size as i64]);
    check(*i, "batch_get_into");
    let mut kpm = kp;
    let mut outm = outs;
    assert_eq!(
        mooncake_store_batch_get_into(
            store.cast(),
            kpm.as_mut_ptr(),
            outm.as_mut_ptr(),
            [size].as_ptr(),
            1,
            results.as_mut_ptr()
        ),
        0
    );
    check(*i, "mooncake batch_get_into");
    let split = [
        out.addr() as *mut c_void,
        (out.addr() + size / 2) as *mut c_void,
    ];
    assert_eq!(
        mc_store_batch_get_into_multi_buffers(
            store,
            kp.as_ptr(),
            1,
            [split.as_ptr()].as_ptr(),
            [half_sizes.as_ptr()].as_ptr(),
            [2usize].as_ptr(),
            results.as_mut_ptr()
        ),
        0
    );
    check(*i, "multi_buffers");
    let ranges = [
        mc_range_t {
            buffer_index: 0,
            key: k.as_ptr(),
            dst_offset: 0,
            src_offset: 0,
            size: (size / 2) as u64,
        },
        mc_range_t {
            buffer_index: 0,
            key: k.as_ptr(),
            dst_offset: (size / 2) as u64,
            src_offset: (size / 2) as u64,
            size: (size - size / 2) as u64,
        },
    ];
    let mut two = [0i64; 2];
    assert_eq!(
        mc_store_get_into_ranges(
            store,
            outs.as_ptr(),
            [size].as_ptr(),
            1,
            ranges.as_ptr(),
            2,
            two.as_mut_ptr()
        ),
        0
    );
    assert_eq!(two, [(size / 2) as i64, (size - size / 2) as i64]);
    check(*i, "get_into_ranges");
    let mut started = [9];
    assert_eq!(
        mc_store_batch_get_session_start(store, kp.as_ptr(), 1, started.as_mut_ptr()),
        0
    );
    assert_eq!(started, [0]);
    let offs = [0u64, (size / 2) as u64];
    assert_eq!(
        mc_store_batch_get_into_multi_buffer_ranges(
            store,
            kp.as_ptr(),
            1,
            [split.as_ptr()].as_ptr(),
            [half_sizes.as_ptr()].as_ptr(),
            [offs.as_ptr()].as_ptr(),
            [2usize].as_ptr(),
            results.as_mut_ptr()
        ),
        0
    );
    assert_eq!(results, [size as i64]);
    check(*i, "session ranges");
    assert_eq!(mc_store_batch_get_session_end(store, kp.as_ptr(), 1), 0);
    mc_store_free(store);
}

/// Over TCP between two clients of one master: device memory goes through a pinned bounce
/// (one copy each way), host memory is sent and received in place (no local copy).
#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_remote_paths() {
    let master = TcpMaster::start();
    let owner = master.client(64 * MIB);
    let client = master.client(0);
    let remote = ReplicateConfig {
        preferred_segments: vec![owner.get_hostname()],
        ..ReplicateConfig::default()
    };
    // 9 MiB + 1: three bounce chunks per lane split.
    let size = 9 * MIB as usize + 1;
    let n = size as u64;
    let value = pattern(size, 5);
    let src = device_with(&value);
    let before = client.metrics();
    // SAFETY: device memory of its length.
    let r = unsafe { client.write_raw(&["dev"], vec![vec![buf(&src)]], &remote, WriteMode::Put) };
    assert_eq!(r, vec![Ok(())]);
    let after = client.metrics();
    assert_eq!(
        delta(after.paths.device_to_remote, before.paths.device_to_remote),
        (1, n, n)
    );
    assert_eq!(
        after.transfer.device_staging_bytes - before.transfer.device_staging_bytes,
        n
    );

    let dst = DeviceAlloc::new(size).unwrap();
    let before = client.metrics();
    // SAFETY: device memory of its length.
    let r = unsafe { client.get_into_raw(&["dev"], vec![vec![buf(&dst)]], false) };
    assert_eq!(r, vec![Ok(n)]);
    assert_eq!(read_device(&dst), value);
    let after = client.metrics();
    assert_eq!(
        delta(after.paths.remote_to_device, before.paths.remote_to_device),
        (1, n, n)
    );

    // Host memory: registered and unregistered buffers, no local copy either way (TCP).
    let mut registered = value.clone();
    client
        .register_buffer(registered.as_mut_ptr() as usize, size)
        .unwrap();
    let before = client.metrics();
    client.put_from("reg", &registered, &remote).unwrap();
    client.put_from("unreg", &value, &remote).unwrap();
    let mut out = vec![0u8; size];
    assert_eq!(client.get_into("unreg", &mut out), Ok(n));
    assert_eq!(out, value);
    let after = client.metrics();
    assert_eq!(
        delta(
            after.paths.registered_to_remote,
            before.paths.registered_to_remote
        ),
        (1, n, 0)
    );
    assert_eq!(
        delta(
            after.paths.unregistered_to_remote,
            before.paths.unregistered_to_remote
        ),
        (1, n, 0)
    );
    assert_eq!(
        delta(after.paths.remote_to_host, before.paths.remote_to_host),
        (1, n, 0)
    );
    assert_eq!(
        after.transfer.device_staging_copies,
        before.transfer.device_staging_copies
    );
    client
        .unregister_buffer(registered.as_mut_ptr() as usize)
        .unwrap();
}

/// `mooncake.engine`'s path, as SGLang and vLLM use it with their GPU KV caches: a target that
/// registered device memory, an initiator moving bytes into and out of it from host memory and
/// from its own device memory, over TCP (P2P handshake names). The data server and the
/// initiator reach device memory only through the driver: a host access to the stand-in's
/// device memory would kill this child.
#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_transfer_endpoint() {
    let start = || {
        TransferEndpoint::start(&EndpointConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: "P2PHANDSHAKE".into(),
            metadata_type: None,
            protocol: "tcp".into(),
            device_name: String::new(),
        })
        .unwrap()
    };
    let (target, initiator) = (start(), start());
    let size = 3 * MIB as usize + 17;
    let remote = DeviceAlloc::new(size).unwrap();
    let host_value = pattern(size, 9);
    let device_value = pattern(size, 4);
    let device_src = device_with(&device_value);
    let device_dst = DeviceAlloc::new(size).unwrap();
    let mut host_dst = vec![0u8; size];
    // SAFETY: every range is memory of its length that outlives both endpoints' use of it
    // (the endpoints are dropped before the allocations).
    unsafe {
        target.register(remote.addr(), size).unwrap();
        for addr in [
            host_value.as_ptr() as usize,
            host_dst.as_mut_ptr() as usize,
            device_src.addr(),
            device_dst.addr(),
        ] {
            initiator.register(addr, size).unwrap();
        }
    }
    let moved = |op, local: usize| {
        let part = TransferPart {
            local,
            remote: remote.addr() as u64,
            len: size as u64,
        };
        // SAFETY: the local range is registered and alive for the call.
        unsafe { initiator.transfer(target.segment_name(), op, &[part]) }
    };
    moved(TransferOp::Write, host_value.as_ptr() as usize).unwrap();
    assert_eq!(read_device(&remote), host_value, "host -> remote device");
    moved(TransferOp::Read, host_dst.as_mut_ptr() as usize).unwrap();
    assert_eq!(host_dst, host_value, "remote device -> host");
    moved(TransferOp::Write, device_src.addr()).unwrap();
    moved(TransferOp::Read, device_dst.addr()).unwrap();
    assert_eq!(
        read_device(&device_dst),
        device_value,
        "device -> remote device -> device"
    );
    // One call mixing the target's device and host memory, part by part: host and device
    // requests follow each other on a connection (host reads are gathered, device ones not).
    let remote_host = vec![0u8; size];
    // SAFETY: as above.
    unsafe { target.register(remote_host.as_ptr() as usize, size) }.unwrap();
    let piece = 64 * 1024;
    let mixed = |local: usize| -> Vec<TransferPart> {
        (0..16)
            .map(|i| TransferPart {
                local: local + i * piece,
                remote: if i % 2 == 0 {
                    remote.addr()
                } else {
                    remote_host.as_ptr() as usize
                } as u64
                    + (i * piece) as u64,
                len: piece as u64,
            })
            .collect()
    };
    let name = target.segment_name();
    // SAFETY: registered local ranges, alive for the calls.
    unsafe {
        initiator
            .transfer(
                name,
                TransferOp::Write,
                &mixed(host_value.as_ptr() as usize),
            )
            .unwrap();
        host_dst.fill(0);
        initiator
            .transfer(
                name,
                TransferOp::Read,
                &mixed(host_dst.as_mut_ptr() as usize),
            )
            .unwrap();
    }
    assert_eq!(
        host_dst[..16 * piece],
        host_value[..16 * piece],
        "mixed parts"
    );
    // Upstream's write_bytes_to_buffer / read_bytes_from_buffer on device memory.
    initiator
        .write_local(device_dst.addr() + 5, b"kv ready")
        .unwrap();
    assert_eq!(
        initiator.read_local(device_dst.addr() + 5, 8).unwrap(),
        b"kv ready"
    );
    drop((target, initiator));
}

/// Device memory over RDMA, inside the soft-RoCE VM (`scripts/rdma-tests.sh` runs it there;
/// elsewhere it prints that it skipped). The stand-in offers no GPUDirect (no flush
/// attribute), so device memory, registered or not, is staged: one driver copy per bounce.
#[test]
fn cuda_device_memory_over_rdma_is_staged_through_bounces() {
    if std::env::var_os("RDMA_VM").is_none() {
        eprintln!("skipped: needs the soft-RoCE VM (scripts/rdma-tests.sh)");
        return;
    }
    // Two clients of one process: keep them off the same-host mapped path. One part per
    // request, so each part spans several 4 MiB bounces.
    child(
        "cuda_rdma_paths",
        &cuda(),
        &[("MC_SAME_HOST", "0"), ("MC_TCP_LANES_PER_PEER", "1")],
    );
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_rdma_paths() {
    let device = std::env::var("RDMA_VM_DEV").expect("RDMA_VM_DEV");
    let host = std::env::var("RDMA_VM_ADDR").expect("RDMA_VM_ADDR");
    let master = TcpMaster::start();
    let owner = master.rdma_client(64 * MIB, &device, &host);
    let client = master.rdma_client(0, &device, &host);
    let remote = ReplicateConfig {
        preferred_segments: vec![owner.get_hostname()],
        ..ReplicateConfig::default()
    };
    // 9 MiB + 1 in one part (MC_TCP_LANES_PER_PEER=1): three bounces of at most 4 MiB.
    let size = 9 * MIB as usize + 1;
    let n = size as u64;
    let value = pattern(size, 9);
    let src = device_with(&value);
    let dst = DeviceAlloc::new(size).unwrap();
    let start = client.metrics();
    for registered in [false, true] {
        if registered {
            // The stand-in cannot flush NIC writes: GPUDirect refuses, the range is kept
            // registered without an MR and staged like unregistered device memory.
            for d in [&src, &dst] {
                client.register_buffer(d.addr(), d.len()).unwrap();
            }
        }
        let key = format!("dev-{registered}");
        let before = client.metrics();
        // SAFETY: device memory of its length.
        let r =
            unsafe { client.write_raw(&[&key], vec![vec![buf(&src)]], &remote, WriteMode::Put) };
        assert_eq!(
            r,
            vec![Ok(())],
            "{}",
            mooncake_rs::error::last_error_message()
        );
        // SAFETY: device memory of its length.
        let r = unsafe { client.get_into_raw(&[&key], vec![vec![buf(&dst)]], false) };
        assert_eq!(
            r,
            vec![Ok(n)],
            "{}",
            mooncake_rs::error::last_error_message()
        );
        assert_eq!(read_device(&dst), value, "registered: {registered}");
        let after = client.metrics();
        let (t, b) = (&after.transfer, &before.transfer);
        assert_eq!(
            delta(after.paths.device_to_remote, before.paths.device_to_remote),
            (1, n, n)
        );
        assert_eq!(
            delta(after.paths.remote_to_device, before.paths.remote_to_device),
            (1, n, n)
        );
        assert_eq!(t.rdma_write_bytes - b.rdma_write_bytes, n);
        assert_eq!(t.rdma_read_bytes - b.rdma_read_bytes, n);
        assert_eq!(t.rdma_bounce_bytes - b.rdma_bounce_bytes, 2 * n);
        assert_eq!(t.device_staging_bytes - b.device_staging_bytes, 2 * n);
        assert_eq!(t.rdma_gpudirect_bytes, b.rdma_gpudirect_bytes);
    }
    let end = client.metrics().transfer;
    assert_eq!(
        end.tcp_read_bytes + end.tcp_write_bytes,
        start.transfer.tcp_read_bytes + start.transfer.tcp_write_bytes
    );
    for d in [&src, &dst] {
        client.unregister_buffer(d.addr()).unwrap();
    }
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_host_read_crashes() {
    let d = DeviceAlloc::new(64).unwrap();
    // SAFETY: deliberately not: the stand-in's device memory is PROT_NONE.
    let byte = unsafe { std::ptr::read_volatile(d.addr() as *const u8) };
    println!("read {byte} from device memory: the stand-in is broken");
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_register_fails() {
    let client = embedded(16 * MIB, 4 * MIB);
    let stats = DeviceStats::snapshot();
    assert!(stats.host_register_failures >= 2, "{stats:?}");
    assert_eq!(stats.host_registrations, 0);
    assert!(client.metrics().device.host_register_failures >= 2);
    round_trip_device(&client, 256 * 1024 + 7);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_pin_budget() {
    let _client = embedded(32 * MIB, 4 * MIB);
    let stats = DeviceStats::snapshot();
    // Registered: the local buffer and the stream gate words (1024 slots of 8 bytes);
    // over the budget: the segment and the 64 MiB stream staging.
    assert_eq!(
        (stats.host_registrations, stats.host_register_skipped),
        (2, 2),
        "{stats:?}"
    );
    assert_eq!(stats.host_registered_bytes, 4 * MIB + 8192);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_no_register_symbols() {
    mooncake_rs::init_logging();
    let info = device::runtime().info();
    assert_eq!((info.runtime, info.host_register), ("cuda", false));
    let client = embedded(16 * MIB, 4 * MIB);
    assert!(DeviceStats::snapshot().host_register_skipped >= 2);
    round_trip_device(&client, 256 * 1024 + 7);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_no_runtime() {
    mooncake_rs::init_logging();
    let client = embedded(16 * MIB, 4 * MIB);
    if device::runtime().info().runtime == "none" {
        assert_eq!(DeviceStats::snapshot().host_registrations, 0);
    }
    client.put("k", b"host only", &cfg()).unwrap();
    let mut out = [0u8; 9];
    assert_eq!(client.get_into("k", &mut out), Ok(9));
    assert_eq!(&out, b"host only");
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_ascend_paths() {
    assert_eq!(device::runtime().info().runtime, "ascend");
    let client = embedded(16 * MIB, 4 * MIB);
    assert!(DeviceStats::snapshot().host_registrations >= 2);
    round_trip_device(&client, 256 * 1024 + 7);
    let lib = c"libascendcl.so";
    assert!(standin_counter(lib, c"fake_device_copies").unwrap() >= 3);
}

/// Device → local segment → device through the raw Rust API, with exact path counters;
/// returns the size.
fn round_trip_device(client: &Client, size: usize) -> u64 {
    let value = pattern(size, 3);
    let src = device_with(&value);
    let before = client.metrics();
    // SAFETY: device memory of its length.
    let r = unsafe { client.write_raw(&["rt"], vec![vec![buf(&src)]], &cfg(), WriteMode::Upsert) };
    assert_eq!(r, vec![Ok(())]);
    let dst = DeviceAlloc::new(size).unwrap();
    // SAFETY: device memory of its length.
    let r = unsafe { client.get_into_raw(&["rt"], vec![vec![buf(&dst)]], false) };
    assert_eq!(r, vec![Ok(size as u64)]);
    assert_eq!(read_device(&dst), value);
    let after = client.metrics();
    let n = size as u64;
    assert_eq!(
        delta(
            after.paths.device_to_local_segment,
            before.paths.device_to_local_segment
        ),
        (1, n, n)
    );
    assert_eq!(
        delta(
            after.paths.local_segment_to_device,
            before.paths.local_segment_to_device
        ),
        (1, n, n)
    );
    assert_eq!(after.transfer.device_staging_copies, 0, "no bounce locally");
    n
}

/// GPUDirect's first step on a real driver (run by `scripts/gpu-check`): device memory is
/// exported as a dma-buf (the allocation, with the requested address's offset in it); a range
/// that leaves its allocation, and host memory, are refused with a reason. A device without
/// dma-buf support says so and the check ends there.
#[test]
#[ignore = "a GPU check: scripts/gpu-check runs it by name against a real driver (the stand-in exports no dma-buf)"]
fn child_cuda_dmabuf_export() {
    let alloc = DeviceAlloc::new(4 * MIB as usize).unwrap();
    let buf = match device::runtime().export_dmabuf(alloc.addr() + 4096, 4096) {
        Ok(buf) => buf,
        Err(why) if why.contains("does not support dma-buf") => {
            eprintln!("NOT SUPPORTED: {why}");
            return;
        }
        Err(why) => panic!("dma-buf export refused: {why}"),
    };
    assert_eq!(buf.offset, 4096);
    use std::os::fd::AsRawFd;
    let target = std::fs::read_link(format!("/proc/self/fd/{}", buf.fd.as_raw_fd())).unwrap();
    // Kernels name the file "anon_inode:dmabuf" or, since dma-buf has its own pseudo file
    // system, "/dmabuf:<name>" (seen on the H200 machine).
    let name = target.to_string_lossy();
    assert!(
        name.starts_with("anon_inode:dmabuf") || name.starts_with("/dmabuf:"),
        "{target:?}"
    );
    let past_end = device::runtime().export_dmabuf(alloc.addr() + 4096, 4 * MIB as usize);
    assert!(past_end.is_err_and(|why| why.contains("not inside one device allocation")));
    let host = vec![0u8; 4096];
    let refused = device::runtime().export_dmabuf(host.as_ptr() as usize, host.len());
    assert!(refused.is_err_and(|why| why.contains("not device memory")));
}
