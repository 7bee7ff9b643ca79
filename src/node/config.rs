//! Setup arguments of a client (Mooncake's `setup_real`) and their validation.

use crate::error::{fail, ErrorCode, Result};
use crate::types::P2P_HANDSHAKE;

/// Default segment and local buffer size (16 MiB, as Mooncake).
pub(super) const DEFAULT_SIZE: u64 = 16 * 1024 * 1024;
/// Largest local buffer Mooncake accepts (1 TiB).
pub(super) const MAX_LOCAL_BUFFER_SIZE: u64 = 1 << 40;

/// Everything `setup` takes. Plain data; validated by [`SetupConfig::validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetupConfig {
    /// This client's name, `host` or `host:port`. Without a port one is picked in
    /// `[MC_STORE_CLIENT_MIN_PORT, MC_STORE_CLIENT_MAX_PORT]` (12300..14300). Required.
    pub local_hostname: String,
    /// `P2PHANDSHAKE`, or `http://host:port/metadata` (the master's HTTP metadata server).
    pub metadata_server: String,
    /// Bytes this client contributes to the pool (0, or ≥ 1024).
    pub global_segment_size: u64,
    /// Bytes of the registered local buffer used by `put` and `get_buffer` (0, or 1024..=1 TiB).
    pub local_buffer_size: u64,
    /// Transport protocol: `tcp` (or empty), or `rdma` (one-sided verbs; libibverbs is
    /// loaded at setup, which fails naming the problem when it or the device is missing).
    pub protocol: String,
    /// RDMA device names, comma-separated as Mooncake's (the first is used; empty: the first
    /// device listed). Unused by TCP.
    pub device_name: String,
    /// `host:port` of the master, or `embedded` / empty for the in-process master.
    pub master_server_addr: String,
    /// The SSD tier's directory (Mooncake's `ssd_offload_path`); empty: no SSD tier. Needs a
    /// segment (the tier holds what the master evicts from it). See `docs/ssd-tier.md`.
    pub ssd_offload_path: String,
    /// The cluster key file (`auth/keys.rs` has the format): every connection of this
    /// process opens with the key's handshake. Empty: `MC_CLUSTER_KEY_FILE`, else no key.
    /// One key file per process: a second setup naming another fails `INVALID_PARAMS`.
    pub cluster_key_file: String,
}

impl Default for SetupConfig {
    fn default() -> Self {
        SetupConfig {
            local_hostname: "localhost".into(),
            metadata_server: P2P_HANDSHAKE.into(),
            global_segment_size: DEFAULT_SIZE,
            local_buffer_size: DEFAULT_SIZE,
            protocol: "tcp".into(),
            device_name: String::new(),
            master_server_addr: "127.0.0.1:50051".into(),
            ssd_offload_path: String::new(),
            cluster_key_file: String::new(),
        }
    }
}

/// The SSD tier directory a setup asks for (Mooncake's `enable_ssd_offload` and
/// `ssd_offload_path`): none unless `enable`; then `path`, or when empty
/// `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`. Errors: `INVALID_PARAMS` when enabled with neither.
pub fn ssd_offload_dir(enable: bool, path: &str) -> Result<String> {
    if !enable {
        return Ok(String::new());
    }
    let dir = match path.trim() {
        "" => crate::env::OFFLOAD_FILE_STORAGE_PATH
            .get()
            .unwrap_or_default(),
        given => given.to_string(),
    };
    if dir.is_empty() {
        return fail(
            ErrorCode::InvalidParams,
            "enable_ssd_offload needs ssd_offload_path or MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
        );
    }
    Ok(dir)
}

/// How the client finds the byte endpoints of other clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataMode {
    /// Segment names are `host:port` data addresses.
    P2pHandshake,
    /// Descriptors published to / read from Mooncake's HTTP metadata service at this URL.
    Http(String),
}

impl SetupConfig {
    /// Makes [`cluster_key_file`](Self::cluster_key_file) the process's key (or, when empty,
    /// checks that `MC_CLUSTER_KEY_FILE`, if set, loads), before any connection is made.
    ///
    /// Errors: as [`crate::auth::use_key_file`] and [`crate::auth::process_key`].
    pub fn use_cluster_key(&self) -> Result<()> {
        match self.cluster_key_file.trim() {
            "" => crate::auth::process_key().map(drop),
            path => crate::auth::use_key_file(std::path::Path::new(path)).map(drop),
        }
    }

    /// Whether `protocol` selects the RDMA transport.
    pub fn uses_rdma(&self) -> bool {
        self.protocol.trim() == "rdma"
    }

    /// True when `master_server_addr` selects the in-process master.
    pub fn is_embedded(&self) -> bool {
        super::master_link::is_embedded_addr(&self.master_server_addr)
    }

    /// Checks every argument; `INVALID_PARAMS` with a detail on the first bad one.
    pub fn validate(&self) -> Result<MetadataMode> {
        if self.local_hostname.trim().is_empty() {
            return fail(ErrorCode::InvalidParams, "local_hostname is empty");
        }
        if self.global_segment_size != 0 && self.global_segment_size < 1024 {
            return fail(
                ErrorCode::InvalidParams,
                format!(
                    "global_segment_size {} must be 0 or at least 1024",
                    self.global_segment_size
                ),
            );
        }
        if self.local_buffer_size != 0
            && !(1024..=MAX_LOCAL_BUFFER_SIZE).contains(&self.local_buffer_size)
        {
            return fail(
                ErrorCode::InvalidParams,
                format!(
                    "local_buffer_size {} must be 0 or in [1024, 1 TiB]",
                    self.local_buffer_size
                ),
            );
        }
        if !self.ssd_offload_path.is_empty() && self.global_segment_size == 0 {
            return fail(
                ErrorCode::InvalidParams,
                "ssd_offload_path needs a segment (global_segment_size > 0): the SSD tier holds what is evicted from it",
            );
        }
        let protocol = self.protocol.trim();
        if !(protocol.is_empty() || protocol == "tcp" || protocol == "rdma") {
            return fail(
                ErrorCode::InvalidParams,
                format!("protocol '{protocol}' is not built in; use 'tcp' or 'rdma'"),
            );
        }
        let metadata = self.metadata_server.trim();
        if self.is_embedded() || metadata.is_empty() || metadata == P2P_HANDSHAKE {
            return Ok(MetadataMode::P2pHandshake);
        }
        if metadata.starts_with("http://") || metadata.starts_with("https://") {
            return Ok(MetadataMode::Http(metadata.to_string()));
        }
        fail(
            ErrorCode::InvalidParams,
            format!(
                "metadata_server '{metadata}' is not supported; use P2PHANDSHAKE or http[s]://host:port/metadata"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_matches_spec() {
        let ok = SetupConfig::default();
        assert_eq!(ok.validate(), Ok(MetadataMode::P2pHandshake));
        let bad = |f: &dyn Fn(&mut SetupConfig)| {
            let mut c = SetupConfig::default();
            f(&mut c);
            c.validate()
        };
        assert_eq!(
            bad(&|c| c.local_hostname.clear()),
            Err(ErrorCode::InvalidParams)
        );
        assert_eq!(
            bad(&|c| c.global_segment_size = 10),
            Err(ErrorCode::InvalidParams)
        );
        assert!(bad(&|c| c.global_segment_size = 0).is_ok());
        assert_eq!(
            bad(&|c| c.local_buffer_size = 1023),
            Err(ErrorCode::InvalidParams)
        );
        assert_eq!(
            bad(&|c| c.protocol = "nvlink".into()),
            Err(ErrorCode::InvalidParams)
        );
        assert!(bad(&|c| c.protocol = "rdma".into()).is_ok());
        assert_eq!(
            bad(&|c| c.metadata_server = "127.0.0.1:2379".into()),
            Err(ErrorCode::InvalidParams)
        );
        assert_eq!(
            bad(&|c| c.metadata_server = "http://127.0.0.1:8080/metadata".into()),
            Ok(MetadataMode::Http("http://127.0.0.1:8080/metadata".into()))
        );
        let mut embedded = SetupConfig {
            master_server_addr: "embedded".into(),
            ..SetupConfig::default()
        };
        assert!(embedded.is_embedded());
        embedded.master_server_addr = String::new();
        assert!(embedded.is_embedded());
    }
}
