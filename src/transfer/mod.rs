//! The transfer engine: a table of registered memory and the transports (local copy, TCP)
//! that move bytes between a local buffer and a (possibly remote) registered address.
//!
//! Modules, one job each: `registry` (registered ranges), [`copy`] (the single primitive
//! that copies caller memory — route every such copy in the crate through it), `wire`
//! (Mooncake's TCP v2 framing), `server` (serving peers), `pool` (outgoing connections, one
//! slice at a time), `staging` (pinned bounce buffers for device memory over TCP), `batch` (slicing and the worker pool), `resolver` (segment name →
//! socket address), `same_host` (mapping a same-host peer's segment instead of TCP), `metrics` (counters), `settings` (environment tunables) and `engine`
//! ([`TransferEngine`]).

mod batch;
pub mod copy;
mod engine;
mod gather;
mod metrics;
mod pool;
pub mod rdma;
mod registry;
mod resolver;
mod same_host;
mod server;
pub(crate) mod settings;
mod socket;
mod staging;
pub mod wire;

#[cfg(test)]
mod tests;

pub use engine::{EngineConfig, TransferDelegate, TransferEngine, TransferOp, TransferRequest};
pub use metrics::{CopyPaths, PathStats, TransferMetrics};
pub use registry::{MemoryRegion, MAX_EPOCH};
pub use resolver::{DirectResolver, SegmentResolver};
pub(crate) use same_host::hung_up;
