//! `mooncake_client`: a standalone client process that contributes a segment to the pool and
//! serves it until SIGINT/SIGTERM. Prints `READY <segment name>` on stdout once mounted.
//!
//! With `--deployment_mode P2P` it is a P2P owner instead: a TieredBackend from
//! `--tiered_backend_config`, the client RPC service on `--client_rpc_port`, and
//! `READY <segment name> <client RPC address>` once registered with the master.
//! A CENTRALIZED client also serves dummy clients of this host (`setup_dummy` with its
//! segment name as the server address) over `@mooncake_client_<port>.sock`; see
//! `docs/standalone.md`.
//! `MOONCAKE_DM_LOCK_SHARD_COUNT` (default 1024) sets the record-table shard count.

use super::glog::GlogFlags;
use super::Program;
use crate::client::{parse_size, ssd_offload_dir, Client, ClientHttpServer, SetupConfig};
use crate::p2p::{P2pClient, P2pSetupConfig, TransferDirection};
use crate::standalone::DummyServer;
use clap::Parser;
use std::io::Write;

#[derive(Parser, Debug)]
#[command(
    name = "mooncake_client",
    version,
    about = "Mooncake Store standalone client (mooncake-rs)",
    args_override_self = true
)]
pub(super) struct Flags {
    #[command(flatten)]
    glog: GlogFlags,
    /// Master address `host:port`.
    #[arg(long = "master_server_address", default_value = "127.0.0.1:50051")]
    master_server_address: String,
    /// The address peers reach this client's data port at: the segment name is `host` and
    /// a port picked in [MC_STORE_CLIENT_MIN_PORT, MC_STORE_CLIENT_MAX_PORT], or `ip:port` to
    /// choose it. (Upstream's default is 0.0.0.0, which names no reachable address.)
    #[arg(long = "host", default_value = "127.0.0.1")]
    host: String,
    /// The real client service port (upstream's): dummies of this host attach with
    /// `setup_dummy(…, "host:<port>")`, on `@mooncake_client_<port>.sock` (and with the
    /// segment name); 0: only with the segment name.
    #[arg(long = "port", default_value_t = 50052)]
    port: u16,
    /// `P2PHANDSHAKE` or `http://host:port/metadata`.
    #[arg(long = "metadata_server", default_value = "P2PHANDSHAKE")]
    metadata_server: String,
    /// Segment size contributed to the pool, e.g. `4 GB`.
    #[arg(long = "global_segment_size", default_value = "4 GB")]
    global_segment_size: String,
    /// Local buffer size (this process's own staging; dummies bring their own).
    #[arg(long = "local_buffer_size", default_value = "0")]
    local_buffer_size: String,
    /// Transport protocol.
    #[arg(long = "protocol", default_value = "tcp")]
    protocol: String,
    /// Worker threads (upstream's `--threads`; accepted: dummies are served one thread each).
    #[arg(long = "threads", default_value_t = 1)]
    threads: usize,
    /// RDMA device names (unused by TCP).
    #[arg(long = "device_name", alias = "device_names", default_value = "")]
    device_name: String,
    /// CENTRALIZED (mount a segment) or P2P (own a TieredBackend, serve client RPCs).
    #[arg(long = "deployment_mode", default_value = "CENTRALIZED", value_parser = ["CENTRALIZED", "P2P"])]
    deployment_mode: String,
    /// P2P: port of the client RPC service (0 picks one).
    #[arg(long = "client_rpc_port", default_value_t = 0)]
    client_rpc_port: u16,
    /// P2P: threads of the client RPC service.
    #[arg(long = "client_rpc_thread_num", default_value_t = 16)]
    client_rpc_thread_num: usize,
    /// P2P: TieredBackend JSON, e.g. {"tiers":[{"type":"DRAM","capacity":536870912,"priority":100,"allocator_type":"OFFSET"}]}.
    #[arg(long = "tiered_backend_config", default_value = "")]
    tiered_backend_config: String,
    /// P2P: lease of PreWrite / PinKey records (ms).
    #[arg(long = "p2p_key_lease_duration_ms", default_value_t = 5000)]
    p2p_key_lease_duration_ms: u64,
    /// P2P: period of the expired-record scan (ms; 0 = 1000).
    #[arg(long = "p2p_key_lease_scan_interval_ms", default_value_t = 1000)]
    p2p_key_lease_scan_interval_ms: u64,
    /// Turn the SSD tier on (upstream's flag): its directory is `--ssd_offload_path`, or
    /// `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH` (`docs/ssd-tier.md`).
    #[arg(long = "enable_offload", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = super::glog::gflags_bool)]
    enable_offload: bool,
    /// The SSD tier's directory (with `--enable_offload`).
    #[arg(long = "ssd_offload_path", default_value = "")]
    ssd_offload_path: String,
    /// The cluster key file (mooncake-rs flag; format in README, "Cluster key"): every
    /// connection opens with the key's handshake. Empty: `MC_CLUSTER_KEY_FILE`, else no key.
    #[arg(long = "cluster_key_file", default_value = "")]
    cluster_key_file: String,
    /// Certificates (PEM) to trust for TLS to the master and `https://` metadata (mooncake-rs
    /// flag; README, "TLS"): master connections use TLS. Empty: `MC_TLS_CA_FILE`, else none.
    #[arg(long = "tls_ca_file", default_value = "")]
    tls_ca_file: String,
    /// Upstream's tenant of this client; only `default` (one tenant per pool here).
    #[arg(long = "tenant_id", default_value = "default")]
    tenant_id: String,
    /// P2P: default transfer direction, forward or reverse.
    #[arg(long = "p2p_transfer_direction_mode", default_value = "reverse", value_parser = ["forward", "reverse"])]
    p2p_transfer_direction_mode: String,
    /// Upstream's switch for serving reads of the SSD tier to other clients: always on here
    /// (the master lists an owner's disk copies to every reader); `false` with
    /// `--enable_offload` is refused.
    #[arg(long = "start_offload_rpc_server", default_value = "true", num_args = 0..=1, default_missing_value = "true", value_parser = super::glog::gflags_bool)]
    start_offload_rpc_server: bool,
    /// Serve `/health`, `/metrics` and `/metrics/summary` over HTTP on `--http_port`.
    #[arg(long = "enable_http_server", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = super::glog::gflags_bool)]
    enable_http_server: bool,
    /// Port of the HTTP server (with `--enable_http_server`).
    #[arg(long = "http_port", default_value_t = 9300)]
    http_port: u16,
    /// Upstream's arena allocator for its mmap buffers; accepted, no effect here (a segment
    /// is one mapping, allocated once).
    #[arg(long = "use_mmap_arena_allocator", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = super::glog::gflags_bool)]
    use_mmap_arena_allocator: bool,
    /// Upstream's arena pool size (with `--use_mmap_arena_allocator`); accepted, no effect.
    #[arg(long = "mmap_arena_pool_size", default_value_t = 8 << 30)]
    mmap_arena_pool_size: u64,
}

fn run_p2p(flags: Flags, local_hostname: String) -> Result<(), String> {
    let size = parse_size(&flags.local_buffer_size)
        .map_err(|e| format!("bad size '{}': {e}", flags.local_buffer_size))?;
    let direction =
        TransferDirection::parse(&flags.p2p_transfer_direction_mode).map_err(|e| format!("{e}"))?;
    let client = P2pClient::setup_p2p(P2pSetupConfig {
        local_hostname,
        metadata_server: flags.metadata_server.clone(),
        tiered_backend_config_json: flags.tiered_backend_config.clone(),
        local_buffer_size: size,
        protocol: flags.protocol.clone(),
        rdma_devices: flags.device_name.clone(),
        master_server_addr: flags.master_server_address.clone(),
        client_rpc_port: flags.client_rpc_port,
        client_rpc_thread_num: flags.client_rpc_thread_num,
        p2p_key_lease_duration_ms: flags.p2p_key_lease_duration_ms,
        p2p_key_lease_scan_interval_ms: flags.p2p_key_lease_scan_interval_ms,
        p2p_transfer_direction_mode: direction,
    })
    .map_err(|e| {
        format!(
            "P2P setup failed: {e}: {}",
            crate::error::last_error_message()
        )
    })?;
    let rpc = client
        .owner_info()
        .map(|o| o.rpc_addr)
        .unwrap_or_else(|| "-".into());
    let mut out = std::io::stdout();
    let _ = writeln!(out, "READY {} {rpc}", client.hostname());
    let _ = out.flush();
    crate::wait_for_termination();
    client.teardown();
    Ok(())
}

fn run(flags: Flags) -> Result<(), String> {
    let size = |text: &str| parse_size(text).map_err(|e| format!("bad size '{text}': {e}"));
    let local_hostname = segment_host(&flags.host)?;
    check_tenant(&flags.tenant_id)?;
    if flags.enable_offload && !flags.start_offload_rpc_server {
        return Err(
            "--start_offload_rpc_server=false: an owner always serves reads of its SSD tier \
             (write-only owners are not supported)"
                .into(),
        );
    }
    let _ = (
        flags.threads,
        flags.use_mmap_arena_allocator,
        flags.mmap_arena_pool_size,
    );
    super::use_cluster_key(&flags.cluster_key_file)?;
    super::use_tls_ca(&flags.tls_ca_file)?;
    if flags.deployment_mode == "P2P" {
        if flags.enable_http_server {
            return Err(
                "--enable_http_server: a P2P owner (--deployment_mode=P2P) serves none".into(),
            );
        }
        return run_p2p(flags, local_hostname);
    }
    let service_port = reserve_service_port(&local_hostname, flags.port)?;
    let client = Client::setup(SetupConfig {
        local_hostname,
        metadata_server: flags.metadata_server.clone(),
        global_segment_size: size(&flags.global_segment_size)?,
        local_buffer_size: size(&flags.local_buffer_size)?,
        protocol: flags.protocol.clone(),
        device_name: flags.device_name.clone(),
        master_server_addr: flags.master_server_address.clone(),
        ssd_offload_path: ssd_offload_dir(flags.enable_offload, &flags.ssd_offload_path)
            .map_err(|e| format!("{e}: {}", crate::error::last_error_message()))?,
        cluster_key_file: flags.cluster_key_file.clone(),
    })
    .map_err(|e| format!("setup failed: {e}: {}", crate::error::last_error_message()))?;
    let (dummies, http) = match serve(&client, &flags) {
        Ok(servers) => servers,
        Err(e) => {
            client.teardown();
            return Err(e);
        }
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "READY {}", client.get_hostname());
    let _ = out.flush();
    crate::wait_for_termination();
    drop(http);
    drop(dummies);
    client.teardown();
    drop(service_port);
    Ok(())
}

/// Starts what a real client serves besides its segment: dummies of this host on
/// `@mooncake_client_<--port>.sock` and under its segment name's port (an in-process master's
/// dummies are refused when they attach: they could not reach it), and the HTTP server when
/// asked. `Err` (for stderr) when either cannot start; nothing is left running then.
fn serve(
    client: &Client,
    flags: &Flags,
) -> Result<(DummyServer, Option<ClientHttpServer>), String> {
    let detail = crate::error::last_error_message;
    let dummies = client
        .serve_dummies(flags.master_server_address.trim(), flags.port)
        .map_err(|e| format!("cannot serve dummies: {e}: {}", detail()))?;
    let http = match flags.enable_http_server {
        true => Some(
            ClientHttpServer::start(client, flags.http_port).map_err(|e| {
                format!(
                    "cannot serve HTTP on port {}: {e}: {}",
                    flags.http_port,
                    detail()
                )
            })?,
        ),
        false => None,
    };
    Ok((dummies, http))
}

/// Holds TCP port `port` (`--port`) on the address of `segment` (`--host`) for the process's
/// life, as upstream's real client holds it with its RPC server: bound, never listening (a
/// connection is refused), without `SO_REUSEADDR`, so a second real client with the same
/// `--port` fails at start and no client picks the port as its data port (a name clash of
/// their dummy sockets). None for port 0, or when the segment name carries that port itself
/// (its data listener holds it).
///
/// Errors (for stderr): the port is taken, or the host does not resolve.
fn reserve_service_port(segment: &str, port: u16) -> Result<Option<socket2::Socket>, String> {
    let (host, data_port) = match segment.rsplit_once(':') {
        _ if segment.parse::<std::net::Ipv6Addr>().is_ok() => (segment, None),
        Some((host, tail)) => (host, tail.parse::<u16>().ok()),
        None => (segment, None),
    };
    if port == 0 || data_port == Some(port) {
        return Ok(None);
    }
    let addr = super::socket(host.trim_matches(|c| c == '[' || c == ']'), port)?;
    let taken = |e: std::io::Error| {
        format!(
            "--port={port}: TCP port {port} on {host} is taken ({e}); another mooncake_client of \
             this host? Give each its own --port (0: none)"
        )
    };
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .map_err(taken)?;
    socket.bind(&addr.into()).map_err(taken)?;
    Ok(Some(socket))
}

impl Program for Flags {
    const NAME: &'static str = "mooncake_client";

    fn glog(&self) -> &GlogFlags {
        &self.glog
    }

    fn run(self) -> Result<(), String> {
        run(self)
    }
}

/// The segment name (`local_hostname`) `--host` asks for: a host (a data port is picked) or
/// `ip:port` (that data port, as upstream accepts); a bare IPv6 address is a host. Errors: an
/// empty host, or one whose part after its last colon is not a port.
fn segment_host(host: &str) -> Result<String, String> {
    if host.is_empty() {
        return Err("--host is empty".into());
    }
    match host.rsplit_once(':') {
        _ if host.parse::<std::net::Ipv6Addr>().is_ok() => Ok(host.to_string()),
        Some((_, tail)) if tail.parse::<u16>().is_err() => {
            Err(format!("--host={host}: '{tail}' is not a port"))
        }
        _ => Ok(host.to_string()),
    }
}

/// Upstream's `--tenant_id`: this pool has one tenant, `default`. Errors: any other.
fn check_tenant(tenant: &str) -> Result<(), String> {
    match tenant {
        "default" => Ok(()),
        other => Err(format!(
            "--tenant_id={other}: multi-tenant pools are not supported; only the default tenant"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_port_comes_from_host_only() {
        assert_eq!(segment_host("127.0.0.1").unwrap(), "127.0.0.1");
        assert_eq!(segment_host("10.0.0.1:6000").unwrap(), "10.0.0.1:6000");
        // A bare IPv6 address is a host.
        assert_eq!(segment_host("::1").unwrap(), "::1");
        assert!(segment_host("").is_err());
        let bad = segment_host("localhost:abc").unwrap_err();
        assert!(bad.contains("'abc' is not a port"), "{bad}");
    }

    #[test]
    fn defaults_are_upstreams_and_a_repeated_flag_takes_the_last_value() {
        let flags = Flags::try_parse_from(["mooncake_client"]).unwrap();
        assert_eq!(flags.port, 50052);
        assert_eq!(flags.local_buffer_size, "0");
        assert_eq!(flags.master_server_address, "127.0.0.1:50051");
        assert_eq!(flags.global_segment_size, "4 GB");
        assert!(flags.start_offload_rpc_server && !flags.enable_http_server);
        assert_eq!(flags.http_port, 9300);
        // As gflags: the last of a repeated flag wins.
        let flags = Flags::try_parse_from([
            "mooncake_client",
            "--host=127.0.0.1",
            "--host=10.0.0.1:7000",
        ])
        .unwrap();
        assert_eq!(flags.host, "10.0.0.1:7000");
        // Upstream's remaining client flags parse.
        let upstream = [
            "mooncake_client",
            "--start_offload_rpc_server=true",
            "--enable_http_server=true",
            "--http_port=9400",
            "--use_mmap_arena_allocator=0",
            "--mmap_arena_pool_size=1073741824",
        ];
        let flags = Flags::try_parse_from(upstream).unwrap();
        assert!(flags.enable_http_server && flags.http_port == 9400);
    }

    #[test]
    fn upstreams_tenant_flag_is_accepted_for_the_default_tenant_only() {
        let flags = Flags::try_parse_from(["mooncake_client", "--tenant_id=default"]).unwrap();
        assert!(check_tenant(&flags.tenant_id).is_ok());
        let flags = Flags::try_parse_from(["mooncake_client"]).unwrap();
        assert!(check_tenant(&flags.tenant_id).is_ok());
        let other = check_tenant("team-a").unwrap_err();
        assert!(other.contains("team-a"), "{other}");
    }
}
