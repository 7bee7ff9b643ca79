//! Network fuzzing of servers with a cluster key (this process, the master and the peer hold
//! it; the fuzzed connections do not): nothing gets past the handshake, not even removals or
//! writes over the kept object, and the pool serves the key's holders exactly afterwards. See
//! `common::net_fuzz`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::OnceLock;

/// This process's key file (one per process), mode 0600.
fn key() -> &'static PathBuf {
    static KEY: OnceLock<PathBuf> = OnceLock::new();
    KEY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("mc-net-fuzz-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster.key");
        std::fs::write(&path, format!("{}\n", "6b".repeat(32))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    })
}

#[test]
fn keyed_servers_refuse_every_mutated_frame_at_the_handshake() {
    common::net_fuzz::mutated_frames(Some(key()));
}

#[test]
fn a_keyed_peer_admits_no_request_aimed_inside_its_segment() {
    common::net_fuzz::aimed_requests(Some(key()));
}
