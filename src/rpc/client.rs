//! The RPC client: blocking sockets, called straight from the caller's thread.
//!
//! [`RpcClient`] (any [`Interface`]; [`RpcMasterClient`] for the master) keeps a small pool of idle connections. A call takes one (or connects
//! lazily), writes the request frame, reads the answer frame and puts the connection back.
//! A connection that saw any error is dropped, never reused; an idle connection the master
//! has closed (restart) is noticed before use and replaced, so calls work again as soon as a
//! master listens on the address.

use super::codec;
use super::interface::{Call, Interface};
use super::net::{self, Timeouts};
use crate::error::{fail, ErrorCode, Result};
use crate::master::{MasterApi, MasterInterface, MasterRequest, MasterResponse, RemoteMaster};
use crate::types::STORE_VERSION;
use parking_lot::Mutex;
use std::io::{self, Write};
use std::marker::PhantomData;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

/// Idle connections kept per client; more are closed after use.
const MAX_IDLE_CONNECTIONS: usize = 16;

/// A [`Call`] transport of interface `I` to one server address. Thread-safe: concurrent
/// calls use separate connections. Errors: `RPC_FAIL` (-900) for connection, I/O and
/// protocol failures, `RPC_TIMEOUT` (-901) when the server does not answer within the
/// request timeout.
pub struct RpcClient<I> {
    addr: String,
    timeouts: Timeouts,
    idle: Mutex<Vec<TcpStream>>,
    interface: PhantomData<fn() -> I>,
}

/// The master's transport.
pub type RpcMasterClient = RpcClient<MasterInterface>;

/// A [`MasterApi`] backed by a remote master.
pub type RemoteMasterApi = RemoteMaster<RpcMasterClient>;

/// Connects to the master at `addr` ("host:port") with timeouts from the environment and
/// returns it as a [`MasterApi`]. Errors as [`RpcMasterClient::connect`].
pub fn connect_master(addr: &str) -> Result<Arc<dyn MasterApi>> {
    Ok(Arc::new(RemoteMaster(RpcMasterClient::connect(addr)?)))
}

/// A [`MasterApi`] for liveness pings alone, to the master at `addr` ("host:port"): its own
/// connection, never shared with data-path calls (a slow call elsewhere cannot hold it), with
/// `timeout` on connecting and on each wait for the answer. Connects lazily, on the first
/// ping; a ping that fails drops its connection, so the next one connects afresh (and lands
/// on another server shard). Thread-safe; meant for one heartbeat thread. Errors per ping:
/// `RPC_FAIL`, `RPC_TIMEOUT`.
pub fn connect_pinger(addr: &str, timeout: Duration) -> Arc<dyn MasterApi> {
    let timeouts = Timeouts {
        connect: timeout,
        request: timeout,
    };
    Arc::new(RemoteMaster(RpcMasterClient::new(addr, timeouts)))
}

impl<I: Interface> RpcClient<I> {
    /// A client of the server at `addr` ("host:port"); connects lazily, on the first call.
    pub fn new(addr: &str, timeouts: Timeouts) -> RpcClient<I> {
        RpcClient {
            addr: addr.to_owned(),
            timeouts,
            idle: Mutex::new(Vec::new()),
            interface: PhantomData,
        }
    }

    /// The server address as given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// An idle connection still open on the server's side, or a new one.
    fn checkout(&self) -> Result<TcpStream> {
        loop {
            let Some(stream) = self.idle.lock().pop() else {
                return net::connect(&self.addr, self.timeouts);
            };
            if is_idle_and_open(&stream) {
                return Ok(stream);
            }
        }
    }

    fn checkin(&self, stream: TcpStream) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(stream);
        }
    }
}

impl RpcMasterClient {
    /// Connects to `addr` with [`Timeouts::from_env`] and checks the master's version.
    ///
    /// Errors: `RPC_FAIL` / `RPC_TIMEOUT` if the master cannot be reached, `INVALID_VERSION`
    /// (-300) if its `service_ready` is not [`STORE_VERSION`].
    pub fn connect(addr: &str) -> Result<RpcMasterClient> {
        RpcMasterClient::with_timeouts(addr, Timeouts::from_env())
    }

    /// As [`RpcMasterClient::connect`], with explicit timeouts.
    pub fn with_timeouts(addr: &str, timeouts: Timeouts) -> Result<RpcMasterClient> {
        let client = RpcMasterClient::new(addr, timeouts);
        match client.call(MasterRequest::service_ready {})? {
            MasterResponse::service_ready(Ok(version)) if version == STORE_VERSION => Ok(client),
            MasterResponse::service_ready(Ok(version)) => fail(
                ErrorCode::InvalidVersion,
                format_args!("master {addr} runs version {version}, expected {STORE_VERSION}"),
            ),
            MasterResponse::service_ready(Err(code)) => Err(code),
            other => fail(
                ErrorCode::RpcFail,
                format_args!("unexpected answer to service_ready: {other:?}"),
            ),
        }
    }
}

impl<I: Interface> Call<I> for RpcClient<I> {
    fn call(&self, request: I::Request) -> Result<I::Response> {
        let frame = codec::encode_frame(&request)?;
        let mut stream = self.checkout()?;
        if let Err(err) = stream.write_all(&frame) {
            return codec::io_fail(
                &format!("send {} to {}", I::method(&request), self.addr),
                err,
            );
        }
        crate::spin::before_read(&stream);
        let payload = codec::read_answer(&mut stream)?;
        let response = codec::decode_payload(&payload)?;
        self.checkin(stream);
        Ok(response)
    }
}

/// Whether an idle connection can carry a new request: the peer has neither closed it nor
/// sent unsolicited bytes. One non-blocking `recv(MSG_PEEK)`.
fn is_idle_and_open(stream: &TcpStream) -> bool {
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
