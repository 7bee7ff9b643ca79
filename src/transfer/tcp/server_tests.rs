//! TCP data server tests: the wire by hand (v1, malformed, pipelined), epochs, deadlines,
//! connection caps and idle timeouts.

use super::pool_tests::{read_slice, test_pool};
use super::wire::{Opcode, SessionHeader, Status, HEADER_LEN, STATUS_LEN};
use crate::error::ErrorCode;
use crate::test_util::wait_until;
use crate::transfer::metrics::Metrics;
use crate::transfer::settings::Settings;
use crate::transfer::test_support::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
            // No such opcode (0x02-0x04 are ours: RDMA handshake, segment query, notification).
            h[16] = 0x8f;
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
