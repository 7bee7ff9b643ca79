//! The local SSD tier's record store: one crash-safe file per object in a directory that one
//! process owns (an exclusive `flock` on `dir/LOCK`, held for the store's life).
//!
//! Layout: `dir/objects/{n % 256:02x}/{n:016x}.rec`, `n` a file number (format in [`record`];
//! `dir/tmp` holds the O_DIRECT probe). A file's name means nothing: its header says which
//! (key, generation) it holds, and a file whose header block is zero, or whose header is the
//! record its spare mark names ([`spare_mark`]), is *spare*. A removed record's file is kept
//! as a spare (marked, costing no disk write) and the next record of the same length
//! overwrites it: an overwrite of allocated blocks plus `fdatasync`, which costs no file
//! creation, block allocation or directory sync (the spare pool is bounded, see
//! [`spare_limit`](DiskStore::spare_limit), and dropped first when a write needs room). A new
//! file is created, written, `fdatasync`ed and its directory synced (one sync for the files
//! created in that directory meanwhile, [`dir_sync`]). Either way the write
//! returns only once the record is durable, and its owner reports it to the master only after
//! that. A crash may leave a record torn: `open` deletes one whose length or header is wrong, a
//! read rejects one whose bytes are (payload CRC, checked on every read), and the master never
//! lists one it did not accept, so the next mount deletes it.
//!
//! Thread-safety: [`DiskStore`] is `Send + Sync`. One mutex guards the index, the byte
//! accounting and the counters; it is a leaf and never held across disk I/O. A (key,
//! generation) with file I/O in flight is marked busy, so concurrent callers never write or
//! remove the same record twice; new files get unique numbers and a spare belongs to the one
//! write that took it. A file with reads in flight is never made a spare: a removal unlinks
//! it instead (the readers keep the inode), so a read never sees another record's bytes.
//! Generations of one key coexist: only [`DiskStore::remove`] (the master's deletion task) or
//! a failed check deletes a record.

mod dir_sync;
mod read_buf;
mod record;
mod spare_mark;

use crate::error::{fail, ErrorCode, Result};
use dir_sync::DirSyncs;
use parking_lot::Mutex;
use record::{decode_header, encode_header, file_len, round_up, Header, BLOCK};
use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// Free space a write leaves on the filesystem at least.
const FREE_RESERVE: u64 = 64 << 20;
/// Directories under `objects/`.
const FANS: usize = 256;
/// Consecutive file numbers that share a directory (about the owner's parallel writes).
const FAN_RUN: u64 = 64;
/// Spare-file bytes a store may always keep (see [`DiskStore::spare_limit`]).
const SPARE_MIN: u64 = 64 << 20;

/// A zeroed, [`BLOCK`]-aligned heap buffer (what O_DIRECT needs). Owns its memory, freed on
/// drop; `Send + Sync` like a `Box<[u8]>`.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer uniquely owns its allocation, like `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: `&AlignedBuf` gives read-only access only.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `capacity` bytes rounded up to whole blocks (at least one).
    ///
    /// Errors: `INVALID_PARAMS` for an impossible size; `INTERNAL_ERROR` when out of memory.
    pub(crate) fn new(capacity: usize) -> Result<AlignedBuf> {
        let size = capacity.max(1).div_ceil(BLOCK).saturating_mul(BLOCK);
        let Ok(layout) = Layout::from_size_align(size, BLOCK) else {
            return fail(
                ErrorCode::InvalidParams,
                format_args!("{capacity} B buffer"),
            );
        };
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) });
        match ptr {
            Some(ptr) => Ok(AlignedBuf { ptr, layout }),
            None => fail(
                ErrorCode::InternalError,
                format_args!("no memory for {size} B"),
            ),
        }
    }

    /// Usable bytes (a multiple of [`BLOCK`]).
    pub(crate) fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// The whole buffer.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` owns `capacity` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.capacity()) }
    }

    /// The whole buffer, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity()) }
    }

    /// Zeroes the padding after a `from`-byte value: the bytes from `from` to the next
    /// whole block (or the buffer's end).
    pub(crate) fn zero_tail(&mut self, from: usize) {
        let from = from.min(self.capacity());
        let to = from
            .div_ceil(BLOCK)
            .saturating_mul(BLOCK)
            .min(self.capacity());
        self.as_mut_slice()[from..to].fill(0);
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// What [`DiskStore::open`] needs. Plain value.
#[derive(Clone, Debug)]
pub(crate) struct DiskStoreOptions {
    /// The store's directory (created if missing).
    pub dir: PathBuf,
    /// Bytes of record files allowed; 0 = no limit but the filesystem's.
    pub capacity: u64,
}

/// Occupancy and counters of a store since it was opened (a snapshot; plain value). A
/// client's SSD tier reports these (`crate::client::SsdTierMetrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskStats {
    /// Indexed records.
    pub objects: u64,
    /// Bytes of record files, including space reserved by writes in flight.
    pub used_bytes: u64,
    /// Spare files kept for reuse (their bytes are not in `used_bytes`).
    pub spare_files: u64,
    /// Bytes of the spare files.
    pub spare_bytes: u64,
    /// The configured capacity (0 = unlimited).
    pub capacity: u64,
    /// Records written.
    pub writes: u64,
    /// Records written by overwriting a spare file (counted in `writes` too).
    pub reused: u64,
    /// Records read and verified.
    pub reads: u64,
    /// Records found malformed (at open or on read) and deleted.
    pub corrupt: u64,
    /// Writes refused for lack of space.
    pub full: u64,
    /// Other I/O errors.
    pub io_errors: u64,
}

/// One indexed record (what a restarted owner re-publishes). Plain value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredObject {
    /// The object's key.
    pub key: String,
    /// The generation it was written with.
    pub generation: u64,
    /// Payload bytes.
    pub len: u64,
}

/// A verified record read from disk; owns its buffer (given back to the thread's pool,
/// [`read_buf`], when dropped), [`bytes`](Self::bytes) borrows it.
pub(crate) struct ReadRecord {
    /// Always `Some` until dropped.
    buf: Option<AlignedBuf>,
    len: usize,
}

impl ReadRecord {
    /// The payload (exactly the stored length), without a copy.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.buf
            .as_ref()
            .map_or(&[], |buf| &buf.as_slice()[..self.len])
    }
}

impl Drop for ReadRecord {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            read_buf::give_back(buf);
        }
    }
}

/// An indexed record file: its payload length and CRC32C (as its header says, checked when
/// it was written or indexed), so a read fetches and checks the payload alone.
struct Entry {
    len: u64,
    crc: u32,
    path: PathBuf,
}

/// What the store's mutex guards.
#[derive(Default)]
struct State {
    /// Indexed records: key, then generation. A key holds several generations while the
    /// master still needs an older one (a pinned read of it): records are deleted only by
    /// [`DiskStore::remove`], never superseded, so a reader holding an older generation keeps it.
    index: HashMap<String, BTreeMap<u64, Entry>>,
    /// (key, generation) of files being written or unlinked.
    busy: HashSet<(String, u64)>,
    /// Files with reads in flight, and how many.
    reading: HashMap<PathBuf, u32>,
    /// Spare files by length (see the module documentation).
    spare: BTreeMap<u64, Vec<PathBuf>>,
    /// The number of the next new file.
    next_file: u64,
    /// Counters; `used_bytes`, `spare_files` and `spare_bytes` are the accounting itself,
    /// `objects` counts the index, `capacity` is unused.
    stats: DiskStats,
}

impl State {
    /// The indexed record of (`key`, `generation`).
    fn entry(&self, key: &str, generation: u64) -> Option<&Entry> {
        self.index.get(key)?.get(&generation)
    }

    /// Indexes `entry` (its bytes already counted) as (`key`, `generation`) unless that pair
    /// is indexed already. Returns whether it was indexed; an entry that was not gives its
    /// bytes back.
    fn adopt(&mut self, key: &str, generation: u64, entry: Entry) -> bool {
        if self.entry(key, generation).is_some() {
            self.stats.used_bytes -= file_len(entry.len);
            return false;
        }
        let generations = self.index.entry(key.to_owned()).or_default();
        generations.insert(generation, entry);
        self.stats.objects += 1;
        true
    }

    /// Adds a spare file of `len` bytes.
    fn add_spare(&mut self, len: u64, path: PathBuf) {
        self.spare.entry(len).or_default().push(path);
        self.stats.spare_files += 1;
        self.stats.spare_bytes += len;
    }

    /// Takes a spare file of exactly `len` bytes, if one exists.
    fn take_spare(&mut self, len: u64) -> Option<PathBuf> {
        let files = self.spare.get_mut(&len)?;
        let path = files.pop()?;
        if files.is_empty() {
            self.spare.remove(&len);
        }
        self.stats.spare_files -= 1;
        self.stats.spare_bytes -= len;
        Some(path)
    }

    /// Takes spare files (the largest first) until `bytes` are taken or none is left; the
    /// caller unlinks them.
    fn drain_spare(&mut self, bytes: u64) -> Vec<PathBuf> {
        let mut taken = (Vec::new(), 0u64);
        while taken.1 < bytes {
            let Some((&len, _)) = self.spare.last_key_value() else {
                break;
            };
            let path = self.take_spare(len).expect("listed length");
            taken.0.push(path);
            taken.1 += len;
        }
        taken.0
    }

    /// The next file number, its path and its directory's index: runs of [`FAN_RUN`]
    /// consecutive numbers share a directory, so files created together share its syncs.
    fn new_path(&mut self, dir: &Path) -> (PathBuf, usize) {
        let number = self.next_file;
        self.next_file = number.wrapping_add(1);
        let fan = (number / FAN_RUN) as usize % FANS;
        let path = dir.join(format!("objects/{fan:02x}/{number:016x}.rec"));
        (path, fan)
    }

    /// Takes (`key`, `generation`) out of the index.
    fn take(&mut self, key: &str, generation: u64) -> Option<Entry> {
        let generations = self.index.get_mut(key)?;
        let entry = generations.remove(&generation)?;
        if generations.is_empty() {
            self.index.remove(key);
        }
        self.stats.objects -= 1;
        Some(entry)
    }
}

/// Where a reserved write goes: a spare file it overwrites, or a new file at `path` (in
/// directory `fan`), created after unlinking the spare files `dropped` (taken out of the pool
/// to make room).
enum Target {
    Spare(PathBuf),
    New {
        path: PathBuf,
        fan: usize,
        dropped: Vec<PathBuf>,
    },
}

/// The record store; see the module documentation. Dropping it closes the lock file, which
/// releases the directory.
pub(crate) struct DiskStore {
    dir: PathBuf,
    capacity: u64,
    /// Whether files are opened with O_DIRECT (false where the filesystem refuses it).
    direct: bool,
    _lock: File,
    state: Mutex<State>,
    /// Syncs of the `objects/` directories, by index.
    dir_syncs: DirSyncs,
}

impl DiskStore {
    /// Opens (creating if needed) the store in `options.dir`, locks it, deletes torn writes
    /// in `tmp` and rebuilds the index from the record headers (malformed records are
    /// deleted and counted in `corrupt`; of two files of one (key, generation) the one whose
    /// payload checks is kept; zero headers and marked files are spares).
    ///
    /// Errors: `FILE_LOCK_FAIL` when another open store (any process, this one included)
    /// holds the directory; `FILE_OPEN_FAIL` when directories cannot be created;
    /// `FILE_READ_FAIL` / `FILE_WRITE_FAIL` when scanning or cleaning fails.
    pub(crate) fn open(options: DiskStoreOptions) -> Result<DiskStore> {
        let dir = options.dir;
        let subdirs = (0..FANS).map(|fan| format!("objects/{fan:02x}"));
        for path in subdirs.chain(["tmp".into()]).map(|sub| dir.join(sub)) {
            fs::create_dir_all(&path).or_else(|e| io_fail(ErrorCode::FileOpenFail, &path, e))?;
        }
        let _lock = lock_dir(&dir)?;
        clear_dir(&dir.join("tmp"))?;
        let direct = probe_direct(&dir.join("tmp"));
        let state = Mutex::new(scan(&dir)?);
        let capacity = options.capacity;
        Ok(DiskStore {
            dir,
            capacity,
            direct,
            _lock,
            state,
            dir_syncs: DirSyncs::new(FANS),
        })
    }

    /// Every indexed record.
    pub(crate) fn objects(&self) -> Vec<StoredObject> {
        let state = self.state.lock();
        let records = state.index.iter().flat_map(|(key, generations)| {
            generations.iter().map(|(&generation, e)| StoredObject {
                key: key.clone(),
                generation,
                len: e.len,
            })
        });
        records.collect()
    }

    /// Whether (`key`, `generation`) is indexed (the tests' view of the index).
    #[cfg(test)]
    pub(crate) fn contains(&self, key: &str, generation: u64) -> bool {
        self.state.lock().entry(key, generation).is_some()
    }

    /// Stores the first `len` bytes of `payload` (its capacity covers `round_up(len)`; the
    /// padding is written as it is, see [`AlignedBuf::zero_tail`]) durably as (`key`,
    /// `generation`). Other generations of `key` stay (the master deletes each it lets go).
    ///
    /// Errors: `OBJECT_ALREADY_EXISTS` when (`key`, `generation`) is indexed or being
    /// written or deleted; `NO_AVAILABLE_HANDLE` when the capacity or the filesystem (64 MiB kept
    /// free, ENOSPC, EDQUOT) has no room (counted in `full`); `INVALID_KEY` for an oversized
    /// key; `INVALID_PARAMS` when `payload` is too short; `FILE_WRITE_FAIL` for other I/O
    /// errors (counted in `io_errors`). The file is unlinked on failure (if that fails too,
    /// counted in `io_errors` and found again by the next open).
    pub(crate) fn write(
        &self,
        key: &str,
        generation: u64,
        payload: &AlignedBuf,
        len: u64,
    ) -> Result<()> {
        let padded = round_up(len);
        if padded > payload.capacity() as u64 {
            return fail(
                ErrorCode::InvalidParams,
                format_args!("{len} B exceed the buffer"),
            );
        }
        let crc = crc32c::crc32c(&payload.as_slice()[..len as usize]);
        let mut header = AlignedBuf::new(BLOCK)?;
        let block = encode_header(key, generation, len, crc)?;
        header.as_mut_slice().copy_from_slice(&block);
        let need = file_len(len);
        let target = self.reserve(key, generation, need)?;
        let reused = matches!(target, Target::Spare(_));
        let body = &payload.as_slice()[..padded as usize];
        let written = self.write_file(target, &header, body);
        let path = written.inspect_err(|_| self.finish(key, generation, need))?;
        self.publish(key, generation, Entry { len, crc, path }, reused);
        Ok(())
    }

    /// Reads and verifies (`key`, `generation`): the payload blocks alone (not the header
    /// block), checked against the length and CRC32C the index took from the record's header
    /// when it was written or indexed. The file cannot change meanwhile: a file with a read in
    /// flight is never reused, so bytes of another record (or a torn or rotten payload) fail
    /// the CRC. A record found corrupt or missing is dropped from the index and its file
    /// deleted, so it is never served again.
    ///
    /// Errors: `OBJECT_NOT_FOUND` when that generation is not indexed (or was removed while
    /// reading); `FILE_NOT_FOUND` when its file vanished; `CHECKSUM_MISMATCH` for a short
    /// file or a wrong payload CRC (counted in `corrupt`); `FILE_READ_FAIL` for other I/O
    /// errors (counted in `io_errors`).
    pub(crate) fn read(&self, key: &str, generation: u64) -> Result<ReadRecord> {
        let mut state = self.state.lock();
        let found = state
            .entry(key, generation)
            .map(|e| (e.len, e.crc, e.path.clone()));
        let Some((len, crc, path)) = found else {
            return fail(
                ErrorCode::ObjectNotFound,
                format_args!("{key}@{generation}"),
            );
        };
        // While counted here the file is not reused (a removal unlinks it instead).
        *state.reading.entry(path.clone()).or_default() += 1;
        drop(state);
        // An empty value has no block to check: its header block is read and checked instead.
        let (offset, total) = match len {
            0 => (0, BLOCK),
            _ => (BLOCK as u64, round_up(len) as usize),
        };
        let read = read_buf::take(total).map(|mut buf| {
            let file = self.open_file(&path, OpenOptions::new().read(true));
            let into = &mut buf.as_mut_slice()[..total];
            let read = file.and_then(|f| f.read_exact_at(into, offset));
            read.map(|()| buf)
        });
        self.end_read(&path);
        let buf = match read? {
            Ok(buf) => buf,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return self.vanished(&path, key, generation, e)
            }
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                return self.corrupted(&path, key, generation)
            }
            Err(e) => return self.io_error(ErrorCode::FileReadFail, &path, e),
        };
        let same = |h: Header| h.key == key && h.generation == generation && h.len == 0;
        let verified = match len {
            0 => decode_header(buf.as_slice()).is_ok_and(same),
            _ => crc32c::crc32c(&buf.as_slice()[..len as usize]) == crc,
        };
        if !verified {
            return self.corrupted(&path, key, generation);
        }
        let record = ReadRecord {
            buf: Some(buf),
            len: len as usize,
        };
        self.state.lock().stats.reads += 1;
        Ok(record)
    }

    /// Removes the record (`key`, `generation`); returns whether it was indexed. Its file
    /// becomes a spare (marked, not synced) while the spare pool has room, else it is
    /// unlinked.
    ///
    /// Errors: `FILE_WRITE_FAIL` when the file can neither be recycled nor unlinked (counted
    /// in `io_errors`; the record is no longer indexed either way).
    pub(crate) fn remove(&self, key: &str, generation: u64) -> Result<bool> {
        let Some(entry) = self.detach(key, generation, None) else {
            return Ok(false);
        };
        if self.recycle(key, generation, &entry) {
            return Ok(true);
        }
        let unlinked = self.discard(key, generation, &entry).map(|()| true);
        unlinked.or_else(|e| self.io_error(ErrorCode::FileWriteFail, &entry.path, e))
    }

    /// Removes every record; returns how many were removed (failures as in
    /// [`remove`](Self::remove): logged and counted). Used by the tests.
    #[cfg(test)]
    pub(crate) fn remove_all(&self) -> u64 {
        let records = self.objects();
        let removed = records
            .iter()
            .filter(|r| self.remove(&r.key, r.generation) == Ok(true));
        removed.count() as u64
    }

    /// A snapshot of the occupancy and counters.
    pub(crate) fn stats(&self) -> DiskStats {
        let state = self.state.lock();
        DiskStats {
            capacity: self.capacity,
            ..state.stats
        }
    }

    /// Checks that (`key`, `generation`) is neither indexed nor busy and that `need` bytes
    /// fit, then reserves them, marks the pair busy and picks the file: a spare of exactly
    /// `need` bytes, else a new one (taking spares out of the pool while they and the
    /// records would exceed the capacity).
    fn reserve(&self, key: &str, generation: u64, need: u64) -> Result<Target> {
        let mut state = self.state.lock();
        let pair = (key.to_owned(), generation);
        if state.entry(key, generation).is_some() || state.busy.contains(&pair) {
            drop(state);
            let msg = format_args!("{key}@{generation} exists");
            return fail(ErrorCode::ObjectAlreadyExists, msg);
        }
        let used = state.stats.used_bytes.saturating_add(need);
        if self.capacity > 0 && used > self.capacity {
            state.stats.full += 1;
            drop(state);
            return fail(
                ErrorCode::NoAvailableHandle,
                format_args!("{used} B exceed the capacity"),
            );
        }
        state.stats.used_bytes = used;
        state.busy.insert(pair);
        if let Some(path) = state.take_spare(need) {
            return Ok(Target::Spare(path));
        }
        let over = used.saturating_add(state.stats.spare_bytes);
        let dropped = match self.capacity {
            0 => Vec::new(),
            capacity => state.drain_spare(over.saturating_sub(capacity)),
        };
        let (path, fan) = state.new_path(&self.dir);
        Ok(Target::New { path, fan, dropped })
    }

    /// The most bytes of spare files kept: an eighth of the capacity (or, without one, of
    /// the bytes held), at least [`SPARE_MIN`].
    fn spare_limit(&self, stats: &DiskStats) -> u64 {
        let held = stats.used_bytes.saturating_add(stats.spare_bytes);
        let base = if self.capacity > 0 {
            self.capacity
        } else {
            held
        };
        (base / 8).max(SPARE_MIN)
    }

    /// Bytes free on the store's filesystem (for unprivileged users).
    ///
    /// Errors: `INVALID_PARAMS` for a directory name holding a NUL; `FILE_WRITE_FAIL` when
    /// `statvfs` fails (counted in `io_errors`).
    fn filesystem_free(&self) -> Result<u64> {
        let Ok(path) = std::ffi::CString::new(self.dir.as_os_str().as_bytes()) else {
            return fail(ErrorCode::InvalidParams, "directory name holds a NUL");
        };
        // SAFETY: plain C struct, filled by statvfs.
        let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid C string and out pointer.
        if unsafe { libc::statvfs(path.as_ptr(), &mut vfs) } != 0 {
            return self.write_error(&self.dir, io::Error::last_os_error());
        }
        Ok((vfs.f_bavail as u64).saturating_mul(vfs.f_frsize as u64))
    }

    /// The record bytes the store may hold: its capacity, or without one, what it holds
    /// plus what the filesystem has free beyond [`FREE_RESERVE`]. Errors: see
    /// `filesystem_free`.
    pub(crate) fn room(&self) -> Result<u64> {
        if self.capacity > 0 {
            return Ok(self.capacity);
        }
        let free = self.filesystem_free()?.saturating_sub(FREE_RESERVE);
        let stats = self.state.lock().stats;
        Ok(stats.used_bytes + stats.spare_bytes.saturating_add(free))
    }

    /// Refuses a write that would leave less than [`FREE_RESERVE`] free on the filesystem
    /// (after unlinking spare files to make up the difference).
    fn check_free(&self, need: u64) -> Result<()> {
        let want = need.saturating_add(FREE_RESERVE);
        let mut free = self.filesystem_free()?;
        if free < want {
            let dropped = self.state.lock().drain_spare(want - free);
            if !dropped.is_empty() {
                self.unlink_spare(&dropped);
                free = self.filesystem_free()?;
            }
        }
        if free < want {
            self.state.lock().stats.full += 1;
            return fail(
                ErrorCode::NoAvailableHandle,
                format_args!("{free} B free on disk"),
            );
        }
        Ok(())
    }

    /// Writes the record into `target` and syncs it (`fdatasync`; a new file's directory
    /// too, after checking the filesystem's free space); returns its path. On failure the
    /// file is unlinked (a spare's content is then unknown; a new file was never indexed).
    fn write_file(&self, target: Target, header: &AlignedBuf, body: &[u8]) -> Result<PathBuf> {
        let mut options = OpenOptions::new();
        options.write(true);
        let (path, created) = match target {
            Target::Spare(path) => (path, None),
            Target::New { path, fan, dropped } => {
                self.unlink_spare(&dropped);
                self.check_free(file_len(body.len() as u64))?;
                options.create_new(true);
                (path, Some(fan))
            }
        };
        let file = match self.open_file(&path, &mut options) {
            Ok(file) => file,
            Err(e) => {
                if created.is_none() {
                    self.unlink_spare(std::slice::from_ref(&path));
                }
                return self.write_error(&path, e);
            }
        };
        let written = write_record_at(&file, header.as_slice(), body);
        let synced = written.and_then(|()| file.sync_data());
        let synced = synced.and_then(|()| match created {
            Some(fan) => self.dir_syncs.sync(fan, path.parent().unwrap_or(&self.dir)),
            None => Ok(()),
        });
        if let Err(e) = synced {
            self.unlink_spare(std::slice::from_ref(&path));
            return self.write_error(&path, e);
        }
        // After the sync: a crash before the mark comes off leaves a mark naming the record
        // the spare held, which the new header is not (see `spare_mark`).
        let unmarked = match created {
            Some(_) => Ok(()),
            None => spare_mark::unmark(&path),
        };
        if let Err(e) = unmarked {
            self.state.lock().stats.io_errors += 1;
            tracing::warn!("ssd tier: {}: {e}", path.display());
        }
        Ok(path)
    }

    /// Unlinks files that are neither indexed nor spare: spares taken out of the pool, or the
    /// file of a failed write (failures are logged and counted in `io_errors`; such a file
    /// is found again by the next open).
    fn unlink_spare(&self, paths: &[PathBuf]) {
        for path in paths {
            if let Err(e) = unlink(path) {
                self.state.lock().stats.io_errors += 1;
                tracing::warn!("ssd tier: {}: {e}", path.display());
            }
        }
    }

    /// Indexes a written record and ends its busy mark (the pair was reserved, so it is
    /// not indexed yet).
    fn publish(&self, key: &str, generation: u64, entry: Entry, reused: bool) {
        let mut state = self.state.lock();
        state.busy.remove(&(key.to_owned(), generation));
        let indexed = state.adopt(key, generation, entry);
        state.stats.writes += u64::from(indexed);
        state.stats.reused += u64::from(indexed && reused);
    }

    /// Releases `bytes` and ends the busy mark of (`key`, `generation`).
    fn finish(&self, key: &str, generation: u64, bytes: u64) {
        let mut state = self.state.lock();
        state.stats.used_bytes -= bytes;
        state.busy.remove(&(key.to_owned(), generation));
    }

    /// Takes (`key`, `generation`) out of the index (only if its file is `at`, when given),
    /// marking it busy until [`discard`](Self::discard) or [`recycle`](Self::recycle).
    fn detach(&self, key: &str, generation: u64, at: Option<&Path>) -> Option<Entry> {
        let mut state = self.state.lock();
        let elsewhere = |e: &Entry| at.is_some_and(|at| e.path != at);
        if state.entry(key, generation).is_some_and(elsewhere) {
            return None;
        }
        let entry = state.take(key, generation)?;
        state.busy.insert((key.to_owned(), generation));
        Some(entry)
    }

    /// Unlinks a detached entry's file and releases its bytes and busy mark.
    fn discard(&self, key: &str, generation: u64, entry: &Entry) -> io::Result<()> {
        let result = unlink(&entry.path);
        self.finish(key, generation, file_len(entry.len));
        result
    }

    /// Ends one read of the file at `path` (see `State::reading`).
    fn end_read(&self, path: &Path) {
        let mut state = self.state.lock();
        if let Some(count) = state.reading.get_mut(path) {
            *count -= 1;
            if *count == 0 {
                state.reading.remove(path);
            }
        }
    }

    /// Keeps a detached entry's file as a spare (marked, see [`spare_mark`]; header zeroed
    /// where the filesystem has no user attributes) while the pool has room and no read of
    /// it is in flight (a detached entry gets no new readers), releasing its bytes and busy
    /// mark; returns false (nothing released) when the file is to be unlinked instead (no
    /// room, being read, or it could be neither marked nor cleared).
    fn recycle(&self, key: &str, generation: u64, entry: &Entry) -> bool {
        let len = file_len(entry.len);
        let reusable = {
            let state = self.state.lock();
            let room = state.stats.spare_bytes + len <= self.spare_limit(&state.stats);
            room && !state.reading.contains_key(&entry.path)
        };
        let marked = || {
            let marked = spare_mark::mark(&entry.path, key, generation);
            marked.or_else(|_| self.clear_header(&entry.path)).is_ok()
        };
        if !reusable || !marked() {
            return false;
        }
        let mut state = self.state.lock();
        state.stats.used_bytes -= len;
        state.busy.remove(&(key.to_owned(), generation));
        state.add_spare(len, entry.path.clone());
        true
    }

    /// Zeroes the header block of the file at `path` (not synced: a record a crash brings
    /// back is one the master no longer lists, so the next mount removes it again).
    fn clear_header(&self, path: &Path) -> io::Result<()> {
        let zero = AlignedBuf::new(BLOCK).map_err(|_| io::Error::from(ErrorKind::OutOfMemory))?;
        let file = self.open_file(path, OpenOptions::new().write(true))?;
        file.write_all_at(zero.as_slice(), 0)
    }

    /// Drops (`key`, `generation`) if indexed in the file at `path` and deletes that file;
    /// returns whether it was.
    fn forget(&self, key: &str, generation: u64, path: &Path) -> bool {
        let entry = self.detach(key, generation, Some(path));
        let discarded = entry.map(|entry| self.discard(key, generation, &entry));
        discarded.is_some()
    }

    /// A read found the record at `path` malformed: counts it and forgets it
    /// (`CHECKSUM_MISMATCH`), or `OBJECT_NOT_FOUND` when a concurrent removal took it (the
    /// file may hold another record by now).
    fn corrupted<T>(&self, path: &Path, key: &str, generation: u64) -> Result<T> {
        if !self.forget(key, generation, path) {
            let msg = format_args!("{key}@{generation} removed");
            return fail(ErrorCode::ObjectNotFound, msg);
        }
        self.state.lock().stats.corrupt += 1;
        let msg = format_args!("{}: malformed record of {key}@{generation}", path.display());
        fail(ErrorCode::ChecksumMismatch, msg)
    }

    /// A read found no file: `FILE_NOT_FOUND` (and the entry dropped) while it is still
    /// indexed, `OBJECT_NOT_FOUND` when a concurrent removal or supersede took it.
    fn vanished<T>(&self, path: &Path, key: &str, generation: u64, err: io::Error) -> Result<T> {
        match self.forget(key, generation, path) {
            true => io_fail(ErrorCode::FileNotFound, path, err),
            false => fail(
                ErrorCode::ObjectNotFound,
                format_args!("{key}@{generation} removed"),
            ),
        }
    }

    /// Counts an I/O error and fails with `code`.
    fn io_error<T>(&self, code: ErrorCode, path: &Path, err: io::Error) -> Result<T> {
        self.state.lock().stats.io_errors += 1;
        io_fail(code, path, err)
    }

    /// ENOSPC / EDQUOT: `NO_AVAILABLE_HANDLE` (counted in `full`); else `FILE_WRITE_FAIL`.
    fn write_error<T>(&self, path: &Path, err: io::Error) -> Result<T> {
        if !matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
            return self.io_error(ErrorCode::FileWriteFail, path, err);
        }
        self.state.lock().stats.full += 1;
        io_fail(ErrorCode::NoAvailableHandle, path, err)
    }

    /// Opens `path` with `options`, adding O_DIRECT where the store uses it.
    fn open_file(&self, path: &Path, options: &mut OpenOptions) -> io::Result<File> {
        if self.direct {
            options.custom_flags(libc::O_DIRECT);
        }
        options.open(path)
    }
}

/// Fails with `code`, naming `path` and the OS error.
fn io_fail<T>(code: ErrorCode, path: &Path, err: io::Error) -> Result<T> {
    fail(code, format_args!("ssd tier: {}: {err}", path.display()))
}

/// Opens and exclusively locks `dir/LOCK`, then writes our pid into it.
///
/// Errors: `FILE_LOCK_FAIL` (naming the holder's pid when another holds it).
fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join("LOCK");
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    let opened = options.open(&path);
    let mut file = opened.or_else(|e| io_fail(ErrorCode::FileLockFail, &path, e))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return io_fail(ErrorCode::FileLockFail, &path, err);
        }
        let mut pid = String::new();
        let _ = file.read_to_string(&mut pid);
        let (dir, pid) = (dir.display(), pid.trim());
        let msg = format!("ssd offload directory {dir} is in use by another process (pid {pid})");
        return fail(ErrorCode::FileLockFail, msg);
    }
    let pid = format!("{}\n", std::process::id());
    let truncated = file.set_len(0);
    let written = truncated.and_then(|()| file.write_all_at(pid.as_bytes(), 0));
    written.or_else(|e| io_fail(ErrorCode::FileLockFail, &path, e))?;
    Ok(file)
}

/// Deletes everything in `dir` (torn writes of a crashed process).
fn clear_dir(dir: &Path) -> Result<()> {
    let entries = fs::read_dir(dir).or_else(|e| io_fail(ErrorCode::FileReadFail, dir, e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let removed = match entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            true => fs::remove_dir_all(&path),
            false => fs::remove_file(&path),
        };
        removed.or_else(|e| io_fail(ErrorCode::FileWriteFail, &path, e))?;
    }
    Ok(())
}

/// Whether the filesystem of `tmp` takes O_DIRECT (tmpfs, for one, refuses it with EINVAL).
fn probe_direct(tmp: &Path) -> bool {
    let path = tmp.join("direct-probe.tmp");
    let Ok(block) = AlignedBuf::new(BLOCK) else {
        return false;
    };
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT);
    let opened = options.open(&path);
    let probe = opened.and_then(|file| file.write_all_at(block.as_slice(), 0));
    let _ = fs::remove_file(&path);
    let refused = probe.is_err_and(|e| e.raw_os_error() == Some(libc::EINVAL));
    if refused {
        tracing::info!(
            "ssd tier: {} refuses O_DIRECT; using buffered I/O",
            tmp.display()
        );
    }
    !refused
}

/// Builds the index from `dir/objects`: records are indexed (a second file of one (key,
/// generation) is deleted), files with a zero header block or a spare mark become spares, malformed files
/// are deleted (counted in `corrupt`); unreadable files are skipped (counted in `io_errors`).
fn scan(dir: &Path) -> Result<State> {
    let mut state = State::default();
    for fan in 0..FANS {
        let fan_dir = dir.join(format!("objects/{fan:02x}"));
        let entries =
            fs::read_dir(&fan_dir).or_else(|e| io_fail(ErrorCode::FileReadFail, &fan_dir, e))?;
        let paths = entries.flatten().map(|entry| entry.path());
        for path in paths.filter(|path| path.extension() == Some("rec".as_ref())) {
            if let Some(number) = file_number(&path) {
                state.next_file = state.next_file.max(number.saturating_add(1));
            }
            let dropped = match inspect(&path) {
                Ok(Found::Record(header)) => {
                    let (key, generation) = (header.key.as_str(), header.generation);
                    match state
                        .index
                        .get_mut(key)
                        .and_then(|g| g.get_mut(&generation))
                    {
                        // Two files of one record: a crash brought back a removed copy (its
                        // file maybe half reused since). Keep one whose payload checks.
                        Some(kept) if !payload_ok(&kept.path, kept.len, kept.crc) => {
                            let used = state.stats.used_bytes - file_len(kept.len);
                            state.stats.used_bytes = used + file_len(header.len);
                            (kept.len, kept.crc) = (header.len, header.payload_crc);
                            let stale = std::mem::replace(&mut kept.path, path);
                            Some(stale)
                        }
                        Some(_) => Some(path),
                        None => {
                            state.stats.used_bytes += file_len(header.len);
                            let entry = Entry {
                                len: header.len,
                                crc: header.payload_crc,
                                path,
                            };
                            state.adopt(key, generation, entry);
                            None
                        }
                    }
                }
                Ok(Found::Spare(len)) => {
                    state.add_spare(len, path);
                    None
                }
                Err(ErrorCode::ChecksumMismatch) => {
                    state.stats.corrupt += 1;
                    Some(path)
                }
                Err(_) => {
                    state.stats.io_errors += 1;
                    None
                }
            };
            if let Some(path) = dropped {
                let _ = fs::remove_file(path);
            }
        }
    }
    Ok(state)
}

/// The number in a file name `{n:016x}.rec` (older stores named files otherwise: `None`).
fn file_number(path: &Path) -> Option<u64> {
    let stem = path.file_stem()?.to_str()?;
    (stem.len() == 16).then(|| u64::from_str_radix(stem, 16).ok())?
}

/// Whether the file at `path` holds a `len`-byte payload of CRC32C `crc`.
fn payload_ok(path: &Path, len: u64, crc: u32) -> bool {
    let mut bytes = vec![0u8; file_len(len) as usize];
    let read = File::open(path).and_then(|file| file.read_exact_at(&mut bytes, 0));
    let payload = bytes.get(BLOCK..BLOCK + len as usize);
    read.is_ok() && payload.is_some_and(|p| crc32c::crc32c(p) == crc)
}

/// The record (key, generation) that the tier file at `path` holds, as the store's next open
/// would index it: `None` for a spare (zero header block or spare mark), a malformed file or
/// one that cannot be read. For tools and tests that look at a tier from outside its process
/// (the file may change under them: a snapshot, not a lease).
pub fn record_in(path: &Path) -> Option<(String, u64)> {
    match inspect(path).ok()? {
        Found::Record(header) => Some((header.key, header.generation)),
        Found::Spare(_) => None,
    }
}

/// What a file in `objects/` holds.
enum Found {
    /// A record with this header.
    Record(Header),
    /// Nothing (a zero header block or a marked record): a spare file of this many bytes.
    Spare(u64),
}

/// Reads a file's header block and checks the file's length against it; a zero header block
/// or a record marked spare (see [`spare_mark`]) is a spare.
///
/// Errors: `CHECKSUM_MISMATCH` for a malformed record; `FILE_READ_FAIL` for I/O errors.
fn inspect(path: &Path) -> Result<Found> {
    let mut block = [0u8; BLOCK];
    let file = File::open(path);
    let read = file.and_then(|file| file.read_exact_at(&mut block, 0).and(file.metadata()));
    let meta = read.or_else(|e| match e.kind() {
        ErrorKind::UnexpectedEof => io_fail(ErrorCode::ChecksumMismatch, path, e),
        _ => io_fail(ErrorCode::FileReadFail, path, e),
    })?;
    if block.iter().all(|&b| b == 0) && meta.len() % BLOCK as u64 == 0 {
        return Ok(Found::Spare(meta.len()));
    }
    let header = decode_header(&block)?;
    if meta.len() != file_len(header.len) {
        let msg = format_args!("{}: length does not match", path.display());
        return fail(ErrorCode::ChecksumMismatch, msg);
    }
    let marked = spare_mark::is_marked(path, &header.key, header.generation);
    match marked.or_else(|e| io_fail(ErrorCode::FileReadFail, path, e))? {
        true => Ok(Found::Spare(meta.len())),
        false => Ok(Found::Record(header)),
    }
}

/// Writes a record (`header` block at 0, `body` after it) with one `pwritev`, finishing a
/// short write with positional writes.
fn write_record_at(file: &File, header: &[u8], body: &[u8]) -> io::Result<()> {
    let iov = [header, body].map(|part| libc::iovec {
        iov_base: part.as_ptr() as *mut libc::c_void,
        iov_len: part.len(),
    });
    let written = loop {
        // SAFETY: both iovecs point at live slices of the given lengths; the fd is open.
        let n = unsafe { libc::pwritev(file.as_raw_fd(), iov.as_ptr(), 2, 0) };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != ErrorKind::Interrupted {
            return Err(err);
        }
    };
    if written < header.len() {
        file.write_all_at(&header[written..], written as u64)?;
        return file.write_all_at(body, header.len() as u64);
    }
    let done = written - header.len();
    file.write_all_at(&body[done.min(body.len())..], written as u64)
}

/// Unlinks `path` (already gone is fine). Not synced: a deleted record that a crash brings
/// back is one the master no longer lists, so the next mount deletes it again.
fn unlink(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode::{ChecksumMismatch, FileNotFound, NoAvailableHandle};
    use crate::error::ErrorCode::{ObjectAlreadyExists, ObjectNotFound};
    use crate::test_util::TempDir;

    fn open(dir: &TempDir, capacity: u64) -> Result<DiskStore> {
        let dir = dir.path().to_path_buf();
        DiskStore::open(DiskStoreOptions { dir, capacity })
    }

    fn random(len: usize) -> Vec<u8> {
        (0..len).map(|_| fastrand::u8(..)).collect()
    }

    fn put(store: &DiskStore, key: &str, generation: u64, bytes: &[u8]) -> Result<()> {
        let mut buf = AlignedBuf::new(bytes.len())?;
        buf.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        buf.zero_tail(bytes.len());
        store.write(key, generation, &buf, bytes.len() as u64)
    }

    fn get(store: &DiskStore, key: &str, generation: u64) -> Result<Vec<u8>> {
        let record = store.read(key, generation)?;
        Ok(record.bytes().to_vec())
    }

    fn path_of(store: &DiskStore, key: &str, generation: u64) -> PathBuf {
        let state = store.state.lock();
        state.entry(key, generation).expect("indexed").path.clone()
    }

    /// Every file in the store's `objects/` tree.
    fn files(dir: &TempDir) -> Vec<PathBuf> {
        let fans = fs::read_dir(dir.path().join("objects")).unwrap().flatten();
        let files = fans.flat_map(|fan| fs::read_dir(fan.path()).unwrap().flatten());
        files.map(|entry| entry.path()).collect()
    }

    fn truncate(path: PathBuf, len: u64) {
        OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }

    fn stored(key: &str, generation: u64, len: u64) -> StoredObject {
        StoredObject {
            key: key.into(),
            generation,
            len,
        }
    }

    #[test]
    fn sizes_round_trip_and_survive_a_reopen() {
        let dir = TempDir::new("disk-roundtrip");
        let sizes = [0, 1, 4095, 4096, 4097, 1 << 20];
        let values: Vec<Vec<u8>> = sizes.iter().map(|&len| random(len)).collect();
        let used: u64 = sizes.iter().map(|&len| file_len(len as u64)).sum();
        let store = open(&dir, 0).unwrap();
        for (i, value) in values.iter().enumerate() {
            let key = format!("k{i}");
            put(&store, &key, 1, value).unwrap();
            assert_eq!(get(&store, &key, 1).unwrap(), *value);
            let on_disk = fs::metadata(path_of(&store, &key, 1)).unwrap().len();
            assert_eq!(on_disk, file_len(value.len() as u64));
        }
        let s = store.stats();
        assert_eq!(
            (s.objects, s.used_bytes, s.writes, s.reads),
            (6, used, 6, 6)
        );
        drop(store);
        let store = open(&dir, 0).unwrap();
        let mut objects = store.objects();
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        let expected = sizes.iter().enumerate();
        let expected = expected.map(|(i, &len)| stored(&format!("k{i}"), 1, len as u64));
        assert_eq!(objects, expected.collect::<Vec<_>>());
        assert_eq!((store.stats().used_bytes, store.stats().corrupt), (used, 0));
        for (i, value) in values.iter().enumerate() {
            let key = format!("k{i}");
            assert!(store.contains(&key, 1) && !store.contains(&key, 2));
            assert_eq!(get(&store, &key, 1).unwrap(), *value);
        }
    }

    #[test]
    fn a_locked_dir_is_refused_and_torn_writes_are_cleared() {
        let dir = TempDir::new("disk-lock");
        let store = open(&dir, 0).unwrap();
        assert_eq!(open(&dir, 0).err(), Some(ErrorCode::FileLockFail));
        let message = crate::error::last_error_message();
        let pid = format!("in use by another process (pid {})", std::process::id());
        assert!(message.contains(&pid), "{message}");
        drop(store);
        fs::create_dir_all(dir.path().join("tmp/sub")).unwrap();
        fs::write(dir.path().join("tmp/7-abc.tmp"), b"torn").unwrap();
        let _store = open(&dir, 0).unwrap();
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn a_read_checks_the_payload_alone_and_refuses_another_records_bytes() {
        let dir = TempDir::new("disk-swap");
        let store = open(&dir, 0).unwrap();
        let values = [random(9_000), random(9_000), random(9_000)];
        for (key, value) in ["a", "b", "c"].iter().zip(&values) {
            put(&store, key, 1, value).unwrap();
        }
        let [a, b, c] = ["a", "b", "c"].map(|key| path_of(&store, key, 1));
        // "a"'s file now holds "b"'s whole record (a file swapped under the index): the
        // payload's CRC is not "a"'s, so the read refuses it.
        fs::copy(&b, &a).unwrap();
        assert_eq!(get(&store, "a", 1).err(), Some(ChecksumMismatch));
        assert_eq!(get(&store, "b", 1).unwrap(), values[1]);
        // A damaged header block is not read: the payload still checks against the CRC the
        // index took when it was written, so the right bytes are served (the next open, which
        // reads headers, drops the record).
        let mut bytes = fs::read(&c).unwrap();
        bytes[10] ^= 0x01;
        fs::write(&c, &bytes).unwrap();
        assert_eq!(get(&store, "c", 1).unwrap(), values[2]);
        // An empty value has no payload block: its header block is checked instead.
        put(&store, "empty", 1, &[]).unwrap();
        assert_eq!(get(&store, "empty", 1).unwrap(), Vec::<u8>::new());
        fs::copy(&b, path_of(&store, "empty", 1)).unwrap();
        assert_eq!(get(&store, "empty", 1).err(), Some(ChecksumMismatch));
        drop(store);
        let store = open(&dir, 0).unwrap();
        assert_eq!(get(&store, "c", 1).err(), Some(ObjectNotFound));
        assert_eq!(get(&store, "b", 1).unwrap(), values[1]);
    }

    #[test]
    fn damaged_records_are_refused_once_then_gone() {
        let dir = TempDir::new("disk-damage");
        let store = open(&dir, 0).unwrap();
        let keys = ["flipped", "truncated", "deleted"];
        for key in keys {
            put(&store, key, 1, &random(10_000)).unwrap();
        }
        let paths = keys.map(|key| path_of(&store, key, 1));
        let mut bytes = fs::read(&paths[0]).unwrap();
        bytes[BLOCK + 5000] ^= 0x40;
        fs::write(&paths[0], &bytes).unwrap();
        truncate(paths[1].clone(), 8192);
        fs::remove_file(&paths[2]).unwrap();
        assert_eq!(get(&store, "flipped", 1).err(), Some(ChecksumMismatch));
        assert_eq!(get(&store, "truncated", 1).err(), Some(ChecksumMismatch));
        assert_eq!(get(&store, "deleted", 1).err(), Some(FileNotFound));
        for (key, path) in keys.iter().zip(&paths) {
            assert_eq!(get(&store, key, 1).err(), Some(ObjectNotFound));
            assert!(!path.exists(), "a damaged file is deleted, never reused");
        }
        let stats = store.stats();
        assert_eq!((stats.corrupt, stats.objects, stats.used_bytes), (2, 0, 0));
    }

    #[test]
    fn open_keeps_every_generation_and_drops_malformed_files() {
        let dir = TempDir::new("disk-scan");
        let store = open(&dir, 0).unwrap();
        put(&store, "a", 1, b"one").unwrap();
        let a1 = path_of(&store, "a", 1);
        let old = fs::read(&a1).unwrap();
        put(&store, "a", 2, b"two").unwrap();
        put(&store, "b", 1, &random(9000)).unwrap();
        let truncated = path_of(&store, "b", 1);
        drop(store);
        let fan = dir.path().join("objects/00");
        let (copy, junk, spare) = (
            fan.join("copy.rec"),
            fan.join("junk.rec"),
            fan.join("x.rec"),
        );
        // A second file of ("a", 1) whose payload was half overwritten (a removed copy a
        // crash brought back after its file was reused); scanned before the good one.
        let mut torn = old.clone();
        torn[BLOCK] ^= 0xff;
        fs::write(&copy, &torn).unwrap();
        let a1_moved = dir.path().join("objects/ff/good.rec");
        fs::rename(&a1, &a1_moved).unwrap();
        fs::write(&junk, random(8192)).unwrap();
        fs::write(&spare, [0u8; 3 * BLOCK]).unwrap();
        truncate(truncated.clone(), 8192);
        let store = open(&dir, 0).unwrap();
        let mut objects = store.objects();
        objects.sort_by_key(|o| o.generation);
        assert_eq!(objects, vec![stored("a", 1, 3), stored("a", 2, 3)]);
        assert!(![&copy, &junk, &truncated].iter().any(|path| path.exists()));
        assert!(a1_moved.exists(), "the copy whose payload checks is kept");
        let s = store.stats();
        assert_eq!(
            (s.corrupt, s.objects, s.used_bytes),
            (2, 2, 2 * file_len(3))
        );
        assert_eq!((s.spare_files, s.spare_bytes), (1, 3 * BLOCK as u64));
        put(&store, "c", 1, &[9u8; 2 * BLOCK]).unwrap();
        assert_eq!((store.stats().reused, path_of(&store, "c", 1)), (1, spare));
        assert_eq!(get(&store, "a", 1).unwrap(), b"one");
        assert_eq!(get(&store, "a", 2).unwrap(), b"two");
    }

    #[test]
    fn capacity_limit_refuses_writes_and_keeps_the_rest() {
        let dir = TempDir::new("disk-full");
        let store = open(&dir, 2 * file_len(4096)).unwrap();
        let (a, b) = (random(4096), random(4096));
        put(&store, "a", 1, &a).unwrap();
        put(&store, "b", 1, &b).unwrap();
        assert_eq!(put(&store, "c", 1, b"x").err(), Some(NoAvailableHandle));
        let s = store.stats();
        assert_eq!(
            (s.full, s.objects, s.used_bytes),
            (1, 2, 2 * file_len(4096))
        );
        assert_eq!(get(&store, "a", 1).unwrap(), a);
        assert_eq!(get(&store, "b", 1).unwrap(), b);
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
        assert_eq!(store.remove("a", 1), Ok(true));
        put(&store, "c", 1, b"x").unwrap(); // into a's file
        assert_eq!(store.stats().reused, 1);
    }

    /// A removed record's file is kept as a spare and overwritten by the next record of its
    /// length; spares give way when a record of another length needs their room.
    #[test]
    fn removed_files_are_reused_and_give_way_to_new_ones() {
        let dir = TempDir::new("disk-spare");
        let store = open(&dir, 3 * file_len(4096)).unwrap();
        put(&store, "a", 1, &random(4096)).unwrap();
        put(&store, "b", 1, &random(4096)).unwrap();
        let a_file = path_of(&store, "a", 1);
        assert_eq!(store.remove("a", 1), Ok(true));
        let s = store.stats();
        assert_eq!((s.objects, s.spare_files), (1, 1));
        assert_eq!(
            (s.used_bytes, s.spare_bytes),
            (file_len(4096), file_len(4096))
        );
        let zeroed = fs::read(&a_file).unwrap()[..BLOCK] == [0u8; BLOCK];
        assert!(zeroed || spare_mark::is_marked(&a_file, "a", 1).unwrap());
        // Reopened, the marked file is a spare again; the next 4 KiB record overwrites it.
        drop(store);
        let store = open(&dir, 3 * file_len(4096)).unwrap();
        assert_eq!(store.stats().spare_files, 1);
        let c = random(4000);
        put(&store, "c", 1, &c).unwrap();
        assert_eq!((path_of(&store, "c", 1), store.stats().reused), (a_file, 1));
        assert_eq!(get(&store, "c", 1).unwrap(), c);
        // An 8 KiB record fits only once the spare left by "c" is unlinked.
        assert_eq!(store.remove("c", 1), Ok(true));
        let d = random(8192);
        put(&store, "d", 1, &d).unwrap();
        let s = store.stats();
        assert_eq!((s.objects, s.spare_files, s.reused), (2, 0, 1));
        assert_eq!(s.used_bytes, file_len(4096) + file_len(8192));
        assert_eq!(files(&dir).len(), 2);
        assert_eq!(get(&store, "d", 1).unwrap(), d);
    }

    /// A spare mark left on a reused file (a crash before it came off) names the record the
    /// spare held, so the record written over it is still found by the next open.
    #[test]
    fn a_stale_spare_mark_does_not_hide_the_record_written_over_it() {
        let dir = TempDir::new("disk-stale-mark");
        let store = open(&dir, 0).unwrap();
        put(&store, "a", 1, &random(4096)).unwrap();
        let file = path_of(&store, "a", 1);
        assert_eq!(store.remove("a", 1), Ok(true));
        let c = random(4096);
        put(&store, "c", 7, &c).unwrap();
        assert_eq!(
            (path_of(&store, "c", 7), store.stats().reused),
            (file.clone(), 1)
        );
        assert!(!spare_mark::is_marked(&file, "a", 1).unwrap());
        if spare_mark::mark(&file, "a", 1).is_err() {
            return; // no user attributes here: headers are zeroed instead
        }
        drop(store);
        let store = open(&dir, 0).unwrap();
        assert_eq!(get(&store, "c", 7).unwrap(), c);
        assert_eq!(store.stats().spare_files, 0);
    }

    /// A file with a read in flight is not made a spare: its removal unlinks it (the reader
    /// keeps the inode), so no record can be written into it under the reader.
    #[test]
    fn a_file_being_read_is_unlinked_not_reused() {
        let dir = TempDir::new("disk-reading");
        let store = open(&dir, 0).unwrap();
        put(&store, "a", 1, &random(5000)).unwrap();
        let file = path_of(&store, "a", 1);
        // What `read` registers between its lookup and its read.
        *store.state.lock().reading.entry(file.clone()).or_default() += 1;
        assert_eq!(store.remove("a", 1), Ok(true));
        store.end_read(&file);
        let s = store.stats();
        assert_eq!((s.spare_files, s.used_bytes, s.objects), (0, 0, 0));
        assert!(!file.exists() && store.state.lock().reading.is_empty());
        put(&store, "b", 1, &random(5000)).unwrap();
        assert_ne!(path_of(&store, "b", 1), file);
    }

    /// A read that raced a removal whose file was reused by another record is a miss, not a
    /// corruption: the other record stays.
    #[test]
    fn a_read_of_a_reused_file_is_a_miss_for_the_removed_record() {
        let dir = TempDir::new("disk-reuse-race");
        let store = open(&dir, 0).unwrap();
        put(&store, "a", 1, &random(5000)).unwrap();
        let stale = path_of(&store, "a", 1);
        assert_eq!(store.remove("a", 1), Ok(true));
        let b = random(5000);
        put(&store, "b", 1, &b).unwrap();
        assert_eq!(path_of(&store, "b", 1), stale);
        // What `read` does when the header it finds names another record.
        let missed = store.corrupted::<()>(&stale, "a", 1).err();
        assert_eq!((missed, store.stats().corrupt), (Some(ObjectNotFound), 0));
        assert_eq!(get(&store, "b", 1).unwrap(), b);
    }

    /// A newer generation never deletes an older one: a reader pinned to the older record
    /// (a session, an on-stream get) keeps its bytes until the master deletes it.
    #[test]
    fn generations_coexist_until_each_is_removed() {
        let dir = TempDir::new("disk-gen");
        let store = open(&dir, 0).unwrap();
        let (older, newer) = (random(5000), random(100));
        put(&store, "a", 1, &older).unwrap();
        put(&store, "a", 2, &newer).unwrap();
        assert_eq!(get(&store, "a", 1).unwrap(), older);
        assert_eq!(get(&store, "a", 2).unwrap(), newer);
        for generation in [1, 2] {
            let refused = put(&store, "a", generation, b"again").err();
            assert_eq!(refused, Some(ObjectAlreadyExists));
        }
        let s = store.stats();
        assert_eq!(
            (s.objects, s.used_bytes),
            (2, file_len(5000) + file_len(100))
        );
        assert_eq!(store.remove("a", 1), Ok(true));
        assert_eq!(store.stats().spare_files, 1);
        assert_eq!(get(&store, "a", 1).err(), Some(ObjectNotFound));
        assert_eq!(get(&store, "a", 2).unwrap(), newer);
        assert_eq!(store.stats().objects, 1);
    }

    #[test]
    fn remove_respects_generations() {
        let dir = TempDir::new("disk-remove");
        let store = open(&dir, 0).unwrap();
        put(&store, "a", 3, b"three").unwrap();
        put(&store, "b", 1, b"bee").unwrap();
        put(&store, "c", 1, b"sea").unwrap();
        for other in [2, 4] {
            assert_eq!(store.remove("a", other), Ok(false));
            assert!(store.contains("a", 3));
        }
        assert_eq!(store.remove("a", 3), Ok(true));
        assert!(!store.contains("a", 3));
        assert_eq!(store.remove("a", 3), Ok(false));
        assert_eq!(get(&store, "a", 3).err(), Some(ObjectNotFound));
        assert_eq!(store.remove_all(), 2);
        let s = store.stats();
        assert_eq!((s.objects, s.used_bytes, s.spare_files), (0, 0, 3));
        put(&store, "a", 3, b"again").unwrap();
        assert_eq!(get(&store, "a", 3).unwrap(), b"again");
    }

    #[test]
    fn concurrent_writers_of_one_key_keep_every_generation() {
        let dir = TempDir::new("disk-race");
        let store = open(&dir, 0).unwrap();
        std::thread::scope(|scope| {
            for generation in 1..=8u64 {
                let store = &store;
                scope.spawn(move || put(store, "k", generation, &[generation as u8; 5000]));
            }
        });
        let mut objects = store.objects();
        objects.sort_by_key(|o| o.generation);
        let expected: Vec<StoredObject> = (1..=8).map(|g| stored("k", g, 5000)).collect();
        assert_eq!(objects, expected);
        for generation in 1..=8u64 {
            let value = get(&store, "k", generation).unwrap();
            assert_eq!(value, vec![generation as u8; 5000]);
        }
        assert_eq!(store.stats().used_bytes, 8 * file_len(5000));
        assert_eq!(files(&dir).len(), 8);
    }
}
