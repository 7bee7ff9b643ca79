//! The console scripts' native halves: `mooncake_master` and `mooncake_client` run this
//! crate's binaries' code inside the interpreter (`mooncake.cli`, `mooncake.cli_client`), so
//! the wheel needs no separate executables. Each blocks (GIL released) until SIGINT/SIGTERM
//! and returns the exit code; meant to be called once per process.

use pyo3::prelude::*;

/// `mooncake_master` with `argv` (argv[0] included): the process exit code (0 after a
/// signal, 2 for a bad flag, 1 for a run error).
#[pyfunction]
pub fn _run_master(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| mooncake_rs::cli::run_master(argv))
}

/// `mooncake_client` with `argv` (argv[0] included): the process exit code.
#[pyfunction]
pub fn _run_client(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| mooncake_rs::cli::run_client(argv))
}

/// `mooncake_http_metadata_server` with `argv` (argv[0] included): the process exit code.
#[pyfunction]
pub fn _run_metadata_server(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| mooncake_rs::cli::run_metadata_server(argv))
}
