//! Tests against the real library and a real device: they run inside the soft-RoCE VM
//! (`RDMA_VM=1`, see `scripts/rdma-tests.sh`) and print that they skipped elsewhere.
//! On the host only the "no device / no library" errors are checked.

use super::device::{RdmaDevice, Registration};
use super::devices::RdmaDevices;
use super::events::CompletionMode;
use super::qp::{Endpoint, QpSettings, QueuePair, WorkRequest};
use super::transport::RdmaTransport;
use super::verbs::{self, Verbs};
use crate::error::{last_error_message, ErrorCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The VM's device, or `None` (with a note) outside the VM.
fn vm_device() -> Option<Arc<RdmaDevice>> {
    if std::env::var_os("RDMA_VM").is_none() {
        eprintln!("skipped: needs the soft-RoCE VM (RDMA_VM=1)");
        return None;
    }
    let name = std::env::var("RDMA_VM_DEV").unwrap_or_default();
    Some(RdmaDevice::open(&name).expect("the VM's device opens"))
}

fn settings() -> QpSettings {
    QpSettings {
        max_wr: 16,
        cq_depth: 16,
        ack_timeout: 10,
        retry_cnt: 3,
        completion: CompletionMode::from_env(),
    }
}

/// Two QPs on one device connected to each other ("two nodes" on one rxe device).
fn pair(device: &Arc<RdmaDevice>) -> (QueuePair, QueuePair) {
    let mut a = QueuePair::new(device, settings()).unwrap();
    let mut b = QueuePair::new(device, settings()).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    a.connect(&eb).unwrap();
    b.connect(&ea).unwrap();
    (a, b)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[test]
fn a_missing_library_is_named_in_the_error() {
    let Err(problem) = Verbs::load(&["libibverbs-that-does-not-exist.so.9"]) else {
        panic!("a missing library loaded");
    };
    assert!(
        problem.contains("libibverbs-that-does-not-exist.so.9"),
        "{problem}"
    );
    assert!(problem.contains("cannot be loaded"), "{problem}");
}

#[test]
fn open_without_a_device_names_the_problem() {
    if std::env::var_os("RDMA_VM").is_some() {
        // A device exists here: an unknown name must still be refused by name.
        assert_eq!(
            RdmaDevice::open("no_such_dev0").map(|_| ()),
            Err(ErrorCode::TransferFail)
        );
        let message = last_error_message();
        assert!(
            message.contains("no_such_dev0") && message.contains("rxe"),
            "{message}"
        );
        return;
    }
    assert_eq!(
        RdmaDevice::open("").map(|_| ()),
        Err(ErrorCode::TransferFail)
    );
    let message = last_error_message();
    assert!(
        message.contains("protocol 'rdma'")
            && (message.contains("no RDMA device") || message.contains("libibverbs")),
        "{message}"
    );
}

#[test]
fn layouts_agree_with_the_library() {
    let Some(device) = vm_device() else { return };
    let mut buffer = vec![0u8; 8192];
    let addr = buffer.as_mut_ptr() as usize;
    let registration = device.register(addr, buffer.len(), true).unwrap();
    // ibv_mr: addr/length at the offsets we read, keys set.
    assert_eq!(registration.range(), (addr, buffer.len()));
    assert_ne!(registration.lkey(), 0);
    // ibv_context: the ops we call are filled in by the provider.
    // SAFETY: a live context.
    let ops = unsafe { &(*device.context).ops };
    assert!(ops.poll_cq.is_some() && ops.post_send.is_some() && ops.req_notify_cq.is_some());
    let mut qp = QueuePair::new(&device, settings()).unwrap();
    assert_eq!(qp.state().unwrap(), verbs::QPS_RESET);
    let own = qp.endpoint();
    assert_ne!(own.qpn, 0);
    assert_eq!(
        &own.gid[10..12],
        &[0xff, 0xff],
        "RoCE v2 IPv4-mapped GID: {own:?}"
    );
    let mut peer = QueuePair::new(&device, settings()).unwrap();
    qp.connect(&peer.endpoint()).unwrap();
    peer.connect(&own).unwrap();
    // ibv_qp_attr: the state the library reports back through our layout.
    assert_eq!(qp.state().unwrap(), verbs::QPS_RTS);
    assert_eq!(Endpoint::decode(&own.encode()), own);
}

#[test]
fn write_then_read_moves_exactly_the_bytes() {
    let Some(device) = vm_device() else { return };
    let (mut a, _b) = pair(&device);
    let len = 1 << 20;
    let source: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    let mut target = vec![0u8; len];
    let mut back = vec![0u8; len];
    let src = device
        .register(source.as_ptr() as usize, len, false)
        .unwrap();
    let dst = device
        .register(target.as_mut_ptr() as usize, len, true)
        .unwrap();
    let bck = device
        .register(back.as_mut_ptr() as usize, len, false)
        .unwrap();
    // 64 slices of 16 KiB with max_wr 16: the window refills while completions arrive.
    let slice = 16 << 10;
    let writes: Vec<WorkRequest> = (0..len / slice)
        .map(|i| WorkRequest {
            read: false,
            local: (source.as_ptr() as usize + i * slice) as u64,
            lkey: src.lkey(),
            len: slice as u32,
            remote: (target.as_ptr() as usize + i * slice) as u64,
            rkey: dst.rkey(),
        })
        .collect();
    // SAFETY: the buffers are registered and live until the end of the test.
    let results = unsafe { a.run(&writes, deadline(), None, &|| true) };
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert!(target == source);
    let read = WorkRequest {
        read: true,
        local: back.as_mut_ptr() as u64,
        lkey: bck.lkey(),
        len: len as u32,
        remote: target.as_ptr() as u64,
        rkey: dst.rkey(),
    };
    // SAFETY: as above.
    assert_eq!(
        unsafe { a.run(&[read], deadline(), None, &|| true) },
        vec![Ok(())]
    );
    assert!(back == source);
    assert!(!a.is_broken());
}

/// A WRITE of all of `source` into `target`, both registered on `device` (`target` for peers'
/// access only when `remote_accessible`); keep the registrations while the request is used.
fn whole_write(
    device: &Arc<RdmaDevice>,
    source: &[u8],
    target: &mut [u8],
    remote_accessible: bool,
) -> (WorkRequest, [Registration; 2]) {
    let src = device
        .register(source.as_ptr() as usize, source.len(), false)
        .unwrap();
    let dst = device
        .register(
            target.as_mut_ptr() as usize,
            target.len(),
            remote_accessible,
        )
        .unwrap();
    let write = WorkRequest {
        read: false,
        local: source.as_ptr() as u64,
        lkey: src.lkey(),
        len: source.len() as u32,
        remote: target.as_ptr() as u64,
        rkey: dst.rkey(),
    };
    (write, [src, dst])
}

#[test]
fn nothing_is_posted_after_post_by_and_the_qp_stays_usable() {
    let Some(device) = vm_device() else { return };
    let (mut a, _b) = pair(&device);
    let len = 64 << 10;
    let source = vec![0x5Au8; len];
    let mut target = vec![0x11u8; len];
    let (write, _registered) = whole_write(&device, &source, &mut target, true);
    let passed = Some(Instant::now());
    // SAFETY: the buffers are registered and live until the end of the test.
    let results = unsafe { a.run(&[write, write], deadline(), passed, &|| true) };
    assert!(results.iter().all(Result::is_err), "{results:?}");
    let problem = results[0].as_ref().unwrap_err();
    assert!(problem.contains("grant ended"), "{problem}");
    assert!(!a.is_broken(), "a late stop is not a QP error");
    assert!(target.iter().all(|b| *b == 0x11), "a late write was posted");
    let later = Some(Instant::now() + Duration::from_secs(30));
    // SAFETY: as above.
    assert_eq!(
        unsafe { a.run(&[write], deadline(), later, &|| true) },
        vec![Ok(())]
    );
    assert!(target == source);
}

#[test]
fn a_local_only_registration_refuses_a_peers_work_requests() {
    let Some(device) = vm_device() else { return };
    let (mut a, _b) = pair(&device);
    let len = 64 << 10;
    let source = vec![0xC3u8; len];
    let mut private = vec![0x11u8; len];
    let (write, _registered) = whole_write(&device, &source, &mut private, false);
    // SAFETY: the buffers are registered and live until the end of the test.
    let results = unsafe { a.run(&[write], deadline(), None, &|| true) };
    let problem = results[0].as_ref().unwrap_err();
    assert!(problem.contains("remote access error"), "{problem}");
    assert!(
        private.iter().all(|b| *b == 0x11),
        "a peer wrote into local-only memory"
    );
}

#[test]
fn a_stale_rkey_is_refused_by_the_nic_and_no_byte_lands() {
    let Some(device) = vm_device() else { return };
    let (mut a, _b) = pair(&device);
    let len = 64 << 10;
    let source = vec![0xA5u8; len];
    let mut target = vec![0x11u8; len];
    let src = device
        .register(source.as_ptr() as usize, len, false)
        .unwrap();
    let dst = device
        .register(target.as_mut_ptr() as usize, len, true)
        .unwrap();
    let stale = dst.rkey();
    drop(dst); // Unmount: the region is deregistered before its space is reused.
    let fresh = device
        .register(target.as_mut_ptr() as usize, len, true)
        .unwrap();
    assert_ne!(fresh.rkey(), stale, "re-registration gives a new rkey");
    let write = WorkRequest {
        read: false,
        local: source.as_ptr() as u64,
        lkey: src.lkey(),
        len: len as u32,
        remote: target.as_ptr() as u64,
        rkey: stale,
    };
    // SAFETY: the buffers are live; `src` is registered.
    let results = unsafe { a.run(&[write, write], deadline(), None, &|| true) };
    let first = results[0].as_ref().unwrap_err();
    assert!(first.contains("remote access error"), "{first}");
    assert!(results[1].is_err(), "{results:?}");
    assert!(a.is_broken());
    assert!(
        target.iter().all(|b| *b == 0x11),
        "a byte landed through a stale rkey"
    );
    // A broken QP refuses work; a new pair works with the fresh key.
    // SAFETY: as above.
    assert!(unsafe { a.run(&[write], deadline(), None, &|| true) }[0].is_err());
    let (mut c, _d) = pair(&device);
    let write = WorkRequest {
        rkey: fresh.rkey(),
        ..write
    };
    // SAFETY: as above.
    assert_eq!(
        unsafe { c.run(&[write], deadline(), None, &|| true) },
        vec![Ok(())]
    );
    assert!(target.iter().all(|b| *b == 0xA5));
}

/// A remount re-registers the range under a new rkey while the old MR still exists (so a
/// provider cannot hand out the old key again), and keeps the old MR through its quarantine:
/// a stale writer's WRITE is accepted by the NIC until then (into the orphaned pages, on a
/// real remount), refused after.
#[test]
fn a_remount_never_reissues_the_old_rkey_and_keeps_the_old_mr_through_its_quarantine() {
    let Some(_) = vm_device() else { return };
    let devices = RdmaDevices::open(&std::env::var("RDMA_VM_DEV").unwrap_or_default()).unwrap();
    let device = Arc::clone(&devices.devices()[0]);
    let quarantine = Duration::from_millis(500);
    let transport = RdmaTransport::new(devices, Duration::from_secs(10), Arc::default(), None)
        .with_mr_quarantine(quarantine);
    let len = 64 << 10;
    let source = vec![0xA5u8; len];
    let src = device
        .register(source.as_ptr() as usize, len, false)
        .unwrap();
    let mut target = vec![0x11u8; len];
    let base = target.as_mut_ptr() as usize;
    transport.register(base, len, true).unwrap();
    transport.set_epoch(base, 1, false).unwrap();
    let old = transport.remote_table(0)[0].rkey;
    let remounted = Instant::now();
    // As a remount does it (the pages were replaced; here they are not, so the stale write
    // below lands in this buffer, where a remount's would land in orphaned pages).
    transport.set_epoch(base, 2, true).unwrap();
    let table = transport.remote_table(0);
    assert_eq!((table.len(), table[0].epoch), (1, 2));
    assert_ne!(table[0].rkey, old, "the remount reissued the old rkey");
    let stale = WorkRequest {
        read: false,
        local: source.as_ptr() as u64,
        lkey: src.lkey(),
        len: len as u32,
        remote: base as u64,
        rkey: old,
    };
    let (mut a, _b) = pair(&device);
    // SAFETY: the buffers are live; `src` is registered.
    let early = unsafe { a.run(&[stale], deadline(), None, &|| true) };
    if remounted.elapsed() < quarantine {
        assert_eq!(
            early,
            vec![Ok(())],
            "the old MR is gone before its quarantine"
        );
    }
    std::thread::sleep(quarantine + Duration::from_millis(300));
    let (mut c, _d) = pair(&device);
    // SAFETY: as above.
    let late = unsafe { c.run(&[stale], deadline(), None, &|| true) };
    let refused = late[0].as_ref().unwrap_err();
    assert!(refused.contains("remote access error"), "{refused}");
    transport.unregister(base);
    drop(target);
}

/// A 4 KiB READ on a QP (with `settings`) whose peer QP was destroyed, run with
/// `deadline`: its results, how long the run took, whether the QP is broken after it, and
/// whether the local buffer is untouched.
fn read_from_a_gone_peer(
    device: &Arc<RdmaDevice>,
    settings: QpSettings,
    deadline: Instant,
) -> (Vec<super::qp::Completion>, Duration, bool, bool) {
    let mut a = QueuePair::new(device, settings).unwrap();
    let b = QueuePair::new(device, settings).unwrap();
    a.connect(&b.endpoint()).unwrap();
    drop(b); // The peer's QP is destroyed (its process died, or the fabric dropped it).
    let len = 4096;
    let mut local = vec![0u8; len];
    let remote = vec![7u8; len];
    let l = device
        .register(local.as_mut_ptr() as usize, len, false)
        .unwrap();
    let r = device
        .register(remote.as_ptr() as usize, len, true)
        .unwrap();
    let read = WorkRequest {
        read: true,
        local: local.as_mut_ptr() as u64,
        lkey: l.lkey(),
        len: len as u32,
        remote: remote.as_ptr() as u64,
        rkey: r.rkey(),
    };
    let started = Instant::now();
    // SAFETY: the buffers are registered and live until the run returned.
    let results = unsafe { a.run(&[read], deadline, None, &|| true) };
    let took = started.elapsed();
    (results, took, a.is_broken(), local.iter().all(|b| *b == 0))
}

#[test]
fn a_peer_qp_gone_fails_by_the_retry_limit_without_hanging() {
    let Some(device) = vm_device() else { return };
    let limit = Duration::from_secs(30);
    let (results, took, broken, untouched) =
        read_from_a_gone_peer(&device, settings(), Instant::now() + limit);
    eprintln!("failed by the retry limit after {took:?}: {results:?}");
    assert!(results[0].is_err(), "{results:?}");
    assert!(
        !results[0].as_ref().unwrap_err().contains("timed out"),
        "{results:?}"
    );
    assert!(took < limit);
    assert!(broken);
    assert!(untouched);
}

/// With an ACK timeout far longer than the run's deadline (the NIC would keep retrying for
/// hours), the run's own deadline ends it: the request fails "timed out", the QP is moved to
/// the error state and drained (the call returns soon after the deadline, not after the
/// NIC's retries), it is reported broken (the owner reconnects), and no byte landed.
#[test]
fn a_run_past_its_deadline_times_out_drains_and_breaks_the_qp() {
    let Some(device) = vm_device() else { return };
    let patient = QpSettings {
        ack_timeout: 31,
        ..settings()
    };
    let deadline = Instant::now() + Duration::from_millis(500);
    let (results, took, broken, untouched) = read_from_a_gone_peer(&device, patient, deadline);
    eprintln!("timed out after {took:?}: {results:?}");
    let problem = results[0].as_ref().unwrap_err();
    assert!(
        problem.contains("timed out waiting for completions"),
        "{problem}"
    );
    assert!(Instant::now() >= deadline);
    assert!(took < Duration::from_secs(10), "drain took {took:?}");
    assert!(broken);
    assert!(untouched);
}

/// GPUDirect's dma-buf registration reaches the library's `ibv_reg_dmabuf_mr`, and a
/// descriptor that is not a dma-buf (or a device that cannot register one: soft-RoCE
/// answers EOPNOTSUPP) is a clean `TRANSFER_FAIL` naming the call, so the range falls back to
/// bounces; and without a device runtime that can flush NIC writes nothing is registered by
/// GPUDirect, even memory `ibv_reg_mr` would take.
#[test]
fn a_dmabuf_registration_the_device_refuses_is_a_clean_error() {
    let Some(device) = vm_device() else { return };
    assert!(
        verbs::verbs().unwrap().reg_dmabuf_mr.is_some(),
        "the VM's rdma-core has ibv_reg_dmabuf_mr"
    );
    let file = crate::shm::SealedMemfd::create("not a dma-buf", 1 << 16).unwrap();
    let refused = device.register_dmabuf(file.fd(), 0, 1 << 16, 0x10000, true);
    assert!(matches!(refused, Err(ErrorCode::TransferFail)));
    let message = last_error_message();
    assert!(
        message.contains("ibv_reg_dmabuf_mr of 65536 bytes"),
        "{message}"
    );
    assert!(
        message.contains(&format!("on {} failed:", device.name())),
        "{message}"
    );
    let host = crate::device::MappedRegion::new(1 << 16).unwrap();
    assert!(super::gpudirect::register(&device, host.addr(), 1 << 16, true).is_err());
    let message = last_error_message();
    assert!(
        message.contains("(GPUDirect): no device runtime"),
        "{message}"
    );
}

/// With a cluster key, the RDMA side channel (which hands out a QP endpoint, the region table
/// and its rkeys) serves only engines that prove the key: a keyed engine reads and writes by
/// RDMA; one with another key fails `AUTH_FAILED`, one without fails, and a raw handshake
/// request (a valid one, with a real QP endpoint) is closed without a byte of the table.
#[test]
fn a_keyed_side_channel_hands_rkeys_only_to_engines_with_the_key() {
    use crate::auth::test_ring as ring;
    use crate::transfer::test_support::{addr_of, one, pattern, read_req, register, write_req};
    use crate::transfer::{DirectResolver, EngineConfig, TransferEngine};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let Some(device) = vm_device() else { return };
    let host = std::env::var("RDMA_VM_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
    let config = |listener: Option<TcpListener>, local: String| EngineConfig {
        local_name: local,
        listener,
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: Some(Arc::clone(&device).into()),
    };
    let listener = TcpListener::bind((host.as_str(), 0)).unwrap();
    let name = listener.local_addr().unwrap().to_string();
    let server = TransferEngine::with_cluster_key(config(Some(listener), name.clone()), ring(1));
    let server = server.unwrap();
    let mut segment = pattern(1 << 20, 4);
    register(&server, &mut segment, true);
    let base = addr_of(&segment);
    let engine = |key: Option<u8>, local: &str| {
        let config = config(None, format!("embedded:{local}"));
        match key {
            Some(byte) => TransferEngine::with_cluster_key(config, ring(byte)).unwrap(),
            None => TransferEngine::new(config).unwrap(),
        }
    };

    let keyed = engine(Some(1), "keyed");
    let mut back = vec![0u8; 1 << 20];
    register(&keyed, &mut back, false);
    one(&keyed, read_req(&mut back, &name, base)).unwrap();
    assert!(back == pattern(1 << 20, 4));
    let written = pattern(4096, 9);
    one(&keyed, write_req(&written, &name, base)).unwrap();
    let moved = keyed.metrics();
    assert!(moved.rdma_read_bytes >= 1 << 20 && moved.rdma_write_bytes >= 4096);
    assert_eq!(moved.tcp_read_bytes + moved.tcp_write_bytes, 0, "{moved:?}");

    let wrong = engine(Some(2), "wrong");
    let keyless = engine(None, "keyless");
    let mut stolen = vec![0u8; 4096];
    let evil = [0xEEu8; 4096];
    assert_eq!(
        one(&wrong, read_req(&mut stolen, &name, base)),
        Err(ErrorCode::AuthFailed)
    );
    assert_eq!(
        one(&wrong, write_req(&evil, &name, base)),
        Err(ErrorCode::AuthFailed)
    );
    assert!(one(&keyless, read_req(&mut stolen, &name, base)).is_err());
    assert!(one(&keyless, write_req(&evil, &name, base)).is_err());
    assert_eq!(stolen, vec![0u8; 4096], "nothing was read");
    assert_eq!(
        wrong.metrics().rdma_read_bytes + keyless.metrics().rdma_read_bytes,
        0
    );

    // A well-formed side-channel request from a connection without the handshake.
    let qp = QueuePair::new(&device, settings()).unwrap();
    let mut raw = TcpStream::connect(&name).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut request = super::handshake::request_header().to_vec();
    request.extend_from_slice(&qp.endpoint().encode());
    request.extend_from_slice(&0u32.to_le_bytes());
    let _ = raw.write_all(&request);
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer);
    assert!(
        answer.is_empty(),
        "{} bytes of the side channel",
        answer.len()
    );

    // The segment holds the keyed write and nothing else.
    let original = pattern(1 << 20, 4);
    let expected: Vec<u8> = written.iter().chain(&original[4096..]).copied().collect();
    assert!(segment == expected, "the segment changed otherwise");
    for engine in [server, keyed, wrong, keyless] {
        engine.shutdown();
    }
}
