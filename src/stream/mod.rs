//! Layer-wise loads on a caller's stream (seed 000): `*_on_stream` calls return without
//! waiting for the data; the caller's stream (a CUDA stream, an ACL stream or one of our
//! [`HostStream`]s) reaches any point enqueued after the call only once the data is in the
//! caller's buffers — or the call's [`Ticket`] says why not.
//!
//! What a call puts on the stream, in order (`../shared/spec/streams.md` §5):
//! 1. copies from replicas already in this process (the mounted segment, pinned at setup);
//! 2. if any key is remote: a *gate* — a wait on a pinned, device-mapped word that a fetch
//!    worker opens once it has read the remote bytes into pinned staging (or on failure,
//!    timeout or teardown, after writing the status) — then copies from staging;
//! 3. a *release marker*: a host function that hands the ticket to the housekeeper, which
//!    unpins the replicas and frees staging. Until then the replicas stay pinned, so
//!    eviction or a forced remove never changes bytes a stream may still read.
//!
//! The call itself never waits for a transfer, allocates pinned memory or synchronizes a
//! device: gate words and staging come from slabs allocated at setup; when they run out the
//! call fails with `TRY_AGAIN`.
//!
//! Modules: `host` (host streams and events), `slab` (gate/status words), `staging`
//! (pinned staging), `ticket` (per-call state), `workers` (the fetch pool and its hand-off of
//! overdue fetches), `unpin` (batched, asynchronous unpins), `engine` (housekeeper, deadline
//! timer, enqueueing).

mod engine;
mod host;
mod slab;
mod staging;
mod ticket;
mod unpin;
mod workers;

pub(crate) use engine::{Copy, Fetch, Plan, StreamConfig, StreamEngine, Target};
pub use engine::{StreamMetrics, StreamRef};
pub use host::{HostEvent, HostStream};
pub(crate) use slab::GateSlot;
pub use slab::TICKET_PENDING;
pub(crate) use staging::StagingBuf;
pub use ticket::Ticket;
pub(crate) use ticket::{Hold, TicketState};
