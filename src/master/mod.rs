//! The master: object metadata, segments and their allocators, leases, pins, eviction and
//! client liveness. [`MasterApi`] is its interface; [`MasterService`] the in-process master
//! (lock order and ownership rules in `service.rs`); [`remote`] its RPC client and server glue.
//! It imports no client-side part (client, p2p, node, stream, standalone, ffi).

mod api;
#[cfg(test)]
mod cache_lease_tests;
mod cache_leases;
mod config;
mod deferred;
mod disk_tiers;
mod disks;
mod durability;
mod eviction;
mod journal;
mod liveness;
mod maintenance;
mod metrics;
mod object_key;
mod objects;
mod pins;
mod reads;
pub mod remote;
#[cfg(test)]
mod remote_tests;
mod removal;
mod replicas;
#[cfg(test)]
mod restart_tests;
mod route_claims;
mod routes;
mod segments;
mod service;
mod stamp;
pub mod standby;
#[cfg(test)]
mod standby_tests;
mod stripes;
mod table;
mod workers;
pub(crate) use workers::Workers;
mod writes;

#[cfg(test)]
mod integrity_tests;
#[cfg(test)]
mod tests;

pub use api::{
    ForwardMaster, MasterApi, MasterInterface, MasterRequest, MasterResponse, RemoteMaster,
};
pub use config::{MasterConfig, DEFAULT_LOCATION_CACHE_START_GRACE_MS};
pub(crate) use journal::Follower;
pub use journal::{JournalFile, JournalMetrics, JournalOptions};
pub use metrics::{DiskTierMetrics, LocationCacheMetrics, MasterMetrics, SegmentMetrics};
pub use remote::{
    connect_master, connect_pinger, RemoteMasterApi, RpcMasterClient, MASTER_POLL_METHODS,
    MASTER_SCAN_METHODS, MASTER_WAIT_METHODS,
};
pub use service::MasterService;
