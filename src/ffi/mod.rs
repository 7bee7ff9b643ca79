//! The C surface: `mc_*` (our API, declared by the generated `include/mooncake_rs.h`) and
//! Mooncake's `mooncake_store_*` (declared by `include/store_c.h`).
//!
//! One file per C object family; the plumbing modules are private:
//! - [`panic`]: the boundary every exported body runs in (panic → -1, handle poisoned);
//! - [`check`]: every pointer and length from C passes through it (→ -600 + message);
//! - [`batch`]: the results contract of batch functions and nested-array unpacking.
//!
//! Every exported function is a literal `#[no_mangle] pub extern "C" fn` (so cbindgen sees
//! it) whose body is one `ffi_boundary!` call. They are safe Rust functions taking raw
//! pointers, as C sees them: their contract is the one stated in the header (pointers valid
//! for the sizes given), and every other misuse is rejected with an error code.

#![allow(non_camel_case_types)]
// The exported functions check every pointer before use; their remaining contract (a
// non-NULL pointer is valid for the length given) is C's and is stated in the header.
#![allow(clippy::not_unsafe_ptr_arg_deref)]
// Several functions mirror Mooncake's wide signatures.
#![allow(clippy::too_many_arguments)]

mod batch;
pub mod buffer;
mod check;
pub mod config;
pub mod error;
mod handle;
pub mod p2p;
mod panic;
pub mod standalone;
pub mod store;
pub mod store_admin;
pub mod store_c;
pub mod store_get;
pub mod store_put;
pub mod store_session;
pub mod store_stream;
pub mod stream;
