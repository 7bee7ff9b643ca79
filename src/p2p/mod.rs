//! P2P (V3) deployment with bidirectional transfer (seed 003).
//!
//! The master keeps routes only (key → owner client, size). Owners store values in their
//! own TieredBackend and serve them through the client RPC service; accessors move bytes
//! with transfer engines, never through the RPC channel.
//!
//! Files, one job each: [`config`] (setup arguments, tier JSON, direction), `tiered`
//! (TieredBackend: tiers and committed keys), `records` (sharded lease tables), `registration` (whether the master still routes
//! this owner's keys: reads stop when it may not), `quarantine` (space
//! held until no failed or expired transfer can touch it), `owner`
//! (DataManager: the stage operations), [`api`] (the owner RPC list), `routing` (accessor
//! routes and owner connections), `accessor` (FORWARD / REVERSE flows), [`counters`] and
//! `client` ([`P2pClient`]).

mod accessor;
pub mod api;
mod client;
pub mod config;
pub mod counters;
mod owner;
mod quarantine;
mod records;
mod registration;
mod routing;
mod tiered;

pub use accessor::{FaultInjection, CLEANUP_RETRIES};
pub use api::{
    PeerApi, PeerInterface, PeerRequest, PeerResponse, ReadGrant, RemoteBufferDesc, RemotePeer,
    RemoteRead, RemoteWrite, WriteGrant,
};
pub use client::{P2pClient, RequestOptions};
pub use config::{P2pSetupConfig, TieredConfig, TransferDirection, QUARANTINE_ENV};
pub use counters::P2pCounters;
pub use owner::DEBUG_TRANSFER_DELAY_ENV;
pub use registration::{FENCE_AFTER, MASTER_ROUTE_GRACE};
