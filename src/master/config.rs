//! The master's knobs ([`MasterConfig`]): Mooncake's flag names and defaults, plus
//! millisecond overrides of the second-granularity timeouts (tests, fast fail-over).

use crate::error::{fail, ErrorCode, Result};
use crate::types::DeploymentMode;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Master configuration. Plain data (`Clone + Send + Sync`); [`Default`] gives Mooncake's
/// `mooncake_master` flag defaults (spec §4.11).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MasterConfig {
    /// Read lease granted by every query (`--default_kv_lease_ttl`), in ms.
    pub default_kv_lease_ttl_ms: u64,
    /// Soft pin length when a write enables the pin without a ttl (`--default_kv_soft_pin_ttl`).
    pub default_kv_soft_pin_ttl_ms: u64,
    /// Largest soft pin ttl a write may ask for (`--max_kv_soft_pin_ttl`); above is `INVALID_PARAMS`.
    pub max_kv_soft_pin_ttl_ms: u64,
    /// Whether the second eviction pass may evict soft-pinned objects.
    pub allow_evict_soft_pinned_objects: bool,
    /// Fraction of the evictable objects one eviction round removes (0..=1).
    pub eviction_ratio: f64,
    /// Used/total ratio above which eviction runs (0..=1).
    pub eviction_high_watermark_ratio: f64,
    /// A client with no ping for this long is expired (`--client_ttl`), in s.
    pub client_ttl_s: u64,
    /// An in-flight put older than this may be taken over by a new put (s).
    pub put_start_discard_timeout_s: u64,
    /// Space of a put neither ended nor revoked is reclaimed after this long (s).
    pub put_start_release_timeout_s: u64,
    /// Cluster name (`--cluster_id`), reported in metrics.
    pub cluster_id: String,
    /// `--deployment_mode`: CENTRALIZED places replicas in mounted segments; P2P keeps only
    /// key → owner routes and refuses segment calls.
    pub deployment_mode: DeploymentMode,
    /// When set, replaces `client_ttl_s` with this many ms.
    pub client_ttl_ms: Option<u64>,
    /// When set, replaces `put_start_discard_timeout_s` with this many ms.
    pub put_start_discard_timeout_ms: Option<u64>,
    /// When set, replaces `put_start_release_timeout_s` with this many ms.
    pub put_start_release_timeout_ms: Option<u64>,
    /// Space a write gave up (revoked, pre-empted or reclaimed) is not reused for this long
    /// after the moment its writer could last have sent bytes (`--write_quarantine_ms`):
    /// a stale payload still in flight lands in space nobody else owns. Must be at least the
    /// owners' `MC_TRANSFER_TIMEOUT_MS` (a server applies a payload only that long after its
    /// header).
    pub write_quarantine_ms: u64,
    /// A `remove_all` or `remove_by_regex` answers within this long (`--scan_budget_ms`):
    /// a scan that has not finished by then stops after its slice and answers `TRY_AGAIN`
    /// (what it removed stays removed; calling again removes the rest). Below a client's
    /// `MC_RPC_TIMEOUT_MS` (30 s), so a long scan is a clear code, never a client timeout.
    pub scan_budget_ms: u64,
    /// P2P mode: for this long after the master started, new routes (`p2p_add_keys`) are
    /// refused with `OBJECT_REPLICA_BUSY`, and owners of a previous master's life may reclaim
    /// their keys; after it, they may not (`--p2p_route_grace_ms`). A restarted master knows no
    /// routes, and an owner of its previous life keeps serving its keys until it fences itself
    /// ([`crate::p2p::FENCE_AFTER`] after its last confirmed ping), so no key may be routed
    /// anew before then. 0 here (an in-process master); the `mooncake_master` binary defaults
    /// to [`crate::p2p::MASTER_ROUTE_GRACE`].
    pub p2p_route_grace_ms: u64,
    /// A master restarted from its journal waits this long for the owners of the segments it
    /// recovered to re-attach them (`--reattach_grace_ms`); a segment not re-attached by then
    /// is given up with its replicas.
    pub reattach_grace_ms: u64,
    /// Copy every object to its owner's SSD tier as soon as its write ends (upstream's
    /// `--enable_offload` without `--offload_on_evict`: write-through), besides demoting
    /// evicted objects; evicting an object with such a copy then only frees its memory.
    /// Off: objects go to disk only when evicted.
    #[serde(default)]
    pub offload_at_put: bool,
    /// Load an object that is on disk only back into memory (its owner's segment, when it
    /// has room) once reads found it there `promotion_admission_threshold` times
    /// (`--promotion_on_hit`, upstream's flag); it then has both homes, as a write-through
    /// copy has.
    #[serde(default)]
    pub promotion_on_hit: bool,
    /// Reads of an object on disk only that queue its promotion
    /// (`--promotion_admission_threshold`, upstream's default 2; 0 counts as 1).
    #[serde(default = "default_promotion_threshold")]
    pub promotion_admission_threshold: u32,
    /// How long a client may serve a key's replica list from its location cache
    /// (`--location_cache_lease_ms`, `docs/location-cache.md`); capped by the read lease. 0:
    /// no client caches anything, and writes never wait for revocations.
    #[serde(default = "default_location_cache_lease_ms")]
    pub location_cache_lease_ms: u64,
    /// For this long after the master starts, every write waits before it is acknowledged
    /// (`--location_cache_start_grace_ms`): clients of an earlier life of the master (before a
    /// restart or a failover) may still serve cached answers that long (they stop once their
    /// revocation poll has not succeeded for [`crate::types::LOCATION_CACHE_FRESH_MS`]). 0 for
    /// an in-process master (its clients start with it); the binary defaults to
    /// [`DEFAULT_LOCATION_CACHE_START_GRACE_MS`].
    #[serde(default)]
    pub location_cache_start_grace_ms: u64,
}

/// `--location_cache_lease_ms` default.
fn default_location_cache_lease_ms() -> u64 {
    2_000
}

/// `mooncake_master`'s `--location_cache_start_grace_ms` default: a cache holder's freshness
/// window and the time its last poll may have taken.
pub const DEFAULT_LOCATION_CACHE_START_GRACE_MS: u64 = crate::types::LOCATION_CACHE_FRESH_MS + 200;

/// Upstream's `--promotion_admission_threshold` default.
fn default_promotion_threshold() -> u32 {
    2
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            default_kv_lease_ttl_ms: 10_000,
            default_kv_soft_pin_ttl_ms: 1_800_000,
            max_kv_soft_pin_ttl_ms: 86_400_000,
            allow_evict_soft_pinned_objects: true,
            eviction_ratio: 0.05,
            eviction_high_watermark_ratio: 0.90,
            client_ttl_s: 10,
            put_start_discard_timeout_s: 30,
            put_start_release_timeout_s: 600,
            cluster_id: "mooncake_cluster".to_string(),
            deployment_mode: DeploymentMode::Centralized,
            client_ttl_ms: None,
            put_start_discard_timeout_ms: None,
            put_start_release_timeout_ms: None,
            write_quarantine_ms: 120_000,
            scan_budget_ms: 20_000,
            p2p_route_grace_ms: 0,
            reattach_grace_ms: 30_000,
            offload_at_put: false,
            promotion_on_hit: false,
            promotion_admission_threshold: default_promotion_threshold(),
            location_cache_lease_ms: default_location_cache_lease_ms(),
            location_cache_start_grace_ms: 0,
        }
    }
}

fn pick(seconds: u64, ms_override: Option<u64>) -> Duration {
    ms_override.map_or(Duration::from_secs(seconds), Duration::from_millis)
}

impl MasterConfig {
    /// Checks the knobs: ratios finite and in `[0, 1]`, default soft pin ttl ≤ max, client
    /// ttl > 0, non-empty cluster id. Errors: `INVALID_PARAMS` with a detail.
    pub fn validate(&self) -> Result<()> {
        for (name, ratio) in [
            ("eviction_ratio", self.eviction_ratio),
            (
                "eviction_high_watermark_ratio",
                self.eviction_high_watermark_ratio,
            ),
        ] {
            if !(0.0..=1.0).contains(&ratio) {
                return fail(
                    ErrorCode::InvalidParams,
                    format!("{name}={ratio} not in [0,1]"),
                );
            }
        }
        if self.default_kv_soft_pin_ttl_ms > self.max_kv_soft_pin_ttl_ms {
            return fail(
                ErrorCode::InvalidParams,
                "default_kv_soft_pin_ttl exceeds max_kv_soft_pin_ttl",
            );
        }
        if self.client_ttl().is_zero() {
            return fail(ErrorCode::InvalidParams, "client_ttl must be > 0");
        }
        if self.cluster_id.is_empty() {
            return fail(ErrorCode::InvalidParams, "cluster_id is empty");
        }
        Ok(())
    }

    /// How long after start a P2P master refuses new routes and takes reclaims of owners of a
    /// previous master.
    pub fn p2p_route_grace(&self) -> Duration {
        Duration::from_millis(self.p2p_route_grace_ms)
    }

    /// Effective client liveness ttl.
    pub fn client_ttl(&self) -> Duration {
        pick(self.client_ttl_s, self.client_ttl_ms)
    }

    /// Effective age after which an in-flight put may be taken over.
    pub fn put_start_discard_timeout(&self) -> Duration {
        pick(
            self.put_start_discard_timeout_s,
            self.put_start_discard_timeout_ms,
        )
    }

    /// Effective age after which an unfinished put's space is reclaimed.
    pub fn put_start_release_timeout(&self) -> Duration {
        pick(
            self.put_start_release_timeout_s,
            self.put_start_release_timeout_ms,
        )
    }

    /// How long space a write gave up stays unused after its writer's last chance to send.
    pub fn write_quarantine(&self) -> Duration {
        Duration::from_millis(self.write_quarantine_ms)
    }

    /// How long a removal scan runs before it answers `TRY_AGAIN`.
    pub fn scan_budget(&self) -> Duration {
        Duration::from_millis(self.scan_budget_ms)
    }

    /// Read lease length.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.default_kv_lease_ttl_ms)
    }

    /// The location-cache lease: `location_cache_lease_ms`, at most the read lease.
    pub fn location_cache_lease(&self) -> Duration {
        Duration::from_millis(self.location_cache_lease_ms).min(self.lease_ttl())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_overrides_apply() {
        let mut config = MasterConfig::default();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.client_ttl(), Duration::from_secs(10));
        config.client_ttl_ms = Some(20);
        assert_eq!(config.client_ttl(), Duration::from_millis(20));
        config.eviction_ratio = f64::NAN;
        assert_eq!(config.validate(), Err(ErrorCode::InvalidParams));
        config.eviction_ratio = 1.5;
        assert_eq!(config.validate(), Err(ErrorCode::InvalidParams));
        config.eviction_ratio = 0.1;
        config.client_ttl_ms = Some(0);
        assert_eq!(config.validate(), Err(ErrorCode::InvalidParams));
    }
}
