//! Link settings of the shared library `libmooncake_rs.so`:
//! - SONAME `libmooncake_rs.so.0` (ABI major 0; bumped on an incompatible C ABI change);
//! - a version script that exports only `mc_*` and `mooncake_store_*` and makes every other
//!   symbol local (rustc's own export list already does this; the script states it in one
//!   place and keeps it true if a dependency ever exports a C symbol).
//!
//! The C header is not generated here: `include/mooncake_rs.h` is committed and checked by
//! `tests/ffi_header.rs` (regenerate with `MC_UPDATE_HEADER=1 cargo test --test ffi_header`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/ffi/exports.map");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmooncake_rs.so.0");
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/src/ffi/exports.map");
    }
}
