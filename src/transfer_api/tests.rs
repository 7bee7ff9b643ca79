//! Two endpoints in one process talking over TCP on 127.0.0.1, with P2P handshake names and
//! through an HTTP metadata service.

use super::*;
use crate::metadata::{metadata_handler, MetadataStore};
use crate::rpc::http::HttpServer;
use std::net::SocketAddr;

fn config(metadata_server: &str, local_hostname: &str) -> EndpointConfig {
    EndpointConfig {
        local_hostname: local_hostname.into(),
        metadata_server: metadata_server.into(),
        metadata_type: None,
        protocol: "tcp".into(),
        device_name: String::new(),
    }
}

fn p2p() -> TransferEndpoint {
    TransferEndpoint::start(&config("P2PHANDSHAKE", "127.0.0.1")).unwrap()
}

/// A registered buffer of `len` bytes owned by the test.
fn registered(endpoint: &TransferEndpoint, len: usize, fill: u8) -> Vec<u8> {
    let buffer = vec![fill; len];
    // SAFETY: the buffer outlives every transfer of the test (it is unregistered or the
    // endpoint dropped before it is).
    unsafe { endpoint.register(buffer.as_ptr() as usize, len) }.unwrap();
    buffer
}

fn part(
    local: &[u8],
    offset: usize,
    remote: &[u8],
    remote_offset: usize,
    len: usize,
) -> TransferPart {
    TransferPart {
        local: local.as_ptr() as usize + offset,
        remote: remote.as_ptr() as u64 + remote_offset as u64,
        len: len as u64,
    }
}

#[test]
fn writes_and_reads_of_random_sizes_round_trip_sync_and_async() {
    let (initiator, target) = (p2p(), p2p());
    assert_eq!(
        target.segment_name(),
        format!("127.0.0.1:{}", target.rpc_port())
    );
    assert!((15_000..=17_000).contains(&target.rpc_port()));
    const SIZE: usize = 1 << 20;
    let mut source = registered(&initiator, SIZE, 0);
    let sink = registered(&initiator, SIZE, 0);
    let remote = registered(&target, SIZE, 0);
    let name = target.segment_name().to_string();
    for round in 0..200u32 {
        let len = fastrand::usize(1..SIZE / 4);
        let (at, remote_at) = (
            fastrand::usize(0..SIZE - len),
            fastrand::usize(0..SIZE - len),
        );
        let byte = round as u8;
        source[at..at + len]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = byte ^ i as u8);
        let write = [part(&source, at, &remote, remote_at, len)];
        let read = [part(&sink, at, &remote, remote_at, len)];
        // SAFETY: registered buffers alive for the test.
        unsafe {
            if round % 2 == 0 {
                initiator
                    .transfer(&name, TransferOp::Write, &write)
                    .unwrap();
                initiator.transfer(&name, TransferOp::Read, &read).unwrap();
            } else {
                let id = initiator
                    .submit(&name, TransferOp::Write, write.to_vec())
                    .unwrap();
                initiator.wait_batches(&[id]).unwrap();
                let id = initiator
                    .submit(&name, TransferOp::Read, read.to_vec())
                    .unwrap();
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut state = initiator.batch_state(id).unwrap();
                while state == BatchState::Pending && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_micros(100));
                    state = initiator.batch_state(id).unwrap();
                }
                assert_eq!(state, BatchState::Done);
            }
        }
        assert!(sink[at..at + len] == source[at..at + len], "round {round}");
        assert!(remote[remote_at..remote_at + len] == source[at..at + len]);
    }
    // A batch of several parts.
    let parts: Vec<TransferPart> = (0..8)
        .map(|i| part(&source, i * 4096, &remote, SIZE - (i + 1) * 4096, 4096))
        .collect();
    // SAFETY: as above.
    unsafe { initiator.transfer(&name, TransferOp::Write, &parts) }.unwrap();
    for i in 0..8 {
        let theirs = &remote[SIZE - (i + 1) * 4096..SIZE - i * 4096];
        assert!(theirs == &source[i * 4096..(i + 1) * 4096]);
    }
    assert_eq!(
        initiator.first_buffer_address(&name),
        Ok(remote.as_ptr() as u64)
    );
    drop(initiator);
    drop(target);
}

#[test]
fn bad_arguments_get_error_codes_and_move_nothing() {
    let (initiator, target) = (p2p(), p2p());
    let local = registered(&initiator, 4096, 7);
    let remote = registered(&target, 4096, 0);
    let name = target.segment_name().to_string();
    let unregistered = vec![1u8; 4096];
    let cases: [(&str, TransferPart, ErrorCode); 4] = [
        (
            "unregistered local",
            part(&unregistered, 0, &remote, 0, 64),
            ErrorCode::InvalidParams,
        ),
        (
            "local past its registration",
            part(&local, 4000, &remote, 0, 200),
            ErrorCode::InvalidParams,
        ),
        (
            "remote past the peer's registration",
            part(&local, 0, &remote, 4000, 200),
            ErrorCode::TransferFail,
        ),
        (
            "remote the peer never registered",
            part(&local, 0, &unregistered, 0, 64),
            ErrorCode::TransferFail,
        ),
    ];
    for (what, bad, code) in cases {
        // SAFETY: registered buffers (the unregistered one is refused before any copy).
        let outcome = unsafe { initiator.transfer(&name, TransferOp::Write, &[bad]) };
        assert_eq!(outcome, Err(code), "{what}");
    }
    assert!(remote.iter().all(|&b| b == 0), "nothing landed");
    // SAFETY: as above.
    unsafe {
        assert_eq!(
            initiator.transfer("", TransferOp::Write, &[part(&local, 0, &remote, 0, 8)]),
            Err(ErrorCode::InvalidParams)
        );
        assert_eq!(
            initiator.transfer(
                "127.0.0.1:1",
                TransferOp::Read,
                &[part(&local, 0, &remote, 0, 8)]
            ),
            Err(ErrorCode::TransferFail),
            "nobody listens there"
        );
        assert_eq!(
            initiator.submit(
                &name,
                TransferOp::Write,
                vec![part(&unregistered, 0, &remote, 0, 8)]
            ),
            Err(ErrorCode::InvalidParams)
        );
        let id = initiator
            .submit(
                &name,
                TransferOp::Write,
                vec![part(&local, 0, &unregistered, 0, 8)],
            )
            .unwrap();
        assert_eq!(initiator.wait_batches(&[id]), Err(ErrorCode::TransferFail));
        assert_eq!(
            initiator.wait_batches(&[id]),
            Err(ErrorCode::InvalidParams),
            "freed"
        );
        assert_eq!(
            initiator.register(local.as_ptr() as usize + 8, 8),
            Err(ErrorCode::InvalidParams),
            "overlap"
        );
        assert_eq!(initiator.register(0, 8), Err(ErrorCode::InvalidParams));
        let pair = [0u8; 64];
        let base = pair.as_ptr() as usize;
        assert_eq!(
            initiator.register_all(&[(base, 32), (base + 16, 32)]),
            Err(ErrorCode::InvalidParams),
            "overlapping within the list"
        );
        assert!(
            initiator.engine.region_containing(base).is_none(),
            "none registered"
        );
    }
    assert_eq!(initiator.unregister(12345), Err(ErrorCode::InvalidParams));
    let base = local.as_ptr() as usize;
    assert!(initiator.is_registered_base(base) && !initiator.is_registered_base(base + 1));
    assert!(
        initiator.overlaps_registered(base - 8, 16) && initiator.overlaps_registered(base + 8, 1)
    );
    assert!(!initiator.overlaps_registered(base - 8, 8));
    assert_eq!(
        initiator.write_local(base + 4090, b"abcdefgh"),
        Err(ErrorCode::InvalidParams)
    );
    initiator.write_local(base + 10, b"abc").unwrap();
    assert_eq!(initiator.read_local(base + 10, 3), Ok(b"abc".to_vec()));
    assert_eq!(
        initiator.read_local(base + 4000, 200),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(initiator.probe(&name), Ok(()));
    initiator.notify(&name, "prefill", "kv ready").unwrap();
    initiator.notify(&name, "prefill", "").unwrap();
    assert_eq!(
        target.take_notifications(),
        vec![
            ("prefill".into(), "kv ready".into()),
            ("prefill".into(), String::new())
        ]
    );
    assert!(target.take_notifications().is_empty(), "drained");
    let huge = "x".repeat(1 << 20);
    assert_eq!(
        initiator.notify(&name, "n", &huge),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(
        initiator.notify("127.0.0.1:1", "n", "m"),
        Err(ErrorCode::TransferFail)
    );
    assert_eq!(initiator.probe("127.0.0.1:1"), Err(ErrorCode::TransferFail));
    assert_eq!(initiator.batch_state(999), Err(ErrorCode::InvalidParams));
    assert_eq!(
        initiator.first_buffer_address("127.0.0.1:1").err(),
        Some(ErrorCode::TransferFail)
    );
    let empty = p2p();
    assert_eq!(
        initiator.first_buffer_address(empty.segment_name()),
        Err(ErrorCode::SegmentNotFound)
    );
    for (metadata, protocol) in [
        ("redis://127.0.0.1:6379", "tcp"),
        ("P2PHANDSHAKE", "nvlink"),
    ] {
        let mut bad = config(metadata, "127.0.0.1");
        bad.protocol = protocol.into();
        assert_eq!(
            TransferEndpoint::start(&bad).err(),
            Some(ErrorCode::InvalidParams),
            "{metadata} {protocol}"
        );
    }
    assert_eq!(
        TransferEndpoint::start(&config("P2PHANDSHAKE", "")).err(),
        Some(ErrorCode::InvalidParams)
    );
}

#[test]
fn an_unregistration_waits_for_the_transfers_using_the_range() {
    let (initiator, target) = (p2p(), p2p());
    const SIZE: usize = 64 << 20;
    let local = registered(&initiator, SIZE, 3);
    let remote = registered(&target, SIZE, 0);
    let name = target.segment_name().to_string();
    let ids: Vec<u64> = (0..4)
        .map(|_| {
            // SAFETY: registered buffers alive until the endpoint drops.
            unsafe {
                initiator.submit(
                    &name,
                    TransferOp::Write,
                    vec![part(&local, 0, &remote, 0, SIZE)],
                )
            }
            .unwrap()
        })
        .collect();
    initiator.unregister(local.as_ptr() as usize).unwrap();
    assert!(
        remote.iter().all(|&b| b == 3),
        "every batch using the range had moved its bytes before it was unregistered"
    );
    assert_eq!(initiator.wait_batches(&ids), Ok(()));
}

#[test]
fn managed_buffers_are_reachable_by_peers_and_checked_on_free() {
    let (initiator, target) = (p2p(), p2p());
    let theirs = target.allocate_managed(1 << 16).unwrap();
    let ours = initiator.allocate_managed(1 << 16).unwrap();
    // SAFETY: managed memory of the endpoints, 64 KiB each.
    unsafe {
        std::ptr::write_bytes(ours as *mut u8, 9, 1 << 16);
        let parts = [TransferPart {
            local: ours,
            remote: theirs as u64,
            len: 1 << 16,
        }];
        initiator
            .transfer(target.segment_name(), TransferOp::Write, &parts)
            .unwrap();
        let landed = target.read_local(theirs, 1 << 16).unwrap();
        assert!(landed.iter().all(|&b| b == 9));
    }
    assert_eq!(
        target.first_buffer_address(initiator.segment_name()),
        initiator
            .engine
            .remote_ranges()
            .first()
            .map(|r| r.0)
            .ok_or(ErrorCode::SegmentNotFound)
    );
    assert_eq!(
        target.unregister(theirs),
        Err(ErrorCode::InvalidParams),
        "managed"
    );
    assert_eq!(
        target.free_managed(theirs, 1),
        Err(ErrorCode::InvalidParams)
    );
    target.free_managed(theirs, 1 << 16).unwrap();
    let big = target.allocate_managed(managed::POOL_BYTES + 1).unwrap();
    target.free_managed(big, managed::POOL_BYTES + 1).unwrap();
    assert!(target.engine.region_containing(big).is_none());
}

#[test]
fn with_an_http_metadata_service_segments_are_named_verbatim_and_published() {
    let store = Arc::new(MetadataStore::default());
    let server = HttpServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        metadata_handler(Arc::clone(&store)),
    )
    .unwrap();
    let url = format!("http://{}/metadata", server.local_addr());
    let target = TransferEndpoint::start(&config(&url, "127.0.0.1:1")).unwrap();
    assert_eq!(target.segment_name(), "127.0.0.1:1", "verbatim");
    let initiator = TransferEndpoint::start(&config(&url, "initiator-node")).err();
    assert_eq!(
        initiator,
        Some(ErrorCode::InvalidParams),
        "a host that does not resolve"
    );
    let initiator = TransferEndpoint::start(&config(&url, "127.0.0.1:2")).unwrap();
    let remote = registered(&target, 1 << 16, 0);
    let local = registered(&initiator, 1 << 16, 5);
    // SAFETY: registered buffers alive for the test.
    unsafe {
        initiator
            .transfer(
                "127.0.0.1:1",
                TransferOp::Write,
                &[part(&local, 0, &remote, 0, 1 << 16)],
            )
            .unwrap();
    }
    assert!(remote.iter().all(|&b| b == 5));
    assert_eq!(
        initiator.first_buffer_address("127.0.0.1:1"),
        Ok(remote.as_ptr() as u64)
    );
    let ram: serde_json::Value =
        serde_json::from_slice(&store.get("mooncake/ram/127.0.0.1:1").unwrap()).unwrap();
    assert_eq!(ram["buffers"][0]["addr"], remote.as_ptr() as u64);
    target.unregister(remote.as_ptr() as usize).unwrap();
    let ram: serde_json::Value =
        serde_json::from_slice(&store.get("mooncake/ram/127.0.0.1:1").unwrap()).unwrap();
    assert_eq!(ram["buffers"], serde_json::json!([]), "published again");
    drop(target);
    assert!(
        store.get("mooncake/ram/127.0.0.1:1").is_none(),
        "removed on drop"
    );
    // SAFETY: as above.
    let gone = unsafe {
        initiator.transfer(
            "127.0.0.1:1",
            TransferOp::Write,
            &[part(&local, 0, &remote, 0, 8)],
        )
    };
    assert!(gone.is_err());
}
