//! Engine-level tests: local copies, batching, shutdown, epochs on the local path, address
//! invalidation; TCP transport tests are in `tcp/`.

use crate::error::{last_error_message, ErrorCode};
use crate::transfer::test_support::*;
use crate::transfer::*;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// An engine named `local` (serving on `listener`, if any) whose peers are named by their
/// address (`DirectResolver`), without RDMA.
fn direct_config(local: &str, listener: Option<TcpListener>) -> EngineConfig {
    EngineConfig {
        local_name: local.into(),
        listener,
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: None,
    }
}

/// A data port bound beyond loopback without a cluster key is warned about and counted
/// (`open_listeners`, in `/metrics`); one with a key is not.
#[test]
fn a_data_port_open_to_other_hosts_without_a_key_is_counted() {
    let before = crate::auth::counters().open_listeners;
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let open = TransferEngine::new(direct_config("embedded:open", Some(listener))).unwrap();
    assert!(crate::auth::counters().open_listeners > before);
    open.shutdown();
}

/// A key rotation on a keyed data port: once key 1 leaves the server's file, a connection
/// proven with it is closed while idle within seconds, an engine still on key 1 is refused
/// (`AUTH_FAILED`), and one on key 2 reads as before.
#[test]
fn a_data_port_closes_the_connections_of_a_retired_key() {
    use crate::auth::{client_blocking, test_ring as ring};
    use std::io::Read;
    let config = direct_config;
    let file = crate::auth::KeyFile::new(&[1, 2]);
    let server_ring = file.ring();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let name = listener.local_addr().unwrap().to_string();
    let server =
        TransferEngine::with_cluster_key(config(&name, Some(listener)), Arc::clone(&server_ring))
            .unwrap();
    let mut segment = pattern(4096, 5);
    register(&server, &mut segment, true);
    let base = addr_of(&segment);
    let old = TransferEngine::with_cluster_key(config("embedded:old", None), ring(1)).unwrap();
    let mut back = vec![0u8; 4096];
    one(&old, read_req(&mut back, &name, base)).unwrap();
    let mut idle = std::net::TcpStream::connect(&name).unwrap();
    client_blocking(&mut idle, &ring(1), crate::auth::ROLE_DATA).unwrap();
    file.list(&[2]);
    server_ring.expire_reload_check();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = std::time::Instant::now();
    assert_eq!(idle.read(&mut [0u8; 1]).unwrap(), 0, "closed by the server");
    assert!(started.elapsed() < Duration::from_secs(4));
    // The old engine's pooled connection is closed too (on its own check, at most a second
    // or two later); then a new one proves key 1 and is refused.
    let refused = || one(&old, read_req(&mut back, &name, base)) == Err(ErrorCode::AuthFailed);
    assert!(crate::test_util::wait_until(
        Duration::from_secs(5),
        refused
    ));
    let new = TransferEngine::with_cluster_key(config("embedded:new", None), ring(2)).unwrap();
    back.fill(0);
    one(&new, read_req(&mut back, &name, base)).unwrap();
    assert_eq!(back, pattern(4096, 5));
    for engine in [server, old, new] {
        engine.shutdown();
    }
}

/// With a cluster key, the data port serves an engine that proves it and refuses one with
/// another key (`AUTH_FAILED`) or none, without serving a byte of their requests.
#[test]
fn a_keyed_data_port_serves_only_engines_that_prove_its_key() {
    use crate::auth::test_ring as ring;
    let config = direct_config;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let name = listener.local_addr().unwrap().to_string();
    let server = TransferEngine::with_cluster_key(config(&name, Some(listener)), ring(1)).unwrap();
    let mut segment = pattern(8192, 3);
    register(&server, &mut segment, true);
    let base = addr_of(&segment);
    let keyed = TransferEngine::with_cluster_key(config("embedded:7", None), ring(1)).unwrap();
    let mut back = vec![0u8; 8192];
    one(&keyed, read_req(&mut back, &name, base)).unwrap();
    assert_eq!(back, pattern(8192, 3));
    let wrong = TransferEngine::with_cluster_key(config("embedded:8", None), ring(2)).unwrap();
    let mut other = vec![0u8; 8192];
    let written = [9u8; 8192];
    assert_eq!(
        one(&wrong, read_req(&mut other, &name, base)),
        Err(ErrorCode::AuthFailed)
    );
    assert_eq!(
        one(&wrong, write_req(&written, &name, base)),
        Err(ErrorCode::AuthFailed)
    );
    let keyless = TransferEngine::new(config("embedded:9", None)).unwrap();
    assert!(one(&keyless, read_req(&mut other, &name, base)).is_err());
    assert!(one(&keyless, write_req(&written, &name, base)).is_err());
    assert_eq!(other, vec![0u8; 8192], "nothing was read");
    one(&keyed, read_req(&mut back, &name, base)).unwrap();
    assert_eq!(back, pattern(8192, 3), "nothing was written");
    for engine in [server, keyed, wrong, keyless] {
        engine.shutdown();
    }
}
