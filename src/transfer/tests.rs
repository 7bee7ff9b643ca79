//! Engine-level tests: local copies, and two engines in one process talking over TCP on
//! 127.0.0.1.

use super::metrics::Metrics;
use super::pool::{ConnectionPool, Slice};
use super::settings::Settings;
use super::wire::{Opcode, SessionHeader, Status, HEADER_LEN, STATUS_LEN};
use super::*;
use crate::error::{last_error_message, ErrorCode};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn serving_engine() -> Arc<TransferEngine> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    serving_engine_on(listener)
}

fn serving_engine_on(listener: TcpListener) -> Arc<TransferEngine> {
    let name = listener.local_addr().unwrap().to_string();
    TransferEngine::new(EngineConfig {
        local_name: name,
        listener: Some(listener),
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: None,
    })
    .unwrap()
}

fn embedded_engine() -> Arc<TransferEngine> {
    TransferEngine::new(EngineConfig {
        local_name: "embedded:1".into(),
        listener: None,
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: None,
    })
    .unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 12) as u8 ^ seed)
        .collect()
}

fn request<'a>(
    op: TransferOp,
    local: usize,
    len: usize,
    endpoint: &'a str,
    remote: u64,
) -> TransferRequest<'a> {
    TransferRequest {
        op,
        local_addr: local,
        len: len as u64,
        endpoint,
        remote_addr: remote,
        epoch: 0,
        send_by: None,
    }
}

/// A READ into `buf` (which the transfer writes through a raw pointer).
fn read_req<'a>(buf: &mut [u8], endpoint: &'a str, remote: u64) -> TransferRequest<'a> {
    request(
        TransferOp::Read,
        buf.as_mut_ptr() as usize,
        buf.len(),
        endpoint,
        remote,
    )
}

/// A WRITE from `data`.
fn write_req<'a>(data: &[u8], endpoint: &'a str, remote: u64) -> TransferRequest<'a> {
    request(
        TransferOp::Write,
        data.as_ptr() as usize,
        data.len(),
        endpoint,
        remote,
    )
}

/// Registers all of `buf` with `engine`.
fn register(engine: &TransferEngine, buf: &mut [u8], remote_accessible: bool) {
    engine
        .register(buf.as_mut_ptr() as usize, buf.len(), remote_accessible)
        .unwrap();
}

fn one(engine: &TransferEngine, req: TransferRequest<'_>) -> crate::Result<()> {
    // SAFETY: tests pass buffers they own for the duration of the call.
    let mut results = unsafe { engine.transfer(&[req]) };
    assert_eq!(results.len(), 1);
    results.remove(0)
}

fn addr_of(buf: &[u8]) -> u64 {
    buf.as_ptr() as u64
}

#[test]
fn local_copies_both_ways_inside_own_registry_only() {
    let engine = embedded_engine();
    let mut segment = vec![0u8; 8192];
    register(&engine, &mut segment, false);
    let name = engine.local_name().to_owned();
    assert!(engine.is_local(&name));
    assert!(!engine.is_local("127.0.0.1:1"));

    let data = pattern(4096, 7);
    one(&engine, write_req(&data, &name, addr_of(&segment) + 100)).unwrap();
    assert_eq!(&segment[100..4196], &data[..]);
    let mut back = vec![0u8; 4096];
    one(&engine, read_req(&mut back, &name, addr_of(&segment) + 100)).unwrap();
    assert_eq!(back, data);

    let stranger = vec![0u8; 4096];
    let err = one(&engine, write_req(&data, &name, addr_of(&stranger)));
    assert_eq!(err, Err(ErrorCode::TransferFail));
    assert!(
        last_error_message().contains("registered"),
        "{}",
        last_error_message()
    );
    assert!(stranger.iter().all(|&b| b == 0));
    let past_end = one(
        &engine,
        read_req(&mut back, &name, addr_of(&segment) + 5000),
    );
    assert_eq!(past_end, Err(ErrorCode::TransferFail));
    let segment_addr = addr_of(&segment);
    let overlap = one(
        &engine,
        read_req(&mut segment[10..20], &name, segment_addr + 5),
    );
    assert_eq!(overlap, Err(ErrorCode::TransferFail));

    let m = engine.metrics();
    assert_eq!((m.local_copies, m.local_copy_bytes), (2, 8192));
    assert_eq!(m.failed_requests, 3);
    assert_eq!(m.connections_opened, 0);
    assert_eq!(engine.listen_addr(), None);
}

#[test]
fn zero_length_requests_do_no_io() {
    let engine = embedded_engine();
    let req = TransferRequest {
        op: TransferOp::Read,
        local_addr: 0,
        len: 0,
        endpoint: "unresolvable",
        remote_addr: 0,
        epoch: 0,
        send_by: None,
    };
    // SAFETY: zero-length requests touch no memory.
    let results = unsafe { engine.transfer(&[req, req]) };
    assert_eq!(results, vec![Ok(()), Ok(())]);
    assert_eq!(engine.metrics(), TransferMetrics::default());
}

#[test]
fn register_errors_and_region_lookup() {
    let engine = embedded_engine();
    let mut buf = vec![0u8; 100];
    let base = buf.as_mut_ptr() as usize;
    engine.register(base, 100, true).unwrap();
    assert_eq!(
        engine.register(base + 50, 10, true),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(engine.register(0, 10, true), Err(ErrorCode::InvalidParams));
    assert_eq!(
        engine.register(base + 200, 0, true),
        Err(ErrorCode::InvalidParams)
    );
    let region = engine.region_containing(base + 99).unwrap();
    assert_eq!(
        (region.base, region.len, region.remote_accessible),
        (base, 100, true)
    );
    assert_eq!(engine.unregister(base + 1), Err(ErrorCode::InvalidParams));
    engine.unregister(base).unwrap();
    assert_eq!(engine.region_containing(base), None);
}

#[test]
fn tcp_round_trips_are_byte_exact() {
    let server = serving_engine();
    let client = embedded_engine();
    let peer = server.local_name().to_owned();
    assert!(!client.is_local(&peer));
    let mut segment = vec![0u8; 64 * MIB + 4096];
    register(&server, &mut segment, true);
    let mut expected_bytes = 0u64;
    for (i, len) in [0, 1, 4096, MIB, 64 * MIB].into_iter().enumerate() {
        let data = pattern(len, i as u8);
        let at = addr_of(&segment) + 4096 - (i as u64);
        one(&client, write_req(&data, &peer, at)).unwrap();
        let offset = (at - addr_of(&segment)) as usize;
        assert!(segment[offset..offset + len] == data[..], "write of {len}");
        let mut back = vec![0u8; len];
        one(&client, read_req(&mut back, &peer, at)).unwrap();
        assert!(back == data, "read of {len}");
        expected_bytes += len as u64;
    }
    let m = client.metrics();
    assert_eq!((m.tcp_writes, m.tcp_write_bytes), (4, expected_bytes));
    assert_eq!((m.tcp_reads, m.tcp_read_bytes), (4, expected_bytes));
    assert_eq!(m.failed_requests, 0);
    let s = server.metrics();
    assert_eq!(s.served_write_bytes, expected_bytes);
    assert_eq!(s.served_read_bytes, expected_bytes);
    assert_eq!(s.rejected_requests, 0);
}

#[test]
fn one_mib_read_counts_exactly() {
    let server = serving_engine();
    let client = serving_engine();
    let mut segment = pattern(MIB, 3);
    register(&server, &mut segment, true);
    let mut back = vec![0u8; MIB];
    one(
        &client,
        read_req(&mut back, server.local_name(), addr_of(&segment)),
    )
    .unwrap();
    assert_eq!(back, segment);
    let m = client.metrics();
    assert_eq!((m.tcp_reads, m.tcp_read_bytes), (1, MIB as u64));
    assert_eq!(
        (m.tcp_writes, m.local_copies, m.connections_opened),
        (0, 0, 1)
    );
    let s = server.metrics();
    assert_eq!((s.served_reads, s.served_read_bytes), (1, MIB as u64));
    assert_eq!(s.served_writes, 0);
}

#[test]
fn batches_mix_local_remote_and_failures() {
    let server = serving_engine();
    let client = serving_engine();
    let mut remote_segment = vec![0u8; 8 * MIB];
    let mut own_segment = vec![0u8; MIB];
    register(&server, &mut remote_segment, true);
    register(&client, &mut own_segment, true);
    let big = pattern(8 * MIB, 1);
    let small = pattern(1000, 2);
    let (peer, me) = (server.local_name(), client.local_name());
    let requests = [
        write_req(&big, peer, addr_of(&remote_segment)),
        write_req(&small, me, addr_of(&own_segment)),
        write_req(&small, peer, addr_of(&remote_segment) + 8 * MIB as u64),
        write_req(&small, "nonsense", 1),
    ];
    // SAFETY: all buffers live across the call.
    let results = unsafe { client.transfer(&requests) };
    assert_eq!(
        results,
        vec![
            Ok(()),
            Ok(()),
            Err(ErrorCode::TransferFail),
            Err(ErrorCode::TransferFail)
        ]
    );
    assert!(remote_segment == big);
    assert_eq!(&own_segment[..1000], &small[..]);
    let m = client.metrics();
    assert_eq!((m.tcp_writes, m.tcp_write_bytes), (1, 8 * MIB as u64));
    assert_eq!((m.local_copies, m.failed_requests), (1, 2));
    assert_eq!(server.metrics().served_writes, 4, "8 MiB went as 4 slices");
    assert_eq!(server.metrics().rejected_requests, 1);
}

#[test]
fn refused_requests_leave_memory_unchanged() {
    let server = serving_engine();
    let client = embedded_engine();
    let peer = server.local_name().to_owned();
    // One allocation split into three adjacent registered ranges.
    let mut memory = vec![0u8; 3 * 4096];
    let base = memory.as_mut_ptr() as u64;
    server.register(base as usize, 4096, true).unwrap();
    server.register(base as usize + 4096, 4096, true).unwrap();
    server.register(base as usize + 8192, 4096, false).unwrap();
    let data = pattern(4096, 9);
    let outside = vec![0u8; 4096];
    let cases = [
        (addr_of(&outside), "unregistered"),
        (base + 8192, "not remote-accessible"),
        (base + 2048, "spanning two ranges"),
        (base + 4097, "past the end of the second range"),
    ];
    for (at, why) in cases {
        let result = one(&client, write_req(&data, &peer, at));
        assert_eq!(result, Err(ErrorCode::TransferFail), "{why}");
        let mut sink = vec![0u8; 4096];
        let result = one(&client, read_req(&mut sink, &peer, at));
        assert_eq!(result, Err(ErrorCode::TransferFail), "{why}");
        assert!(sink.iter().all(|&b| b == 0), "{why}");
    }
    assert!(memory.iter().all(|&b| b == 0));
    assert!(outside.iter().all(|&b| b == 0));
    assert!(
        last_error_message().contains("refused"),
        "{}",
        last_error_message()
    );
    assert_eq!(server.metrics().rejected_requests, 8);
    assert_eq!(server.metrics().served_writes, 0);
    assert_eq!(client.metrics().failed_requests, 8);
    // A refused connection is closed; the next request works on a new one.
    one(&client, write_req(&data, &peer, base)).unwrap();
    assert_eq!(&memory[..4096], &data[..]);
}

#[test]
fn concurrent_transfers_from_four_threads() {
    let server = serving_engine();
    let client = embedded_engine();
    let mut segment = vec![0u8; 4 * 4 * MIB];
    register(&server, &mut segment, true);
    let base = addr_of(&segment);
    let peer = server.local_name().to_owned();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (client, peer) = (&client, &peer);
            scope.spawn(move || {
                let area = base + t * 4 * MIB as u64;
                for round in 0..20usize {
                    let len = [1, 4096, 100_000, 3 * MIB + 17][round % 4];
                    let data = pattern(len, (t as usize * 31 + round) as u8);
                    one(client, write_req(&data, peer, area)).unwrap();
                    let mut back = vec![0u8; len];
                    one(client, read_req(&mut back, peer, area)).unwrap();
                    assert!(back == data, "thread {t} round {round}");
                }
            });
        }
    });
    let m = client.metrics();
    assert_eq!((m.tcp_reads, m.tcp_writes, m.failed_requests), (80, 80, 0));
}

/// Runs `work` on a thread, shuts `server` down (twice) 200 ms later and returns what `work`
/// returned, failing the test if that takes 20 s or more after the shutdown.
fn within_bound_of_peer_shutdown<T: Send + 'static>(
    server: &TransferEngine,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = done_tx.send(work());
    });
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    server.shutdown();
    server.shutdown();
    let out = done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a transfer hung after the peer shut down");
    assert!(started.elapsed() < Duration::from_secs(20));
    worker.join().unwrap();
    out
}

#[test]
fn peer_shutdown_mid_transfer_fails_without_hanging() {
    let server = serving_engine();
    let client = embedded_engine();
    let mut segment = vec![0u8; 64 * MIB];
    register(&server, &mut segment, true);
    let peer = server.local_name().to_owned();
    let base = addr_of(&segment);
    let error = within_bound_of_peer_shutdown(&server, {
        let client = Arc::clone(&client);
        move || {
            let mut buf = vec![0u8; 64 * MIB];
            loop {
                if let Err(e) = one(&client, read_req(&mut buf, &peer, base)) {
                    break e;
                }
            }
        }
    });
    assert_eq!(error, ErrorCode::TransferFail);
    let mut buf = vec![0u8; 16];
    let again = one(&client, read_req(&mut buf, server.local_name(), base));
    assert_eq!(again, Err(ErrorCode::TransferFail));
}

#[test]
fn own_shutdown_fails_remote_but_keeps_local() {
    let server = serving_engine();
    let client = serving_engine();
    let mut segment = vec![0u8; 4096];
    register(&server, &mut segment, true);
    register(&client, &mut segment, false);
    let data = pattern(100, 4);
    one(
        &client,
        write_req(&data, server.local_name(), addr_of(&segment)),
    )
    .unwrap();
    client.shutdown();
    let remote = one(
        &client,
        write_req(&data, server.local_name(), addr_of(&segment)),
    );
    assert_eq!(remote, Err(ErrorCode::TransferFail));
    one(
        &client,
        write_req(&data, client.local_name(), addr_of(&segment)),
    )
    .unwrap();
    client.shutdown();
}

#[test]
fn memcpy_disabled_sends_own_requests_over_tcp() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let engine = TransferEngine::new(EngineConfig {
        local_name: listener.local_addr().unwrap().to_string(),
        listener: Some(listener),
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: false,
        rdma: None,
    })
    .unwrap();
    let mut segment = vec![0u8; 4096];
    register(&engine, &mut segment, true);
    let name = engine.local_name().to_owned();
    assert!(!engine.is_local(&name));
    let data = pattern(4096, 5);
    one(&engine, write_req(&data, &name, addr_of(&segment))).unwrap();
    assert_eq!(segment, data);
    let m = engine.metrics();
    assert_eq!((m.local_copies, m.tcp_writes, m.served_writes), (0, 1, 1));
}

#[test]
fn stale_pooled_connection_is_replaced() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let first = serving_engine_on(listener);
    let client = embedded_engine();
    let mut segment = vec![0u8; 4096];
    register(&first, &mut segment, true);
    let data = pattern(4096, 6);
    let name = addr.to_string();
    one(&client, write_req(&data, &name, addr_of(&segment))).unwrap();
    drop(first);
    let second = serving_engine_on(TcpListener::bind(addr).unwrap());
    register(&second, &mut segment, true);
    let mut back = vec![0u8; 4096];
    one(&client, read_req(&mut back, &name, addr_of(&segment))).unwrap();
    assert_eq!(back, data);
    assert_eq!(client.metrics().connections_opened, 2);
}

/// Speaks the wire protocol by hand: v1 requests carry no status frames; bad opcodes and
/// zero sizes are refused with `AddrRejected` under v2.
#[test]
fn server_speaks_v1_and_refuses_malformed_requests() {
    let server = serving_engine();
    let mut segment = vec![0u8; 256];
    register(&server, &mut segment, true);
    let addr = server.listen_addr().unwrap();
    let header = |op, size, v2| {
        SessionHeader {
            size,
            addr: addr_of(&segment),
            opcode: op,
            v2,
            epoch: None,
        }
        .encode()
    };
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let data = pattern(256, 8);
    conn.write_all(&header(Opcode::Write, 256, false)).unwrap();
    conn.write_all(&data).unwrap();
    conn.write_all(&header(Opcode::Read, 256, false)).unwrap();
    let mut back = vec![0u8; 256];
    conn.read_exact(&mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(segment, data);

    for bad in [
        {
            let mut h = header(Opcode::Read, 16, true);
            h[16] = 0x83;
            h
        },
        header(Opcode::Read, 0, true),
    ] {
        let mut conn = TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.write_all(&bad).unwrap();
        let mut frame = [0u8; STATUS_LEN];
        conn.read_exact(&mut frame).unwrap();
        assert_eq!(Status::decode(&frame), Some(Status::AddrRejected));
        assert!(
            closed_by_peer(&mut conn, Duration::from_secs(10)),
            "closed (abortively) after a refusal"
        );
    }
    assert_eq!(server.metrics().rejected_requests, 2);
    assert_eq!(HEADER_LEN, 24);
}

/// The sizes of a mixed batch of small requests: tiny, page-sized, the pipelining limit and
/// just below it.
fn small_sizes(count: usize) -> Vec<usize> {
    (0..count)
        .map(|i| [1, 4096, 64 << 10, (64 << 10) - 1, 100, 4096][i % 6])
        .collect()
}

/// Many small READs and WRITEs to one peer in one batch (pipelined, more answer bytes per
/// connection than the pipelining window): byte-exact, counters exact, few connections.
#[test]
fn pipelined_small_batches_are_exact() {
    let server = serving_engine();
    let client = embedded_engine();
    let sizes = small_sizes(96);
    let total: usize = sizes.iter().sum();
    let mut segment = vec![0u8; 2 * total];
    register(&server, &mut segment, true);
    let peer = server.local_name().to_owned();
    let base = addr_of(&segment);
    let offsets: Vec<u64> = sizes
        .iter()
        .scan(0u64, |at, &len| {
            let here = *at;
            *at += len as u64;
            Some(here)
        })
        .collect();
    let data: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| pattern(len, i as u8))
        .collect();
    // Even requests write the first half; odd ones read what the second half holds.
    segment[total..].copy_from_slice(&pattern(total, 77));
    let expected_second_half = segment[total..].to_vec();
    let mut backs: Vec<Vec<u8>> = sizes.iter().map(|&len| vec![0u8; len]).collect();
    let requests: Vec<TransferRequest<'_>> = backs
        .iter_mut()
        .enumerate()
        .map(|(i, back)| {
            if i % 2 == 0 {
                write_req(&data[i], &peer, base + offsets[i])
            } else {
                read_req(back, &peer, base + total as u64 + offsets[i])
            }
        })
        .collect();
    // SAFETY: all buffers live across the call; READ targets are distinct vectors.
    let results = unsafe { client.transfer(&requests) };
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let (mut read_bytes, mut write_bytes) = (0u64, 0u64);
    for (i, &len) in sizes.iter().enumerate() {
        let at = offsets[i] as usize;
        if i % 2 == 0 {
            assert!(segment[at..at + len] == data[i][..], "write {i}");
            write_bytes += len as u64;
        } else {
            assert!(
                backs[i][..] == expected_second_half[at..at + len],
                "read {i}"
            );
            read_bytes += len as u64;
        }
    }
    let m = client.metrics();
    assert_eq!((m.tcp_writes, m.tcp_write_bytes), (48, write_bytes));
    assert_eq!((m.tcp_reads, m.tcp_read_bytes), (48, read_bytes));
    assert_eq!(m.failed_requests, 0);
    assert!(
        (1..=16).contains(&m.connections_opened),
        "{} connections",
        m.connections_opened
    );
    let s = server.metrics();
    assert_eq!((s.served_writes, s.served_write_bytes), (48, write_bytes));
    assert_eq!((s.served_reads, s.served_read_bytes), (48, read_bytes));
    assert_eq!(s.rejected_requests, 0);

    // The same batch again reuses the pooled connections: however the groups happen to be
    // spread over the lanes (which depends on when the workers wake), three more runs of 96
    // requests stay within the same bound instead of opening connections per request.
    for _ in 0..3 {
        // SAFETY: as above.
        let again = unsafe { client.transfer(&requests) };
        assert!(again.iter().all(Result::is_ok));
    }
    let opened = client.metrics().connections_opened;
    assert!(
        (1..=16).contains(&opened),
        "{opened} connections after 4 runs"
    );
}

/// Refused requests in the middle of pipelined groups fail alone; the valid requests around
/// them, including those queued behind a refusal on the closed connection, succeed.
#[test]
fn refusals_inside_a_pipelined_batch_fail_only_themselves() {
    let server = serving_engine();
    let client = embedded_engine();
    let mut segment = pattern(64 * 4096, 5);
    register(&server, &mut segment, true);
    let stranger = vec![0u8; 4096];
    let peer = server.local_name().to_owned();
    let base = addr_of(&segment);
    let refused = [9usize, 10, 20, 31];
    let mut backs = vec![vec![0u8; 4096]; 32];
    let payload = pattern(4096, 6);
    let requests: Vec<TransferRequest<'_>> = backs
        .iter_mut()
        .enumerate()
        .map(|(i, back)| match (refused.contains(&i), i % 3) {
            (true, 0) => write_req(&payload, &peer, addr_of(&stranger)),
            (true, _) => read_req(back, &peer, addr_of(&stranger)),
            (false, 0) => write_req(&payload, &peer, base + (32 + i as u64) * 4096),
            (false, _) => read_req(back, &peer, base + i as u64 * 4096),
        })
        .collect();
    // SAFETY: all buffers live across the call; READ targets are distinct vectors.
    let results = unsafe { client.transfer(&requests) };
    for (i, result) in results.iter().enumerate() {
        if refused.contains(&i) {
            assert_eq!(*result, Err(ErrorCode::TransferFail), "request {i}");
        } else {
            assert_eq!(*result, Ok(()), "request {i}");
        }
    }
    let (mut reads, mut writes) = (0u64, 0u64);
    for (i, back) in backs.iter().enumerate() {
        let at = i * 4096;
        match (refused.contains(&i), i % 3) {
            (true, _) => assert!(back.iter().all(|&b| b == 0), "refused {i}"),
            (false, 0) => {
                assert!(
                    segment[32 * 4096 + at..][..4096] == payload[..],
                    "write {i}"
                );
                writes += 1;
            }
            (false, _) => {
                assert!(back[..] == segment[at..at + 4096], "read {i}");
                reads += 1;
            }
        }
    }
    assert!(stranger.iter().all(|&b| b == 0));
    let m = client.metrics();
    assert_eq!((m.tcp_reads, m.tcp_read_bytes), (reads, reads * 4096));
    assert_eq!((m.tcp_writes, m.tcp_write_bytes), (writes, writes * 4096));
    assert_eq!(m.failed_requests, refused.len() as u64);
    let s = server.metrics();
    assert_eq!(s.rejected_requests, refused.len() as u64);
    assert_eq!((s.served_reads, s.served_writes), (reads, writes));
}

fn test_pool() -> (ConnectionPool, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let settings = Settings {
        io_timeout: Duration::from_secs(10),
        lanes: 4,
        ..Settings::default()
    };
    (ConnectionPool::new(settings, Arc::clone(&metrics)), metrics)
}

fn read_slice(buf: &mut [u8], remote: u64) -> Slice {
    Slice {
        op: Opcode::Read,
        local: buf.as_mut_ptr(),
        len: buf.len(),
        remote,
        epoch: 0,
    }
}

/// One pipelined group on one connection: each refusal costs exactly that slice and one
/// connection; the slices behind it go out again on a new connection.
#[test]
fn pipelined_group_continues_after_each_refusal() {
    let server = serving_engine();
    let mut segment = pattern(8 * 4096, 2);
    register(&server, &mut segment, true);
    let peer = server.listen_addr().unwrap();
    let (pool, metrics) = test_pool();
    let mut backs = vec![vec![0u8; 4096]; 8];
    let refused = [2usize, 3, 6];
    let slices: Vec<Slice> = backs
        .iter_mut()
        .enumerate()
        .map(|(i, back)| {
            let remote = if refused.contains(&i) {
                1 << 40
            } else {
                addr_of(&segment) + i as u64 * 4096
            };
            read_slice(back, remote)
        })
        .collect();
    // SAFETY: the buffers outlive the call and are distinct.
    let results = unsafe { pool.execute(peer, &slices) };
    for (i, result) in results.iter().enumerate() {
        assert_eq!(
            result.is_err(),
            refused.contains(&i),
            "slice {i}: {result:?}"
        );
        if let Err(error) = result {
            assert!(error.message.contains("refused"), "{error:?}");
        } else {
            assert!(
                backs[i][..] == segment[i * 4096..(i + 1) * 4096],
                "slice {i}"
            );
        }
    }
    assert_eq!(metrics.snapshot().connections_opened, 4);
    assert_eq!(server.metrics().rejected_requests, 3);
    assert_eq!(server.metrics().served_reads, 5);
}

/// A fake peer that reads every pipelined header it gets, answers only the first
/// `answered` READs of each connection (status and `fill` bytes) and then closes.
fn dying_peer(answered: usize, fill: u8) -> (SocketAddr, std::thread::JoinHandle<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut headers = Vec::new();
        let mut raw = [0u8; HEADER_LEN];
        while conn.read_exact(&mut raw).is_ok() {
            headers.push(SessionHeader::decode(&raw).unwrap());
        }
        for header in headers.iter().take(answered) {
            conn.write_all(&Status::Ok.encode()).unwrap();
            conn.write_all(&vec![fill; header.size as usize]).unwrap();
        }
        // Dropping the listener too: reconnecting is refused.
        headers.len()
    });
    (addr, handle)
}

/// The peer dies in the middle of a pipelined group: the answered slices succeed, every
/// later one fails promptly.
#[test]
fn peer_dying_mid_pipeline_fails_the_rest_without_hanging() {
    let (peer, fake) = dying_peer(3, 0xAB);
    let (pool, metrics) = test_pool();
    let mut backs = vec![vec![0u8; 4096]; 10];
    let slices: Vec<Slice> = backs
        .iter_mut()
        .enumerate()
        .map(|(i, back)| read_slice(back, 0x1000 * (i as u64 + 1)))
        .collect();
    let started = Instant::now();
    // SAFETY: the buffers outlive the call and are distinct.
    let results = unsafe { pool.execute(peer, &slices) };
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        fake.join().unwrap(),
        10,
        "all headers went out back to back"
    );
    for (i, result) in results.iter().enumerate() {
        assert_eq!(result.is_ok(), i < 3, "slice {i}: {result:?}");
    }
    assert!(backs[..3].iter().all(|b| b.iter().all(|&x| x == 0xAB)));
    assert_eq!(metrics.snapshot().connections_opened, 1);
}

/// A batch of 32 small READs whose answers (32 x 4 KiB) exceed the answer window goes out
/// whole before any answer: one round trip. The peer takes every header (for at most 2 s)
/// before answering any; with a window it would see only the first ~15 and the slices
/// behind them would wait for their answers.
#[test]
fn small_read_batch_goes_out_before_any_answer() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut headers = Vec::new();
        let mut raw = [0u8; HEADER_LEN];
        while headers.len() < 32 && conn.read_exact(&mut raw).is_ok() {
            headers.push(SessionHeader::decode(&raw).unwrap());
        }
        let before_any_answer = headers.len();
        for (i, header) in headers.iter().enumerate() {
            conn.write_all(&Status::Ok.encode()).unwrap();
            conn.write_all(&vec![i as u8 + 1; header.size as usize])
                .unwrap();
        }
        // Whatever comes after the first answers (the rest of a windowed batch).
        while conn.read_exact(&mut raw).is_ok() {
            let header = SessionHeader::decode(&raw).unwrap();
            conn.write_all(&Status::Ok.encode()).unwrap();
            conn.write_all(&vec![0xEE; header.size as usize]).unwrap();
        }
        before_any_answer
    });
    let (pool, metrics) = test_pool();
    let mut backs = vec![vec![0u8; 4096]; 32];
    let slices: Vec<Slice> = backs
        .iter_mut()
        .enumerate()
        .map(|(i, back)| read_slice(back, 0x1000 * (i as u64 + 1)))
        .collect();
    // SAFETY: the buffers outlive the call and are distinct.
    let results = unsafe { pool.execute(peer, &slices) };
    pool.close();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(
        fake.join().unwrap(),
        32,
        "all 32 headers went out before any answer"
    );
    for (i, back) in backs.iter().enumerate() {
        assert!(back.iter().all(|&x| x == i as u8 + 1), "slice {i}");
    }
    assert_eq!(metrics.snapshot().connections_opened, 1);
}

/// A serving peer shuts down while batches of small requests are in flight: the batch in
/// progress fails (at least partly) and returns promptly; nothing hangs.
#[test]
fn peer_shutdown_during_pipelined_batches_fails_without_hanging() {
    let server = serving_engine();
    let client = embedded_engine();
    let mut segment = pattern(64 * 4096, 3);
    register(&server, &mut segment, true);
    let peer = server.local_name().to_owned();
    let base = addr_of(&segment);
    within_bound_of_peer_shutdown(&server, move || {
        let mut backs = vec![vec![0u8; 4096]; 64];
        loop {
            let requests: Vec<_> = backs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| read_req(b, &peer, base + i as u64 * 4096))
                .collect();
            // SAFETY: the buffers live across the call.
            let results = unsafe { client.transfer(&requests) };
            if results.iter().any(Result::is_err) {
                return;
            }
        }
    });
}

/// Pipelined requests written by hand in one go: READs whose headers arrive together are
/// answered in order, and a WRITE between two READs of the same bytes takes effect after the
/// first READ's answer and before the second's.
#[test]
fn server_answers_pipelined_requests_in_order() {
    let server = serving_engine();
    let mut segment = pattern(3 * 4096, 4);
    let original = segment.clone();
    register(&server, &mut segment, true);
    let base = addr_of(&segment);
    let header = |opcode, offset: u64, v2| {
        SessionHeader {
            size: 4096,
            addr: base + offset,
            opcode,
            v2,
            epoch: None,
        }
        .encode()
    };
    let update = pattern(4096, 99);
    let mut burst = Vec::new();
    burst.extend_from_slice(&header(Opcode::Read, 0, true));
    burst.extend_from_slice(&header(Opcode::Read, 4096, false));
    burst.extend_from_slice(&header(Opcode::Read, 8192, true));
    burst.extend_from_slice(&header(Opcode::Write, 0, true));
    burst.extend_from_slice(&update);
    burst.extend_from_slice(&header(Opcode::Read, 0, true));
    let mut conn = TcpStream::connect(server.listen_addr().unwrap()).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(&burst).unwrap();
    let ok = Status::Ok.encode();
    let mut expected = Vec::new();
    for part in [
        &ok[..],
        &original[..4096],
        &original[4096..8192],
        &ok,
        &original[8192..],
        &ok,
        &ok,
        &update,
    ] {
        expected.extend_from_slice(part);
    }
    let mut answer = vec![0u8; expected.len()];
    conn.read_exact(&mut answer).unwrap();
    assert!(answer == expected);
    assert_eq!(&segment[..4096], &update[..]);
    let s = server.metrics();
    assert_eq!((s.served_reads, s.served_writes), (4, 1));
}

const E1: u64 = 0x00AB_CDEF_0123_4567;
const E2: u64 = 0x0012_3456_789A_BCDE;

/// `req` naming segment epoch `epoch`.
fn at_epoch(req: TransferRequest<'_>, epoch: u64) -> TransferRequest<'_> {
    TransferRequest { epoch, ..req }
}

/// Requests naming the current epoch of a remote segment are served; after a remount (new
/// epoch) the same requests fail with `STALE_SEGMENT_EPOCH` and move no byte: a stale WRITE
/// (one slice, and one larger than the socket buffers, in four slices) leaves the memory as
/// it was, a stale READ leaves the destination untouched.
#[test]
fn stale_segment_epoch_is_refused_over_tcp_and_moves_nothing() {
    let server = serving_engine();
    let client = embedded_engine();
    let mut segment = pattern(8 * MIB, 1);
    let original = segment.clone();
    register(&server, &mut segment, true);
    let base = addr_of(&segment);
    server.set_region_epoch(base as usize, E1).unwrap();
    let peer = server.local_name().to_owned();
    let data = pattern(4 * MIB, 2);
    one(&client, at_epoch(write_req(&data[..4096], &peer, base), E1)).unwrap();
    assert_eq!(&segment[..4096], &data[..4096]);
    let mut back = vec![0u8; 4096];
    one(&client, at_epoch(read_req(&mut back, &peer, base), E1)).unwrap();
    assert_eq!(&back[..], &data[..4096]);

    server.set_region_epoch(base as usize, E2).unwrap();
    let small = one(
        &client,
        at_epoch(write_req(&data[..4096], &peer, base + 4096), E1),
    );
    assert_eq!(small, Err(ErrorCode::StaleSegmentEpoch));
    let big = one(
        &client,
        at_epoch(write_req(&data, &peer, base + 4 * MIB as u64), E1),
    );
    assert_eq!(big, Err(ErrorCode::StaleSegmentEpoch));
    assert!(segment[4096..] == original[4096..], "a stale WRITE landed");
    let mut sink = vec![0u8; 4096];
    let read = one(&client, at_epoch(read_req(&mut sink, &peer, base), E1));
    assert_eq!(read, Err(ErrorCode::StaleSegmentEpoch));
    assert!(sink.iter().all(|&b| b == 0), "a stale READ delivered bytes");

    // The current epoch and unchecked requests (epoch 0) are still served.
    one(&client, at_epoch(read_req(&mut sink, &peer, base), E2)).unwrap();
    one(&client, read_req(&mut back, &peer, base)).unwrap();
    assert_eq!(sink, back);
    assert_eq!(client.metrics().failed_requests, 3);
    let s = server.metrics();
    assert_eq!(
        s.stale_epoch_rejections, 6,
        "a small WRITE, 4 slices, a READ"
    );
    assert_eq!(s.served_writes, 1);
}

/// The local path (copies to and from our own registered segment) checks the epoch too.
#[test]
fn stale_segment_epoch_is_refused_on_the_local_path() {
    let engine = embedded_engine();
    let mut segment = pattern(8192, 3);
    let original = segment.clone();
    register(&engine, &mut segment, false);
    let base = addr_of(&segment);
    let name = engine.local_name().to_owned();
    assert_eq!(
        engine.set_region_epoch(base as usize + 1, E1),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(
        engine.set_region_epoch(base as usize, MAX_EPOCH + 1),
        Err(ErrorCode::InvalidParams)
    );
    engine.set_region_epoch(base as usize, E1).unwrap();
    assert_eq!(
        engine.region_containing(base as usize).map(|r| r.epoch),
        Some(E1)
    );
    let mut back = vec![0u8; 4096];
    one(&engine, at_epoch(read_req(&mut back, &name, base), E1)).unwrap();
    assert_eq!(&back[..], &original[..4096]);

    engine.set_region_epoch(base as usize, E2).unwrap();
    let data = pattern(4096, 4);
    let write = one(&engine, at_epoch(write_req(&data, &name, base + 4096), E1));
    assert_eq!(write, Err(ErrorCode::StaleSegmentEpoch));
    assert!(segment == original, "a stale local WRITE landed");
    let mut sink = vec![0u8; 4096];
    let read = one(&engine, at_epoch(read_req(&mut sink, &name, base), E1));
    assert_eq!(read, Err(ErrorCode::StaleSegmentEpoch));
    assert!(
        sink.iter().all(|&b| b == 0),
        "a stale local READ delivered bytes"
    );
    let m = engine.metrics();
    assert_eq!((m.stale_epoch_rejections, m.failed_requests), (2, 2));
    assert_eq!(m.local_copies, 1);
}

/// A client restarted under the same address: a fresh engine serving the same memory under
/// a new epoch refuses requests that carry the old one (the wire header names the epoch).
#[test]
fn restarted_server_refuses_the_old_epoch() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let first = serving_engine_on(listener);
    let client = embedded_engine();
    let mut segment = vec![0u8; 4096];
    register(&first, &mut segment, true);
    let base = addr_of(&segment);
    first.set_region_epoch(base as usize, E1).unwrap();
    let name = addr.to_string();
    let data = pattern(4096, 6);
    one(&client, at_epoch(write_req(&data, &name, base), E1)).unwrap();
    drop(first);
    let second = serving_engine_on(TcpListener::bind(addr).unwrap());
    register(&second, &mut segment, true);
    second.set_region_epoch(base as usize, E2).unwrap();
    let stale = one(
        &client,
        at_epoch(write_req(&pattern(4096, 7), &name, base), E1),
    );
    assert_eq!(stale, Err(ErrorCode::StaleSegmentEpoch));
    assert_eq!(
        segment, data,
        "the old epoch's WRITE landed in the new segment"
    );
    let mut back = vec![0u8; 4096];
    one(&client, at_epoch(read_req(&mut back, &name, base), E2)).unwrap();
    assert_eq!(back, data);
}

/// A server on its own registry with a short I/O deadline.
fn deadline_server(memory: &mut [u8], deadline: Duration) -> (super::server::Server, Arc<Metrics>) {
    let settings = Settings {
        io_timeout: deadline,
        ..Settings::default()
    };
    limited_server(memory, settings)
}

/// A server on its own registry (all of `memory`, remotely accessible) with `settings`.
fn limited_server(memory: &mut [u8], settings: Settings) -> (super::server::Server, Arc<Metrics>) {
    let registry = Arc::new(super::registry::Registry::default());
    registry
        .register(memory.as_mut_ptr() as usize, memory.len(), true)
        .unwrap();
    let metrics = Arc::new(Metrics::default());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server =
        super::server::Server::start(listener, registry, None, Arc::clone(&metrics), settings)
            .unwrap();
    (server, metrics)
}

/// Waits (at most `bound`) for the server to end `conn`: true when it did (EOF or reset).
fn closed_by_peer(conn: &mut TcpStream, bound: Duration) -> bool {
    conn.set_read_timeout(Some(bound)).unwrap();
    let mut byte = [0u8; 1];
    match conn.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// A WRITE whose payload stalls past the server's deadline: the server drops it and closes
/// the connection; the bytes sent after the deadline never reach memory.
#[test]
fn write_payload_after_the_deadline_is_never_applied() {
    let mut segment = vec![0u8; 8192];
    let base = addr_of(&segment);
    let (server, metrics) = deadline_server(&mut segment, Duration::from_millis(300));
    let data = pattern(8192, 5);
    let header = SessionHeader {
        size: 8192,
        addr: base,
        opcode: Opcode::Write,
        v2: true,
        epoch: None,
    }
    .encode();
    let mut conn = TcpStream::connect(server.local_addr()).unwrap();
    conn.write_all(&header).unwrap();
    conn.write_all(&data[..4096]).unwrap();
    let started = Instant::now();
    let closed = closed_by_peer(&mut conn, Duration::from_secs(3));
    // The late half; on a closed connection the sends may fail, which is the point.
    let _ = conn.write_all(&data[4096..]);
    let mut frame = [0u8; STATUS_LEN];
    conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let status = conn
        .read_exact(&mut frame)
        .ok()
        .map(|()| Status::decode(&frame));
    server.shutdown();
    assert!(
        segment[4096..].iter().all(|&b| b == 0),
        "late bytes were applied ({status:?})"
    );
    assert!(closed, "the server kept the stalled WRITE open");
    assert!(started.elapsed() < Duration::from_secs(3));
    let m = metrics.snapshot();
    assert_eq!((m.expired_requests, m.served_writes), (1, 0));
}

/// A header that stops half-way times out with the same deadline.
#[test]
fn half_received_header_times_out() {
    let mut segment = vec![0u8; 4096];
    let (server, metrics) = deadline_server(&mut segment, Duration::from_millis(300));
    let mut conn = TcpStream::connect(server.local_addr()).unwrap();
    // An idle connection is kept past the deadline.
    assert!(!closed_by_peer(&mut conn, Duration::from_millis(600)));
    conn.write_all(&[1u8; 10]).unwrap();
    assert!(
        closed_by_peer(&mut conn, Duration::from_secs(3)),
        "half a header held forever"
    );
    assert_eq!(metrics.snapshot().expired_requests, 1);
    server.shutdown();
}

/// A WRITE whose answer times out: the initiator closes the connection abortively (RST),
/// so the peer sees a reset, not an orderly end after which queued payload would still be
/// delivered; a timeout is not retried on another connection.
#[test]
fn timed_out_connection_is_reset() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = listener.local_addr().unwrap();
    let silent = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut request = vec![0u8; HEADER_LEN + 4096];
        conn.read_exact(&mut request).unwrap();
        // Never answer; see how the initiator ends the connection.
        let mut byte = [0u8; 1];
        match conn.read(&mut byte) {
            Ok(n) => format!("read {n}"),
            Err(e) => format!("{:?}", e.kind()),
        }
    });
    let metrics = Arc::new(Metrics::default());
    let settings = Settings {
        io_timeout: Duration::from_millis(200),
        lanes: 1,
        ..Settings::default()
    };
    let pool = ConnectionPool::new(settings, Arc::clone(&metrics));
    let data = pattern(4096, 8);
    let slice = Slice {
        op: Opcode::Write,
        local: data.as_ptr().cast_mut(),
        len: data.len(),
        remote: 0x1000,
        epoch: 0,
    };
    // SAFETY: `data` outlives the call; WRITE only reads it.
    let results = unsafe { pool.execute(peer, &[slice]) };
    assert!(results[0].is_err(), "{results:?}");
    assert_eq!(silent.join().unwrap(), "ConnectionReset");
    assert_eq!(metrics.snapshot().connections_opened, 1);
}

/// A request whose `send_by` has passed is not started: no slice goes out (remote) or is
/// copied (local), and it fails with `STALE_WRITE_TOKEN`; one still in time is served.
#[test]
fn request_past_its_send_by_is_never_started() {
    let server = serving_engine();
    let client = embedded_engine();
    let mut segment = pattern(MIB, 4);
    let original = segment.clone();
    register(&server, &mut segment, true);
    let base = addr_of(&segment);
    let peer = server.local_name().to_owned();
    let data = pattern(MIB, 5);
    let past = Some(Instant::now());
    let late = TransferRequest {
        send_by: past,
        ..write_req(&data, &peer, base)
    };
    assert_eq!(one(&client, late), Err(ErrorCode::StaleWriteToken));
    assert!(segment == original, "a late WRITE landed");
    assert_eq!(server.metrics().served_writes, 0);
    assert_eq!(client.metrics().late_sends_refused, 1);
    let mut local = pattern(4096, 6);
    let local_original = local.clone();
    register(&client, &mut local, false);
    let name = client.local_name().to_owned();
    let late_local = TransferRequest {
        send_by: past,
        ..write_req(&data[..4096], &name, addr_of(&local))
    };
    assert_eq!(one(&client, late_local), Err(ErrorCode::StaleWriteToken));
    assert!(local == local_original, "a late local copy landed");
    let in_time = TransferRequest {
        send_by: Some(Instant::now() + Duration::from_secs(30)),
        ..write_req(&data, &peer, base)
    };
    one(&client, in_time).unwrap();
    assert!(segment == data);
}

use crate::test_util::wait_until;

/// One v2 READ of `len` bytes at `addr` by hand on `conn`; the data, or the socket error.
fn raw_read(conn: &mut TcpStream, addr: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let header = SessionHeader {
        size: len as u64,
        addr,
        opcode: Opcode::Read,
        v2: true,
        epoch: None,
    }
    .encode();
    conn.set_read_timeout(Some(Duration::from_secs(3)))?;
    conn.write_all(&header)?;
    let mut answer = vec![0u8; STATUS_LEN + len];
    conn.read_exact(&mut answer)?;
    assert_eq!(
        Status::decode(answer[..STATUS_LEN].try_into().unwrap()),
        Some(Status::Ok)
    );
    Ok(answer.split_off(STATUS_LEN))
}

/// With `cap` connections held (one of them a pooled client connection), the next one is
/// reset at once and counted, while the pooled client keeps transferring; a closed
/// connection frees its slot.
fn connections_beyond_cap_are_reset(settings: Settings, cap: usize) {
    let mut segment = pattern(4096, 3);
    let base = addr_of(&segment);
    let expected = segment.clone();
    let (server, metrics) = limited_server(&mut segment, settings);
    let (pool, client) = test_pool();
    let mut back = vec![0u8; 4096];
    let transfer = |back: &mut [u8]| {
        // SAFETY: `back` is ours and outlives the call.
        unsafe { pool.execute(server.local_addr(), &[read_slice(back, base)]) }.remove(0)
    };
    transfer(&mut back).unwrap();
    let mut held: Vec<TcpStream> = (1..cap)
        .map(|_| TcpStream::connect(server.local_addr()).unwrap())
        .collect();
    for conn in &mut held {
        assert_eq!(raw_read(conn, base, 16).unwrap(), expected[..16]);
    }
    let mut extra = TcpStream::connect(server.local_addr()).unwrap();
    assert!(
        closed_by_peer(&mut extra, Duration::from_secs(3)),
        "connection {} beyond the cap of {cap} was admitted",
        cap + 1
    );
    assert_eq!(metrics.snapshot().refused_connections, 1);
    back.fill(0);
    transfer(&mut back).unwrap();
    assert_eq!(back, expected);
    assert_eq!(client.snapshot().connections_opened, 1);
    drop(held.pop());
    let admitted = wait_until(Duration::from_secs(3), || {
        let mut conn = TcpStream::connect(server.local_addr()).unwrap();
        raw_read(&mut conn, base, 16).is_ok_and(|data| data == expected[..16])
    });
    assert!(admitted, "a closed connection did not free its slot");
    server.shutdown();
}

#[test]
fn connections_beyond_the_per_peer_cap_are_reset() {
    let settings = Settings {
        max_connections_per_peer: 5,
        ..Settings::default()
    };
    connections_beyond_cap_are_reset(settings, 5);
}

#[test]
fn connections_beyond_the_process_cap_are_reset() {
    let settings = Settings {
        max_connections: 4,
        ..Settings::default()
    };
    connections_beyond_cap_are_reset(settings, 4);
}

/// A connection with no request in flight is closed after the idle timeout (and counted);
/// one that keeps sending requests is not.
#[test]
fn idle_connection_is_closed_after_the_idle_timeout() {
    let mut segment = pattern(4096, 4);
    let base = addr_of(&segment);
    let settings = Settings {
        idle_timeout: Duration::from_millis(300),
        ..Settings::default()
    };
    let (server, metrics) = limited_server(&mut segment, settings);
    let mut busy = TcpStream::connect(server.local_addr()).unwrap();
    let mut idle = TcpStream::connect(server.local_addr()).unwrap();
    let started = Instant::now();
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(100));
        raw_read(&mut busy, base, 64).unwrap();
    }
    assert!(
        closed_by_peer(&mut idle, Duration::from_secs(3)),
        "an idle connection was held past the idle timeout"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    raw_read(&mut busy, base, 64).unwrap();
    assert_eq!(metrics.snapshot().idle_closed, 1);
    server.shutdown();
}

/// A pooled connection the server closed while idle is replaced without an error to the
/// caller, for READs and WRITEs.
#[test]
fn pool_recovers_from_a_server_closed_idle_connection() {
    let mut segment = vec![0u8; 4096];
    let base = addr_of(&segment);
    let settings = Settings {
        idle_timeout: Duration::from_millis(100),
        ..Settings::default()
    };
    let (server, metrics) = limited_server(&mut segment, settings);
    let (pool, client) = test_pool();
    let data = pattern(4096, 9);
    let write = Slice {
        op: Opcode::Write,
        local: data.as_ptr().cast_mut(),
        len: data.len(),
        remote: base,
        epoch: 0,
    };
    let mut back = vec![0u8; 4096];
    for round in 1..=2u64 {
        // SAFETY: `data` and `back` outlive the calls; WRITE only reads `data`.
        unsafe { pool.execute(server.local_addr(), &[write]) }
            .remove(0)
            .unwrap();
        let closed = wait_until(Duration::from_secs(3), || {
            metrics.snapshot().idle_closed == 2 * round - 1
        });
        assert!(closed, "the server did not close the idle connection");
        // SAFETY: as above.
        unsafe { pool.execute(server.local_addr(), &[read_slice(&mut back, base)]) }
            .remove(0)
            .unwrap();
        assert_eq!(back, data);
        let closed = wait_until(Duration::from_secs(3), || {
            metrics.snapshot().idle_closed == 2 * round
        });
        assert!(closed, "the server did not close the idle connection");
    }
    assert_eq!(client.snapshot().connections_opened, 4);
    assert_eq!(metrics.snapshot().served_writes, 2);
    server.shutdown();
}

/// A peer that answered one WRITE, then read the whole next WRITE and reset the connection
/// without answering: the pooled connection had delivered (part of) the request, so it is
/// not sent again on a fresh connection (no duplicate application).
#[test]
fn write_reset_after_acceptance_is_not_retried() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut request = vec![0u8; HEADER_LEN + 4096];
        conn.read_exact(&mut request).unwrap();
        conn.write_all(&Status::Ok.encode()).unwrap();
        conn.read_exact(&mut request).unwrap();
        super::socket::set_abortive_close(conn.as_raw_fd()).unwrap();
        drop(conn);
        // Keep the listener open a while: a retry would connect (and never be answered).
        listener.set_nonblocking(true).unwrap();
        let start = Instant::now();
        let mut retried = 0;
        while start.elapsed() < Duration::from_millis(500) {
            if listener.accept().is_ok() {
                retried += 1;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        retried
    });
    let metrics = Arc::new(Metrics::default());
    let settings = Settings {
        io_timeout: Duration::from_millis(300),
        lanes: 1,
        ..Settings::default()
    };
    let pool = ConnectionPool::new(settings, Arc::clone(&metrics));
    let data = pattern(4096, 10);
    let slice = Slice {
        op: Opcode::Write,
        local: data.as_ptr().cast_mut(),
        len: data.len(),
        remote: 0x1000,
        epoch: 0,
    };
    // SAFETY: `data` outlives the calls; WRITE only reads it.
    unsafe { pool.execute(peer, &[slice]) }.remove(0).unwrap();
    // SAFETY: as above.
    let second = unsafe { pool.execute(peer, &[slice]) }.remove(0);
    assert!(second.is_err(), "{second:?}");
    assert_eq!(fake.join().unwrap(), 0, "the accepted WRITE was sent again");
    assert_eq!(metrics.snapshot().connections_opened, 1);
}

/// A resolver over a table that counts invalidations.
#[derive(Default)]
struct TableResolver {
    table: parking_lot::Mutex<std::collections::HashMap<String, SocketAddr>>,
    invalidated: AtomicUsize,
}

impl SegmentResolver for TableResolver {
    fn resolve(&self, segment_name: &str) -> crate::Result<SocketAddr> {
        match self.table.lock().get(segment_name) {
            Some(addr) => Ok(*addr),
            None => Err(ErrorCode::SegmentNotFound),
        }
    }

    fn invalidate(&self, _segment_name: &str) {
        self.invalidated.fetch_add(1, Ordering::SeqCst);
    }
}

/// A transfer that fails at the connection level invalidates its segment's address; one
/// the peer refused (bad address, stale epoch) does not.
#[test]
fn connection_failures_invalidate_the_segment_address_refusals_do_not() {
    let server = serving_engine();
    let mut segment = vec![0u8; 4096];
    register(&server, &mut segment, true);
    let base = addr_of(&segment);
    let resolver = Arc::new(TableResolver::default());
    resolver
        .table
        .lock()
        .insert("seg".into(), server.listen_addr().unwrap());
    let client = TransferEngine::new(EngineConfig {
        local_name: "embedded:2".into(),
        listener: None,
        resolver: Arc::clone(&resolver) as Arc<dyn SegmentResolver>,
        memcpy_enabled: true,
        rdma: None,
    })
    .unwrap();
    let mut back = vec![0u8; 4096];
    one(&client, read_req(&mut back, "seg", base)).unwrap();
    assert!(one(&client, read_req(&mut back, "seg", base + 1)).is_err());
    assert_eq!(
        one(&client, at_epoch(read_req(&mut back, "seg", base), 7)),
        Err(ErrorCode::StaleSegmentEpoch)
    );
    assert_eq!(resolver.invalidated.load(Ordering::SeqCst), 0);
    server.shutdown();
    assert!(one(&client, read_req(&mut back, "seg", base)).is_err());
    assert_eq!(resolver.invalidated.load(Ordering::SeqCst), 1);
}

/// A peer that restarted on a new port and re-published its segment under the same name
/// is reached after one failed attempt (the failure drops the cached address).
#[test]
fn republished_peer_is_reached_after_one_failed_attempt() {
    use crate::rpc::http::HttpServer;
    use crate::rpc::metadata::{
        metadata_handler, BufferEntry, HttpMetadataClient, HttpMetadataResolver, MetadataStore,
        SegmentDescriptor,
    };
    let store = Arc::new(MetadataStore::default());
    let http = HttpServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        metadata_handler(Arc::clone(&store)),
    )
    .unwrap();
    let url = format!("http://{}/metadata", http.local_addr());
    let metadata = || HttpMetadataClient::with_cluster_id(&url, None, Default::default()).unwrap();
    let mut segment = pattern(4096, 11);
    let expected = segment.clone();
    let base = addr_of(&segment);
    let publish = |engine: &TransferEngine| {
        let descriptor = SegmentDescriptor {
            host: "127.0.0.1".into(),
            rpc_port: 1,
            tcp_data_port: engine.listen_addr().unwrap().port(),
            buffers: vec![BufferEntry {
                name: "cpu:0".into(),
                addr: base,
                length: 4096,
            }],
        };
        metadata().publish_segment("peer", &descriptor).unwrap();
    };
    let first = serving_engine();
    register(&first, &mut segment, true);
    publish(&first);
    let client = TransferEngine::new(EngineConfig {
        local_name: "embedded:3".into(),
        listener: None,
        resolver: Arc::new(HttpMetadataResolver::new(metadata())),
        memcpy_enabled: true,
        rdma: None,
    })
    .unwrap();
    let mut back = vec![0u8; 4096];
    one(&client, read_req(&mut back, "peer", base)).unwrap();
    drop(first);
    let second = serving_engine();
    register(&second, &mut segment, true);
    publish(&second);
    back.fill(0);
    assert!(one(&client, read_req(&mut back, "peer", base)).is_err());
    one(&client, read_req(&mut back, "peer", base)).unwrap();
    assert_eq!(back, expected);
}

/// A peer that asks for a large READ and never reads the answer does not hold the
/// connection: the send stalls past the I/O timeout and the server resets it.
#[test]
fn unread_read_answer_expires() {
    let mut segment = vec![7u8; 32 * MIB];
    let base = addr_of(&segment);
    let (server, metrics) = deadline_server(&mut segment, Duration::from_millis(300));
    let mut conn = TcpStream::connect(server.local_addr()).unwrap();
    let header = SessionHeader {
        size: segment.len() as u64,
        addr: base,
        opcode: Opcode::Read,
        v2: true,
        epoch: None,
    }
    .encode();
    conn.write_all(&header).unwrap();
    let expired = wait_until(Duration::from_secs(3), || {
        metrics.snapshot().expired_requests == 1
    });
    assert!(expired, "a stalled READ answer held its connection");
    server.shutdown();
}

/// The epoch fence: a WRITE admitted under epoch E1 and still receiving its payload when the
/// segment is remounted (E2) applies not one byte more once `set_region_epoch` returned — the
/// range may be handed to another key right after.
#[test]
fn remount_fences_a_write_admitted_under_the_old_epoch() {
    let server = serving_engine();
    let mut segment = vec![0u8; 64 * 1024];
    register(&server, &mut segment, true);
    let base = addr_of(&segment);
    server.set_region_epoch(base as usize, E1).unwrap();
    let header = SessionHeader {
        size: segment.len() as u64,
        addr: base,
        opcode: Opcode::Write,
        v2: true,
        epoch: Some(E1),
    }
    .encode();
    let mut conn = TcpStream::connect(server.listen_addr().unwrap()).unwrap();
    conn.write_all(&header).unwrap();
    conn.write_all(&[0xAA; 4096]).unwrap();
    let first = segment.as_ptr();
    // SAFETY: reads of our own buffer, which the server writes through raw pointers.
    let landed = |i: usize| unsafe { std::ptr::read_volatile(first.add(i)) };
    assert!(wait_until(Duration::from_secs(3), || landed(4095) == 0xAA));
    server.set_region_epoch(base as usize, E2).unwrap();
    let _ = conn.write_all(&[0xBB; 60 * 1024]);
    assert!(closed_by_peer(&mut conn, Duration::from_secs(3)));
    assert!(
        (4096..segment.len()).all(|i| landed(i) == 0),
        "bytes of the old mount's WRITE landed after the remount"
    );
    let m = server.metrics();
    assert_eq!((m.served_writes, m.stale_epoch_rejections), (0, 1));
}
