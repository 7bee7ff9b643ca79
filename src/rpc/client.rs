//! The RPC client: blocking sockets, called straight from the caller's thread.
//!
//! [`RpcClient`] (any [`Interface`]; the master's is `crate::master::RpcMasterClient`) keeps a
//! small pool of idle connections. A call takes one (or connects
//! lazily), writes the request frame, reads the answer frame and puts the connection back.
//! A connection that saw any error is dropped, never reused; an idle connection the master
//! has closed (restart) is noticed before use and replaced, so calls work again as soon as a
//! master listens on the address.

use super::codec;
use super::interface::{Call, Interface};
use super::net::{Conn, Timeouts};
use crate::auth::{self, KeyRing};
use crate::error::Result;
use parking_lot::Mutex;
use std::io::{self, Write};
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Idle connections kept per client; more are closed after use.
const MAX_IDLE_CONNECTIONS: usize = 16;

/// Where a client's server is now, for a server that moves (a master group's leader).
/// Thread-safe; called on the caller's thread at each new connection.
pub trait Resolve: Send + Sync {
    /// The server's address ("host:port") now.
    fn resolve(&self) -> Result<String>;
    /// A connection to `addr` failed: look again before the next one.
    fn failed(&self, addr: &str);
}

/// A [`Call`] transport of interface `I` to one server address, or to whichever address a
/// [`Resolve`] names at each new connection. Thread-safe: concurrent calls use separate
/// connections. Errors: `RPC_FAIL` (-900) for connection, I/O and protocol failures,
/// `RPC_TIMEOUT` (-901) when the server does not answer within the request timeout,
/// `AUTH_FAILED` (-9007) when a new connection's cluster-key handshake fails; a resolver's
/// own.
pub struct RpcClient<I> {
    addr: String,
    resolver: Option<Arc<dyn Resolve>>,
    timeouts: Timeouts,
    /// Idle connections.
    idle: Mutex<Vec<Pooled>>,
    /// The key each new connection proves (`I::NAME` is the role), or the error loading the
    /// process's key gave (every connection then fails with it).
    cluster_key: Result<Option<Arc<KeyRing>>>,
    /// TLS for new connections (`I::TLS` interfaces of a process that trusts certificates:
    /// [`auth::tls::process_client_config`]), or the error loading it gave.
    tls: Result<Option<Arc<rustls::ClientConfig>>>,
    interface: PhantomData<fn() -> I>,
}

impl<I: Interface> RpcClient<I> {
    /// A client of the server at `addr` ("host:port") with the process's cluster key, if
    /// any ([`auth::process_key`]); connects lazily, on the first call.
    pub fn new(addr: &str, timeouts: Timeouts) -> RpcClient<I> {
        RpcClient {
            addr: addr.to_owned(),
            resolver: None,
            timeouts,
            idle: Mutex::new(Vec::new()),
            cluster_key: auth::process_key(),
            tls: match I::TLS {
                true => auth::tls::process_client_config(),
                false => Ok(None),
            },
            interface: PhantomData,
        }
    }

    /// This client with `key` instead of the process's.
    pub fn with_cluster_key(mut self, key: Arc<KeyRing>) -> RpcClient<I> {
        self.cluster_key = Ok(Some(key));
        self
    }

    /// TLS for new connections (the process's error again, with its message, when it could
    /// not be loaded).
    fn tls(&self) -> Result<Option<Arc<rustls::ClientConfig>>> {
        match &self.tls {
            Ok(config) => Ok(config.clone()),
            Err(_) => auth::tls::process_client_config(),
        }
    }

    /// This client with TLS `config` (or plain TCP) instead of what its interface and the
    /// process say.
    pub fn with_tls(mut self, config: Option<Arc<rustls::ClientConfig>>) -> RpcClient<I> {
        self.tls = Ok(config);
        self
    }

    /// The key new connections prove (the process's key error again, with its message, when
    /// it could not be loaded).
    fn cluster_key(&self) -> Result<Option<Arc<KeyRing>>> {
        match &self.cluster_key {
            Ok(key) => Ok(key.clone()),
            Err(_) => auth::process_key(),
        }
    }

    /// A client of whichever server `resolver` names (looked up at each new connection;
    /// `name` describes it in messages, e.g. `etcd://h1:2379`); connects lazily. Idle
    /// connections to an address the resolver no longer names are closed.
    pub fn resolved(name: &str, resolver: Arc<dyn Resolve>, timeouts: Timeouts) -> RpcClient<I> {
        RpcClient {
            resolver: Some(resolver),
            ..RpcClient::new(name, timeouts)
        }
    }

    /// The server address as given (a resolved client's name).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// An idle connection to the current address, still open on the server's side and
    /// proven with the key this process connects with now, or a new one.
    fn checkout(&self) -> Result<Pooled> {
        let addr = match &self.resolver {
            Some(resolver) => resolver.resolve()?,
            None => self.addr.clone(),
        };
        let key = self.cluster_key()?;
        loop {
            let Some(mut pooled) = self.idle.lock().pop() else {
                let tls = self.tls()?;
                let mut conn = Conn::open(&addr, self.timeouts, tls.as_ref())
                    .inspect_err(|_| self.failed(&addr))?;
                let proven = match &key {
                    Some(key) => Some(auth::client_blocking(&mut conn, key, I::NAME)?),
                    None => None,
                };
                return Ok(Pooled { conn, addr, proven });
            };
            // A connection proven with a key this process no longer connects with (a
            // rotation) is dropped: its server closes it once that key is retired.
            let current = match (&key, &pooled.proven) {
                (Some(key), Some(id)) => key.connects_with(id),
                _ => true,
            };
            if pooled.addr == addr && current && is_idle_and_open(&mut pooled.conn) {
                return Ok(pooled);
            }
        }
    }

    fn checkin(&self, pooled: Pooled) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(pooled);
        }
    }

    fn failed(&self, addr: &str) {
        if let Some(resolver) = &self.resolver {
            resolver.failed(addr);
        }
    }
}

impl<I: Interface> Call<I> for RpcClient<I> {
    fn call(&self, request: I::Request) -> Result<I::Response> {
        let frame = codec::encode_frame(&request)?;
        let mut pooled = self.checkout()?;
        let stream = &mut pooled.conn;
        if let Err(err) = stream.write_all(&frame).and_then(|()| stream.flush()) {
            self.failed(&pooled.addr);
            let what = format!("send {} to {}", I::method(&request), pooled.addr);
            return codec::io_fail(&what, err);
        }
        crate::spin::before_read(stream.socket());
        let answer = codec::read_answer(stream);
        let payload = answer.inspect_err(|_| self.failed(&pooled.addr))?;
        let response = codec::decode_payload(&payload)?;
        self.checkin(pooled);
        Ok(response)
    }
}

/// A connection kept between calls: the address it was made to and the key it proved.
struct Pooled {
    conn: Conn,
    addr: String,
    proven: Option<auth::KeyId>,
}

/// Whether an idle connection can carry a new request: the peer has neither closed it nor
/// sent unsolicited bytes (over TLS: nor left any in the session). One non-blocking
/// `recv(MSG_PEEK)`.
fn is_idle_and_open(conn: &mut Conn) -> bool {
    if let Conn::Tls(tls) = conn {
        let quiet = tls
            .conn
            .process_new_packets()
            .is_ok_and(|state| state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed());
        if !quiet {
            return false;
        }
    }
    let stream = conn.socket();
    let mut byte = 0u8;
    // SAFETY: the descriptor belongs to `stream`, alive for the call; the buffer is one byte
    // we own; MSG_DONTWAIT keeps the socket's blocking mode untouched.
    let received = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    received < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
}
