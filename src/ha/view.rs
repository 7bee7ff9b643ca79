//! A client's view of its master group ([`LeaderView`], `master_server_addr` =
//! `etcd://h1:2379;h2:2379`): which address leads now and under which view version, read from
//! the etcd key the leader holds (`mooncake-store/<cluster>/master_view`; the cluster from
//! `MC_STORE_CLUSTER_ID`, default `mooncake_cluster`, as upstream).
//!
//! The view is cached and looked up again after a connection to the leader failed, or when a
//! master answers under another view (at most every [`REFRESH_SPACING`]); an etcd that cannot
//! be reached keeps the cached view. As an [`crate::rpc::Resolve`] it steers the master RPC
//! client's new connections. Thread-safe.

use super::etcd::{endpoints, Etcd};
use super::member::view_key;
use crate::error::{fail, ErrorCode, Result};
use crate::rpc::Resolve;
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// The scheme of an HA `master_server_addr`.
pub const ETCD_SCHEME: &str = "etcd://";
/// Shortest time between two lookups of the view.
pub const REFRESH_SPACING: Duration = Duration::from_millis(100);
/// Timeout of each etcd operation of a client.
const ETCD_TIMEOUT: Duration = Duration::from_secs(1);

/// The leader as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    pub address: String,
    /// The view version (the etcd revision that made it leader).
    pub view: u64,
}

struct Cached {
    leader: Option<Leader>,
    stale: bool,
    looked: Option<Instant>,
}

/// See the module documentation.
pub struct LeaderView {
    name: String,
    endpoints: Vec<String>,
    key: String,
    etcd: Mutex<Option<Etcd>>,
    cached: Mutex<Cached>,
}

/// The cluster clients look up (`MC_STORE_CLUSTER_ID`, default `mooncake_cluster`).
fn client_cluster_id() -> String {
    let var = crate::env::STORE_CLUSTER_ID;
    match var.get() {
        Some(id) if !id.trim().is_empty() => id.trim().to_string(),
        _ => var.default.to_string(),
    }
}

/// Whether `master_server_addr` names a master group through etcd.
pub fn is_etcd_addr(addr: &str) -> bool {
    addr.trim().starts_with(ETCD_SCHEME)
}

impl LeaderView {
    /// The view of `etcd://h1:p;h2:p`. Errors: `INVALID_PARAMS` for another form or no
    /// endpoint. Connects lazily.
    pub fn parse(addr: &str) -> Result<LeaderView> {
        let Some(list) = addr.trim().strip_prefix(ETCD_SCHEME) else {
            return fail(
                ErrorCode::InvalidParams,
                format!("{addr:?} is not etcd://..."),
            );
        };
        let endpoints = endpoints(list);
        if endpoints.is_empty() {
            return fail(
                ErrorCode::InvalidParams,
                format!("{addr:?} names no etcd member"),
            );
        }
        Ok(LeaderView {
            name: addr.trim().to_string(),
            endpoints,
            key: view_key(&client_cluster_id()),
            etcd: Mutex::new(None),
            cached: Mutex::new(Cached {
                leader: None,
                stale: true,
                looked: None,
            }),
        })
    }

    /// The `etcd://` string this view was made from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The leader: the cached one, looked up again if marked stale (and not looked up within
    /// [`REFRESH_SPACING`]). Errors: `ETCD_OPERATION_ERROR` when etcd cannot be reached and
    /// nothing is cached; `RPC_FAIL` when no master leads.
    pub fn leader(&self) -> Result<Leader> {
        let mut cached = self.cached.lock();
        let due = cached
            .looked
            .is_none_or(|at| at.elapsed() >= REFRESH_SPACING);
        if (cached.stale || cached.leader.is_none()) && due {
            cached.looked = Some(Instant::now());
            match self.look_up() {
                Ok(leader) => {
                    if leader != cached.leader {
                        tracing::info!(leader = ?leader, "master view");
                    }
                    cached.leader = leader;
                    cached.stale = false;
                }
                Err(code) if cached.leader.is_none() => return Err(code),
                Err(_) => {}
            }
        }
        match &cached.leader {
            Some(leader) => Ok(leader.clone()),
            None => fail(
                ErrorCode::RpcFail,
                format!("no master leads ({})", self.name),
            ),
        }
    }

    /// Marks the cached leader stale: the next [`LeaderView::leader`] looks again.
    pub fn invalidate(&self) {
        self.cached.lock().stale = true;
    }

    fn look_up(&self) -> Result<Option<Leader>> {
        // Kept across failures: it moves on to the next member itself, and starts where the
        // last call was answered.
        let mut etcd = self.etcd.lock();
        if etcd.is_none() {
            *etcd = Some(Etcd::new(&self.endpoints, ETCD_TIMEOUT)?);
        }
        let Some(client) = etcd.as_ref() else {
            return fail(ErrorCode::EtcdOperationError, "no etcd client");
        };
        let found = client.get(&self.key)?;
        Ok(found.map(|v| Leader {
            address: v.value,
            view: v.create_revision,
        }))
    }
}

impl Resolve for LeaderView {
    fn resolve(&self) -> Result<String> {
        self.leader().map(|leader| leader.address)
    }

    fn failed(&self, _addr: &str) {
        self.invalidate();
    }
}
