//! The transfer engine: a table of registered memory and the transports that move bytes
//! between a local buffer and a (possibly remote) registered address. It knows no keys and
//! none of the client, master, RPC, standalone or stream layers.
//!
//! Modules, one job each: `registry` (registered ranges), [`copy`] (the single primitive
//! that copies caller memory — route every such copy in the crate through it), `transport`
//! (the vocabulary the transports share: `Opcode`, `Slice`, `SliceError`), the transports as
//! siblings — `tcp` (Mooncake's TCP v2: wire, server, pool), [`rdma`] (one-sided verbs) and
//! `same_host` (mapping a same-host peer's segment instead of TCP) — then `staging` (pinned
//! bounce buffers for device memory over TCP), `batch` (slicing and the worker pool),
//! `resolver` (segment name → socket address), `metrics` (counters), `settings` (environment
//! tunables) and `engine` ([`TransferEngine`]).

mod batch;
pub mod copy;
mod engine;
mod gather;
mod metrics;
pub mod rdma;
mod registry;
mod resolver;
mod same_host;
pub(crate) mod settings;
mod staging;
mod tcp;
mod transport;

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;

pub use engine::{EngineConfig, TransferDelegate, TransferEngine, TransferOp, TransferRequest};
pub use metrics::{CopyPaths, PathStats, TransferMetrics};
pub(crate) use registry::MountHold;
pub use registry::{MemoryRegion, MAX_EPOCH};
pub use resolver::{DirectResolver, SegmentResolver};
pub(crate) use same_host::hung_up;
pub use tcp::wire;

/// The fuzz crate's entry to the handshake decoders: the same-host hello and welcome, the RDMA
/// handshake's request payload and its reply as the initiator reads it, and a notification's
/// payload. Not an API.
#[doc(hidden)]
pub fn fuzz_handshakes(data: &[u8]) {
    same_host::fuzz_handshake(data);
    rdma::fuzz_handshake(data);
    let _ = tcp::control::decode_notify(data);
}

/// Parts (and connections) a TCP request of `len` bytes to one peer is split into by an
/// engine made now (`MC_TCP_LANES_PER_PEER`, parts of at least 1 MiB): for benchmarks that
/// measure a like-for-like raw TCP limit.
pub fn tcp_parts(len: u64) -> usize {
    batch::split(len, settings::Settings::from_env().lanes).count()
}
