//! The master: object metadata, segments and their allocators, leases, pins, eviction and
//! client liveness. [`MasterApi`] is its interface.

mod api;

pub use api::{MasterApi, MasterCall, MasterRequest, MasterResponse, RemoteMaster};
