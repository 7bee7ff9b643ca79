//! RPC server and client together over 127.0.0.1, against a recording fixture master.

use super::{RpcMasterClient, RpcServer, Timeouts};
use crate::error::{ErrorCode, Result};
use crate::master::{MasterApi, MasterRequest, MasterResponse, RemoteMaster};
use crate::rpc::Call;
use crate::types::*;
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// How long the fixture's `remove_all` takes (longer than the short test timeout).
const SLOW_CALL: Duration = Duration::from_millis(600);

/// A master that records the names of the calls it gets and returns fixed answers.
struct Fixture {
    version: String,
    calls: Mutex<Vec<&'static str>>,
}

impl Fixture {
    fn new(version: &str) -> Arc<Fixture> {
        Arc::new(Fixture {
            version: version.to_owned(),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn record(&self, name: &'static str) {
        self.calls.lock().push(name);
    }

    fn count(&self, name: &str) -> usize {
        self.calls.lock().iter().filter(|&&c| c == name).count()
    }
}

/// `Ok(())` for every key except those starting with "bad", which get `OBJECT_NOT_FOUND`.
fn per_key(keys: &[String]) -> Vec<Result<()>> {
    let entry = |k: &String| {
        if k.starts_with("bad") {
            Err(ErrorCode::ObjectNotFound)
        } else {
            Ok(())
        }
    };
    keys.iter().map(entry).collect()
}

impl MasterApi for Fixture {
    fn service_ready(&self) -> Result<String> {
        self.record("service_ready");
        Ok(self.version.clone())
    }
    fn ping(&self, client: ClientId) -> Result<PingResponse> {
        self.record("ping");
        Ok(PingResponse {
            view_version: client.lo,
            status: ClientStatus::Ok,
        })
    }
    fn mount_segment(&self, _: ClientId, segment: Segment) -> Result<()> {
        self.record("mount_segment");
        if segment.size == 0 {
            Err(ErrorCode::InvalidParams)
        } else {
            Ok(())
        }
    }
    fn remount_segments(&self, _: ClientId, _: Vec<Segment>) -> Result<()> {
        self.record("remount_segments");
        Ok(())
    }
    fn unmount_segment(&self, _: ClientId, _: SegmentId) -> Result<()> {
        self.record("unmount_segment");
        Ok(())
    }
    fn batch_put_start(
        &self,
        _: ClientId,
        keys: Vec<String>,
        sizes: Vec<u64>,
        config: ReplicateConfig,
    ) -> Result<Vec<Result<WriteGrant>>> {
        self.record("batch_put_start");
        let replica = |size: u64, i: usize| ReplicaDescriptor {
            id: i as u64,
            buffer: BufferDescriptor {
                size,
                buffer_address: 0x1000 * i as u64,
                protocol: "tcp".into(),
                transport_endpoint: config.preferred_segment.clone(),
                epoch: 7,
            },
            status: ReplicaStatus::Processing,
        };
        Ok(keys
            .iter()
            .zip(sizes)
            .enumerate()
            .map(|(i, (key, size))| {
                if key.starts_with("bad") {
                    Err(ErrorCode::ObjectAlreadyExists)
                } else {
                    Ok(WriteGrant {
                        token: WriteToken(i as u64 + 100),
                        replicas: vec![replica(size, i)],
                        write_ttl_ms: 1000,
                    })
                }
            })
            .collect())
    }
    fn batch_put_end(
        &self,
        _: ClientId,
        keys: Vec<String>,
        _: Vec<WriteToken>,
    ) -> Result<Vec<Result<()>>> {
        self.record("batch_put_end");
        Ok(per_key(&keys))
    }
    fn batch_put_revoke(
        &self,
        _: ClientId,
        keys: Vec<String>,
        _: Vec<WriteToken>,
    ) -> Result<Vec<Result<()>>> {
        self.record("batch_put_revoke");
        Ok(per_key(&keys))
    }
    fn batch_upsert_start(
        &self,
        client: ClientId,
        keys: Vec<String>,
        sizes: Vec<u64>,
        config: ReplicateConfig,
    ) -> Result<Vec<Result<WriteGrant>>> {
        self.batch_put_start(client, keys, sizes, config)
    }
    fn batch_get_replica_list(&self, keys: Vec<String>) -> Result<Vec<Result<QueryResult>>> {
        self.record("batch_get_replica_list");
        Ok(keys
            .iter()
            .map(|_| Err(ErrorCode::ObjectNotFound))
            .collect())
    }
    fn batch_exist_key(&self, keys: Vec<String>) -> Result<Vec<Result<bool>>> {
        self.record("batch_exist_key");
        Ok(keys.iter().map(|k| Ok(!k.starts_with("bad"))).collect())
    }
    fn batch_remove(&self, keys: Vec<String>, _: bool) -> Result<Vec<Result<()>>> {
        self.record("batch_remove");
        Ok(per_key(&keys))
    }
    fn remove_by_regex(&self, pattern: String, _: bool) -> Result<u64> {
        self.record("remove_by_regex");
        if pattern == "(" {
            Err(ErrorCode::InvalidParams)
        } else {
            Ok(pattern.len() as u64)
        }
    }
    fn remove_all(&self, _: bool) -> Result<u64> {
        self.record("remove_all");
        std::thread::sleep(SLOW_CALL);
        Ok(0)
    }
    fn batch_pin(&self, _: ClientId, keys: Vec<String>) -> Result<Vec<Result<PinnedObject>>> {
        self.record("batch_pin");
        Ok(keys
            .iter()
            .map(|_| Err(ErrorCode::ObjectNotFound))
            .collect())
    }
    fn unpin(&self, _: ClientId, _: Vec<u64>) -> Result<()> {
        self.record("unpin");
        Ok(())
    }

    fn p2p_register_owner(&self, _: P2pOwner) -> Result<()> {
        self.record("p2p_register_owner");
        Ok(())
    }

    fn p2p_list_owners(&self) -> Result<Vec<P2pOwner>> {
        self.record("p2p_list_owners");
        Ok(Vec::new())
    }

    fn p2p_add_keys(&self, _: ClientId, keys: Vec<String>, _: Vec<u64>) -> Result<Vec<Result<()>>> {
        self.record("p2p_add_keys");
        Ok(keys.iter().map(|_| Ok(())).collect())
    }

    fn p2p_remove_keys(&self, _: ClientId, keys: Vec<String>) -> Result<Vec<Result<()>>> {
        self.record("p2p_remove_keys");
        Ok(keys
            .iter()
            .map(|_| Err(ErrorCode::ObjectNotFound))
            .collect())
    }

    fn p2p_get_routes(&self, keys: Vec<String>) -> Result<Vec<Result<P2pRoute>>> {
        self.record("p2p_get_routes");
        Ok(keys
            .iter()
            .map(|_| Err(ErrorCode::ObjectNotFound))
            .collect())
    }
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn short_timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_millis(500),
        request: Duration::from_millis(150),
    }
}

fn start(version: &str) -> (RpcServer, Arc<Fixture>) {
    let fixture = Fixture::new(version);
    let server = RpcServer::start(loopback(), fixture.clone()).unwrap();
    (server, fixture)
}

fn remote(server: &RpcServer, timeouts: Timeouts) -> RemoteMaster<RpcMasterClient> {
    RemoteMaster(
        RpcMasterClient::with_timeouts(&server.local_addr().to_string(), timeouts).unwrap(),
    )
}

#[test]
fn methods_round_trip_including_per_entry_results() {
    let (server, fixture) = start(STORE_VERSION);
    let master = remote(&server, Timeouts::default());
    let client = Uuid { hi: 9, lo: 42 };

    assert_eq!(master.service_ready().unwrap(), STORE_VERSION);
    assert_eq!(master.ping(client).unwrap().view_version, 42);
    let segment = Segment {
        id: Uuid::random(),
        name: "seg".into(),
        base: 4096,
        size: 0,
        protocol: "tcp".into(),
        epoch: 1,
    };
    assert_eq!(
        master.mount_segment(client, segment),
        Err(ErrorCode::InvalidParams)
    );

    let config = ReplicateConfig {
        preferred_segment: "seg".into(),
        ..ReplicateConfig::default()
    };
    let started = master
        .batch_put_start(client, vec!["k".into(), "bad".into()], vec![7, 8], config)
        .unwrap();
    let grant = started[0].as_ref().unwrap();
    assert_eq!(
        (grant.token, grant.replicas[0].buffer.epoch),
        (WriteToken(100), 7)
    );
    let replicas = &grant.replicas;
    assert_eq!(
        (
            replicas[0].buffer.size,
            replicas[0].buffer.transport_endpoint.as_str()
        ),
        (7, "seg")
    );
    assert_eq!(started[1], Err(ErrorCode::ObjectAlreadyExists));

    let removed = master
        .batch_remove(vec!["a".into(), "bad".into(), "c".into()], true)
        .unwrap();
    assert_eq!(
        removed,
        vec![Ok(()), Err(ErrorCode::ObjectNotFound), Ok(())]
    );
    assert_eq!(
        master.batch_exist_key(vec!["bad".into()]).unwrap(),
        vec![Ok(false)]
    );
    assert_eq!(
        master.remove_by_regex("(".into(), false),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(master.remove_by_regex("abc".into(), false), Ok(3));

    assert_eq!(fixture.count("service_ready"), 2); // handshake + explicit call
    assert_eq!(fixture.count("batch_put_start"), 1);
    let stats = server.stats();
    assert_eq!(
        (
            stats.calls("remove_by_regex"),
            stats.errors("remove_by_regex")
        ),
        (2, 1)
    );
    assert_eq!(
        (stats.calls("batch_remove"), stats.errors("batch_remove")),
        (1, 0)
    );
    assert!(stats
        .prometheus_text()
        .contains("mooncake_master_rpc_errors_total{method=\"mount_segment\"} 1"));
}

#[test]
fn eight_threads_share_one_client() {
    let (server, fixture) = start(STORE_VERSION);
    let master = Arc::new(remote(&server, Timeouts::default()));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let master = Arc::clone(&master);
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    let id = Uuid {
                        hi: t,
                        lo: t * 1000 + i,
                    };
                    assert_eq!(master.ping(id).unwrap().view_version, id.lo);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(fixture.count("ping"), 1600);
    assert_eq!(server.stats().calls("ping"), 1600);
}

#[test]
fn a_version_mismatch_is_refused() {
    let (server, _) = start("1.9.9");
    let addr = server.local_addr().to_string();
    let refused = RpcMasterClient::with_timeouts(&addr, Timeouts::default());
    assert_eq!(refused.err(), Some(ErrorCode::InvalidVersion));
}

#[test]
fn calls_fail_while_the_master_is_down_and_resume_after_it_restarts() {
    let (server, _) = start(STORE_VERSION);
    let addr = server.local_addr();
    let master = remote(&server, short_timeouts());
    assert!(master.ping(Uuid::default()).is_ok());

    server.shutdown();
    server.shutdown(); // idempotent
    assert_eq!(master.ping(Uuid::default()).err(), Some(ErrorCode::RpcFail));

    let restarted = RpcServer::start(addr, Fixture::new(STORE_VERSION)).unwrap();
    assert_eq!(master.ping(Uuid { hi: 0, lo: 5 }).unwrap().view_version, 5);
    drop(restarted);
}

#[test]
fn a_slow_answer_times_out_and_the_connection_is_replaced() {
    let (server, fixture) = start(STORE_VERSION);
    let master = remote(&server, short_timeouts());
    assert_eq!(master.remove_all(true), Err(ErrorCode::RpcTimeout));
    assert_eq!(fixture.count("remove_all"), 1);
    // The timed-out connection is gone; the late answer cannot be mistaken for this one.
    assert_eq!(master.ping(Uuid { hi: 0, lo: 3 }).unwrap().view_version, 3);
}

#[test]
fn garbage_frames_close_the_connection_but_not_the_server() {
    let (server, _) = start(STORE_VERSION);
    for garbage in [
        &b"\x03\x00\x00\x00\xff\xff\xff"[..],
        &u32::MAX.to_le_bytes()[..],
    ] {
        let mut raw = TcpStream::connect(server.local_addr()).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        raw.write_all(garbage).unwrap();
        let mut rest = Vec::new();
        assert_eq!(
            raw.read_to_end(&mut rest).unwrap(),
            0,
            "server must close without answering"
        );
    }
    assert_eq!(server.stats().bad_requests(), 1); // the oversized header never became a request
    let client =
        RpcMasterClient::with_timeouts(&server.local_addr().to_string(), Timeouts::default())
            .unwrap();
    let answer = client
        .call(MasterRequest::unpin {
            client: Uuid::default(),
            pin_ids: vec![1],
        })
        .unwrap();
    assert!(matches!(answer, MasterResponse::unpin(Ok(()))));
}
