//! The same-host channel between two real client processes on one host: a `mooncake_client`
//! peer offering its segment (`MC_SAME_HOST=1`) and a client in the test process, which maps
//! the peer's segment after the handshake and moves every byte with one copy — no TCP byte.
//! Also: a remount of the peer makes the mapping of the old mount unusable, a killed peer's
//! mapping is dropped and its restart mapped afresh, and a peer that refuses is reached over
//! TCP.

mod common;

use common::{free_port, local_client, pattern, wait_until, Master, PeerClient};
use mooncake_rs::client::{Client, RangeRequest};
use mooncake_rs::transfer::{
    DirectResolver, EngineConfig, TransferEngine, TransferMetrics, TransferOp, TransferRequest,
};
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MIB: usize = 1 << 20;

fn on(segment: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![segment.to_string()],
        ..ReplicateConfig::default()
    }
}

/// Bytes that crossed TCP (either way) between two snapshots.
fn tcp_bytes(before: &TransferMetrics, after: &TransferMetrics) -> u64 {
    after.tcp_read_bytes + after.tcp_write_bytes - before.tcp_read_bytes - before.tcp_write_bytes
}

/// The replica address and epoch of `key`'s (only) replica.
fn replica(client: &Client, key: &str) -> (u64, u64) {
    let found = client
        .batch_get_replica_desc(&[key])
        .pop()
        .unwrap()
        .unwrap();
    let buffer = &found.replicas[0].buffer;
    (buffer.buffer_address, buffer.epoch)
}

/// An engine of the test process (no listener) to address a peer's segment directly.
fn probe_engine() -> Arc<TransferEngine> {
    TransferEngine::new(EngineConfig {
        local_name: "same-host-probe".into(),
        listener: None,
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: None,
    })
    .unwrap()
}

/// One request of `buf.len()` bytes at `addr` of `endpoint`'s segment, naming `epoch`.
fn transfer(
    engine: &TransferEngine,
    op: TransferOp,
    buf: &mut [u8],
    endpoint: &str,
    addr: u64,
    epoch: u64,
) -> Result<(), ErrorCode> {
    let request = TransferRequest {
        op,
        local_addr: buf.as_mut_ptr() as usize,
        len: buf.len() as u64,
        endpoint,
        remote_addr: addr,
        epoch,
        send_by: None,
    };
    // SAFETY: `buf` is valid and exclusively ours for the call.
    unsafe { engine.transfer(&[request]) }.pop().unwrap()
}

#[test]
fn two_processes_exchange_through_the_mapped_segment_with_no_tcp_byte() {
    let master = Master::start(&[]);
    let peer = PeerClient::start_same_host(&master.addr(), "256 MB", &[]);
    let client = local_client(&master.addr(), 0, 64 * MIB as u64);
    let start = client.metrics();
    for (i, size) in [1usize, 4096, 64 << 10, MIB, 9 * MIB + 1]
        .into_iter()
        .enumerate()
    {
        let key = format!("sh-{size}");
        let value = pattern(size, i as u8);
        let before = client.metrics();
        client.put_from(&key, &value, &on(&peer.name)).unwrap();
        let mut out = vec![0u8; size];
        assert_eq!(client.get_into(&key, &mut out), Ok(size as u64));
        assert_eq!(out, value);
        assert_eq!(client.get_buffer(&key).unwrap().as_slice(), &value[..]);
        let after = client.metrics();
        let (b, a) = (&before.transfer, &after.transfer);
        assert_eq!(
            a.same_host_write_bytes - b.same_host_write_bytes,
            size as u64
        );
        assert_eq!(a.same_host_writes - b.same_host_writes, 1);
        assert_eq!(
            a.same_host_read_bytes - b.same_host_read_bytes,
            2 * size as u64
        );
        assert_eq!(
            after.paths.peer_segment_to_host.copied_bytes
                - before.paths.peer_segment_to_host.copied_bytes,
            2 * size as u64,
            "one copy per byte read"
        );
        assert_eq!(tcp_bytes(b, a), 0, "no byte over TCP");
    }
    // Batches (zero-copy and copying), multi-part values and ranges.
    let keys: Vec<String> = (0..32).map(|i| format!("batch-{i}")).collect();
    let values: Vec<Vec<u8>> = (0..32).map(|i| pattern(4096 + i, i as u8)).collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    let results = client.batch_put_from(&keys, &refs, &on(&peer.name));
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let mut outs: Vec<Vec<u8>> = values.iter().map(|v| vec![0u8; v.len()]).collect();
    let mut bufs: Vec<&mut [u8]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
    let got = client.batch_get_into(&keys, &mut bufs);
    assert!(
        got.iter()
            .zip(&values)
            .all(|(r, v)| *r == Ok(v.len() as u64)),
        "{got:?}"
    );
    assert_eq!(outs, values);
    client
        .put_parts("parts", &[b"first part,", b" second part"], &on(&peer.name))
        .unwrap();
    assert_eq!(
        client.get_buffer("parts").unwrap().as_slice(),
        b"first part, second part"
    );
    let big = pattern(3 * MIB, 77);
    client.put_from("ranged", &big, &on(&peer.name)).unwrap();
    let mut dst = vec![0u8; 8192];
    let keys = [vec!["ranged".to_string(), "ranged".to_string()]];
    let results = client.get_into_ranges(
        &mut [dst.as_mut_slice()],
        &RangeRequest {
            keys: &keys,
            dst_offsets: &[vec![vec![0], vec![4096]]],
            src_offsets: &[vec![vec![MIB as u64 + 3], vec![2 * MIB as u64]]],
            sizes: &[vec![vec![4096], vec![4096]]],
        },
    );
    assert_eq!(results, vec![vec![vec![Ok(4096)], vec![Ok(4096)]]]);
    assert_eq!(&dst[..4096], &big[MIB + 3..MIB + 3 + 4096]);
    assert_eq!(&dst[4096..], &big[2 * MIB..2 * MIB + 4096]);
    assert_eq!(client.is_exist("ranged"), Ok(true));
    client.remove("ranged", true).unwrap();
    assert_eq!(client.is_exist("ranged"), Ok(false));
    let end = client.metrics().transfer;
    assert_eq!(tcp_bytes(&start.transfer, &end), 0, "no byte over TCP");
    assert_eq!(
        end.same_host_handshakes - start.transfer.same_host_handshakes,
        1,
        "mapped once"
    );
    assert_eq!(end.same_host_refusals, 0);
}

/// A mapped copy of 2 MiB or more is cut across the copy crew (`MC_COPY_THREADS`) when a
/// helper is free: the bytes land exactly, and `host_split_copies` shows the route. Other
/// tests of this binary may hold the helpers for a moment, so the get is repeated (bounded)
/// until one is split.
#[test]
fn a_large_mapped_get_is_split_across_the_copy_crew_and_lands_exactly() {
    use mooncake_rs::device::{copy_threads, DeviceStats};
    let master = Master::start(&[]);
    let peer = PeerClient::start_same_host(&master.addr(), "64 MB", &[]);
    let client = local_client(&master.addr(), 0, 64 * MIB as u64);
    let size = 9 * MIB + 4097;
    let value = pattern(size, 41);
    client.put_from("crew", &value, &on(&peer.name)).unwrap();
    let start = client.metrics().transfer;
    let mut split = false;
    for _ in 0..50 {
        let before = DeviceStats::snapshot().host_split_copies;
        // Unaligned destination: the pieces' boundaries follow its pages, not the offset.
        let mut out = vec![0u8; size + 1];
        assert_eq!(client.get_into("crew", &mut out[1..]), Ok(size as u64));
        assert!(out[1..] == value[..], "the mapped get's bytes");
        assert_eq!(out[0], 0, "nothing before the destination");
        if DeviceStats::snapshot().host_split_copies > before {
            split = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        split,
        copy_threads() > 1,
        "split exactly when there are helpers"
    );
    assert_eq!(
        tcp_bytes(&start, &client.metrics().transfer),
        0,
        "no byte over TCP"
    );
}

#[test]
fn a_remount_makes_the_old_mapping_unusable_and_never_yields_old_or_foreign_bytes() {
    let mut master = Master::start(&[]);
    let peer = PeerClient::start_same_host(&master.addr(), "64 MB", &[]);
    let client = local_client(&master.addr(), 0, 0);
    let size = 8 * MIB;
    let old = pattern(size, 1);
    client.put_from("old", &old, &on(&peer.name)).unwrap();
    let (addr, epoch) = replica(&client, "old");
    assert_ne!(epoch, 0);
    let probe = probe_engine();
    let mut buf = vec![0u8; size];
    assert_eq!(
        transfer(&probe, TransferOp::Read, &mut buf, &peer.name, addr, epoch),
        Ok(())
    );
    assert_eq!(buf, old);
    assert_eq!(probe.metrics().same_host_read_bytes, size as u64);

    // Readers and writers of the old mount run across the remount.
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = |op: TransferOp| {
        let (probe, stop, name, old) = (
            Arc::clone(&probe),
            Arc::clone(&stop),
            peer.name.clone(),
            old.clone(),
        );
        std::thread::spawn(move || {
            let mut buf = vec![0xeeu8; size];
            let (mut ok_after_error, mut errors, mut oks) = (0, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) && errors < 200 {
                if op == TransferOp::Write {
                    buf.fill(0xee);
                }
                match transfer(&probe, op, &mut buf, &name, addr, epoch) {
                    Ok(()) => {
                        oks += 1;
                        ok_after_error += u64::from(errors > 0);
                        if op == TransferOp::Read {
                            assert!(buf == old, "a read of the old mount returned other bytes");
                        }
                    }
                    Err(code) => {
                        errors += 1;
                        assert!(
                            matches!(code, ErrorCode::StaleSegmentEpoch | ErrorCode::TransferFail),
                            "{code:?}"
                        );
                    }
                }
            }
            (oks, errors, ok_after_error)
        })
    };
    let reader = hammer(TransferOp::Read);
    // Restart the master: the peer is told to remount (fresh epoch, empty segment).
    master.kill();
    let port = master.port;
    let master = Master::start_on(port, &[]);
    let new = pattern(size, 2);
    let stored = wait_until(Duration::from_secs(20), || {
        client.put_from("new", &new, &on(&peer.name)).is_ok()
    });
    assert!(stored, "the peer did not remount");
    let writer = hammer(TransferOp::Write);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let (reads, read_errors, reads_after_error) = reader.join().unwrap();
    let (writes, write_errors, _) = writer.join().unwrap();
    assert!(
        reads >= 1 && read_errors >= 1,
        "{reads} reads, {read_errors} errors"
    );
    assert_eq!(
        reads_after_error, 0,
        "a read of the old mount succeeded after the remount"
    );
    assert_eq!(
        writes, 0,
        "a write into the old mount succeeded after the remount"
    );
    assert!(write_errors >= 1);

    let (new_addr, new_epoch) = replica(&client, "new");
    assert_ne!(new_epoch, epoch);
    let mut out = vec![0u8; size];
    assert_eq!(client.get_into("new", &mut out), Ok(size as u64));
    assert!(
        out == new,
        "the new mount's bytes were touched through the old mapping"
    );
    // The old descriptor on the new mount's space (the fresh master reuses offsets).
    let mut foreign = vec![0x55u8; size];
    assert_eq!(
        transfer(
            &probe,
            TransferOp::Write,
            &mut foreign,
            &peer.name,
            new_addr,
            epoch
        ),
        Err(ErrorCode::StaleSegmentEpoch)
    );
    assert_eq!(
        transfer(
            &probe,
            TransferOp::Read,
            &mut foreign,
            &peer.name,
            new_addr,
            epoch
        ),
        Err(ErrorCode::StaleSegmentEpoch)
    );
    assert!(
        foreign.iter().all(|&b| b == 0x55),
        "no byte of the new mount read"
    );
    assert_eq!(client.get_into("new", &mut out), Ok(size as u64));
    assert!(out == new);
    // The new mount is mapped afresh by the probe too.
    assert_eq!(
        transfer(
            &probe,
            TransferOp::Read,
            &mut out,
            &peer.name,
            new_addr,
            new_epoch
        ),
        Ok(())
    );
    assert!(out == new);
    let m = probe.metrics();
    assert!(m.same_host_mappings_dropped >= 1, "{m:?}");
    assert!(m.same_host_handshakes >= 2, "{m:?}");
    drop(master);
}

#[test]
fn a_killed_peer_is_dropped_and_its_restart_mapped_afresh() {
    let master = Master::start(&[]);
    let port = free_port();
    let flags = [format!("--host=127.0.0.1:{port}")];
    let mut peer = PeerClient::start_same_host(&master.addr(), "32 MB", &flags);
    let client = local_client(&master.addr(), 0, 0);
    let value = pattern(MIB, 3);
    client.put_from("before", &value, &on(&peer.name)).unwrap();
    let mut out = vec![0u8; MIB];
    assert_eq!(client.get_into("before", &mut out), Ok(MIB as u64));
    assert_eq!(out, value);
    let name = peer.name.clone();
    peer.kill();
    let failed = client.get_into("before", &mut out);
    assert!(failed.is_err(), "a read from a killed owner: {failed:?}");
    let dead = client.metrics().transfer;
    let peer = PeerClient::start_same_host(&master.addr(), "32 MB", &flags);
    assert_eq!(peer.name, name);
    let again = pattern(MIB, 4);
    let stored = wait_until(Duration::from_secs(20), || {
        client.put_from("after", &again, &on(&peer.name)).is_ok()
    });
    assert!(stored, "no put to the restarted peer");
    assert_eq!(client.get_into("after", &mut out), Ok(MIB as u64));
    assert_eq!(out, again);
    let m = client.metrics().transfer;
    assert!(m.same_host_handshakes >= 2, "{m:?}");
    assert_eq!(
        m.same_host_read_bytes - dead.same_host_read_bytes,
        MIB as u64
    );
    assert_eq!(tcp_bytes(&dead, &m), 0, "{m:?}");
}

#[test]
fn a_peer_that_refuses_is_reached_over_tcp() {
    let master = Master::start(&[]);
    let peer = PeerClient::start(&master.addr(), "32 MB");
    let client = local_client(&master.addr(), 0, 0);
    let value = pattern(MIB, 9);
    client.put_from("tcp", &value, &on(&peer.name)).unwrap();
    let mut out = vec![0u8; MIB];
    assert_eq!(client.get_into("tcp", &mut out), Ok(MIB as u64));
    assert_eq!(out, value);
    let m = client.metrics().transfer;
    assert_eq!(m.tcp_write_bytes, MIB as u64);
    assert_eq!(m.tcp_read_bytes, MIB as u64);
    assert_eq!(m.same_host_read_bytes + m.same_host_write_bytes, 0);
    assert_eq!(m.same_host_handshakes, 0);
    assert!(
        (1..=2).contains(&m.same_host_refusals),
        "refused, then remembered for MC_SAME_HOST_RETRY_MS: {m:?}"
    );
}

/// Binds the same-host socket name of `endpoint` in the test process (the peer behind it
/// runs with `MC_SAME_HOST=0`, so the name is free), accepts connections and never answers.
/// Returns the number of connections accepted so far and a stop switch.
fn silent_owner(endpoint: &str) -> (Arc<std::sync::atomic::AtomicUsize>, Arc<AtomicBool>) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let name = format!("mooncake-rs/same-host/{endpoint}");
    let listener =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
    listener.set_nonblocking(true).unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (count, stopping) = (Arc::clone(&accepted), Arc::clone(&stop));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        // Bounded: the test stops it, and at most 10 minutes either way.
        let end = std::time::Instant::now() + Duration::from_secs(600);
        while !stopping.load(Ordering::SeqCst) && std::time::Instant::now() < end {
            match listener.accept() {
                Ok((stream, _)) => {
                    held.push(stream);
                    count.fetch_add(1, Ordering::SeqCst);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    (accepted, stop)
}

#[test]
fn a_peer_that_accepts_and_never_answers_costs_one_bounded_wait_and_delays_no_other_peer() {
    let master = Master::start(&[]);
    let silent = PeerClient::start(&master.addr(), "32 MB");
    let mapped = PeerClient::start_same_host(&master.addr(), "32 MB", &[]);
    let (accepted, stop) = silent_owner(&silent.name);
    let client = Arc::new(local_client(&master.addr(), 0, 0));
    let value = pattern(MIB, 5);
    client
        .put_from("mapped", &value, &on(&mapped.name))
        .unwrap();
    // A put to the silent peer hangs in its handshake...
    let done = Arc::new(AtomicBool::new(false));
    let slow = {
        let (client, done, value, name) = (
            Arc::clone(&client),
            Arc::clone(&done),
            value.clone(),
            silent.name.clone(),
        );
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            let stored = client.put_from("silent", &value, &on(&name));
            done.store(true, Ordering::SeqCst);
            (stored, start.elapsed())
        })
    };
    assert!(
        wait_until(Duration::from_secs(20), || accepted.load(Ordering::SeqCst)
            >= 1),
        "the client never connected to the silent owner"
    );
    // ...while a get from the other peer goes through its mapping at once.
    let mut out = vec![0u8; MIB];
    assert_eq!(client.get_into("mapped", &mut out), Ok(MIB as u64));
    assert!(out == value);
    assert!(
        !done.load(Ordering::SeqCst),
        "the get from the mapped peer waited for the other peer's handshake"
    );
    let (stored, took) = slow.join().unwrap();
    assert_eq!(stored, Ok(()));
    assert!(
        took < Duration::from_secs(12),
        "the silent handshake held the put for {took:?}"
    );
    // The refusal is remembered: the get goes over TCP without another connection.
    assert_eq!(client.get_into("silent", &mut out), Ok(MIB as u64));
    assert!(out == value);
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one handshake per peer");
    let m = client.metrics().transfer;
    assert_eq!(m.tcp_write_bytes, MIB as u64, "{m:?}");
    assert_eq!(m.tcp_read_bytes, MIB as u64, "{m:?}");
    assert!(m.same_host_refusals >= 1, "{m:?}");
    stop.store(true, Ordering::SeqCst);
}

/// How many descriptors process `pid` holds open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn many_handshakes_leave_the_owner_no_more_descriptors() {
    let master = Master::start(&[]);
    let peer = PeerClient::start_same_host(&master.addr(), "32 MB", &[]);
    let client = local_client(&master.addr(), 0, 0);
    let value = pattern(4096, 8);
    client.put_from("fds", &value, &on(&peer.name)).unwrap();
    let (addr, epoch) = replica(&client, "fds");
    // Each engine maps the peer once (one handshake, one granted connection) and goes away.
    let handshake = || {
        let engine = probe_engine();
        let mut out = vec![0u8; 4096];
        let read = transfer(&engine, TransferOp::Read, &mut out, &peer.name, addr, epoch);
        assert_eq!(read, Ok(()));
        assert!(out == value);
        assert_eq!(engine.metrics().same_host_handshakes, 1);
    };
    handshake();
    let before = open_fds(peer.pid());
    for _ in 0..100 {
        handshake();
    }
    let after = open_fds(peer.pid());
    assert!(
        after <= before + 4,
        "the owner held {before} descriptors before 100 handshakes of gone peers, {after} after"
    );
}

#[test]
fn an_idle_owner_closes_the_connections_of_gone_peers() {
    let master = Master::start(&[]);
    let peer = PeerClient::start_same_host(&master.addr(), "32 MB", &[]);
    let client = local_client(&master.addr(), 0, 0);
    let value = pattern(4096, 9);
    client
        .put_from("idle-fds", &value, &on(&peer.name))
        .unwrap();
    let (addr, epoch) = replica(&client, "idle-fds");
    let before = open_fds(peer.pid());
    // Twenty engines map the peer (one granted connection each) and stay.
    let engines: Vec<_> = (0..20)
        .map(|_| {
            let engine = probe_engine();
            let mut out = vec![0u8; 4096];
            let read = transfer(&engine, TransferOp::Read, &mut out, &peer.name, addr, epoch);
            assert_eq!(read, Ok(()));
            assert!(out == value);
            engine
        })
        .collect();
    let held = open_fds(peer.pid());
    assert!(
        held >= before + 20,
        "{before} descriptors before, {held} with 20 mappings"
    );
    drop(engines);
    // No further handshake: the owner must notice on its own.
    let released = wait_until(Duration::from_secs(5), || {
        open_fds(peer.pid()) <= before + 1
    });
    assert!(
        released,
        "the idle owner still holds {} descriptors 5 s after its 20 peers went ({before} before)",
        open_fds(peer.pid())
    );
}

/// The inodes of the shared-memory files process `pid` maps (`/memfd:` lines of its maps).
fn memfd_inodes(pid: &str) -> std::collections::HashSet<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|line| line.contains("/memfd:"))
        .filter_map(|line| line.split_whitespace().nth(4).map(str::to_string))
        .collect()
}

#[test]
fn a_killed_owner_is_unmapped_by_an_idle_reader() {
    let master = Master::start(&[]);
    let mut peer = PeerClient::start_same_host(&master.addr(), "32 MB", &[]);
    let client = local_client(&master.addr(), 0, 0);
    let value = pattern(MIB, 6);
    client.put_from("kill", &value, &on(&peer.name)).unwrap();
    let mut out = vec![0u8; MIB];
    assert_eq!(client.get_into("kill", &mut out), Ok(MIB as u64));
    assert!(out == value);
    // The owner's files (segment, control page) that this process maps now.
    let owners = memfd_inodes(&peer.pid().to_string());
    let mapped = |inodes: &std::collections::HashSet<String>| {
        memfd_inodes("self")
            .intersection(inodes)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(mapped(&owners).len(), 2, "segment and control page mapped");
    peer.kill();
    // No further request names the owner: the reader notices on its own.
    assert!(
        wait_until(Duration::from_secs(10), || mapped(&owners).is_empty()),
        "the dead owner's files are still mapped: {:?}",
        mapped(&owners)
    );
    assert!(client.metrics().transfer.same_host_mappings_dropped >= 1);
}

#[test]
fn a_mapped_write_whose_grant_ends_mid_copy_stops_at_a_chunk_and_fails() {
    const LEN: usize = 128 * MIB;
    let master = Master::start(&[]);
    let peer = PeerClient::start_same_host(&master.addr(), "160 MB", &[]);
    let client = local_client(&master.addr(), 0, 0);
    client
        .put_from("big", &vec![0x11u8; LEN], &on(&peer.name))
        .unwrap();
    let (addr, epoch) = replica(&client, "big");
    let engine = probe_engine();
    let mut new = vec![0x22u8; LEN];
    let mut back = vec![0u8; LEN];
    // The grant ends a few ms after the write starts (128 MiB take longer to copy); a write
    // refused before its first byte (a slow start) is retried with a longer grant.
    let mut margin = Duration::from_millis(2);
    for _ in 0..8 {
        let request = TransferRequest {
            op: TransferOp::Write,
            local_addr: new.as_mut_ptr() as usize,
            len: LEN as u64,
            endpoint: &peer.name,
            remote_addr: addr,
            epoch,
            send_by: Some(std::time::Instant::now() + margin),
        };
        // SAFETY: `new` is valid and ours for the call.
        let result = unsafe { engine.transfer(&[request]) }.pop().unwrap();
        let read = transfer(
            &engine,
            TransferOp::Read,
            &mut back,
            &peer.name,
            addr,
            epoch,
        );
        assert_eq!(read, Ok(()));
        let written = back.iter().position(|&b| b != 0x22).unwrap_or(LEN);
        if written == 0 {
            assert_eq!(result, Err(ErrorCode::StaleWriteToken));
            margin *= 2;
            continue;
        }
        assert_eq!(
            result,
            Err(ErrorCode::StaleWriteToken),
            "a write that ran past its grant ended as {result:?} after {written} bytes"
        );
        assert!(written < LEN, "{written}");
        assert_eq!(written % (2 * MIB), 0, "stopped between chunks: {written}");
        assert!(back[written..].iter().all(|&b| b == 0x11));
        assert!(engine.metrics().late_sends_refused >= 1);
        return;
    }
    panic!("no write started within its grant");
}
