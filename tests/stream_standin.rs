//! On-stream gets and puts on *device* streams without a GPU: the stand-in drivers of
//! `tests/standin/` (see `tests/device_standin.rs`) run fake streams, so these tests drive
//! the crate's CUDA and Ascend stream operations (`device::StreamOps`) through the public
//! `Client::*_on_stream_raw` API: the call returns before the data moves, resident replicas
//! are copied straight from the pinned segment, remote ones go through the gate and pinned
//! staging, no async copy ever has a pageable host side, captured or NULL streams are
//! refused with nothing enqueued, and a driver without stream symbols means `NOT_SUPPORTED`
//! while everything else keeps working.
//!
//! Each `child_*` test is `#[ignore]`d: its parent test runs it by name (`--ignored`) in a
//! fresh process. Every wait is bounded; nothing asserts on timing.

mod common;

use common::standin::*;
use common::streams::on;
use common::{pattern, wait_until};
use mooncake_rs::client::{Buf, Client};
use mooncake_rs::device::{self, DeviceAlloc};
use mooncake_rs::stream::{HostStream, StreamRef, Ticket, TICKET_PENDING};
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const LIMIT: Option<Duration> = Some(Duration::from_secs(20));
/// What device destinations hold before a get (device memory is not zeroed on a real GPU).
const FILL: u8 = 0xEE;

// ---------------------------------------------------------------- parent side

#[test]
fn cuda_stream_get_of_resident_data_returns_before_the_data_moves() {
    child("cuda_stream_local", &cuda(), &[]);
}

#[test]
fn cuda_stream_get_of_remote_data_is_gated_and_staged() {
    child("cuda_stream_remote", &cuda(), &[]);
}

#[test]
fn cuda_captured_or_null_streams_are_refused_with_nothing_enqueued() {
    child("cuda_stream_refusals", &cuda(), &[]);
}

#[test]
fn missing_stream_symbols_mean_not_supported() {
    let dir = build(
        "cuda_standin.c",
        "libcuda.so",
        "cuda-nostreams",
        &["-DSTANDIN_NO_STREAMS"],
    );
    let log = child("cuda_no_stream_symbols", &dir, &[]);
    assert_eq!(
        log.matches("CUDA stream operations disabled").count(),
        1,
        "{log}"
    );
}

#[test]
fn cuda_stream_copies_of_the_own_segment_hold_its_mount_through_a_remount() {
    child("cuda_stream_remount", &cuda(), &[]);
}

#[test]
fn cuda_stream_puts_copy_in_stream_order_and_commit_after_the_marker() {
    child("cuda_stream_put", &cuda(), &[]);
}

#[test]
fn ascend_stream_gets_use_acl() {
    child(
        "ascend_stream",
        &ascend(),
        &[("MC_DEVICE_RUNTIME", "ascend")],
    );
}

#[test]
fn copy_failures_reach_the_ticket_and_nothing_unfilled_is_committed() {
    child("copy_failures", &cuda(), &[]);
}

#[test]
fn ascend_copy_failures_reach_the_ticket() {
    child(
        "ascend_copy_failures",
        &ascend(),
        &[("MC_DEVICE_RUNTIME", "ascend")],
    );
}

// ---------------------------------------------------------------- child side

type HostFn = unsafe extern "C" fn(*mut c_void);

/// The driver a child drives its streams with (the one the crate loaded).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Driver {
    Cuda,
    Ascend,
}

impl Driver {
    /// The loaded driver library: cudarc's own handle for CUDA (so this also works with a
    /// real `libcuda.so.1`), `libascendcl.so` (already loaded by the crate) for Ascend.
    fn library(self) -> &'static libloading::Library {
        static ASCEND: OnceLock<libloading::Library> = OnceLock::new();
        match self {
            // SAFETY: the crate's runtime loaded the library (checked by the caller).
            Driver::Cuda => unsafe { cudarc::driver::sys::culib() },
            Driver::Ascend => ASCEND.get_or_init(|| {
                // SAFETY: the library is already loaded; this only takes another reference.
                unsafe { libloading::Library::new("libascendcl.so") }.expect("libascendcl.so")
            }),
        }
    }

    /// The driver entry point `name` with signature `F`.
    ///
    /// # Safety
    /// `F` is the entry point's real signature.
    unsafe fn entry<F: Copy>(self, name: &str) -> F {
        // SAFETY: forwarded from the caller.
        *unsafe { self.library().get::<F>(name.as_bytes()) }
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn check(self, what: &str, rc: c_int) {
        assert_eq!(rc, 0, "{self:?} {what}");
    }

    /// Makes a context current on this thread (the stand-ins need none for stream
    /// management; a real driver does).
    fn enter(self) {
        assert_eq!(device::runtime().info().runtime, self.name());
        // SAFETY: documented driver prototypes.
        unsafe {
            match self {
                Driver::Cuda => {
                    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int =
                        self.entry("cuDevicePrimaryCtxRetain");
                    let push: unsafe extern "C" fn(*mut c_void) -> c_int =
                        self.entry("cuCtxPushCurrent_v2");
                    let mut context = std::ptr::null_mut();
                    self.check("cuDevicePrimaryCtxRetain", retain(&mut context, 0));
                    self.check("cuCtxPushCurrent", push(context));
                }
                Driver::Ascend => {
                    let set: unsafe extern "C" fn(i32) -> c_int = self.entry("aclrtSetDevice");
                    self.check("aclrtSetDevice", set(0));
                }
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Driver::Cuda => "cuda",
            Driver::Ascend => "ascend",
        }
    }

    fn lib(self) -> &'static CStr {
        match self {
            Driver::Cuda => c"libcuda.so",
            Driver::Ascend => c"libascendcl.so",
        }
    }
}

/// A stream created through the driver; destroyed on drop.
struct DevStream {
    driver: Driver,
    handle: usize,
}

impl DevStream {
    fn new(driver: Driver) -> DevStream {
        driver.enter();
        let mut handle = std::ptr::null_mut();
        // SAFETY: documented prototypes; flag 1 = CU_STREAM_NON_BLOCKING, so the test's own
        // synchronous copies (legacy stream) never wait for a blocked stream on a real GPU.
        let rc = unsafe {
            match driver {
                Driver::Cuda => driver
                    .entry::<unsafe extern "C" fn(*mut *mut c_void, u32) -> c_int>(
                        "cuStreamCreate",
                    )(&mut handle, 1),
                Driver::Ascend => driver
                    .entry::<unsafe extern "C" fn(*mut *mut c_void) -> c_int>("aclrtCreateStream")(
                    &mut handle,
                ),
            }
        };
        driver.check("create stream", rc);
        DevStream {
            driver,
            handle: handle as usize,
        }
    }

    /// CUDA's legacy default stream (`CU_STREAM_LEGACY`, handle 0x1; never destroyed).
    fn legacy() -> DevStream {
        Driver::Cuda.enter();
        DevStream {
            driver: Driver::Cuda,
            handle: 1,
        }
    }

    /// A CUDA event recorded on the stream now (`None` for Ascend: its stand-in has none).
    fn record(&self) -> Option<DevEvent> {
        if self.driver != Driver::Cuda {
            return None;
        }
        let mut event = std::ptr::null_mut();
        // SAFETY: documented prototypes; the event is destroyed by `DevEvent`.
        unsafe {
            let create: unsafe extern "C" fn(*mut *mut c_void, u32) -> c_int =
                self.driver.entry("cuEventCreate");
            let record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int =
                self.driver.entry("cuEventRecord");
            self.driver.check("cuEventCreate", create(&mut event, 0));
            self.driver
                .check("cuEventRecord", record(event, self.handle as *mut c_void));
        }
        Some(DevEvent(event as usize))
    }

    fn as_ref(&self) -> StreamRef<'static> {
        match self.driver {
            Driver::Cuda => StreamRef::Cuda(self.handle),
            Driver::Ascend => StreamRef::Ascend(self.handle),
        }
    }

    /// Runs `f(arg)` in stream order on a driver thread.
    fn launch(&self, f: HostFn, arg: *mut c_void) {
        let name = match self.driver {
            Driver::Cuda => "cuLaunchHostFunc",
            Driver::Ascend => "aclrtLaunchHostFunc",
        };
        // SAFETY: both take (stream, fn, arg); `f` and `arg` are valid until it ran.
        let rc = unsafe {
            self.driver
                .entry::<unsafe extern "C" fn(*mut c_void, HostFn, *mut c_void) -> c_int>(name)(
                self.handle as *mut c_void,
                f,
                arg,
            )
        };
        self.driver.check(name, rc);
    }

    /// Blocks later work on the stream until the returned blocker is released (or dropped,
    /// or 30 s pass).
    fn block(&self) -> Blocker {
        let open: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
        self.launch(
            block_until_open,
            (open as *const AtomicBool).cast_mut().cast(),
        );
        Blocker(open)
    }

    /// Waits until everything enqueued so far ran (the stand-ins give up after 120 s).
    fn synchronize(&self) {
        let name = match self.driver {
            Driver::Cuda => "cuStreamSynchronize",
            Driver::Ascend => "aclrtSynchronizeStream",
        };
        // SAFETY: both take the stream.
        let rc = unsafe {
            self.driver
                .entry::<unsafe extern "C" fn(*mut c_void) -> c_int>(name)(
                self.handle as *mut c_void,
            )
        };
        self.driver.check(name, rc);
    }
}

impl Drop for DevStream {
    fn drop(&mut self) {
        if self.handle <= 2 {
            return; // a special handle: nothing to destroy
        }
        let name = match self.driver {
            Driver::Cuda => "cuStreamDestroy_v2",
            Driver::Ascend => "aclrtDestroyStream",
        };
        // SAFETY: our stream, destroyed once; its work finishes first.
        unsafe {
            self.driver
                .entry::<unsafe extern "C" fn(*mut c_void) -> c_int>(name)(
                self.handle as *mut c_void,
            );
        }
    }
}

/// A CUDA event; destroyed on drop.
struct DevEvent(usize);

impl DevEvent {
    /// Whether the stream passed the record (`cuEventQuery`: 0 done, 600 not ready).
    fn done(&self) -> bool {
        // SAFETY: documented prototype; our live event.
        let rc = unsafe {
            Driver::Cuda.entry::<unsafe extern "C" fn(*mut c_void) -> c_int>("cuEventQuery")(
                self.0 as *mut c_void,
            )
        };
        assert!(rc == 0 || rc == 600, "cuEventQuery returned {rc}");
        rc == 0
    }
}

impl Drop for DevEvent {
    fn drop(&mut self) {
        // SAFETY: documented prototype; our event, destroyed once.
        unsafe {
            Driver::Cuda.entry::<unsafe extern "C" fn(*mut c_void) -> c_int>("cuEventDestroy_v2")(
                self.0 as *mut c_void,
            );
        }
    }
}

/// Holds a stream at a host function until released; releases on drop, so a failing test
/// never leaves the stream blocked.
struct Blocker(&'static AtomicBool);

impl Blocker {
    fn release(&self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Drop for Blocker {
    fn drop(&mut self) {
        self.release();
    }
}

/// The blocking host function: waits for its flag (a leaked `AtomicBool`), at most 30 s.
unsafe extern "C" fn block_until_open(arg: *mut c_void) {
    // SAFETY: `arg` is a leaked, never freed `AtomicBool` (see `DevStream::block`).
    let open = unsafe { &*(arg as *const AtomicBool) };
    let start = Instant::now();
    while !open.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The stand-in's stream counters (all zero under a real driver, where they do not exist).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counters {
    async_copies: u64,
    pageable_async_sources: u64,
    host_fns: u64,
    waits: u64,
}

impl Counters {
    fn read(driver: Driver) -> Counters {
        let get = |name: &CStr| standin_counter(driver.lib(), name).unwrap_or(0);
        Counters {
            async_copies: get(c"fake_async_copies"),
            pageable_async_sources: get(c"fake_pageable_async_sources"),
            host_fns: get(c"fake_host_fns"),
            waits: get(c"fake_waits"),
        }
    }

    /// What was enqueued since `before`.
    fn since(self, before: Counters) -> Counters {
        Counters {
            async_copies: self.async_copies - before.async_copies,
            pageable_async_sources: self.pageable_async_sources,
            host_fns: self.host_fns - before.host_fns,
            waits: self.waits - before.waits,
        }
    }
}

/// The stand-in's capture hook (`None` under a real driver).
fn set_capturing(driver: Driver, stream: &DevStream, on: bool) -> Option<()> {
    let hook = standin_symbol(driver.lib(), c"fake_stream_set_capturing")?;
    // SAFETY: the stand-in's `int fake_stream_set_capturing(void *stream, int on)`.
    let hook: unsafe extern "C" fn(*mut c_void, c_int) -> c_int =
        unsafe { std::mem::transmute(hook) };
    // SAFETY: a live stream of the stand-in.
    assert_eq!(unsafe { hook(stream.handle as *mut c_void, on.into()) }, 0);
    Some(())
}

/// Device buffers of these lengths, filled with [`FILL`].
fn filled(lens: &[usize]) -> Vec<DeviceAlloc> {
    lens.iter().map(|&n| device_with(&vec![FILL; n])).collect()
}

fn untouched(dsts: &[DeviceAlloc]) -> bool {
    dsts.iter()
        .all(|d| read_device(d).iter().all(|&b| b == FILL))
}

fn get_on(client: &Client, keys: &[&str], dsts: &[DeviceAlloc], stream: StreamRef) -> Ticket {
    let bufs = dsts.iter().map(|d| vec![buf(d)]).collect();
    // SAFETY: device buffers of their length that outlive every wait in the tests.
    unsafe { client.batch_get_into_on_stream_raw(keys, bufs, true, stream) }
        .expect("on-stream get issued")
}

/// The gate's cost on the stream: CUDA waits on the word itself, Ascend polls it in a host
/// function (`fake_waits`, `fake_host_fns`).
fn gate_ops(driver: Driver) -> (u64, u64) {
    match driver {
        Driver::Cuda => (1, 0),
        Driver::Ascend => (0, 1),
    }
}

/// Resident replicas: direct copies from the pinned segment after a blocked stream point,
/// then the same through a get session with ranges.
fn local_scenario(driver: Driver) {
    let client = embedded(64 * MIB, 0);
    let values = [pattern(MIB as usize + 3, 1), pattern(64 * 1024 + 1, 2)];
    let keys = ["s0", "s1"];
    for (k, v) in keys.iter().zip(&values) {
        client.put_from(k, v, &ReplicateConfig::default()).unwrap();
    }
    let stream = DevStream::new(driver);
    let dsts = filled(&[values[0].len(), values[1].len()]);
    let before = Counters::read(driver);
    let blocker = stream.block();
    let ticket = get_on(&client, &keys, &dsts, stream.as_ref());
    // The supported pattern for graphs: an event recorded after the call.
    let event = stream.record();
    assert_eq!(ticket.status(), TICKET_PENDING);
    assert_eq!(ticket.wait(Some(Duration::from_millis(30))), TICKET_PENDING);
    assert!(
        untouched(&dsts),
        "nothing moved while the stream is blocked"
    );
    assert!(!event.as_ref().is_some_and(DevEvent::done));
    assert_eq!(client.metrics().stream.pins_held, 2);
    blocker.release();
    stream.synchronize();
    assert!(event.as_ref().is_none_or(DevEvent::done));
    assert_eq!(ticket.wait(LIMIT), 0);
    for (d, v) in dsts.iter().zip(&values) {
        assert_eq!(&read_device(d), v);
    }
    let sizes: Vec<_> = values.iter().map(|v| Ok(v.len() as u64)).collect();
    assert_eq!(ticket.results(), sizes);
    let enqueued = Counters::read(driver).since(before);
    if enqueued != Counters::default() {
        // Two copies, the blocker and the release marker; no gate for resident data.
        assert_eq!(
            enqueued,
            Counters {
                async_copies: 2,
                pageable_async_sources: 0,
                host_fns: 2,
                waits: 0
            }
        );
    }
    let m = client.metrics().stream;
    assert_eq!((m.direct_copies, m.staged_copies), (2, 0));
    assert_eq!((m.tickets_issued, m.tickets_ok), (1, 1));
    assert_eq!((m.pins_held, m.tickets_outstanding), (0, 0));

    // Ranges of s0 through a get session: [1000, +4096) and [0, 512) into two buffers.
    assert_eq!(client.batch_get_session_start(&["s0"]), vec![Ok(())]);
    let parts = filled(&[4096, 512]);
    let bufs = vec![parts.iter().map(buf).collect::<Vec<Buf>>()];
    // SAFETY: as in `get_on`.
    let ticket = unsafe {
        client.batch_get_into_multi_buffer_ranges_on_stream_raw(
            &["s0"],
            bufs,
            &[vec![1000, 0]],
            stream.as_ref(),
        )
    }
    .expect("ranged on-stream get issued");
    stream.synchronize();
    assert_eq!(ticket.wait(LIMIT), 0);
    assert_eq!(read_device(&parts[0]), values[0][1000..5096]);
    assert_eq!(read_device(&parts[1]), values[0][..512]);
    client.batch_get_session_end(&["s0"]).unwrap();
    assert_eq!(Counters::read(driver).pageable_async_sources, 0);
}

/// A replica only in another client's segment (TCP): gate, staged copy, bytes match.
fn remote_scenario(driver: Driver) {
    let master = TcpMaster::start();
    let owner = master.client(64 * MIB);
    let reader = master.client(0);
    let value = pattern(3 * MIB as usize + 5, 9);
    owner
        .put_from("far", &value, &on(&owner.get_hostname()))
        .unwrap();
    let stream = DevStream::new(driver);
    let dsts = filled(&[value.len()]);
    let before = Counters::read(driver);
    let blocker = stream.block();
    let ticket = get_on(&reader, &["far"], &dsts, stream.as_ref());
    assert_eq!(ticket.status(), TICKET_PENDING);
    assert!(
        untouched(&dsts),
        "nothing moved while the stream is blocked"
    );
    blocker.release();
    stream.synchronize();
    assert_eq!(ticket.wait(LIMIT), 0);
    assert_eq!(read_device(&dsts[0]), value);
    assert_eq!(ticket.results(), vec![Ok(value.len() as u64)]);
    let enqueued = Counters::read(driver).since(before);
    if enqueued != Counters::default() {
        let (waits, gate_fns) = gate_ops(driver);
        assert_eq!(
            enqueued,
            Counters {
                async_copies: 1,
                pageable_async_sources: 0,
                host_fns: 2 + gate_fns,
                waits
            }
        );
    }
    let m = reader.metrics().stream;
    assert_eq!((m.direct_copies, m.staged_copies), (0, 1));
    assert_eq!((m.tickets_ok, m.tickets_failed), (1, 0));
    assert_eq!((m.pins_held, m.staging_bytes_in_use), (0, 0));

    // Unblocked: the stream typically reaches the gate long before the bytes arrive, and
    // the copy behind it must still see them all.
    let big = pattern(16 * MIB as usize, 10);
    owner
        .put_from("big", &big, &on(&owner.get_hostname()))
        .unwrap();
    let dsts = filled(&[big.len()]);
    let ticket = get_on(&reader, &["big"], &dsts, stream.as_ref());
    stream.synchronize();
    assert_eq!(ticket.wait(LIMIT), 0);
    assert_eq!(read_device(&dsts[0]), big);
    assert_eq!(Counters::read(driver).pageable_async_sources, 0);
}

/// Stream-ordered puts from device memory: into the pinned local segment and, for a second
/// replica on another client, through pinned staging and the transport; invisible until the
/// commit, then readable everywhere; a host source on a device stream is refused.
fn put_scenario(driver: Driver) {
    let master = TcpMaster::start();
    let producer = master.client(64 * MIB);
    let other = master.client(64 * MIB);
    let values = [pattern(2 * MIB as usize + 1, 21), pattern(4096, 22)];
    let srcs: Vec<DeviceAlloc> = values.iter().map(|v| device_with(v)).collect();
    let stream = DevStream::new(driver);
    let config = ReplicateConfig {
        replica_num: 2,
        preferred_segments: vec![producer.get_hostname(), other.get_hostname()],
        ..ReplicateConfig::default()
    };
    let before = Counters::read(driver);
    let blocker = stream.block();
    let bufs = srcs.iter().map(|d| vec![buf(d)]).collect();
    // SAFETY: the device sources outlive the stream's work (synchronized below).
    let ticket = unsafe {
        producer.batch_put_from_on_stream_raw(&["p0", "p1"], bufs, &config, stream.as_ref())
    }
    .expect("on-stream put issued");
    assert_eq!(ticket.status(), TICKET_PENDING);
    assert!(
        !other.is_exist("p0").unwrap(),
        "invisible before the commit"
    );
    blocker.release();
    stream.synchronize();
    assert_eq!(ticket.wait(LIMIT), 0);
    let sizes: Vec<_> = values.iter().map(|v| Ok(v.len() as u64)).collect();
    assert_eq!(ticket.results(), sizes);
    for (k, v) in ["p0", "p1"].iter().zip(&values) {
        let mut out = vec![0u8; v.len()];
        assert_eq!(other.get_into(k, &mut out), Ok(v.len() as u64));
        assert_eq!(&out, v);
    }
    let enqueued = Counters::read(driver).since(before);
    if enqueued != Counters::default() {
        // Per key: one copy into the local segment and one into staging; the blocker and the
        // release marker; no gate on a put.
        assert_eq!(
            enqueued,
            Counters {
                async_copies: 4,
                pageable_async_sources: 0,
                host_fns: 2,
                waits: 0
            }
        );
    }
    let m = producer.metrics().stream;
    assert_eq!((m.tickets_ok, m.staging_bytes_in_use), (1, 0));
    // A host source cannot be copied asynchronously on a device stream.
    let host = pattern(64, 1);
    let bufs = vec![vec![Buf::new(host.as_ptr() as usize, 64)]];
    // SAFETY: refused before anything is enqueued.
    let refused =
        unsafe { producer.batch_put_from_on_stream_raw(&["h"], bufs, &config, stream.as_ref()) };
    assert_eq!(refused.err(), Some(ErrorCode::InvalidParams));
    assert!(!producer.is_exist("h").unwrap());
}

/// A resident get queued on a blocked device stream while the master restarts: the
/// client's remount waits for the copy (the segment stays registered with the device and keeps
/// its pages), the copy delivers the value, and the remount goes through once the stream let
/// go.
fn remount_scenario(driver: Driver) {
    let mut master = TcpMaster::start();
    let client = master.client(16 * MIB);
    let here = on(&client.get_hostname());
    let value = pattern(MIB as usize, 31);
    client.put_from("resident", &value, &here).unwrap();
    let stream = DevStream::new(driver);
    let dsts = filled(&[value.len()]);
    let blocker = stream.block();
    let ticket = get_on(&client, &["resident"], &dsts, stream.as_ref());
    assert_eq!(client.metrics().transfer.segment_holds, 1);
    let registrations = client.metrics().device.host_registrations;
    master.restart();
    let deferred = wait_until(Duration::from_secs(10), || {
        client.metrics().transfer.remounts_deferred > 0
    });
    let same_pages = client.metrics().device.host_registrations == registrations;
    blocker.release();
    stream.synchronize();
    assert_eq!(ticket.wait(LIMIT), 0);
    assert_eq!(read_device(&dsts[0]), value, "the held mount's bytes");
    assert!(deferred, "the remount did not wait for the queued copy");
    assert!(
        same_pages,
        "the segment got new pages (re-registered) under the copy"
    );
    let after = pattern(MIB as usize, 32);
    assert!(
        wait_until(Duration::from_secs(10), || client
            .put_from("after", &after, &here)
            .is_ok()),
        "never remounted after the stream let go"
    );
    let mut out = vec![0u8; after.len()];
    assert_eq!(client.get_into("after", &mut out), Ok(after.len() as u64));
    assert_eq!(out, after);
    assert_eq!(client.metrics().transfer.segment_holds, 0);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_stream_remount() {
    remount_scenario(Driver::Cuda);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_stream_put() {
    put_scenario(Driver::Cuda);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_stream_local() {
    local_scenario(Driver::Cuda);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_stream_remote() {
    remote_scenario(Driver::Cuda);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_ascend_stream() {
    local_scenario(Driver::Ascend);
    remote_scenario(Driver::Ascend);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_stream_refusals() {
    let driver = Driver::Cuda;
    let client = embedded(16 * MIB, 0);
    let value = pattern(100_000, 4);
    client
        .put_from("k", &value, &ReplicateConfig::default())
        .unwrap();
    let stream = DevStream::new(driver);
    let dsts = filled(&[value.len()]);
    let bufs = || vec![vec![buf(&dsts[0])]];
    let before = Counters::read(driver);
    let issued = || client.metrics().stream.tickets_issued;

    // SAFETY (all calls below): device buffers of their length, alive throughout.
    let null =
        unsafe { client.batch_get_into_on_stream_raw(&["k"], bufs(), true, StreamRef::Cuda(0)) };
    assert_eq!(null.err(), Some(ErrorCode::InvalidParams));

    if set_capturing(driver, &stream, true).is_some() {
        let captured =
            unsafe { client.batch_get_into_on_stream_raw(&["k"], bufs(), true, stream.as_ref()) };
        assert_eq!(captured.err(), Some(ErrorCode::StreamCaptureUnsupported));
        assert_eq!(ErrorCode::StreamCaptureUnsupported.code(), -9002);
        set_capturing(driver, &stream, false);
    }

    // A host destination on a device stream.
    let mut host = vec![0u8; value.len()];
    let host_buf = vec![vec![Buf::new(
        host.as_mut_ptr() as usize,
        host.len() as u64,
    )]];
    let refused =
        unsafe { client.batch_get_into_on_stream_raw(&["k"], host_buf, true, stream.as_ref()) };
    assert_eq!(refused.err(), Some(ErrorCode::InvalidParams));

    assert_eq!(issued(), 0, "no ticket issued");
    assert_eq!(client.metrics().stream.pins_held, 0);
    assert_eq!(Counters::read(driver).since(before), Counters::default());

    // The stream itself is fine once it is no longer captured, and so is the legacy
    // default stream (handle 0x1: device 0's primary context).
    for stream in [stream, DevStream::legacy()] {
        let dsts = filled(&[value.len()]);
        let ticket = get_on(&client, &["k"], &dsts, stream.as_ref());
        stream.synchronize();
        assert_eq!(ticket.wait(LIMIT), 0);
        assert_eq!(read_device(&dsts[0]), value);
    }
    assert_eq!(Counters::read(driver).pageable_async_sources, 0);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_cuda_no_stream_symbols() {
    mooncake_rs::init_logging();
    assert_eq!(device::runtime().info().runtime, "cuda");
    let client = embedded(16 * MIB, 0);
    let value = pattern(100_000, 6);
    client
        .put_from("k", &value, &ReplicateConfig::default())
        .unwrap();
    let dst = filled(&[value.len()]);
    // Any non-NULL handle: the call must refuse before looking at it (0x1 = legacy stream).
    // SAFETY: a device buffer of its length.
    let refused = unsafe {
        client.batch_get_into_on_stream_raw(
            &["k"],
            vec![vec![buf(&dst[0])]],
            true,
            StreamRef::Cuda(1),
        )
    };
    assert_eq!(refused.err(), Some(ErrorCode::NotSupported));
    assert_eq!(ErrorCode::NotSupported.code(), -1012);
    assert!(untouched(&dst));

    // Blocking gets into device memory and host-stream gets still work.
    // SAFETY: as above.
    let r = unsafe { client.get_into_raw(&["k"], vec![vec![buf(&dst[0])]], false) };
    assert_eq!(r, vec![Ok(value.len() as u64)]);
    assert_eq!(read_device(&dst[0]), value);
    let host_stream = HostStream::new().unwrap();
    let mut out = vec![0u8; value.len()];
    let bufs = vec![vec![Buf::new(out.as_mut_ptr() as usize, out.len() as u64)]];
    // SAFETY: `out` outlives the wait below.
    let ticket = unsafe {
        client.batch_get_into_on_stream_raw(&["k"], bufs, true, StreamRef::Host(&host_stream))
    }
    .expect("host-stream get issued");
    assert_eq!(ticket.wait(LIMIT), 0);
    assert_eq!(out, value);
}

/// Makes the stand-in refuse every copy touching `range` (`None`: refuse nothing). `None` is
/// returned under a real driver, which has no such hook.
fn refuse_copies(driver: Driver, range: Option<&DeviceAlloc>) -> Option<()> {
    let word = |name: &CStr| {
        standin_symbol(driver.lib(), name).map(|sym| {
            // SAFETY: the stand-in's `unsigned long` hook words, alive as long as the library;
            // the stand-in reads them atomically.
            unsafe { &*(sym as *const std::sync::atomic::AtomicU64) }
        })
    };
    let (base, len) = (word(c"fake_refuse_base")?, word(c"fake_refuse_len")?);
    len.store(0, Ordering::SeqCst);
    if let Some(d) = range {
        base.store(d.addr() as u64, Ordering::SeqCst);
        len.store(d.len() as u64, Ordering::SeqCst);
    }
    Some(())
}

/// The ticket's status word as the stream sees it (host streams: a host address).
fn status_word(ticket: &Ticket) -> i32 {
    // SAFETY: the word lives as long as the ticket; the host writes it atomically.
    unsafe { &*(ticket.status_word() as *const std::sync::atomic::AtomicI32) }
        .load(Ordering::SeqCst)
}

/// A copy the driver refuses on a host stream fails that key (ticket status and per-key
/// result `TRANSFER_FAIL`, and the status word later stream work reads), the other keys of the
/// call still land; an on-stream put whose source copy is refused revokes that key instead of
/// committing it. On a device stream a refused enqueue fails the call and commits nothing.
fn copy_failure_scenario(driver: Driver) {
    let client = embedded(64 * MIB, 0);
    let values = [pattern(100_000, 31), pattern(4096, 32)];
    let keys = ["bad", "good"];
    for (k, v) in keys.iter().zip(&values) {
        client.put_from(k, v, &ReplicateConfig::default()).unwrap();
    }
    let host = HostStream::new().unwrap();
    let fail = Err(ErrorCode::TransferFail);

    // A get on a host stream whose first destination the driver refuses.
    let dsts = filled(&[values[0].len(), values[1].len()]);
    if refuse_copies(driver, Some(&dsts[0])).is_none() {
        return; // a real driver: nothing to inject with
    }
    let ticket = get_on(&client, &keys, &dsts, StreamRef::Host(&host));
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(TICKET_PENDING));
    let (word, out) = (ticket.status_word(), seen.clone());
    host.launch(move || {
        // SAFETY: the ticket (alive until the assertions below) keeps the word.
        let status = unsafe { &*(word as *const std::sync::atomic::AtomicI32) };
        out.store(status.load(Ordering::SeqCst), Ordering::SeqCst);
    });
    assert!(host.synchronize(LIMIT));
    assert_eq!(ticket.wait(LIMIT), ErrorCode::TransferFail.code());
    assert_eq!(ticket.results(), vec![fail, Ok(values[1].len() as u64)]);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        ErrorCode::TransferFail.code(),
        "later stream work sees the failure in the status word"
    );
    assert_eq!(status_word(&ticket), ErrorCode::TransferFail.code());
    assert_eq!(read_device(&dsts[1]), values[1]);
    let m = client.metrics().stream;
    assert_eq!((m.tickets_ok, m.tickets_failed), (0, 1));

    // A put on a host stream whose first source the driver refuses: that key is revoked,
    // the other committed.
    let srcs: Vec<DeviceAlloc> = values.iter().map(|v| device_with(v)).collect();
    refuse_copies(driver, Some(&srcs[0]));
    let bufs = srcs.iter().map(|d| vec![buf(d)]).collect();
    let put_keys = ["p-bad", "p-good"];
    // SAFETY: the device sources outlive the wait below.
    let ticket = unsafe {
        client.batch_put_from_on_stream_raw(
            &put_keys,
            bufs,
            &ReplicateConfig::default(),
            StreamRef::Host(&host),
        )
    }
    .expect("host-stream put issued");
    assert_eq!(ticket.wait(LIMIT), ErrorCode::TransferFail.code());
    assert_eq!(ticket.results(), vec![fail, Ok(values[1].len() as u64)]);
    let mut back = vec![0u8; values[0].len()];
    assert_eq!(
        client.get_into("p-bad", &mut back),
        Err(ErrorCode::ObjectNotFound),
        "an unfilled replica is never committed"
    );
    let mut back = vec![0u8; values[1].len()];
    assert_eq!(
        client.get_into("p-good", &mut back),
        Ok(values[1].len() as u64)
    );
    assert_eq!(back, values[1]);

    // Through staging (the replica is on another client): a refused copy out of staging
    // fails the get; a put whose source cannot be copied into staging is revoked.
    let master = TcpMaster::start();
    let owner = master.client(64 * MIB);
    let remote = master.client(0);
    let far = on(&owner.get_hostname());
    owner.put_from("far", &values[0], &far).unwrap();
    let dsts = filled(&[values[0].len()]);
    refuse_copies(driver, Some(&dsts[0]));
    let ticket = get_on(&remote, &["far"], &dsts, StreamRef::Host(&host));
    assert_eq!(ticket.wait(LIMIT), ErrorCode::TransferFail.code());
    assert_eq!(ticket.results(), vec![fail]);
    refuse_copies(driver, Some(&srcs[0]));
    let bufs = vec![vec![buf(&srcs[0])]];
    // SAFETY: the device source outlives the wait below.
    let ticket = unsafe {
        remote.batch_put_from_on_stream_raw(&["far-put"], bufs, &far, StreamRef::Host(&host))
    }
    .expect("host-stream put through staging issued");
    assert_eq!(ticket.wait(LIMIT), ErrorCode::TransferFail.code());
    let mut back = vec![0u8; values[0].len()];
    assert_eq!(
        owner.get_into("far-put", &mut back),
        Err(ErrorCode::ObjectNotFound)
    );
    // The ticket's staging is released right after its status is published (the waiter may
    // run first): it must come back, bounded.
    assert!(
        common::wait_until(Duration::from_secs(5), || remote
            .metrics()
            .stream
            .staging_bytes_in_use
            == 0),
        "the failed put's staging was never released: {} bytes in use",
        remote.metrics().stream.staging_bytes_in_use
    );

    // Device streams: the refused copy is refused at enqueue, the call fails, nothing is
    // committed.
    let stream = DevStream::new(driver);
    let dsts = filled(&[values[0].len()]);
    refuse_copies(driver, Some(&dsts[0]));
    let bufs = vec![vec![buf(&dsts[0])]];
    // SAFETY: a device buffer of its length, alive throughout.
    let refused =
        unsafe { client.batch_get_into_on_stream_raw(&["bad"], bufs, true, stream.as_ref()) };
    assert_eq!(refused.err(), Some(ErrorCode::InternalError));
    refuse_copies(driver, Some(&srcs[0]));
    let bufs = vec![vec![buf(&srcs[0])]];
    // SAFETY: as above.
    let refused = unsafe {
        client.batch_put_from_on_stream_raw(
            &["d-bad"],
            bufs,
            &ReplicateConfig::default(),
            stream.as_ref(),
        )
    };
    assert_eq!(refused.err(), Some(ErrorCode::InternalError));
    stream.synchronize();
    let mut back = vec![0u8; values[0].len()];
    assert_ne!(
        client.get_into("d-bad", &mut back),
        Ok(values[0].len() as u64)
    );
    refuse_copies(driver, None);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_copy_failures() {
    copy_failure_scenario(Driver::Cuda);
}

#[test]
#[ignore = "a child: run by its parent test in a fresh process (common::standin::child)"]
fn child_ascend_copy_failures() {
    copy_failure_scenario(Driver::Ascend);
}
