//! The process's cluster key: the key file its setup or flags name ([`use_key_file`]), else
//! `MC_CLUSTER_KEY_FILE`, else none. Clients and servers built without an explicit key take
//! this one ([`process_key`]).
//!
//! Fails closed: a key file that cannot be loaded makes [`process_key`] an error, so every
//! connection that would have used it fails `AUTH_FAILED` instead of opening without a key.
//! Thread-safety: set at most once (the first setter or reader fixes it).

use super::keys::KeyRing;
use crate::env;
use crate::error::{fail, ErrorCode, Result};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The process's key: none, a ring loaded from `path`, or the error loading `path` gave.
enum ProcessKey {
    None,
    Ring(PathBuf, Arc<KeyRing>),
    Broken(PathBuf, ErrorCode),
}

static PROCESS_KEY: OnceLock<ProcessKey> = OnceLock::new();

fn load(path: &Path) -> ProcessKey {
    match KeyRing::load(path) {
        Ok(ring) => ProcessKey::Ring(path.to_path_buf(), ring),
        Err(code) => ProcessKey::Broken(path.to_path_buf(), code),
    }
}

fn from_env() -> ProcessKey {
    match env::CLUSTER_KEY_FILE.get().filter(|p| !p.trim().is_empty()) {
        Some(path) => load(Path::new(path.trim())),
        None => ProcessKey::None,
    }
}

/// Makes `path` the process's key file (a setup field or a binary's `--cluster_key_file`).
/// Naming the file already in use is fine.
///
/// Errors: as [`KeyRing::load`]; `INVALID_PARAMS` when the process already uses another key
/// file, or none (a connection was made without one).
pub fn use_key_file(path: &Path) -> Result<Arc<KeyRing>> {
    let key = PROCESS_KEY.get_or_init(|| load(path));
    match key {
        ProcessKey::Ring(used, ring) if used == path => Ok(ring.clone()),
        ProcessKey::Broken(used, code) if used == path => {
            fail(*code, format_args!("cluster key file {}: not usable", path.display()))
        }
        ProcessKey::Ring(used, _) | ProcessKey::Broken(used, _) => fail(
            ErrorCode::InvalidParams,
            format_args!(
                "this process already uses the cluster key file {}, not {}",
                used.display(),
                path.display()
            ),
        ),
        ProcessKey::None => fail(
            ErrorCode::InvalidParams,
            "this process already connects without a cluster key; name the key file before the first connection (or in MC_CLUSTER_KEY_FILE)",
        ),
    }
}

/// Logs a warning (and counts it in `open_listeners`) when a `service` listening on `addr`
/// takes connections from other hosts without a cluster key (anything that reaches the port
/// may use it).
pub fn warn_if_open(addr: std::net::SocketAddr, service: &str, key: Option<&Arc<KeyRing>>) {
    if key.is_none() && !addr.ip().is_loopback() {
        super::refusals::open_listener();
        tracing::warn!(%addr, service, "listening beyond this host without a cluster key: any host that reaches this port can use it (set --cluster_key_file or MC_CLUSTER_KEY_FILE; README, \"Cluster key\")");
    }
}

/// The process's key ring, if it has a key (fixing it from `MC_CLUSTER_KEY_FILE` on the
/// first call when no setup named one).
///
/// Errors: `AUTH_FAILED` when the key file could not be loaded (fail closed).
pub fn process_key() -> Result<Option<Arc<KeyRing>>> {
    match PROCESS_KEY.get_or_init(from_env) {
        ProcessKey::None => Ok(None),
        ProcessKey::Ring(_, ring) => Ok(Some(ring.clone())),
        ProcessKey::Broken(path, code) => fail(
            ErrorCode::AuthFailed,
            format_args!(
                "cluster key file {} could not be loaded ({code})",
                path.display()
            ),
        ),
    }
}
