//! Blocking client sockets shared by the RPC and HTTP clients: timeouts (from Mooncake's
//! `MC_RPC_*` variables) and connecting to `host:port` with them applied.

use super::codec::io_fail;
use crate::env;
use crate::error::{fail, ErrorCode, Result};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Client timeouts. Plain value, `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Limit on establishing one TCP connection (`MC_RPC_CONNECT_TIMEOUT_MS`, default 3000).
    pub connect: Duration,
    /// Limit on each wait for the peer while sending a request or receiving its answer
    /// (`MC_RPC_TIMEOUT_MS`, default 30000). Our servers answer in one write, so this bounds
    /// the whole request.
    pub request: Duration,
}

/// Default connect timeout in milliseconds.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = env::RPC_CONNECT_TIMEOUT_MS.default;
/// Default request timeout in milliseconds.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = env::RPC_TIMEOUT_MS.default;

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_millis(DEFAULT_CONNECT_TIMEOUT_MS),
            request: Duration::from_millis(DEFAULT_REQUEST_TIMEOUT_MS),
        }
    }
}

impl Timeouts {
    /// Reads `MC_RPC_CONNECT_TIMEOUT_MS` and `MC_RPC_TIMEOUT_MS`; a missing, unparsable or
    /// zero value keeps the default (a bad value is logged as a warning).
    pub fn from_env() -> Timeouts {
        Timeouts {
            connect: Duration::from_millis(env::RPC_CONNECT_TIMEOUT_MS.get()),
            request: Duration::from_millis(env::RPC_TIMEOUT_MS.get()),
        }
    }
}

/// Resolves `addr` ("host:port") and connects to the first address that answers, with
/// `TCP_NODELAY` and the request timeout set on reads and writes.
///
/// Errors: `RPC_FAIL` if the name does not resolve or no address accepts the connection,
/// `RPC_TIMEOUT` if the last attempt timed out.
pub fn connect(addr: &str, timeouts: Timeouts) -> Result<TcpStream> {
    let candidates = match addr.to_socket_addrs() {
        Ok(candidates) => candidates,
        Err(err) => return fail(ErrorCode::RpcFail, format_args!("resolve {addr}: {err}")),
    };
    let mut last_error = None;
    for candidate in candidates {
        match TcpStream::connect_timeout(&candidate, timeouts.connect) {
            Ok(stream) => return configure(stream, timeouts),
            Err(err) => last_error = Some(err),
        }
    }
    match last_error {
        Some(err) => io_fail(&format!("connect {addr}"), err),
        None => fail(
            ErrorCode::RpcFail,
            format_args!("{addr} resolves to no address"),
        ),
    }
}

/// A blocking client connection: plain TCP, or TLS over it ([`crate::auth::tls`]). Reads and
/// writes go through TLS when it has it; [`Conn::socket`] is the TCP socket under either (for
/// readiness checks: a TLS server here sends nothing unsolicited).
pub enum Conn {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed: the TLS state is large).
    Tls(Box<crate::auth::tls::ClientTlsStream>),
}

impl Conn {
    /// Connects to `addr` ([`connect`]) and opens TLS with `tls` when given.
    ///
    /// Errors: as [`connect`] and [`crate::auth::tls::connect`].
    pub fn open(
        addr: &str,
        timeouts: Timeouts,
        tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
    ) -> Result<Conn> {
        let tcp = connect(addr, timeouts)?;
        match tls {
            None => Ok(Conn::Plain(tcp)),
            Some(config) => Ok(Conn::Tls(Box::new(crate::auth::tls::connect(
                tcp, config, addr,
            )?))),
        }
    }

    /// The TCP socket under the connection.
    pub fn socket(&self) -> &TcpStream {
        match self {
            Conn::Plain(tcp) => tcp,
            Conn::Tls(tls) => &tls.sock,
        }
    }
}

impl std::io::Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(tcp) => tcp.read(buf),
            Conn::Tls(tls) => tls.read(buf),
        }
    }
}

impl std::io::Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(tcp) => tcp.write(buf),
            Conn::Tls(tls) => tls.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(tcp) => tcp.flush(),
            Conn::Tls(tls) => tls.flush(),
        }
    }
}

fn configure(stream: TcpStream, timeouts: Timeouts) -> Result<TcpStream> {
    let applied = stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(Some(timeouts.request)))
        .and_then(|()| stream.set_write_timeout(Some(timeouts.request)));
    match applied {
        Ok(()) => Ok(stream),
        Err(err) => io_fail("configure socket", err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn connects_with_nodelay_and_timeouts() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let timeouts = Timeouts {
            connect: Duration::from_millis(500),
            request: Duration::from_millis(700),
        };
        let stream = connect(&listener.local_addr().unwrap().to_string(), timeouts).unwrap();
        assert!(stream.nodelay().unwrap());
        assert_eq!(stream.read_timeout().unwrap(), Some(timeouts.request));
    }

    #[test]
    fn refused_and_unresolvable_addresses_fail() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let refused = connect(&format!("127.0.0.1:{port}"), Timeouts::default());
        assert_eq!(refused.unwrap_err(), ErrorCode::RpcFail);
        assert_eq!(
            connect("no-port", Timeouts::default()).unwrap_err(),
            ErrorCode::RpcFail
        );
    }
}
