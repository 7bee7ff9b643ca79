//! How a [`super::TransferEndpoint`] reads upstream's `initialize` arguments: the
//! `local_hostname` forms, the metadata server string and the listening port.

use crate::env;
use crate::error::{fail, ErrorCode, Result};
use crate::types::P2P_HANDSHAKE;
use std::net::{Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs};

/// Where segment names are resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Metadata {
    /// `P2PHANDSHAKE`: a segment name is its `host:port`.
    P2pHandshake,
    /// An HTTP metadata service (upstream's `http://host:port/metadata`).
    Http(String),
    /// etcd: its endpoints, comma- or semicolon-separated (`etcd://` stripped).
    Etcd(String),
}

/// Reads `metadata_server` as upstream's `initialize` does (`metadata_type`: `initialize_ext`'s
/// scheme for a server string without one; `None`: `etcd`, upstream's default).
///
/// Errors: `INVALID_PARAMS` for an empty string and for redis servers (not served here: the
/// message says what is).
pub(crate) fn metadata(server: &str, metadata_type: Option<&str>) -> Result<Metadata> {
    let server = server.trim();
    if server == P2P_HANDSHAKE {
        return Ok(Metadata::P2pHandshake);
    }
    if server.is_empty() {
        return fail(ErrorCode::InvalidParams, "metadata_server is empty");
    }
    let url = match server.contains("://") {
        true => server.to_string(),
        false => format!("{}://{server}", metadata_type.unwrap_or("etcd")),
    };
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(Metadata::Http(url));
    }
    if let Some(endpoints) = url.strip_prefix("etcd://").filter(|e| !e.trim().is_empty()) {
        return Ok(Metadata::Etcd(endpoints.to_string()));
    }
    fail(
        ErrorCode::InvalidParams,
        format!(
            "metadata server {url:?} is not supported here; use P2PHANDSHAKE, etcd \
             (etcd://host:port or a bare host:port) or an HTTP metadata service \
             (http://host:port/metadata, e.g. mooncake_master's --enable_http_metadata_server)"
        ),
    )
}

/// `local_hostname` split as upstream's `parseHostNameWithPort`: `host`, `host:port`, a bare
/// IPv6 address, `[v6]` or `[v6]:port`. An unparsable port is `None`.
pub(crate) fn split_host(local_hostname: &str) -> (String, Option<u16>) {
    let name = local_hostname.trim();
    if let Some(rest) = name.strip_prefix('[') {
        if let Some((host, tail)) = rest.split_once(']') {
            let port = tail.strip_prefix(':').and_then(|p| p.parse().ok());
            return (host.to_string(), port);
        }
    }
    if name.parse::<Ipv6Addr>().is_ok() {
        return (name.to_string(), None);
    }
    match name.rsplit_once(':') {
        Some((host, port)) => (host.to_string(), port.parse().ok()),
        None => (name.to_string(), None),
    }
}

/// `host:port` with an IPv6 host in brackets (upstream's `maybeWrapIpV6`).
pub(crate) fn endpoint_name(host: &str, port: u16) -> String {
    match host.parse::<Ipv6Addr>() {
        Ok(_) => format!("[{host}]:{port}"),
        Err(_) => format!("{host}:{port}"),
    }
}

/// A listener on `host`, on a free port in `[MC_MIN_RPC_PORT, MC_MAX_RPC_PORT]` (random
/// start, every port tried at most once).
///
/// Errors: `INVALID_PARAMS` when `host` does not resolve; `INTERNAL_ERROR` when no port of
/// the range is free.
pub(crate) fn bind_in_range(host: &str) -> Result<TcpListener> {
    let ip = match (host, 0).to_socket_addrs() {
        Ok(mut addrs) => match addrs.next() {
            Some(addr) => addr.ip(),
            None => return fail(ErrorCode::InvalidParams, format!("{host:?} has no address")),
        },
        Err(e) => {
            return fail(
                ErrorCode::InvalidParams,
                format!("cannot resolve {host:?}: {e}"),
            )
        }
    };
    let min = env::MIN_RPC_PORT.get() as u16;
    let max = (env::MAX_RPC_PORT.get() as u16).max(min);
    let span = u32::from(max - min) + 1;
    let start = fastrand::u32(0..span);
    for step in 0..span {
        let port = min + ((start + step) % span) as u16;
        if let Ok(listener) = TcpListener::bind(SocketAddr::new(ip, port)) {
            return Ok(listener);
        }
    }
    fail(
        ErrorCode::InternalError,
        format!("no free port for {host} in [{min}, {max}]"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_split_like_upstream() {
        let cases = [
            ("127.0.0.1", ("127.0.0.1", None)),
            ("127.0.0.1:12345", ("127.0.0.1", Some(12345))),
            ("node-1:bad", ("node-1", None)),
            ("::1", ("::1", None)),
            ("[::1]", ("::1", None)),
            ("[fe80::1]:9000", ("fe80::1", Some(9000))),
            ("localhost", ("localhost", None)),
        ];
        for (name, (host, port)) in cases {
            assert_eq!(split_host(name), (host.to_string(), port), "{name}");
        }
        assert_eq!(endpoint_name("::1", 7), "[::1]:7");
        assert_eq!(endpoint_name("10.0.0.1", 7), "10.0.0.1:7");
    }

    #[test]
    fn metadata_servers_read_like_upstream_and_unserved_ones_are_refused() {
        assert_eq!(metadata("P2PHANDSHAKE", None), Ok(Metadata::P2pHandshake));
        assert_eq!(
            metadata("http://127.0.0.1:8080/metadata", None),
            Ok(Metadata::Http("http://127.0.0.1:8080/metadata".into()))
        );
        assert_eq!(
            metadata("127.0.0.1:8080/metadata", Some("http")),
            Ok(Metadata::Http("http://127.0.0.1:8080/metadata".into()))
        );
        assert_eq!(
            metadata("127.0.0.1:2379", None),
            Ok(Metadata::Etcd("127.0.0.1:2379".into())),
            "a bare host:port is etcd, as upstream"
        );
        assert_eq!(
            metadata("etcd://h1:2379,h2:2379", None),
            Ok(Metadata::Etcd("h1:2379,h2:2379".into()))
        );
        for refused in ["", "redis://h:6379", "etcd://", "ftp://h"] {
            assert_eq!(
                metadata(refused, None),
                Err(ErrorCode::InvalidParams),
                "{refused}"
            );
        }
    }

    #[test]
    fn a_listener_takes_a_port_in_the_range() {
        let listener = bind_in_range("127.0.0.1").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!((15_000..=17_000).contains(&port), "{port}");
        assert_eq!(
            bind_in_range("no-such-host.invalid").err(),
            Some(ErrorCode::InvalidParams)
        );
    }
}
