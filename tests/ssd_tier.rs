//! The SSD tier (`docs/ssd-tier.md`) end to end: eviction demotes to the owner's disk, every
//! object of a working set four times the segment reads back exactly, corrupt or missing
//! records are errors for their key only and the master forgets them, a second process on
//! the directory is refused, and a client restarted on the directory serves its records again.

mod common;

use common::{wait_until, Master, PeerClient};
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::storage::record_in;
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const KIB: usize = 1 << 10;
const MIB: u64 = 1 << 20;

/// A fresh directory under the system's temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "mc-ssd-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn client(master: &str, segment: u64, ssd: &str) -> mooncake_rs::Result<Client> {
    Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: segment,
        local_buffer_size: 4 * MIB,
        master_server_addr: master.into(),
        ssd_offload_path: ssd.into(),
        ..SetupConfig::default()
    })
}

fn value(i: usize, len: usize) -> Vec<u8> {
    let seed = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len)
        .map(|j| (seed.rotate_left((j % 64) as u32) as u8) ^ (j as u8))
        .collect()
}

/// Puts `key`, retrying while the pool is full and demotions free it (bounded).
fn put(client: &Client, key: &str, bytes: &[u8]) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match client.put_from(key, bytes, &ReplicateConfig::default()) {
            Ok(()) => return,
            Err(ErrorCode::NoAvailableHandle) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("put {key}: {e:?}"),
        }
    }
}

fn on_disk(client: &Client, key: &str) -> bool {
    match client.batch_get_replica_desc(&[key]).remove(0) {
        Ok(query) => query.replicas.iter().any(|r| r.disk.is_some()),
        Err(_) => false,
    }
}

/// Every file under the tier's `objects/` (records and spares).
fn records(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for fan in std::fs::read_dir(dir.join("objects")).unwrap() {
        for file in std::fs::read_dir(fan.unwrap().path()).unwrap() {
            found.push(file.unwrap().path());
        }
    }
    found
}

/// The record file that holds `key` (a spare file that held it does not), if one does.
fn find_record(dir: &Path, key: &str) -> Option<PathBuf> {
    records(dir)
        .into_iter()
        .find(|path| record_in(path).is_some_and(|(named, _)| named == key))
}

/// The record file whose header names `key`.
fn record_of(dir: &Path, key: &str) -> PathBuf {
    find_record(dir, key).expect("a record names the key")
}

/// Puts `count` values of `len` bytes as `prefix-i` and returns the indexes now on disk.
fn fill(client: &Client, prefix: &str, count: usize, len: usize) -> Vec<usize> {
    for i in 0..count {
        put(client, &format!("{prefix}-{i}"), &value(i, len));
    }
    (0..count)
        .filter(|i| on_disk(client, &format!("{prefix}-{i}")))
        .collect()
}

/// Waits (up to `limit`) until each of `indexes` reads back exactly as `prefix-i`.
fn served_again(client: &Client, prefix: &str, indexes: &[usize], len: usize, limit: Duration) {
    let mut out = vec![0u8; len];
    for &i in indexes {
        let key = format!("{prefix}-{i}");
        assert!(
            wait_until(limit, || client.get_into(&key, &mut out).is_ok()),
            "{key} is served again"
        );
        assert_eq!(out, value(i, len), "{key}");
    }
}

/// A `mooncake_client` owning a 4 MB segment with an SSD tier in `dir`.
fn owner(master: &Master, dir: &TempDir) -> PeerClient {
    owner_with(master, dir, &[])
}

/// [`owner`] with extra environment variables.
fn owner_with(master: &Master, dir: &TempDir, env: &[(&str, &str)]) -> PeerClient {
    let args = [
        "--enable_offload".to_string(),
        format!("--ssd_offload_path={}", dir.path()),
    ];
    let env: Vec<(&str, &str)> = [("MC_SAME_HOST", "1")]
        .into_iter()
        .chain(env.iter().copied())
        .collect();
    PeerClient::spawn(&master.addr(), "4 MB", "P2PHANDSHAKE", &args, &env)
}

#[test]
fn a_working_set_four_times_the_segment_reads_back_exactly() {
    let dir = TempDir::new("working-set");
    // Short read leases: a removal's disk copy goes once the lease of the reads ends.
    let master = Master::start(&["--default_kv_lease_ttl=300"]);
    let client = client(&master.addr(), 16 * MIB, dir.path()).expect("setup with an SSD tier");
    let (count, len) = (256, 256 * KIB);
    let disk = fill(&client, "ws", count, len).len();
    let (mut wrong, mut empty) = (0, 0);
    let mut out = vec![0u8; len];
    for i in 0..count {
        let key = format!("ws-{i}");
        out.fill(0);
        match client.get_into(&key, &mut out) {
            Ok(n) if n as usize == len && out == value(i, len) => {}
            Ok(0) => empty += 1,
            Ok(_) => wrong += 1,
            Err(e) => panic!("{key}: {e:?} (the tier has room for every object)"),
        }
    }
    assert_eq!((wrong, empty), (0, 0), "exact bytes for every key");
    assert!(disk >= count / 2, "most of the set is on disk: {disk}");
    let ssd = client.metrics().ssd.expect("the client has a tier");
    assert!(
        ssd.writes >= disk as u64 && ssd.reads >= disk as u64,
        "{ssd:?}"
    );
    assert_eq!(ssd.corrupt, 0);
    // A removal deletes the disk copy.
    let key = (0..count)
        .map(|i| format!("ws-{i}"))
        .find(|k| on_disk(&client, k))
        .unwrap();
    assert!(find_record(&dir.0, &key).is_some());
    client.remove(&key, true).unwrap();
    assert!(wait_until(Duration::from_secs(5), || find_record(
        &dir.0, &key
    )
    .is_none()));
    assert_eq!(
        client.get_into(&key, &mut out),
        Err(ErrorCode::ObjectNotFound)
    );
}

#[test]
fn a_corrupt_or_missing_record_is_an_error_for_its_key_and_the_master_forgets_it() {
    let dir = TempDir::new("corrupt");
    let client = client("embedded", 8 * MIB, dir.path()).expect("setup");
    let len = 256 * KIB;
    let disk_keys = fill(&client, "c", 96, len);
    assert!(disk_keys.len() >= 3, "some objects are on disk");
    let (flipped, deleted, intact) = (disk_keys[0], disk_keys[1], disk_keys[2]);
    let path = record_of(&dir.0, &format!("c-{flipped}"));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4096 + 1000] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    std::fs::remove_file(record_of(&dir.0, &format!("c-{deleted}"))).unwrap();

    let mut out = vec![0u8; len];
    assert_eq!(
        client.get_into(&format!("c-{flipped}"), &mut out),
        Err(ErrorCode::ChecksumMismatch)
    );
    assert_eq!(
        client.get_into(&format!("c-{deleted}"), &mut out),
        Err(ErrorCode::FileNotFound)
    );
    assert_eq!(
        client.get_into(&format!("c-{intact}"), &mut out),
        Ok(len as u64)
    );
    assert_eq!(out, value(intact, len), "other keys are untouched");
    // The owner reports both lost; the master forgets them (self-heal).
    for lost in [flipped, deleted] {
        let key = format!("c-{lost}");
        assert!(
            wait_until(Duration::from_secs(5), || client.get_into(&key, &mut out)
                == Err(ErrorCode::ObjectNotFound)),
            "{key} is forgotten"
        );
    }
    assert!(client.metrics().ssd.unwrap().corrupt >= 1);
}

#[test]
fn a_second_client_on_the_directory_is_refused() {
    let dir = TempDir::new("lock");
    let first = client("embedded", 4 * MIB, dir.path()).expect("first");
    assert_eq!(
        client("embedded", 4 * MIB, dir.path()).err(),
        Some(ErrorCode::FileLockFail)
    );
    assert!(mooncake_rs::error::last_error_message().contains("in use"));
    drop(first);
    let third = client("embedded", 4 * MIB, dir.path());
    assert!(third.is_ok(), "free again once the first is gone");
}

#[test]
fn an_owner_killed_and_restarted_on_its_directory_serves_its_records_again() {
    let master = Master::start(&[]);
    let dir = TempDir::new("restart");
    let mut first = owner(&master, &dir);
    // A writer without a segment: every value lands in the owner's segment.
    let writer = client(&master.addr(), 0, "").expect("writer");
    let len = 256 * KIB;
    let demoted = fill(&writer, "r", 64, len);
    assert!(demoted.len() >= 32, "demoted: {}", demoted.len());
    // kill -9, then a new process on the same directory.
    first.kill();
    let _restarted = owner(&master, &dir);
    served_again(&writer, "r", &demoted, len, Duration::from_secs(10));
}

/// The value of the series `mooncake_master_NAME` in the master's Prometheus text (0 when
/// absent).
fn counter(master: &Master, name: &str) -> u64 {
    let text = master.http_get("/metrics");
    let series = format!("mooncake_master_{name}{{");
    let line = text.lines().find(|l| l.starts_with(&series));
    line.and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// Write-through (`--enable_offload` without `--offload_on_evict`, upstream's eager SSD
/// persistence): every write is copied to its owner's tier as soon as it ends and read from
/// memory while there; evicting it then only frees its memory (no second write) and it
/// reads from disk; and values never evicted survive their owner's kill -9 on its disk.
#[test]
fn write_through_copies_every_write_and_an_owner_crash_keeps_them() {
    let master = Master::start(&["--enable_offload"]);
    let dir = TempDir::new("write-through");
    let mut first = owner(&master, &dir);
    let writer = client(&master.addr(), 0, "").expect("writer");
    let len = 256 * KIB;
    // 8 × 256 KiB fit in the 4 MB segment: nothing is evicted.
    for i in 0..8 {
        put(&writer, &format!("w-{i}"), &value(i, len));
    }
    let both = |key: &str| match writer.batch_get_replica_desc(&[key]).remove(0) {
        Ok(query) => {
            query.replicas.len() == 2
                && query.replicas[0].disk.is_none()
                && query.replicas[1].disk.is_some()
        }
        Err(_) => false,
    };
    for i in 0..8 {
        let key = format!("w-{i}");
        assert!(
            wait_until(Duration::from_secs(10), || both(&key)),
            "{key}: a memory replica, then its disk copy"
        );
    }
    assert_eq!(counter(&master, "offloads_committed_total"), 8);
    assert_eq!(counter(&master, "demotions_started_total"), 0);
    let all: Vec<usize> = (0..32).collect();
    served_again(&writer, "w", &all[..8], len, Duration::from_secs(5));
    // 24 more: the first ones are evicted, which frees only their memory.
    for i in 8..32 {
        put(&writer, &format!("w-{i}"), &value(i, len));
    }
    let released = counter(&master, "memory_released_total");
    assert!(released > 0, "evictions freed memory of objects on disk");
    served_again(&writer, "w", &all, len, Duration::from_secs(5));
    // kill -9: every value written was copied, so all come back from the disk.
    let copied: Vec<usize> = (0..32)
        .filter(|i| on_disk(&writer, &format!("w-{i}")))
        .collect();
    assert!(copied.len() >= 24, "copied: {copied:?}");
    first.kill();
    let _restarted = owner(&master, &dir);
    served_again(&writer, "w", &copied, len, Duration::from_secs(15));
}

/// Promotion on hit (`--promotion_on_hit`, upstream's flag): a value demoted to disk that is
/// read again is loaded back into its owner's segment, then read from memory with the same
/// bytes (and still listed on disk).
#[test]
fn a_value_read_again_from_disk_comes_back_into_memory() {
    let master = Master::start(&["--promotion_on_hit", "--default_kv_lease_ttl=200"]);
    let dir = TempDir::new("promotion");
    let _owner = owner(&master, &dir);
    let writer = client(&master.addr(), 0, "").expect("writer");
    let len = 256 * KIB;
    let demoted = fill(&writer, "p", 24, len);
    assert!(demoted.len() >= 4, "demoted: {demoted:?}");
    // Room for it in the segment: what is still in memory goes (once its lease ends).
    for i in (0..24).filter(|i| !demoted.contains(i)) {
        writer.remove(&format!("p-{i}"), true).expect("remove");
    }
    let i = demoted[0];
    let key = format!("p-{i}");
    let in_memory = |key: &str| match writer.batch_get_replica_desc(&[key]).remove(0) {
        Ok(query) => query.replicas.first().is_some_and(|r| r.disk.is_none()),
        Err(_) => false,
    };
    let mut out = vec![0u8; len];
    assert!(
        wait_until(Duration::from_secs(10), || {
            writer.get_into(&key, &mut out).is_ok() && in_memory(&key)
        }),
        "{key} is promoted"
    );
    assert_eq!(out, value(i, len));
    assert!(on_disk(&writer, &key), "{key} is still on disk");
    writer.get_into(&key, &mut out).expect("get from memory");
    assert_eq!(out, value(i, len));
    assert!(counter(&master, "promotions_committed_total") >= 1);
}

#[test]
fn a_master_restarted_on_its_journal_serves_the_disk_objects_again() {
    let journal = TempDir::new("journal");
    let mut master = Master::start(&[&format!("--journal_dir={}", journal.path())]);
    let dir = TempDir::new("journaled-tier");
    let _owner = owner(&master, &dir);
    let writer = client(&master.addr(), 0, "").expect("writer");
    let len = 256 * KIB;
    let demoted = fill(&writer, "j", 64, len);
    assert!(demoted.len() >= 32, "demoted: {}", demoted.len());
    master.kill();
    let extra: Vec<&str> = master.extra.iter().map(String::as_str).collect();
    let _restarted = Master::start_on(master.port, &extra);
    served_again(&writer, "j", &demoted, len, Duration::from_secs(15));
}

#[test]
fn every_get_family_reads_disk_objects_and_a_session_keeps_its_record() {
    let dir = TempDir::new("families");
    let master = Master::start(&["--default_kv_lease_ttl=300"]);
    let client = client(&master.addr(), 8 * MIB, dir.path()).expect("setup");
    let (count, len) = (96, 256 * KIB);
    let disk = fill(&client, "f", count, len);
    let memory = (0..count)
        .rev()
        .find(|i| !on_disk(&client, &format!("f-{i}")))
        .expect("a key still in memory");
    assert!(disk.len() >= 4);
    let key = |i: usize| format!("f-{i}");

    // Batch: a disk and a memory object in one call.
    let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
    let got = client.batch_get_into(&[key(disk[0]), key(memory)], &mut [&mut a, &mut b]);
    assert_eq!(got, vec![Ok(len as u64), Ok(len as u64)]);
    assert_eq!(
        (a == value(disk[0], len), b == value(memory, len)),
        (true, true)
    );

    // Multi-buffer: one object over two buffers.
    let (mut head, mut tail) = (vec![0u8; 1000], vec![0u8; len - 1000]);
    let got =
        client.batch_get_into_multi_buffers(&[key(disk[1])], &mut [vec![&mut head, &mut tail]]);
    assert_eq!(got, vec![Ok(len as u64)]);
    assert_eq!([head, tail].concat(), value(disk[1], len));

    // Ranges: bytes [1000, 6000) of a disk object at offset 10 of a buffer.
    let mut buffer = vec![0u8; 6000];
    let request = mooncake_rs::client::RangeRequest {
        keys: &[vec![key(disk[2])]],
        dst_offsets: &[vec![vec![10]]],
        src_offsets: &[vec![vec![1000]]],
        sizes: &[vec![vec![5000]]],
    };
    let got = client.get_into_ranges(&mut [&mut buffer], &request);
    assert_eq!(got[0][0], vec![Ok(5000)]);
    assert_eq!(&buffer[10..5010], &value(disk[2], len)[1000..6000]);

    // get_buffer: one copy into a client-owned buffer.
    let handle = client
        .get_buffer(&key(disk[3]))
        .expect("get_buffer of a disk object");
    assert_eq!(handle.as_slice(), &value(disk[3], len)[..]);

    // On a (host) stream: staged like remote data, read from disk by the stream's fetch.
    let stream = mooncake_rs::stream::HostStream::new().unwrap();
    let mut on_stream = vec![0u8; len];
    let bufs = vec![vec![mooncake_rs::client::Buf::new(
        on_stream.as_mut_ptr() as usize,
        len as u64,
    )]];
    // SAFETY: the buffer outlives the ticket's wait below and nothing else touches it.
    let ticket = unsafe {
        client.batch_get_into_on_stream_raw(
            &[key(disk[1]).as_str()],
            bufs,
            false,
            mooncake_rs::stream::StreamRef::Host(&stream),
        )
    }
    .expect("on-stream get issued");
    assert_eq!(ticket.wait(Some(Duration::from_secs(20))), 0);
    assert!(stream.synchronize(Some(Duration::from_secs(20))));
    assert_eq!(ticket.results(), vec![Ok(len as u64)]);
    assert_eq!(on_stream, value(disk[1], len));

    // A get session pins the object: a forced removal meanwhile keeps its record until the
    // session ends, so the session's reads still return the bytes.
    let pinned = key(disk[0]);
    assert_eq!(client.batch_get_session_start(&[&pinned]), vec![Ok(())]);
    client.remove(&pinned, true).unwrap();
    std::thread::sleep(Duration::from_millis(50)); // a deletion would be done by now
    let mut out = vec![0u8; len];
    let got =
        client.batch_get_into_multi_buffer_ranges(&[&pinned], &mut [vec![&mut out]], &[vec![0]]);
    assert_eq!(
        got,
        vec![Ok(len as u64)],
        "the pinned record is still there"
    );
    assert_eq!(out, value(disk[0], len));
    assert!(find_record(&dir.0, &pinned).is_some(), "the record stays");
    client.batch_get_session_end(&[&pinned]).unwrap();
    // Other records come and go meanwhile (demotions of the fill): this key's must go.
    assert!(
        wait_until(Duration::from_secs(5), || find_record(&dir.0, &pinned)
            .is_none()),
        "the record is deleted once the session (and the reads' lease) ends"
    );
}

#[test]
fn a_full_tier_evicts_its_oldest_objects_and_the_pool_keeps_serving() {
    let master = Master::start(&[]);
    let dir = TempDir::new("full");
    // Room for about seven 256 KiB records.
    let _owner = owner_with(
        &master,
        &dir,
        &[("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "2MB")],
    );
    let writer = client(&master.addr(), 0, "").expect("writer");
    let (count, len) = (64, 256 * KIB);
    let demoted = fill(&writer, "full", count, len);
    assert!(
        !demoted.is_empty() && demoted.len() < 9,
        "demoted: {demoted:?}"
    );
    // The tier made room by age: what it holds now is among the newest values, and far more
    // than it can hold went through it.
    assert!(demoted[0] >= count / 2, "the oldest on disk: {demoted:?}");
    assert!(master.gauge("disk_evicted_objects_total") >= 8);
    // Every key is its exact bytes, or gone (dropped by eviction): never wrong, never empty.
    let (mut exact, mut gone) = (0, 0);
    let mut out = vec![0u8; len];
    for i in 0..count {
        match writer.get_into(&format!("full-{i}"), &mut out) {
            Ok(n) if n as usize == len && out == value(i, len) => exact += 1,
            Err(ErrorCode::ObjectNotFound) => gone += 1,
            other => panic!("full-{i}: {other:?}"),
        }
    }
    assert!(
        exact >= demoted.len() && gone > 0,
        "exact {exact}, gone {gone}"
    );
    assert_eq!(master.gauge("demotions_skipped_total"), 0, "none dropped");
}

/// A small ext4 filesystem on a device-mapper device over a loop file, whose table the test
/// switches to `error` (every I/O fails with EIO). Needs root and the kernel's dm and loop
/// drivers: the soft-RoCE VM (`scripts/rdma-tests.sh`) has them. Torn down on drop.
struct FaultyDisk {
    name: String,
    image: PathBuf,
    loop_dev: String,
    mount: PathBuf,
    sectors: u64,
}

/// Runs `program args`, returning its stdout; panics with its stderr on failure.
fn run(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{program} {args:?}: {err}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl FaultyDisk {
    /// A `mib` MiB filesystem mounted on a fresh directory.
    fn new(mib: u64) -> FaultyDisk {
        let tag = format!("mc-ssd-{}", std::process::id());
        let image = std::env::temp_dir().join(format!("{tag}.img"));
        let file = std::fs::File::create(&image).unwrap();
        file.set_len(mib * MIB).unwrap();
        for module in ["loop", "dm-mod"] {
            run("modprobe", &[module]);
        }
        let loop_dev = run("losetup", &["-f", "--show", image.to_str().unwrap()]);
        let sectors: u64 = run("blockdev", &["--getsz", &loop_dev]).parse().unwrap();
        let disk = FaultyDisk {
            name: tag.clone(),
            image,
            loop_dev,
            mount: std::env::temp_dir().join(&tag),
            sectors,
        };
        // No udev in the VM: the node is made by hand.
        run(
            "dmsetup",
            &["create", &tag, "--table", &disk.table("linear")],
        );
        run("dmsetup", &["mknodes", &tag]);
        run("mkfs.ext4", &["-q", &disk.device()]);
        std::fs::create_dir_all(&disk.mount).unwrap();
        run("mount", &[&disk.device(), disk.mount.to_str().unwrap()]);
        disk
    }

    fn device(&self) -> String {
        format!("/dev/mapper/{}", self.name)
    }

    /// The table for `target` over the whole device.
    fn table(&self, target: &str) -> String {
        match target {
            "linear" => format!("0 {} linear {} 0", self.sectors, self.loop_dev),
            _ => format!("0 {} {target}", self.sectors),
        }
    }

    /// From now on every I/O to the filesystem fails with EIO.
    fn fail_all_io(&self) {
        run("dmsetup", &["suspend", "--noflush", &self.name]);
        run(
            "dmsetup",
            &["load", &self.name, "--table", &self.table("error")],
        );
        run("dmsetup", &["resume", &self.name]);
    }

    /// Bytes free on the filesystem.
    fn free(&self) -> u64 {
        let out = run(
            "df",
            &["-B1", "--output=avail", self.mount.to_str().unwrap()],
        );
        out.lines().last().unwrap().trim().parse().unwrap()
    }
}

impl Drop for FaultyDisk {
    fn drop(&mut self) {
        let quiet = |program: &str, args: &[&str]| {
            let _ = std::process::Command::new(program).args(args).output();
        };
        quiet("umount", &["-l", self.mount.to_str().unwrap()]);
        quiet("dmsetup", &["remove", "--force", &self.name]);
        quiet("losetup", &["-d", &self.loop_dev]);
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Counts `prefix-i` gets for `0..count`: (exact, gone, failed); panics on other bytes or
/// an empty success.
fn read_all(client: &Client, prefix: &str, count: usize, len: usize) -> (usize, usize, usize) {
    let (mut exact, mut gone, mut failed) = (0, 0, 0);
    let mut out = vec![0u8; len];
    for i in 0..count {
        out.fill(0);
        match client.get_into(&format!("{prefix}-{i}"), &mut out) {
            Ok(n) if n as usize == len && out == value(i, len) => exact += 1,
            Ok(n) => panic!("{prefix}-{i}: {n} bytes, not its value"),
            Err(ErrorCode::ObjectNotFound) => gone += 1,
            Err(_) => failed += 1,
        }
    }
    (exact, gone, failed)
}

/// A real full disk and a real EIO (device-mapper's `error` target) under the tier: the pool
/// keeps serving, every get is its exact bytes or an error, never other or empty bytes, and the
/// master forgets the replicas the disk lost. Runs in the soft-RoCE VM (root, dm, loop).
#[test]
fn in_the_vm_a_full_disk_and_eio_keep_the_pool_serving() {
    if std::env::var_os("RDMA_VM").is_none() {
        println!("skipped: needs the VM's device-mapper (scripts/rdma-tests.sh runs it)");
        return;
    }
    let disk = FaultyDisk::new(160);
    let dir = disk.mount.join("tier");
    std::fs::create_dir_all(&dir).unwrap();
    let dir = TempDir(dir);
    let master = Master::start(&["--default_kv_lease_ttl=200"]);
    let _owner = owner(&master, &dir);
    let writer = client(&master.addr(), 0, "").expect("writer");
    let len = 256 * KIB;

    // 1. The disk fills up (another file takes the room): demotions are refused, victims are
    //    evicted as without a tier, puts go on.
    let demoted = fill(&writer, "before", 48, len);
    assert!(!demoted.is_empty(), "some objects reached the disk");
    let keep = 40 * MIB; // below the tier's 64 MiB reserve
    let filler = disk.mount.join("filler");
    let room = disk.free().saturating_sub(keep).to_string();
    run("fallocate", &["-l", &room, filler.to_str().unwrap()]);
    let failed_before = master.gauge("demotions_failed_total");
    fill(&writer, "full", 48, len);
    assert!(
        master.gauge("demotions_failed_total") > failed_before,
        "the full disk refused"
    );
    let (exact, _, failed) = read_all(&writer, "before", 48, len);
    assert!(
        exact >= demoted.len() && failed == 0,
        "exact {exact}, failed {failed}"
    );
    std::fs::remove_file(&filler).unwrap();

    // 2. Every I/O fails: disk reads are errors (then the master forgets those replicas),
    //    memory objects are served, puts go on.
    disk.fail_all_io();
    let (_, _, failed) = read_all(&writer, "before", 48, len);
    assert!(failed > 0, "the disk objects fail to read");
    assert!(
        wait_until(Duration::from_secs(10), || {
            read_all(&writer, "before", 48, len).2 == 0
        }),
        "the master forgot the replicas the disk lost"
    );
    fill(&writer, "after", 48, len);
    let (exact, _, failed) = read_all(&writer, "after", 48, len);
    assert!(
        exact > 0 && failed == 0,
        "after the fault: exact {exact}, failed {failed}"
    );
}
