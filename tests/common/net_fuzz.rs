//! The network fuzzer of `tests/net_fuzz.rs` (open servers) and `tests/net_fuzz_keyed.rs`
//! (servers with a cluster key; a process has one key, hence two binaries): mutated RPC
//! frames at a live master's RPC port and mutated transfer headers at a peer's data port, and
//! requests aimed inside the peer's real segment. Both servers must stay up and correct (a
//! real client's put and get return exact bytes afterwards, the get served from the peer's
//! segment) with bounded RSS. Open, a server must apply exactly what it admits; keyed, it
//! admits nothing: every connection ends at the handshake, even requests that would remove
//! or overwrite the kept object, which are then sent too.

use super::{pattern, Master, PeerClient};
use mooncake_rs::master::{MasterInterface, MasterRequest};
use mooncake_rs::rpc::codec::{decode_payload, encode_frame, HEADER_LEN};
use mooncake_rs::rpc::Interface;
use mooncake_rs::transfer::wire::{Opcode, SessionHeader, Status, HEADER_LEN as TRANSFER_HEADER};
use mooncake_rs::types::{PinnedObject, ReplicateConfig, Uuid};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Resident bytes of `pid`.
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// The object written before the fuzzing and read back after it.
const KEPT: &str = "kept";

/// Methods a mutated frame may still carry when it decodes as a valid request: none of them
/// removes or unmounts anything. A mutation that stays valid but turns into a removal (one
/// flipped bit makes "k/.*" "k..*", which matches `KEPT`; another makes the variant index
/// `remove_all`'s) would remove `KEPT` as the master must; such frames are not sent. A valid
/// `batch_put_start` asking for most of the segment evicts unpinned objects, so `KEPT` is
/// pinned. (Seed 10511089597179785706 lost `KEPT` before both.)
const HARMLESS: [&str; 3] = ["ping", "batch_put_start", "batch_get_replica_list"];

/// Whether the master, reading `bytes` as frames one after another until one does not decode
/// (it then closes the connection), would run a request not in [`HARMLESS`].
fn removes_or_unmounts(mut bytes: &[u8]) -> bool {
    while let Some((header, rest)) = bytes.split_first_chunk::<HEADER_LEN>() {
        let len = u32::from_le_bytes(*header) as usize;
        let Some(payload) = rest.get(..len) else {
            return false;
        };
        match decode_payload::<MasterRequest>(payload) {
            Ok(request) if !HARMLESS.contains(&MasterInterface::method(&request)) => return true,
            Ok(_) => bytes = &rest[len..],
            Err(_) => return false,
        }
    }
    false
}

/// Valid request frames to mutate.
fn request_frames() -> Vec<Vec<u8>> {
    let client = Uuid { hi: 1, lo: 2 };
    let keys = vec!["k/1".to_string(), "k/2".to_string()];
    let requests = [
        MasterRequest::ping { client },
        MasterRequest::batch_put_start {
            client,
            keys: keys.clone(),
            sizes: vec![4096, 1 << 20],
            config: ReplicateConfig::default(),
        },
        MasterRequest::batch_get_replica_list { keys: keys.clone() },
        MasterRequest::batch_remove { keys, force: false },
        MasterRequest::remove_by_regex {
            pattern: "k/.*".into(),
            force: false,
        },
    ];
    requests.iter().map(|r| encode_frame(r).unwrap()).collect()
}

/// One mutation of `input`: bit flips, a cut, random bytes spliced in, or a rewritten
/// length header.
fn mutate(rng: &mut fastrand::Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    match rng.u8(0..5) {
        0 => {
            for _ in 0..rng.usize(1..8) {
                let at = rng.usize(0..out.len());
                out[at] ^= 1 << rng.u8(0..8);
            }
        }
        1 => out.truncate(rng.usize(0..out.len())),
        2 => {
            let at = rng.usize(0..=out.len());
            let noise: Vec<u8> = (0..rng.usize(1..64)).map(|_| rng.u8(..)).collect();
            out.splice(at..at, noise);
        }
        3 if out.len() >= 4 => {
            let claimed = match rng.u8(0..3) {
                0 => u32::MAX,
                1 => 64 << 20,
                _ => rng.u32(..),
            };
            out[..4].copy_from_slice(&claimed.to_le_bytes());
        }
        _ => {
            let at = rng.usize(4.min(out.len())..out.len().max(4));
            for byte in out.iter_mut().skip(at).take(8) {
                *byte = rng.u8(..);
            }
        }
    }
    out
}

/// Sends `bytes` on a fresh connection and returns what comes back in a moment.
fn poke(port: u16, bytes: &[u8]) -> Vec<u8> {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return Vec::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let _ = stream.write_all(bytes);
    let mut answer = vec![0u8; 4096];
    let n = stream.read(&mut answer).unwrap_or(0);
    answer.truncate(n);
    answer
}

/// Asserts that `answer` holds nothing past a cluster-key handshake: nothing, or a challenge
/// (a mutation that kept a hello's magic gets one: a real one, or the unknown-key answer),
/// perhaps followed by the refusing verdict.
fn assert_only_a_handshake(answer: &[u8], seed: u64) {
    use mooncake_rs::auth::protocol::CHALLENGE_LEN;
    let handshake_only = match answer.len() {
        0 => true,
        n if n == CHALLENGE_LEN => answer.starts_with(b"MCAUTH01"),
        n if n == CHALLENGE_LEN + 8 => {
            answer.starts_with(b"MCAUTH01") && answer.ends_with(b"MCAUTHNO")
        }
        _ => false,
    };
    assert!(
        handshake_only,
        "a keyed server answered {} bytes that are not its handshake (seed {seed}): {:?}",
        answer.len(),
        &answer[..answer.len().min(16)]
    );
}

/// The cluster-key handshakes the master refused so far (its `/metrics`).
fn refused_handshakes(master: &Master) -> u64 {
    let metrics = master.http_get("/metrics");
    let refusals = metrics
        .lines()
        .filter(|l| l.starts_with("mooncake_auth_handshakes_total") && !l.contains("\"accepted\""));
    refusals
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// A master, a peer contributing a 16 MB segment, a client with none, and [`KEPT`] (300 000
/// bytes) written to the peer's segment and pinned, so the space a fuzzed `batch_put_start`
/// asks for cannot evict it either. With a key file, all three hold that key.
struct Pool {
    master: Master,
    peer: PeerClient,
    client: mooncake_rs::client::Client,
    kept: Vec<u8>,
    pin: PinnedObject,
    /// The peer's TCP data port.
    data_port: u16,
}

impl Pool {
    fn start(pattern_seed: u8, key: Option<&Path>) -> Pool {
        let flags: Vec<String> = key
            .map(|key| format!("--cluster_key_file={}", key.display()))
            .into_iter()
            .collect();
        let master = Master::start(&flags.iter().map(String::as_str).collect::<Vec<_>>());
        let peer = PeerClient::spawn(
            &master.addr(),
            "16 MB",
            "P2PHANDSHAKE",
            &flags,
            &[("MC_SAME_HOST", "0")],
        );
        let client = super::keyed_client(&master.addr(), "P2PHANDSHAKE", key, 16 << 20);
        let kept = pattern(300_000, pattern_seed);
        client
            .put(KEPT, &kept, &ReplicateConfig::default())
            .unwrap();
        let pin = client.pin(&[KEPT]).pop().unwrap().unwrap();
        let data_port = peer.name.rsplit(':').next().unwrap().parse().unwrap();
        Pool {
            master,
            peer,
            client,
            kept,
            pin,
            data_port,
        }
    }

    /// Unpins [`KEPT`], then checks that it still reads back exactly and that a fresh
    /// 200 000-byte object can be written and read.
    fn check_kept_and_a_fresh_object(&self) {
        let mut buf = vec![0u8; self.kept.len()];
        let got = self.client.get_into(KEPT, &mut buf).unwrap();
        assert_eq!(got, self.kept.len() as u64);
        assert!(buf == self.kept, "the kept object changed");
        self.client.unpin(&[self.pin.pin_id]).unwrap();
        let after = pattern(200_000, 9);
        let config = ReplicateConfig::default();
        self.client.put("fresh", &after, &config).unwrap();
        assert_eq!(self.client.get_into("fresh", &mut buf).unwrap(), 200_000);
        assert!(buf[..200_000] == after[..]);
    }
}

/// The run's seed: `NET_FUZZ_SEED` replays a run; otherwise a fresh one, printed.
fn fuzz_seed(what: &str) -> u64 {
    let seed = std::env::var("NET_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("net_fuzz ({what}) seed {seed}");
    seed
}

/// Mutated frames at both ports; with `key`, the servers hold it (and the frames do not).
pub fn mutated_frames(key: Option<&Path>) {
    let pool = Pool::start(5, key);
    let (master, peer, data_port) = (&pool.master, &pool.peer, pool.data_port);
    let (master_rss, peer_rss) = (rss(master.pid()), rss(peer.pid()));
    let seed = fuzz_seed("mutated");
    let mut rng = fastrand::Rng::with_seed(seed);
    let frames = request_frames();
    let refused_before = refused_handshakes(master);
    let start = Instant::now();
    let mut sent = 0;
    let mut withheld = 0;
    while start.elapsed() < Duration::from_secs(8) && sent < 4000 {
        let frame = &frames[rng.usize(0..frames.len())];
        let mutated = mutate(&mut rng, frame);
        // Keyed, nothing is admitted: removals are sent too.
        if key.is_none() && removes_or_unmounts(&mutated) {
            withheld += 1;
        } else {
            let answer = poke(master.port, &mutated);
            if key.is_some() {
                assert_only_a_handshake(&answer, seed);
            }
        }
        let header = SessionHeader {
            size: match rng.u8(0..3) {
                0 => rng.u64(..),
                1 => rng.u64(0..1 << 20),
                _ => 1 << 40,
            },
            addr: rng.u64(..),
            opcode: if rng.bool() {
                Opcode::Read
            } else {
                Opcode::Write
            },
            v2: rng.bool(),
            epoch: rng.bool().then(|| rng.u64(0..1 << 56)),
        };
        let mut bytes = mutate(&mut rng, &header.encode());
        bytes.extend((0..rng.usize(0..256)).map(|_| rng.u8(..)));
        let answer = poke(data_port, &bytes);
        if key.is_some() {
            assert_only_a_handshake(&answer, seed);
        }
        sent += 1;
    }
    println!("sent {sent} mutated frames to each port ({withheld} valid removals withheld)");
    if key.is_some() {
        // Every connection to the master was refused at its handshake, and counted.
        let want = refused_before + sent;
        let counted = super::wait_until(Duration::from_secs(10), || {
            refused_handshakes(master) >= want
        });
        assert!(counted, "refused {} of {want}", refused_handshakes(master));
    }

    // Both still serve: the old object read back exactly, from the peer, and a fresh one.
    pool.check_kept_and_a_fresh_object();
    let grown = |now: u64, then: u64| now.saturating_sub(then) >> 20;
    let (master_growth, peer_growth) = (
        grown(rss(master.pid()), master_rss),
        grown(rss(peer.pid()), peer_rss),
    );
    println!("RSS growth: master {master_growth} MiB, peer {peer_growth} MiB");
    assert!(master_growth < 64, "master grew {master_growth} MiB");
    assert!(peer_growth < 64, "peer grew {peer_growth} MiB");
}

/// Sends one request (`header`, then `payload`) on a fresh connection and reads its status
/// frame and, when it is OK and `read_back` > 0, that many bytes. `None` when the peer closed
/// or said nothing in 2 s.
fn exchange(
    port: u16,
    header: &SessionHeader,
    payload: &[u8],
    read_back: usize,
) -> Option<(Status, Vec<u8>)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(&header.encode()).ok()?;
    // A refused WRITE's payload is never read: the answer may already wait.
    let _ = stream.write_all(payload);
    let mut frame = [0u8; 8];
    stream.read_exact(&mut frame).ok()?;
    let status = Status::decode(&frame)?;
    let mut data = vec![0u8; if status == Status::Ok { read_back } else { 0 }];
    stream.read_exact(&mut data).ok()?;
    Some((status, data))
}

/// Whether some 24-byte window of `bytes` reads as a WRITE into `[start, end)` that names no
/// epoch or `epoch`: a request the server may apply there, wherever a mutation shifted it to.
fn may_write_into(bytes: &[u8], start: u64, end: u64, epoch: u64) -> bool {
    bytes.windows(TRANSFER_HEADER).any(|window| {
        let raw: &[u8; TRANSFER_HEADER] = window.try_into().unwrap();
        SessionHeader::decode(raw).is_ok_and(|h| {
            h.opcode == Opcode::Write
                && !matches!(h.epoch, Some(e) if e != epoch)
                && h.addr < end
                && h.addr.saturating_add(h.size) > start
        })
    })
}

/// Requests aimed inside the peer's segment, around the kept replica. Open, the peer must
/// apply exactly what it admits; with `key`, it admits nothing, also writes over the replica.
pub fn aimed_requests(key: Option<&Path>) {
    let pool = Pool::start(7, key);
    let (peer, kept, data_port) = (&pool.peer, &pool.kept, pool.data_port);
    let replica = &pool.pin.query.replicas[0].buffer;
    assert_eq!(replica.transport_endpoint, peer.name);
    let (kept_at, epoch) = (replica.buffer_address, replica.epoch);
    assert_ne!(epoch, 0, "a segment range carries its mount's epoch");
    let kept_end = kept_at + kept.len() as u64;
    // The 16 MB segment lies inside 16 MiB either side of the replica.
    let (low, high) = (kept_at.saturating_sub(16 << 20), kept_end + (16 << 20));
    let peer_rss = rss(peer.pid());
    let seed = fuzz_seed("aimed");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut exact_reads, mut applied_writes, mut stale, mut unanswered) = (0, 0, 0, 0);
    let (mut mutated, mut withheld) = (0, 0);
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_secs(8) && sent < 3000 {
        sent += 1;
        let size = match rng.u8(0..3) {
            0 => rng.u64(1..=64),
            1 => rng.u64(1..=64 << 10),
            _ => rng.u64(1..=256 << 10),
        };
        let addr = match rng.u8(0..4) {
            0 => rng.u64(kept_at..kept_end),
            1 => kept_end + rng.u64(0..64),
            2 => kept_at.saturating_sub(size) + rng.u64(0..64),
            _ => rng.u64(low..high),
        };
        let named = match rng.u8(0..4) {
            0 => None,
            1 => Some(epoch ^ rng.u64(1..256)),
            _ => Some(epoch),
        };
        let wrong_epoch = named.is_some_and(|e| e != epoch);
        let opcode = if rng.bool() {
            Opcode::Read
        } else {
            Opcode::Write
        };
        let header = SessionHeader {
            size,
            addr,
            opcode,
            v2: true,
            epoch: named,
        };
        let payload: Vec<u8> = match opcode {
            Opcode::Write => (0..size).map(|_| rng.u8(..)).collect(),
            Opcode::Read => Vec::new(),
        };
        if rng.u8(0..4) == 0 {
            // A mutation of it (bit flips, cuts, spliced noise, a rewritten size), sent blind.
            let mut bytes = header.encode().to_vec();
            bytes.extend_from_slice(&payload[..payload.len().min(4096)]);
            let bytes = mutate(&mut rng, &bytes);
            if key.is_none() && may_write_into(&bytes, kept_at, kept_end, epoch) {
                withheld += 1;
            } else {
                let answer = poke(data_port, &bytes);
                if key.is_some() {
                    assert_only_a_handshake(&answer, seed);
                }
                mutated += 1;
            }
            continue;
        }
        let overlaps_kept = addr < kept_end && addr.saturating_add(size) > kept_at;
        if key.is_none() && opcode == Opcode::Write && overlaps_kept && !wrong_epoch {
            // An open data port takes writes from every peer: such a write would really
            // change the object. Not sent (keyed, it is sent and must be refused).
            withheld += 1;
            continue;
        }
        let read_back = if opcode == Opcode::Read {
            size as usize
        } else {
            0
        };
        // A refused request is answered and then reset, which may overtake the answer.
        let Some((status, data)) = exchange(data_port, &header, &payload, read_back) else {
            unanswered += 1;
            continue;
        };
        assert!(
            key.is_none(),
            "a keyed peer answered {header:?} (seed {seed})"
        );
        if wrong_epoch {
            assert_ne!(
                status,
                Status::Ok,
                "{header:?} named a wrong epoch (seed {seed})"
            );
            stale += usize::from(status == Status::StaleEpoch);
            continue;
        }
        match (status, opcode) {
            (Status::Ok, Opcode::Read) if addr >= kept_at && addr + size <= kept_end => {
                let at = (addr - kept_at) as usize;
                assert!(
                    data == kept[at..at + size as usize],
                    "a READ of the replica at +{at} returned other bytes (seed {seed})"
                );
                exact_reads += 1;
            }
            (Status::Ok, Opcode::Write) => {
                // Applied exactly where it was aimed: the range reads back as written.
                let back = SessionHeader {
                    opcode: Opcode::Read,
                    ..header
                };
                if let Some((Status::Ok, data)) = exchange(data_port, &back, &[], size as usize) {
                    assert!(
                        data == payload,
                        "a WRITE at {addr:#x} of {size} bytes reads back otherwise (seed {seed})"
                    );
                    applied_writes += 1;
                }
            }
            _ => {}
        }
    }
    println!(
        "sent {sent} aimed requests: {exact_reads} exact reads of the replica, \
         {applied_writes} writes applied beside it (read back exactly), {stale} refused as \
         stale, {unanswered} unanswered, {mutated} mutated, {withheld} withheld"
    );
    if key.is_some() {
        assert_eq!(unanswered + mutated + withheld, sent, "seed {seed}");
    } else {
        assert!(
            exact_reads > 0 && applied_writes > 0 && stale > 0,
            "the aim missed (seed {seed})"
        );
        // The replica is exactly as written through the raw port (and below, the store).
        let whole = SessionHeader {
            size: kept.len() as u64,
            addr: kept_at,
            opcode: Opcode::Read,
            v2: true,
            epoch: Some(epoch),
        };
        let answer = exchange(data_port, &whole, &[], kept.len());
        let (status, data) = answer.expect("the peer answers");
        assert_eq!(status, Status::Ok);
        assert!(data == *kept, "the replica changed (seed {seed})");
    }
    pool.check_kept_and_a_fresh_object();
    let growth = rss(peer.pid()).saturating_sub(peer_rss) >> 20;
    println!("peer RSS growth {growth} MiB");
    assert!(growth < 64, "peer grew {growth} MiB");
}
