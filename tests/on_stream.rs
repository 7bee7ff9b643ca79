//! On-stream gets with host streams (no GPU needed): the call returns before the data moves,
//! the stream's order holds, pins keep bytes stable through eviction and forced removes,
//! failures open the gate with a status, teardown and exhausted slabs are clean errors, and
//! session ranges make no master call. Every wait is bounded.

mod common;

use common::streams::{buf, embedded, on, Blocker};
use common::{local_client, pattern, wait_until, PeerClient};
use mooncake_rs::client::{Buf, Client};
use mooncake_rs::master::{MasterConfig, MasterService};
use mooncake_rs::stream::{HostEvent, HostStream, StreamRef, Ticket, TICKET_PENDING};
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MIB: usize = 1 << 20;
const LIMIT: Option<Duration> = Some(Duration::from_secs(20));

fn get_on(client: &Client, keys: &[&str], outs: &mut [Vec<u8>], stream: &HostStream) -> Ticket {
    let bufs = outs.iter_mut().map(|o| buf(o)).collect();
    // SAFETY: the outputs outlive every wait in the tests and nobody else touches them.
    unsafe { client.batch_get_into_on_stream_raw(keys, bufs, false, StreamRef::Host(stream)) }
        .expect("on-stream get issued")
}

#[test]
fn returns_before_the_data_moves_and_the_stream_order_holds() {
    let client = embedded(64 * MIB as u64);
    let values: Vec<Vec<u8>> = (0..4).map(|i| pattern(MIB + i * 7, i as u8)).collect();
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    for (k, v) in keys.iter().zip(&values) {
        client.put_from(k, v, &ReplicateConfig::default()).unwrap();
    }
    let stream = HostStream::new().unwrap();
    let blocker = Blocker::block(&stream);
    let mut outs: Vec<Vec<u8>> = values.iter().map(|v| vec![0u8; v.len() + 5]).collect();
    let names: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
    let ticket = get_on(&client, &names, &mut outs, &stream);
    assert_eq!(ticket.status(), TICKET_PENDING);
    assert_eq!(ticket.wait(Some(Duration::from_millis(30))), TICKET_PENDING);
    assert!(
        outs.iter().all(|o| o.iter().all(|&b| b == 0)),
        "nothing moved yet"
    );
    assert_eq!(client.metrics().stream.pins_held, 4);
    // Work enqueued after the call sees the data.
    let seen = Arc::new(AtomicU64::new(0));
    let (s, first) = (seen.clone(), outs[0].as_ptr() as usize);
    let expect = values[0][MIB - 1];
    stream.launch(move || {
        // SAFETY: the buffer outlives the stream's work (the test waits below).
        let byte = unsafe { *(first as *const u8).add(MIB - 1) };
        s.store(u64::from(byte == expect) + 1, Ordering::SeqCst);
    });
    blocker.release();
    assert_eq!(ticket.wait(LIMIT), 0);
    assert!(stream.synchronize(LIMIT));
    assert_eq!(seen.load(Ordering::SeqCst), 2, "later work saw the data");
    for (o, v) in outs.iter().zip(&values) {
        assert_eq!(&o[..v.len()], &v[..]);
    }
    let results = ticket.results();
    assert_eq!(results.len(), 4);
    for (r, v) in results.iter().zip(&values) {
        assert_eq!(*r, Ok(v.len() as u64));
    }
    let m = client.metrics().stream;
    assert_eq!((m.pins_held, m.tickets_outstanding), (0, 0));
    assert_eq!((m.tickets_issued, m.tickets_ok), (1, 1));
    assert_eq!(m.direct_copies, 4);
}

#[test]
fn per_key_errors_and_bad_calls() {
    let client = embedded(16 * MIB as u64);
    client
        .put_from("present", &pattern(1000, 3), &ReplicateConfig::default())
        .unwrap();
    let stream = HostStream::new().unwrap();
    let mut outs = vec![vec![0u8; 1000], vec![0u8; 10], vec![0u8; 64]];
    let ticket = get_on(
        &client,
        &["present", "present", "absent"],
        &mut outs,
        &stream,
    );
    assert_eq!(ticket.wait(LIMIT), ErrorCode::InvalidParams.code());
    let r = ticket.results();
    assert_eq!(r[0], Ok(1000));
    assert_eq!(r[1], Err(ErrorCode::InvalidParams), "buffer too small");
    assert_eq!(r[2], Err(ErrorCode::ObjectNotFound));
    assert_eq!(outs[0], pattern(1000, 3));
    assert!(
        outs[1].iter().all(|&b| b == 0),
        "a failed key's buffer is untouched"
    );
    // Shape mismatch and unsupported stream kinds fail the call; nothing is enqueued.
    let err = unsafe {
        client.batch_get_into_on_stream_raw(&["present"], vec![], false, StreamRef::Host(&stream))
    };
    assert_eq!(err.err(), Some(ErrorCode::InvalidParams));
    let mut one = vec![0u8; 1000];
    let err = unsafe {
        client.batch_get_into_on_stream_raw(
            &["present"],
            vec![buf(&mut one)],
            false,
            StreamRef::Cuda(0x1234),
        )
    };
    assert!(matches!(
        err.err(),
        Some(ErrorCode::NotSupported) | Some(ErrorCode::InvalidParams)
    ));
    let m = client.metrics().stream;
    assert_eq!((m.tickets_issued, m.pins_held), (1, 0));
}

#[test]
fn layerwise_pipeline_overlaps_load_and_compute() {
    const LAYERS: usize = 8;
    let client = embedded(64 * MIB as u64);
    let values: Vec<Vec<u8>> = (0..LAYERS).map(|i| pattern(256 * 1024, i as u8)).collect();
    for (i, v) in values.iter().enumerate() {
        client
            .put_from(&format!("layer{i}"), v, &ReplicateConfig::default())
            .unwrap();
    }
    let load = HostStream::new().unwrap();
    let compute = HostStream::new().unwrap();
    let mut outs: Vec<Vec<u8>> = values.iter().map(|v| vec![0u8; v.len()]).collect();
    let checked = Arc::new(AtomicU64::new(0));
    let mut tickets = Vec::new();
    for (i, out) in outs.iter_mut().enumerate() {
        let key = format!("layer{i}");
        let bufs = vec![buf(out)];
        // SAFETY: outputs outlive the streams' work (synchronized below).
        let t = unsafe {
            client.batch_get_into_on_stream_raw(&[key.as_str()], bufs, true, StreamRef::Host(&load))
        }
        .unwrap();
        tickets.push(t);
        let ready = HostEvent::new();
        ready.record(&load);
        compute.wait_event(&ready);
        let (addr, len, expect, c) = (
            out.as_ptr() as usize,
            out.len(),
            values[i].clone(),
            checked.clone(),
        );
        compute.launch(move || {
            // SAFETY: the load stream wrote this buffer before the event; nothing writes now.
            let got = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
            if got == &expect[..] {
                c.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    assert!(compute.synchronize(LIMIT));
    assert_eq!(
        checked.load(Ordering::SeqCst),
        LAYERS as u64,
        "every layer saw its KV"
    );
    assert!(tickets.iter().all(|t| t.wait(LIMIT) == 0));
}

#[test]
fn pinned_bytes_survive_forced_removal_and_eviction_during_the_window() {
    // A 50 ms read lease, so only the pins (not the lease) can protect the bytes below.
    let master = MasterService::new(MasterConfig {
        default_kv_lease_ttl_ms: 50,
        ..MasterConfig::default()
    });
    let server =
        mooncake_rs::master::remote::serve("127.0.0.1:0".parse().unwrap(), master.clone()).unwrap();
    let client = local_client(&server.local_addr().to_string(), 16 * MIB as u64, 0);
    let value = pattern(4 * MIB, 9);
    client
        .put_from("victim", &value, &ReplicateConfig::default())
        .unwrap();
    let stream = HostStream::new().unwrap();
    let blocker = Blocker::block(&stream);
    let mut outs = vec![vec![0u8; value.len()]];
    let ticket = get_on(&client, &["victim"], &mut outs, &stream);
    std::thread::sleep(Duration::from_millis(200)); // the lease is over
    assert_eq!(client.remove("victim", true), Ok(()));
    // Fill the segment many times over: eviction and reuse of every free byte.
    for i in 0..40 {
        let _ = client.put_from(
            &format!("filler{i}"),
            &pattern(MIB, i as u8),
            &ReplicateConfig::default(),
        );
    }
    blocker.release();
    assert_eq!(ticket.wait(LIMIT), 0);
    assert_eq!(
        outs[0], value,
        "bytes unchanged through removal and eviction"
    );
    let m = client.metrics().stream;
    assert_eq!(
        (m.pins_held, m.lease_overruns),
        (0, 1),
        "the lease overrun is counted, not acted on"
    );
}

#[test]
fn session_ranges_on_stream_make_no_master_call() {
    const LAYERS: usize = 6;
    const LAYER: usize = 64 * 1024;
    let client = embedded(32 * MIB as u64);
    let value = pattern(LAYERS * LAYER, 5);
    client
        .put_from("kv", &value, &ReplicateConfig::default())
        .unwrap();
    assert!(client
        .batch_get_session_start(&["kv"])
        .iter()
        .all(|r| r.is_ok()));
    let stream = HostStream::new().unwrap();
    let mut out = vec![0u8; LAYERS * LAYER];
    let before = client.metrics().master_calls;
    let mut tickets = Vec::new();
    for layer in 0..LAYERS {
        let dst = Buf::new(out.as_mut_ptr() as usize + layer * LAYER, LAYER as u64);
        // SAFETY: `out` outlives the waits below.
        let t = unsafe {
            client.batch_get_into_multi_buffer_ranges_on_stream_raw(
                &["kv"],
                vec![vec![dst]],
                &[vec![(layer * LAYER) as u64]],
                StreamRef::Host(&stream),
            )
        }
        .unwrap();
        tickets.push(t);
    }
    assert!(tickets.iter().all(|t| t.wait(LIMIT) == 0));
    assert_eq!(
        client.metrics().master_calls,
        before,
        "zero master calls per layer"
    );
    assert_eq!(out, value);
    // Without a session: a per-key error, no master call either.
    let mut spare = vec![0u8; 16];
    let t = unsafe {
        client.batch_get_into_multi_buffer_ranges_on_stream_raw(
            &["no-session"],
            vec![buf(&mut spare)],
            &[vec![0]],
            StreamRef::Host(&stream),
        )
    }
    .unwrap();
    assert_eq!(t.wait(LIMIT), ErrorCode::InvalidParams.code());
    assert_eq!(client.metrics().master_calls, before);
    client.batch_get_session_end(&["kv"]).unwrap();
}

#[test]
fn ticket_slots_run_out_with_try_again_and_come_back() {
    let client = embedded(16 * MIB as u64);
    client
        .put_from("small", b"abc", &ReplicateConfig::default())
        .unwrap();
    let stream = HostStream::new().unwrap();
    let blocker = Blocker::block(&stream);
    let mut out = vec![0u8; 3];
    let mut tickets = Vec::new();
    let mut refused = None;
    for _ in 0..5000 {
        // SAFETY: `out` outlives the stream (synchronized below); concurrent writes of the
        // same bytes are fine for this test's purpose only because they happen in order on
        // one stream thread.
        match unsafe {
            client.batch_get_into_on_stream_raw(
                &["small"],
                vec![buf(&mut out)],
                false,
                StreamRef::Host(&stream),
            )
        } {
            Ok(t) => tickets.push(t),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    assert_eq!(refused, Some(ErrorCode::TryAgain));
    assert!(client.metrics().stream.try_again >= 1);
    // The blocking (NULL-stream) form needs a slot too, and does nothing without one.
    let mut value = b"blocked".to_vec();
    let blocked = unsafe {
        client.batch_put_from_on_stream_raw(
            &["blocked"],
            vec![buf(&mut value)],
            &ReplicateConfig::default(),
            StreamRef::Blocking,
        )
    };
    assert_eq!(blocked.err(), Some(ErrorCode::TryAgain));
    assert!(!client.is_exist("blocked").unwrap(), "nothing was written");
    blocker.release();
    assert!(tickets.iter().all(|t| t.wait(LIMIT) == 0));
    drop(tickets);
    let again = unsafe {
        client.batch_get_into_on_stream_raw(
            &["small"],
            vec![buf(&mut out)],
            false,
            StreamRef::Host(&stream),
        )
    };
    assert_eq!(again.unwrap().wait(LIMIT), 0);
    assert_eq!(out, b"abc");
}

#[test]
fn freeing_a_ticket_early_is_safe_and_teardown_cancels_waiting_gates() {
    // A master and a peer client in this process; the reader's object lives on the peer.
    let master = MasterService::new(MasterConfig::default());
    let server =
        mooncake_rs::master::remote::serve("127.0.0.1:0".parse().unwrap(), master.clone()).unwrap();
    let addr = server.local_addr().to_string();
    let peer = local_client(&addr, 64 * MIB as u64, 0);
    let reader = local_client(&addr, 16 * MIB as u64, 0);
    let value = pattern(2 * MIB, 4);
    reader
        .put_from("remote", &value, &on(&peer.get_hostname()))
        .unwrap();
    let stream = HostStream::new().unwrap();
    // Staged path: gate + copy from staging.
    let mut out = vec![vec![0u8; value.len()]];
    let t = get_on(&reader, &["remote"], &mut out, &stream);
    assert_eq!(t.wait(LIMIT), 0);
    assert_eq!(out[0], value);
    assert!(reader.metrics().stream.staged_copies >= 1);
    // Freed before completion: the stream still completes and releases everything.
    let blocker = Blocker::block(&stream);
    let mut early = vec![vec![0u8; value.len()]];
    drop(get_on(&reader, &["remote"], &mut early, &stream));
    blocker.release();
    assert!(stream.synchronize(LIMIT));
    assert_eq!(early[0], value);
    assert!(wait_until(Duration::from_secs(10), || {
        let m = reader.metrics().stream;
        m.tickets_outstanding == 0 && m.pins_held == 0 && m.staging_bytes_in_use == 0
    }));
    // Teardown while a gate is closed behind a blocked stream: it opens with CANCELLED or
    // the fetch already finished; the stream never hangs and the status is final.
    let blocker = Blocker::block(&stream);
    let mut late = vec![vec![0u8; value.len()]];
    let t = get_on(&reader, &["remote"], &mut late, &stream);
    reader.teardown();
    blocker.release();
    let status = t.wait(LIMIT);
    assert!(
        status == 0 || status == ErrorCode::Cancelled.code(),
        "status {status}"
    );
    assert!(stream.synchronize(LIMIT));
    let err = unsafe {
        reader.batch_get_into_on_stream_raw(
            &["remote"],
            vec![buf(&mut late[0])],
            false,
            StreamRef::Host(&stream),
        )
    };
    assert_eq!(err.err(), Some(ErrorCode::InvalidParams), "closed client");
    drop(peer);
}

#[test]
fn a_peer_killed_mid_transfer_fails_the_ticket_and_the_stream_goes_on() {
    let master = common::Master::start(&[]);
    let peer = PeerClient::start(&master.addr(), "128 MB");
    let reader = local_client(&master.addr(), 16 * MIB as u64, 0);
    let keys: Vec<String> = (0..6).map(|i| format!("big{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        reader
            .put_from(k, &pattern(8 * MIB, i as u8), &on(&peer.name))
            .unwrap();
    }
    let stream = HostStream::new().unwrap();
    let blocker = Blocker::block(&stream);
    let mut peer = peer;
    let mut outs: Vec<Vec<u8>> = keys.iter().map(|_| vec![0u8; 8 * MIB]).collect();
    let names: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
    // Issue, then kill the peer while the 48 MiB fetch runs.
    let ticket = get_on(&reader, &names, &mut outs, &stream);
    peer.kill();
    blocker.release();
    let status = ticket.wait(Some(Duration::from_secs(60)));
    if status == 0 {
        // The fetch beat the kill: then every byte must be there.
        for (i, o) in outs.iter().enumerate() {
            assert_eq!(o, &pattern(8 * MIB, i as u8));
        }
    } else {
        assert!(status < 0, "status {status}");
        assert!(ticket.results().iter().any(|r| r.is_err()));
    }
    // A get issued after the peer is gone always fails, and the stream goes on.
    let mut again: Vec<Vec<u8>> = vec![vec![0u8; 8 * MIB]];
    let dead = get_on(&reader, &names[..1], &mut again, &stream);
    assert!(dead.wait(Some(Duration::from_secs(60))) < 0);
    assert!(
        again[0].iter().all(|&b| b == 0),
        "a host stream leaves a failed key's buffer alone"
    );
    // The stream goes on and everything is released.
    let after = Arc::new(AtomicBool::new(false));
    let a = after.clone();
    stream.launch(move || a.store(true, Ordering::SeqCst));
    assert!(stream.synchronize(LIMIT));
    assert!(after.load(Ordering::SeqCst));
    assert!(wait_until(Duration::from_secs(10), || {
        let m = reader.metrics().stream;
        m.pins_held == 0 && m.tickets_outstanding == 0 && m.staging_bytes_in_use == 0
    }));
    assert!(reader.metrics().stream.tickets_failed >= 1);
}

#[test]
fn staging_exhaustion_is_try_again_and_gives_the_pins_back() {
    let master = MasterService::new(MasterConfig::default());
    let server =
        mooncake_rs::master::remote::serve("127.0.0.1:0".parse().unwrap(), master.clone()).unwrap();
    let addr = server.local_addr().to_string();
    let peer = local_client(&addr, 96 * MIB as u64, 0);
    let reader = local_client(&addr, 8 * MIB as u64, 0);
    let keys = ["s0", "s1", "s2"];
    for (i, k) in keys.iter().enumerate() {
        reader
            .put_from(k, &pattern(24 * MIB, i as u8), &on(&peer.get_hostname()))
            .unwrap();
    }
    let stream = HostStream::new().unwrap();
    let mut outs: Vec<Vec<u8>> = keys.iter().map(|_| vec![0u8; 24 * MIB]).collect();
    let bufs = outs.iter_mut().map(|o| buf(o)).collect();
    // 72 MiB of remote data does not fit the default 64 MiB of staging.
    let refused = unsafe {
        reader.batch_get_into_on_stream_raw(&keys, bufs, false, StreamRef::Host(&stream))
    };
    assert_eq!(refused.err(), Some(ErrorCode::TryAgain));
    let m = reader.metrics().stream;
    assert_eq!(
        (m.pins_held, m.staging_bytes_in_use, m.tickets_issued),
        (0, 0, 0)
    );
    assert_eq!(master.metrics().active_pins, 0, "the pins were given back");
    // Two of them fit.
    let t = get_on(&reader, &keys[..2], &mut outs[..2], &stream);
    assert_eq!(t.wait(LIMIT), 0);
    assert_eq!(outs[1], pattern(24 * MIB, 1));
    drop(peer);
}

/// A gated host-stream get: while the stream has not run the call's staged copies, the status
/// word never says 0 — even after the fetch opened the gate (a reader polling the word from
/// another thread must never see "ready" over an unfilled destination).
#[test]
fn host_status_word_stays_pending_until_the_staged_copies_ran() {
    let master = common::Master::start(&[]);
    let peer = PeerClient::start(&master.addr(), "32 MB");
    let reader = local_client(&master.addr(), 16 * MIB as u64, 0);
    let value = pattern(MIB, 9);
    reader.put_from("remote", &value, &on(&peer.name)).unwrap();
    let stream = HostStream::new().unwrap();
    let blocker = Blocker::block(&stream);
    let mut outs = vec![vec![0u8; MIB]];
    let ticket = get_on(&reader, &["remote"], &mut outs, &stream);
    // SAFETY: the word lives as long as the ticket handle.
    let word = unsafe { &*(ticket.status_word() as *const std::sync::atomic::AtomicI32) };
    let watch = std::time::Instant::now();
    let mut early = None;
    while early.is_none() && watch.elapsed() < Duration::from_millis(800) {
        let seen = word.load(Ordering::SeqCst);
        early = (seen != TICKET_PENDING).then_some(seen);
        std::thread::sleep(Duration::from_millis(2));
    }
    blocker.release();
    assert_eq!(ticket.wait(LIMIT), 0);
    assert!(stream.synchronize(LIMIT));
    assert_eq!(
        early, None,
        "the status word left PENDING before the staged copies ran"
    );
    assert_eq!(word.load(Ordering::SeqCst), 0);
    assert!(outs[0] == value);
}
