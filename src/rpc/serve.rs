//! A TCP accept loop on its own tokio runtime, shared by the RPC and HTTP servers.
//!
//! [`Acceptor`] owns a multi-thread runtime (so a server works the same whether or not the
//! embedding program uses tokio), binds the listener synchronously (bind errors are returned
//! to the caller), and runs one task per connection. [`Acceptor::shutdown`] drops the runtime:
//! the listener and every connection close, and the call waits (up to [`SHUTDOWN_GRACE`]) for
//! handlers still running a synchronous call.

use crate::error::{fail, ErrorCode, Result};
use parking_lot::Mutex;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

/// How long [`Acceptor::shutdown`] waits for synchronous handlers that are still running.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A listening socket served on a private runtime. Thread-safe; `shutdown` is idempotent and
/// also runs on drop.
pub struct Acceptor {
    runtime: Mutex<Option<Runtime>>,
    local_addr: SocketAddr,
}

impl Acceptor {
    /// Binds `addr` and serves each accepted connection with `handler(stream, peer)` on a
    /// runtime of `threads` workers named `name`. Accepted sockets have `TCP_NODELAY`.
    ///
    /// Errors: `RPC_FAIL` if the runtime cannot be built or the address cannot be bound.
    pub fn start<H, F>(name: &str, addr: SocketAddr, threads: usize, handler: H) -> Result<Self>
    where
        H: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(name)
            .enable_io()
            .enable_time()
            .build()
        {
            Ok(runtime) => runtime,
            Err(err) => return fail(ErrorCode::RpcFail, format_args!("{name} runtime: {err}")),
        };
        let listener = match runtime.block_on(TcpListener::bind(addr)) {
            Ok(listener) => listener,
            Err(err) => {
                return fail(
                    ErrorCode::RpcFail,
                    format_args!("{name} bind {addr}: {err}"),
                )
            }
        };
        let local_addr = match listener.local_addr() {
            Ok(local_addr) => local_addr,
            Err(err) => return fail(ErrorCode::RpcFail, format_args!("{name} address: {err}")),
        };
        let name = name.to_owned();
        runtime.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, peer)) => {
                        if let Err(err) = stream.set_nodelay(true) {
                            tracing::warn!(server = %name, %peer, "TCP_NODELAY: {err}");
                        }
                        tokio::spawn(handler(stream, peer));
                    }
                    Err(err) => {
                        // Out of descriptors and the like: back off instead of spinning.
                        tracing::warn!(server = %name, "accept: {err}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        tracing::info!(%local_addr, threads, "server listening");
        Ok(Acceptor {
            runtime: Mutex::new(Some(runtime)),
            local_addr,
        })
    }

    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and closes every connection. Idempotent. Called from inside an async
    /// context it cannot wait, so it only starts the shutdown there.
    pub fn shutdown(&self) {
        let Some(runtime) = self.runtime.lock().take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            runtime.shutdown_background();
        } else {
            runtime.shutdown_timeout(SHUTDOWN_GRACE);
        }
        tracing::info!(local_addr = %self.local_addr, "server stopped");
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.shutdown();
    }
}
