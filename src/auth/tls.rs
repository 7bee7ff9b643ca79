//! Optional TLS (rustls on the `ring` provider) for the master's RPC port and the HTTP metadata
//! service; data connections stay authenticated by the cluster key only.
//!
//! - A server with a certificate ([`server_config`]: a PEM chain and its private key,
//!   `--tls_cert_file` / `--tls_key_file` of `mooncake_master`) accepts only TLS on those ports.
//! - A process that trusts certificates ([`use_ca_file`], else `MC_TLS_CA_FILE`: a PEM file of
//!   CA or self-signed certificates) opens every master connection with TLS and may use
//!   `https://` metadata URLs; without one, master connections are plain and an `https://` URL
//!   is refused. The server's certificate must name the host the client dials (a DNS name, or
//!   an IP address in its subject alternative names); `MC_TLS_SERVER_NAME` names another (for
//!   every TLS connection of the process: master and metadata alike).
//! - TLS comes first; the cluster key's handshake, when there is a key, runs inside it.
//! - Servers send no TLS 1.3 session tickets: a pooled idle client connection must hold no
//!   unsolicited bytes (the client checks that before reusing one), and no resumption state is
//!   kept.
//!
//! Thread-safety: configurations are immutable `Arc`s; the process's client configuration is
//! fixed by the first setter or reader.

use crate::env;
use crate::error::{fail, ErrorCode, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, StreamOwned};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// A blocking client connection over TLS.
pub type ClientTlsStream = StreamOwned<ClientConnection, TcpStream>;

/// rustls's `ring` provider. rustls marks it deprecated because it offers no post-quantum key
/// exchange (its `aws-lc-rs` provider does, but builds a C library with cmake on every CI run);
/// the classical suites it offers are rustls's safe defaults.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_fail<T>(what: impl std::fmt::Display) -> Result<T> {
    fail(ErrorCode::InvalidParams, format_args!("TLS: {what}"))
}

/// The certificates of a PEM file (at least one).
///
/// Errors: `FILE_OPEN_FAIL` when it cannot be read; `INVALID_PARAMS` when it holds no
/// certificate or a malformed one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let shown = path.display();
    if let Err(err) = std::fs::metadata(path) {
        return fail(ErrorCode::FileOpenFail, format_args!("TLS: {shown}: {err}"));
    }
    let parsed: std::result::Result<Vec<_>, _> = match CertificateDer::pem_file_iter(path) {
        Ok(iter) => iter.collect(),
        Err(err) => return tls_fail(format_args!("{shown}: {err}")),
    };
    match parsed {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        Ok(_) => tls_fail(format_args!("{shown} holds no PEM certificate")),
        Err(err) => tls_fail(format_args!("{shown}: {err}")),
    }
}

/// A server configuration from a PEM certificate chain (leaf first) and its PEM private key
/// (PKCS#8, PKCS#1 or SEC1).
///
/// Errors: `FILE_OPEN_FAIL` when a file cannot be read; `INVALID_PARAMS` when a file holds no
/// certificate or key, or the key does not match the certificate.
pub fn server_config(cert_file: &Path, key_file: &Path) -> Result<Arc<ServerConfig>> {
    let chain = certificates(cert_file)?;
    if let Err(err) = std::fs::metadata(key_file) {
        let shown = key_file.display();
        return fail(ErrorCode::FileOpenFail, format_args!("TLS: {shown}: {err}"));
    }
    let key = match PrivateKeyDer::from_pem_file(key_file) {
        Ok(key) => key,
        Err(err) => return tls_fail(format_args!("{}: {err}", key_file.display())),
    };
    server_config_of(chain, key).inspect_err(|_| {
        prefix_message(&format!(
            "{} with {}",
            cert_file.display(),
            key_file.display()
        ))
    })
}

/// A server configuration from a parsed chain and key. Errors: `INVALID_PARAMS` when the key
/// does not fit the certificate.
fn server_config_of(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>> {
    let builder = match ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
    {
        Ok(builder) => builder,
        Err(err) => return tls_fail(err),
    };
    let mut config = match builder.with_no_client_auth().with_single_cert(chain, key) {
        Ok(config) => config,
        Err(err) => return tls_fail(err),
    };
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(Arc::new(config))
}

/// A client configuration trusting the certificates of the PEM file `ca_file`.
///
/// Errors: as [`certificates`]; `INVALID_PARAMS` when a certificate is not a usable anchor.
pub fn client_config(ca_file: &Path) -> Result<Arc<ClientConfig>> {
    client_config_of(certificates(ca_file)?)
        .inspect_err(|_| prefix_message(&ca_file.display().to_string()))
}

/// Puts `what: ` before the calling thread's last error message.
fn prefix_message(what: &str) {
    let why = crate::error::last_error_message();
    crate::error::set_last_error_message(format!("{what}: {why}"));
}

/// A client configuration trusting `anchors`. Errors: `INVALID_PARAMS` when one is not a
/// usable trust anchor.
fn client_config_of(anchors: Vec<CertificateDer<'static>>) -> Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    for cert in anchors {
        if let Err(err) = roots.add(cert) {
            return tls_fail(err);
        }
    }
    let builder = match ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
    {
        Ok(builder) => builder,
        Err(err) => return tls_fail(err),
    };
    Ok(Arc::new(
        builder.with_root_certificates(roots).with_no_client_auth(),
    ))
}

/// The process's client TLS: none, a configuration from `path`, or the error loading it gave.
enum ProcessTls {
    None,
    Config(PathBuf, Arc<ClientConfig>),
    Broken(PathBuf, ErrorCode),
}

static PROCESS_TLS: OnceLock<ProcessTls> = OnceLock::new();

fn load(path: &Path) -> ProcessTls {
    match client_config(path) {
        Ok(config) => ProcessTls::Config(path.to_path_buf(), config),
        Err(code) => ProcessTls::Broken(path.to_path_buf(), code),
    }
}

/// Makes the process trust the certificates of `path` (a binary's `--tls_ca_file`): its master
/// connections use TLS from then on. Naming the file already in use is fine.
///
/// Errors: as [`client_config`]; `INVALID_PARAMS` when the process already trusts another
/// file, or connected without TLS.
pub fn use_ca_file(path: &Path) -> Result<()> {
    match PROCESS_TLS.get_or_init(|| load(path)) {
        ProcessTls::Config(used, _) if used == path => Ok(()),
        ProcessTls::Broken(used, code) if used == path => {
            fail(*code, format_args!("TLS CA file {}: not usable", path.display()))
        }
        ProcessTls::Config(used, _) | ProcessTls::Broken(used, _) => fail(
            ErrorCode::InvalidParams,
            format_args!(
                "this process already trusts the TLS CA file {}, not {}",
                used.display(),
                path.display()
            ),
        ),
        ProcessTls::None => fail(
            ErrorCode::InvalidParams,
            "this process already connects without TLS; name the CA file before the first connection (or in MC_TLS_CA_FILE)",
        ),
    }
}

/// The process's client TLS configuration, if it trusts certificates (fixed from
/// `MC_TLS_CA_FILE` on the first call when no flag named a file).
///
/// Errors: `AUTH_FAILED` when the file could not be loaded (fail closed: such a process
/// never connects in the clear instead; the message names the file and why).
pub fn process_client_config() -> Result<Option<Arc<ClientConfig>>> {
    let tls =
        PROCESS_TLS.get_or_init(
            || match env::TLS_CA_FILE.get().filter(|p| !p.trim().is_empty()) {
                Some(path) => load(Path::new(path.trim())),
                None => ProcessTls::None,
            },
        );
    match tls {
        ProcessTls::None => Ok(None),
        ProcessTls::Config(_, config) => Ok(Some(Arc::clone(config))),
        ProcessTls::Broken(path, code) => fail(
            ErrorCode::AuthFailed,
            format_args!(
                "TLS CA file {} could not be loaded ({code})",
                path.display()
            ),
        ),
    }
}

/// The name a server reached at `addr` ("host:port", "[v6]:port") must hold in its
/// certificate: `MC_TLS_SERVER_NAME` when set, else the host.
///
/// Errors: `INVALID_PARAMS` when it is neither a DNS name nor an IP address.
fn server_name(addr: &str) -> Result<ServerName<'static>> {
    let host = match env::TLS_SERVER_NAME.get().filter(|n| !n.trim().is_empty()) {
        Some(name) => name.trim().to_owned(),
        None => {
            let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned()
        }
    };
    ServerName::try_from(host.clone())
        .or_else(|_| tls_fail(format_args!("{host:?} is not a server name")))
}

/// Opens TLS as a client on the connected `tcp` to `addr` and completes the handshake (within
/// the socket's timeouts), verifying the server's certificate for `addr`'s host.
///
/// Errors: `INVALID_PARAMS` for a host that is no server name; `RPC_FAIL` when the handshake
/// fails (the detail says why: an untrusted or misnamed certificate, a server without TLS, a
/// closed connection), `RPC_TIMEOUT` when it stalls.
pub fn connect(tcp: TcpStream, config: &Arc<ClientConfig>, addr: &str) -> Result<ClientTlsStream> {
    let name = server_name(addr)?;
    let connection = match ClientConnection::new(Arc::clone(config), name) {
        Ok(connection) => connection,
        Err(err) => return tls_fail(err),
    };
    let mut stream = StreamOwned::new(connection, tcp);
    while stream.conn.is_handshaking() {
        if let Err(err) = stream.conn.complete_io(&mut stream.sock) {
            let code = match err.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    ErrorCode::RpcTimeout
                }
                _ => ErrorCode::RpcFail,
            };
            let hint = match err.kind() {
                std::io::ErrorKind::UnexpectedEof => " (the server closed: it may not speak TLS)",
                _ => "",
            };
            return fail(code, format_args!("TLS handshake with {addr}: {err}{hint}"));
        }
    }
    Ok(stream)
}

/// Accepts TLS as the `role` server on `io` within [`super::HANDSHAKE_TIMEOUT`]; `None` when
/// the handshake fails, which is counted (`tls_failed`) and logged as the key's refusals are
/// ([`super::refusals`]: once a minute per peer; the detail at debug level).
pub async fn accept<IO>(
    io: IO,
    config: &Arc<ServerConfig>,
    role: &str,
    peer: std::net::SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<IO>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(config));
    let failure = match tokio::time::timeout(super::HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
        Ok(Ok(stream)) => return Some(stream),
        Ok(Err(err)) => err.to_string(),
        Err(_) => "timed out".to_owned(),
    };
    tracing::debug!(%peer, role, "TLS handshake failed: {failure}");
    super::refusals::refused(super::protocol::Refusal::Tls, role, Some(peer.ip()));
    None
}

/// A throwaway CA and a certificate it signed for `127.0.0.1` and `localhost` (tests): the
/// server configuration with that certificate, and a client configuration trusting the CA.
#[cfg(test)]
pub(crate) fn test_pki() -> (Arc<ServerConfig>, Arc<ClientConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let key = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    let server = server_config_of(vec![cert.der().clone()], key).unwrap();
    (server, client_config_of(vec![ca.der().clone()]).unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = crate::test_util::TempDir::new("tls-files");
        let missing = dir.path().join("missing.pem");
        assert_eq!(
            client_config(&missing).unwrap_err(),
            ErrorCode::FileOpenFail
        );
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        assert_eq!(client_config(&junk).unwrap_err(), ErrorCode::InvalidParams);
        assert!(crate::error::last_error_message().contains("no PEM certificate"));
        assert_eq!(
            server_config(&junk, &junk).unwrap_err(),
            ErrorCode::InvalidParams
        );
        assert_eq!(
            server_name("[::1]:80").unwrap(),
            ServerName::try_from("::1").unwrap()
        );
        assert_eq!(
            server_name("example.org:50051").unwrap(),
            ServerName::try_from("example.org").unwrap()
        );
    }
}
