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
use super::net::{self, Timeouts};
use crate::error::Result;
use parking_lot::Mutex;
use std::io::{self, Write};
use std::marker::PhantomData;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

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
