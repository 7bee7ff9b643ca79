//! The `mooncake_master` and `mooncake_client` binaries: flag handling, the HTTP endpoints and
//! endpoint discovery through the master's HTTP metadata server.

mod common;

use common::{free_port, http_get, local_client_with_metadata, pattern, Master, PeerClient};
use mooncake_rs::types::ReplicateConfig;
use std::process::Command;

#[test]
fn unknown_flags_and_bad_values_exit_with_code_2() {
    for args in [
        vec!["--no_such_flag=1"],
        vec!["--eviction_ratio=lots"],
        vec!["--deployment_mode=MESH"],
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
