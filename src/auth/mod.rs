//! The cluster key: when one is set, every connection between mooncake-rs processes opens
//! with a mutual challenge–response (HMAC-SHA-256 over fresh nonces of both sides and the
//! service's role) before any request is read, so a host that can reach a port but does not
//! hold the key can neither read nor write anything through it. Without a key, connections
//! are as before (upstream compatibility).
//!
//! - [`keys`]: the key file (hex keys, the first connects, two accepted while rotating) and
//!   [`KeyRing`], which follows the file.
//! - [`protocol`]: the messages and proofs, pure (fuzzed).
//! - [`io`]: the handshake over blocking and async streams, both sides.
//! - [`admission`]: the key a connection proved, so a retired key's connections close.
//! - [`refusals`]: process-wide counters, and a log of refused peers limited to once a minute.
//! - [`tls`]: optional TLS for the master RPC and the metadata HTTP service.
//! - `process`: the process's key ([`use_key_file`] from a setup or flag, else
//!   `MC_CLUSTER_KEY_FILE`), which clients and servers take unless given one explicitly. One
//!   key file per process.
//!
//! A ground-floor module: it knows no caller; `rpc`, `transfer`, `standalone` and `metadata`
//! use it for their connections.

/// The role of the transfer engine's data port (TCP transfers and the RDMA side channel, which
/// arrives on the same port).
pub const ROLE_DATA: &str = "transfer-data";
/// The role of the same-host channel's socket (segments mapped by processes of this host).
pub const ROLE_SAME_HOST: &str = "same-host";
/// The role of a real client's socket for its dummies (the standalone layout).
pub const ROLE_STANDALONE: &str = "standalone";
/// The role of the HTTP metadata service (segment descriptors and endpoints).
pub const ROLE_METADATA: &str = "http-metadata";

pub mod admission;
pub mod io;
pub mod keys;
mod process;
pub mod protocol;
pub mod refusals;
pub mod tls;

pub use admission::{wait_admitted, Admission, KeyId, Waited};
pub use io::{client_async, client_blocking, server_async, server_blocking, HANDSHAKE_TIMEOUT};
pub use keys::{Key, KeyRing, Keys};
pub use process::{process_key, use_key_file, warn_if_open};
pub use refusals::{counters, prometheus_text, AuthCounters};

/// A ring of one key whose 32 bytes are all `byte` (tests: equal bytes, equal keys).
#[cfg(test)]
pub(crate) fn test_ring(byte: u8) -> std::sync::Arc<KeyRing> {
    KeyRing::fixed(Keys::from_keys(vec![Key::new(vec![byte; 32]).unwrap()]).unwrap())
}

/// A cluster key file in a directory of its own, rewritten by tests that rotate keys. Its
/// keys are 32 bytes each, every byte equal (key `1` is `[1; 32]`, as `auth::test_ring(1)`).
#[cfg(test)]
pub(crate) struct KeyFile {
    _dir: crate::test_util::TempDir,
    path: std::path::PathBuf,
}

#[cfg(test)]
impl KeyFile {
    /// A file listing `keys` (the first is the one its process connects with).
    pub(crate) fn new(keys: &[u8]) -> KeyFile {
        let dir = crate::test_util::TempDir::new("key-file");
        let path = dir.path().join("cluster.key");
        let file = KeyFile { _dir: dir, path };
        file.list(keys);
        file
    }

    /// Rewrites the file to list `keys`.
    pub(crate) fn list(&self, keys: &[u8]) {
        let lines: Vec<String> = keys.iter().map(|b| format!("{b:02x}").repeat(32)).collect();
        std::fs::write(&self.path, lines.join("\n") + "\n").expect("a key file");
    }

    /// A ring following the file.
    pub(crate) fn ring(&self) -> std::sync::Arc<KeyRing> {
        KeyRing::load(&self.path).expect("a key file")
    }
}
