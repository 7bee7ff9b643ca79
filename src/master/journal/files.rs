//! The journal directory: which files it holds, reading them back into a [`JournalState`],
//! and writing a snapshot.
//!
//! Layout: `snapshot-<lsn>.mcs` (at most one after a finished compaction; the state as of
//! `lsn`) and `log-<first lsn>.mcj` files, each a run of frames with consecutive LSNs.
//! Only the newest log may end in a torn frame (the process died while appending to it);
//! a bad frame anywhere else, or a gap between LSNs, is corruption and stops the master.

use super::frame::{decode_snapshot, encode_snapshot, scan_log};
use super::record::JournalState;
use crate::error::{fail, ErrorCode, Result};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LogFile {
    pub first_lsn: u64,
    pub path: PathBuf,
}

/// The files of a journal directory.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// The newest snapshot: `(lsn, path)`.
    pub snapshot: Option<(u64, PathBuf)>,
    /// Older snapshots and leftover temporary files (deleted by whoever lists).
    pub stale: Vec<PathBuf>,
    /// Logs by first LSN.
    pub logs: Vec<LogFile>,
}

/// The name of the log whose first record is `lsn`.
pub(crate) fn log_path(dir: &Path, lsn: u64) -> PathBuf {
    dir.join(format!("log-{lsn:020}.mcj"))
}

fn snapshot_path(dir: &Path, lsn: u64) -> PathBuf {
    dir.join(format!("snapshot-{lsn:020}.mcs"))
}

fn io_fail<T>(what: &str, path: &Path, error: std::io::Error) -> Result<T> {
    let detail = format!("journal: {what} {}: {error}", path.display());
    fail(ErrorCode::InternalError, detail)
}

fn number(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

/// The LSN in a snapshot file's name.
pub(crate) fn snapshot_lsn(name: &str) -> Option<u64> {
    number(name, "snapshot-", ".mcs")
}

/// Whether `name` is a snapshot's or a log's (what a standby may read and copy).
pub(crate) fn is_journal_file(name: &str) -> bool {
    number(name, "snapshot-", ".mcs").is_some() || number(name, "log-", ".mcj").is_some()
}

/// Lists `dir`. Errors: `INTERNAL_ERROR` when it cannot be read.
pub(crate) fn list(dir: &Path) -> Result<Listing> {
    let entries = fs::read_dir(dir).or_else(|e| io_fail("cannot list", dir, e))?;
    let mut listing = Listing::default();
    let mut snapshots = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if let Some(lsn) = number(&name, "snapshot-", ".mcs") {
            snapshots.push((lsn, path));
        } else if let Some(first_lsn) = number(&name, "log-", ".mcj") {
            listing.logs.push(LogFile { first_lsn, path });
        } else if name.ends_with(".tmp") {
            listing.stale.push(path);
        }
    }
    snapshots.sort();
    listing.snapshot = snapshots.pop();
    listing
        .stale
        .extend(snapshots.into_iter().map(|(_, path)| path));
    listing.logs.sort_by_key(|log| log.first_lsn);
    Ok(listing)
}

/// Where a torn tail was cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TornTail {
    pub path: PathBuf,
    /// Length kept (the end of the last whole record).
    pub kept: u64,
    /// Bytes cut.
    pub cut: u64,
    pub reason: String,
}

/// A journal read back.
#[derive(Debug, Default)]
pub(crate) struct Folded {
    pub state: JournalState,
    /// LSN of the last record applied (0: none).
    pub last_lsn: u64,
    pub records: u64,
    pub torn: Option<TornTail>,
}

/// Reads the snapshot and then `logs` (in order) into a state. `cut_torn_tail`: a torn end
/// of the last log is truncated on disk and reported; otherwise (compaction, which reads only
/// closed logs) it is corruption. Errors: `INTERNAL_ERROR` for unreadable files, a bad
/// snapshot, a bad frame before the last log's end, or an LSN gap.
pub(crate) fn fold(
    snapshot: Option<&(u64, PathBuf)>,
    logs: &[LogFile],
    cut_torn_tail: bool,
) -> Result<Folded> {
    let mut folded = Folded::default();
    if let Some((_, path)) = snapshot {
        let bytes = fs::read(path).or_else(|e| io_fail("cannot read", path, e))?;
        let (lsn, state) = decode_snapshot(&bytes).or_else(|code| {
            let detail = crate::error::last_error_message();
            fail(code, format!("{}: {detail}", path.display()))
        })?;
        folded.state = state;
        folded.last_lsn = lsn;
    }
    for (index, log) in logs.iter().enumerate() {
        let bytes = fs::read(&log.path).or_else(|e| io_fail("cannot read", &log.path, e))?;
        let scan = scan_log(&bytes);
        for (lsn, record) in scan.records {
            if lsn <= folded.last_lsn {
                continue;
            }
            if lsn != folded.last_lsn + 1 {
                return fail(
                    ErrorCode::InternalError,
                    format!(
                        "journal: {} jumps from LSN {} to {lsn}",
                        log.path.display(),
                        folded.last_lsn
                    ),
                );
            }
            folded.state.apply(record);
            folded.last_lsn = lsn;
            folded.records += 1;
        }
        let Some(reason) = scan.torn else { continue };
        let last = index + 1 == logs.len();
        if !(last && cut_torn_tail) {
            return fail(
                ErrorCode::InternalError,
                format!(
                    "journal: {} is damaged at byte {} ({reason}) and is not the newest log",
                    log.path.display(),
                    scan.valid_len
                ),
            );
        }
        cut(&log.path, scan.valid_len)?;
        folded.torn = Some(TornTail {
            path: log.path.clone(),
            kept: scan.valid_len,
            cut: bytes.len() as u64 - scan.valid_len,
            reason,
        });
    }
    Ok(folded)
}

fn cut(path: &Path, len: u64) -> Result<()> {
    let file = File::options()
        .write(true)
        .open(path)
        .or_else(|e| io_fail("cannot open", path, e))?;
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .or_else(|e| io_fail("cannot cut the torn tail of", path, e))
}

/// Makes the directory's entries (created, renamed or deleted files) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .or_else(|e| io_fail("cannot sync", dir, e))
}

/// Writes the snapshot of `state` as of `lsn` (a temporary file, synced, renamed into place,
/// directory synced); returns its path and size. Errors: `INTERNAL_ERROR` (nothing replaced).
pub(crate) fn write_snapshot(dir: &Path, lsn: u64, state: &JournalState) -> Result<(PathBuf, u64)> {
    let bytes = encode_snapshot(lsn, state)?;
    let path = snapshot_path(dir, lsn);
    let tmp = path.with_extension("mcs.tmp");
    let written = File::create(&tmp)
        .and_then(|mut file| file.write_all(&bytes).and_then(|()| file.sync_all()))
        .or_else(|e| io_fail("cannot write", &tmp, e));
    if let Err(code) = written {
        let _ = fs::remove_file(&tmp);
        return Err(code);
    }
    fs::rename(&tmp, &path).or_else(|e| io_fail("cannot rename", &tmp, e))?;
    sync_dir(dir)?;
    Ok((path, bytes.len() as u64))
}

/// Deletes `paths` (best effort: a file left over is deleted by a later listing or fold).
pub(crate) fn remove_all(paths: impl IntoIterator<Item = PathBuf>) {
    for path in paths {
        if let Err(error) = fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), %error, "journal: cannot delete");
        }
    }
}
