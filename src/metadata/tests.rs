//! The HTTP metadata service with real engines: a republished peer is found again.

use crate::transfer::test_support::*;
use crate::transfer::*;
use std::net::SocketAddr;
use std::sync::Arc;

/// A peer that restarted on a new port and re-published its segment under the same name
/// is reached after one failed attempt (the failure drops the cached address).
#[test]
fn republished_peer_is_reached_after_one_failed_attempt() {
    use crate::metadata::{
        metadata_handler, BufferEntry, MetadataClient, MetadataResolver, MetadataStore,
        SegmentDescriptor,
    };
    use crate::rpc::http::HttpServer;
    let store = Arc::new(MetadataStore::default());
    let http = HttpServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        metadata_handler(Arc::clone(&store)),
    )
    .unwrap();
    let url = format!("http://{}/metadata", http.local_addr());
    let metadata = || MetadataClient::with_cluster_id(&url, None, Default::default()).unwrap();
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
        resolver: Arc::new(MetadataResolver::new(metadata())),
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
