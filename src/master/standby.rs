//! A standby master's copy of its leader's journal ([`JournalCopy`]): the leader's files,
//! copied byte for byte into the standby's own journal directory, so that on promotion the
//! standby opens that directory as its journal (a torn tail of the newest log — a copy cut
//! in the middle of a record — is cut as after a crash).
//!
//! Each round lists the leader's files (reporting how far this copy is durable, which the
//! leader waits for before it reuses freed ranges), copies what is new in order (the
//! snapshot first, then the logs), syncs it, and deletes the files the leader no longer
//! lists (folded into a newer snapshot). Ownership: one copier per directory, driven by one
//! thread (`&mut self`).

use super::journal::{self, JournalFile};
use super::MasterApi;
use crate::error::{fail, ErrorCode, Result};
use crate::types::{ClientId, Uuid};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Name of the file holding a master's member id (its identity as a standby).
const MEMBER_ID_FILE: &str = "member-id";

/// A standby's copy of the leader's journal. See the module documentation.
pub struct JournalCopy {
    dir: PathBuf,
    member: ClientId,
    /// Bytes copied of each file.
    copied: BTreeMap<String, u64>,
    /// Per log: bytes scanned (whole records) and the last LSN seen.
    scanned: BTreeMap<String, (u64, u64)>,
    acked: u64,
}

fn io_fail<T>(what: &str, path: &Path, error: std::io::Error) -> Result<T> {
    fail(
        ErrorCode::FileWriteFail,
        format!("journal copy: {what} {}: {error}", path.display()),
    )
}

/// The bytes of `path` from `offset` to its end.
fn read_from(path: &Path, offset: u64) -> Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut file| {
            file.seek(SeekFrom::Start(offset))?;
            file.read_to_end(&mut bytes)
        })
        .or_else(|e| io_fail("cannot read", path, e))?;
    Ok(bytes)
}

/// The member id stored in `dir` (created on first use): this master's identity to its
/// leader and in the in-sync list.
pub fn member_id(dir: &Path) -> Result<ClientId> {
    let path = dir.join(MEMBER_ID_FILE);
    if let Ok(text) = fs::read_to_string(&path) {
        let parts: Vec<u64> = text
            .split('-')
            .filter_map(|part| u64::from_str_radix(part.trim(), 16).ok())
            .collect();
        if let [hi, lo] = parts[..] {
            return Ok(Uuid { hi, lo });
        }
    }
    let id = Uuid::random();
    fs::create_dir_all(dir).or_else(|e| io_fail("cannot create", dir, e))?;
    fs::write(&path, id.to_string()).or_else(|e| io_fail("cannot write", &path, e))?;
    Ok(id)
}

impl JournalCopy {
    /// Starts an empty copy in `dir`: the journal files there (a previous life's) are
    /// deleted. Errors: `FILE_WRITE_FAIL` when the directory cannot be prepared.
    pub fn start(dir: &Path) -> Result<JournalCopy> {
        fs::create_dir_all(dir).or_else(|e| io_fail("cannot create", dir, e))?;
        let member = member_id(dir)?;
        let entries = fs::read_dir(dir).or_else(|e| io_fail("cannot list", dir, e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if journal::is_journal_file(&name) {
                let path = entry.path();
                fs::remove_file(&path).or_else(|e| io_fail("cannot delete", &path, e))?;
            }
        }
        Ok(JournalCopy {
            dir: dir.to_path_buf(),
            member,
            copied: BTreeMap::new(),
            scanned: BTreeMap::new(),
            acked: 0,
        })
    }

    /// This master's member id.
    pub fn member(&self) -> ClientId {
        self.member
    }

    /// The last record this copy holds durably.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// The directory (open it as the journal on promotion).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// One round against `leader` (whose listing waits up to 100 ms for something new, so
    /// rounds may follow each other without a pause). Errors: the leader's (the caller retries or re-resolves
    /// the leader), `FILE_WRITE_FAIL` for local I/O, `INTERNAL_ERROR` when the leader's
    /// files no longer extend this copy (it restarted from another history: start over).
    pub fn sync_once(&mut self, leader: &dyn MasterApi) -> Result<()> {
        let listing = leader.journal_files(self.member, self.acked)?;
        let mut new_files = false;
        for file in &listing {
            let have = self.copied.get(&file.name).copied().unwrap_or(0);
            if have > file.len {
                return fail(
                    ErrorCode::InternalError,
                    format!("journal copy: {} shrank at the leader", file.name),
                );
            }
            new_files |= !self.copied.contains_key(&file.name);
            match self.copy(leader, file, have) {
                // Compacted meanwhile: list again next round. Nothing is acknowledged from
                // this one (a snapshot cut short would count as whole).
                Err(ErrorCode::FileNotFound) => return Ok(()),
                outcome => outcome?,
            }
        }
        if new_files {
            journal::sync_dir(&self.dir)?;
        }
        let listed: Vec<&str> = listing.iter().map(|f| f.name.as_str()).collect();
        let gone: Vec<String> = self
            .copied
            .keys()
            .filter(|name| !listed.contains(&name.as_str()))
            .cloned()
            .collect();
        for name in gone {
            let path = self.dir.join(&name);
            fs::remove_file(&path).or_else(|e| io_fail("cannot delete", &path, e))?;
            self.copied.remove(&name);
            self.scanned.remove(&name);
        }
        self.acked = self.scan()?;
        Ok(())
    }

    /// Copies `file` from byte `have` to its listed length and syncs it.
    fn copy(&mut self, leader: &dyn MasterApi, file: &JournalFile, mut have: u64) -> Result<()> {
        let path = self.dir.join(&file.name);
        let mut out = File::options()
            .create(true)
            .append(true)
            .open(&path)
            .or_else(|e| io_fail("cannot open", &path, e))?;
        let start = have;
        while have < file.len {
            let chunk = leader.journal_read(file.name.clone(), have, journal::MAX_READ)?;
            if chunk.is_empty() {
                break;
            }
            out.write_all(&chunk)
                .or_else(|e| io_fail("cannot write", &path, e))?;
            have += chunk.len() as u64;
            self.copied.insert(file.name.clone(), have);
        }
        self.copied.insert(file.name.clone(), have);
        if have > start {
            out.sync_data()
                .or_else(|e| io_fail("cannot sync", &path, e))?;
        }
        Ok(())
    }

    /// The last LSN of the whole records copied (the snapshot's LSN if no log has one).
    fn scan(&mut self) -> Result<u64> {
        let mut last = self.acked;
        for (name, &len) in &self.copied {
            if let Some(lsn) = journal::snapshot_lsn(name) {
                last = last.max(lsn);
                continue;
            }
            let (offset, seen) = self.scanned.get(name).copied().unwrap_or((0, 0));
            if offset < len {
                let path = self.dir.join(name);
                let bytes = read_from(&path, offset)?;
                let (whole, lsn) = journal::last_whole_record(&bytes);
                let seen = lsn.unwrap_or(seen);
                self.scanned.insert(name.clone(), (offset + whole, seen));
            }
            let (_, seen) = self.scanned.get(name).copied().unwrap_or((0, 0));
            last = last.max(seen);
        }
        Ok(last)
    }
}
