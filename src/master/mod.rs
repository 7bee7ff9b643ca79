//! The master: object metadata, segments and their allocators, leases, pins, eviction and
//! client liveness. [`MasterApi`] is its interface; [`MasterService`] the in-process master
//! (lock order and ownership rules in `service.rs`).

mod api;
mod config;
mod deferred;
mod eviction;
mod liveness;
mod maintenance;
mod metrics;
mod objects;
mod pins;
mod reads;
mod removal;
mod route_claims;
mod routes;
mod segments;
mod service;
mod workers;
pub(crate) use workers::Workers;
mod writes;

#[cfg(test)]
mod integrity_tests;
#[cfg(test)]
mod tests;

pub use api::{MasterApi, MasterInterface, MasterRequest, MasterResponse, RemoteMaster};
pub use config::MasterConfig;
pub use metrics::{MasterMetrics, SegmentMetrics};
pub use service::MasterService;
