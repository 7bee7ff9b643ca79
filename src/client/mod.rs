//! The RealClient as a safe Rust API: [`Client::setup`], the put/upsert/get families,
//! sessions, ranges, removal and registration. Return conventions follow Mooncake
//! (`../shared/spec/mooncake-api.md` §1, §8), expressed as `Result`s: a batch returns one
//! result per key, in order.
//!
//! Thread-safety: a [`Client`] is `Send + Sync + Clone`; all methods take `&self`.
//! Buffers passed in are borrowed for the duration of the call only.
//!
//! Device memory: the slice-based methods take host memory (a Rust slice over device memory
//! would be undefined behaviour). The `unsafe` `*_raw` methods take [`Buf`] address ranges
//! that may be host or device memory; the C API uses them for every put/get path.

mod buffer;
mod core;
mod counters;
mod disk_read;
mod dummy;
mod http_server;
mod location_cache;
mod location_renewal;
mod metrics;
mod on_stream;
mod on_stream_put;
mod pins;
mod plan;
mod ranges;
mod read;
mod remove;
mod revocation_poll;
mod revocation_wait;
mod session_table;
mod sessions;
mod write;

pub use crate::env::parse_size;
pub use crate::node::{ssd_offload_dir, LocalAlloc, SetupConfig};
pub use crate::types::{EMBEDDED_MASTER, P2P_HANDSHAKE};
pub use buffer::BufferHandle;
pub use core::{health, Client};
pub use http_server::ClientHttpServer;
pub use location_cache::LocationCacheStats;
pub use metrics::{ClientMetrics, GetBufferStats, SsdTierMetrics};
pub use plan::Buf;
pub use ranges::RangeRequest;
pub use write::WriteMode;
