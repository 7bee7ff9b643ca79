//! mooncake-rs: the Mooncake Store client layer in Rust, exported as a C ABI.
//!
//! The modules are floors (`../shared/DESIGN.md` §1); each may use only floors below it (or
//! its own floor where no circle forms), and `tests/layering.rs` fails the build's tests on a
//! `crate::<part>` path that breaks these rules. Top first:
//!
//! - [`cli`], [`ffi`]: the binaries' flags and process life; the C surface (`mc_*` and
//!   Mooncake's `mooncake_store_*`): argument checks, the panic boundary, handles. Nothing below
//!   names `ffi`.
//! - [`client`], [`p2p`], [`transfer_api`]: the centralized client (Mooncake's RealClient), the
//!   P2P (V3) client (owner and accessor flows) and the transfer engine on its own (upstream's
//!   `mooncake.engine.TransferEngine`). May use everything below.
//! - `node`: one process handle's plumbing shared by both clients (setup config, engine
//!   bootstrap, local buffer, own segment, the master link and its single liveness loop).
//!   Never names `client` or `p2p`.
//! - [`stream`], [`standalone`], [`ha`]: the on-stream engine; dummy clients' link and the real
//!   client's server for them; HA on etcd (a master group's election and fence, standbys
//!   copying the journal, clients following `etcd://`).
//! - [`master`], `metadata`, `storage`: the metadata service (with `master::remote`, its RPC
//!   glue); Mooncake's HTTP metadata service; storage tiers (the `Tier` seam). `master` names
//!   no client-side part.
//! - [`transfer`]: the engine and its sibling transports (local copy, TCP, RDMA, same-host).
//!   Names none of `client`, `master`, `rpc`, `standalone`, `stream`: it knows no keys.
//! - [`rpc`], [`device`], `shm`: the generic wire (names neither `master` nor `transfer`);
//!   device runtimes and copies (names neither `transfer` nor `stream`); shared memory files.
//! - Ground: [`types`], [`error`], `env` (every environment variable the library reads),
//!   [`alloc`] (the offset allocator), [`spin`] (deadlines and awake waits), `process`,
//!   [`auth`] (the cluster key and the connection handshake every network part uses).
//!
//! The public modules are the API of the bindings, the binaries and the tests; the others are
//! `pub(crate)`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]

pub mod alloc;
pub mod auth;
pub mod cli;
pub mod client;
pub mod device;
pub(crate) mod env;
pub mod error;
pub mod ffi;
pub mod ha;
pub mod master;
pub(crate) mod metadata;
pub(crate) mod node;
pub mod p2p;
mod process;
pub mod rpc;
pub(crate) mod shm;
pub mod spin;
pub mod standalone;
pub mod storage;
pub mod stream;
#[cfg(test)]
mod test_util;
pub mod transfer;
pub mod transfer_api;
pub mod types;

pub use error::{ErrorCode, Result};
pub use process::{init_logging, init_logging_with, wait_for_termination};
