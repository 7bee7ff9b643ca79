//! The `mooncake_master` and `mooncake_client` programs as library functions, so the binaries
//! and the Python wheel's console scripts (`mooncake.store._run_master(sys.argv)`) run the same
//! code. Flags use Mooncake's names; glog's logging flags are accepted too ([`glog`]).

mod client;
mod glog;
mod master;

use clap::Parser;
use std::ffi::OsString;

/// Runs `mooncake_master` with `args` (`args[0]` is the program name, as in `argv`): serves
/// until SIGINT/SIGTERM and returns the exit code. 0 after a signal, and for `--help` /
/// `--version`; 2 for a flag error (unknown flag, bad value; printed on stderr); 1 if the
/// master cannot start (`mooncake_master: <message>` on stderr).
///
/// Blocks the calling thread, and listens for SIGINT/SIGTERM itself. Never exits the process.
/// Installs the process's logging once (see [`crate::init_logging_with`]); if logging is
/// already set up, that set-up stays and the logging flags change nothing. Meant to be called
/// once per process.
pub fn run_master<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run::<master::Flags, I, T>(args)
}

/// Runs `mooncake_client` with `args` (`args[0]` is the program name): mounts a segment (or,
/// with `--deployment_mode P2P`, becomes a P2P owner), prints `READY ...` on stdout, serves
/// until SIGINT/SIGTERM and returns the exit code: 0 after a signal and for `--help` /
/// `--version`, 2 for a flag error, 1 if setup fails (`mooncake_client: <message>` on stderr).
///
/// Same blocking, signal, logging and once-per-process rules as [`run_master`].
pub fn run_client<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run::<client::Flags, I, T>(args)
}

/// One program: its flags, its name for messages and log files, and its body.
trait Program: Parser + std::fmt::Debug {
    const NAME: &'static str;

    /// The glog logging flags among the program's flags.
    fn glog(&self) -> &glog::GlogFlags;

    /// Checks what clap cannot (flags that need each other's values); `Err` is a flag error
    /// (exit 2).
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    /// Runs until a termination signal; `Err` carries the message for stderr.
    fn run(self) -> Result<(), String>;
}

fn run<P: Program, I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let flags = match P::try_parse_from(args) {
        Ok(flags) => flags,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    if let Err(message) = flags.validate() {
        eprintln!("{}: {message}", P::NAME);
        return 2;
    }
    // Before any thread starts, so every thread inherits the mask.
    crate::process::hold_termination_signals();
    flags.glog().init_logging(P::NAME);
    tracing::debug!(?flags, "{} flags", P::NAME);
    match flags.run() {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("{}: {message}", P::NAME);
            1
        }
    }
}

/// Makes `path` (a `--cluster_key_file`) the process's cluster key file, or, when empty,
/// checks that `MC_CLUSTER_KEY_FILE` (if set) loads; `Err` is the message for stderr.
fn use_cluster_key(path: &str) -> Result<(), String> {
    let used = match path.trim() {
        "" => crate::auth::process_key().map(|_| ()),
        path => crate::auth::use_key_file(std::path::Path::new(path)).map(|_| ()),
    };
    used.map_err(|e| format!("cluster key: {e}: {}", crate::error::last_error_message()))
}

/// Makes `path` (a `--tls_ca_file`) the certificates the process trusts for TLS to the master
/// and `https://` metadata, or, when empty, checks that `MC_TLS_CA_FILE` (if set) loads;
/// `Err` is the message for stderr.
fn use_tls_ca(path: &str) -> Result<(), String> {
    let used = match path.trim() {
        "" => crate::auth::tls::process_client_config().map(|_| ()),
        path => crate::auth::tls::use_ca_file(std::path::Path::new(path)),
    };
    used.map_err(|e| format!("TLS: {e}: {}", crate::error::last_error_message()))
}
