use super::*;
use crate::error::ErrorCode;
use crate::shm::{PeerMapping, SealedMemfd};
use crate::transfer::metrics::Metrics;
use crate::transfer::transport::Opcode;
use crate::transfer::transport::Slice;
use std::sync::Arc;
use std::time::Duration;

/// An owner exporting mount `epoch` of a fresh 64 KiB file under a unique loopback endpoint
/// name (127.x.y.z:port), and its own mapping of the file.
fn owner(epoch: u64) -> (String, Exporter, SealedMemfd, PeerMapping) {
    owner_at(&unique_endpoint(), epoch)
}

/// A loopback endpoint name (127.x.y.z:port) no other test uses.
fn unique_endpoint() -> String {
    format!(
        "127.{}.{}.{}:{}",
        fastrand::u8(..),
        fastrand::u8(..),
        fastrand::u8(1..),
        fastrand::u16(1..)
    )
}

/// An owner exporting mount `epoch` of a fresh 64 KiB file as `endpoint`.
fn owner_at(endpoint: &str, epoch: u64) -> (String, Exporter, SealedMemfd, PeerMapping) {
    owner_with(endpoint, epoch, Duration::from_secs(5))
}

/// [`owner_at`] whose handshakes may take `timeout` each.
fn owner_with(
    endpoint: &str,
    epoch: u64,
    timeout: Duration,
) -> (String, Exporter, SealedMemfd, PeerMapping) {
    let endpoint = endpoint.to_string();
    let exporter = Exporter::start(&endpoint, timeout, None).unwrap();
    let file = SealedMemfd::create("same-host-unit", 1 << 16).unwrap();
    let mine = PeerMapping::map(file.fd(), 0, 1 << 16).unwrap();
    exporter
        .publish(0x10_0000, 1 << 16, epoch, file.fd())
        .unwrap();
    (endpoint, exporter, file, mine)
}

fn maps(metrics: &Arc<Metrics>) -> PeerMaps {
    keyed_maps(metrics, None)
}

fn keyed_maps(metrics: &Arc<Metrics>, key: Option<Arc<crate::auth::KeyRing>>) -> PeerMaps {
    PeerMaps::new(
        true,
        Duration::from_secs(60),
        Duration::from_secs(5),
        Arc::clone(metrics),
        key,
    )
}

/// With a cluster key, the owner maps its segment only to a peer that proves it; one with
/// another key or none gets no mapping (and uses the network, which refuses it too).
#[test]
fn a_keyed_owner_maps_only_for_peers_that_prove_its_key() {
    use crate::auth::test_ring as ring;
    let endpoint = unique_endpoint();
    let exporter = Exporter::start(&endpoint, Duration::from_secs(5), Some(ring(1))).unwrap();
    let file = SealedMemfd::create("same-host-keyed", 1 << 16).unwrap();
    exporter.publish(0x10_0000, 1 << 16, 5, file.fd()).unwrap();
    let metrics = Arc::new(Metrics::default());
    let before = crate::auth::counters();
    for key in [Some(ring(2)), None] {
        let peers = keyed_maps(&metrics, key);
        assert!(peers.lookup(&endpoint, 5, 0x10_0000, 16).is_none());
    }
    let keyed = keyed_maps(&metrics, Some(ring(1)));
    assert!(
        keyed.lookup(&endpoint, 5, 0x10_0000, 16).is_some(),
        "{}",
        crate::error::last_error_message()
    );
    let after = crate::auth::counters();
    assert!(after.accepted > before.accepted);
    assert!(after.refused_total() >= before.refused_total() + 2);
    drop(exporter);
}

/// Another process of this user (python) that opens `count` connections to `endpoint`'s
/// socket, runs `each` on every one (python lines on `s`, indented by four spaces, ending in
/// a newline; empty: an idle connection), and holds them all until its stdin closes. Returns
/// once every connection is open.
fn stranger_holding(endpoint: &str, count: usize, each: &str) -> std::process::Child {
    let script = format!(
        "import os, resource, socket, sys\n\
         soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n\
         resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))\n\
         held = []\n\
         for _ in range({count}):\n    \
         s = socket.socket(socket.AF_UNIX)\n    s.settimeout(5)\n    \
         s.connect('\\0{name}')\n{each}    held.append(s)\n\
         print(len(held), flush=True)\n\
         sys.stdin.read()\n",
        name = handshake::socket_name(endpoint),
    );
    let mut stranger = std::process::Command::new("python3")
        .args(["-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(stranger.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), count.to_string(), "the stranger's connections");
    stranger
}

fn read(
    metrics: &Metrics,
    peer: &MappedPeer,
    remote: u64,
    out: &mut [u8],
    epoch: u64,
) -> Result<u64, ErrorCode> {
    let slice = Slice {
        op: Opcode::Read,
        local: out.as_mut_ptr(),
        len: out.len(),
        remote,
        epoch,
    };
    // SAFETY: `peer` is alive and covers the range; `out` is ours.
    unsafe { copy_mapped(metrics, &peer.target(), &slice, None) }.map_err(|e| e.code)
}

#[test]
fn only_the_owner_of_the_named_epoch_is_mapped_and_a_retired_mount_is_unusable() {
    let (endpoint, exporter, _file, mine) = owner(77);
    // SAFETY: the owner's own mapping of 64 KiB; the test is its only writer.
    unsafe { std::ptr::write_bytes((mine.addr() + 4096) as *mut u8, 0xab, 16) };
    let metrics = Arc::new(Metrics::default());
    let peers = maps(&metrics);
    assert!(
        peers.lookup(&endpoint, 0, 0x10_0000, 16).is_none(),
        "epoch 0 never maps"
    );
    assert!(
        peers.lookup(&endpoint, 78, 0x10_0000, 16).is_none(),
        "another epoch"
    );
    assert_eq!(metrics.snapshot().same_host_refusals, 1);
    assert!(peers.lookup(&endpoint, 78, 0x10_0000, 16).is_none());
    assert_eq!(metrics.snapshot().same_host_refusals, 1, "remembered");
    let peer = peers
        .lookup(&endpoint, 77, 0x10_0000, 16)
        .expect("the named epoch maps");
    assert!(
        peers
            .lookup(&endpoint, 77, 0x10_0000 + (1 << 16) - 8, 16)
            .is_none(),
        "outside"
    );
    let mut out = [0u8; 16];
    assert_eq!(
        read(&metrics, &peer, 0x10_0000 + 4096, &mut out, 77),
        Ok(16)
    );
    assert_eq!(out, [0xab; 16]);
    // Retire: a copy through the mapping already handed out fails, copying nothing.
    exporter.retire();
    let mut out = [0u8; 16];
    assert_eq!(
        read(&metrics, &peer, 0x10_0000 + 4096, &mut out, 77),
        Err(ErrorCode::StaleSegmentEpoch)
    );
    assert_eq!(out, [0; 16]);
    assert_eq!(metrics.snapshot().same_host_stale, 1);
    assert!(
        peers.lookup(&endpoint, 77, 0x10_0000, 16).is_none(),
        "dropped, not re-granted"
    );
    assert_eq!(metrics.snapshot().same_host_mappings_dropped, 1);
    let snapshot = metrics.snapshot();
    assert_eq!(
        (snapshot.same_host_handshakes, snapshot.same_host_refusals),
        (1, 2)
    );
}

#[test]
fn an_owner_that_goes_away_fails_the_copy_and_nobody_listening_is_refused() {
    let (endpoint, exporter, _file, _mine) = owner(5);
    let metrics = Arc::new(Metrics::default());
    let peers = maps(&metrics);
    let peer = peers.lookup(&endpoint, 5, 0x10_0000, 16).unwrap();
    exporter.stop();
    let mut out = [0u8; 16];
    // The control word went to 0 with the stop: stale, never the old bytes as valid.
    assert_eq!(
        read(&metrics, &peer, 0x10_0000, &mut out, 5),
        Err(ErrorCode::StaleSegmentEpoch)
    );
    let nobody = maps(&metrics);
    assert!(nobody.lookup("unit-nobody-listens-here", 5, 0, 1).is_none());
    assert_eq!(metrics.snapshot().same_host_refusals, 1);
}

#[test]
fn an_endpoint_whose_address_is_not_of_this_host_is_never_asked() {
    // 192.0.2.0/24 is TEST-NET-1: never an address of this host. Whoever binds the socket
    // name of such an endpoint here (and echoes the epoch) is not the owner.
    let endpoint = format!("192.0.2.{}:{}", fastrand::u8(1..255), fastrand::u16(1..));
    let (endpoint, _exporter, _file, _mine) = owner_at(&endpoint, 9);
    let metrics = Arc::new(Metrics::default());
    let peers = maps(&metrics);
    assert!(peers.lookup(&endpoint, 9, 0x10_0000, 16).is_none());
    let snapshot = metrics.snapshot();
    assert_eq!(
        (snapshot.same_host_handshakes, snapshot.same_host_refusals),
        (0, 1)
    );
    // A loopback endpoint is asked (and granted).
    let (local, _exporter, _file, _mine) = owner(9);
    assert!(peers.lookup(&local, 9, 0x10_0000, 16).is_some());
}

/// Finding (review of the same-host path): a request naming a stale epoch dropped the cached,
/// still current mapping, so requests of the old and the current mount alternating (while
/// the master still hands out descriptors of a remounted owner) remapped the whole segment
/// each time. A stale request now goes to the network and leaves the mapping alone.
#[test]
fn a_stale_epoch_request_keeps_the_current_mapping() {
    let (endpoint, _exporter, _file, _mine) = owner(12);
    let metrics = Arc::new(Metrics::default());
    let peers = maps(&metrics);
    let first = peers.lookup(&endpoint, 12, 0x10_0000, 16).unwrap();
    assert!(
        peers.lookup(&endpoint, 11, 0x10_0000, 16).is_none(),
        "stale"
    );
    let again = peers.lookup(&endpoint, 12, 0x10_0000, 16).unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "the current mapping was remade"
    );
    let snapshot = metrics.snapshot();
    assert_eq!(
        (
            snapshot.same_host_handshakes,
            snapshot.same_host_mappings_dropped
        ),
        (1, 0)
    );
}

#[test]
fn a_process_of_another_user_gets_no_answer_from_the_exporter() {
    let (endpoint, _exporter, _file, _mine) = owner(5);
    let name = handshake::socket_name(&endpoint);
    // A stranger of this user gets an answer (the grant, for the right epoch)...
    let hello = handshake::Hello { epoch: 5 }.encode();
    let addr = handshake::socket_addr(&endpoint).unwrap();
    let mut ours = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    std::io::Write::write_all(&mut ours, &hello).unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = [0u8; 8];
    let answered = std::io::Read::read(&mut ours, &mut answer).unwrap();
    assert!(answered > 0, "a process of this user got no answer");
    let Some(seen) = crate::test_util::other_user_connects(&name, &hello) else {
        return;
    };
    // ...a process of another user is closed on, unanswered, whatever it asks.
    assert_eq!(seen, "CLOSED");
}

#[test]
fn an_idle_connection_delays_no_other_handshake() {
    // The owner would wait 30 s for a hello; the peer gives up after 5 s (`maps`).
    let (endpoint, _exporter, _file, _mine) =
        owner_with(&unique_endpoint(), 9, Duration::from_secs(30));
    let addr = handshake::socket_addr(&endpoint).unwrap();
    let idle: Vec<_> = (0..3)
        .map(|_| std::os::unix::net::UnixStream::connect_addr(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let metrics = Arc::new(Metrics::default());
    let peer = maps(&metrics).lookup(&endpoint, 9, 0x10_0000, 16);
    assert!(
        peer.is_some(),
        "the handshake waited behind idle connections and gave up"
    );
    drop(idle);
}

#[test]
fn a_process_that_hand_shakes_in_a_loop_evicts_no_other_peers_connection() {
    let (endpoint, _exporter, _file, _mine) = owner(21);
    let metrics = Arc::new(Metrics::default());
    let peers = maps(&metrics);
    let held = peers.lookup(&endpoint, 21, 0x10_0000, 16).expect("mapped");
    // Another process of this user: more granted handshakes than the owner holds at once.
    let handshakes = 4200;
    let hello: String = handshake::Hello { epoch: 21 }
        .encode()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let granted = format!(
        "    s.sendall(bytes.fromhex('{hello}'))\n    \
         data, fds, _, _ = socket.recv_fds(s, 64, 4)\n    \
         [os.close(fd) for fd in fds]\n"
    );
    let mut stranger = stranger_holding(&endpoint, handshakes, &granted);
    // Our mapping's connection is still held: its reaper saw no hang-up.
    let dropped = crate::test_util::wait_until(Duration::from_secs(2), || {
        metrics.snapshot().same_host_mappings_dropped > 0
    });
    drop(stranger.stdin.take());
    let _ = stranger.wait();
    assert!(
        !dropped,
        "a stranger's handshakes evicted our held connection"
    );
    let mut out = [0u8; 16];
    assert_eq!(read(&metrics, &held, 0x10_0000, &mut out, 21), Ok(16));
}

/// The owner (or any holder of its file) punches a hole in its segment where the kernel cannot
/// refill it (strict overcommit at its limit): a peer's mapped read or write of that range
/// raised SIGBUS and killed the peer. Now the copy fails `TRANSFER_FAIL` (`lost_page_copies`),
/// the mapping is dropped from the cache, and the next lookup hand-shakes afresh.
/// Runs in the RDMA VM (`scripts/rdma-tests.sh`): it switches the kernel's overcommit.
#[test]
#[ignore = "needs a kernel of its own (strict overcommit): run by scripts/rdma-tests.sh"]
fn a_hole_punched_in_the_owners_segment_fails_the_copy_not_the_peer() {
    let (endpoint, _exporter, file, mine) = owner(91);
    // SAFETY: the owner's own mapping of 64 KiB; the test is its only writer.
    unsafe { std::ptr::write_bytes(mine.addr() as *mut u8, 0x42, 1 << 16) };
    let metrics = Arc::new(Metrics::default());
    let peers = maps(&metrics);
    let peer = peers.lookup(&endpoint, 91, 0x10_0000, 16).expect("maps");
    let mut out = vec![0u8; 8192];
    let incoming = vec![0x99u8; 8192];
    crate::test_util::punch_hole(file.fd(), 16384, 32768);
    let (read_result, write_result) = {
        let _strict = crate::test_util::StrictOvercommit::enter();
        let read_result = read(&metrics, &peer, 0x10_0000 + 16384, &mut out, 91);
        let slice = Slice {
            op: Opcode::Write,
            local: incoming.as_ptr().cast_mut(),
            len: incoming.len(),
            remote: 0x10_0000 + 32768,
            epoch: 91,
        };
        // SAFETY: `peer` is alive and covers the range; `incoming` is ours and only read.
        let write_result = unsafe { copy_mapped(&metrics, &peer.target(), &slice, None) };
        (read_result, write_result.map_err(|e| e.code))
    };
    assert_eq!(read_result, Err(ErrorCode::TransferFail));
    assert_eq!(write_result, Err(ErrorCode::TransferFail));
    assert_eq!(metrics.snapshot().lost_page_copies, 2);
    // A copy of an intact range through the same mapping fails too: it is never trusted again.
    let mut head = [0u8; 16];
    assert_eq!(
        read(&metrics, &peer, 0x10_0000, &mut head, 91),
        Err(ErrorCode::TransferFail)
    );
    drop(peer);
    let again = peers
        .lookup(&endpoint, 91, 0x10_0000, 16)
        .expect("a fresh mapping");
    assert_eq!(read(&metrics, &again, 0x10_0000, &mut head, 91), Ok(16));
    assert_eq!(head, [0x42; 16]);
    assert_eq!(metrics.snapshot().same_host_handshakes, 2);
}

/// Another process of this user opens hundreds of idle connections to the owner's socket: the
/// exporter dropped the oldest pending connections past its cap, whoever made them, so a
/// legitimate peer whose hello was still on its way lost its handshake. Pending connections
/// are now counted per process like held ones: the flooding process loses its own.
#[test]
fn a_process_that_floods_idle_connections_drops_no_other_peers_pending_hello() {
    use std::io::{Read, Write};
    let (endpoint, _exporter, _file, _mine) =
        owner_with(&unique_endpoint(), 31, Duration::from_secs(30));
    let addr = handshake::socket_addr(&endpoint).unwrap();
    // Our connection, accepted before the flood; its hello comes after it.
    let mut ours = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut stranger = stranger_holding(&endpoint, 600, "");
    // Every one of them accepted (the exporter's loop wakes at once for new connections).
    std::thread::sleep(Duration::from_millis(300));
    ours.write_all(&handshake::Hello { epoch: 31 }.encode())
        .unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut welcome = [0u8; handshake::WELCOME_LEN];
    let answered = ours.read_exact(&mut welcome).is_ok();
    drop(stranger.stdin.take());
    let _ = stranger.wait();
    assert!(
        answered,
        "a stranger's idle connections dropped our pending hello"
    );
    let welcome = handshake::Welcome::decode(&welcome).expect("a welcome");
    assert_eq!(welcome.status, handshake::Status::Granted);
}
