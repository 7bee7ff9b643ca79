//! `TransferEndpoint` (what `mooncake.engine.TransferEngine` runs on) with etcd as its metadata
//! server, as upstream's default `initialize(host, "host:port", ...)`: a real etcd member,
//! two endpoints, segments named verbatim, published, resolved, and removed on drop.

mod common;

use common::EtcdMember;
use mooncake_rs::error::ErrorCode;
use mooncake_rs::transfer::TransferOp;
use mooncake_rs::transfer_api::{EndpointConfig, TransferEndpoint, TransferPart};

fn endpoint(local_hostname: &str, metadata_server: &str) -> mooncake_rs::Result<TransferEndpoint> {
    TransferEndpoint::start(&EndpointConfig {
        local_hostname: local_hostname.into(),
        metadata_server: metadata_server.into(),
        metadata_type: None,
        protocol: "tcp".into(),
        device_name: String::new(),
    })
}

#[test]
fn endpoints_find_each_other_through_etcd_and_leave_it_when_dropped() {
    let etcd = EtcdMember::cluster(1);
    let bare = etcd[0].endpoint();
    let target = endpoint("127.0.0.1:1", &bare).expect("a bare host:port is etcd");
    assert_eq!(target.segment_name(), "127.0.0.1:1");
    let initiator = endpoint("127.0.0.1:2", &format!("etcd://{bare}")).unwrap();
    let remote = vec![0u8; 1 << 16];
    let local: Vec<u8> = (0..1 << 16).map(|i| (i % 251) as u8).collect();
    // SAFETY: both buffers outlive the endpoints' use of them (the endpoints drop first or
    // the buffers are unregistered with them).
    unsafe {
        target
            .register(remote.as_ptr() as usize, remote.len())
            .unwrap();
        initiator
            .register(local.as_ptr() as usize, local.len())
            .unwrap();
    }
    assert_eq!(
        initiator.first_buffer_address("127.0.0.1:1"),
        Ok(remote.as_ptr() as u64)
    );
    let part = TransferPart {
        local: local.as_ptr() as usize,
        remote: remote.as_ptr() as u64,
        len: local.len() as u64,
    };
    // SAFETY: registered buffers alive for the test.
    unsafe { initiator.transfer("127.0.0.1:1", TransferOp::Write, &[part]) }.unwrap();
    assert_eq!(remote, local);
    drop(target);
    let fresh = endpoint("127.0.0.1:3", &bare).unwrap();
    assert_eq!(
        fresh.first_buffer_address("127.0.0.1:1"),
        Err(ErrorCode::SegmentNotFound),
        "the dropped target removed its entries"
    );
    drop(etcd);
    assert!(
        endpoint("127.0.0.1:4", &bare).is_err(),
        "no etcd: initialize fails"
    );
}
