//! mooncake-rs: the Mooncake Store client layer in Rust, exported as a C ABI.
//!
//! Module map (see `../shared/DESIGN.md`): [`ffi`] is the C surface; [`client`] is the
//! RealClient; [`master`] keeps metadata; [`transfer`] moves bytes; [`rpc`] is the only
//! module that knows the wire.

pub mod alloc;
pub mod cli;
pub mod client;
pub mod device;
pub mod env;
pub mod error;
pub mod ffi;
pub mod master;
pub mod metadata;
mod node;
pub mod p2p;
mod process;
pub mod rpc;
pub mod shm;
pub mod spin;
pub mod standalone;
mod storage;
pub mod stream;
#[cfg(test)]
mod test_util;
pub mod transfer;
pub mod types;

pub use error::{ErrorCode, Result};
pub use process::{init_logging, init_logging_with, wait_for_termination};
