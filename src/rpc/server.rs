//! The master's RPC server: serves an `Arc<dyn MasterApi>` over the framed protocol of
//! [`super::codec`].
//!
//! Each connection carries a sequence of request frames, each a [`MasterRequest`], and gets
//! one [`MasterResponse`] frame per request, in order. A frame that does not decode closes the
//! connection (the client sees `RPC_FAIL`). `MasterApi` is synchronous, so each call runs via
//! `tokio::task::block_in_place` on the connection's worker thread: no thread hop on the hot
//! path, while the runtime moves its other tasks to a fresh worker if the call blocks.

use super::codec::{self, HEADER_LEN};
use super::serve::Acceptor;
use super::stats::RpcStats;
use crate::error::Result;
use crate::master::{MasterApi, MasterRequest};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Worker threads of the server's runtime.
const WORKER_THREADS: usize = 4;

/// A running RPC server. Owns its tokio runtime (see [`Acceptor`]); thread-safe;
/// [`RpcServer::shutdown`] is idempotent and also runs on drop.
pub struct RpcServer {
    acceptor: Acceptor,
    stats: Arc<RpcStats>,
}

impl RpcServer {
    /// Binds `addr` (port 0 picks a free port) and serves `api` until shut down.
    ///
    /// Errors: `RPC_FAIL` if the address cannot be bound.
    pub fn start(addr: SocketAddr, api: Arc<dyn MasterApi>) -> Result<RpcServer> {
        let stats = Arc::new(RpcStats::default());
        let shared = Arc::clone(&stats);
        let acceptor = Acceptor::start(
            "mc-master-rpc",
            addr,
            WORKER_THREADS,
            move |stream, peer| {
                serve_connection(stream, peer, Arc::clone(&api), Arc::clone(&shared))
            },
        )?;
        Ok(RpcServer { acceptor, stats })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.acceptor.local_addr()
    }

    /// The server's counters (live; keep the `Arc` as long as needed).
    pub fn stats(&self) -> Arc<RpcStats> {
        Arc::clone(&self.stats)
    }

    /// Closes the listener and every connection; waits briefly for calls in progress.
    pub fn shutdown(&self) {
        self.acceptor.shutdown();
    }
}

async fn serve_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    api: Arc<dyn MasterApi>,
    stats: Arc<RpcStats>,
) {
    let (reader, mut writer) = stream.split();
    let mut reader = BufReader::new(reader);
    loop {
        let payload = match codec::read_frame_async(&mut reader).await {
            Ok(Some(payload)) => payload,
            Ok(None) => break,
            Err(code) => {
                tracing::debug!(%peer, "closing RPC connection: {code}");
                break;
            }
        };
        let Some(answer) = tokio::task::block_in_place(|| answer(&payload, &*api, &stats)) else {
            tracing::warn!(%peer, "closing RPC connection after an unanswerable request");
            break;
        };
        if let Err(err) = writer.write_all(&answer).await {
            tracing::debug!(%peer, "closing RPC connection: {err}");
            break;
        }
    }
}

/// Decodes, runs and encodes one request; `None` when the request does not decode or the
/// answer cannot be encoded (the connection is then closed).
fn answer(payload: &[u8], api: &dyn MasterApi, stats: &RpcStats) -> Option<Vec<u8>> {
    let started = Instant::now();
    let Ok(request) = codec::decode_payload::<MasterRequest>(payload) else {
        stats.record_bad_request();
        return None;
    };
    let method = request.name();
    let frame = codec::encode_frame(&request.dispatch(api));
    let failed = frame.as_ref().map_or(true, |frame| {
        codec::enum_result_error(&frame[HEADER_LEN..]).is_some()
    });
    stats.record(method, started.elapsed(), failed);
    frame.ok()
}
