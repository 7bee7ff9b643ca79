//! TLS across real processes: a `mooncake_master` with `--tls_cert_file`/`--tls_key_file`
//! (RPC port and HTTP metadata service), a `mooncake_client` peer and this process trusting
//! the CA that signed its certificate, all with a cluster key too (the key's handshake runs
//! inside TLS). Clients without TLS or trusting another CA are refused; the master's traffic
//! carries no plaintext key names.

mod common;

use common::{Launched, Master, PeerClient};
use mooncake_rs::client::Client;
use mooncake_rs::types::ReplicateConfig;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The files of a throwaway PKI: a CA, a certificate it signed for 127.0.0.1 with its key,
/// another CA, and a cluster key.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    other_ca: PathBuf,
    cluster_key: PathBuf,
}

fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let dir = std::env::temp_dir().join(format!("mc-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_of = || {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let cert = params.self_signed(&key).unwrap();
            (cert, key)
        };
        let (ca, ca_key) = ca_of();
        let (other, _) = ca_of();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            path
        };
        Pki {
            ca: write("ca.pem", ca.pem()),
            cert: write("server.pem", cert.pem()),
            key: write("server.key", key.serialize_pem()),
            other_ca: write("other-ca.pem", other.pem()),
            cluster_key: write("cluster.key", format!("{}\n", "3c".repeat(32))),
        }
    })
}

fn flag(name: &str, path: &std::path::Path) -> String {
    format!("--{name}={}", path.display())
}

/// A TLS master with a keyed HTTPS metadata service; with its metadata URL.
fn tls_master() -> (Master, String) {
    let pki = pki();
    let http_port = common::free_port();
    let master = Master::start(&[
        &flag("tls_cert_file", &pki.cert),
        &flag("tls_key_file", &pki.key),
        &flag("cluster_key_file", &pki.cluster_key),
        "--enable_http_metadata_server=true",
        &format!("--http_metadata_server_port={http_port}"),
        "--http_metadata_server_host=127.0.0.1",
    ]);
    (master, format!("https://127.0.0.1:{http_port}/metadata"))
}

/// An in-process client trusting the CA, with the cluster key, against `master_addr`.
fn trusting_client(master_addr: &str, metadata: &str) -> Client {
    let pki = pki();
    mooncake_rs::auth::tls::use_ca_file(&pki.ca).unwrap();
    common::keyed_client(master_addr, metadata, Some(&pki.cluster_key), 16 << 20)
}

/// A `mooncake_client` with `extra` flags against `master` that must fail its setup; its
/// stderr.
fn refused_peer(master: &str, metadata: &str, extra: &[String]) -> String {
    let mut args = common::peer_args(master, "16 MB", metadata);
    args.extend(extra.iter().cloned());
    let mut client = Launched::spawn(env!("CARGO_BIN_EXE_mooncake_client"), &args);
    assert!(
        client.stderr_shows("setup failed", Duration::from_secs(20)),
        "the client set up: {}",
        client.stderr()
    );
    assert_eq!(client.terminate(), Some(1));
    client.stderr()
}

#[test]
fn a_tls_master_serves_clients_that_trust_its_certificate_and_refuses_the_others() {
    let pki = pki();
    let (master, metadata) = tls_master();
    let peer = PeerClient::spawn(
        &master.addr(),
        "16 MB",
        &metadata,
        &[
            flag("tls_ca_file", &pki.ca),
            flag("cluster_key_file", &pki.cluster_key),
        ],
        &[("MC_SAME_HOST", "0")],
    );
    let client = trusting_client(&master.addr(), &metadata);
    let config = ReplicateConfig {
        preferred_segments: vec![peer.name.clone()],
        ..ReplicateConfig::default()
    };
    let value: Vec<u8> = (0..1 << 20).map(|i| (i % 239) as u8).collect();
    client.put("over-tls", &value, &config).unwrap();
    let mut back = vec![0u8; value.len()];
    assert_eq!(client.get_into("over-tls", &mut back), Ok(1 << 20));
    assert_eq!(back, value);
    assert!(client.metrics().transfer.tcp_read_bytes >= 1 << 20);
    assert_eq!(client.is_exist("over-tls"), Ok(true));
    client.remove("over-tls", true).unwrap();
    assert_eq!(client.is_exist("over-tls"), Ok(false));

    // With the key but no TLS, or trusting another CA: refused at the master.
    let key = flag("cluster_key_file", &pki.cluster_key);
    let plain = refused_peer(&master.addr(), "P2PHANDSHAKE", std::slice::from_ref(&key));
    assert!(plain.contains("take TLS only"), "{plain}");
    let other = [key.clone(), flag("tls_ca_file", &pki.other_ca)];
    let untrusted = refused_peer(&master.addr(), "P2PHANDSHAKE", &other);
    assert!(untrusted.contains("certificate"), "{untrusted}");
    // The metadata service speaks HTTPS only: plain HTTP gets no HTTP answer.
    let port: u16 = metadata
        .trim_end_matches("/metadata")
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut raw = TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(b"GET /metadata?key=mooncake/ram/x HTTP/1.1\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP"), "{answer:?}");
    client.teardown();
}

/// Relays 127.0.0.1:<its port> to `target`, recording every byte the client sent.
fn recording_relay(target: u16) -> (u16, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&recorded);
    std::thread::spawn(move || {
        for inbound in listener.incoming().flatten() {
            let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else {
                continue;
            };
            let (mut from_client, mut to_server) = (inbound.try_clone().unwrap(), outbound);
            let (mut from_server, mut to_client) = (to_server.try_clone().unwrap(), inbound);
            let sink = Arc::clone(&sink);
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                while let Ok(n @ 1..) = from_client.read(&mut buf) {
                    sink.lock().unwrap().extend_from_slice(&buf[..n]);
                    if to_server.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from_server, &mut to_client);
            });
        }
    });
    (port, recorded)
}

/// What a client tells the master (object keys among it) crosses the network encrypted.
#[test]
fn master_traffic_carries_no_plaintext() {
    let (master, metadata) = tls_master();
    let (relay, recorded) = recording_relay(master.port);
    let client = trusting_client(&format!("127.0.0.1:{relay}"), &metadata);
    let name = "a-key-name-that-must-not-show-0f3c9";
    client
        .put(name, &[7u8; 4096], &ReplicateConfig::default())
        .unwrap_err(); // no segment in this pool: the master answers, the put fails
    assert_eq!(client.is_exist(name), Ok(false));
    let sent = recorded.lock().unwrap().clone();
    assert!(sent.len() > 1000, "{} bytes relayed", sent.len());
    assert_eq!(sent[0], 0x16, "the first record is a TLS handshake");
    assert!(
        !sent.windows(name.len()).any(|w| w == name.as_bytes()),
        "the key name crossed in plaintext"
    );
    client.teardown();
}
