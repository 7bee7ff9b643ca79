//! The cluster key across real processes: a `mooncake_master` and a `mooncake_client` peer
//! started with `--cluster_key_file`, an in-process client with the same key file (this test
//! process's key: one key file per process, so every test here uses the same one), and
//! clients with another key or none, which are refused on every port before any request.

mod common;

use common::{Launched, Master, PeerClient};
use mooncake_rs::client::Client;
use mooncake_rs::types::ReplicateConfig;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// The role the master's RPC port proves and checks (its interface's name).
const MASTER_ROLE: &str =
    <mooncake_rs::master::MasterInterface as mooncake_rs::rpc::Interface>::NAME;

/// Writes a key file (mode 0600) holding `hex` in a fresh directory; returns its path.
fn key_file(name: &str, hex: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mc-cluster-key-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cluster.key");
    std::fs::write(&path, format!("# test key\n{hex}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// This test process's key file.
fn our_key() -> &'static PathBuf {
    static KEY: OnceLock<PathBuf> = OnceLock::new();
    KEY.get_or_init(|| key_file("ours", &"5a".repeat(32)))
}

fn flag(path: &std::path::Path) -> String {
    format!("--cluster_key_file={}", path.display())
}

/// A `mooncake_client` with `key` (or none) against `master`; returns its stderr once it
/// exits and its exit code (it must exit: setup fails).
fn refused_client(master: &str, key: Option<&std::path::Path>) -> (Option<i32>, String) {
    let mut args = common::peer_args(master, "16 MB", "P2PHANDSHAKE");
    args.extend(key.map(flag));
    let mut client = Launched::spawn(env!("CARGO_BIN_EXE_mooncake_client"), &args);
    assert!(
        client.stderr_shows("setup failed", Duration::from_secs(20)),
        "the client set up: {}",
        client.stderr()
    );
    let code = client.terminate();
    (code, client.stderr())
}

/// Whether a raw connection to 127.0.0.1:`port` that sends `bytes` is closed by the server
/// without an answer byte.
fn closed_without_an_answer(port: u16, bytes: &[u8]) -> bool {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let mut answer = [0u8; 64];
    matches!(stream.read(&mut answer), Ok(0) | Err(_))
}

/// A keyed pool: a master and a peer with a segment (over TCP: `MC_SAME_HOST=0`), both with
/// [`our_key`], and an in-process client with the key.
struct KeyedPool {
    master: Master,
    _peer: PeerClient,
    /// The peer's data port.
    data_port: u16,
    /// The peer's client HTTP server (`/metrics`).
    peer_http_port: u16,
    client: Client,
}

fn keyed_pool(segment: &str) -> KeyedPool {
    let key = our_key();
    let master = Master::start(&[&flag(key)]);
    let peer_http_port = common::free_port();
    let peer = PeerClient::spawn(
        &master.addr(),
        segment,
        "P2PHANDSHAKE",
        &[
            flag(key),
            "--enable_http_server".into(),
            format!("--http_port={peer_http_port}"),
        ],
        &[("MC_SAME_HOST", "0")],
    );
    let data_port: u16 = peer.name.rsplit(':').next().unwrap().parse().unwrap();
    let client = common::keyed_client(&master.addr(), "P2PHANDSHAKE", Some(key), 32 << 20);
    KeyedPool {
        master,
        _peer: peer,
        data_port,
        peer_http_port,
        client,
    }
}

/// The value of the sample `name` (its labels included) in a Prometheus text `page`.
fn sample(page: &str, name: &str) -> u64 {
    let prefix = format!("{name} ");
    let found = page.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
    found
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        .trim()
        .parse()
        .unwrap()
}

/// Asserts that the `role` server on 127.0.0.1:`port` closes a connection that sends no
/// handshake without an answer, and refuses one that proves another key (`AUTH_FAILED`).
fn refuses_strangers(port: u16, role: &'static str) {
    use mooncake_rs::auth::{client_blocking, KeyRing, Keys};
    assert!(closed_without_an_answer(
        port,
        &[8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]
    ));
    let other = KeyRing::fixed(Keys::parse(&"c3".repeat(32)).unwrap());
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        client_blocking(&mut stream, &other, role),
        Err(mooncake_rs::ErrorCode::AuthFailed),
        "{role} on port {port}"
    );
}

#[test]
fn a_keyed_cluster_serves_clients_with_the_key_and_refuses_the_others_on_every_port() {
    // This process proves the same key: every operation family works.
    let pool = keyed_pool("64 MB");
    let (master, data_port, client) = (&pool.master, pool.data_port, &pool.client);
    let value: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    client
        .put("k1", &value, &ReplicateConfig::default())
        .unwrap();
    let mut back = vec![0u8; value.len()];
    assert_eq!(
        client.get_into("k1", &mut back).unwrap(),
        value.len() as u64
    );
    assert_eq!(back, value);
    let keys = ["b1", "b2"];
    let values = [vec![1u8; 4096], vec![2u8; 8192]];
    let parts: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    client
        .put_batch(&keys, &parts, &ReplicateConfig::default())
        .unwrap();
    let (mut b1, mut b2) = (vec![0u8; 4096], vec![0u8; 8192]);
    let got = client.batch_get_into(&keys, &mut [&mut b1[..], &mut b2[..]]);
    assert_eq!(got, vec![Ok(4096), Ok(8192)]);
    assert_eq!([b1, b2], values);
    assert_eq!(client.is_exist("b1"), Ok(true));
    client.remove("b1", true).unwrap(); // forced: the batch read holds a lease
    assert_eq!(client.is_exist("b1"), Ok(false));
    // Upsert, ranges, an owned buffer, removal by pattern.
    let newer = vec![7u8; 5000];
    client
        .upsert("b2", &newer, &ReplicateConfig::default())
        .unwrap();
    let keys = vec![vec!["k1".to_string(), "b2".to_string()]];
    let (dst, src, sizes) = (
        vec![vec![vec![0], vec![100]]],
        vec![vec![vec![1000], vec![10]]],
        vec![vec![vec![100], vec![50]]],
    );
    let request = mooncake_rs::client::RangeRequest {
        keys: &keys,
        dst_offsets: &dst,
        src_offsets: &src,
        sizes: &sizes,
    };
    let mut ranges = [0u8; 150];
    let got = client.get_into_ranges(&mut [&mut ranges[..]], &request);
    assert_eq!(got, vec![vec![vec![Ok(100)], vec![Ok(50)]]]);
    assert_eq!(&ranges[..100], &value[1000..1100]);
    assert_eq!(&ranges[100..], &newer[10..60]);
    assert_eq!(client.get_buffer("b2").unwrap().as_slice(), &newer[..]);
    assert_eq!(client.remove_by_regex("^b", true), Ok(1));
    // Another key, or none: setup fails at the master, AUTH_FAILED / RPC_FAIL.
    let other = key_file("other", &"c3".repeat(32));
    let (code, stderr) = refused_client(&master.addr(), Some(&other));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("AUTH_FAILED"), "{stderr}");
    let (code, stderr) = refused_client(&master.addr(), None);
    assert_eq!(code, Some(1), "{stderr}");
    // Raw bytes on the master's RPC port and on the peer's data port are never answered.
    assert!(closed_without_an_answer(
        master.port,
        &[8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]
    ));
    assert!(closed_without_an_answer(data_port, &[0x80; 64]));
    // The peer counts the refusals of its data port in its own `/metrics`.
    let peer_metrics = common::http_get(pool.peer_http_port, "/metrics");
    let no_handshake = "mooncake_auth_handshakes_total{result=\"no_handshake\"}";
    assert!(sample(&peer_metrics, no_handshake) >= 1, "{peer_metrics}");
    // Nothing changed for the key's holders; the master counted the refusals.
    assert_eq!(
        client.get_into("k1", &mut back).unwrap(),
        value.len() as u64
    );
    assert_eq!(back, value);
    let metrics = master.http_get("/metrics");
    let count = |label: &str| -> u64 {
        sample(
            &metrics,
            &format!("mooncake_auth_handshakes_total{{result=\"{label}\"}}"),
        )
    };
    assert!(count("accepted") >= 2, "{metrics}");
    assert!(count("unknown_key") >= 1, "{metrics}");
    assert!(count("no_handshake") >= 2, "{metrics}");
    assert_eq!(client.remove_all(true), Ok(1));
    client.teardown();
}

/// A keyed master's HTTP metadata service serves its key's holders (a peer publishes its
/// segment, a client finds it and reads over TCP) and nobody else: a plain HTTP read of the
/// descriptor and an overwrite pointing the segment elsewhere get the connection closed
/// unanswered, and the data still flows to the right peer afterwards.
#[test]
fn a_keyed_metadata_service_serves_only_holders_of_the_key() {
    let key = our_key();
    let http_port = common::free_port();
    let master = Master::start(&[
        &flag(key),
        "--enable_http_metadata_server=true",
        &format!("--http_metadata_server_port={http_port}"),
        "--http_metadata_server_host=127.0.0.1",
    ]);
    let url = format!("http://127.0.0.1:{http_port}/metadata");
    let peer = PeerClient::spawn(
        &master.addr(),
        "16 MB",
        &url,
        &[flag(key)],
        &[("MC_SAME_HOST", "0")],
    );
    let client = common::keyed_client(&master.addr(), &url, Some(key), 16 << 20);
    let read = format!(
        "GET /metadata?key=mooncake/ram/{} HTTP/1.1\r\nHost: x\r\n\r\n",
        peer.name
    );
    assert!(closed_without_an_answer(http_port, read.as_bytes()));
    let forged = r#"{"name":"x","protocol":"tcp","tcp_data_port":1,"buffers":[]}"#;
    let overwrite = format!(
        "PUT /metadata?key=mooncake/ram/{} HTTP/1.1\r\nContent-Length: {}\r\n\r\n{forged}",
        peer.name,
        forged.len()
    );
    assert!(closed_without_an_answer(http_port, overwrite.as_bytes()));
    let config = ReplicateConfig {
        preferred_segments: vec![peer.name.clone()],
        ..ReplicateConfig::default()
    };
    let value: Vec<u8> = (0..1 << 20).map(|i| (i % 253) as u8).collect();
    client.put("via-http", &value, &config).unwrap();
    let mut back = vec![0u8; value.len()];
    assert_eq!(client.get_into("via-http", &mut back), Ok(1 << 20));
    assert_eq!(back, value);
    assert!(client.metrics().transfer.tcp_read_bytes >= 1 << 20);
    client.teardown();
}

/// Everything the server sends on a fresh connection to 127.0.0.1:`port` after `bytes`, until
/// it closes (at most 2 s).
fn answer_to(port: u16, bytes: &[u8]) -> Vec<u8> {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return Vec::new();
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

/// Fuzzing a keyed master and peer gets nothing past the handshake: valid and mutated
/// request frames, transfer headers and handshakes (mutated hellos, a proof replayed from
/// another connection) are refused with no answer but the handshake's own, the master counts
/// every one, and the key's holder reads its object back exactly afterwards.
#[test]
fn fuzzed_and_replayed_connections_get_nothing_past_the_handshake() {
    use mooncake_rs::auth::protocol::{ClientHandshake, CHALLENGE_LEN, PROOF_LEN};
    use mooncake_rs::auth::{KeyRing, Keys};
    let key = our_key();
    let pool = keyed_pool("16 MB");
    let (master, data_port, client) = (&pool.master, pool.data_port, &pool.client);
    let kept: Vec<u8> = (0..300_000).map(|i| (i % 241) as u8).collect();
    client
        .put("kept", &kept, &ReplicateConfig::default())
        .unwrap();
    let refused = || -> u64 {
        let metrics = master.http_get("/metrics");
        let lines = metrics
            .lines()
            .filter(|l| l.starts_with("mooncake_auth_handshakes_total"));
        let refusals = lines.filter(|l| !l.contains("\"accepted\""));
        refusals
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    let before = refused();
    let seed = std::env::var("NET_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    let seed = seed.unwrap_or_else(|| fastrand::u64(..));
    println!("cluster_key fuzz seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let keys = Keys::parse(&std::fs::read_to_string(key).unwrap()).unwrap();
    let (_, hello) = ClientHandshake::start(&keys, MASTER_ROLE).unwrap();
    // Valid master requests, unmutated: a removal of everything without the key.
    let valid = [
        vec![4u8, 0, 0, 0, 0, 0, 0, 0],
        b"GET /metrics HTTP/1.1\r\n\r\n".to_vec(),
        hello.to_vec(),
    ];
    let mut to_master = 0u64;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(6) && to_master < 600 {
        let base = &valid[rng.usize(0..valid.len())];
        let mut bytes = base.clone();
        for _ in 0..rng.usize(0..4) {
            let at = rng.usize(0..bytes.len());
            bytes[at] ^= 1 << rng.u8(0..8);
        }
        bytes.extend((0..rng.usize(0..64)).map(|_| rng.u8(..)));
        for port in [master.port, data_port] {
            let answer = answer_to(port, &bytes);
            // A hello that kept our magic and key id gets a challenge; a bogus proof after it
            // (the fuzz's bytes) never gets an accepting verdict.
            assert!(
                answer.len() <= CHALLENGE_LEN + 8,
                "{} answer bytes",
                answer.len()
            );
            assert!(
                !answer.windows(8).any(|w| w == b"MCAUTHOK"),
                "accepted: {bytes:?}"
            );
        }
        to_master += 1;
    }
    // A proof recorded on one connection, replayed on another: refused.
    let ring = KeyRing::fixed(keys.clone());
    let mut first = TcpStream::connect(("127.0.0.1", master.port)).unwrap();
    let (handshake, hello) = ClientHandshake::start(&ring.keys(), MASTER_ROLE).unwrap();
    first.write_all(&hello).unwrap();
    let mut challenge = [0u8; CHALLENGE_LEN];
    first.read_exact(&mut challenge).unwrap();
    let proof: [u8; PROOF_LEN] = handshake.answer(&challenge).unwrap();
    let mut replay = TcpStream::connect(("127.0.0.1", master.port)).unwrap();
    replay
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    replay.write_all(&hello).unwrap();
    replay.read_exact(&mut challenge).unwrap();
    replay.write_all(&proof).unwrap();
    let mut verdict = Vec::new();
    let _ = replay.read_to_end(&mut verdict);
    assert_eq!(verdict, b"MCAUTHNO");
    drop(first);
    // Every fuzzed connection to the master (and the replay, and the unfinished first) was
    // refused; the pool serves its key's holder as before.
    let want = before + to_master + 2;
    assert!(
        common::wait_until(Duration::from_secs(10), || refused() >= want),
        "refused {} of {want}",
        refused()
    );
    let mut back = vec![0u8; kept.len()];
    assert_eq!(
        client.get_into("kept", &mut back).unwrap(),
        kept.len() as u64
    );
    assert_eq!(back, kept);
    client
        .put("fresh", &kept[..1000], &ReplicateConfig::default())
        .unwrap();
    client.teardown();
}

/// A keyed P2P (V3) deployment: an owner with the key serves this process's accessors in
/// both directions, and its RPC and data ports refuse connections without the key or with
/// another before any request.
#[test]
fn a_keyed_p2p_owner_serves_holders_of_the_key_and_refuses_the_others() {
    use mooncake_rs::p2p::{PeerInterface, RequestOptions, TransferDirection};
    let key = our_key();
    mooncake_rs::auth::use_key_file(key).unwrap();
    let master = Master::start(&["--deployment_mode=P2P", &flag(key)]);
    let owner = common::P2pOwnerProcess::start(&master.addr(), &[&flag(key)], &[]);
    for direction in [TransferDirection::Forward, TransferDirection::Reverse] {
        let accessor = common::p2p_accessor(&master.addr(), direction);
        let name = format!("p2p-{direction:?}");
        let value = common::pattern(300_000, direction as u8);
        let to_owner = RequestOptions {
            direction: Some(direction),
            preferred_owner: Some(owner.name.clone()),
        };
        accessor.put(&name, &value, &to_owner).unwrap();
        let read = RequestOptions::direction(direction);
        assert_eq!(accessor.get(&name, &read).unwrap(), value, "{direction:?}");
        accessor.remove(&name).unwrap();
    }
    let port = |addr: &str| -> u16 { addr.rsplit(':').next().unwrap().parse().unwrap() };
    let role = <PeerInterface as mooncake_rs::rpc::Interface>::NAME;
    refuses_strangers(port(&owner.rpc_addr), role);
    refuses_strangers(port(&owner.name), mooncake_rs::auth::ROLE_DATA);
}

/// A keyed owner's SSD tier serves disk reads to holders of the key (objects demoted from
/// its 4 MB segment read back exactly over its disk-read port) and refuses the others there.
#[test]
fn a_keyed_ssd_owner_serves_disk_reads_only_to_holders_of_the_key() {
    let key = our_key();
    let master = Master::start(&[&flag(key)]);
    let dir = std::env::temp_dir().join(format!("mc-keyed-ssd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let owner = PeerClient::spawn(
        &master.addr(),
        "4 MB",
        "P2PHANDSHAKE",
        &[
            flag(key),
            "--enable_offload".into(),
            format!("--ssd_offload_path={}", dir.display()),
        ],
        &[("MC_SAME_HOST", "0")],
    );
    let client = common::keyed_client(&master.addr(), "P2PHANDSHAKE", Some(key), 16 << 20);
    let config = ReplicateConfig {
        preferred_segments: vec![owner.name.clone()],
        ..ReplicateConfig::default()
    };
    // 16 × 1 MiB into a 4 MB segment: the earliest are demoted to the owner's disk.
    let values: Vec<Vec<u8>> = (0..16).map(|i| common::pattern(1 << 20, i)).collect();
    for (i, value) in values.iter().enumerate() {
        let name = format!("ssd-{i}");
        assert!(
            common::wait_until(Duration::from_secs(20), || client
                .put(&name, value, &config)
                .is_ok()),
            "put {name}"
        );
    }
    let disk_endpoint = |name: &str| -> Option<String> {
        let answer = client.batch_get_replica_desc(&[name]).remove(0).ok()?;
        let on_disk = answer.replicas.iter().find(|r| r.disk.is_some())?;
        Some(on_disk.buffer.transport_endpoint.clone())
    };
    let mut endpoint = None;
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            endpoint = disk_endpoint("ssd-0");
            endpoint.is_some()
        }),
        "ssd-0 reached the disk"
    );
    let mut back = vec![0u8; 1 << 20];
    assert_eq!(client.get_into("ssd-0", &mut back), Ok(1 << 20));
    assert_eq!(back, values[0]);
    let endpoint = endpoint.unwrap();
    let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    refuses_strangers(port, "mc-disk-read");
    client.teardown();
    drop(owner);
    let _ = std::fs::remove_dir_all(&dir);
}
