//! Issue 11 ("never the wrong bytes") scenarios that need a real client: a master that hands
//! out a replica of the wrong size, and a put session whose ranged write failed. Masters and
//! peers run on 127.0.0.1; every wait is bounded.

mod common;

use common::{pattern, wait_until, Master, PeerClient};
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::error::{ErrorCode, Result};
use mooncake_rs::master::{
    MasterApi, MasterConfig, MasterInterface, MasterRequest, MasterResponse, MasterService,
    RemoteMaster,
};
use mooncake_rs::rpc::{Call, Interface};
use mooncake_rs::types::ReplicateConfig;
use std::sync::Arc;
use std::time::Duration;

/// A master that answers like `inner`, except that every replica granted for a key starting
/// with `skewed` is described 2048 bytes further on and 2048 bytes shorter (a buggy or
/// mismatched master: the described range now ends inside the next object).
struct SkewingMaster {
    inner: Arc<MasterService>,
}

impl Call<MasterInterface> for SkewingMaster {
    fn call(&self, request: MasterRequest) -> Result<MasterResponse> {
        let skew = matches!(&request, MasterRequest::batch_put_start { keys, .. }
            if keys.iter().any(|k| k.starts_with("skewed")));
        let mut answer = MasterInterface::dispatch(request, &*self.inner);
        if let (true, MasterResponse::batch_put_start(Ok(grants))) = (skew, &mut answer) {
            for grant in grants.iter_mut().flatten() {
                for replica in &mut grant.replicas {
                    replica.buffer.buffer_address += 2048;
                    replica.buffer.size -= 2048;
                }
            }
        }
        Ok(answer)
    }
}

fn client_of(master: &str, segment: u64) -> Client {
    Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: segment,
        local_buffer_size: 1 << 20,
        master_server_addr: master.into(),
        ..SetupConfig::default()
    })
    .expect("client setup")
}

/// Failure 7: a replica whose size does not match the object is never written — before, the
/// write went ahead and overran into the neighbouring object.
#[test]
fn replica_of_the_wrong_size_is_never_written() {
    let service = MasterService::new(MasterConfig::default());
    let skewing: Arc<dyn MasterApi> = Arc::new(RemoteMaster(SkewingMaster {
        inner: service.clone(),
    }));
    let server =
        mooncake_rs::master::remote::serve("127.0.0.1:0".parse().unwrap(), skewing).unwrap();
    let client = client_of(&server.local_addr().to_string(), 1 << 20);
    let config = ReplicateConfig::default();
    let neighbour = pattern(4096, 7);
    client.put_from("first", &[1u8; 4096], &config).unwrap();
    client.put_from("neighbour", &neighbour, &config).unwrap();
    client.remove("first", true).unwrap();
    // Placed where "first" was; described as [2048, 4096): a 4 KiB write would overrun.
    assert_eq!(
        client.put_from("skewed", &[0xEE; 4096], &config),
        Err(ErrorCode::InvalidReplica)
    );
    let mut out = vec![0u8; 4096];
    assert_eq!(client.get_into("neighbour", &mut out), Ok(4096));
    assert!(out == neighbour, "the neighbouring object was overwritten");
    assert_eq!(
        client.is_exist("skewed"),
        Ok(false),
        "nothing was committed"
    );
    client.teardown();
}

/// Failure 10: a put session whose ranged write failed never commits: its end reports the
/// failure and the key stays unreadable.
#[test]
fn put_session_with_a_failed_ranged_write_does_not_commit() {
    let master = Master::start(&[]);
    let mut peer = PeerClient::start(&master.addr(), "16 MB");
    let client = client_of(&master.addr(), 0);
    let on_peer = ReplicateConfig {
        preferred_segment: peer.name.clone(),
        ..ReplicateConfig::default()
    };
    let keys = ["layers"];
    let started = client.batch_put_session_start(&keys, &[8192], &on_peer);
    assert_eq!(started, vec![Ok(())]);
    let layer = pattern(4096, 3);
    let first = client.batch_put_from_multi_buffer_ranges(&keys, &[vec![&layer[..]]], &[vec![0]]);
    assert_eq!(first, vec![Ok(4096)]);
    peer.kill();
    let second =
        client.batch_put_from_multi_buffer_ranges(&keys, &[vec![&layer[..]]], &[vec![4096]]);
    assert!(
        second[0].is_err(),
        "the write to a dead peer fails: {second:?}"
    );
    let ended = client.batch_put_session_end(&keys);
    assert_eq!(
        ended[0],
        second[0].map(drop),
        "a session with a failed ranged write ends with that write's error, uncommitted"
    );
    assert!(wait_until(Duration::from_secs(5), || client
        .is_exist("layers")
        .is_ok_and(|e| !e)));
    client.teardown();
}
