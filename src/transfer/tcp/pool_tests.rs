//! TCP initiator tests: round trips, pipelining, refusals inside a pipelined run, pooled
//! connections that went stale, peers dying mid-run.

use super::pool::ConnectionPool;
use super::wire::{Opcode, SessionHeader, Status, HEADER_LEN};
use crate::error::{last_error_message, ErrorCode};
use crate::test_util::wait_until;
use crate::transfer::metrics::Metrics;
use crate::transfer::settings::Settings;
use crate::transfer::test_support::*;
use crate::transfer::transport::Slice;
use crate::transfer::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

pub(super) fn test_pool() -> (ConnectionPool, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let settings = Settings {
        io_timeout: Duration::from_secs(10),
        lanes: 4,
        ..Settings::default()
    };
    (
        ConnectionPool::new(settings, Arc::clone(&metrics), None),
        metrics,
    )
}

pub(super) fn read_slice(buf: &mut [u8], remote: u64) -> Slice {
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
    let pool = ConnectionPool::new(settings, Arc::clone(&metrics), None);
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
    let pool = ConnectionPool::new(settings, Arc::clone(&metrics), None);
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

/// A peer that answered one READ, then closed the pooled connection with the next READ's
/// header unread (so its kernel resets it: what an idle-timeout close racing a new request
/// does): nothing was applied and a READ changes nothing, so it is sent again on a fresh
/// connection and succeeds.
#[test]
fn read_reset_before_any_answer_is_retried_on_a_fresh_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut header = [0u8; HEADER_LEN];
        conn.read_exact(&mut header).unwrap();
        conn.write_all(&Status::Ok.encode()).unwrap();
        conn.write_all(&[0x11; 4096]).unwrap();
        conn.read_exact(&mut header).unwrap();
        super::socket::set_abortive_close(conn.as_raw_fd()).unwrap();
        drop(conn);
        // A fresh connection gets its READ answered.
        listener.set_nonblocking(false).unwrap();
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.read_exact(&mut header).unwrap();
        conn.write_all(&Status::Ok.encode()).unwrap();
        conn.write_all(&[0x22; 4096]).unwrap();
    });
    let (pool, metrics) = test_pool();
    let mut back = vec![0u8; 4096];
    // SAFETY: `back` outlives the calls.
    unsafe { pool.execute(peer, &[read_slice(&mut back, 0x1000)]) }
        .remove(0)
        .unwrap();
    assert!(back.iter().all(|&b| b == 0x11));
    // SAFETY: as above.
    let second = unsafe { pool.execute(peer, &[read_slice(&mut back, 0x1000)]) }.remove(0);
    assert!(second.is_ok(), "{second:?}");
    assert!(back.iter().all(|&b| b == 0x22));
    fake.join().unwrap();
    assert_eq!(metrics.snapshot().connections_opened, 2);
}
