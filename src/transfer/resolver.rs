//! Mapping a segment name to the socket address of its TCP data server.

use crate::error::{fail, ErrorCode, Result};
use once_cell::sync::Lazy;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};

/// Resolves a segment name (a peer's `local_hostname`) to its data socket address.
///
/// Implementations must be thread-safe: the engine calls them concurrently from caller
/// threads. Errors are reported to the caller of the transfer as `TRANSFER_FAIL`.
pub trait SegmentResolver: Send + Sync {
    /// The data address of `segment_name`.
    fn resolve(&self, segment_name: &str) -> Result<SocketAddr>;

    /// Forgets what is cached about `segment_name`, so the next [`resolve`](Self::resolve)
    /// looks it up again. The engine calls it after a transfer to the segment failed at the
    /// connection level (refused, reset, timed out, closed early): the peer may have moved.
    /// The default does nothing (nothing is cached).
    fn invalidate(&self, segment_name: &str) {
        let _ = segment_name;
    }
}

/// P2P-handshake resolution: the segment name `"host:port"` is itself the data address.
///
/// Numeric names are parsed without a lookup; host names go through the system resolver
/// once (IPv4 preferred) and are cached for the life of the process, shared by every
/// `DirectResolver`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DirectResolver;

static HOST_CACHE: Lazy<RwLock<HashMap<String, SocketAddr>>> = Lazy::new(Default::default);

impl SegmentResolver for DirectResolver {
    /// Errors: `TRANSFER_FAIL` when the name is not `host:port` or the host does not resolve.
    fn resolve(&self, segment_name: &str) -> Result<SocketAddr> {
        if let Ok(addr) = segment_name.parse::<SocketAddr>() {
            return Ok(addr);
        }
        if let Some(addr) = HOST_CACHE.read().get(segment_name) {
            return Ok(*addr);
        }
        let addrs: Vec<SocketAddr> = match segment_name.to_socket_addrs() {
            Ok(iter) => iter.collect(),
            Err(e) => {
                return fail(
                    ErrorCode::TransferFail,
                    format_args!("cannot resolve segment {segment_name:?}: {e}"),
                )
            }
        };
        let Some(addr) = addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
        else {
            return fail(
                ErrorCode::TransferFail,
                format_args!("segment {segment_name:?} resolves to no address"),
            );
        };
        HOST_CACHE.write().insert(segment_name.to_owned(), addr);
        Ok(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_numeric_and_host_names() {
        let r = DirectResolver;
        assert_eq!(
            r.resolve("127.0.0.1:12345").unwrap(),
            "127.0.0.1:12345".parse().unwrap()
        );
        let local = r.resolve("localhost:80").unwrap();
        assert!(local.ip().is_loopback());
        assert_eq!(local.port(), 80);
        assert_eq!(r.resolve("localhost:80").unwrap(), local);
        assert_eq!(r.resolve("no-port"), Err(ErrorCode::TransferFail));
    }
}
