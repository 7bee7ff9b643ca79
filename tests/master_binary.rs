//! The `mooncake_master` and `mooncake_client` binaries: flag handling, the HTTP endpoints and
//! endpoint discovery through the master's HTTP metadata server.

mod common;

use common::{
    free_port, free_ports, http_get, local_client_with_metadata, pattern, peer_args, Launched,
    Master, PeerClient,
};
use mooncake_rs::types::ReplicateConfig;
use std::process::Command;
use std::time::Duration;

const MASTER: &str = env!("CARGO_BIN_EXE_mooncake_master");

/// Starts `mooncake_master` with exactly `args` and waits until it accepts on `rpc_port`.
fn serving_master(rpc_port: u16, args: &[String]) -> Launched {
    let mut master = Launched::spawn(MASTER, args);
    master.wait_listening(rpc_port);
    master
}

/// Starts a master on free 127.0.0.1 RPC and metrics ports with `extra` flags; returns it with
/// its RPC port.
fn master_on_free_ports(extra: &[&str]) -> (Launched, u16) {
    let [rpc, metrics] = free_ports(2)[..] else {
        unreachable!("free_ports(2) returns two ports")
    };
    let mut args = vec![
        "--rpc_address=127.0.0.1".to_string(),
        format!("--rpc_port={rpc}"),
        "--metrics_host=127.0.0.1".into(),
        format!("--metrics_port={metrics}"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    (serving_master(rpc, &args), rpc)
}

/// SIGTERMs `process`, asserts that it exits with status 0 and returns all its stderr.
fn clean_exit(mut process: Launched) -> String {
    let code = process.terminate();
    let stderr = process.stderr();
    assert_eq!(code, Some(0), "stderr:\n{stderr}");
    stderr
}

/// Puts and gets one object through the master on 127.0.0.1:`rpc_port`.
fn assert_serves(rpc_port: u16) {
    let client =
        local_client_with_metadata(&format!("127.0.0.1:{rpc_port}"), 1 << 20, 0, "P2PHANDSHAKE");
    let value = pattern(4096, 7);
    client
        .put_from("served", &value, &ReplicateConfig::default())
        .unwrap();
    let mut out = vec![0u8; 4096];
    assert_eq!(client.get_into("served", &mut out), Ok(4096));
    assert_eq!(out, value);
    client.teardown();
}

#[test]
fn upstream_launch_line_with_logtostderr_serves_and_exits_0() {
    let [rpc, metrics] = free_ports(2)[..] else {
        unreachable!("free_ports(2) returns two ports")
    };
    let master = serving_master(
        rpc,
        &[
            "--rpc_address=127.0.0.1".into(),
            format!("--rpc_port={rpc}"),
            "--default_kv_lease_ttl=500".into(),
            "--enable_http_metadata_server=false".into(),
            "--logtostderr=true".into(),
            format!("--metrics_port={metrics}"),
            "--metrics_host=127.0.0.1".into(),
        ],
    );
    assert_serves(rpc);
    let stderr = clean_exit(master);
    assert!(
        !stderr.contains("DEBUG"),
        "debug lines without --v:\n{stderr}"
    );
}

#[test]
fn upstream_launch_line_with_the_http_metadata_server_serves_and_exits_0() {
    let [rpc, http, metrics] = free_ports(3)[..] else {
        unreachable!("free_ports(3) returns three ports")
    };
    let master = serving_master(
        rpc,
        &[
            "--default_kv_lease_ttl=500".into(),
            "--enable_http_metadata_server=true".into(),
            "--rpc_address=127.0.0.1".into(),
            format!("--rpc_port={rpc}"),
            "--http_metadata_server_host=127.0.0.1".into(),
            format!("--http_metadata_server_port={http}"),
            "--metrics_host=127.0.0.1".into(),
            format!("--metrics_port={metrics}"),
        ],
    );
    assert_serves(rpc);
    let missing = http_get(http, "/metadata?key=nobody");
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    clean_exit(master);
}

/// Upstream's flags of features this master lacks: at their off values (as upstream's scripts
/// often spell them out) the master starts and serves, knobs are named in a warning; a feature
/// turned on stops it with exit code 2 and a message naming what is missing.
#[test]
fn upstream_flags_of_missing_features_are_accepted_off_and_refused_on() {
    let (master, rpc) = master_on_free_ports(&[
        "--enable_snapshot=false",
        "--enable_kv_events=false",
        "--kv_events_queue_capacity=65536",
        "--dynamic_replication_mode=off",
        "--enable_metadata_cleanup_on_timeout=false",
        "--max_total_pending_tasks=10000",
        "--enable_disk_eviction=true",
    ]);
    assert_serves(rpc);
    let stderr = clean_exit(master);
    for knob in [
        "--kv_events_queue_capacity=65536",
        "--max_total_pending_tasks=10000",
    ] {
        assert!(
            stderr.contains(&format!(
                "{knob} (an upstream Mooncake flag) has no effect here"
            )),
            "no warning for {knob}:\n{stderr}"
        );
    }
    for (flag, says) in [
        ("--enable_snapshot=true", "snapshots are not built"),
        (
            "--config_path=/etc/mooncake/master.yaml",
            "config file is not read",
        ),
        ("--enable_kv_events", "KV-event publisher is not built"),
    ] {
        let out = Command::new(MASTER).arg(flag).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains(says), "{flag}: {stderr}");
    }
}

#[test]
fn v_1_writes_debug_lines_to_stderr() {
    let (master, _) = master_on_free_ports(&["--v=1", "--logtostderr"]);
    assert!(
        master.stderr_shows("mooncake_master flags", Duration::from_secs(5)),
        "{}",
        master.stderr()
    );
    let stderr = clean_exit(master);
    assert!(stderr.contains("DEBUG"), "{stderr}");
}

/// Opens two connections to a master allowing one; returns once the master has closed the
/// second (it logs a warning when it does).
fn exceed_the_connection_cap(rpc_port: u16) {
    use std::io::Read;
    let first = std::net::TcpStream::connect(("127.0.0.1", rpc_port)).unwrap();
    let mut second = std::net::TcpStream::connect(("127.0.0.1", rpc_port)).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(matches!(second.read(&mut byte), Ok(0) | Err(_)));
    drop(first);
}

#[test]
fn minloglevel_2_suppresses_warnings() {
    const WARNING: &str = "refusing an RPC connection: too many";
    let (shown, rpc) = master_on_free_ports(&["--rpc_max_connections=1"]);
    exceed_the_connection_cap(rpc);
    assert!(
        shown.stderr_shows(WARNING, Duration::from_secs(5)),
        "{}",
        shown.stderr()
    );
    clean_exit(shown);
    let (hidden, rpc) = master_on_free_ports(&["--rpc_max_connections=1", "--minloglevel=2"]);
    exceed_the_connection_cap(rpc);
    let stderr = clean_exit(hidden);
    assert!(!stderr.contains(WARNING), "{stderr}");
}

#[test]
fn log_dir_also_writes_the_log_to_a_file_without_colour_codes() {
    let dir = std::env::temp_dir().join(format!("mc-log-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log_dir = format!("--log_dir={}", dir.display());
    let (master, _) = master_on_free_ports(&["--v=1", &log_dir]);
    assert!(master.stderr_shows("mooncake_master flags", Duration::from_secs(5)));
    clean_exit(master);
    let file = std::fs::read_to_string(dir.join("mooncake_master.log")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(file.contains("mooncake_master flags"), "{file}");
    assert!(!file.contains('\u{1b}'), "{file}");
}

#[test]
fn mooncake_client_with_logtostderr_serves_and_exits_0() {
    let master = Master::start(&[]);
    let mut args = peer_args(&master.addr(), "8 MB", "P2PHANDSHAKE");
    args.push("--logtostderr".into());
    let mut peer = Launched::spawn(env!("CARGO_BIN_EXE_mooncake_client"), &args);
    let line = peer.first_line();
    assert!(line.starts_with("READY 127.0.0.1"), "{line:?}");
    clean_exit(peer);
}

/// Upstream's client HTTP server (`--enable_http_server`, `--http_port`): `/health`,
/// `/metrics` as Prometheus text, `/metrics/summary`, 404 elsewhere; and upstream's
/// `--start_offload_rpc_server=false` refused for an owner with an SSD tier.
#[test]
fn mooncake_client_serves_upstreams_http_routes() {
    let master = Master::start(&[]);
    let http_port = free_port();
    let mut args = peer_args(&master.addr(), "8 MB", "P2PHANDSHAKE");
    args.push("--enable_http_server".into());
    args.push(format!("--http_port={http_port}"));
    let mut peer = Launched::spawn(env!("CARGO_BIN_EXE_mooncake_client"), &args);
    let line = peer.first_line();
    assert!(
        line.starts_with("READY 127.0.0.1"),
        "{line:?}: {}",
        peer.stderr()
    );
    let health = http_get(http_port, "/health");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(
        health.ends_with(r#"{"status":"healthy","code":0}"#),
        "{health}"
    );
    let metrics = http_get(http_port, "/metrics");
    assert!(metrics.contains("text/plain; version=0.0.4"), "{metrics}");
    let body = metrics.split("\r\n\r\n").nth(1).unwrap_or_default();
    let samples: Vec<(&str, f64)> = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l.split_once(' ').unwrap_or_else(|| panic!("{l:?}"));
            (name, value.parse().unwrap_or_else(|_| panic!("{l:?}")))
        })
        .collect();
    let sample = |name: &str| samples.iter().find(|(n, _)| *n == name).map(|s| s.1);
    assert_eq!(
        sample("mooncake_client_objects_written"),
        Some(0.0),
        "{body}"
    );
    assert_eq!(
        sample("mooncake_client_location_cache_enabled"),
        Some(1.0),
        "{body}"
    );
    assert!(
        sample("mooncake_client_master_calls").is_some_and(|n| n >= 1.0),
        "{body}"
    );
    assert!(samples
        .iter()
        .all(|(n, _)| n.starts_with("mooncake_client_") || n.starts_with("mooncake_auth_")));
    assert_eq!(
        sample("mooncake_auth_handshakes_total{result=\"no_handshake\"}"),
        Some(0.0),
        "{body}"
    );
    let summary = http_get(http_port, "/metrics/summary");
    assert!(summary.contains("objects written: 0"), "{summary}");
    assert!(http_get(http_port, "/nope").starts_with("HTTP/1.1 404"));
    clean_exit(peer);

    // Refused before the directory is opened (it is never created).
    let dir = std::env::temp_dir().join(format!("mc-write-only-owner-{}", std::process::id()));
    let mut args = peer_args(&master.addr(), "8 MB", "P2PHANDSHAKE");
    args.extend([
        "--enable_offload".into(),
        format!("--ssd_offload_path={}", dir.display()),
        "--start_offload_rpc_server=false".into(),
    ]);
    let out = Command::new(env!("CARGO_BIN_EXE_mooncake_client"))
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--start_offload_rpc_server=false"),
        "{stderr}"
    );
    assert!(!dir.exists());
}

#[test]
fn the_library_entry_points_return_exit_codes() {
    use mooncake_rs::cli::{run_client, run_master};
    assert_eq!(run_master(["mooncake_master", "--no_such_flag=1"]), 2);
    assert_eq!(run_master(["mooncake_master", "--version"]), 0);
    assert_eq!(run_client(["mooncake_client", "--help"]), 0);
    assert_eq!(run_client(["mooncake_client", "--logtostderr=maybe"]), 2);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let args = [
        "mooncake_master".to_string(),
        "--rpc_address=127.0.0.1".into(),
        format!("--rpc_port={port}"),
        "--enable_metric_reporting=false".into(),
    ];
    assert_eq!(run_master(args), 1);
}

#[test]
fn unknown_flags_and_bad_values_exit_with_code_2() {
    for args in [
        vec!["--no_such_flag=1"],
        vec!["--eviction_ratio=lots"],
        vec!["--deployment_mode=MESH"],
        vec!["--enable_ha=true"],
        vec!["--enable_ha=true", "--etcd_endpoints=,"],
        vec!["--enable_ha", "--etcd_endpoints="],
        vec!["--logtostderr=maybe"],
        vec!["--v=lots"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_mooncake_master"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?} printed no error");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_mooncake_client"))
        .arg("--bogus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Upstream's `--rpc_interface` binds the RPC port on that interface's IPv4 address, and
/// `--rpc_enable_tcp_no_delay=false` (ours always sets it) is refused.
#[test]
fn rpc_interface_binds_the_interfaces_address() {
    // 10.255.255.1 is no address of this host: binding it would fail.
    let [rpc_port, metrics] = free_ports(2)[..] else {
        unreachable!("free_ports(2) returns two ports")
    };
    let args = [
        "--rpc_address=10.255.255.1".to_string(),
        "--rpc_interface=lo".into(),
        format!("--rpc_port={rpc_port}"),
        "--metrics_host=127.0.0.1".into(),
        format!("--metrics_port={metrics}"),
    ];
    let master = serving_master(rpc_port, &args);
    assert_serves(rpc_port);
    clean_exit(master);
    let out = Command::new(MASTER)
        .args([
            format!("--rpc_port={}", free_port()),
            "--rpc_address=127.0.0.1".into(),
            "--enable_metric_reporting=false".into(),
            "--rpc_enable_tcp_no_delay=false".into(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rpc_enable_tcp_no_delay"), "{stderr}");
}

#[test]
fn invalid_configuration_is_refused_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_mooncake_master"))
        .args([
            format!("--rpc_port={}", free_port()),
            "--eviction_ratio=1.5".into(),
            "--rpc_address=127.0.0.1".into(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid master configuration"));
}

/// The master binds its HTTP listeners before its RPC port accepts, so a master whose RPC
/// port accepts serves metadata and metrics too, and one whose HTTP port is taken exits
/// before any client can reach it.
#[test]
fn http_listeners_are_bound_before_the_rpc_port() {
    let mut held: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let [rpc, metrics, metadata] = [0, 1, 2].map(|i| held[i].local_addr().unwrap().port());
    let refusal = || {
        let out = Command::new(MASTER)
            .args([
                format!("--rpc_port={rpc}"),
                "--rpc_address=127.0.0.1".into(),
                format!("--metrics_port={metrics}"),
                "--metrics_host=127.0.0.1".into(),
                "--enable_http_metadata_server=true".into(),
                format!("--http_metadata_server_port={metadata}"),
                "--http_metadata_server_host=127.0.0.1".into(),
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = refusal();
    assert!(
        stderr.contains(&format!("cannot serve metrics on port {metrics}"))
            && !stderr.contains("RPC server"),
        "{stderr}"
    );
    drop(held.swap_remove(1));
    let stderr = refusal();
    assert!(
        stderr.contains(&format!("cannot serve metadata on port {metadata}"))
            && !stderr.contains("RPC server"),
        "{stderr}"
    );
}

#[test]
fn metrics_endpoint_reports_objects_segments_and_rpcs() {
    let master = Master::start(&[]);
    let peer = PeerClient::start(&master.addr(), "8 MB");
    let client = local_client_with_metadata(&master.addr(), 0, 0, "P2PHANDSHAKE");
    let cfg = ReplicateConfig {
        preferred_segments: vec![peer.name.clone()],
        ..ReplicateConfig::default()
    };
    client.put_from("m1", &pattern(4096, 1), &cfg).unwrap();
    let text = master.http_get("/metrics");
    for needle in [
        "mooncake_master_objects",
        "mooncake_master_segment_used_bytes",
        "mooncake_master_rpc_calls_total",
        "batch_put_start",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    assert!(master.http_get("/nope").contains("404"));
}

#[test]
fn peers_are_found_through_the_http_metadata_server() {
    // Master::start picks its own ports and starts again on others when this one is taken.
    let http_port = free_port();
    let master = Master::start(&[
        "--enable_http_metadata_server=true",
        &format!("--http_metadata_server_port={http_port}"),
        "--http_metadata_server_host=127.0.0.1",
    ]);
    let url = format!("http://127.0.0.1:{http_port}/metadata");
    let peer = PeerClient::start_with_metadata(&master.addr(), "16 MB", &url);
    let published = http_get(
        http_port,
        &format!("/metadata?key=mooncake/ram/{}", peer.name),
    );
    assert!(
        published.contains("200") && published.contains("tcp_data_port"),
        "{published}"
    );
    let client = local_client_with_metadata(&master.addr(), 0, 0, &url);
    let cfg = ReplicateConfig {
        preferred_segments: vec![peer.name.clone()],
        ..ReplicateConfig::default()
    };
    let value = pattern(1 << 20, 5);
    client.put_from("via-http", &value, &cfg).unwrap();
    let mut out = vec![0u8; 1 << 20];
    assert_eq!(client.get_into("via-http", &mut out), Ok(1 << 20));
    assert_eq!(out, value);
    assert!(client.metrics().transfer.tcp_read_bytes >= 1 << 20);
}

#[test]
fn the_binary_drops_a_stalled_half_frame_and_counts_it() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let master = Master::start(&["--rpc_read_timeout_ms=300", "--rpc_max_connections=64"]);
    let mut stalled = std::net::TcpStream::connect(master.addr()).unwrap();
    stalled.write_all(&[40, 0, 0, 0, 1, 2]).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let sent = Instant::now();
    let mut rest = Vec::new();
    assert_eq!(stalled.read_to_end(&mut rest).unwrap(), 0);
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );
    let text = master.http_get("/metrics");
    assert!(
        text.contains("mooncake_master_rpc_timed_out_connections_total 1"),
        "{text}"
    );
}

#[test]
fn sigterm_right_after_ready_is_a_clean_exit() {
    // The signal may arrive before the process waits for it: it must still be a clean exit
    // (a fresh-clone CI run saw `mooncake_client` die by the signal, exit status None).
    let master = Master::start(&[]);
    for _ in 0..10 {
        let args = peer_args(&master.addr(), "8 MB", "P2PHANDSHAKE");
        let mut peer = Launched::spawn(env!("CARGO_BIN_EXE_mooncake_client"), &args);
        let line = peer.first_line();
        assert!(line.starts_with("READY 127.0.0.1"), "{line:?}");
        clean_exit(peer);
    }
}
