//! A TCP accept loop and a set of single-threaded tokio shards, shared by the RPC and HTTP
//! servers.
//!
//! [`Acceptor`] owns its threads, so a server works the same whether or not the embedding
//! program uses tokio. One thread accepts; each accepted connection is handed, round robin, to
//! one of `threads` shard threads, each running a current-thread runtime that drives its
//! connections. Handlers may run a short synchronous call inline: that holds only the
//! connections of its own shard (as Mooncake's coro_rpc I/O threads do), never the accept loop
//! or the other shards, and costs no thread hop. (On a work-stealing runtime an inline blocking
//! call also stalls the shared I/O driver; `block_in_place` avoids that but added ~8 µs per
//! call in our measurements.)
//!
//! [`Acceptor::shutdown`] closes the listener and every connection, and waits (up to
//! [`SHUTDOWN_GRACE`]) for handlers still inside a synchronous call.

use crate::error::{fail, ErrorCode, Result};
use parking_lot::Mutex;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::watch;

/// How long [`Acceptor::shutdown`] waits for the threads to finish.
pub(super) const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A listening socket and the threads serving it. Thread-safe; `shutdown` is idempotent and
/// also runs on drop.
pub(super) struct Acceptor {
    local_addr: SocketAddr,
    running: Mutex<Option<Running>>,
}

/// What shutdown needs: the stop signal and a channel each thread reports its exit on.
/// Dropping it (a failed start) also stops the threads: they stop when `stop` is closed.
struct Running {
    stop: watch::Sender<bool>,
    exit_tx: mpsc::Sender<()>,
    exited: mpsc::Receiver<()>,
    threads: usize,
}

impl Acceptor {
    /// Binds `addr` and serves each accepted connection with `handler(stream, peer)` on one
    /// of `threads` (at least 1) shard threads named `name`. Accepted sockets have
    /// `TCP_NODELAY`.
    ///
    /// Errors: `RPC_FAIL` if the address cannot be bound or a thread cannot be started.
    pub(super) fn start<H, F>(
        name: &str,
        addr: SocketAddr,
        threads: usize,
        handler: H,
    ) -> Result<Self>
    where
        H: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .or_else(|err| {
                fail(
                    ErrorCode::RpcFail,
                    format_args!("{name} bind {addr}: {err}"),
                )
            })?;
        let local_addr = listener
            .local_addr()
            .or_else(|err| fail(ErrorCode::RpcFail, format_args!("{name} address: {err}")))?;
        let (stop, stopped) = watch::channel(false);
        let (exit_tx, exited) = mpsc::channel();
        let mut running = Running {
            stop,
            exit_tx: exit_tx.clone(),
            exited,
            threads: 0,
        };
        let handler = std::sync::Arc::new(handler);
        let mut shards = Vec::with_capacity(threads.max(1));
        for index in 0..threads.max(1) {
            let (handle_tx, handle_rx) = mpsc::channel();
            running.spawn(
                format!("{name}-{index}"),
                &stopped,
                &exit_tx,
                move || async move {
                    let _ = handle_tx.send(Handle::current());
                    std::future::pending::<()>().await
                },
            )?;
            match handle_rx.recv() {
                Ok(handle) => shards.push(handle),
                Err(_) => return fail(ErrorCode::RpcFail, format_args!("{name}: shard failed")),
            }
        }
        let accept_name = name.to_owned();
        running.spawn(format!("{name}-accept"), &stopped, &exit_tx, move || {
            accept_loop(accept_name, listener, shards, handler)
        })?;
        tracing::info!(%local_addr, threads, "server listening");
        Ok(Acceptor {
            local_addr,
            running: Mutex::new(Some(running)),
        })
    }

    /// Starts one more single-threaded runtime, named `name`, outside the round robin (for
    /// connections a server moves off the shards); stopped with the others. Errors:
    /// `RPC_FAIL` if the server is shut down or the thread cannot be started.
    pub(super) fn extra_runtime(&self, name: &str) -> Result<Handle> {
        let mut running = self.running.lock();
        let Some(running) = running.as_mut() else {
            return fail(ErrorCode::RpcFail, format_args!("{name}: server stopped"));
        };
        let (handle_tx, handle_rx) = mpsc::channel();
        let stopped = running.stop.subscribe();
        let exit_tx = running.exit_tx.clone();
        running.spawn(name.to_owned(), &stopped, &exit_tx, move || async move {
            let _ = handle_tx.send(Handle::current());
            std::future::pending::<()>().await
        })?;
        handle_rx
            .recv()
            .or_else(|_| fail(ErrorCode::RpcFail, format_args!("{name}: runtime failed")))
    }

    /// The bound address (with the real port when 0 was asked for).
    pub(super) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, closes every connection and waits up to [`SHUTDOWN_GRACE`] for the
    /// threads to finish. Idempotent.
    pub(super) fn shutdown(&self) {
        let Some(running) = self.running.lock().take() else {
            return;
        };
        let _ = running.stop.send(true);
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        for _ in 0..running.threads {
            let left = deadline.saturating_duration_since(Instant::now());
            if running.exited.recv_timeout(left).is_err() {
                tracing::warn!(local_addr = %self.local_addr, "a server thread is still busy");
                break;
            }
        }
        tracing::info!(local_addr = %self.local_addr, "server stopped");
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Running {
    /// Starts a thread with a current-thread runtime that drives `main()` and everything
    /// spawned on the runtime until the stop signal; dropping the runtime then drops (closes)
    /// all of it.
    fn spawn<M, F>(
        &mut self,
        name: String,
        stopped: &watch::Receiver<bool>,
        exit_tx: &mpsc::Sender<()>,
        main: M,
    ) -> Result<()>
    where
        M: FnOnce() -> F + Send + 'static,
        F: Future<Output = ()> + 'static,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .or_else(|err| fail(ErrorCode::RpcFail, format_args!("{name} runtime: {err}")))?;
        let mut stopped = stopped.clone();
        let exit_tx = exit_tx.clone();
        let spawned = thread::Builder::new().name(name.clone()).spawn(move || {
            runtime.block_on(async {
                tokio::select! {
                    () = main() => {}
                    _ = stopped.wait_for(|stop| *stop) => {}
                }
            });
            drop(runtime);
            let _ = exit_tx.send(());
        });
        match spawned {
            Ok(_) => {
                self.threads += 1;
                Ok(())
            }
            Err(err) => fail(ErrorCode::RpcFail, format_args!("{name} thread: {err}")),
        }
    }
}

async fn accept_loop<H, F>(
    name: String,
    listener: std::net::TcpListener,
    shards: Vec<Handle>,
    handler: std::sync::Arc<H>,
) where
    H: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(server = %name, "listener: {err}");
            return;
        }
    };
    for shard in shards.iter().cycle() {
        let (stream, peer) = loop {
            match listener.accept().await {
                Ok(accepted) => break accepted,
                Err(err) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(server = %name, "accept: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        if let Err(err) = stream.set_nodelay(true) {
            tracing::warn!(server = %name, %peer, "TCP_NODELAY: {err}");
        }
        // A tokio socket is tied to the runtime it was created on: move it to the shard.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(err) => {
                tracing::warn!(server = %name, %peer, "hand-off: {err}");
                continue;
            }
        };
        let handler = std::sync::Arc::clone(&handler);
        shard.spawn(async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => handler(stream, peer).await,
                Err(err) => tracing::warn!(%peer, "adopt connection: {err}"),
            }
        });
    }
}
