//! `mc_set_cluster_key_file` as a C program calls it: first, before any setup (a process has
//! one key, so this is a binary of its own). The key it names is the one every later
//! connection proves: a client set up without naming a key works against a keyed master.
//! Naming the same file again is fine; another file, NULL or "" is INVALID_PARAMS.

mod common;

use common::Master;
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::ffi::config::mc_set_cluster_key_file;
use mooncake_rs::types::ReplicateConfig;
use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;

fn key_file(name: &str, hex: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mc-ffi-key-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cluster.key");
    std::fs::write(&path, format!("{hex}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

#[test]
fn the_key_named_through_the_c_api_is_the_one_connections_prove() {
    let key = key_file("ours", &"9e".repeat(32));
    let path = CString::new(key.display().to_string()).unwrap();
    assert_eq!(mc_set_cluster_key_file(path.as_ptr()), 0);
    assert_eq!(
        mc_set_cluster_key_file(path.as_ptr()),
        0,
        "the same file again"
    );
    let other = key_file("other", &"d4".repeat(32));
    let other = CString::new(other.display().to_string()).unwrap();
    assert_eq!(mc_set_cluster_key_file(other.as_ptr()), -600);
    assert!(mooncake_rs::error::last_error_message().contains("already uses"));
    assert_eq!(mc_set_cluster_key_file(std::ptr::null()), -600);
    assert_eq!(mc_set_cluster_key_file(c"".as_ptr()), -600);

    let master = Master::start(&[&format!("--cluster_key_file={}", key.display())]);
    let client = Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 16 << 20,
        local_buffer_size: 16 << 20,
        master_server_addr: master.addr(),
        ..SetupConfig::default()
    })
    .unwrap_or_else(|e| panic!("setup: {e}: {}", mooncake_rs::error::last_error_message()));
    client
        .put("c-api", &[9u8; 4096], &ReplicateConfig::default())
        .unwrap();
    let mut back = vec![0u8; 4096];
    assert_eq!(client.get_into("c-api", &mut back), Ok(4096));
    assert_eq!(back, vec![9u8; 4096]);
    assert!(mooncake_rs::auth::counters().client_failed == 0);
    client.teardown();
}
