//! The one-copy-primitive rule: caller memory (which may be device memory) is copied only by
//! `device::memcpy_safe` (src/device/copy.rs). This test greps `src/` for every other way
//! Rust code can copy bytes or view raw memory as a slice, and allows only the sites listed
//! below, each with why it never touches caller data buffers. A new site fails the test:
//! route the copy through `memcpy_safe`, or (if it copies only our own memory) add it here
//! with the reason.

use std::collections::BTreeMap;
use std::path::Path;

/// Byte copies and raw slices (over memory that might be a caller's).
const PATTERNS: &[&str] = &[
    "copy_nonoverlapping",
    "ptr::copy(",
    ".copy_from(",
    ".copy_to(",
    "copy_to_nonoverlapping",
    "copy_from_nonoverlapping",
    "memcpy(",
    "memmove(",
    "copy_from_slice",
    "clone_from_slice",
    "from_raw_parts",
];

/// (file, allowed occurrences, why).
const ALLOWED: &[(&str, usize, &str)] = &[
    ("src/device/copy.rs", 1, "the primitive itself (host <-> host only)"),
    ("src/storage/disk/mod.rs", 4, "the SSD tier's own aligned I/O buffers: slices of its allocation, the header block, a test payload; never caller memory"),
    ("src/storage/disk/spare_mark.rs", 2, "building the SSD tier's spare-mark attribute value (generation, key CRC) in a 12-byte array; never caller memory"),
    ("src/auth/keys.rs", 1, "a cluster key's id from its SHA-256 digest; never caller memory"),
    ("src/master/object_key.rs", 1, "the master's copy of an object key (a `&str` of a request) into its inline array; never caller memory"),
    ("src/auth/protocol.rs", 7, "encoding the cluster-key handshake's own fixed messages (magic, key id, nonces, proofs); never caller memory"),
    ("src/storage/disk/record.rs", 4, "encoding and decoding the SSD tier record header in its own block buffer; never caller memory"),
    ("src/transfer/tcp/pool.rs", 2, "socket I/O slices over slice memory: host only (device memory is replaced by pinned bounces before)"),
    ("src/transfer/tcp/server.rs", 1, "read-ahead bytes into our own registered segment (host mapping), by raw pointer"),
    ("src/transfer/tcp/wire.rs", 6, "encoding/decoding our own header arrays (size, addr, epoch)"),
    ("src/transfer/tcp/pool_tests.rs", 1, "test data"),
    ("src/rpc/codec.rs", 1, "our own RPC frame"),
    ("src/ffi/check.rs", 3, "arrays of pointers/sizes/keys (never data buffers) and NUL-terminated text into a char buffer"),
    ("src/ffi/error.rs", 1, "error text into the caller's char buffer"),
    ("src/client/buffer.rs", 1, "a get_buffer handle's own local-buffer memory"),
    ("src/device/region.rs", 1, "unit test of our own mapping"),
    ("src/p2p/accessor.rs", 1, "unit test reading back its own staging slot"),
    ("src/bin/mc_bench/limits.rs", 1, "the benchmark's memcpy baseline on its own buffers"),
    ("src/bin/mc_chaos/value.rs", 2, "the chaos checker building and splicing its own test values"),
    ("src/bin/mc_chaos/worker.rs", 1, "a chaos dummy's view of its own shared-memory block (its registered memory)"),
    ("src/shm/tests.rs", 4, "unit tests of our own shared mappings (copies through a punched hole among them)"),
    ("src/standalone/tests.rs", 1, "a unit-test helper reading back its own registered region or shared block"),
    ("src/standalone/wire.rs", 3, "decoding integers of our own dummy frames"),
    ("src/transfer/same_host/handshake.rs", 5, "encoding/decoding our own same-host handshake messages"),
    ("src/transfer/rdma/qp.rs", 5, "encoding/decoding our own QP endpoint (qpn, psn, lid, gid)"),
    ("src/transfer/rdma/handshake.rs", 6, "encoding/decoding our own RDMA handshake (lengths, endpoint, device index, region table; a unit test's canned reply)"),
];

fn scan(dir: &Path, found: &mut BTreeMap<String, usize>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            scan(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let hits: usize = text
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .map(|line| PATTERNS.iter().filter(|p| line.contains(*p)).count())
                .sum();
            if hits > 0 {
                let root = Path::new(env!("CARGO_MANIFEST_DIR"));
                let name = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                found.insert(name, hits);
            }
        }
    }
}

#[test]
fn caller_memory_is_copied_only_by_memcpy_safe() {
    let mut found = BTreeMap::new();
    scan(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut found,
    );
    for (file, hits) in &found {
        match ALLOWED.iter().find(|(f, _, _)| f == file) {
            Some((_, allowed, _)) => assert!(
                hits <= allowed,
                "{file}: {hits} byte copies / raw slices, {allowed} allowed; use device::memcpy_safe"
            ),
            None => panic!(
                "{file}: {hits} byte copies / raw slices outside device::memcpy_safe; \
                 caller memory may be device memory"
            ),
        }
    }
    assert!(
        found.contains_key("src/device/copy.rs"),
        "the primitive moved?"
    );
}
