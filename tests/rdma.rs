//! `protocol = "rdma"` end to end: a `mooncake_master`, owner `mooncake_client` processes
//! and in-process clients and engines over one-sided verbs on the soft-RoCE device of the
//! RDMA VM (`scripts/rdma-tests.sh` runs this binary there, `RDMA_VM=1`). Outside the VM the
//! scenarios print that they skipped; the setup error without a device is checked there.

mod common;

use common::churn::churn;
use common::{pattern, wait_until, Launched, Master};
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::device::MappedRegion;
use mooncake_rs::error::last_error_message;
use mooncake_rs::transfer::rdma::{RdmaDevice, RdmaDeviceBytes, RdmaDevices};
use mooncake_rs::transfer::{
    DirectResolver, EngineConfig, TransferEngine, TransferMetrics, TransferOp, TransferRequest,
};
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// `(device, data address)` inside the VM; `None` (with a note) elsewhere. Inside, turns the
/// same-host mapped path off for this process and the processes it starts (`MC_SAME_HOST=0`):
/// every "two nodes" here are two processes of one host, which would otherwise exchange bytes
/// through mapped segments instead of the NIC these tests are about.
fn vm() -> Option<(String, String)> {
    if std::env::var_os("RDMA_VM").is_none() {
        eprintln!("skipped: needs the soft-RoCE VM (scripts/rdma-tests.sh)");
        return None;
    }
    static NO_SAME_HOST: std::sync::Once = std::sync::Once::new();
    NO_SAME_HOST.call_once(|| std::env::set_var("MC_SAME_HOST", "0"));
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
        Owner::start_with(master, segment, device, host, &[])
    }

    /// As [`Owner::start`], with `extra` flags.
    fn start_with(
        master: &str,
        segment: &str,
        device: &str,
        host: &str,
        extra: &[String],
    ) -> Owner {
        let mut args = vec![
            format!("--master_server_address={master}"),
            format!("--host={host}"),
            "--port=0".into(),
            format!("--global_segment_size={segment}"),
            "--local_buffer_size=0".into(),
            "--protocol=rdma".into(),
            format!("--device_name={device}"),
        ];
        args.extend_from_slice(extra);
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
    rdma_client_with(master, device, host, local_buffer, "P2PHANDSHAKE")
}

/// As [`rdma_client`], discovering peers through `metadata_server`.
fn rdma_client_with(
    master: &str,
    device: &str,
    host: &str,
    local_buffer: u64,
    metadata_server: &str,
) -> Client {
    Client::setup(SetupConfig {
        local_hostname: host.into(),
        metadata_server: metadata_server.into(),
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

/// Between the two snapshots exactly `written` bytes went by RDMA WRITE and `read` by RDMA
/// READ, and nothing over TCP.
fn moved_by_rdma(before: &TransferMetrics, after: &TransferMetrics, written: u64, read: u64) {
    assert_eq!(
        after.rdma_write_bytes - before.rdma_write_bytes,
        written,
        "RDMA WRITE bytes"
    );
    assert_eq!(
        after.rdma_read_bytes - before.rdma_read_bytes,
        read,
        "RDMA READ bytes"
    );
    no_tcp(before, after);
}

/// Between the two snapshots exactly `read` bytes went by RDMA READ, none through a bounce
/// (they landed in registered memory: the local buffer).
fn read_zero_copy(before: &TransferMetrics, after: &TransferMetrics, read: usize) {
    assert_eq!(after.rdma_bounce_bytes, before.rdma_bounce_bytes, "bounced");
    assert_eq!(after.rdma_read_bytes - before.rdma_read_bytes, read as u64);
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
    read_zero_copy(&mid, &client.metrics().transfer, whole.len());
    // put_parts (one object from parts) and batch_get_buffer (several, zero-copy into the
    // registered local buffer), one absent key failing alone.
    let put = client.put_parts(
        "parts",
        &[parts[1].as_slice(), parts[0].as_slice()],
        &on(&owner.name),
    );
    assert_eq!(put, Ok(()));
    let put_done = client.metrics().transfer;
    let handles = client.batch_get_buffer(&["parts", "batch-3", "absent"]);
    assert_eq!(handles.len(), 3);
    assert_eq!(
        handles[0].as_ref().unwrap().as_slice(),
        &[parts[1].as_slice(), parts[0].as_slice()].concat()[..]
    );
    assert_eq!(handles[1].as_ref().unwrap().as_slice(), &values[3][..]);
    assert_eq!(
        handles[2].as_ref().map(|_| ()).map_err(|code| *code),
        Err(ErrorCode::ObjectNotFound)
    );
    drop(handles);
    let last = client.metrics().transfer;
    read_zero_copy(
        &put_done,
        &last,
        parts[0].len() + parts[1].len() + values[3].len(),
    );
    no_tcp(&before, &last);
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
        rdma: Some(Arc::clone(device).into()),
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

/// A ranged read of object bytes into caller buffers: `get_into_ranges` over RDMA reads
/// exactly the fragments asked for, nothing over TCP.
#[test]
fn ranged_gets_read_exact_fragments_by_rdma() {
    let Some((device, host)) = vm() else { return };
    let master = Master::start(&[]);
    let owner = Owner::start(&master.addr(), "64 MB", &device, &host);
    let client = rdma_client(&master.addr(), &device, &host, 0);
    let value = pattern(3 * MIB + 17, 21);
    client.put_from("ranged", &value, &on(&owner.name)).unwrap();
    let before = client.metrics().transfer;
    let mut out = vec![0u8; 2 * MIB];
    let keys = vec![vec!["ranged".to_string(), "ranged".to_string()]];
    let dst = vec![vec![vec![0u64], vec![MIB as u64, (MIB + 4096) as u64]]];
    let src = vec![vec![vec![5u64], vec![(2 * MIB) as u64, 100]]];
    let sizes = vec![vec![vec![MIB as u64], vec![4096, (MIB - 4096) as u64]]];
    let request = mooncake_rs::client::RangeRequest {
        keys: &keys,
        dst_offsets: &dst,
        src_offsets: &src,
        sizes: &sizes,
    };
    let got = client.get_into_ranges(&mut [out.as_mut_slice()], &request);
    assert_eq!(
        got,
        vec![vec![
            vec![Ok(MIB as u64)],
            vec![Ok(4096), Ok((MIB - 4096) as u64)]
        ]]
    );
    assert_eq!(&out[..MIB], &value[5..5 + MIB]);
    assert_eq!(&out[MIB..MIB + 4096], &value[2 * MIB..2 * MIB + 4096]);
    assert_eq!(&out[MIB + 4096..], &value[100..100 + MIB - 4096]);
    let after = client.metrics().transfer;
    assert_eq!(
        after.rdma_read_bytes - before.rdma_read_bytes,
        2 * MIB as u64
    );
    no_tcp(&before, &after);
}

/// Put sessions (ranged writes, then commit) and get sessions (ranged reads under a pin)
/// over RDMA, and an upsert replacing the bytes: exact bytes, RDMA counters, no TCP.
#[test]
fn sessions_and_upsert_go_by_rdma() {
    let Some((device, host)) = vm() else { return };
    let master = Master::start(&[]);
    let owner = Owner::start(&master.addr(), "64 MB", &device, &host);
    let client = rdma_client(&master.addr(), &device, &host, 0);
    const LAYER: usize = 256 * 1024;
    let value = pattern(4 * LAYER, 31);
    let before = client.metrics().transfer;
    let started =
        client.batch_put_session_start(&["sess"], &[value.len() as u64], &on(&owner.name));
    assert_eq!(started, vec![Ok(())]);
    // Layers written out of order, two per call.
    for pair in [[2usize, 0], [3, 1]] {
        let bufs = vec![pair
            .iter()
            .map(|&l| &value[l * LAYER..(l + 1) * LAYER])
            .collect()];
        let offsets = vec![pair.iter().map(|&l| (l * LAYER) as u64).collect()];
        let wrote = client.batch_put_from_multi_buffer_ranges(&["sess"], &bufs, &offsets);
        assert_eq!(wrote, vec![Ok(2 * LAYER as u64)]);
    }
    assert_eq!(client.batch_put_session_end(&["sess"]), vec![Ok(())]);
    let mid = client.metrics().transfer;
    assert_eq!(
        mid.rdma_write_bytes - before.rdma_write_bytes,
        value.len() as u64
    );
    assert!(client
        .batch_get_session_start(&["sess"])
        .iter()
        .all(Result::is_ok));
    let mut out = vec![0u8; value.len()];
    for layer in (0..4).rev() {
        let mut bufs = vec![vec![&mut out[layer * LAYER..(layer + 1) * LAYER]]];
        let read = client.batch_get_into_multi_buffer_ranges(
            &["sess"],
            &mut bufs,
            &[vec![(layer * LAYER) as u64]],
        );
        assert_eq!(read, vec![Ok(LAYER as u64)]);
    }
    client.batch_get_session_end(&["sess"]).unwrap();
    assert!(out == value, "session bytes");
    let read = client.metrics().transfer;
    assert_eq!(
        read.rdma_read_bytes - mid.rdma_read_bytes,
        value.len() as u64
    );
    // Upsert: the key's bytes are replaced (new size too), read back exactly.
    let newer = pattern(LAYER + 3, 32);
    client
        .upsert_from("sess", &newer, &on(&owner.name))
        .unwrap();
    let mut back = vec![0u8; newer.len()];
    assert_eq!(client.get_into("sess", &mut back), Ok(newer.len() as u64));
    assert!(back == newer, "upserted bytes");
    let after = client.metrics().transfer;
    let n = newer.len() as u64;
    moved_by_rdma(&read, &after, n, n);
    no_tcp(&before, &after);
}

/// On-stream puts and gets on a host stream go through the RDMA transport, WRITing from and
/// READing into the registered stream staging without bounce buffers.
#[test]
fn on_stream_puts_and_gets_on_host_streams_go_by_rdma() {
    use mooncake_rs::client::Buf;
    use mooncake_rs::stream::{HostStream, StreamRef};
    let Some((device, host)) = vm() else { return };
    let master = Master::start(&[]);
    let owner = Owner::start(&master.addr(), "64 MB", &device, &host);
    let client = rdma_client(&master.addr(), &device, &host, 0);
    let limit = Some(Duration::from_secs(60));
    let stream = HostStream::new().unwrap();
    let values: Vec<Vec<u8>> = (0..3)
        .map(|i| pattern(MIB + i * 999, 40 + i as u8))
        .collect();
    let keys = ["s0", "s1", "s2"];
    let total: u64 = values.iter().map(|v| v.len() as u64).sum();
    let before = client.metrics().transfer;
    let srcs = values
        .iter()
        .map(|v| vec![Buf::new(v.as_ptr() as usize, v.len() as u64)])
        .collect();
    // SAFETY: `values` outlives the wait and is not changed meanwhile.
    let put = unsafe {
        client.batch_put_from_on_stream_raw(&keys, srcs, &on(&owner.name), StreamRef::Host(&stream))
    }
    .unwrap();
    assert_eq!(put.wait(limit), 0);
    let mid = client.metrics().transfer;
    assert_eq!(mid.rdma_write_bytes - before.rdma_write_bytes, total);
    // Staging is registered with the NIC: the WRITEs leave straight from it.
    assert_eq!(
        mid.rdma_bounce_bytes, before.rdma_bounce_bytes,
        "on-stream put bounced"
    );
    let mut outs: Vec<Vec<u8>> = values.iter().map(|v| vec![0u8; v.len()]).collect();
    let dsts = outs
        .iter_mut()
        .map(|o| vec![Buf::new(o.as_mut_ptr() as usize, o.len() as u64)])
        .collect();
    // SAFETY: `outs` outlives the wait and nobody else touches it.
    let get = unsafe {
        client.batch_get_into_on_stream_raw(&keys, dsts, false, StreamRef::Host(&stream))
    }
    .unwrap();
    assert_eq!(get.wait(limit), 0);
    assert!(stream.synchronize(limit));
    let sizes: Vec<_> = values.iter().map(|v| Ok(v.len() as u64)).collect();
    assert_eq!(get.results(), sizes);
    assert!(outs == values, "on-stream bytes");
    let after = client.metrics().transfer;
    assert_eq!(after.rdma_read_bytes - mid.rdma_read_bytes, total);
    // The READs land straight in (registered) staging; the stream's copy is the only one.
    assert_eq!(
        after.rdma_bounce_bytes, mid.rdma_bounce_bytes,
        "on-stream get bounced"
    );
    no_tcp(&before, &after);
}

/// Four threads of one RDMA client put, get and remove 16 keys at random on two owner
/// processes at once: every get that succeeds returns one whole committed value (pooled QPs
/// and bounce buffers shared by concurrent calls, keys removed and re-put into reused space),
/// and every byte moves by RDMA.
#[test]
fn concurrent_churn_over_rdma_never_returns_a_torn_value() {
    let Some((device, host)) = vm() else { return };
    let master = Master::start(&["--default_kv_lease_ttl=200"]);
    let owners = [
        Owner::start(&master.addr(), "32 MB", &device, &host),
        Owner::start(&master.addr(), "32 MB", &device, &host),
    ];
    let client = rdma_client(&master.addr(), &device, &host, 0);
    let segments: Vec<String> = owners.iter().map(|o| o.name.clone()).collect();
    let before = client.metrics().transfer;
    let verified = churn(&client, &segments, Instant::now() + Duration::from_secs(20));
    let after = client.metrics().transfer;
    eprintln!(
        "verified {verified} gets; {} bytes read and {} written by RDMA",
        after.rdma_read_bytes - before.rdma_read_bytes,
        after.rdma_write_bytes - before.rdma_write_bytes
    );
    assert!(verified > 0, "no read succeeded");
    assert!(after.rdma_read_bytes > before.rdma_read_bytes);
    assert!(after.rdma_write_bytes > before.rdma_write_bytes);
    no_tcp(&before, &after);
}

/// The master dies and comes back on the same port: the owner process remounts its segment
/// (a new epoch, so the NIC re-registers it under a new rkey), and the client's pooled queue
/// pair, whose region table names the first mount, is replaced by a new connection: the put
/// and get after the restart go by RDMA and move exactly their bytes; the first mount's
/// objects are gone.
#[test]
fn a_restarted_master_is_rejoined_and_the_remounted_segment_is_reached_by_rdma() {
    let Some((device, host)) = vm() else { return };
    let mut master = Master::start(&[]);
    let port = master.port;
    let owner = Owner::start(&master.addr(), "32 MB", &device, &host);
    let client = rdma_client(&master.addr(), &device, &host, 0);
    let first = pattern(MIB, 11);
    client.put_from("before", &first, &on(&owner.name)).unwrap();
    let mut out = vec![0u8; MIB];
    assert_eq!(client.get_into("before", &mut out), Ok(MIB as u64));
    assert!(out == first);
    master.kill();
    assert!(
        wait_until(Duration::from_secs(10), || client.health_check() == 2),
        "health never became 2"
    );
    let _restarted = Master::start_on(port, &[]);
    assert!(
        wait_until(Duration::from_secs(30), || client.health_check() == 0),
        "client never rejoined"
    );
    let before = client.metrics().transfer;
    let value = pattern(MIB, 12);
    assert!(
        wait_until(Duration::from_secs(30), || {
            client.put_from("after", &value, &on(&owner.name)).is_ok()
        }),
        "no put succeeded after the restart (segment not remounted?): {}",
        last_error_message()
    );
    let mut out = vec![0u8; MIB];
    assert_eq!(client.get_into("after", &mut out), Ok(MIB as u64));
    assert!(out == value, "bytes after the remount");
    let after = client.metrics().transfer;
    assert!(
        after.rdma_connections > before.rdma_connections,
        "the pooled connection's table predates the remount: {after:?}"
    );
    assert!(after.rdma_write_bytes - before.rdma_write_bytes >= MIB as u64);
    assert_eq!(after.rdma_read_bytes - before.rdma_read_bytes, MIB as u64);
    no_tcp(&before, &after);
    assert_eq!(
        client.is_exist("before"),
        Ok(false),
        "a restarted master starts empty"
    );
}

/// With the master's HTTP metadata service instead of P2PHANDSHAKE, the client learns the
/// owner's data address from the service and the bytes still go by RDMA (rkeys come with the
/// RDMA handshake on that address, whichever way it was found).
#[test]
fn http_metadata_discovery_moves_the_bytes_by_rdma() {
    let Some((device, host)) = vm() else { return };
    let http_port = common::free_port();
    let master = Master::start(&[
        "--enable_http_metadata_server=true",
        &format!("--http_metadata_server_port={http_port}"),
        "--http_metadata_server_host=127.0.0.1",
    ]);
    let url = format!("http://127.0.0.1:{http_port}/metadata");
    let owner = Owner::start_with(
        &master.addr(),
        "32 MB",
        &device,
        &host,
        &[format!("--metadata_server={url}")],
    );
    let client = rdma_client_with(&master.addr(), &device, &host, 0, &url);
    let value = pattern(3 * MIB + 17, 21);
    let before = client.metrics().transfer;
    client
        .put_from("via-http", &value, &on(&owner.name))
        .unwrap();
    let mut out = vec![0u8; value.len()];
    assert_eq!(
        client.get_into("via-http", &mut out),
        Ok(value.len() as u64)
    );
    assert!(out == value);
    let n = value.len() as u64;
    moved_by_rdma(&before, &client.metrics().transfer, n, n);
}

/// A P2P owner process on RDMA; `(process, segment name)`.
fn p2p_owner(master: &str, device: &str, host: &str) -> (Launched, String) {
    let args = vec![
        format!("--master_server_address={master}"),
        format!("--host={host}"),
        "--deployment_mode=P2P".into(),
        format!("--tiered_backend_config={}", common::dram_tiers(64 << 20)),
        "--local_buffer_size=16 MB".into(),
        "--protocol=rdma".into(),
        format!("--device_name={device}"),
    ];
    let mut process = Launched::spawn(env!("CARGO_BIN_EXE_mooncake_client"), &args);
    let line = process.first_line();
    let name = match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["READY", name, _rpc] => name.to_string(),
        _ => panic!("unexpected line {line:?}: {}", process.stderr()),
    };
    (process, name)
}

/// P2P FORWARD (the accessor's engine reads/writes the owner's tier) and REVERSE (the owner's
/// engine moves the bytes to/from the accessor's staging) over RDMA: exact bytes, the RDMA
/// counters of the side that moves the data, and no TCP data in either direction.
#[test]
fn p2p_forward_and_reverse_go_by_rdma() {
    use mooncake_rs::p2p::{P2pClient, P2pSetupConfig, RequestOptions, TransferDirection};
    let Some((device, host)) = vm() else { return };
    let master = Master::start(&["--deployment_mode=P2P"]);
    let (_owner, name) = p2p_owner(&master.addr(), &device, &host);
    let client = P2pClient::setup_p2p(P2pSetupConfig {
        local_hostname: host.clone(),
        tiered_backend_config_json: r#"{"tiers":[]}"#.into(),
        local_buffer_size: 64 << 20,
        master_server_addr: master.addr(),
        protocol: "rdma".into(),
        rdma_devices: device.clone(),
        p2p_transfer_direction_mode: TransferDirection::Reverse,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("P2P rdma accessor: {e}: {}", last_error_message()));
    for (i, direction) in [TransferDirection::Forward, TransferDirection::Reverse]
        .into_iter()
        .enumerate()
    {
        let options = RequestOptions {
            direction: Some(direction),
            preferred_owner: Some(name.clone()),
        };
        for (j, size) in [4096usize, 3 * MIB + 5].into_iter().enumerate() {
            let key = format!("p2p-{i}-{j}");
            let value = pattern(size, (10 * i + j) as u8);
            let before = client.transfer_metrics();
            client.put(&key, &value, &options).unwrap();
            let mut out = vec![0u8; size];
            assert_eq!(client.get_into(&key, &mut out, &options), Ok(size as u64));
            assert!(out == value, "{key} {direction:?}");
            let after = client.transfer_metrics();
            no_tcp(&before, &after);
            assert_eq!(
                after.served_read_bytes, before.served_read_bytes,
                "{direction:?}"
            );
            assert_eq!(
                after.served_write_bytes, before.served_write_bytes,
                "{direction:?}"
            );
            if direction == TransferDirection::Forward {
                assert_eq!(
                    after.rdma_write_bytes - before.rdma_write_bytes,
                    size as u64
                );
                assert_eq!(after.rdma_read_bytes - before.rdma_read_bytes, size as u64);
            } else {
                assert_eq!(after.rdma_write_bytes, before.rdma_write_bytes);
                assert_eq!(after.rdma_read_bytes, before.rdma_read_bytes);
            }
        }
    }
    let m = client.transfer_metrics();
    assert!(m.rdma_connections >= 1, "FORWARD connected by RDMA: {m:?}");
    assert!(
        m.rdma_served_connections >= 1,
        "REVERSE: the owner connected by RDMA: {m:?}"
    );
    let counters = client.counters();
    assert!(
        counters.forward_puts >= 2 && counters.reverse_puts >= 2,
        "{counters:?}"
    );
}

/// The master's replica descriptors name the transport of the segment that holds the bytes.
#[test]
fn replica_descriptors_name_the_rdma_protocol() {
    let Some((device, host)) = vm() else { return };
    let master = Master::start(&[]);
    let owner = Owner::start(&master.addr(), "16 MB", &device, &host);
    let client = rdma_client(&master.addr(), &device, &host, 0);
    client
        .put_from("desc", &pattern(4096, 3), &on(&owner.name))
        .unwrap();
    let answers = client.batch_get_replica_desc(&["desc"]);
    let query = answers[0].as_ref().expect("desc is stored");
    assert_eq!(query.replicas.len(), 1);
    let buffer = &query.replicas[0].buffer;
    assert_eq!(buffer.transport_endpoint, owner.name);
    assert_eq!(buffer.protocol, "rdma");
}

/// An engine on `device` built while `vars` are set in this process's environment (they are
/// read when the engine is built and removed again after; the VM runs these tests one at a
/// time).
fn engine_with(device: &Arc<RdmaDevice>, host: &str, vars: &[(&str, &str)]) -> Arc<TransferEngine> {
    for (name, value) in vars {
        std::env::set_var(name, value);
    }
    let built = engine(device, host);
    for (name, _) in vars {
        std::env::remove_var(name);
    }
    built
}

/// One request of `op` between `local` and the peer's `remote`.
fn transfer_one(
    engine: &TransferEngine,
    to: &TransferEngine,
    op: TransferOp,
    local: usize,
    len: usize,
    remote: usize,
) -> mooncake_rs::Result<()> {
    let request = TransferRequest {
        op,
        local_addr: local,
        len: len as u64,
        endpoint: to.local_name(),
        remote_addr: remote as u64,
        epoch: 0,
        send_by: None,
    };
    // SAFETY: the callers' buffers are valid for the operation for the call.
    unsafe { engine.transfer(&[request]) }.pop().unwrap()
}

/// A CQ smaller than the outstanding window (`MC_CQ_DEPTH=1`, `MC_MAX_WR=64`, 4 KiB work
/// requests, one QP per request): the NIC produces more completions than the CQ holds
/// (soft-RoCE drops them and raises `IBV_EVENT_CQ_ERR`). Each such call fails the key with
/// `TRANSFER_FAIL` naming the overrun, long before the transfer timeout; no byte lands
/// outside the request, nor after the call returned; the QP and CQ are rebuilt (a new
/// connection) and the next call, which fits the CQ, moves exactly its bytes. Both ways:
/// WRITE into the owner's segment, READ into the initiator's buffer.
#[test]
fn a_cq_overrun_fails_the_key_and_the_next_call_works() {
    let Some((device, host)) = vm() else { return };
    let device = RdmaDevice::open(&device).unwrap();
    let owner = engine(&device, &host);
    let tiny = engine_with(
        &device,
        &host,
        &[
            ("MC_CQ_DEPTH", "1"),
            ("MC_MAX_WR", "64"),
            ("MC_SLICE_SIZE", "4096"),
            ("MC_TCP_LANES_PER_PEER", "1"),
            ("MC_TRANSFER_TIMEOUT_MS", "30000"),
        ],
    );
    let (guard, len) = (64 << 10, MIB);
    let total = guard + len + guard;
    let mut segment = vec![0x11u8; total];
    let remote = segment.as_mut_ptr() as usize;
    owner.register(remote, total, true).unwrap();
    let mut local = pattern(total, 3);
    let local_addr = local.as_mut_ptr() as usize;
    tiny.register(local_addr, total, false).unwrap();
    let overrun = |op: TransferOp| {
        let before = tiny.metrics().rdma_connections;
        let started = Instant::now();
        let result = transfer_one(&tiny, &owner, op, local_addr + guard, len, remote + guard);
        let message = last_error_message();
        eprintln!(
            "{op:?} of 256 work requests on a 1-entry CQ: {result:?} after {:?}: {message}",
            started.elapsed()
        );
        assert_eq!(result, Err(ErrorCode::TransferFail), "{message}");
        assert!(message.contains("completion queue overrun"), "{message}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "failed by the overrun, not the 30 s timeout"
        );
        before
    };

    // WRITE: bytes outside the request untouched; nothing lands after the call.
    let connections = overrun(TransferOp::Write);
    assert!(
        segment[..guard].iter().all(|b| *b == 0x11),
        "a byte landed before the request"
    );
    assert!(
        segment[guard + len..].iter().all(|b| *b == 0x11),
        "a byte landed after the request"
    );
    let snapshot = segment.clone();
    let small = 4096;
    assert_eq!(
        transfer_one(&tiny, &owner, TransferOp::Write, local_addr, small, remote),
        Ok(())
    );
    assert!(
        tiny.metrics().rdma_connections > connections,
        "the QP was rebuilt"
    );
    assert!(segment[..small] == local[..small]);
    assert!(
        segment[small..] == snapshot[small..],
        "a late write of the broken QP landed"
    );

    // READ: the initiator's bytes outside the request untouched; the next read is exact.
    let mine = local.clone();
    let connections = overrun(TransferOp::Read);
    assert!(
        local[..guard] == mine[..guard],
        "a byte landed before the request"
    );
    assert!(
        local[guard + len..] == mine[guard + len..],
        "a byte landed after the request"
    );
    let snapshot = local.clone();
    let far = total - small;
    assert_eq!(
        transfer_one(
            &tiny,
            &owner,
            TransferOp::Read,
            local_addr + far,
            small,
            remote + far
        ),
        Ok(())
    );
    assert!(
        tiny.metrics().rdma_connections > connections,
        "the QP was rebuilt"
    );
    assert!(local[far..] == segment[far..]);
    assert!(
        local[..far] == snapshot[..far],
        "a late read of the broken QP landed"
    );
    assert_eq!(tiny.metrics().tcp_write_bytes, 0);
    assert_eq!(tiny.metrics().tcp_read_bytes, 0);
}

/// A write whose writer's grant (`send_by`) ends while its work requests are being posted
/// (4096 work requests of 4 KiB, one outstanding at a time): nothing is posted after it, so
/// the call fails `STALE_WRITE_TOKEN` (counted in `late_sends_refused`), the end of the range
/// never changes, nothing lands after the call returned, and the connection, not broken,
/// serves the next call.
#[test]
fn a_write_past_its_send_by_posts_nothing_more() {
    let Some((device, host)) = vm() else { return };
    let device = RdmaDevice::open(&device).unwrap();
    let owner = engine(&device, &host);
    let serial = engine_with(
        &device,
        &host,
        &[
            ("MC_MAX_WR", "1"),
            ("MC_SLICE_SIZE", "4096"),
            ("MC_TCP_LANES_PER_PEER", "1"),
        ],
    );
    let len = 16 * MIB;
    let mut segment = vec![0x11u8; len];
    let remote = segment.as_mut_ptr() as usize;
    owner.register(remote, len, true).unwrap();
    let local = pattern(len, 4);
    let local_addr = local.as_ptr() as usize;
    serial.register(local_addr, len, false).unwrap();
    // Connect first, so that the grant below runs out while posting.
    let small = 4096;
    assert_eq!(
        transfer_one(
            &serial,
            &owner,
            TransferOp::Write,
            local_addr,
            small,
            remote
        ),
        Ok(())
    );
    let before = serial.metrics();
    // A grant that ends while the run posts: 5 ms is enough on a quiet machine; a stalled
    // vCPU can let it end before the first post ("not started", nothing written), and then
    // the next, longer grant is tried (nothing of the range changed meanwhile).
    let mut grants = [5, 10, 20, 40].into_iter().peekable();
    let (result, message) = loop {
        let grant = grants.next().expect("a grant to try");
        let request = TransferRequest {
            op: TransferOp::Write,
            local_addr,
            len: len as u64,
            endpoint: owner.local_name(),
            remote_addr: remote as u64,
            epoch: 0,
            send_by: Some(Instant::now() + Duration::from_millis(grant)),
        };
        let started = Instant::now();
        // SAFETY: `local` is valid for reads of its length for the call.
        let result = unsafe { serial.transfer(&[request]) }.pop().unwrap();
        let message = last_error_message();
        eprintln!(
            "16 MiB write with a {grant} ms grant: {result:?} after {:?}: {message}",
            started.elapsed()
        );
        let posted = segment[small..2 * small] == local[small..2 * small];
        if posted || result != Err(ErrorCode::StaleWriteToken) || grants.peek().is_none() {
            break (result, message);
        }
    };
    assert_eq!(result, Err(ErrorCode::StaleWriteToken), "{message}");
    assert!(
        segment[small..2 * small] == local[small..2 * small],
        "nothing was posted: the grant ended before the run, not during it"
    );
    let after = serial.metrics();
    assert!(after.late_sends_refused > before.late_sends_refused);
    assert!(
        segment[len - small..].iter().all(|b| *b == 0x11),
        "the whole range was written after the grant ended"
    );
    let snapshot = segment.clone();
    std::thread::sleep(Duration::from_millis(100));
    assert!(segment == snapshot, "a byte landed after the call returned");
    let tail = len - small;
    assert_eq!(
        transfer_one(
            &serial,
            &owner,
            TransferOp::Write,
            local_addr + tail,
            small,
            remote + tail
        ),
        Ok(())
    );
    assert!(segment[tail..] == local[tail..]);
    assert_eq!(
        serial.metrics().rdma_connections,
        before.rdma_connections,
        "the late stop broke the connection"
    );
}

/// After `shutdown` an engine moves no byte by RDMA: the next call fails `TRANSFER_FAIL`
/// without connecting (no new QP), and the owner's bytes stay as they were.
#[test]
fn a_shut_down_engine_makes_no_rdma_connection() {
    let Some((device, host)) = vm() else { return };
    let device = RdmaDevice::open(&device).unwrap();
    let (owner, initiator) = (engine(&device, &host), engine(&device, &host));
    let len = 64 << 10;
    let mut segment = vec![0x11u8; len];
    let remote = segment.as_mut_ptr() as usize;
    owner.register(remote, len, true).unwrap();
    let first = pattern(len, 5);
    assert_eq!(write(&initiator, &owner, &first, remote as u64, 0), Ok(()));
    assert!(segment == first);
    initiator.shutdown();
    let connections = initiator.metrics().rdma_connections;
    let second = pattern(len, 6);
    assert_eq!(
        write(&initiator, &owner, &second, remote as u64, 0),
        Err(ErrorCode::TransferFail)
    );
    let message = last_error_message();
    assert!(message.contains("shut down"), "{message}");
    assert_eq!(initiator.metrics().rdma_connections, connections);
    assert!(segment == first, "a shut-down engine wrote");
}

// --- multi-device, descriptors, remount ---

/// Reads `dst.len()` bytes of `from`'s registered `remote` (naming `epoch`) into `dst`.
fn read(
    engine: &TransferEngine,
    from: &TransferEngine,
    dst: &mut [u8],
    remote: u64,
    epoch: u64,
) -> mooncake_rs::Result<()> {
    let request = TransferRequest {
        op: TransferOp::Read,
        local_addr: dst.as_mut_ptr() as usize,
        len: dst.len() as u64,
        endpoint: from.local_name(),
        remote_addr: remote,
        epoch,
        send_by: None,
    };
    // SAFETY: `dst` is valid for writes of its length for the call and nothing else uses it.
    unsafe { engine.transfer(&[request]) }.pop().unwrap()
}

/// The bytes of `region` as this process sees them (its current pages).
fn bytes_of(region: &MappedRegion) -> Vec<u8> {
    // SAFETY: our own live mapping; no transfer into it runs while the test reads it.
    unsafe { std::slice::from_raw_parts(region.addr() as *const u8, region.len()) }.to_vec()
}

/// Finding S3: a remount fences the old epoch, maps fresh pages, then re-registers the range
/// with the NIC, in that order (new MRs first, the old ones kept through their quarantine). A
/// peer still holding the old rkey lands nothing in the new pages (only in the orphaned old
/// ones); a peer with the new rkey reads exactly the bytes the
/// owner put into the new pages and its writes land there (not in the old pages).
#[test]
fn a_remount_registers_the_fresh_pages_and_the_old_rkey_reaches_only_orphaned_pages() {
    let Some((device, host)) = vm() else { return };
    let device = RdmaDevice::open(&device).unwrap();
    let (owner, peer) = (engine(&device, &host), engine(&device, &host));
    let len = 2 * MIB;
    let mut region = MappedRegion::shared(len as u64, "remount test").unwrap();
    let base = region.addr();
    owner.register(base, len, true).unwrap();
    owner.set_region_epoch(base, 1).unwrap();
    let old = pattern(len, 1);
    assert_eq!(write(&peer, &owner, &old, base as u64, 1), Ok(()));
    assert!(bytes_of(&region) == old, "the first mount's bytes landed");
    // The remount, as the client's own segment does it: fresh (zero) pages over the range.
    owner
        .set_region_epoch_with(base, 2, Duration::ZERO, || {
            region.renew_shared("remount test", false)
        })
        .unwrap();
    assert!(bytes_of(&region).iter().all(|b| *b == 0), "fresh pages");
    let fresh = pattern(len, 2);
    // SAFETY: our own mapping of `len` bytes; nothing else touches it now.
    unsafe { std::ptr::copy_nonoverlapping(fresh.as_ptr(), base as *mut u8, len) };
    // The peer's pooled QP still has the first mount's table: the old rkey (epoch 0 skips
    // the table's epoch check, so the work requests are posted). The old MR is kept through
    // MC_RDMA_MR_QUARANTINE_MS, so its rkey is never reissued to the new mount, and it pins
    // only the old pages: the stale WRITE lands there, never in the new pages. Under 2 MiB
    // the request is one part, so it runs on that pooled QP alone.
    let before = peer.metrics();
    let intruder = pattern(MIB, 3);
    assert_eq!(write(&peer, &owner, &intruder, base as u64, 0), Ok(()));
    assert_eq!(peer.metrics().rdma_connections, before.rdma_connections);
    assert!(
        bytes_of(&region) == fresh,
        "nothing landed in the new pages"
    );
    // A new QP learns the new rkey and epoch: it reads the new pages' bytes exactly...
    let mut got = vec![0u8; len];
    assert_eq!(read(&peer, &owner, &mut got, base as u64, 2), Ok(()));
    assert!(got == fresh, "the new rkey reaches the new pages");
    // ...and its writes land in them.
    let second = pattern(len, 4);
    assert_eq!(write(&peer, &owner, &second, base as u64, 2), Ok(()));
    assert!(
        bytes_of(&region) == second,
        "a write by the new rkey lands in the new pages"
    );
    let m = peer.metrics();
    assert!(m.rdma_connections > before.rdma_connections, "{m:?}");
    assert_eq!(m.tcp_write_bytes + m.tcp_read_bytes, 0);
    owner.unregister(base).unwrap();
}

/// The second soft-RoCE device `scripts/rdma-tests.sh` adds in the VM (`RDMA_VM_DEV2`).
fn second_device() -> Option<String> {
    let device = std::env::var("RDMA_VM_DEV2").ok();
    if device.is_none() {
        eprintln!("skipped: needs a second RDMA device (RDMA_VM_DEV2, scripts/rdma-tests.sh)");
    }
    device
}

/// `device_name = "rxe0,rxe1"`: every range is registered on both devices, QPs are made per
/// (local device, peer) and the parts of a request are striped across the devices: each
/// device carries bytes of every request, in both directions, bounced and zero-copy.
#[test]
fn two_devices_stripe_the_slices_of_a_request() {
    let Some((first, host)) = vm() else { return };
    let Some(second) = second_device() else {
        return;
    };
    let devices = RdmaDevices::open(&format!("{first},{second}")).unwrap();
    let names: Vec<&str> = devices.devices().iter().map(|d| d.name()).collect();
    assert_eq!(names, [first.as_str(), second.as_str()]);
    let engine_on = |devices: &RdmaDevices| {
        let listener = TcpListener::bind((host.as_str(), 0)).unwrap();
        TransferEngine::new(EngineConfig {
            local_name: listener.local_addr().unwrap().to_string(),
            listener: Some(listener),
            resolver: Arc::new(DirectResolver),
            memcpy_enabled: true,
            rdma: Some(devices.clone()),
        })
        .unwrap()
    };
    let (owner, initiator) = (engine_on(&devices), engine_on(&devices));
    let len = 8 * MIB;
    let mut segment = vec![0u8; len];
    let remote = segment.as_mut_ptr() as u64;
    owner.register(remote as usize, len, true).unwrap();
    let mut registered = vec![0u8; len];
    initiator
        .register(registered.as_mut_ptr() as usize, len, false)
        .unwrap();
    // Unregistered source: bounced through each device's own bounce buffers.
    let value = pattern(len, 7);
    assert_eq!(write(&initiator, &owner, &value, remote, 0), Ok(()));
    assert!(segment == value);
    let wrote = initiator.rdma_device_bytes();
    // Registered destination: zero-copy, with each device's own lkey.
    let bounced = initiator.metrics().rdma_bounce_bytes;
    assert_eq!(read(&initiator, &owner, &mut registered, remote, 0), Ok(()));
    assert!(registered == value);
    let m = initiator.metrics();
    assert_eq!(
        m.rdma_bounce_bytes, bounced,
        "the registered read is zero-copy"
    );
    let per_device = initiator.rdma_device_bytes();
    eprintln!("per device: {per_device:?}");
    assert_eq!(per_device.len(), 2);
    for (device, name) in per_device.iter().zip(&names) {
        assert_eq!(device.device, *name);
        assert!(device.write_bytes > 0, "{name} carried part of the write");
        assert!(device.read_bytes > 0, "{name} carried part of the read");
    }
    let total =
        |f: fn(&RdmaDeviceBytes) -> u64, of: &[RdmaDeviceBytes]| -> u64 { of.iter().map(f).sum() };
    assert_eq!(total(|d| d.write_bytes, &wrote), len as u64);
    assert_eq!(total(|d| d.read_bytes, &per_device), len as u64);
    assert!(m.rdma_connections >= 2, "a QP from each device: {m:?}");
    assert!(owner.metrics().rdma_served_connections >= 2);
    assert_eq!(m.tcp_write_bytes + m.tcp_read_bytes, 0);
    assert_eq!(owner.rdma_device_bytes().len(), 2);
}

/// A client and an owner process both on two devices (`--device_name=rxe0,rxe1`) round-trip
/// through the store by RDMA only.
#[test]
fn a_client_on_two_devices_round_trips_by_rdma() {
    let Some((first, host)) = vm() else { return };
    let Some(second) = second_device() else {
        return;
    };
    let both = format!("{first},{second}");
    let master = Master::start(&[]);
    let owner = Owner::start(&master.addr(), "64 MB", &both, &host);
    let client = rdma_client(&master.addr(), &both, &host, 0);
    let before = client.metrics().transfer;
    for (i, size) in [4096usize, 8 * MIB + 3].into_iter().enumerate() {
        let key = format!("two-devices-{i}");
        let value = pattern(size, 30 + i as u8);
        client.put_from(&key, &value, &on(&owner.name)).unwrap();
        let mut out = vec![0u8; size];
        assert_eq!(client.get_into(&key, &mut out), Ok(size as u64));
        assert!(out == value, "bytes of {key}");
    }
    let after = client.metrics().transfer;
    no_tcp(&before, &after);
    assert_eq!(
        after.rdma_read_bytes - before.rdma_read_bytes,
        (4096 + 8 * MIB + 3) as u64
    );
    assert!(after.rdma_connections >= 2, "{after:?}");
}

/// A `device_name` list with a device that does not exist, or one named twice, fails setup
/// with `TRANSFER_FAIL` naming it (on the host, without a device, the list is refused for the
/// duplicate before any device is opened).
#[test]
fn a_bad_name_in_a_device_list_is_named_at_setup() {
    let setup = |device_name: String| {
        let result = Client::setup(SetupConfig {
            local_hostname: "127.0.0.1".into(),
            global_segment_size: 0,
            local_buffer_size: 0,
            protocol: "rdma".into(),
            device_name,
            master_server_addr: "embedded".into(),
            ..SetupConfig::default()
        });
        assert_eq!(result.map(|_| ()), Err(ErrorCode::TransferFail));
        last_error_message()
    };
    let first = vm().map_or("rxe0".to_string(), |(device, _)| device);
    let twice = setup(format!("{first}, {first}"));
    assert!(twice.contains("protocol 'rdma'"), "{twice}");
    assert!(twice.contains("named twice"), "{twice}");
    if vm().is_some() {
        let missing = setup(format!("{first},no_such_dev1"));
        assert!(missing.contains("\"no_such_dev1\" not found"), "{missing}");
    }
}

/// An endpoint of `mooncake.engine.TransferEngine` on RDMA (P2P handshake name on the VM's
/// address, `protocol = "rdma"`).
fn rdma_endpoint(device: &str, host: &str) -> mooncake_rs::transfer_api::TransferEndpoint {
    let endpoint = mooncake_rs::transfer_api::TransferEndpoint::start(
        &mooncake_rs::transfer_api::EndpointConfig {
            local_hostname: host.into(),
            metadata_server: "P2PHANDSHAKE".into(),
            metadata_type: None,
            protocol: "rdma".into(),
            device_name: device.into(),
        },
    )
    .unwrap();
    assert!(endpoint.uses_rdma());
    endpoint
}

/// The target process of `transfer_engine_endpoints_move_their_bytes_by_rdma` (this test binary
/// started again with `MC_TE_TARGET=1`): registers 4 MiB, prints `TE-TARGET <segment> <address>`
/// and serves until its stdin closes.
fn serve_as_transfer_engine_target(device: &str, host: &str) {
    use std::io::Read;
    let target = rdma_endpoint(device, host);
    let memory = vec![0u8; 4 * MIB];
    // SAFETY: `memory` outlives the endpoint, dropped first below.
    unsafe { target.register(memory.as_ptr() as usize, memory.len()) }.unwrap();
    println!(
        "TE-TARGET {} {}",
        target.segment_name(),
        memory.as_ptr() as usize
    );
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(target);
}

/// `mooncake.engine.TransferEngine`'s endpoint on RDMA between two processes: a target process
/// that registers memory and serves, an initiator writing random spans (sync, batch, async) and
/// reading each back byte for byte; every byte by RDMA, none over TCP; a remote range the
/// target never registered is refused.
#[test]
fn transfer_engine_endpoints_move_their_bytes_by_rdma() {
    use mooncake_rs::transfer_api::TransferPart;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let Some((device, host)) = vm() else { return };
    if std::env::var_os("MC_TE_TARGET").is_some() {
        return serve_as_transfer_engine_target(&device, &host);
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "transfer_engine_endpoints_move_their_bytes_by_rdma",
            "--nocapture",
        ])
        .env("MC_TE_TARGET", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let announced = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("TE-TARGET ").map(str::to_string))
        .expect("the target process announces itself");
    // The rest of its output (the test harness's lines) is drained, so it never writes into a
    // closed pipe.
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).count());
    let (name, remote) = announced.split_once(' ').unwrap();
    let (name, remote) = (name.to_string(), remote.parse::<u64>().unwrap());
    let initiator = rdma_endpoint(&device, &host);
    const SIZE: usize = 4 * MIB;
    let mut source = pattern(SIZE, 34);
    let sink = vec![0u8; SIZE];
    // SAFETY: the buffers outlive the endpoint's use of them (it drops first).
    unsafe {
        initiator.register(source.as_ptr() as usize, SIZE).unwrap();
        initiator.register(sink.as_ptr() as usize, SIZE).unwrap();
    }
    let before = initiator.metrics();
    let (mut written, mut read) = (0u64, 0u64);
    let mut rng = fastrand::Rng::with_seed(34);
    for round in 0..100u32 {
        let len = rng.usize(1..256 * 1024);
        let at = rng.usize(0..SIZE - len);
        source[at..at + len]
            .iter_mut()
            .for_each(|b| *b = b.wrapping_add(round as u8 + 1));
        // Every third round a batch: the range in four parts of one call.
        let pieces = if round % 3 == 2 { 4 } else { 1 };
        let parts = |local: &[u8]| -> Vec<TransferPart> {
            (0..pieces)
                .map(|i| {
                    let (from, to) = (at + len * i / pieces, at + len * (i + 1) / pieces);
                    TransferPart {
                        local: local.as_ptr() as usize + from,
                        remote: remote + from as u64,
                        len: (to - from) as u64,
                    }
                })
                .collect()
        };
        // SAFETY: registered buffers alive for the test.
        unsafe {
            if round % 2 == 0 {
                initiator
                    .transfer(&name, TransferOp::Write, &parts(&source))
                    .unwrap();
            } else {
                let id = initiator
                    .submit(&name, TransferOp::Write, parts(&source))
                    .unwrap();
                initiator.wait_batches(&[id]).unwrap();
            }
            initiator
                .transfer(&name, TransferOp::Read, &parts(&sink))
                .unwrap();
        }
        written += len as u64;
        read += len as u64;
        assert!(sink[at..at + len] == source[at..at + len], "round {round}");
    }
    moved_by_rdma(&before, &initiator.metrics(), written, read);
    assert_eq!(initiator.first_buffer_address(&name), Ok(remote));
    let bad = TransferPart {
        local: source.as_ptr() as usize,
        remote: remote + SIZE as u64 - 32,
        len: 64,
    };
    // SAFETY: as above.
    let id = unsafe { initiator.submit(&name, TransferOp::Write, vec![bad]) }.unwrap();
    assert!(
        initiator.wait_batches(&[id]).is_err(),
        "past the target's registration"
    );
    assert_eq!(
        initiator.batch_state(id),
        Err(ErrorCode::InvalidParams),
        "freed"
    );
    drop(child.stdin.take());
    assert!(
        child.wait().unwrap().success(),
        "the target process ends cleanly"
    );
    drain.join().unwrap();
}
