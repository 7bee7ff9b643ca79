//! `mooncake_master`: the metadata server (see [`super::run_master`]). Flags use Mooncake's names and defaults
//! (`../shared/spec/mooncake-api.md` §4.11); an unknown flag is an error with exit code 2.

use super::glog::GlogFlags;
use super::Program;
use crate::ha::{HaConfig, Member, Role, RoleCall};
use crate::master::{
    JournalOptions, MasterConfig, MasterInterface, MasterService, RemoteMaster,
    DEFAULT_LOCATION_CACHE_START_GRACE_MS,
};
use crate::rpc::server::{ServerLimits, ServerOptions};
use crate::rpc::stats::RpcStats;
use crate::rpc::{HttpRequest, HttpResponse, HttpServer, RpcServer};
use crate::types::DeploymentMode;

/// The default of `--p2p_route_grace_ms`: [`crate::p2p::MASTER_ROUTE_GRACE`].
const DEFAULT_P2P_ROUTE_GRACE_MS: u64 = crate::p2p::MASTER_ROUTE_GRACE.as_millis() as u64;
use clap::Parser;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "mooncake_master",
    version,
    about = "Mooncake Store master (mooncake-rs)"
)]
pub(super) struct Flags {
    #[command(flatten)]
    glog: GlogFlags,
    /// RPC port (deprecated spelling).
    #[arg(long = "port", default_value_t = 50051)]
    port: u16,
    /// RPC port; 0 means use --port.
    #[arg(long = "rpc_port", default_value_t = 0)]
    rpc_port: u16,
    /// Address the RPC server binds.
    #[arg(long = "rpc_address", default_value = "0.0.0.0")]
    rpc_address: String,
    /// A network interface whose IPv4 address replaces `--rpc_address` (upstream's flag).
    #[arg(long = "rpc_interface", default_value = "")]
    rpc_interface: String,
    /// Upstream's switch for TCP_NODELAY on RPC connections: always on here; `false` is refused.
    #[arg(long = "rpc_enable_tcp_no_delay", default_value = "true", num_args = 0..=1, default_missing_value = "true", value_parser = super::glog::gflags_bool)]
    rpc_enable_tcp_no_delay: bool,
    /// RPC I/O shard threads (0 = 16); a call blocks only its own shard's connections.
    #[arg(long = "rpc_thread_num", alias = "max_threads", default_value_t = 0)]
    rpc_thread_num: u32,
    /// Seconds a connection may stay without a request before it is closed; 0: never (as
    /// upstream, whose default that is; ours closes idle ones so that a vanished peer's
    /// connection does not hold one of `--rpc_max_connections` for ever).
    #[arg(long = "rpc_conn_timeout_seconds", default_value_t = 300)]
    rpc_conn_timeout_seconds: u64,
    /// Milliseconds a request frame may take to arrive after its first byte (mooncake-rs flag).
    #[arg(long = "rpc_read_timeout_ms", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    rpc_read_timeout_ms: u64,
    /// Connections served at once; more are closed on accept (mooncake-rs flag).
    #[arg(long = "rpc_max_connections", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    rpc_max_connections: u64,
    /// Longest request payload in bytes, at most 67108864 (mooncake-rs flag).
    #[arg(long = "rpc_max_request_bytes", default_value_t = 67_108_864, value_parser = clap::value_parser!(u64).range(1..=67_108_864))]
    rpc_max_request_bytes: u64,
    /// Most sequence elements and struct fields in one request; more is INVALID_PARAMS
    /// (mooncake-rs flag).
    #[arg(long = "rpc_max_request_items", default_value_t = 1_048_576, value_parser = clap::value_parser!(u64).range(1..))]
    rpc_max_request_items: u64,
    /// Threads running table scans (remove_all, remove_by_regex) off the I/O shards
    /// (mooncake-rs flag).
    #[arg(long = "rpc_scan_threads", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    rpc_scan_threads: u64,
    /// Scans waiting for a scan thread; more are answered TASK_PENDING_LIMIT_EXCEEDED
    /// (mooncake-rs flag).
    #[arg(long = "rpc_scan_queue", default_value_t = 16, value_parser = clap::value_parser!(u64).range(0..=65536))]
    rpc_scan_queue: u64,
    /// Read lease length: milliseconds, or a number with ms/s/m/h.
    #[arg(long = "default_kv_lease_ttl", default_value = "10000")]
    default_kv_lease_ttl: String,
    /// Default soft pin length (ms, or with a unit).
    #[arg(long = "default_kv_soft_pin_ttl", default_value = "1800000")]
    default_kv_soft_pin_ttl: String,
    /// Longest soft pin a request may ask for (ms, or with a unit).
    #[arg(long = "max_kv_soft_pin_ttl", default_value = "86400000")]
    max_kv_soft_pin_ttl: String,
    /// Whether eviction may take soft-pinned objects in its second pass.
    #[arg(long = "allow_evict_soft_pinned_objects", default_value = "true", num_args = 0..=1, default_missing_value = "true")]
    allow_evict_soft_pinned_objects: bool,
    /// Fraction of evictable objects freed per eviction round.
    #[arg(long = "eviction_ratio", default_value_t = 0.05)]
    eviction_ratio: f64,
    /// Used-space fraction above which eviction starts.
    #[arg(long = "eviction_high_watermark_ratio", default_value_t = 0.90)]
    eviction_high_watermark_ratio: f64,
    /// Seconds without a ping after which a client is declared dead.
    #[arg(long = "client_ttl", default_value_t = 10)]
    client_ttl: u64,
    /// Seconds after which another writer may take over an unfinished put.
    #[arg(long = "put_start_discard_timeout_sec", default_value_t = 30)]
    put_start_discard_timeout_sec: u64,
    /// Seconds after which the space of an unfinished put is reclaimed.
    #[arg(long = "put_start_release_timeout_sec", default_value_t = 600)]
    put_start_release_timeout_sec: u64,
    /// Milliseconds space a write gave up (revoked, pre-empted, reclaimed, or on a segment that
    /// was remounted) stays unused after its writer's last chance to send; at least the
    /// clients' MC_TRANSFER_TIMEOUT_MS (mooncake-rs flag).
    #[arg(long = "write_quarantine_ms", default_value_t = 120_000)]
    write_quarantine_ms: u64,
    /// remove_all / remove_by_regex answer within this many ms: a longer scan stops and
    /// answers TRY_AGAIN (call again for the rest). Below the clients' 30 s RPC timeout.
    #[arg(long = "scan_budget_ms", default_value_t = 20_000)]
    scan_budget_ms: u64,
    /// P2P mode: milliseconds after start during which new routes wait (owners' commits retry)
    /// while owners of a previous master's life reclaim their keys; below the default (the
    /// owners' fence time plus one ping interval) only where the master never restarts
    /// (mooncake-rs flag).
    #[arg(long = "p2p_route_grace_ms", default_value_t = DEFAULT_P2P_ROUTE_GRACE_MS)]
    p2p_route_grace_ms: u64,
    /// Keep a journal in this directory so a restarted master keeps its objects (committed
    /// objects, removals, mounts, write-token ceiling); empty: none (mooncake-rs flag).
    #[arg(long = "journal_dir", default_value = "")]
    journal_dir: String,
    /// With `--journal_dir`: milliseconds a restarted master waits for the owners of the
    /// segments it recovered to re-attach them before giving their objects up
    /// (mooncake-rs flag).
    #[arg(long = "reattach_grace_ms", default_value_t = 30_000)]
    reattach_grace_ms: u64,
    /// Milliseconds a client may serve a key's replica list from its location cache before
    /// asking again (at most the read lease); every write of a cached key waits until its
    /// holders dropped it or this ran out; 0: no location caching (mooncake-rs flag,
    /// `docs/location-cache.md`).
    #[arg(long = "location_cache_lease_ms", default_value_t = 2_000)]
    location_cache_lease_ms: u64,
    /// Milliseconds after start during which writes wait before they are acknowledged, while
    /// location caches of an earlier master life may still serve (mooncake-rs flag).
    #[arg(long = "location_cache_start_grace_ms", default_value_t = DEFAULT_LOCATION_CACHE_START_GRACE_MS)]
    location_cache_start_grace_ms: u64,
    /// Upstream's switch for its SSD offload: on (without `--offload_on_evict`), every write
    /// is copied to its owner's SSD tier as soon as it ends (write-through), and evicting an
    /// object with such a copy only frees its memory. Evicted objects are demoted to their
    /// owner's tier either way, so off or with `--offload_on_evict` the tier works as
    /// upstream's `--offload_on_evict` (`docs/ssd-tier.md`).
    #[arg(long = "enable_offload", default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    enable_offload: bool,
    /// Upstream's switch for deferring SSD writes to eviction: with `--enable_offload`, no
    /// write-through copies (objects go to disk only when evicted, as without the flags).
    #[arg(long = "offload_on_evict", default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    offload_on_evict: bool,
    /// The cluster key file (mooncake-rs flag; format in README, "Cluster key"): every
    /// connection to the RPC port must first prove the key. Empty: `MC_CLUSTER_KEY_FILE`,
    /// else no key.
    #[arg(long = "cluster_key_file", default_value = "")]
    cluster_key_file: String,
    /// TLS certificate chain (PEM, leaf first) of the RPC port and the HTTP metadata service
    /// (mooncake-rs flag; README, "TLS"): both then accept TLS only. Needs `--tls_key_file`.
    #[arg(long = "tls_cert_file", default_value = "")]
    tls_cert_file: String,
    /// The private key (PEM) of `--tls_cert_file`.
    #[arg(long = "tls_key_file", default_value = "")]
    tls_key_file: String,
    /// Certificates (PEM) this master trusts when it connects to another master (an HA
    /// group's leader). Empty: `MC_TLS_CA_FILE`, else none.
    #[arg(long = "tls_ca_file", default_value = "")]
    tls_ca_file: String,
    /// Upstream's switch for promoting SSD objects back to DRAM: an object on disk only is
    /// loaded into its owner's segment (when it has room) once reads found it there
    /// `--promotion_admission_threshold` times.
    #[arg(long = "promotion_on_hit", default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    promotion_on_hit: bool,
    /// Reads of an object on disk only that queue its promotion (1: the first read).
    #[arg(long = "promotion_admission_threshold", default_value_t = 2)]
    promotion_admission_threshold: u32,
    /// Run as one master of an HA group elected on etcd (`--etcd_endpoints`): a standby
    /// copying the leader's journal until it leads.
    #[arg(
        long = "enable_ha",
        default_value = "false",
        num_args = 0..=1,
        default_missing_value = "true",
        requires_if("true", "etcd_endpoints")
    )]
    enable_ha: bool,
    /// HA backend; `etcd` is built.
    #[arg(long = "ha_backend_type", default_value = "etcd", value_parser = ["etcd"])]
    ha_backend_type: String,
    /// etcd members, `h1:2379,h2:2379` (or `;`-separated); required by `--enable_ha`.
    #[arg(
        long = "etcd_endpoints",
        alias = "ha_backend_connstring",
        value_parser = parse_etcd_endpoints
    )]
    etcd_endpoints: Option<EtcdEndpoints>,
    /// The leader's etcd lease in ms: a leader that cannot renew it stops serving before it
    /// ends, and a standby takes over after it (mooncake-rs flag).
    #[arg(long = "ha_lease_ttl_ms", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1000..))]
    ha_lease_ttl_ms: u64,
    /// The address clients reach this master at, published while it leads; default
    /// `--rpc_address:port`, this host's name for 0.0.0.0 (mooncake-rs flag).
    #[arg(long = "ha_advertise_address", default_value = "")]
    ha_advertise_address: String,
    /// Serve Mooncake's HTTP metadata service (`/metadata?key=`).
    #[arg(long = "enable_http_metadata_server", default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    enable_http_metadata_server: bool,
    /// Port of the HTTP metadata service.
    #[arg(long = "http_metadata_server_port", default_value_t = 8080)]
    http_metadata_server_port: u16,
    /// Address of the HTTP metadata service.
    #[arg(long = "http_metadata_server_host", default_value = "0.0.0.0")]
    http_metadata_server_host: String,
    /// Serve `/health` and `/metrics` over HTTP.
    #[arg(long = "enable_metric_reporting", default_value = "true", num_args = 0..=1, default_missing_value = "true")]
    enable_metric_reporting: bool,
    /// Port of `/health` and `/metrics`.
    #[arg(long = "metrics_port", default_value_t = 9003)]
    metrics_port: u16,
    /// Address of `/health` and `/metrics`.
    #[arg(long = "metrics_host", default_value = "0.0.0.0")]
    metrics_host: String,
    /// Cluster id (metadata key prefix).
    #[arg(long = "cluster_id", default_value = "mooncake_cluster")]
    cluster_id: String,
    /// CENTRALIZED (the master places replicas) or P2P (routing only: key → owner client and
    /// size; no segment space is ever allocated).
    #[arg(long = "deployment_mode", default_value = "CENTRALIZED", value_parser = ["CENTRALIZED", "P2P"])]
    deployment_mode: String,
    /// Segment allocator; `offset` is built.
    #[arg(long = "memory_allocator", default_value = "offset", value_parser = ["offset"])]
    memory_allocator: String,
    /// Replica placement; `random` is built.
    #[arg(long = "allocation_strategy", default_value = "random", value_parser = ["random"])]
    allocation_strategy: String,
}

/// Parses Mooncake's duration strings: plain milliseconds, or a number with ms/s/m/h.
fn parse_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("bad duration '{text}'"))?;
    let factor = match unit {
        "" | "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        other => return Err(format!("bad duration unit '{other}' in '{text}'")),
    };
    value
        .checked_mul(factor)
        .ok_or_else(|| format!("duration '{text}' too large"))
}

fn config_from(flags: &Flags) -> Result<MasterConfig, String> {
    let config = MasterConfig {
        default_kv_lease_ttl_ms: parse_ms(&flags.default_kv_lease_ttl)?,
        default_kv_soft_pin_ttl_ms: parse_ms(&flags.default_kv_soft_pin_ttl)?,
        max_kv_soft_pin_ttl_ms: parse_ms(&flags.max_kv_soft_pin_ttl)?,
        allow_evict_soft_pinned_objects: flags.allow_evict_soft_pinned_objects,
        eviction_ratio: flags.eviction_ratio,
        eviction_high_watermark_ratio: flags.eviction_high_watermark_ratio,
        client_ttl_s: flags.client_ttl,
        put_start_discard_timeout_s: flags.put_start_discard_timeout_sec,
        put_start_release_timeout_s: flags.put_start_release_timeout_sec,
        write_quarantine_ms: flags.write_quarantine_ms,
        scan_budget_ms: flags.scan_budget_ms,
        p2p_route_grace_ms: flags.p2p_route_grace_ms,
        reattach_grace_ms: flags.reattach_grace_ms,
        location_cache_lease_ms: flags.location_cache_lease_ms,
        location_cache_start_grace_ms: match flags.location_cache_lease_ms {
            0 => 0,
            _ => flags.location_cache_start_grace_ms,
        },
        offload_at_put: flags.enable_offload && !flags.offload_on_evict,
        promotion_on_hit: flags.promotion_on_hit,
        promotion_admission_threshold: flags.promotion_admission_threshold,
        cluster_id: flags.cluster_id.clone(),
        deployment_mode: match flags.deployment_mode.as_str() {
            "P2P" => DeploymentMode::P2p,
            _ => DeploymentMode::Centralized,
        },
        ..MasterConfig::default()
    };
    config
        .validate()
        .map_err(|e| format!("invalid master configuration: {e}"))?;
    Ok(config)
}

/// `--rpc_conn_timeout_seconds=0`: idle connections are kept (a century stands for never).
const NO_IDLE_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The RPC server's limits from the flags (clap has checked their ranges).
fn limits_from(flags: &Flags) -> ServerLimits {
    let size = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
    ServerLimits {
        max_connections: size(flags.rpc_max_connections),
        idle_timeout: match flags.rpc_conn_timeout_seconds {
            0 => NO_IDLE_TIMEOUT,
            seconds => Duration::from_secs(seconds),
        },
        read_timeout: Duration::from_millis(flags.rpc_read_timeout_ms),
        max_request_bytes: size(flags.rpc_max_request_bytes),
        max_request_items: size(flags.rpc_max_request_items),
        scan_threads: size(flags.rpc_scan_threads),
        scan_queue: size(flags.rpc_scan_queue),
    }
}

/// What the RPC server serves: one master, or this member's role in an HA group.
enum Served {
    Single(Arc<MasterService>),
    Ha(Arc<Role>),
}

impl Served {
    fn api(&self) -> Arc<dyn crate::master::MasterApi> {
        match self {
            Served::Single(service) => service.clone(),
            Served::Ha(role) => Arc::new(RemoteMaster(RoleCall(Arc::clone(role)))),
        }
    }

    fn prometheus_text(&self, cluster_id: &str) -> String {
        match self {
            Served::Single(service) => service.prometheus_text(),
            Served::Ha(role) => {
                let service = role.service();
                let text = service.as_ref().map(|s| s.prometheus_text());
                format!(
                    "# HELP mooncake_master_ha_leader Whether this master leads its HA group\n\
                     # TYPE mooncake_master_ha_leader gauge\n\
                     mooncake_master_ha_leader{{cluster=\"{cluster_id}\"}} {}\n{}",
                    u8::from(service.is_some()),
                    text.unwrap_or_default()
                )
            }
        }
    }
}

/// The IPv4 address of network interface `name` (`--rpc_interface`). `Err` (for stderr) when
/// no interface of that name has one.
fn interface_ipv4(name: &str) -> Result<std::net::Ipv4Addr, String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(format!(
            "--rpc_interface={name}: cannot list interfaces: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut found = None;
    let mut at = list;
    while !at.is_null() && found.is_none() {
        // SAFETY: `at` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let entry = unsafe { &*at };
        // SAFETY: `ifa_name` is a NUL-terminated string of the same list.
        let named =
            unsafe { std::ffi::CStr::from_ptr(entry.ifa_name) }.to_bytes() == name.as_bytes();
        let addr = entry.ifa_addr;
        // SAFETY: a non-null `ifa_addr` points at a sockaddr of the family it names; an
        // AF_INET one is a sockaddr_in.
        if named && !addr.is_null() && i32::from(unsafe { (*addr).sa_family }) == libc::AF_INET {
            let v4 = unsafe { &*(addr as *const libc::sockaddr_in) };
            found = Some(std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)));
        }
        at = entry.ifa_next;
    }
    // SAFETY: the list came from getifaddrs and is not used after this.
    unsafe { libc::freeifaddrs(list) };
    found.ok_or_else(|| format!("--rpc_interface={name}: no such interface with an IPv4 address"))
}

/// The address an HA master publishes while it leads.
fn advertise(flags: &Flags, port: u16) -> String {
    if !flags.ha_advertise_address.is_empty() {
        return flags.ha_advertise_address.clone();
    }
    let host = match flags.rpc_address.as_str() {
        "0.0.0.0" | "::" | "" => crate::process::host_name().unwrap_or_else(|| "127.0.0.1".into()),
        address => address.to_string(),
    };
    format!("{host}:{port}")
}

/// The parsed `--etcd_endpoints`: at least one member URL.
#[derive(Clone, Debug)]
struct EtcdEndpoints(Vec<String>);

/// Parses `--etcd_endpoints` (see [`crate::ha::etcd::endpoints`]); an empty list is refused
/// with `--enable_ha` ([`Program::validate`]), accepted without.
fn parse_etcd_endpoints(text: &str) -> Result<EtcdEndpoints, String> {
    Ok(EtcdEndpoints(crate::ha::etcd::endpoints(text)))
}

fn run(mut flags: Flags) -> Result<(), String> {
    if !flags.rpc_enable_tcp_no_delay {
        return Err(
            "--rpc_enable_tcp_no_delay=false: RPC connections always use TCP_NODELAY".into(),
        );
    }
    if !flags.rpc_interface.is_empty() {
        flags.rpc_address = interface_ipv4(&flags.rpc_interface)?.to_string();
    }
    super::use_cluster_key(&flags.cluster_key_file)?;
    super::use_tls_ca(&flags.tls_ca_file)?;
    let tls = super::server_tls(&flags.tls_cert_file, &flags.tls_key_file)?;
    let trusts = crate::auth::tls::process_client_config().map_err(|e| format!("TLS: {e}"))?;
    if flags.enable_ha && tls.is_some() && trusts.is_none() {
        // A standby copies the leader's journal over the master's RPC port, TLS-only then.
        return Err("an HA master with --tls_cert_file must trust the group's certificates: name their CA in --tls_ca_file (or MC_TLS_CA_FILE)".into());
    }
    let config = config_from(&flags)?;
    let journal = (!flags.journal_dir.is_empty()).then(|| JournalOptions::new(&flags.journal_dir));
    let served = match (flags.enable_ha, &journal) {
        (true, _) => Served::Ha(Arc::new(Role::default())),
        (false, None) => Served::Single(MasterService::new(config.clone())),
        (false, Some(journal)) => {
            let opened = MasterService::open(config.clone(), journal.clone());
            Served::Single(opened.map_err(|e| {
                let detail = crate::error::last_error_message();
                format!(
                    "cannot open the journal in {}: {e}: {detail}",
                    flags.journal_dir
                )
            })?)
        }
    };
    let port = if flags.rpc_port != 0 {
        flags.rpc_port
    } else {
        flags.port
    };
    let threads = match flags.rpc_thread_num {
        0 => crate::rpc::server::DEFAULT_WORKER_THREADS,
        n => n as usize,
    };
    let options = ServerOptions {
        limits: limits_from(&flags),
        tls: tls.clone(),
        ..crate::master::remote::server_options(threads)
    };
    // The HTTP listeners are bound first: a master whose RPC port accepts serves them too,
    // and one that cannot bind them exits before any client reaches it. `/metrics` shows the
    // RPC counters once the RPC server exists (it is started right after).
    let rpc_stats: Arc<OnceLock<Arc<RpcStats>>> = Arc::default();
    let served = Arc::new(served);
    let _metrics = if flags.enable_metric_reporting {
        let served = Arc::clone(&served);
        let rpc_stats = Arc::clone(&rpc_stats);
        let cluster_id = flags.cluster_id.clone();
        let handler = move |request: &HttpRequest| match request.path.as_str() {
            "/health" => HttpResponse::text(200, "OK\n"),
            "/metrics" => {
                let rpc_text = rpc_stats.get().map(|s| s.prometheus_text());
                HttpResponse::text(
                    200,
                    served.prometheus_text(&cluster_id)
                        + &rpc_text.unwrap_or_default()
                        + &crate::auth::prometheus_text(),
                )
            }
            _ => HttpResponse::text(404, "not found\n"),
        };
        Some(
            HttpServer::start(
                super::socket(&flags.metrics_host, flags.metrics_port)?,
                Arc::new(handler),
            )
            .map_err(|e| format!("cannot serve metrics on port {}: {e}", flags.metrics_port))?,
        )
    } else {
        None
    };
    let _metadata = match flags.enable_http_metadata_server {
        true => Some(super::serve_metadata(
            &flags.http_metadata_server_host,
            flags.http_metadata_server_port,
            tls,
        )?),
        false => None,
    };
    let api = served.api();
    let rpc = RpcServer::serve_with::<MasterInterface>(
        super::socket(&flags.rpc_address, port)?,
        api,
        options,
    )
    .map_err(|e| {
        format!(
            "cannot start the RPC server on {}:{port}: {e}",
            flags.rpc_address
        )
    })?;
    let _ = rpc_stats.set(rpc.stats());
    let member = match &*served {
        Served::Ha(role) => Some(start_member(
            &flags,
            port,
            config,
            journal,
            Arc::clone(role),
        )?),
        Served::Single(_) => None,
    };
    tracing::info!(rpc = %rpc.local_addr(), "mooncake_master ready");
    crate::wait_for_termination();
    if let Some((stop, thread)) = member {
        stop.store(true, Ordering::Release);
        let _ = thread.join();
    }
    rpc.shutdown();
    if let Served::Single(service) = &*served {
        service.shutdown();
    }
    Ok(())
}

/// Starts this master's HA member loop on a thread; returns its stop flag and thread.
fn start_member(
    flags: &Flags,
    port: u16,
    master: MasterConfig,
    journal: Option<JournalOptions>,
    role: Arc<Role>,
) -> Result<(Arc<AtomicBool>, std::thread::JoinHandle<()>), String> {
    // `validate` refused --enable_ha without a member.
    let endpoints = flags
        .etcd_endpoints
        .clone()
        .map(|e| e.0)
        .unwrap_or_default();
    let config = HaConfig {
        endpoints,
        cluster_id: flags.cluster_id.clone(),
        advertise: advertise(flags, port),
        lease_ttl: Duration::from_millis(flags.ha_lease_ttl_ms),
        journal,
        master,
    };
    let mut member = Member::new(config, role).map_err(|e| {
        let detail = crate::error::last_error_message();
        format!("cannot join the HA group: {e}: {detail}")
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("mc-ha".into())
        .spawn(move || member.run(&flag))
        .map_err(|e| format!("cannot start the HA thread: {e}"))?;
    Ok((stop, thread))
}

impl Program for Flags {
    const NAME: &'static str = "mooncake_master";
    const UPSTREAM_ONLY: &'static [super::upstream_only::UpstreamFlag] =
        super::upstream_only::MASTER_FLAGS;

    fn glog(&self) -> &GlogFlags {
        &self.glog
    }

    fn validate(&self) -> Result<(), String> {
        let named = self
            .etcd_endpoints
            .as_ref()
            .is_some_and(|e| !e.0.is_empty());
        match self.enable_ha && !named {
            true => Err(
                "--enable_ha needs --etcd_endpoints naming an etcd member (h1:2379,h2:2379)".into(),
            ),
            false => Ok(()),
        }
    }

    fn run(self) -> Result<(), String> {
        run(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> MasterConfig {
        let argv = std::iter::once("mooncake_master").chain(args.iter().copied());
        config_from(&Flags::try_parse_from(argv).expect("flags parse")).expect("config")
    }

    /// Upstream's SSD switches: `--enable_offload` alone copies every write to disk at its
    /// end (write-through); with `--offload_on_evict`, or without either, objects go to
    /// disk only when evicted.
    #[test]
    fn enable_offload_without_offload_on_evict_is_write_through() {
        assert!(config(&["--enable_offload"]).offload_at_put);
        assert!(config(&["--enable_offload=true"]).offload_at_put);
        assert!(!config(&[]).offload_at_put);
        assert!(!config(&["--enable_offload", "--offload_on_evict"]).offload_at_put);
        assert!(!config(&["--offload_on_evict=true"]).offload_at_put);
        let promoting = config(&["--promotion_on_hit", "--promotion_admission_threshold=3"]);
        assert!(promoting.promotion_on_hit);
        assert_eq!(promoting.promotion_admission_threshold, 3);
        assert!(!config(&[]).promotion_on_hit);
        assert_eq!(config(&[]).promotion_admission_threshold, 2);
    }

    #[test]
    fn rpc_interface_names_an_interfaces_ipv4_address() {
        assert_eq!(interface_ipv4("lo"), Ok(std::net::Ipv4Addr::LOCALHOST));
        let missing = interface_ipv4("no-such-if0").unwrap_err();
        assert!(missing.contains("no-such-if0"), "{missing}");
        let argv = [
            "mooncake_master",
            "--rpc_interface=lo",
            "--rpc_enable_tcp_no_delay=1",
        ];
        let flags = Flags::try_parse_from(argv).expect("flags parse");
        assert!(flags.rpc_enable_tcp_no_delay);
        assert_eq!(flags.rpc_interface, "lo");
    }

    /// Upstream's `--rpc_conn_timeout_seconds=0` (its default): idle connections are kept.
    #[test]
    fn a_zero_connection_timeout_keeps_idle_connections() {
        let limits = |args: &[&str]| {
            let argv = std::iter::once("mooncake_master").chain(args.iter().copied());
            limits_from(&Flags::try_parse_from(argv).expect("flags parse"))
        };
        assert_eq!(limits(&[]).idle_timeout, Duration::from_secs(300));
        assert_eq!(
            limits(&["--rpc_conn_timeout_seconds=5"]).idle_timeout,
            Duration::from_secs(5)
        );
        assert_eq!(
            limits(&["--rpc_conn_timeout_seconds=0"]).idle_timeout,
            NO_IDLE_TIMEOUT
        );
    }
}
