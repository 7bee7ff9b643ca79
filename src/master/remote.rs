//! The master over the wire: its RPC client (a [`MasterApi`] backed by the generic
//! [`RpcClient`]) and its server glue (the generic [`RpcServer`] serving a `dyn MasterApi`,
//! with the master's table scans on their own threads). `rpc/` knows neither; everything the
//! master adds to the generic wire is here.
//!
//! Thread-safety: every type here is `Send + Sync`; see [`RpcClient`] and [`RpcServer`].

use super::api::{MasterApi, MasterInterface, MasterRequest, MasterResponse, RemoteMaster};
use crate::error::{fail, ErrorCode, Result};
use crate::rpc::server::{ServerLimits, ServerOptions, DEFAULT_WORKER_THREADS};
use crate::rpc::{Call, Resolve, RpcClient, RpcServer, Timeouts};
use crate::types::STORE_VERSION;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The master's transport.
pub type RpcMasterClient = RpcClient<MasterInterface>;

/// A [`MasterApi`] backed by a remote master.
pub type RemoteMasterApi = RemoteMaster<RpcMasterClient>;

/// The master's methods that scan the whole object table: served on the scan threads, so a
/// scan over millions of keys never holds a shard's other connections (pings among them).
pub const MASTER_SCAN_METHODS: &[&str] = &["remove_all", "remove_by_regex"];

/// The standbys' methods, served on the wait threads: `journal_files` waits for new journal
/// records (a long poll) and must not hold a shard; `journal_read` is what a shard's call
/// waiting for a removal to be safe waits for, so it must not queue behind such a call.
pub const MASTER_WAIT_METHODS: &[&str] = &["journal_files", "journal_read"];

/// Long polls of many clients, up to 100 ms each: the SSD tier owners' poll for work
/// (`disk_tasks`), the location caches' poll for revocations (`cache_revocations`) and a
/// writer's wait for them (`await_revocations`): served on the poll threads, never holding a
/// shard nor taking a wait thread from a standby.
pub const MASTER_POLL_METHODS: &[&str] = &["disk_tasks", "cache_revocations", "await_revocations"];

/// Connects to the master at `addr` ("host:port") with timeouts from the environment and
/// returns it as a [`MasterApi`]. Errors as [`RpcMasterClient::connect`].
pub fn connect_master(addr: &str) -> Result<Arc<dyn MasterApi>> {
    Ok(Arc::new(RemoteMaster(RpcMasterClient::connect(addr)?)))
}

/// A [`MasterApi`] for liveness pings alone, to the master at `addr` ("host:port"): its own
/// connection, never shared with data-path calls (a slow call elsewhere cannot hold it), with
/// `timeout` on connecting and on each wait for the answer. Connects lazily, on the first
/// ping; a ping that fails drops its connection, so the next one connects afresh (and lands
/// on another server shard). Thread-safe; meant for one liveness thread. Errors per ping:
/// `RPC_FAIL`, `RPC_TIMEOUT`.
pub fn connect_pinger(addr: &str, timeout: Duration) -> Arc<dyn MasterApi> {
    let timeouts = Timeouts {
        connect: timeout,
        request: timeout,
    };
    Arc::new(RemoteMaster(RpcMasterClient::new(addr, timeouts)))
}

impl RpcClient<MasterInterface> {
    /// Connects to `addr` with [`Timeouts::from_env`] and checks the master's version.
    ///
    /// Errors: `RPC_FAIL` / `RPC_TIMEOUT` if the master cannot be reached, `INVALID_VERSION`
    /// (-300) if its `service_ready` is not [`STORE_VERSION`].
    pub fn connect(addr: &str) -> Result<RpcMasterClient> {
        RpcMasterClient::with_timeouts(addr, Timeouts::from_env())
    }

    /// As [`RpcMasterClient::connect`], with explicit timeouts.
    pub fn with_timeouts(addr: &str, timeouts: Timeouts) -> Result<RpcMasterClient> {
        Self::checked(RpcMasterClient::new(addr, timeouts))
    }

    /// A client of whichever master `resolver` names (an HA group's leader; `name` is the
    /// group's `etcd://` address), with its version checked as [`RpcMasterClient::connect`].
    pub fn resolved_master(
        name: &str,
        resolver: Arc<dyn Resolve>,
        timeouts: Timeouts,
    ) -> Result<RpcMasterClient> {
        Self::checked(RpcMasterClient::resolved(name, resolver, timeouts))
    }

    fn checked(client: RpcMasterClient) -> Result<RpcMasterClient> {
        let addr = client.addr().to_string();
        match client.call(MasterRequest::service_ready {})? {
            MasterResponse::service_ready(Ok(version)) if version == STORE_VERSION => Ok(client),
            MasterResponse::service_ready(Ok(version)) => fail(
                ErrorCode::InvalidVersion,
                format_args!("master {addr} runs version {version}, expected {STORE_VERSION}"),
            ),
            MasterResponse::service_ready(Err(code)) => Err(code),
            other => fail(
                ErrorCode::RpcFail,
                format_args!("unexpected answer to service_ready: {other:?}"),
            ),
        }
    }
}

/// The master's server options: `threads` shards (at least 1), default limits,
/// [`MASTER_SCAN_METHODS`] on the scan threads, [`MASTER_WAIT_METHODS`] on the wait threads,
/// [`MASTER_POLL_METHODS`] on the poll threads.
pub fn server_options(threads: usize) -> ServerOptions {
    ServerOptions {
        threads,
        limits: ServerLimits::default(),
        scan_methods: MASTER_SCAN_METHODS,
        wait_methods: MASTER_WAIT_METHODS,
        poll_methods: MASTER_POLL_METHODS,
        cluster_key: None,
        tls: None,
    }
}

/// Binds `addr` (port 0 picks a free port) and serves `api` with
/// [`DEFAULT_WORKER_THREADS`] shard threads until the server is shut down.
///
/// Errors: `RPC_FAIL` if the address cannot be bound.
pub fn serve(addr: SocketAddr, api: Arc<dyn MasterApi>) -> Result<RpcServer> {
    serve_with_threads(addr, api, DEFAULT_WORKER_THREADS)
}

/// As [`serve`], with `threads` shard threads (at least 1) and [`server_options`].
///
/// Errors: `RPC_FAIL` if the address cannot be bound.
pub fn serve_with_threads(
    addr: SocketAddr,
    api: Arc<dyn MasterApi>,
    threads: usize,
) -> Result<RpcServer> {
    RpcServer::serve_with::<MasterInterface>(addr, api, server_options(threads))
}
