//! The real client's side against a hand-written (buggy, hostile) dummy: every offset, length
//! and target it names is checked; refusals are `INVALID_PARAMS` answers, never a crash.

use super::server::DummyServer;
use super::wire::{parse_header, Kind, Reader, WireRequest, Writer, VERSION};
use crate::device::MappedRegion;
use crate::error::{last_error_message, ErrorCode};
use crate::shm::{send_with_fds, SealedMemfd};
use crate::transfer::{DirectResolver, EngineConfig, TransferEngine};
use std::io::Read;
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::Arc;
use std::time::Duration;

const OWN: &str = "own-name:1";
const INVALID: i32 = -600;

fn connect(name: &str) -> UnixStream {
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let stream = UnixStream::connect_addr(&addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// A copy of the `len` bytes at `addr`, which must lie in a live mapping of this test (a
/// registered region or a shared block) that nothing writes meanwhile.
fn bytes_at(addr: usize, len: usize) -> Vec<u8> {
    // SAFETY: the caller's mapping covers the range, and nothing writes it meanwhile.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

/// Sends a frame (with an optional descriptor); returns the answer's code, message, payload.
fn call(
    stream: &mut UnixStream,
    kind: u8,
    body: &Writer,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> (i32, String, Vec<u8>) {
    let fds: Vec<_> = fd.into_iter().collect();
    send_with_fds(stream.as_fd(), &body.frame(kind), &fds).unwrap();
    let mut header = [0u8; 5];
    stream.read_exact(&mut header).unwrap();
    let (_, len) = parse_header(header).unwrap();
    let mut answer = vec![0u8; len];
    stream.read_exact(&mut answer).unwrap();
    let mut r = Reader::new(&answer);
    let code = r.i32().unwrap();
    let message = r.str().unwrap().to_string();
    let rest = answer[8 + message.len()..].to_vec();
    (code, message, rest)
}

fn transfer(stream: &mut UnixStream, requests: &[WireRequest]) -> (Vec<i32>, String) {
    let mut w = Writer::default();
    w.u32(requests.len() as u32);
    for r in requests {
        r.encode(&mut w);
    }
    let (code, message, payload) = call(stream, Kind::Transfer as u8, &w, None);
    assert_eq!(code, 0, "{message}");
    let mut r = Reader::new(&payload);
    let n = r.u32().unwrap() as usize;
    let message = r.str().unwrap().to_string();
    ((0..n).map(|_| r.i32().unwrap()).collect(), message)
}

fn request(
    write: bool,
    block: u64,
    offset: u64,
    len: u64,
    remote: u64,
    endpoint: &str,
) -> WireRequest {
    WireRequest {
        write,
        block,
        offset,
        len,
        remote_addr: remote,
        epoch: 0,
        send_by_monotonic_ns: u64::MAX,
        endpoint: endpoint.into(),
    }
}

/// A real client's engine named [`OWN`] with a remotely accessible 64 KiB segment.
fn engine_with_segment() -> (Arc<TransferEngine>, MappedRegion) {
    let engine = TransferEngine::new(EngineConfig {
        local_name: OWN.into(),
        listener: None,
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: None,
    })
    .unwrap();
    let segment = MappedRegion::new(1 << 16).unwrap();
    engine
        .register(segment.addr(), segment.len(), true)
        .unwrap();
    (engine, segment)
}

#[test]
fn a_hostile_dummy_gets_invalid_params_and_the_real_client_keeps_serving() {
    let (engine, segment) = engine_with_segment();
    let private = MappedRegion::new(1 << 16).unwrap();
    engine
        .register(private.addr(), private.len(), false)
        .unwrap();
    let name = format!("mc-rs-test-{}-hostile.sock", std::process::id());
    let server = DummyServer::start(&[&name], Arc::clone(&engine), OWN, "127.0.0.1:1").unwrap();

    let mut s = connect(&name);
    // Nothing before hello.
    assert_eq!(
        call(&mut s, Kind::Ping as u8, &Writer::default(), None).0,
        INVALID
    );
    let mut hello = Writer::default();
    hello.u32(VERSION).u32(1).u64(1);
    let (code, message, payload) = call(&mut s, Kind::Hello as u8, &hello, None);
    assert_eq!(code, 0, "{message}");
    let mut r = Reader::new(&payload);
    assert_eq!(r.str().unwrap(), "127.0.0.1:1");
    assert_eq!(r.str().unwrap(), OWN);
    // A second hello on one connection, and a hello without its link id.
    assert_eq!(call(&mut s, Kind::Hello as u8, &hello, None).0, INVALID);
    let mut short = Writer::default();
    short.u32(VERSION).u32(1);
    let mut other = connect(&name);
    assert_eq!(call(&mut other, Kind::Hello as u8, &short, None).0, INVALID);
    drop(other);

    // Map: without a descriptor, longer than the file, and a good one.
    let file = SealedMemfd::create("hostile", 8192).unwrap();
    let mut map = |id: u64, len: u64, fd| {
        let mut w = Writer::default();
        w.u64(id).u64(len);
        call(&mut s, Kind::Map as u8, &w, fd).0
    };
    assert_eq!(map(1, 8192, None), INVALID);
    assert_eq!(map(1, 1 << 20, Some(file.fd())), INVALID);
    assert_eq!(map(1, 8192, Some(file.fd())), 0);
    assert_eq!(map(1, 8192, Some(file.fd())), INVALID, "mapped twice");

    let seg = segment.addr() as u64;
    let (codes, message) = transfer(
        &mut s,
        &[
            request(true, 1, 8000, 500, seg, OWN), // past the block's end
            request(true, 1, u64::MAX - 1, 4, seg, OWN), // offset + len overflows
            request(true, 9, 0, 16, seg, OWN),     // unknown block
            request(true, 1, 0, 16, private.addr() as u64, OWN), // not the segment
            request(true, 1, 0, 16, 0x10, OWN),    // not registered at all
            request(true, 1, 0, 16, seg + (1 << 16) - 8, OWN), // runs past the segment
        ],
    );
    assert_eq!(codes[..5], [INVALID; 5], "{message}");
    assert_ne!(codes[5], 0, "{message}");

    // Overlapping read destinations are refused together; disjoint ones run.
    let (codes, _) = transfer(
        &mut s,
        &[
            request(false, 1, 0, 100, seg, OWN),
            request(false, 1, 50, 100, seg + 1000, OWN),
            request(false, 1, 4096, 10, seg + 2000, OWN),
        ],
    );
    assert_eq!(codes, vec![INVALID, INVALID, 0]);

    // A good write lands in the segment: the dummy's bytes, nothing else touched.
    let dummy_view = crate::shm::PeerMapping::map(file.fd(), 0, 8192).unwrap();
    // SAFETY: our own mapping of 8192 bytes.
    unsafe { std::ptr::write_bytes(dummy_view.addr() as *mut u8, 0xab, 64) };
    let (codes, message) = transfer(&mut s, &[request(true, 1, 0, 64, seg + 128, OWN)]);
    assert_eq!(codes, vec![0], "{message}");
    let seg_bytes = bytes_at(segment.addr(), 256);
    assert!(seg_bytes[128..192].iter().all(|b| *b == 0xab));
    assert!(seg_bytes[..128]
        .iter()
        .chain(&seg_bytes[192..])
        .all(|b| *b == 0));

    // Unknown kinds and a malformed transfer are answered; unmap of an unknown block too.
    assert_eq!(call(&mut s, 99, &Writer::default(), None).0, INVALID);
    let mut truncated = Writer::default();
    truncated.u32(3).u8(1);
    assert_eq!(
        call(&mut s, Kind::Transfer as u8, &truncated, None).0,
        INVALID
    );
    let mut unmap = Writer::default();
    unmap.u64(77);
    assert_eq!(call(&mut s, Kind::Unmap as u8, &unmap, None).0, INVALID);
    let stats = server.stats();
    assert_eq!(
        (stats.dummies, stats.mappings, stats.mapped_bytes),
        (1, 1, 8192)
    );
    assert_eq!(stats.requests_refused, 7);

    // A frame claiming a huge body ends that dummy only; its mapping is released.
    let mut huge = Vec::from(u32::MAX.to_le_bytes());
    huge.push(Kind::Ping as u8);
    send_with_fds(s.as_fd(), &huge, &[]).unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(s.read(&mut byte).unwrap(), 0, "closed by the real client");
    assert!(crate::test_util::wait_until(Duration::from_secs(5), || {
        server.stats().connections == 0
    }));
    let stats = server.stats();
    assert_eq!(
        (stats.dummies, stats.mappings, stats.mapped_bytes),
        (0, 0, 0)
    );
    assert_eq!(
        stats.connections_dropped, 2,
        "this one and the short hello's"
    );
    let mut again = connect(&name);
    assert_eq!(call(&mut again, Kind::Hello as u8, &hello, None).0, 0);
}

/// A transfer the real client reads only after its writer's deadline (it sat in the socket
/// while the real client was stopped) is refused and moves no byte: the deadline on the wire is
/// an instant, not "so long from whenever it is read".
#[test]
fn a_transfer_read_after_its_deadline_is_refused_and_lands_nothing() {
    let (engine, segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-deadline.sock", std::process::id());
    let _server = DummyServer::start(&[&name], Arc::clone(&engine), OWN, "127.0.0.1:1").unwrap();
    let mut s = connect(&name);
    let mut hello = Writer::default();
    hello.u32(VERSION).u32(1).u64(1);
    assert_eq!(call(&mut s, Kind::Hello as u8, &hello, None).0, 0);
    let file = SealedMemfd::create("deadline", 8192).unwrap();
    let mut map = Writer::default();
    map.u64(1).u64(8192);
    assert_eq!(call(&mut s, Kind::Map as u8, &map, Some(file.fd())).0, 0);
    let dummy_view = crate::shm::PeerMapping::map(file.fd(), 0, 8192).unwrap();
    // SAFETY: our own mapping of 8192 bytes.
    unsafe { std::ptr::write_bytes(dummy_view.addr() as *mut u8, 0xcd, 64) };

    // The writer's grant ends 50 ms from now; the frame reaches the real client 150 ms later.
    let mut late = request(true, 1, 0, 64, segment.addr() as u64, OWN);
    late.send_by_monotonic_ns =
        super::wire::deadline_to_wire(Some(std::time::Instant::now() + Duration::from_millis(50)));
    let mut w = Writer::default();
    w.u32(1);
    late.encode(&mut w);
    std::thread::sleep(Duration::from_millis(150));
    let (code, message, payload) = call(&mut s, Kind::Transfer as u8, &w, None);
    assert_eq!(code, 0, "{message}");
    let mut r = Reader::new(&payload);
    assert_eq!(r.u32().unwrap(), 1);
    let message = r.str().unwrap().to_string();
    assert_eq!(
        r.i32().unwrap(),
        crate::ErrorCode::StaleWriteToken.code(),
        "a write past its deadline was run: {message}"
    );
    let seg_bytes = bytes_at(segment.addr(), 64);
    assert!(seg_bytes.iter().all(|b| *b == 0), "no byte landed");
}

/// How many descriptors of this process are Unix sockets bound to (or accepted on) the
/// abstract name `name` (`/proc/net/unix` names accepted sockets by their listener's name).
fn sockets_named(name: &str) -> usize {
    let wanted = format!("@{name}");
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let inodes: std::collections::HashSet<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 8 && fields[7] == wanted).then(|| fields[6].to_string())
        })
        .collect();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|link| {
            let link = link.to_string_lossy();
            link.strip_prefix("socket:[")
                .and_then(|rest| rest.strip_suffix(']'))
                .is_some_and(|inode| inodes.contains(inode))
        })
        .count()
}

/// A server on two names (a real client's service port and its segment's port) answers a
/// hello on each, a repeated name is bound once, a taken name fails naming it, and shutdown
/// releases every name.
#[test]
fn a_server_on_two_names_serves_both_and_releases_both() {
    let (engine, _segment) = engine_with_segment();
    let first = format!("mc-rs-test-{}-name-a.sock", std::process::id());
    let second = format!("mc-rs-test-{}-name-b.sock", std::process::id());
    let mut server = DummyServer::start(
        &[&first, &second, &first],
        Arc::clone(&engine),
        OWN,
        "127.0.0.1:1",
    )
    .unwrap();
    for name in [&first, &second] {
        let mut s = connect(name);
        let mut hello = Writer::default();
        hello.u32(VERSION).u32(1).u64(1);
        let (code, message, _) = call(&mut s, Kind::Hello as u8, &hello, None);
        assert_eq!(code, 0, "{name}: {message}");
    }
    let taken = DummyServer::start(&[&second], Arc::clone(&engine), OWN, "127.0.0.1:1");
    assert!(taken.is_err());
    assert!(
        last_error_message().contains(&second),
        "{}",
        last_error_message()
    );
    assert!(DummyServer::start(&[], Arc::clone(&engine), OWN, "127.0.0.1:1").is_err());
    server.shutdown();
    assert_eq!(sockets_named(&first), 0);
    assert_eq!(sockets_named(&second), 0);
}

#[test]
fn shutdown_ends_connected_dummies_and_keeps_no_socket() {
    let (engine, _segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-shutdown.sock", std::process::id());
    let mut server = DummyServer::start(&[&name], Arc::clone(&engine), OWN, "127.0.0.1:1").unwrap();
    let mut s = connect(&name);
    let mut hello = Writer::default();
    hello.u32(VERSION).u32(1).u64(1);
    assert_eq!(call(&mut s, Kind::Hello as u8, &hello, None).0, 0);
    assert_eq!(server.stats().dummies, 1);
    assert_eq!(
        sockets_named(&name),
        3,
        "the listener, the dummy's connection and the server's handle on it"
    );
    let started = std::time::Instant::now();
    server.shutdown();
    // Returned with the dummy's thread ended and its state released...
    let stats = server.stats();
    assert_eq!(
        (stats.dummies, stats.connections_dropped),
        (0, 1),
        "{stats:?}"
    );
    assert_eq!(sockets_named(&name), 0, "a socket of the server lingers");
    // ...and the dummy sees its connection end at once (not after the TTL).
    let mut byte = [0u8; 1];
    assert_eq!(s.read(&mut byte).unwrap(), 0);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A real client's dummy server on [`engine_with_segment`] (socket named after `tag`) and a
/// dummy link attached to it; the segment comes along to keep it mapped.
fn served_link(tag: &str) -> (MappedRegion, DummyServer, Arc<crate::standalone::DummyLink>) {
    served_link_with(tag, super::ttl())
}

/// [`served_link`] with a dummy TTL of `ttl` on both sides.
fn served_link_with(
    tag: &str,
    ttl: Duration,
) -> (MappedRegion, DummyServer, Arc<crate::standalone::DummyLink>) {
    let (engine, segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-{tag}.sock", std::process::id());
    let server =
        DummyServer::start_with_ttl(&name, Arc::clone(&engine), OWN, "127.0.0.1:1", ttl).unwrap();
    let link = Arc::new(crate::standalone::DummyLink::connect_with(&name, ttl, None).unwrap());
    (segment, server, link)
}

/// Finding (review of the standalone layout): a dummy waited at most its TTL for any answer,
/// so a call the real client was still working on (a large or slow transfer, well within the
/// engine's timeouts) failed `TRANSFER_FAIL` and was abandoned. The real client's heartbeats
/// now keep the dummy waiting: a read held 2.5 s by a slow peer, with a TTL of 900 ms (the
/// first heartbeat within 450 ms, then every 300 ms), lands and returns `Ok` without a
/// reconnect.
#[test]
fn a_call_longer_than_the_ttl_succeeds_on_the_real_clients_heartbeats() {
    use crate::standalone::ShmPool;
    let (_segment, server, link) = served_link_with("slow", Duration::from_millis(900));
    let (_owner, owned, proxy, seen, release) = paused_owner(0x6b);
    let block = ShmPool::global().alloc(1 << 16, "slow call test").unwrap();
    let addr = block.addr();
    let reader = spawn_read(&link, addr, proxy, owned.addr() as u64);
    seen.recv_timeout(Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    release.store(true, std::sync::atomic::Ordering::Release);
    let (result, message) = reader.join().unwrap();
    assert_eq!(result, vec![Ok(())], "{message}");
    let landed = bytes_at(addr, 1 << 16);
    assert!(landed.iter().all(|&b| b == 0x6b), "the read did not land");
    assert_eq!(link.stats().reconnects, 0, "{:?}", link.stats());
    drop(link);
    drop(server);
    drop(block);
    ShmPool::global().free(addr).unwrap();
}

/// Finding S13: a dummy's transfers were serialised on its one connection, so a thread whose
/// transfer waits on a stalled remote peer held up every other thread of that dummy (until
/// the TTL ended the stalled call). With a pool of connections the other thread runs at once.
#[test]
fn a_stalled_transfer_does_not_hold_up_the_dummys_other_threads() {
    use crate::transfer::{TransferDelegate, TransferOp, TransferRequest};
    let (segment, server, link) = served_link("concurrent");
    // A peer that accepts the real client's data connection and never answers.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stalled_name = stalled.local_addr().unwrap().to_string();
    let (stalled_done, stalled_result) = std::sync::mpsc::channel();
    let reader = {
        let link = Arc::clone(&link);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            let request = TransferRequest {
                op: TransferOp::Read,
                local_addr: buf.as_mut_ptr() as usize,
                len: buf.len() as u64,
                endpoint: &stalled_name,
                remote_addr: 0x1000,
                epoch: 0,
                send_by: None,
            };
            // SAFETY: `buf` outlives the call.
            let result = unsafe { link.transfer(&[request]) };
            stalled_done.send(result).unwrap();
        })
    };
    let (held, _) = stalled.accept().unwrap();
    // The stalled read is in flight at the real client; a write of the same dummy to the real
    // client's own segment must complete meanwhile.
    let (done, written) = std::sync::mpsc::channel();
    let writer = {
        let link = Arc::clone(&link);
        let remote_addr = segment.addr() as u64;
        std::thread::spawn(move || {
            let data = vec![0x5au8; 4096];
            let request = TransferRequest {
                op: TransferOp::Write,
                local_addr: data.as_ptr() as usize,
                len: data.len() as u64,
                endpoint: OWN,
                remote_addr,
                epoch: 0,
                send_by: None,
            };
            // SAFETY: `data` outlives the call.
            let result = unsafe { link.transfer(&[request]) };
            done.send(result).unwrap();
        })
    };
    let during_stall = written.recv_timeout(Duration::from_secs(5));
    let still_stalled = stalled_result.try_recv().is_err();
    // Two connections, one dummy.
    let (server_stats, link_stats) = (server.stats(), link.stats());
    drop(held);
    writer.join().unwrap();
    reader.join().unwrap();
    assert_eq!(
        during_stall,
        Ok(vec![Ok(())]),
        "the write waited for the stalled read"
    );
    assert!(still_stalled, "the stalled read ended before the write");
    assert_eq!(
        (server_stats.dummies, server_stats.connections),
        (1, 2),
        "{server_stats:?}"
    );
    assert_eq!(link_stats.connections, 2, "{link_stats:?}");
    let landed = bytes_at(segment.addr(), 4096);
    assert!(landed.iter().all(|&b| b == 0x5a));
    assert_eq!(
        stalled_result
            .recv_timeout(Duration::from_secs(10))
            .map(|r| r[0].is_err()),
        Ok(true),
        "the stalled read must fail once its peer is gone"
    );
    drop(link);
    drop(server);
}

/// A TCP proxy to `upstream` that holds each connection's first bytes until released: it
/// reports on `seen` when a connection sent them, and forwards everything once `release` is
/// set. Accepts for at most 20 s; every wait is bounded.
fn paused_proxy(
    upstream: std::net::SocketAddr,
) -> (
    String,
    std::sync::mpsc::Receiver<()>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    listener.set_nonblocking(true).unwrap();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    let release = Arc::new(AtomicBool::new(false));
    let released = Arc::clone(&release);
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            let Ok((mut client, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            let (seen_tx, released) = (seen_tx.clone(), Arc::clone(&released));
            std::thread::spawn(move || {
                client.set_nonblocking(false).unwrap();
                client
                    .set_read_timeout(Some(Duration::from_secs(20)))
                    .unwrap();
                let mut first = [0u8; 4096];
                let Ok(n) = client.read(&mut first) else {
                    return;
                };
                let _ = seen_tx.send(());
                let waited = std::time::Instant::now();
                while !released.load(Ordering::Acquire)
                    && waited.elapsed() < Duration::from_secs(20)
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let mut server = std::net::TcpStream::connect(upstream).unwrap();
                server.write_all(&first[..n]).unwrap();
                let (mut from_server, mut to_client) =
                    (server.try_clone().unwrap(), client.try_clone().unwrap());
                std::thread::spawn(move || std::io::copy(&mut from_server, &mut to_client));
                let _ = std::io::copy(&mut client, &mut server);
            });
        }
    });
    (addr, seen, release)
}

/// A remote owner of 64 KiB filled with `fill`, reached through a [`paused_proxy`]: its
/// engine (keep it alive), its memory, the proxy's endpoint, `seen` and `release`.
#[allow(clippy::type_complexity)]
fn paused_owner(
    fill: u8,
) -> (
    Arc<TransferEngine>,
    MappedRegion,
    String,
    std::sync::mpsc::Receiver<()>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    let owner_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let owner_addr = owner_listener.local_addr().unwrap();
    let owner = TransferEngine::new(EngineConfig {
        local_name: owner_addr.to_string(),
        listener: Some(owner_listener),
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: true,
        rdma: None,
    })
    .unwrap();
    let owned = MappedRegion::new(1 << 16).unwrap();
    // SAFETY: our own 64 KiB mapping.
    unsafe { std::ptr::write_bytes(owned.addr() as *mut u8, fill, 1 << 16) };
    owner.register(owned.addr(), owned.len(), true).unwrap();
    let (proxy, seen, release) = paused_proxy(owner_addr);
    (owner, owned, proxy, seen, release)
}

/// On a new thread, reads 64 KiB of `remote_addr` at `endpoint` into `addr` (in a shared
/// block that stays allocated until the thread is joined) through `link`; the results and the
/// thread's last error message.
fn spawn_read(
    link: &Arc<crate::standalone::DummyLink>,
    addr: usize,
    endpoint: String,
    remote_addr: u64,
) -> std::thread::JoinHandle<(Vec<crate::Result<()>>, String)> {
    use crate::transfer::{TransferDelegate, TransferOp, TransferRequest};
    let link = Arc::clone(link);
    std::thread::spawn(move || {
        let request = TransferRequest {
            op: TransferOp::Read,
            local_addr: addr,
            len: 1 << 16,
            endpoint: &endpoint,
            remote_addr,
            epoch: 0,
            send_by: None,
        };
        // SAFETY: the caller keeps the block allocated until the thread is joined.
        let result = unsafe { link.transfer(&[request]) };
        (result, crate::error::last_error_message())
    })
}

/// Finding S14 (review of the connection pool): a zero-copy read of one connection whose
/// shared block was re-homed meanwhile (another connection's call on that block was
/// abandoned) landed in the old file, which nothing in the dummy maps any more, and returned
/// `Ok` with the caller's memory unchanged. It must fail instead.
#[test]
fn a_read_into_a_block_re_homed_during_it_fails_instead_of_returning_ok() {
    use crate::standalone::ShmPool;
    let (_segment, server, link) = served_link("rehomed");
    // The remote owner of the bytes, behind a proxy that holds the real client's request.
    let (_owner, owned, proxy, seen, release) = paused_owner(0xc3);

    let block = ShmPool::global().alloc(1 << 16, "rehome test").unwrap();
    let (addr, old_id) = (block.addr(), block.id());
    let reader = spawn_read(&link, addr, proxy, owned.addr() as u64);
    // The real client runs the read (its mapping of the block's current file) ...
    seen.recv_timeout(Duration::from_secs(10)).unwrap();
    // ... when the block is re-homed, as an abandoned call on another connection does.
    ShmPool::global().rehome(old_id).unwrap();
    release.store(true, std::sync::atomic::Ordering::Release);
    let (result, message) = reader.join().unwrap();
    let now = bytes_at(addr, 1 << 16);
    assert!(
        now.iter().all(|&b| b == 0),
        "the read landed here after all"
    );
    assert_eq!(result, vec![Err(ErrorCode::TransferFail)], "{message}");
    assert!(message.contains("re-homed"), "{message}");
    drop(link);
    drop(server);
    drop(block);
    ShmPool::global().free(addr).unwrap();
}

#[test]
fn a_dummys_own_blocks_are_not_the_callers_to_free() {
    use super::pool::{BlockGuard, ShmPool};
    let pool = ShmPool::global();
    let guard = BlockGuard::new(4096, "guarded test block").unwrap();
    let (addr, id) = (guard.addr(), guard.block().unwrap().id());
    assert_eq!(pool.free(addr), Err(ErrorCode::InvalidParams));
    assert!(
        crate::error::last_error_message().contains("dummy's own"),
        "{}",
        crate::error::last_error_message()
    );
    let held = |addr| pool.find(addr, 1).map(|(block, _)| block.id());
    assert_eq!(held(addr), Some(id), "a refused free forgot the block");
    drop(guard);
    assert_ne!(held(addr), Some(id), "the guard's drop left its block");
    // The caller's own blocks still free.
    let own = pool.alloc(4096, "caller test block").unwrap().addr();
    assert_eq!(pool.free(own), Ok(()));
}

/// Finding (review of the standalone layout): the real client kept every descriptor attached
/// to any chunk of a frame until the frame ended, so a dummy sending a long frame one byte per
/// message, each with descriptors, could fill the real client's descriptor table. A second
/// descriptor in one frame now drops the connection at once.
#[test]
fn a_frame_with_more_than_one_descriptor_drops_the_connection() {
    let (engine, _segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-fdflood.sock", std::process::id());
    let server = DummyServer::start(&[&name], Arc::clone(&engine), OWN, "127.0.0.1:1").unwrap();
    let mut s = connect(&name);
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut hello = Writer::default();
    hello.u32(VERSION).u32(1).u64(1);
    assert_eq!(call(&mut s, Kind::Hello as u8, &hello, None).0, 0);
    // A Map frame declaring a 4 KiB body, sent a byte at a time, a descriptor on each byte.
    let mut body = Writer::default();
    body.0.resize(4096, 0);
    let frame = body.frame(Kind::Map as u8);
    let memfd = SealedMemfd::create("fd flood test", 4096).unwrap();
    for byte in frame.chunks(1).take(8) {
        if send_with_fds(s.as_fd(), byte, &[memfd.fd()]).is_err() {
            break; // Dropped already.
        }
    }
    let mut answer = [0u8; 1];
    let ended = match s.read(&mut answer) {
        Ok(n) => n == 0,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(ended, "the real client kept reading the flooding frame");
    drop(server);
}

/// Finding (review of the standalone layout): a guard held its block's first `Arc`, so after
/// a re-home (an abandoned call naming the dummy's local buffer) the replaced block, with its
/// memfd and pages, stayed alive until the guard dropped: a second local buffer's worth of
/// shared memory per client, and `guard.block()` named a stale id. The guard now stands for
/// the block at its address.
#[test]
fn a_re_homed_guarded_block_releases_its_old_file() {
    use super::pool::{BlockGuard, ShmPool};
    let name = format!("guard rehome test {}", std::process::id());
    let files = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|link| link.to_string_lossy().contains(&name))
            .count()
    };
    let guard = BlockGuard::new(1 << 16, &name).unwrap();
    assert_eq!(files(), 1);
    let old_id = guard.block().unwrap().id();
    ShmPool::global().rehome(old_id).unwrap();
    let current = ShmPool::global().find(guard.addr(), 1).unwrap().0.id();
    assert_ne!(current, old_id);
    assert_eq!(
        guard.block().unwrap().id(),
        current,
        "the guard names a stale block"
    );
    assert_eq!(files(), 0, "the replaced block's file is still open");
    let addr = guard.addr();
    drop(guard);
    let held = ShmPool::global().find(addr, 1).map(|(block, _)| block.id());
    assert_ne!(held, Some(current), "the guard's drop left its successor");
}

/// Finding (review of the standalone layout): a dummy sent every piece of a call in one
/// `Transfer` frame, so a call encoding to more than the real client's 64 MiB frame limit
/// (about a million requests) failed whole: the real client dropped the connection. It is
/// now sent in rounds. Endpoint names of 4 KB make 20 000 requests (81 MB) enough here.
#[test]
fn a_call_over_one_frame_is_sent_in_rounds() {
    use crate::standalone::ShmPool;
    use crate::transfer::{TransferDelegate, TransferOp, TransferRequest};
    let (segment, server, link) = served_link("rounds");
    let block = ShmPool::global().alloc(4096, "rounds test").unwrap();
    // SAFETY: our own 4 KiB block.
    unsafe { std::ptr::write_bytes(block.addr() as *mut u8, 0x5c, 1) };
    let unreachable = format!("{}:1", "x".repeat(4000));
    let one_byte = |endpoint, remote_addr| TransferRequest {
        op: TransferOp::Write,
        local_addr: block.addr(),
        len: 1,
        endpoint,
        remote_addr,
        epoch: 0,
        send_by: None,
    };
    let n = 20_000;
    let piece = super::wire::WireRequest::encoded_len(&unreachable);
    assert!(
        n * piece > super::wire::MAX_BODY,
        "the call must not fit one frame"
    );
    let mut requests: Vec<TransferRequest<'_>> =
        (0..n).map(|_| one_byte(&unreachable, 0x1000)).collect();
    requests.push(one_byte(OWN, segment.addr() as u64));
    // SAFETY: the block and the segment outlive the call.
    let results = unsafe { link.transfer(&requests) };
    let message = crate::error::last_error_message();
    assert_eq!(results.len(), n + 1);
    assert_eq!(results[n], Ok(()), "{message}");
    assert!(results[..n].iter().all(Result::is_err));
    // SAFETY: the segment is mapped; nothing else writes it now.
    assert_eq!(unsafe { *(segment.addr() as *const u8) }, 0x5c);
    assert_eq!(link.stats().reconnects, 0, "{:?}", link.stats());
    drop(link);
    drop(server);
    ShmPool::global().free(block.addr()).unwrap();
}

#[test]
fn a_wire_requests_encoded_length_is_what_it_encodes() {
    let request = super::wire::WireRequest {
        write: true,
        block: 1,
        offset: 2,
        len: 3,
        remote_addr: 4,
        epoch: 5,
        send_by_monotonic_ns: 6,
        endpoint: "127.0.0.1:12345".into(),
    };
    let mut w = Writer::default();
    request.encode(&mut w);
    assert_eq!(
        w.0.len(),
        super::wire::WireRequest::encoded_len(&request.endpoint)
    );
}

#[test]
fn a_dummy_of_another_user_is_closed_on_unserved() {
    let (engine, _segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-other-user.sock", std::process::id());
    let server = DummyServer::start(&[&name], Arc::clone(&engine), OWN, "127.0.0.1:1").unwrap();
    // Served, even a ping before hello gets an answer (INVALID_PARAMS), as this user's does.
    let mut ours = connect(&name);
    assert_eq!(
        call(&mut ours, Kind::Ping as u8, &Writer::default(), None).0,
        INVALID
    );
    let ping = Writer::default().frame(Kind::Ping as u8);
    let Some(seen) = crate::test_util::other_user_connects(&name, &ping) else {
        return;
    };
    assert_eq!(seen, "CLOSED");
    assert_eq!(server.stats().other_user_refused, 1);
}

/// Whether the real client closed `s` (read sees end of file within 5 s) rather than answer
/// or keep waiting.
fn closed_by_server(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

#[test]
fn connections_past_the_cap_are_closed_unserved() {
    let (engine, _segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-conn-cap.sock", std::process::id());
    let server = DummyServer::start(&[&name], Arc::clone(&engine), OWN, "127.0.0.1:1").unwrap();
    let cap = crate::env::DUMMY_MAX_CONNECTIONS.get() as usize;
    let ping = Writer::default();
    let mut served: Vec<UnixStream> = (0..cap).map(|_| connect(&name)).collect();
    for s in &mut served {
        // Served: even a ping before hello is answered.
        assert_eq!(call(s, Kind::Ping as u8, &ping, None).0, INVALID);
    }
    let mut extra = connect(&name);
    // The real client may have closed it already (then the send fails).
    let _ = send_with_fds(extra.as_fd(), &ping.frame(Kind::Ping as u8), &[]);
    assert!(
        closed_by_server(&mut extra),
        "a connection past the cap was served"
    );
    assert_eq!(server.stats().connections_refused, 1);
    // One connection less, and the next is served again.
    drop(served.pop());
    let again = crate::test_util::wait_until(Duration::from_secs(5), || {
        let mut s = connect(&name);
        let _ = send_with_fds(s.as_fd(), &ping.frame(Kind::Ping as u8), &[]);
        !closed_by_server(&mut s)
    });
    assert!(again);
}

#[test]
fn a_frame_trickled_byte_by_byte_is_dropped_one_ttl_after_its_first_byte() {
    let (engine, _segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-trickle.sock", std::process::id());
    let ttl = Duration::from_millis(400);
    let server =
        DummyServer::start_with_ttl(&name, Arc::clone(&engine), OWN, "127.0.0.1:1", ttl).unwrap();
    let mut s = connect(&name);
    // A header announcing a 64 MiB body, then one byte of it every 150 ms: each read of the
    // real client sees a byte within the TTL.
    let mut header = vec![Kind::Ping as u8];
    header.extend_from_slice(&(64u32 << 20).to_le_bytes());
    let mut closed = false;
    for (i, byte) in header
        .iter()
        .chain(std::iter::repeat(&0u8))
        .take(20)
        .enumerate()
    {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(150));
        }
        if std::io::Write::write_all(&mut s, std::slice::from_ref(byte)).is_err() {
            closed = true;
            break;
        }
    }
    // The real client closed the connection while bytes were still coming (a write fails
    // once it did), not only after the trickle stopped.
    assert!(
        closed,
        "a frame trickled over 3 s (TTL 400 ms) kept its connection"
    );
    assert_eq!(server.stats().frames_timed_out, 1);
}

#[test]
fn a_map_past_the_mapped_bytes_limit_is_refused() {
    let (engine, _segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-big-map.sock", std::process::id());
    let server = DummyServer::start(&[&name], Arc::clone(&engine), OWN, "127.0.0.1:1").unwrap();
    let mut s = connect(&name);
    let mut hello = Writer::default();
    hello.u32(VERSION).u32(1).u64(1);
    assert_eq!(call(&mut s, Kind::Hello as u8, &hello, None).0, 0);
    // A sparse file one page past the per-process limit (1 TiB by default).
    let limit = crate::env::DUMMY_MAX_MAPPED_BYTES.get();
    let len = limit + 4096;
    let file = SealedMemfd::create("huge", len as usize).unwrap();
    let mut map = Writer::default();
    map.u64(1).u64(len);
    let (code, message, _) = call(&mut s, Kind::Map as u8, &map, Some(file.fd()));
    assert_eq!(code, INVALID, "{message}");
    assert!(message.contains("MC_DUMMY_MAX_MAPPED_BYTES"), "{message}");
    assert_eq!(
        (server.stats().maps_refused, server.stats().mapped_bytes),
        (1, 0)
    );
    // A block within the limit still maps.
    let small = SealedMemfd::create("small", 8192).unwrap();
    let mut map = Writer::default();
    map.u64(2).u64(8192);
    assert_eq!(call(&mut s, Kind::Map as u8, &map, Some(small.fd())).0, 0);
}

#[test]
fn the_mapping_limit_counts_every_link_of_one_process() {
    let (engine, _segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-links.sock", std::process::id());
    let server = DummyServer::start(&[&name], Arc::clone(&engine), OWN, "127.0.0.1:1").unwrap();
    let cap = crate::env::DUMMY_MAX_MAPPINGS.get();
    let file = SealedMemfd::create("links", 4096).unwrap();
    // Two links of this process, each saying another pid: together past the cap.
    let mut mapped = 0u64;
    let mut refused = 0u64;
    let mut links = Vec::new(); // open, so that their mappings stay
    for (pid, link) in [(11u32, 1u64), (22, 2)] {
        let mut s = connect(&name);
        let mut hello = Writer::default();
        hello.u32(VERSION).u32(pid).u64(link);
        assert_eq!(call(&mut s, Kind::Hello as u8, &hello, None).0, 0);
        for block in 0..cap / 2 + 1 {
            let mut map = Writer::default();
            map.u64(block).u64(4096);
            match call(&mut s, Kind::Map as u8, &map, Some(file.fd())).0 {
                0 => mapped += 1,
                _ => refused += 1,
            }
        }
        links.push(s);
    }
    assert_eq!(
        (mapped, refused),
        (cap, 2),
        "mapped over two links of one process"
    );
    assert_eq!(server.stats().maps_refused, 2);
}

/// A dummy that punches a hole in its own block (which the shrink seal does not prevent) where
/// the kernel cannot refill it (strict overcommit at its limit) raised SIGBUS in the real
/// client copying into or out of the block: the whole store process died. Now both copies fail
/// `TRANSFER_FAIL`, later transfers on that block are refused, and other blocks still move.
/// Runs in the RDMA VM (`scripts/rdma-tests.sh`): it switches the kernel's overcommit.
#[test]
#[ignore = "needs a kernel of its own (strict overcommit): run by scripts/rdma-tests.sh"]
fn a_hole_punched_in_a_dummys_block_fails_its_transfers_not_the_real_client() {
    const FAIL: i32 = -800;
    let (engine, segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-punched.sock", std::process::id());
    let server = DummyServer::start(&[&name], Arc::clone(&engine), OWN, "127.0.0.1:1").unwrap();
    let mut s = connect(&name);
    let mut hello = Writer::default();
    hello.u32(VERSION).u32(1).u64(1);
    assert_eq!(call(&mut s, Kind::Hello as u8, &hello, None).0, 0);
    let punched = SealedMemfd::create("punched", 1 << 16).unwrap();
    let intact = SealedMemfd::create("intact", 8192).unwrap();
    for (id, file) in [(1u64, &punched), (2, &intact)] {
        let mut map = Writer::default();
        map.u64(id).u64(file.len() as u64);
        assert_eq!(call(&mut s, Kind::Map as u8, &map, Some(file.fd())).0, 0);
    }
    let view = crate::shm::PeerMapping::map(intact.fd(), 0, 8192).unwrap();
    // SAFETY: our own mapping of 8192 bytes.
    unsafe { std::ptr::write_bytes(view.addr() as *mut u8, 0x3c, 4096) };
    let seg = segment.addr() as u64;
    crate::test_util::punch_hole(punched.fd(), 0, 1 << 16);
    let (codes, message) = {
        let _strict = crate::test_util::StrictOvercommit::enter();
        transfer(
            &mut s,
            &[
                request(true, 1, 0, 4096, seg, OWN),
                request(false, 1, 8192, 4096, seg + 8192, OWN),
            ],
        )
    };
    assert_eq!(codes, vec![FAIL, FAIL], "{message}");
    assert!(message.contains("lost pages"), "{message}");
    assert_eq!(server.stats().lost_page_requests, 2);
    // The block stays refused; the dummy's other block still moves its bytes.
    let (codes, _) = transfer(&mut s, &[request(true, 1, 0, 16, seg, OWN)]);
    assert_eq!(codes, vec![FAIL]);
    let (codes, message) = transfer(&mut s, &[request(true, 2, 0, 4096, seg + 16384, OWN)]);
    assert_eq!(codes, vec![0], "{message}");
    assert_eq!(bytes_at(segment.addr() + 16384, 4096), vec![0x3c; 4096]);
}

/// With a cluster key, a dummy link that proves it is served; one with another key or none
/// is refused before its hello is read (`INVALID_PARAMS`, naming the handshake).
#[test]
fn a_keyed_real_client_serves_only_dummies_that_prove_its_key() {
    use crate::auth::test_ring as ring;
    use crate::standalone::DummyLink;
    use crate::transfer::{TransferDelegate, TransferOp, TransferRequest};
    let (engine, segment) = engine_with_segment();
    let name = format!("mc-rs-test-{}-keyed.sock", std::process::id());
    let limits = super::server::Limits::from_env();
    let server =
        DummyServer::start_with(&[&name], engine, OWN, "127.0.0.1:1", limits, Some(ring(1)))
            .unwrap();
    let ttl = super::ttl();
    let link = DummyLink::connect_with(&name, ttl, Some(ring(1))).unwrap();
    let mut buf = vec![0u8; 4096];
    let request = TransferRequest {
        op: TransferOp::Read,
        local_addr: buf.as_mut_ptr() as usize,
        len: buf.len() as u64,
        endpoint: OWN,
        remote_addr: segment.addr() as u64,
        epoch: 0,
        send_by: None,
    };
    // SAFETY: `buf` outlives the call; the segment is registered for its whole length.
    let read = unsafe { link.transfer(&[request]) };
    assert_eq!(read, vec![Ok(())]);
    for key in [Some(ring(2)), None] {
        let refused = DummyLink::connect_with(&name, ttl, key.clone());
        assert_eq!(refused.err(), Some(ErrorCode::InvalidParams));
        let message = crate::error::last_error_message();
        assert!(message.contains("cannot attach"), "{message}");
        if key.is_some() {
            assert!(message.contains("AUTH_FAILED"), "{message}");
        }
    }
    drop(link);
    drop(server);
}
