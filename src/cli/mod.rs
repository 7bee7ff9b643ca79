//! The `mooncake_master`, `mooncake_client` and `mooncake_http_metadata_server` programs as
//! library functions, so the binaries (`src/bin/`: the first two) and the Python wheel's
//! console scripts (`mooncake.store._run_master(sys.argv)`, all three) run the same code.
//! Flags use Mooncake's names; glog's logging flags are accepted too ([`glog`]).

mod client;
mod glog;
mod master;
mod metadata_server;
mod upstream_only;

use crate::metadata::{metadata_handler, MetadataStore};
use crate::rpc::HttpServer;
use clap::Parser;
use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;

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

/// Runs `mooncake_http_metadata_server` with `args` (`args[0]` is the program name): serves
/// Mooncake's HTTP metadata service (as `mooncake_master --enable_http_metadata_server`, on its
/// own) on `--host`/`--port` (0.0.0.0:8080, upstream's defaults), prints `READY host:port` on
/// stdout once listening, and serves until SIGINT/SIGTERM. Exit codes, blocking, signals and
/// logging as [`run_master`].
pub fn run_metadata_server<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run::<metadata_server::Flags, I, T>(args)
}

/// One program: its flags, its name for messages and log files, and its body.
trait Program: Parser + std::fmt::Debug {
    const NAME: &'static str;

    /// Upstream flags of features this program does not have, taken out before clap parses
    /// the rest ([`upstream_only`]).
    const UPSTREAM_ONLY: &'static [upstream_only::UpstreamFlag] = &[];

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
    let (args, ignored) = match upstream_only::take(args, P::UPSTREAM_ONLY) {
        Ok(taken) => taken,
        Err(message) => {
            eprintln!("{}: {message}", P::NAME);
            return 2;
        }
    };
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
    upstream_only::warn_ignored(P::NAME, &ignored);
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

/// The address of `host:port` (the first one it resolves to); `Err` is the message for stderr.
fn socket(host: &str, port: u16) -> Result<SocketAddr, String> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}:{port}: {e}"))?
        .next()
        .ok_or_else(|| format!("no address for {host}:{port}"))
}

/// A server's TLS from `--tls_cert_file` and `--tls_key_file` (both empty: none); `Err` (for
/// stderr) when only one is named or they do not load.
fn server_tls(cert: &str, key: &str) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
    match (cert.trim(), key.trim()) {
        ("", "") => Ok(None),
        ("", _) | (_, "") => {
            Err("--tls_cert_file and --tls_key_file must be given together".into())
        }
        (cert, key) => crate::auth::tls::server_config(Path::new(cert), Path::new(key))
            .map(Some)
            .map_err(|e| format!("TLS: {e}: {}", crate::error::last_error_message())),
    }
}

/// Serves Mooncake's HTTP metadata service (an empty store) on `host:port`, with the
/// process's cluster key (writes and descriptor reads need it) and `tls` when given; warns
/// when a non-loopback address has no key. `Err` is the message for stderr.
fn serve_metadata(
    host: &str,
    port: u16,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<HttpServer, String> {
    let handler = metadata_handler(Arc::new(MetadataStore::default()));
    let addr = socket(host, port)?;
    let key = crate::auth::process_key().map_err(|e| format!("cluster key: {e}"))?;
    let role = crate::auth::ROLE_METADATA;
    crate::auth::warn_if_open(addr, role, key.as_ref());
    HttpServer::start_with(addr, handler, role, key, tls)
        .map_err(|e| format!("cannot serve metadata on port {port}: {e}"))
}
