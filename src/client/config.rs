//! Setup arguments of a client (Mooncake's `setup_real`) and their validation.

use crate::error::{fail, ErrorCode, Result};

/// Default segment and local buffer size (16 MiB, as Mooncake).
pub const DEFAULT_SIZE: u64 = 16 * 1024 * 1024;
/// Largest local buffer Mooncake accepts (1 TiB).
pub const MAX_LOCAL_BUFFER_SIZE: u64 = 1 << 40;
/// `master_server_addr` value that selects the in-process master.
pub const EMBEDDED_MASTER: &str = "embedded";
/// `metadata_server` value for decentralised endpoint discovery (segment name = data address).
pub const P2P_HANDSHAKE: &str = "P2PHANDSHAKE";

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
        }
    }
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
    /// Whether `protocol` selects the RDMA transport.
    pub fn uses_rdma(&self) -> bool {
        self.protocol.trim() == "rdma"
    }

    /// True when `master_server_addr` selects the in-process master.
    pub fn is_embedded(&self) -> bool {
        let addr = self.master_server_addr.trim();
        addr.is_empty() || addr == EMBEDDED_MASTER
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
        if metadata.starts_with("http://") {
            return Ok(MetadataMode::Http(metadata.to_string()));
        }
        fail(
            ErrorCode::InvalidParams,
            format!(
                "metadata_server '{metadata}' is not supported; use P2PHANDSHAKE or http://host:port/metadata"
            ),
        )
    }
}

/// Parses Mooncake's human-readable sizes: a plain byte count or a number with a
/// `K/KB/KiB/M/MB/MiB/G/GB/GiB/T/TB/TiB` suffix (binary multiples, case-insensitive).
pub fn parse_size(text: &str) -> Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return fail(
                ErrorCode::InvalidParams,
                format!("unknown size unit '{other}'"),
            )
        }
    };
    let out_of_range = || {
        fail(
            ErrorCode::InvalidParams,
            format!("size '{text}' out of range"),
        )
    };
    // A whole number is scaled exactly; only a fraction goes through a double (a u64 above
    // 2^53 does not survive one).
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier).map_or_else(out_of_range, Ok);
    }
    let value: f64 = match number.parse() {
        Ok(v) => v,
        Err(_) => return fail(ErrorCode::InvalidParams, format!("bad size '{text}'")),
    };
    let bytes = value * multiplier as f64;
    // u64::MAX as f64 is 2^64, itself out of range.
    if !(0.0..u64::MAX as f64).contains(&bytes) {
        return out_of_range();
    }
    Ok(bytes as u64)
}

/// Reads an environment variable as a number, falling back to `default` when unset or
/// unparsable.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Reads a boolean environment variable (`1/true/yes/on`, `0/false/no/off`).
pub fn env_bool(name: &str) -> Option<bool> {
    let value = std::env::var(name).ok()?;
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_mooncake() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("4 GB").unwrap(), 4 << 30);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_size("12 parsecs"), Err(ErrorCode::InvalidParams));
        assert_eq!(parse_size(""), Err(ErrorCode::InvalidParams));
    }

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
