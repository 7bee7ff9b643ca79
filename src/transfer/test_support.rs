//! Helpers shared by the transfer engine's tests, its transports' tests and the metadata
//! service's: engines serving on 127.0.0.1, requests over caller buffers, registration.

use crate::transfer::metrics::Metrics;
use crate::transfer::settings::Settings;
use crate::transfer::*;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One mebibyte.
pub(crate) const MIB: usize = 1 << 20;

pub(crate) fn serving_engine() -> Arc<TransferEngine> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    serving_engine_on(listener)
}

pub(crate) fn serving_engine_on(listener: TcpListener) -> Arc<TransferEngine> {
    let name = listener.local_addr().unwrap().to_string();
    TransferEngine::new(EngineConfig {
        local_name: name,
        listener: Some(listener),
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: None,
    })
    .unwrap()
}

pub(crate) fn embedded_engine() -> Arc<TransferEngine> {
    TransferEngine::new(EngineConfig {
        local_name: "embedded:1".into(),
        listener: None,
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: None,
    })
    .unwrap()
}

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 12) as u8 ^ seed)
        .collect()
}

pub(crate) fn request<'a>(
    op: TransferOp,
    local: usize,
    len: usize,
    endpoint: &'a str,
    remote: u64,
) -> TransferRequest<'a> {
    TransferRequest {
        op,
        local_addr: local,
        len: len as u64,
        endpoint,
        remote_addr: remote,
        epoch: 0,
        send_by: None,
    }
}

/// A READ into `buf` (which the transfer writes through a raw pointer).
pub(crate) fn read_req<'a>(buf: &mut [u8], endpoint: &'a str, remote: u64) -> TransferRequest<'a> {
    request(
        TransferOp::Read,
        buf.as_mut_ptr() as usize,
        buf.len(),
        endpoint,
        remote,
    )
}

/// A WRITE from `data`.
pub(crate) fn write_req<'a>(data: &[u8], endpoint: &'a str, remote: u64) -> TransferRequest<'a> {
    request(
        TransferOp::Write,
        data.as_ptr() as usize,
        data.len(),
        endpoint,
        remote,
    )
}

/// Registers all of `buf` with `engine`.
pub(crate) fn register(engine: &TransferEngine, buf: &mut [u8], remote_accessible: bool) {
    engine
        .register(buf.as_mut_ptr() as usize, buf.len(), remote_accessible)
        .unwrap();
}

pub(crate) fn one(engine: &TransferEngine, req: TransferRequest<'_>) -> crate::Result<()> {
    // SAFETY: tests pass buffers they own for the duration of the call.
    let mut results = unsafe { engine.transfer(&[req]) };
    assert_eq!(results.len(), 1);
    results.remove(0)
}

pub(crate) fn addr_of(buf: &[u8]) -> u64 {
    buf.as_ptr() as u64
}

pub(crate) const E1: u64 = 0x00AB_CDEF_0123_4567;
pub(crate) const E2: u64 = 0x0012_3456_789A_BCDE;

/// `req` naming segment epoch `epoch`.
pub(crate) fn at_epoch(req: TransferRequest<'_>, epoch: u64) -> TransferRequest<'_> {
    TransferRequest { epoch, ..req }
}

/// Runs `work` on a thread, shuts `server` down (twice) 200 ms later and returns what `work`
/// returned, failing the test if that takes 20 s or more after the shutdown.
pub(crate) fn within_bound_of_peer_shutdown<T: Send + 'static>(
    server: &TransferEngine,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = done_tx.send(work());
    });
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    server.shutdown();
    server.shutdown();
    let out = done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a transfer hung after the peer shut down");
    assert!(started.elapsed() < Duration::from_secs(20));
    worker.join().unwrap();
    out
}

/// A server on its own registry (all of `memory`, remotely accessible) with `settings`.
pub(crate) fn limited_server(
    memory: &mut [u8],
    settings: Settings,
) -> (crate::transfer::tcp::server::Server, Arc<Metrics>) {
    let registry = Arc::new(super::registry::Registry::default());
    registry
        .register(memory.as_mut_ptr() as usize, memory.len(), true)
        .unwrap();
    let metrics = Arc::new(Metrics::default());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = crate::transfer::tcp::server::Server::start(
        listener,
        registry,
        None,
        Arc::clone(&metrics),
        settings,
        None,
        Arc::default(),
    )
    .unwrap();
    (server, metrics)
}

/// An in-memory stream for handshake tests: reads replay `reply`, writes are kept in `sent`.
pub(crate) struct CannedStream {
    reply: std::io::Cursor<Vec<u8>>,
    pub(crate) sent: Vec<u8>,
}

impl CannedStream {
    pub(crate) fn new(reply: Vec<u8>) -> CannedStream {
        CannedStream {
            reply: std::io::Cursor::new(reply),
            sent: Vec::new(),
        }
    }
}

impl std::io::Read for CannedStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reply.read(buf)
    }
}

impl std::io::Write for CannedStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.sent.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
