//! The SSD tier in the soak: every owner of the centralized pool keeps its evicted objects in
//! a small disk tier (`--ssd-limit`, so the tier is always full and trimming), and the fault
//! driver damages its record files as a failing disk would: a flipped payload byte, a
//! truncated file, a deleted file. A get of a damaged record must fail (never return other
//! or empty bytes: the workers' checks catch that), and at the end the records on disk must
//! be exactly the live disk objects the master lists.

use std::path::{Path, PathBuf};

/// The disk fault kinds (drawn only when the owners have a tier).
pub const DISK_KINDS: &[&str] = &["corrupt_record", "truncate_record", "delete_record"];

/// Bytes of a record's header block (`src/storage/disk/record.rs`): the payload follows.
const HEADER_BLOCK: u64 = 4096;

/// The tier directory of owner `index` under the run's directory.
pub fn tier_dir(run_dir: &Path, index: usize) -> PathBuf {
    run_dir.join(format!("ssd-{index}"))
}

/// Every file of the tier in `dir` that holds a record (none when it does not exist yet);
/// spare files (kept for reuse: header zeroed, or marked spare, `src/storage/disk/spare_mark.rs`)
/// are not records.
pub fn record_files(dir: &Path) -> Vec<PathBuf> {
    let fans = std::fs::read_dir(dir.join("objects")).into_iter().flatten();
    let files = fans.flatten().flat_map(|fan| {
        let entries = std::fs::read_dir(fan.path()).into_iter().flatten();
        entries.flatten().map(|entry| entry.path())
    });
    let named = files.filter(|path| path.extension() == Some("rec".as_ref()));
    let records = named.filter(|path| mooncake_rs::storage::record_in(path).is_some());
    records.collect()
}

/// Damages one random record of a random tier among `dirs` as `kind` says; returns the
/// fault's target (the record's path), or `None` when no tier holds a record yet.
pub fn inject(dirs: &[PathBuf], kind: &str, rng: &mut fastrand::Rng) -> Option<String> {
    let records: Vec<PathBuf> = dirs.iter().flat_map(|dir| record_files(dir)).collect();
    let path = records.get(rng.usize(0..records.len().max(1)))?;
    let damaged = match kind {
        "corrupt_record" => flip_payload_byte(path, rng),
        "truncate_record" => truncate(path, rng),
        _ => std::fs::remove_file(path),
    };
    // The owner may have deleted the record meanwhile: that is no fault of the run.
    damaged.ok()?;
    Some(path.display().to_string())
}

/// Flips one bit of one payload byte of the record at `path`.
fn flip_payload_byte(path: &Path, rng: &mut fastrand::Rng) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let len = file.metadata()?.len();
    let at = HEADER_BLOCK + rng.u64(0..len.saturating_sub(HEADER_BLOCK).max(1));
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at)?;
    byte[0] ^= 1 << rng.u32(0..8);
    file.write_all_at(&byte, at)
}

/// Cuts the record at `path` to a random shorter length.
fn truncate(path: &Path, rng: &mut fastrand::Rng) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    let len = file.metadata()?.len();
    file.set_len(rng.u64(0..len.max(1)))
}
