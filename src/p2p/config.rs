//! The P2P client's setup arguments (Mooncake's `setup_p2p_real_client`), the transfer
//! direction, and the TieredBackend JSON configuration. Plain data; validated at setup.

use crate::env;
use crate::error::{fail, ErrorCode, Result};
use crate::node::{MetadataMode, SetupConfig};
use serde::Deserialize;
use std::time::Duration;

/// Default `p2p_key_lease_duration_ms`.
pub const DEFAULT_LEASE_MS: u64 = 5000;
/// Default `p2p_key_lease_scan_interval_ms` (also used when 0 is passed).
pub const DEFAULT_SCAN_INTERVAL_MS: u64 = 1000;
/// Default of `MOONCAKE_DM_LOCK_SHARD_COUNT`.
pub const DEFAULT_SHARD_COUNT: usize = env::DM_LOCK_SHARD_COUNT.default as usize;
/// Milliseconds that space a failed, expired or revoked transfer may still touch is held
/// before reuse (see `quarantine`). Unset: twice the transfer timeout `MC_TRANSFER_TIMEOUT_MS`
/// (default 60000, so 120 s; like the master's `--write_quarantine_ms`): one transfer timeout
/// for a started transfer to end, one for a request that waited before it started (a
/// FORWARD slice queued behind others until its `send_by`; a REVERSE request read late by
/// a busy owner, up to `valid_for_ms` = the RPC timeout, default 30 s). A smaller value is
/// for tests only: below the peers' transfer timeout the guarantee is gone.
pub const QUARANTINE_ENV: &str = env::P2P_QUARANTINE_MS.name;
/// Default `client_rpc_thread_num`.
pub const DEFAULT_RPC_THREADS: usize = 16;

/// Which side's transfer engine moves the bytes of a cross-client put or get.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransferDirection {
    /// The owner's engine, in one RPC (WriteRemoteData / ReadRemoteData). The default.
    #[default]
    Reverse = 0,
    /// The accessor's engine, between PreWrite/WriteCommit or after PinKey.
    Forward = 1,
}

impl TransferDirection {
    /// Parses `forward` / `reverse` (case-insensitive; empty = reverse).
    ///
    /// Errors: `INVALID_PARAMS` for anything else.
    pub fn parse(text: &str) -> Result<TransferDirection> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "reverse" => Ok(TransferDirection::Reverse),
            "forward" => Ok(TransferDirection::Forward),
            other => fail(
                ErrorCode::InvalidParams,
                format!("p2p_transfer_direction_mode '{other}': use forward or reverse"),
            ),
        }
    }
}

/// Everything `setup_p2p` takes (the arguments of Mooncake's `setup_p2p_real_client`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2pSetupConfig {
    /// This client's host, or `host:port` for a fixed data port (as [`SetupConfig`]).
    pub local_hostname: String,
    /// `P2PHANDSHAKE` or `http://host:port/metadata`.
    pub metadata_server: String,
    /// TieredBackend JSON (see [`TieredConfig::parse`]); `{"tiers":[]}` makes a pure accessor
    /// that stores nothing and runs no client RPC service.
    pub tiered_backend_config_json: String,
    /// Bytes of the registered, remotely accessible staging buffer the REVERSE path uses
    /// (0 disables REVERSE puts and gets of remote keys), 0 or 1024..=1 TiB.
    pub local_buffer_size: u64,
    /// Transport protocol: `tcp` or `rdma` (as [`SetupConfig::protocol`]).
    pub protocol: String,
    /// RDMA devices, comma-separated (as [`SetupConfig::device_name`]; unused by TCP).
    pub rdma_devices: String,
    /// `host:port` of a master running `--deployment_mode P2P`.
    pub master_server_addr: String,
    /// Port of this client's RPC service (0 picks a free one).
    pub client_rpc_port: u16,
    /// Threads of the client RPC service (0 = [`DEFAULT_RPC_THREADS`]).
    pub client_rpc_thread_num: usize,
    /// Life of PreWrite / PinKey records in ms (> 0).
    pub p2p_key_lease_duration_ms: u64,
    /// Period of the expired-record scan in ms (0 = [`DEFAULT_SCAN_INTERVAL_MS`]).
    pub p2p_key_lease_scan_interval_ms: u64,
    /// Direction of requests that do not choose one.
    pub p2p_transfer_direction_mode: TransferDirection,
}

impl Default for P2pSetupConfig {
    fn default() -> Self {
        P2pSetupConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: crate::types::P2P_HANDSHAKE.into(),
            tiered_backend_config_json: String::new(),
            local_buffer_size: 16 << 20,
            protocol: "tcp".into(),
            rdma_devices: String::new(),
            master_server_addr: "127.0.0.1:50051".into(),
            client_rpc_port: 0,
            client_rpc_thread_num: DEFAULT_RPC_THREADS,
            p2p_key_lease_duration_ms: DEFAULT_LEASE_MS,
            p2p_key_lease_scan_interval_ms: DEFAULT_SCAN_INTERVAL_MS,
            p2p_transfer_direction_mode: TransferDirection::Reverse,
        }
    }
}

/// Validated settings derived from a [`P2pSetupConfig`].
pub(crate) struct Settings {
    pub(crate) base: SetupConfig,
    pub(crate) metadata: MetadataMode,
    pub(crate) tiers: TieredConfig,
    pub(crate) lease: Duration,
    pub(crate) scan_interval: Duration,
    pub(crate) rpc_threads: usize,
    pub(crate) shard_count: usize,
    pub(crate) quarantine: Duration,
}

impl P2pSetupConfig {
    /// Checks every argument.
    ///
    /// Errors: `INVALID_PARAMS` with a detail: bad host, sizes, protocol or metadata server
    /// (as [`SetupConfig::validate`]), an embedded master (P2P needs a real one), bad tier
    /// JSON, lease 0.
    pub(crate) fn validate(&self) -> Result<Settings> {
        let base = SetupConfig {
            local_hostname: self.local_hostname.clone(),
            metadata_server: self.metadata_server.clone(),
            global_segment_size: 0,
            local_buffer_size: self.local_buffer_size,
            protocol: self.protocol.clone(),
            device_name: self.rdma_devices.clone(),
            master_server_addr: self.master_server_addr.clone(),
            ssd_offload_path: String::new(),
            cluster_key_file: String::new(),
        };
        if base.is_embedded() {
            return fail(
                ErrorCode::InvalidParams,
                "P2P mode needs a master address (mooncake_master --deployment_mode P2P)",
            );
        }
        let metadata = base.validate()?;
        let tiers = TieredConfig::parse(&self.tiered_backend_config_json)?;
        if self.p2p_key_lease_duration_ms == 0 {
            return fail(
                ErrorCode::InvalidParams,
                "p2p_key_lease_duration_ms must be > 0",
            );
        }
        let scan_ms = match self.p2p_key_lease_scan_interval_ms {
            0 => DEFAULT_SCAN_INTERVAL_MS,
            ms => ms,
        };
        Ok(Settings {
            base,
            metadata,
            tiers,
            lease: Duration::from_millis(self.p2p_key_lease_duration_ms),
            scan_interval: Duration::from_millis(scan_ms),
            rpc_threads: match self.client_rpc_thread_num {
                0 => DEFAULT_RPC_THREADS,
                n => n,
            },
            shard_count: env::DM_LOCK_SHARD_COUNT.get() as usize,
            quarantine: quarantine_from(
                env::P2P_QUARANTINE_MS.parsed(),
                env::TRANSFER_TIMEOUT_MS.parsed(),
            ),
        })
    }
}

/// The quarantine: `value` ([`QUARANTINE_ENV`] parsed; 0 allowed) when given, else twice the
/// transfer timeout `transfer_timeout` (`MC_TRANSFER_TIMEOUT_MS` parsed; at least 1 ms,
/// default 60 s, no upper bound, never logged: the transfer engine logs a bad value).
pub(crate) fn quarantine_from(value: Option<u64>, transfer_timeout: Option<u64>) -> Duration {
    let ms = value.unwrap_or_else(|| {
        transfer_timeout
            .unwrap_or(env::TRANSFER_TIMEOUT_MS.default)
            .max(1)
            .saturating_mul(2)
    });
    Duration::from_millis(ms)
}

/// One storage tier of the TieredBackend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierConfig {
    /// Bytes of the tier.
    pub capacity: u64,
    /// Higher first: allocations try tiers in descending priority.
    pub priority: i64,
}

/// The TieredBackend configuration.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TieredConfig {
    /// Tiers in allocation order (descending priority; ties keep the JSON order).
    pub tiers: Vec<TierConfig>,
}

#[derive(Deserialize)]
struct JsonConfig {
    tiers: Vec<JsonTier>,
}

#[derive(Deserialize)]
struct JsonTier {
    #[serde(rename = "type")]
    kind: String,
    capacity: u64,
    #[serde(default)]
    priority: i64,
    #[serde(default = "offset")]
    allocator_type: String,
}

fn offset() -> String {
    "OFFSET".into()
}

impl TieredConfig {
    /// Parses `{"tiers":[{"type":"DRAM","capacity":N,"priority":P,"allocator_type":"OFFSET"}]}`.
    /// `type` and `capacity` are required; `priority` defaults to 0 and `allocator_type` to
    /// OFFSET; other fields are ignored.
    ///
    /// Errors: `INVALID_PARAMS` naming the problem: not JSON, missing fields, a `type` other
    /// than DRAM, an `allocator_type` other than OFFSET, capacity 0.
    pub fn parse(json: &str) -> Result<TieredConfig> {
        let parsed: JsonConfig = match serde_json::from_str(json) {
            Ok(parsed) => parsed,
            Err(e) => {
                return fail(
                    ErrorCode::InvalidParams,
                    format!("tiered_backend_config is not valid: {e}"),
                )
            }
        };
        let mut tiers = Vec::with_capacity(parsed.tiers.len());
        for (index, tier) in parsed.tiers.into_iter().enumerate() {
            if !tier.kind.eq_ignore_ascii_case("DRAM") {
                return fail(
                    ErrorCode::InvalidParams,
                    format!("tier {index}: type '{}' is not supported (DRAM)", tier.kind),
                );
            }
            if !tier.allocator_type.eq_ignore_ascii_case("OFFSET") {
                return fail(
                    ErrorCode::InvalidParams,
                    format!(
                        "tier {index}: allocator_type '{}' is not supported (OFFSET)",
                        tier.allocator_type
                    ),
                );
            }
            if tier.capacity == 0 {
                return fail(
                    ErrorCode::InvalidParams,
                    format!("tier {index}: capacity 0"),
                );
            }
            tiers.push(TierConfig {
                capacity: tier.capacity,
                priority: tier.priority,
            });
        }
        tiers.sort_by_key(|t| std::cmp::Reverse(t.priority));
        Ok(TieredConfig { tiers })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tier_json_parses_and_rejects_clearly() {
        let ok = TieredConfig::parse(
            r#"{"tiers":[{"type":"DRAM","capacity":1024,"priority":1,"allocator_type":"OFFSET"},
                         {"type":"dram","capacity":2048,"priority":100}]}"#,
        )
        .unwrap();
        assert_eq!(ok.tiers.len(), 2);
        assert_eq!(ok.tiers[0].capacity, 2048, "highest priority first");
        assert!(TieredConfig::parse(r#"{"tiers":[]}"#)
            .unwrap()
            .tiers
            .is_empty());
        for bad in [
            "",
            "{",
            "[]",
            r#"{"tiers":[{"type":"SSD","capacity":1}]}"#,
            r#"{"tiers":[{"type":"DRAM","capacity":1,"allocator_type":"CACHELIB"}]}"#,
            r#"{"tiers":[{"type":"DRAM","capacity":0}]}"#,
            r#"{"tiers":[{"type":"DRAM"}]}"#,
            r#"{"tiers":[{"type":"DRAM","capacity":-5}]}"#,
        ] {
            assert_eq!(
                TieredConfig::parse(bad),
                Err(ErrorCode::InvalidParams),
                "{bad}"
            );
            assert!(crate::error::last_error_message().contains("tier"), "{bad}");
        }
    }

    #[test]
    fn directions_shards_and_setup_checks() {
        assert_eq!(
            TransferDirection::parse("FORWARD"),
            Ok(TransferDirection::Forward)
        );
        assert_eq!(TransferDirection::parse(""), Ok(TransferDirection::Reverse));
        assert_eq!(
            TransferDirection::parse("up"),
            Err(ErrorCode::InvalidParams)
        );
        let shard_count_from = |text| env::DM_LOCK_SHARD_COUNT.read(text);
        assert_eq!(shard_count_from(None), 1024);
        assert_eq!(shard_count_from(Some("0")), 1024);
        assert_eq!(shard_count_from(Some(" 8 ")), 8);
        let q = |a: Option<&str>, b: Option<&str>| {
            let a = a.and_then(|text| env::P2P_QUARANTINE_MS.parse(text));
            let b = b.and_then(|text| env::TRANSFER_TIMEOUT_MS.parse(text));
            quarantine_from(a, b).as_millis()
        };
        assert_eq!(q(None, None), 120_000, "twice the transfer timeout");
        assert_eq!(q(None, Some("250")), 500);
        assert_eq!(q(Some(" 40 "), Some("250")), 40);
        assert_eq!(q(Some("x"), Some("0")), 2);
        assert_eq!(q(None, Some(&u64::MAX.to_string())), u64::MAX as u128);
        let mut config = P2pSetupConfig {
            tiered_backend_config_json: r#"{"tiers":[]}"#.into(),
            ..P2pSetupConfig::default()
        };
        assert!(config.validate().is_ok());
        config.p2p_key_lease_scan_interval_ms = 0;
        let settings = config.validate().ok().unwrap();
        assert_eq!(settings.scan_interval, Duration::from_millis(1000));
        config.p2p_key_lease_duration_ms = 0;
        assert!(config.validate().is_err());
        config.p2p_key_lease_duration_ms = 5;
        config.master_server_addr = "embedded".into();
        assert!(config.validate().is_err());
    }
}
