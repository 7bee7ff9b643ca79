//! Stream-ordered puts with host streams: the source is read when the stream reaches the
//! call (after the producer's work), the object is invisible until the ticket is final and
//! visible right after, failures revoke (nothing half-visible), teardown cancels. Bounded.

mod common;

use common::streams::{buf, embedded, on, Blocker};
use common::{local_client, pattern, wait_until, PeerClient};
use mooncake_rs::client::Client;
use mooncake_rs::stream::{HostStream, StreamRef, Ticket, TICKET_PENDING};
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::time::Duration;

const MIB: usize = 1 << 20;
const LIMIT: Option<Duration> = Some(Duration::from_secs(30));

fn put_on(
    client: &Client,
    keys: &[&str],
    srcs: &mut [Vec<u8>],
    config: &ReplicateConfig,
    stream: &HostStream,
) -> Ticket {
    let bufs = srcs.iter_mut().map(|s| buf(s)).collect();
    // SAFETY: the sources outlive every wait in the tests and are not changed meanwhile.
    unsafe { client.batch_put_from_on_stream_raw(keys, bufs, config, StreamRef::Host(stream)) }
        .expect("on-stream put issued")
}

#[test]
fn the_source_is_read_in_stream_order_and_the_object_appears_only_when_final() {
    let client = embedded(64 * MIB as u64);
    let stream = HostStream::new().unwrap();
    let blocker = Blocker::block(&stream);
    // The producer writes the layer on the stream; the put is enqueued after it.
    let mut srcs = vec![vec![0u8; MIB]];
    let (addr, value) = (srcs[0].as_mut_ptr() as usize, pattern(MIB, 6));
    let produced = value.clone();
    stream.launch(move || {
        // SAFETY: the test keeps `srcs` alive and untouched until the ticket is final.
        unsafe { std::ptr::copy_nonoverlapping(produced.as_ptr(), addr as *mut u8, MIB) };
    });
    let ticket = put_on(
        &client,
        &["layer0"],
        &mut srcs,
        &ReplicateConfig::default(),
        &stream,
    );
    assert_eq!(ticket.status(), TICKET_PENDING);
    let mut out = vec![0u8; MIB];
    assert!(
        client.get_into("layer0", &mut out).is_err(),
        "invisible before the commit"
    );
    blocker.release();
    assert_eq!(ticket.wait(LIMIT), 0);
    assert_eq!(ticket.results(), vec![Ok(MIB as u64)]);
    assert_eq!(client.get_into("layer0", &mut out), Ok(MIB as u64));
    assert_eq!(
        out, value,
        "the stored bytes are the producer's, not the zeros at call time"
    );
    let m = client.metrics();
    assert_eq!(m.objects_written, 1);
    assert_eq!(
        (m.stream.tickets_outstanding, m.stream.staging_bytes_in_use),
        (0, 0)
    );
}

#[test]
fn existing_keys_are_kept_and_bad_calls_reserve_nothing() {
    let client = embedded(16 * MIB as u64);
    client
        .put_from("old", b"first", &ReplicateConfig::default())
        .unwrap();
    let stream = HostStream::new().unwrap();
    let mut srcs = vec![b"second".to_vec(), Vec::new(), b"fresh".to_vec()];
    let t = put_on(
        &client,
        &["old", "empty", "new"],
        &mut srcs,
        &ReplicateConfig::default(),
        &stream,
    );
    assert_eq!(t.wait(LIMIT), 0);
    assert_eq!(t.results(), vec![Ok(0), Ok(0), Ok(5)]);
    let mut out = vec![0u8; 5];
    assert_eq!(client.get_into("old", &mut out), Ok(5));
    assert_eq!(&out, b"first", "insert-if-absent is unchanged");
    let issue = |keys: &[&str], srcs: &mut [Vec<u8>], config: &ReplicateConfig| {
        let bufs = srcs.iter_mut().map(|s| buf(s)).collect();
        // SAFETY: as `put_on`.
        unsafe { client.batch_put_from_on_stream_raw(keys, bufs, config, StreamRef::Host(&stream)) }
            .err()
    };
    let mut two = vec![b"a".to_vec(), b"b".to_vec()];
    assert_eq!(
        issue(&["dup", "dup"], &mut two, &ReplicateConfig::default()),
        Some(ErrorCode::InvalidParams)
    );
    let none = ReplicateConfig {
        replica_num: 0,
        ..ReplicateConfig::default()
    };
    assert_eq!(
        issue(&["x", "y"], &mut two, &none),
        Some(ErrorCode::InvalidParams)
    );
    assert_eq!(
        issue(&["x"], &mut two, &ReplicateConfig::default()),
        Some(ErrorCode::InvalidParams)
    );
    assert!(!client.is_exist("dup").unwrap() && !client.is_exist("x").unwrap());
    // NULL stream: the blocking put, with a final ticket.
    let bufs = two.iter_mut().map(|s| buf(s)).collect();
    // SAFETY: as `put_on`.
    let t = unsafe {
        client.batch_put_from_on_stream_raw(
            &["b1", "b2"],
            bufs,
            &ReplicateConfig::default(),
            StreamRef::Blocking,
        )
    }
    .unwrap();
    assert_eq!((t.status(), t.results()), (0, vec![Ok(1), Ok(1)]));
}

#[test]
fn remote_replicas_go_through_staging_and_the_transport_then_commit() {
    let master = common::Master::start(&[]);
    let peer = PeerClient::start(&master.addr(), "64 MB");
    let producer = local_client(&master.addr(), 16 * MIB as u64, 0);
    let consumer = local_client(&master.addr(), 16 * MIB as u64, 0);
    let stream = HostStream::new().unwrap();
    let mut srcs: Vec<Vec<u8>> = (0..4).map(|i| pattern(2 * MIB, 10 + i as u8)).collect();
    let values = srcs.clone();
    let config = ReplicateConfig {
        replica_num: 2,
        preferred_segments: vec![peer.name.clone(), producer.get_hostname()],
        ..ReplicateConfig::default()
    };
    let keys = ["r0", "r1", "r2", "r3"];
    let t = put_on(&producer, &keys, &mut srcs, &config, &stream);
    assert_eq!(t.wait(LIMIT), 0);
    for (k, v) in keys.iter().zip(&values) {
        let mut out = vec![0u8; v.len()];
        assert_eq!(consumer.get_into(k, &mut out), Ok(v.len() as u64));
        assert_eq!(&out, v);
    }
    let m = producer.metrics().stream;
    assert_eq!(
        (m.tickets_ok, m.staging_bytes_in_use, m.tickets_outstanding),
        (1, 0, 0)
    );
}

#[test]
fn a_dead_peer_revokes_the_put_and_nothing_becomes_visible() {
    let master = common::Master::start(&[]);
    let mut peer = PeerClient::start(&master.addr(), "64 MB");
    let producer = local_client(&master.addr(), 16 * MIB as u64, 0);
    let stream = HostStream::new().unwrap();
    let blocker = Blocker::block(&stream);
    let mut srcs = vec![pattern(4 * MIB, 1)];
    let t = put_on(&producer, &["doomed"], &mut srcs, &on(&peer.name), &stream);
    peer.kill(); // before the stream reaches the call: the transport write must fail
    blocker.release();
    let status = t.wait(LIMIT);
    assert!(status < 0, "status {status}");
    assert!(t.results()[0].is_err());
    assert!(wait_until(Duration::from_secs(10), || !producer
        .is_exist("doomed")
        .unwrap_or(true)));
    let m = producer.metrics().stream;
    assert_eq!((m.tickets_failed, m.staging_bytes_in_use), (1, 0));
}

#[test]
fn teardown_before_the_stream_arrives_cancels_and_revokes() {
    let client = embedded(16 * MIB as u64);
    let stream = HostStream::new().unwrap();
    let blocker = Blocker::block(&stream);
    let mut srcs = vec![pattern(MIB, 2)];
    let t = put_on(
        &client,
        &["late"],
        &mut srcs,
        &ReplicateConfig::default(),
        &stream,
    );
    client.teardown();
    blocker.release();
    assert_eq!(t.wait(LIMIT), ErrorCode::Cancelled.code());
    assert_eq!(t.results(), vec![Err(ErrorCode::Cancelled)]);
    assert!(stream.synchronize(LIMIT));
}
