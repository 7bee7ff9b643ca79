//! Standalone store + dummy clients: a `mooncake_master`, a `mooncake_client` real client, and
//! dummies (this test process, and re-executions of this test binary as separate dummy
//! processes) that reach the pool only through the real client's shared-memory link.

mod common;

use common::{free_ports, pattern, signal_child, wait_until, Launched, Master};
use mooncake_rs::client::{Buf, Client, RangeRequest, WriteMode};
use mooncake_rs::standalone::ShmPool;
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
/// The dummies' and the real client's TTL in these tests.
const TTL_MS: u64 = 1000;

/// A real client serving dummies on `port` (`--port`, as upstream's) with a 64 MiB segment;
/// returns it and its segment name (whose data port it picks).
fn real_client(master: &str, port: u16) -> (Launched, String) {
    std::env::set_var("MC_DUMMY_TTL_MS", TTL_MS.to_string());
    let mut launched = Launched::spawn(
        env!("CARGO_BIN_EXE_mooncake_client"),
        &[
            format!("--master_server_address={master}"),
            "--host=127.0.0.1".into(),
            format!("--port={port}"),
            "--global_segment_size=64 MB".into(),
            "--local_buffer_size=0".into(),
            "--metadata_server=P2PHANDSHAKE".into(),
            "--protocol=tcp".into(),
            "--device_names=".into(),
            "--threads=1".into(),
        ],
    );
    let line = launched.first_line();
    let name = line
        .trim()
        .strip_prefix("READY ")
        .unwrap_or_else(|| panic!("unexpected line {line:?}: {}", launched.stderr()))
        .to_string();
    (launched, name)
}

fn dummy(server: &str) -> Client {
    std::env::set_var("MC_DUMMY_TTL_MS", TTL_MS.to_string());
    Client::setup_dummy(0, 16 * MIB as u64, server).expect("setup_dummy")
}

fn cfg() -> ReplicateConfig {
    ReplicateConfig::default()
}

#[test]
fn a_dummy_runs_every_family_through_the_real_client() {
    let master = Master::start(&[]);
    let port = free_ports(1)[0];
    let (_real, name) = real_client(&master.addr(), port);
    // Upstream's way: the dummy names the real client's service port, not its segment.
    assert_ne!(name, format!("127.0.0.1:{port}"));
    let client = dummy(&format!("127.0.0.1:{port}"));
    assert!(client.is_dummy());
    assert_eq!(client.get_hostname(), "");
    assert_eq!(client.health_check(), 0);

    // Single put/get from ordinary (staged) memory, including a multi-MiB value.
    for (i, size) in [1usize, 4096, 3 * MIB, 20 * MIB].into_iter().enumerate() {
        let key = format!("single-{size}");
        let value = pattern(size, i as u8);
        client.put_from(&key, &value, &cfg()).unwrap();
        let mut out = vec![0u8; size];
        assert_eq!(client.get_into(&key, &mut out), Ok(size as u64));
        assert!(out == value, "{key}: wrong bytes");
    }
    // The copying put and get_buffer (through the shared local buffer).
    client.put("copying", b"copied bytes", &cfg()).unwrap();
    let handle = client.get_buffer("copying").unwrap();
    assert_eq!(handle.as_slice(), b"copied bytes");
    drop(handle);

    // Batches and multi-buffer.
    let keys: Vec<String> = (0..8).map(|i| format!("batch-{i}")).collect();
    let values: Vec<Vec<u8>> = (0..8).map(|i| pattern(1000 + i * 777, i as u8)).collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    assert!(client
        .batch_put_from(&keys, &refs, &cfg())
        .iter()
        .all(|r| r.is_ok()));
    let mut outs: Vec<Vec<u8>> = values.iter().map(|v| vec![0u8; v.len()]).collect();
    let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
    let got = client.batch_get_into(&keys, &mut out_refs);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(*r, Ok(values[i].len() as u64));
    }
    assert!(outs == values, "batch: wrong bytes");
    let (a, b) = (pattern(5000, 9), pattern(3000, 10));
    let multi = vec![vec![a.as_slice(), b.as_slice()]];
    assert_eq!(
        client.batch_put_from_multi_buffers(&["multi"], &multi, &cfg()),
        vec![Ok(())]
    );
    let (mut oa, mut ob) = (vec![0u8; 4000], vec![0u8; 4000]);
    let mut scatter = vec![vec![oa.as_mut_slice(), ob.as_mut_slice()]];
    assert_eq!(
        client.batch_get_into_multi_buffers(&["multi"], &mut scatter),
        vec![Ok(8000)]
    );
    let whole: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
    assert_eq!(&oa[..], &whole[..4000]);
    assert_eq!(&ob[..], &whole[4000..]);

    // Ranges.
    let mut dst = vec![0u8; 100];
    let keys_r = vec![vec!["multi".to_string()]];
    let results = client.get_into_ranges(
        &mut [dst.as_mut_slice()],
        &RangeRequest {
            keys: &keys_r,
            dst_offsets: &[vec![vec![0, 50]]],
            src_offsets: &[vec![vec![10, 6000]]],
            sizes: &[vec![vec![50, 50]]],
        },
    );
    assert_eq!(results, vec![vec![vec![Ok(50), Ok(50)]]]);
    assert_eq!(&dst[..50], &whole[10..60]);
    assert_eq!(&dst[50..], &whole[6000..6050]);

    // Zero-copy from / into shared memory of the pool, registered.
    let before = client.dummy_stats().unwrap();
    let block = client.alloc_from_mem_pool(4 * MIB as u64).unwrap();
    client.register_buffer(block, 4 * MIB).unwrap();
    let value = pattern(2 * MIB, 42);
    // SAFETY: `block` is 4 MiB of our own mapped shared memory.
    unsafe {
        std::ptr::copy_nonoverlapping(value.as_ptr(), block as *mut u8, value.len());
        let put = client.write_raw(
            &["zero-copy"],
            vec![vec![Buf::new(block, value.len() as u64)]],
            &cfg(),
            WriteMode::Put,
        );
        assert_eq!(put, vec![Ok(())]);
        let dst = block + 2 * MIB;
        let got = client.get_into_raw(
            &["zero-copy"],
            vec![vec![Buf::new(dst, value.len() as u64)]],
            false,
        );
        assert_eq!(got, vec![Ok(value.len() as u64)]);
        let read = std::slice::from_raw_parts(dst as *const u8, value.len());
        assert!(read == value.as_slice(), "zero-copy: wrong bytes");
    }
    let after = client.dummy_stats().unwrap();
    assert_eq!(after.staged_bytes, before.staged_bytes, "no staging copy");
    assert_eq!(
        after.zero_copy_bytes - before.zero_copy_bytes,
        2 * value.len() as u64
    );
    let stats = client.real_client_stats().unwrap();
    assert_eq!(stats.dummies, 1);
    assert!(
        stats.mappings >= 3,
        "local buffer, staging, block: {stats:?}"
    );

    // Exist / remove.
    assert_eq!(client.is_exist("batch-3"), Ok(true));
    client.remove("batch-3", true).unwrap();
    assert_eq!(client.is_exist("batch-3"), Ok(false));
    let mut out = vec![0u8; 16];
    assert_eq!(
        client.get_into("batch-3", &mut out),
        Err(ErrorCode::ObjectNotFound)
    );

    // Freed pool memory is unmapped at the real client on the next call.
    client.unregister_buffer(block).unwrap();
    ShmPool::global().free(block).unwrap();
    assert_eq!(client.is_exist("batch-4"), Ok(true));
    let mut out = vec![0u8; values[4].len()];
    client.get_into("batch-4", &mut out).unwrap();
    let later = client.real_client_stats().unwrap();
    assert_eq!(later.mappings, stats.mappings - 1, "{later:?}");
    client.teardown();
    assert_eq!(client.health_check(), 1);
}

#[test]
fn memory_outside_shared_blocks_cannot_be_registered() {
    let master = Master::start(&[]);
    let (_real, name) = real_client(&master.addr(), free_ports(1)[0]);
    let client = dummy(&name);
    let heap = vec![0u8; 4096];
    assert_eq!(
        client.register_buffer(heap.as_ptr() as usize, heap.len()),
        Err(ErrorCode::InvalidParams)
    );
    assert!(
        mooncake_rs::error::last_error_message().contains("not inside shared memory"),
        "{}",
        mooncake_rs::error::last_error_message()
    );
    let block = client.alloc_from_mem_pool(8192).unwrap();
    // Running past the block's end is refused too.
    assert_eq!(
        client.register_buffer(block, 8192 + 4096),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(client.register_buffer(block, 8192), Ok(()));
    ShmPool::global().free(block).unwrap();
    assert_eq!(ShmPool::global().free(block), Err(ErrorCode::InvalidParams));
}

/// A separate dummy process: this test binary re-run as `dummy_process` with the real
/// client's name in `MC_TEST_REAL_CLIENT`. It writes `MC_TEST_KEY`, prints `READY`, then waits.
#[test]
#[ignore = "run as a child process by the standalone tests"]
fn dummy_process() {
    let Ok(server) = std::env::var("MC_TEST_REAL_CLIENT") else {
        return;
    };
    let key = std::env::var("MC_TEST_KEY").unwrap_or_default();
    let client = dummy(&server);
    let block = client.alloc_from_mem_pool(MIB as u64).unwrap();
    client.register_buffer(block, MIB).unwrap();
    client.put_from(&key, &pattern(100_000, 7), &cfg()).unwrap();
    // And a zero-copy put from the block: the real client maps it too.
    // SAFETY: `block` is 1 MiB of our own shared memory.
    let put = unsafe {
        client.write_raw(
            &[format!("{key}-zero-copy")],
            vec![vec![Buf::new(block, 4096)]],
            &cfg(),
            WriteMode::Put,
        )
    };
    assert_eq!(put, vec![Ok(())]);
    let mut out = vec![0u8; 100_000];
    client.get_into(&key, &mut out).unwrap();
    println!("READY");
    std::thread::sleep(Duration::from_secs(120));
}

fn spawn_dummy_process(server: &str, key: &str) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "dummy_process", "--ignored", "--nocapture"])
        .env("MC_TEST_REAL_CLIENT", server)
        .env("MC_TEST_KEY", key)
        .env("MC_DUMMY_TTL_MS", TTL_MS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(|l| l.ok())
        {
            if line.trim() == "READY" {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the dummy process did not become ready");
    child
}

#[test]
fn a_stopped_or_killed_dummy_is_dropped_with_its_mappings() {
    let master = Master::start(&[]);
    let (_real, name) = real_client(&master.addr(), free_ports(1)[0]);
    let client = dummy(&name);
    // Our own link maps its staging block on first use.
    client.put_from("ours", b"our bytes", &cfg()).unwrap();
    let alone = client.real_client_stats().unwrap();
    assert_eq!(alone.dummies, 1);

    let mut stopped = spawn_dummy_process(&name, "from-stopped");
    let with = client.real_client_stats().unwrap();
    assert_eq!(with.dummies, 2);
    assert!(with.mappings >= alone.mappings + 2, "{with:?}");
    // Its bytes are in the pool, readable by another dummy.
    let mut got = vec![0u8; 100_000];
    assert_eq!(client.get_into("from-stopped", &mut got), Ok(100_000));
    assert!(got == pattern(100_000, 7));
    // A stopped dummy sends no pings: dropped after the TTL, its mappings released.
    signal_child(&stopped, libc::SIGSTOP);
    let started = Instant::now();
    let dropped = wait_until(Duration::from_millis(TTL_MS * 5), || {
        client.real_client_stats().is_ok_and(|s| s.dummies == 1)
    });
    assert!(dropped, "{:?}", client.real_client_stats());
    assert!(started.elapsed() >= Duration::from_millis(TTL_MS / 2));
    let after = client.real_client_stats().unwrap();
    assert_eq!(after.mappings, alone.mappings, "{after:?}");
    assert_eq!(after.mapped_bytes, alone.mapped_bytes, "{after:?}");
    let _ = stopped.kill();
    let _ = stopped.wait();

    // A killed dummy is dropped at once (its socket closes).
    let mut killed = spawn_dummy_process(&name, "from-killed");
    assert_eq!(client.real_client_stats().unwrap().dummies, 2);
    let _ = killed.kill();
    let _ = killed.wait();
    let dropped = wait_until(Duration::from_millis(TTL_MS / 2), || {
        client.real_client_stats().is_ok_and(|s| s.dummies == 1)
    });
    assert!(dropped, "{:?}", client.real_client_stats());
    let after = client.real_client_stats().unwrap();
    assert_eq!(after.mappings, alone.mappings, "{after:?}");
    assert_eq!(after.mapped_bytes, alone.mapped_bytes, "{after:?}");
}

/// Upstream's rule: one real client per service port. A second one on the same `--port` is
/// refused at start with a message naming the port, and the first keeps serving dummies.
#[test]
fn a_second_real_client_on_the_same_port_is_refused() {
    let master = Master::start(&[]);
    let port = free_ports(1)[0];
    let (_first, _) = real_client(&master.addr(), port);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mooncake_client"))
        .args([
            format!("--master_server_address={}", master.addr()),
            format!("--port={port}"),
            "--global_segment_size=16 MB".into(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("--port={port}")), "{stderr}");
    let client = dummy(&format!("127.0.0.1:{port}"));
    let value = pattern(4096, 9);
    assert_eq!(client.put_from("still-served", &value, &cfg()), Ok(()));
}

#[test]
fn a_dummy_survives_a_real_client_restart() {
    let master = Master::start(&[]);
    let port = free_ports(1)[0];
    let (mut real, _) = real_client(&master.addr(), port);
    // The service port outlives the restart (the data port is picked anew).
    let client = dummy(&format!("127.0.0.1:{port}"));
    let value = pattern(MIB, 3);
    let put = client.put_from("before", &value, &cfg());
    assert_eq!(put, Ok(()), "{}", mooncake_rs::error::last_error_message());

    drop(real); // SIGKILL
    let mut out = vec![0u8; MIB];
    let started = Instant::now();
    assert!(client.get_into("before", &mut out).is_err());
    assert!(
        started.elapsed() < Duration::from_millis(TTL_MS * 2),
        "the failure took {:?}",
        started.elapsed()
    );
    assert!(
        wait_until(Duration::from_millis(TTL_MS * 3), || client.health_check()
            == 2),
        "health {}",
        client.health_check()
    );

    (real, _) = real_client(&master.addr(), port);
    // The pinger (or the next call) reconnects and re-sends its blocks.
    let healthy = wait_until(Duration::from_secs(15), || {
        client.health_check() == 0 && client.put_from("after", &value, &cfg()).is_ok()
    });
    assert!(
        healthy,
        "health {}: {}",
        client.health_check(),
        real.stderr()
    );
    assert_eq!(client.get_into("after", &mut out), Ok(MIB as u64));
    assert!(out == value);
    assert!(client.dummy_stats().unwrap().reconnects >= 1);
}

/// Issue 14: a get whose call was abandoned (the real client stopped past the TTL) must not
/// land its bytes later in memory the caller has reused. The real client is stopped before it
/// reads the request, the dummy's get into its shared block times out, the caller writes new
/// bytes there, and only then does the real client resume and run the stale request.
#[test]
fn an_abandoned_get_never_lands_in_reused_memory() {
    let master = Master::start(&[]);
    let (real, name) = real_client(&master.addr(), free_ports(1)[0]);
    let client = dummy(&name);
    let stale = pattern(2 * MIB, 1);
    client.put_from("stale", &stale, &cfg()).unwrap();
    let block = client.alloc_from_mem_pool(2 * MIB as u64).unwrap();
    client.register_buffer(block, 2 * MIB).unwrap();
    // A first get maps the block at the real client.
    // SAFETY: `block` is 2 MiB of our own shared memory.
    let got = unsafe {
        client.get_into_raw(
            &["stale"],
            vec![vec![Buf::new(block, 2 * MIB as u64)]],
            false,
        )
    };
    assert_eq!(got, vec![Ok(2 * MIB as u64)]);

    signal_child(real.child(), libc::SIGSTOP);
    let started = Instant::now();
    // SAFETY: as above.
    let got = unsafe {
        client.get_into_raw(
            &["stale"],
            vec![vec![Buf::new(block, 2 * MIB as u64)]],
            false,
        )
    };
    assert!(got[0].is_err(), "{got:?}");
    assert!(started.elapsed() < Duration::from_millis(TTL_MS * 3));

    // The caller reuses its buffer, then the real client resumes and runs what it had queued.
    let reused = pattern(2 * MIB, 2);
    // SAFETY: as above; no call names the block now.
    unsafe { std::ptr::copy_nonoverlapping(reused.as_ptr(), block as *mut u8, reused.len()) };
    let before = client.real_client_stats();
    signal_child(real.child(), libc::SIGCONT);
    // The stale connection is served (its request run) and then dropped: its socket is closed,
    // and only the connection this poll runs on is left.
    let dropped = wait_until(Duration::from_millis(TTL_MS * 5), || {
        client
            .real_client_stats()
            .is_ok_and(|s| s.dummies == 1 && s.connections == 1 && s.connections_dropped >= 1)
    });
    assert!(dropped, "{before:?} {:?}", client.real_client_stats());
    // SAFETY: as above.
    let now = unsafe { std::slice::from_raw_parts(block as *const u8, reused.len()) };
    assert!(
        now == reused.as_slice(),
        "the abandoned get landed in reused memory"
    );
}
