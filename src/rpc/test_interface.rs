//! A small interface for the wire's own tests, shaped like a real service's (per-key results,
//! a table scan, a version handshake), so `rpc/` is tested without any of its callers.

// The macro declares its items `pub` (real interfaces are API); this one is test-only.
#![allow(unreachable_pub)]

use crate::error::Result;
use crate::rpc::interface::rpc_interface;
use crate::types::{ReplicateConfig, Uuid};

rpc_interface! {
    /// The test interface ([`crate::rpc::Interface`] marker).
    interface TestInterface = "mc-test-rpc";
    /// The test service.
    trait TestApi;
    request TestRequest;
    response TestResponse;
    /// A [`TestApi`] over any [`crate::rpc::Call`] transport.
    remote RemoteTest;
    /// Version handshake.
    fn service_ready() -> Result<String>;
    /// A batch with per-key results.
    fn batch_put_start(client: Uuid, keys: Vec<String>, sizes: Vec<u64>, config: ReplicateConfig) -> Result<Vec<Result<u64>>>;
    /// A batch of unit results.
    fn batch_remove(keys: Vec<String>, force: bool) -> Result<Vec<Result<()>>>;
    /// A unit answer.
    fn unpin(client: Uuid, pin_ids: Vec<u64>) -> Result<()>;
    /// A scan.
    fn remove_all(force: bool) -> Result<u64>;
    /// A scan with a pattern.
    fn remove_by_regex(pattern: String, force: bool) -> Result<u64>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::KeyFile;
    use crate::error::ErrorCode;
    use crate::rpc::server::ServerOptions;
    use crate::rpc::{RpcClient, RpcServer, Timeouts};
    use std::net::SocketAddr;
    use std::sync::Arc;

    /// One shard thread, no lanes but `wait` and `poll` methods, no key, no TLS.
    fn one_shard(wait: &'static [&'static str], poll: &'static [&'static str]) -> ServerOptions {
        ServerOptions {
            threads: 1,
            limits: Default::default(),
            scan_methods: &[],
            wait_methods: wait,
            poll_methods: poll,
            cluster_key: None,
            tls: None,
        }
    }

    /// Serves `api` on a free loopback port with `options`; the server and its address.
    fn serve(api: Arc<dyn TestApi>, options: ServerOptions) -> (RpcServer, String) {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = RpcServer::serve_with::<TestInterface>(addr, api, options).unwrap();
        let local = server.local_addr().to_string();
        (server, local)
    }

    /// Answers every call from its arguments, so a round trip shows what arrived.
    struct Echo;

    impl TestApi for Echo {
        fn service_ready(&self) -> Result<String> {
            Ok("test-1".into())
        }
        fn batch_put_start(
            &self,
            _client: Uuid,
            keys: Vec<String>,
            sizes: Vec<u64>,
            _config: ReplicateConfig,
        ) -> Result<Vec<Result<u64>>> {
            Ok(keys
                .iter()
                .zip(sizes)
                .map(|(key, size)| match key.is_empty() {
                    true => Err(ErrorCode::InvalidParams),
                    false => Ok(size * 2),
                })
                .collect())
        }
        fn batch_remove(&self, keys: Vec<String>, force: bool) -> Result<Vec<Result<()>>> {
            match force {
                true => Ok(keys.iter().map(|_| Ok(())).collect()),
                false => Err(ErrorCode::ObjectHasLease),
            }
        }
        fn unpin(&self, _client: Uuid, pin_ids: Vec<u64>) -> Result<()> {
            match pin_ids.is_empty() {
                true => Err(ErrorCode::InvalidParams),
                false => Ok(()),
            }
        }
        fn remove_all(&self, force: bool) -> Result<u64> {
            Ok(u64::from(force))
        }
        fn remove_by_regex(&self, pattern: String, _force: bool) -> Result<u64> {
            Ok(pattern.len() as u64)
        }
    }

    /// A service declared with `rpc_interface!` round-trips every method through the generic
    /// server and client: answers, per-key errors and call-level errors arrive as sent.
    #[test]
    fn a_declared_interface_round_trips_through_server_and_client() {
        let (server, addr) = serve(
            Arc::new(Echo),
            ServerOptions {
                threads: 2,
                ..one_shard(&[], &[])
            },
        );
        let remote = RemoteTest(RpcClient::<TestInterface>::new(&addr, Timeouts::default()));
        assert_eq!(remote.service_ready().unwrap(), "test-1");
        let keys = vec!["a".to_string(), String::new()];
        let answers = remote
            .batch_put_start(
                Uuid::random(),
                keys.clone(),
                vec![3, 4],
                ReplicateConfig::default(),
            )
            .unwrap();
        assert_eq!(answers, vec![Ok(6), Err(ErrorCode::InvalidParams)]);
        assert_eq!(
            remote.batch_remove(keys.clone(), true).unwrap(),
            vec![Ok(()), Ok(())]
        );
        assert_eq!(
            remote.batch_remove(keys, false),
            Err(ErrorCode::ObjectHasLease)
        );
        assert_eq!(
            remote.unpin(Uuid::random(), vec![]),
            Err(ErrorCode::InvalidParams)
        );
        assert_eq!(remote.remove_all(true).unwrap(), 1);
        assert_eq!(remote.remove_by_regex("abc".into(), false).unwrap(), 3);
        let stats = server.stats();
        assert_eq!(stats.calls("batch_remove"), 2);
        assert_eq!(stats.errors("batch_remove"), 1);
        server.shutdown();
        assert!(remote.service_ready().is_err());
    }

    /// Counts `service_ready` calls (a wait method in the tests below); `batch_remove`, an
    /// inline call, waits up to 3 s for the second one; `unpin` stands for a long poll (it
    /// waits `poll`).
    #[derive(Default)]
    struct Rendezvous {
        ready_calls: parking_lot::Mutex<u32>,
        called: parking_lot::Condvar,
        poll: std::time::Duration,
    }

    impl TestApi for Rendezvous {
        fn service_ready(&self) -> Result<String> {
            *self.ready_calls.lock() += 1;
            self.called.notify_all();
            Ok("test-1".into())
        }
        fn batch_put_start(
            &self,
            _: Uuid,
            _: Vec<String>,
            _: Vec<u64>,
            _: ReplicateConfig,
        ) -> Result<Vec<Result<u64>>> {
            Ok(Vec::new())
        }
        fn batch_remove(&self, _: Vec<String>, _: bool) -> Result<Vec<Result<()>>> {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
            let mut calls = self.ready_calls.lock();
            while *calls < 2 {
                if self.called.wait_until(&mut calls, until).timed_out() {
                    return Err(ErrorCode::RpcTimeout);
                }
            }
            Ok(Vec::new())
        }
        fn unpin(&self, _: Uuid, _: Vec<u64>) -> Result<()> {
            std::thread::sleep(self.poll);
            Ok(())
        }
        fn remove_all(&self, _: bool) -> Result<u64> {
            Ok(0)
        }
        fn remove_by_regex(&self, _: String, _: bool) -> Result<u64> {
            Ok(0)
        }
    }

    /// A connection that made a wait call is served off the shards from then on: an inline
    /// call that holds the only shard while it waits for that connection's next call gets it.
    #[test]
    fn a_connection_that_made_a_wait_call_is_never_held_by_a_blocked_shard() {
        wait_call_moves_off_the_shard(None);
    }

    /// The same over TLS: the session moves to the side runtime with its state (the waiter's
    /// second call on it is decrypted there), and both clients speak only TLS.
    #[test]
    fn a_tls_connection_moves_off_the_shard_with_its_session() {
        let (server, client) = crate::auth::tls::test_pki();
        wait_call_moves_off_the_shard(Some((server, client)));
    }

    /// A TLS server serves clients that trust its certificate; a plain client and one that
    /// trusts another CA fail `RPC_FAIL` (the detail names the certificate) and are not served.
    #[test]
    fn a_tls_server_serves_only_clients_that_trust_its_certificate() {
        let (server_tls, trusting) = crate::auth::tls::test_pki();
        let (_, other_ca) = crate::auth::tls::test_pki();
        let api = Arc::new(Rendezvous::default());
        let options = crate::rpc::server::ServerOptions {
            tls: Some(server_tls),
            ..one_shard(&[], &[])
        };
        let served: Arc<dyn TestApi> = api.clone();
        let (_server, addr) = serve(served, options);
        let client = |tls| RemoteTest(RpcClient::new(&addr, Timeouts::default()).with_tls(tls));
        let tls = client(Some(trusting));
        assert_eq!(tls.service_ready().unwrap(), "test-1");
        assert_eq!(tls.service_ready().unwrap(), "test-1"); // the pooled connection
        assert_eq!(client(None).service_ready(), Err(ErrorCode::RpcFail));
        assert_eq!(
            client(Some(other_ca)).service_ready(),
            Err(ErrorCode::RpcFail)
        );
        let why = crate::error::last_error_message();
        assert!(
            why.contains("certificate") || why.contains("Certificate"),
            "{why}"
        );
        assert_eq!(*api.ready_calls.lock(), 2, "only the TLS calls were served");
    }

    fn wait_call_moves_off_the_shard(
        tls: Option<(Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>)>,
    ) {
        let api = Arc::new(Rendezvous::default());
        let options = ServerOptions {
            tls: tls.as_ref().map(|(server, _)| Arc::clone(server)),
            ..one_shard(&["service_ready"], &[])
        };
        let client_tls = tls.map(|(_, client)| client);
        let served: Arc<dyn TestApi> = api.clone();
        let (_server, addr) = serve(served, options);
        let client = move |addr: &str| {
            let client = RpcClient::<TestInterface>::new(addr, Timeouts::default());
            RemoteTest(client.with_tls(client_tls.clone()))
        };
        let waiter = client(&addr);
        assert_eq!(waiter.service_ready().unwrap(), "test-1");
        let blocked = {
            let remote = client(&addr);
            std::thread::spawn(move || remote.batch_remove(vec!["k".into()], true))
        };
        // The inline call now holds the only shard, waiting for the waiter's second call.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(waiter.service_ready().unwrap(), "test-1");
        assert_eq!(blocked.join().unwrap(), Ok(Vec::new()));
        assert_eq!(*api.ready_calls.lock(), 2);
    }

    /// With a cluster key, a client that proves it is served; one with another key fails
    /// `AUTH_FAILED`, and one without a key is closed at once, before its request is read.
    #[test]
    fn a_keyed_server_serves_only_clients_that_prove_its_key() {
        use crate::auth::test_ring as ring;
        let api = Arc::new(Rendezvous::default());
        let options = ServerOptions {
            cluster_key: Some(ring(1)),
            ..one_shard(&[], &[])
        };
        let served: Arc<dyn TestApi> = api.clone();
        let (_server, addr) = serve(served, options);
        let client = || RpcClient::<TestInterface>::new(&addr, Timeouts::default());
        let keyed = RemoteTest(client().with_cluster_key(ring(1)));
        assert_eq!(keyed.service_ready().unwrap(), "test-1");
        assert_eq!(keyed.service_ready().unwrap(), "test-1"); // the pooled connection
        let wrong = RemoteTest(client().with_cluster_key(ring(2)));
        assert_eq!(wrong.service_ready(), Err(ErrorCode::AuthFailed));
        let started = std::time::Instant::now();
        let keyless = RemoteTest(client());
        assert_eq!(keyless.service_ready(), Err(ErrorCode::RpcFail));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            *api.ready_calls.lock(),
            2,
            "only the keyed calls were served"
        );
    }

    /// A key rotation on a keyed server: a client that moved to the new key keeps being
    /// served (on a connection proven with it), a connection proven with the old key is
    /// closed by the server within seconds of the key leaving its file (while idle, nothing
    /// of a request read), and a client still on the old key is refused.
    #[test]
    fn a_retired_keys_connections_are_closed_and_its_holders_refused() {
        use crate::auth::{client_blocking, test_ring as ring};
        use std::io::Read;
        let (server_file, client_file) = (KeyFile::new(&[1, 2]), KeyFile::new(&[1]));
        let server_ring = server_file.ring();
        let options = ServerOptions {
            cluster_key: Some(Arc::clone(&server_ring)),
            ..one_shard(&[], &[])
        };
        let (_server, addr) = serve(Arc::new(Echo), options);
        let client_ring = client_file.ring();
        let client = RpcClient::<TestInterface>::new(&addr, Timeouts::default());
        let rotating = RemoteTest(client.with_cluster_key(Arc::clone(&client_ring)));
        assert_eq!(rotating.service_ready().unwrap(), "test-1");
        // A connection proven with key 1 that then stays idle.
        let mut idle = std::net::TcpStream::connect(&addr).unwrap();
        let role = <TestInterface as crate::rpc::Interface>::NAME;
        client_blocking(&mut idle, &ring(1), role).unwrap();
        // The client moves to key 2 first, then the server drops key 1.
        client_file.list(&[2, 1]);
        client_ring.expire_reload_check();
        assert_eq!(rotating.service_ready().unwrap(), "test-1");
        let retired_before = crate::auth::counters().retired_closed;
        server_file.list(&[2]);
        server_ring.expire_reload_check();
        idle.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let started = std::time::Instant::now();
        assert_eq!(idle.read(&mut [0u8; 1]).unwrap(), 0, "closed by the server");
        assert!(started.elapsed() < std::time::Duration::from_secs(4));
        assert!(crate::auth::counters().retired_closed > retired_before);
        for _ in 0..3 {
            assert_eq!(rotating.service_ready().unwrap(), "test-1");
        }
        let stale = RpcClient::<TestInterface>::new(&addr, Timeouts::default());
        let stale = RemoteTest(stale.with_cluster_key(ring(1)));
        assert_eq!(stale.service_ready(), Err(ErrorCode::AuthFailed));
    }

    /// Long polls held open by more clients than there are wait threads never delay a wait
    /// method: they have their own lane.
    #[test]
    fn long_polls_never_take_the_wait_threads() {
        let options = one_shard(&["service_ready"], &["unpin"]);
        let (_server, addr) = serve(
            Arc::new(Rendezvous {
                poll: std::time::Duration::from_secs(3),
                ..Rendezvous::default()
            }),
            options,
        );
        let polls: Vec<_> = (0..2 * crate::rpc::server::WAIT_THREADS)
            .map(|_| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let remote =
                        RemoteTest(RpcClient::<TestInterface>::new(&addr, Timeouts::default()));
                    remote.unpin(Uuid::random(), Vec::new())
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let waiter = RemoteTest(RpcClient::<TestInterface>::new(&addr, Timeouts::default()));
        let asked = std::time::Instant::now();
        assert_eq!(waiter.service_ready().unwrap(), "test-1");
        assert!(
            asked.elapsed() < std::time::Duration::from_millis(1500),
            "the wait call queued behind the polls: {:?}",
            asked.elapsed()
        );
        for poll in polls {
            assert_eq!(poll.join().unwrap(), Ok(()));
        }
    }
}
