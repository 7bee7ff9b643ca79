//! Multi-process scenarios with the real binaries on 127.0.0.1: a `mooncake_master`, peer
//! `mooncake_client` processes contributing segments, and an in-process client.

mod common;

use common::churn::churn;
use common::{local_client, pattern, wait_until, Master, PeerClient};
use mooncake_rs::transfer::{
    DirectResolver, EngineConfig, TransferEngine, TransferOp, TransferRequest,
};
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn on(segment: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![segment.to_string()],
        ..ReplicateConfig::default()
    }
}

#[test]
fn round_trips_over_tcp_between_processes() {
    let master = Master::start(&[]);
    let peer = PeerClient::start(&master.addr(), "256 MB");
    let client = local_client(&master.addr(), 0, 80 * MIB as u64);
    for (i, size) in [1usize, 4096, MIB, 64 * MIB].into_iter().enumerate() {
        let key = format!("tcp-{size}");
        let value = pattern(size, i as u8);
        let before = client.metrics().transfer;
        client.put_from(&key, &value, &on(&peer.name)).unwrap();
        let mid = client.metrics().transfer;
        assert_eq!(
            mid.tcp_write_bytes - before.tcp_write_bytes,
            size as u64,
            "sent straight from the caller's buffer"
        );
        assert_eq!(
            mid.local_copies, before.local_copies,
            "no local staging copy"
        );
        let mut out = vec![0u8; size];
        assert_eq!(client.get_into(&key, &mut out), Ok(size as u64));
        assert_eq!(out, value);
        let after = client.metrics().transfer;
        assert_eq!(after.tcp_read_bytes - mid.tcp_read_bytes, size as u64);
        assert_eq!(client.get_buffer(&key).unwrap().as_slice(), &value[..]);
    }
    client.put_from("zero", &[], &on(&peer.name)).unwrap();
    assert_eq!(client.is_exist("zero"), Ok(false));
    assert_eq!(
        client.get_into("nope", &mut [0u8; 8]),
        Err(ErrorCode::ObjectNotFound)
    );
    client.put_from("dup", b"first", &on(&peer.name)).unwrap();
    client.put_from("dup", b"second", &on(&peer.name)).unwrap();
    assert_eq!(client.get_buffer("dup").unwrap().as_slice(), b"first");
    let health = master.http_get("/health");
    assert!(health.contains("200"), "{health}");
    let metrics = master.http_get("/metrics");
    assert!(metrics.contains("mooncake_master_"), "{metrics}");
}

#[test]
fn lease_blocks_remove_and_force_wins() {
    let master = Master::start(&["--default_kv_lease_ttl=500"]);
    let client = local_client(&master.addr(), 16 * MIB as u64, 0);
    client
        .put_from("leased", b"value", &ReplicateConfig::default())
        .unwrap();
    client.remove("leased", false).unwrap();
    client
        .put_from("leased", b"value", &ReplicateConfig::default())
        .unwrap();
    assert_eq!(client.get_into("leased", &mut [0u8; 5]), Ok(5));
    assert_eq!(
        client.remove("leased", false),
        Err(ErrorCode::ObjectHasLease)
    );
    assert!(
        wait_until(Duration::from_secs(3), || client
            .remove("leased", false)
            .is_ok()),
        "lease never expired"
    );
    client
        .put_from("forced", b"value", &ReplicateConfig::default())
        .unwrap();
    assert_eq!(client.is_exist("forced"), Ok(true));
    assert_eq!(
        client.remove("forced", false),
        Err(ErrorCode::ObjectHasLease)
    );
    client.remove("forced", true).unwrap();
    assert_eq!(client.is_exist("forced"), Ok(false));
}

fn put_retrying(
    client: &mooncake_rs::client::Client,
    key: &str,
    value: &[u8],
    config: &ReplicateConfig,
) -> mooncake_rs::Result<()> {
    let start = Instant::now();
    loop {
        match client.put_from(key, value, config) {
            Err(ErrorCode::NoAvailableHandle) if start.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => return other,
        }
    }
}

#[test]
fn eviction_under_pressure_spares_leased_pinned_and_hard_pinned_objects() {
    let master = Master::start(&["--default_kv_lease_ttl=60000"]);
    let peer = PeerClient::start(&master.addr(), "16 MB");
    let client = local_client(&master.addr(), 0, 0);
    let seg = on(&peer.name);
    let keep = pattern(MIB, 1);
    put_retrying(&client, "leased", &keep, &seg).unwrap();
    put_retrying(&client, "pinned", &keep, &seg).unwrap();
    put_retrying(
        &client,
        "hard",
        &keep,
        &ReplicateConfig {
            with_hard_pin: true,
            ..seg.clone()
        },
    )
    .unwrap();
    assert_eq!(
        client.get_into("leased", &mut vec![0u8; MIB]),
        Ok(MIB as u64)
    );
    let pin = client.pin(&["pinned"]).pop().unwrap().unwrap();
    client.remove("hard", true).unwrap_or(());
    put_retrying(
        &client,
        "hard",
        &keep,
        &ReplicateConfig {
            with_hard_pin: true,
            ..seg.clone()
        },
    )
    .unwrap();
    for i in 0..40 {
        put_retrying(&client, &format!("fill-{i}"), &pattern(MIB, i as u8), &seg)
            .unwrap_or_else(|e| panic!("fill-{i}: {e}"));
    }
    for key in ["leased", "pinned", "hard"] {
        let mut out = vec![0u8; MIB];
        assert_eq!(
            client.get_into(key, &mut out),
            Ok(MIB as u64),
            "{key} was evicted"
        );
        assert_eq!(out, keep);
    }
    let exist = client.batch_is_exist(&(0..40).map(|i| format!("fill-{i}")).collect::<Vec<_>>());
    assert!(
        exist[..10].contains(&Ok(false)),
        "oldest objects were evicted first"
    );
    assert_eq!(exist[39], Ok(true), "the newest object survives");
    client.unpin(&[pin.pin_id]).unwrap();
    let metrics = master.http_get("/metrics");
    assert!(metrics.contains("evict"), "{metrics}");
}

#[test]
fn pinned_object_keeps_its_bytes_until_unpinned_across_processes() {
    let master = Master::start(&["--default_kv_lease_ttl=300"]);
    let peer = PeerClient::start(&master.addr(), "8 MB");
    let client = local_client(&master.addr(), 0, 0);
    let seg = on(&peer.name);
    let value = pattern(2 * MIB, 42);
    client.put_from("in-use", &value, &seg).unwrap();
    let pin = client.pin(&["in-use"]).pop().unwrap().unwrap();
    client.remove("in-use", true).unwrap();
    assert_eq!(client.is_exist("in-use"), Ok(false));
    for i in 0..6 {
        let _ = client.put_from(&format!("over-{i}"), &pattern(MIB, 7 + i as u8), &seg);
    }
    let mut out = vec![0u8; 2 * MIB];
    assert_eq!(client.read_pinned(&pin, &mut out), Ok(2 * MIB as u64));
    assert_eq!(out, value, "pinned bytes were reused");
    client.unpin(&[pin.pin_id]).unwrap();
    client.remove_all(true).unwrap();
    for i in 0..4 {
        put_retrying(
            &client,
            &format!("reuse-{i}"),
            &pattern(2 * MIB, i as u8),
            &seg,
        )
        .unwrap();
    }
}

#[test]
fn killed_client_loses_its_objects_and_a_new_one_takes_its_place() {
    let master = Master::start(&[]);
    let mut peer = PeerClient::start(&master.addr(), "32 MB");
    let client = local_client(&master.addr(), 32 * MIB as u64, 0);
    client
        .put_from("on-peer", &pattern(MIB, 1), &on(&peer.name))
        .unwrap();
    client
        .put_from("on-me", &pattern(MIB, 2), &on(&client.get_hostname()))
        .unwrap();
    peer.kill();
    let gone = wait_until(Duration::from_secs(10), || {
        client.is_exist("on-peer") == Ok(false)
    });
    assert!(gone, "objects of a SIGKILLed client outlived client_ttl");
    assert_eq!(
        client.is_exist("on-me"),
        Ok(true),
        "objects on other segments survive"
    );
    let replacement = PeerClient::start(&master.addr(), "32 MB");
    let value = pattern(16 * MIB, 3);
    client
        .put_from("on-new-peer", &value, &on(&replacement.name))
        .unwrap();
    let mut out = vec![0u8; 16 * MIB];
    assert_eq!(
        client.get_into("on-new-peer", &mut out),
        Ok(16 * MIB as u64)
    );
    assert_eq!(out, value);
}

#[test]
fn master_death_is_reported_and_a_restarted_master_is_rejoined() {
    let mut master = Master::start(&[]);
    let port = master.port;
    let client = local_client(&master.addr(), 16 * MIB as u64, 0);
    client
        .put_from("before", b"x", &ReplicateConfig::default())
        .unwrap();
    assert_eq!(client.health_check(), 0);
    master.kill();
    assert!(
        wait_until(Duration::from_secs(5), || client.health_check() == 2),
        "health never became 2"
    );
    assert!(client
        .put_from("during", b"x", &ReplicateConfig::default())
        .is_err());
    let _restarted = Master::start_on(port, &[]);
    assert!(
        wait_until(Duration::from_secs(10), || client.health_check() == 0),
        "client never rejoined"
    );
    let ok = wait_until(Duration::from_secs(10), || {
        client
            .put_from("after", b"back", &ReplicateConfig::default())
            .is_ok()
    });
    assert!(
        ok,
        "no put succeeded after the restart (segment not remounted?)"
    );
    let mut out = [0u8; 4];
    assert_eq!(client.get_into("after", &mut out), Ok(4));
    assert_eq!(&out, b"back");
    assert_eq!(
        client.is_exist("before"),
        Ok(false),
        "a restarted master starts empty"
    );
}

#[test]
fn peer_refuses_access_outside_registered_ranges() {
    let master = Master::start(&[]);
    let peer = PeerClient::start(&master.addr(), "4 MB");
    let client = local_client(&master.addr(), 0, 0);
    client
        .put_from("probe", &pattern(4096, 1), &on(&peer.name))
        .unwrap();
    let pin = client.pin(&["probe"]).pop().unwrap().unwrap();
    let inside = pin.query.replicas[0].buffer.buffer_address;
    let engine = TransferEngine::new(EngineConfig {
        local_name: "probe-engine".into(),
        listener: None,
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: None,
    })
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let read = |addr: u64, len: u64, buf: &mut [u8]| {
        let request = TransferRequest {
            op: TransferOp::Read,
            local_addr: buf.as_mut_ptr() as usize,
            len,
            endpoint: &peer.name,
            remote_addr: addr,
            epoch: 0,
            send_by: None,
        };
        // SAFETY: `buf` is valid and writable for `len` ≤ its length.
        unsafe { engine.transfer(&[request]) }.pop().unwrap()
    };
    assert_eq!(read(inside, 4096, &mut buf), Ok(()));
    assert_eq!(buf, pattern(4096, 1));
    assert_eq!(
        read(0x1000, 64, &mut buf),
        Err(ErrorCode::TransferFail),
        "address outside every registered range"
    );
    assert_eq!(
        read(inside + 4 * MIB as u64 - 32, 64, &mut buf),
        Err(ErrorCode::TransferFail),
        "range running past the segment"
    );
    let write = TransferRequest {
        op: TransferOp::Write,
        local_addr: buf.as_ptr() as usize,
        len: 64,
        endpoint: &peer.name,
        remote_addr: 0x2000,
        epoch: 0,
        send_by: None,
    };
    // SAFETY: `buf` is valid for reads of 64 bytes.
    assert_eq!(
        unsafe { engine.transfer(&[write]) }.pop().unwrap(),
        Err(ErrorCode::TransferFail)
    );
    assert_eq!(
        read(inside, 4096, &mut buf),
        Ok(()),
        "the peer still serves valid requests"
    );
}

#[test]
fn concurrent_churn_never_returns_a_torn_value() {
    let master = Master::start(&["--default_kv_lease_ttl=200"]);
    let peer = PeerClient::start(&master.addr(), "64 MB");
    let client = local_client(&master.addr(), 64 * MIB as u64, 0);
    let segments = [peer.name.clone(), client.get_hostname()];
    let deadline = Instant::now() + Duration::from_secs(8);
    let verified = churn(&client, &segments, deadline);
    assert!(verified > 0, "no read succeeded");
}
