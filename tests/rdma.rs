//! `protocol = "rdma"` end to end: a `mooncake_master`, owner `mooncake_client` processes
//! and in-process clients and engines over one-sided verbs on the soft-RoCE device of the
//! RDMA VM (`scripts/rdma-tests.sh` runs this binary there, `RDMA_VM=1`). Outside the VM the
//! scenarios print that they skipped; the setup error without a device is checked there.

mod common;

use common::{pattern, wait_until, Launched, Master};
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::error::last_error_message;
use mooncake_rs::transfer::rdma::RdmaDevice;
use mooncake_rs::transfer::{
    DirectResolver, EngineConfig, TransferEngine, TransferMetrics, TransferOp, TransferRequest,
};
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// `(device, data address)` inside the VM; `None` (with a note) elsewhere.
fn vm() -> Option<(String, String)> {
    if std::env::var_os("RDMA_VM").is_none() {
        eprintln!("skipped: needs the soft-RoCE VM (scripts/rdma-tests.sh)");
        return None;
    }
    let device = std::env::var("RDMA_VM_DEV").expect("RDMA_VM_DEV");
    let addr = std::env::var("RDMA_VM_ADDR").expect("RDMA_VM_ADDR");
    Some((device, addr))
}

fn on(segment: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![segment.to_string()],
        ..ReplicateConfig::default()
    }
}

/// An owner `mooncake_client` process contributing `segment` over RDMA.
struct Owner {
    process: Launched,
    name: String,
}

impl Owner {
    fn start(master: &str, segment: &str, device: &str, host: &str) -> Owner {
        let args = vec![
            format!("--master_server_address={master}"),
            format!("--host={host}"),
            format!("--global_segment_size={segment}"),
            "--local_buffer_size=0".into(),
            "--protocol=rdma".into(),
            format!("--device_name={device}"),
        ];
        let mut process = Launched::spawn(env!("CARGO_BIN_EXE_mooncake_client"), &args);
        let line = process.first_line();
        let name = line
            .trim()
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("unexpected line {line:?}: {}", process.stderr()))
            .to_string();
        Owner { process, name }
    }
}

fn rdma_client(master: &str, device: &str, host: &str, local_buffer: u64) -> Client {
    Client::setup(SetupConfig {
        local_hostname: host.into(),
        global_segment_size: 0,
        local_buffer_size: local_buffer,
        protocol: "rdma".into(),
        device_name: device.into(),
        master_server_addr: master.into(),
        ..SetupConfig::default()
    })
    .unwrap_or_else(|e| panic!("rdma client setup: {e}: {}", last_error_message()))
}

/// Nothing went over TCP between the two snapshots.
fn no_tcp(before: &TransferMetrics, after: &TransferMetrics) {
    assert_eq!(
        after.tcp_read_bytes, before.tcp_read_bytes,
        "TCP read bytes"
    );
    assert_eq!(
        after.tcp_write_bytes, before.tcp_write_bytes,
        "TCP write bytes"
    );
}

#[test]
fn rdma_setup_without_a_device_names_the_problem() {
    let device = match vm() {
        Some(_) => "no_such_dev0", // A device exists: name one that does not.
        None => "",
    };
    let result = Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        local_buffer_size: 0,
        protocol: "rdma".into(),
        device_name: device.into(),
        master_server_addr: "embedded".into(),
        ..SetupConfig::default()
    });
    assert_eq!(result.map(|_| ()), Err(ErrorCode::TransferFail));
    let message = last_error_message();
    assert!(message.contains("protocol 'rdma'"), "{message}");
    assert!(
        message.contains("no RDMA device")
            || message.contains("libibverbs")
            || message.contains("no_such_dev0"),
        "{message}"
    );
}

#[test]
fn round_trips_zero_to_64_mib_go_by_rdma_with_bounces_for_unregistered_memory() {
    let Some((device, host)) = vm() else { return };
    let master = Master::start(&[]);
    let owner = Owner::start(&master.addr(), "256 MB", &device, &host);
    let client = rdma_client(&master.addr(), &device, &host, 0);
    for (i, size) in [1usize, 4096, 65536, MIB, 64 * MIB].into_iter().enumerate() {
        let key = format!("rdma-{size}");
        let value = pattern(size, i as u8);
        let before = client.metrics().transfer;
        client.put_from(&key, &value, &on(&owner.name)).unwrap();
        let mid = client.metrics().transfer;
        assert_eq!(mid.rdma_write_bytes - before.rdma_write_bytes, size as u64);
        assert_eq!(
            mid.rdma_bounce_bytes - before.rdma_bounce_bytes,
            size as u64,
            "unregistered memory: one counted copy through a bounce"
        );
        let mut out = vec![0u8; size];
        assert_eq!(client.get_into(&key, &mut out), Ok(size as u64));
        assert!(out == value, "bytes of {key}");
        let after = client.metrics().transfer;
        assert_eq!(after.rdma_read_bytes - mid.rdma_read_bytes, size as u64);
        no_tcp(&before, &after);
    }
    client.put_from("zero", &[], &on(&owner.name)).unwrap();
    assert_eq!(client.is_exist("zero"), Ok(false));
    let m = client.metrics().transfer;
    assert!(m.rdma_connections >= 1 && m.failed_requests == 0, "{m:?}");
}

#[test]
fn registered_buffers_are_zero_copy() {
    let Some((device, host)) = vm() else { return };
    let master = Master::start(&[]);
    let owner = Owner::start(&master.addr(), "64 MB", &device, &host);
    let client = rdma_client(&master.addr(), &device, &host, 0);
    let size = 8 * MIB;
    let value = pattern(size, 9);
    let mut out = vec![0u8; size];
    client
        .register_buffer(value.as_ptr() as usize, size)
        .unwrap();
    client
        .register_buffer(out.as_mut_ptr() as usize, size)
        .unwrap();
    let before = client.metrics();
    client.put_from("zc", &value, &on(&owner.name)).unwrap();
    assert_eq!(client.get_into("zc", &mut out), Ok(size as u64));
    assert!(out == value);
    let after = client.metrics();
    let (b, a) = (&before.transfer, &after.transfer);
    assert_eq!(a.rdma_bounce_bytes, b.rdma_bounce_bytes, "no bounce copy");
    assert_eq!(a.rdma_write_bytes - b.rdma_write_bytes, size as u64);
    assert_eq!(a.rdma_read_bytes - b.rdma_read_bytes, size as u64);
    assert_eq!(
        after.paths.registered_to_remote.copied_bytes,
        before.paths.registered_to_remote.copied_bytes
    );
    assert_eq!(
        after.paths.registered_to_remote.bytes - before.paths.registered_to_remote.bytes,
        size as u64
    );
    no_tcp(b, a);
}

#[test]
fn batches_and_multi_buffers_round_trip() {
    let Some((device, host)) = vm() else { return };
    let master = Master::start(&[]);
    let owner = Owner::start(&master.addr(), "128 MB", &device, &host);
    let client = rdma_client(&master.addr(), &device, &host, 32 * MIB as u64);
    let keys: Vec<String> = (0..16).map(|i| format!("batch-{i}")).collect();
    let values: Vec<Vec<u8>> = (0..16)
        .map(|i| pattern(4096 + i * 20_000, i as u8))
        .collect();
    let bufs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let before = client.metrics().transfer;
    let put = client.batch_put_from(&keys, &bufs, &on(&owner.name));
    assert!(put.iter().all(Result::is_ok), "{put:?}");
    let mut outs: Vec<Vec<u8>> = values.iter().map(|v| vec![0u8; v.len()]).collect();
    let mut views: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
    let got = client.batch_get_into(&keys, &mut views);
    for (i, result) in got.iter().enumerate() {
        assert_eq!(*result, Ok(values[i].len() as u64));
    }
    assert!(outs == values);
    // One object written from three buffers and read back into two.
    let parts = [pattern(1000, 1), pattern(70_000, 2), pattern(5, 3)];
    let whole: Vec<u8> = parts.concat();
    let lists = vec![parts.iter().map(Vec::as_slice).collect::<Vec<_>>()];
    let put = client.batch_put_from_multi_buffers(&["multi"], &lists, &on(&owner.name));
    assert_eq!(put, vec![Ok(())]);
    let (mut head, mut tail) = (vec![0u8; 30_000], vec![0u8; whole.len() - 30_000]);
    let mut lists = vec![vec![head.as_mut_slice(), tail.as_mut_slice()]];
    let got = client.batch_get_into_multi_buffers(&["multi"], &mut lists);
    assert_eq!(got, vec![Ok(whole.len() as u64)]);
    assert!([head, tail].concat() == whole);
    // get_buffer: the local buffer is registered, so the read is zero-copy into it.
    let mid = client.metrics().transfer;
    assert_eq!(client.get_buffer("multi").unwrap().as_slice(), &whole[..]);
    let after = client.metrics().transfer;
    assert_eq!(
        after.rdma_bounce_bytes, mid.rdma_bounce_bytes,
        "local buffer is registered"
    );
    assert_eq!(
        after.rdma_read_bytes - mid.rdma_read_bytes,
        whole.len() as u64
    );
    no_tcp(&before, &after);
}

#[test]
fn a_peer_killed_mid_transfer_fails_the_key_and_nothing_hangs() {
    let Some((device, host)) = vm() else { return };
    let master = Master::start(&[]);
    let mut doomed = Owner::start(&master.addr(), "128 MB", &device, &host);
    let survivor = Owner::start(&master.addr(), "64 MB", &device, &host);
    let client = Arc::new(rdma_client(&master.addr(), &device, &host, 0));
    let value = pattern(64 * MIB, 5);
    client.put_from("big", &value, &on(&doomed.name)).unwrap();
    let before = client.metrics().transfer;
    let reader = {
        let client = Arc::clone(&client);
        std::thread::spawn(move || {
            let mut out = vec![0u8; 64 * MIB];
            let started = Instant::now();
            let result = client.get_into("big", &mut out);
            (result, out, started.elapsed(), last_error_message())
        })
    };
    // Kill once the first bounce chunk of the read has landed (the read is under way).
    assert!(wait_until(Duration::from_secs(20), || {
        client.metrics().transfer.rdma_bounce_bytes > before.rdma_bounce_bytes
    }));
    doomed.process.kill();
    let (result, out, took, message) = reader.join().unwrap();
    eprintln!("get during the kill: {result:?} after {took:?}: {message}");
    match result {
        Ok(n) => assert!(n == value.len() as u64 && out == value, "wrong bytes"),
        Err(code) => {
            assert_eq!(code, ErrorCode::TransferFail, "{message}");
            assert!(message.contains("RDMA"), "{message}");
        }
    }
    assert!(
        took < Duration::from_secs(20),
        "ended by the peer's death, not a timeout"
    );
    // The next calls do not hang: the dead peer fails fast, the live one works.
    let started = Instant::now();
    let again = client.get_into("big", &mut vec![0u8; 64 * MIB]);
    assert!(again.is_err(), "{again:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    let small = pattern(100_000, 6);
    client
        .put_from("after", &small, &on(&survivor.name))
        .unwrap();
    let mut out = vec![0u8; small.len()];
    assert_eq!(client.get_into("after", &mut out), Ok(small.len() as u64));
    assert!(out == small);
}

/// An engine with a listener on `host` running RDMA on `device`.
fn engine(device: &Arc<RdmaDevice>, host: &str) -> Arc<TransferEngine> {
    let listener = TcpListener::bind((host, 0)).unwrap();
    TransferEngine::new(EngineConfig {
        local_name: listener.local_addr().unwrap().to_string(),
        listener: Some(listener),
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: Some(Arc::clone(device)),
    })
    .unwrap()
}

fn write(
    engine: &TransferEngine,
    to: &TransferEngine,
    src: &[u8],
    remote: u64,
    epoch: u64,
) -> mooncake_rs::Result<()> {
    let request = TransferRequest {
        op: TransferOp::Write,
        local_addr: src.as_ptr() as usize,
        len: src.len() as u64,
        endpoint: to.local_name(),
        remote_addr: remote,
        epoch,
        send_by: None,
    };
    // SAFETY: `src` is valid for reads of its length for the call.
    unsafe { engine.transfer(&[request]) }.pop().unwrap()
}

#[test]
fn a_stale_rkey_after_remount_is_refused_and_the_next_call_reconnects() {
    let Some((device, host)) = vm() else { return };
    let device = RdmaDevice::open(&device).unwrap();
    let (owner, initiator) = (engine(&device, &host), engine(&device, &host));
    let len = MIB;
    let mut segment = vec![0x11u8; len];
    let base = segment.as_mut_ptr() as usize;
    owner.register(base, len, true).unwrap();
    owner.set_region_epoch(base, 1).unwrap();
    let first = pattern(len, 1);
    assert_eq!(write(&initiator, &owner, &first, base as u64, 1), Ok(()));
    assert!(segment == first);
    // Remount: a new epoch re-registers the range, so the initiator's cached rkey is stale.
    owner.set_region_epoch(base, 2).unwrap();
    let second = pattern(len, 2);
    assert_eq!(
        write(&initiator, &owner, &second, base as u64, 0),
        Err(ErrorCode::TransferFail)
    );
    let message = last_error_message();
    assert!(message.contains("remote access error"), "{message}");
    assert!(segment == first, "no byte landed through the stale rkey");
    // The next call connects a new QP, learns the new rkey and epoch, and works.
    assert_eq!(write(&initiator, &owner, &second, base as u64, 2), Ok(()));
    assert!(segment == second);
    // A request naming the old epoch is refused before any work request is posted.
    assert_eq!(
        write(&initiator, &owner, &first, base as u64, 1),
        Err(ErrorCode::StaleSegmentEpoch)
    );
    assert!(segment == second);
    // Unmount: the MR is gone, nothing lands, and the peer says the range is not served.
    owner.unregister(base).unwrap();
    assert_eq!(
        write(&initiator, &owner, &first, base as u64, 0),
        Err(ErrorCode::TransferFail)
    );
    assert!(segment == second);
    let m = initiator.metrics();
    assert!(m.rdma_connections >= 2, "{m:?}");
    assert_eq!(m.tcp_write_bytes, 0);
}
