//! The local SSD tier's record store: one crash-safe file per object in a directory that one
//! process owns (an exclusive `flock` on `dir/LOCK`, held for the store's life).
//!
//! Layout: `dir/objects/{h:02x}/{hash:016x}-{generation}.rec` (format in [`record`]; `dir/tmp`
//! holds the O_DIRECT probe). A record is written in place, `fdatasync`ed and its directory
//! synced before [`DiskStore::write`] returns, and its owner reports it to the master only
//! after that. A crash may leave a record torn: `open` deletes one whose length or header is
//! wrong, a read rejects one whose bytes are (payload CRC, checked on every read), and the
//! master never lists one it did not accept, so the next mount deletes it.
//!
//! Thread-safety: [`DiskStore`] is `Send + Sync`. One mutex guards the index, the byte
//! accounting and the counters; it is a leaf and never held across disk I/O. A (key,
//! generation) with file I/O in flight is marked busy, so concurrent callers never create or
//! unlink the same path. Generations of one key coexist: only [`DiskStore::remove`] (the
//! master's deletion task) or a failed check deletes a record.

mod record;

use crate::error::{fail, ErrorCode, Result};
use parking_lot::Mutex;
use record::{decode_header, encode_header, file_len, record_name, round_up, Header, BLOCK};
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

    /// Zeroes the bytes from `from` to the end (the padding after a `from`-byte value).
    pub(crate) fn zero_tail(&mut self, from: usize) {
        let from = from.min(self.capacity());
        self.as_mut_slice()[from..].fill(0);
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
    /// The configured capacity (0 = unlimited).
    pub capacity: u64,
    /// Records written.
    pub writes: u64,
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

/// A verified record read from disk; owns its buffer, [`bytes`](Self::bytes) borrows it.
pub(crate) struct ReadRecord {
    buf: AlignedBuf,
    len: usize,
}

impl ReadRecord {
    /// The payload (exactly the stored length), without a copy.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[BLOCK..BLOCK + self.len]
    }
}

/// An indexed record file.
struct Entry {
    len: u64,
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
    /// Counters; `used_bytes` is the accounting itself, `objects` counts the index,
    /// `capacity` is unused.
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

/// The record store; see the module documentation. Dropping it closes the lock file, which
/// releases the directory.
pub(crate) struct DiskStore {
    dir: PathBuf,
    capacity: u64,
    /// Whether files are opened with O_DIRECT (false where the filesystem refuses it).
    direct: bool,
    _lock: File,
    state: Mutex<State>,
}

impl DiskStore {
    /// Opens (creating if needed) the store in `options.dir`, locks it, deletes torn writes
    /// in `tmp` and rebuilds the index from the record headers (malformed records are
    /// deleted and counted in `corrupt`; of two records of one key the newer is kept).
    ///
    /// Errors: `FILE_LOCK_FAIL` when another open store (any process, this one included)
    /// holds the directory; `FILE_OPEN_FAIL` when directories cannot be created;
    /// `FILE_READ_FAIL` / `FILE_WRITE_FAIL` when scanning or cleaning fails.
    pub(crate) fn open(options: DiskStoreOptions) -> Result<DiskStore> {
        let dir = options.dir;
        let subdirs = (0..256).map(|fan| format!("objects/{fan:02x}"));
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
    /// errors (counted in `io_errors`). No file is left behind on failure.
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
        self.reserve(key, generation, need)?;
        let body = &payload.as_slice()[..padded as usize];
        let written = self.write_file(key, generation, &header, body);
        let path = written.inspect_err(|_| self.finish(key, generation, need))?;
        self.publish(key, generation, len, path);
        Ok(())
    }

    /// Reads and verifies (`key`, `generation`). A record found corrupt or missing is dropped
    /// from the index and its file deleted, so it is never served again.
    ///
    /// Errors: `OBJECT_NOT_FOUND` when that generation is not indexed (or was removed while
    /// reading); `FILE_NOT_FOUND` when its file vanished; `CHECKSUM_MISMATCH` for a short
    /// file, a wrong header or payload CRC (counted in `corrupt`); `FILE_READ_FAIL` for other
    /// I/O errors (counted in `io_errors`).
    pub(crate) fn read(&self, key: &str, generation: u64) -> Result<ReadRecord> {
        let state = self.state.lock();
        let found = state
            .entry(key, generation)
            .map(|e| (e.len, e.path.clone()));
        drop(state);
        let Some((len, path)) = found else {
            return fail(
                ErrorCode::ObjectNotFound,
                format_args!("{key}@{generation}"),
            );
        };
        let total = file_len(len) as usize;
        let mut buf = AlignedBuf::new(total)?;
        let file = self.open_file(&path, OpenOptions::new().read(true));
        match file.and_then(|file| file.read_exact_at(&mut buf.as_mut_slice()[..total], 0)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return self.vanished(&path, key, generation, e)
            }
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                return self.corrupted(&path, key, generation)
            }
            Err(e) => return self.io_error(ErrorCode::FileReadFail, &path, e),
        }
        let record = ReadRecord {
            buf,
            len: len as usize,
        };
        let same = |h: Header| h.key == key && h.generation == generation && h.len == len;
        let crc = crc32c::crc32c(record.bytes());
        if !decode_header(record.buf.as_slice()).is_ok_and(|h| h.payload_crc == crc && same(h)) {
            return self.corrupted(&path, key, generation);
        }
        self.state.lock().stats.reads += 1;
        Ok(record)
    }

    /// Removes the record (`key`, `generation`); returns whether it was indexed.
    ///
    /// Errors: `FILE_WRITE_FAIL` when the file cannot be unlinked (counted in `io_errors`;
    /// the record is no longer indexed either way).
    pub(crate) fn remove(&self, key: &str, generation: u64) -> Result<bool> {
        let Some(entry) = self.detach(key, generation) else {
            return Ok(false);
        };
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
    /// fit, then reserves them and marks the pair busy.
    fn reserve(&self, key: &str, generation: u64, need: u64) -> Result<()> {
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
        Ok(())
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
        Ok(self.state.lock().stats.used_bytes.saturating_add(free))
    }

    /// Refuses a write that would leave less than [`FREE_RESERVE`] free on the filesystem.
    fn check_free(&self, need: u64) -> Result<()> {
        let free = self.filesystem_free()?;
        if free < need.saturating_add(FREE_RESERVE) {
            self.state.lock().stats.full += 1;
            return fail(
                ErrorCode::NoAvailableHandle,
                format_args!("{free} B free on disk"),
            );
        }
        Ok(())
    }

    /// Checks the free space, writes the record in place, syncs it (`fdatasync`) and its
    /// directory; returns its path. Leaves no file behind on failure.
    fn write_file(
        &self,
        key: &str,
        generation: u64,
        header: &AlignedBuf,
        body: &[u8],
    ) -> Result<PathBuf> {
        self.check_free(file_len(body.len() as u64))?;
        let (fan, name) = record_name(key, generation);
        let path = self.dir.join("objects").join(fan).join(name);
        // The pair is reserved and not indexed: a file of that name is a crash's leftover.
        let mut options = OpenOptions::new();
        let written = self.open_file(&path, options.write(true).create(true).truncate(true));
        let written = written.and_then(|file| {
            file.write_all_at(header.as_slice(), 0)?;
            file.write_all_at(body, BLOCK as u64)?;
            file.sync_data()
        });
        if let Err(e) = written.and_then(|()| sync_parent(&path)) {
            let _ = fs::remove_file(&path);
            return self.write_error(&path, e);
        }
        Ok(path)
    }

    /// Indexes a written record and ends its busy mark (the pair was reserved, so it is
    /// not indexed yet).
    fn publish(&self, key: &str, generation: u64, len: u64, path: PathBuf) {
        let mut state = self.state.lock();
        state.busy.remove(&(key.to_owned(), generation));
        let indexed = state.adopt(key, generation, Entry { len, path });
        state.stats.writes += u64::from(indexed);
    }

    /// Releases `bytes` and ends the busy mark of (`key`, `generation`).
    fn finish(&self, key: &str, generation: u64, bytes: u64) {
        let mut state = self.state.lock();
        state.stats.used_bytes -= bytes;
        state.busy.remove(&(key.to_owned(), generation));
    }

    /// Takes (`key`, `generation`) out of the index, marking it busy until
    /// [`discard`](Self::discard).
    fn detach(&self, key: &str, generation: u64) -> Option<Entry> {
        let mut state = self.state.lock();
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

    /// Drops (`key`, `generation`) if indexed and deletes its file; returns whether it was.
    fn forget(&self, key: &str, generation: u64) -> bool {
        let entry = self.detach(key, generation);
        let discarded = entry.map(|entry| self.discard(key, generation, &entry));
        discarded.is_some()
    }

    /// A read found the record at `path` malformed: counts it and forgets it.
    fn corrupted<T>(&self, path: &Path, key: &str, generation: u64) -> Result<T> {
        self.state.lock().stats.corrupt += 1;
        self.forget(key, generation);
        let msg = format_args!("{}: malformed record of {key}@{generation}", path.display());
        fail(ErrorCode::ChecksumMismatch, msg)
    }

    /// A read found no file: `FILE_NOT_FOUND` (and the entry dropped) while it is still
    /// indexed, `OBJECT_NOT_FOUND` when a concurrent removal or supersede took it.
    fn vanished<T>(&self, path: &Path, key: &str, generation: u64, err: io::Error) -> Result<T> {
        match self.forget(key, generation) {
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

/// Builds the index from `dir/objects`, deleting malformed records (counted in `corrupt`);
/// unreadable files are skipped (counted in `io_errors`).
fn scan(dir: &Path) -> Result<State> {
    let mut state = State::default();
    for fan in 0..256 {
        let fan_dir = dir.join(format!("objects/{fan:02x}"));
        let entries =
            fs::read_dir(&fan_dir).or_else(|e| io_fail(ErrorCode::FileReadFail, &fan_dir, e))?;
        let paths = entries.flatten().map(|entry| entry.path());
        for path in paths.filter(|path| path.extension() == Some("rec".as_ref())) {
            let dropped = match inspect(&path) {
                Ok(header) => {
                    state.stats.used_bytes += file_len(header.len);
                    let entry = Entry {
                        len: header.len,
                        path,
                    };
                    // A file's name is its (key, generation): each pair is seen once.
                    state.adopt(&header.key, header.generation, entry);
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

/// Decodes a record file's header and checks the file's length and name against it.
///
/// Errors: `CHECKSUM_MISMATCH` for a malformed record; `FILE_READ_FAIL` for I/O errors.
fn inspect(path: &Path) -> Result<Header> {
    let mut block = [0u8; BLOCK];
    let file = File::open(path);
    let read = file.and_then(|file| file.read_exact_at(&mut block, 0).and(file.metadata()));
    let meta = read.or_else(|e| match e.kind() {
        ErrorKind::UnexpectedEof => io_fail(ErrorCode::ChecksumMismatch, path, e),
        _ => io_fail(ErrorCode::FileReadFail, path, e),
    })?;
    let header = decode_header(&block)?;
    let (fan, name) = record_name(&header.key, header.generation);
    if meta.len() != file_len(header.len) || !path.ends_with(Path::new(&fan).join(name)) {
        let msg = format_args!("{}: length or name does not match", path.display());
        return fail(ErrorCode::ChecksumMismatch, msg);
    }
    Ok(header)
}

/// Unlinks `path` (already gone is fine). Not synced: a deleted record that a crash brings
/// back is one the master no longer lists, so the next mount deletes it again.
fn unlink(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Syncs the directory holding `path` (makes the creation of a record in it durable).
fn sync_parent(path: &Path) -> io::Result<()> {
    File::open(path.parent().unwrap_or(Path::new("."))).and_then(|dir| dir.sync_all())
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

    fn path_of(dir: &TempDir, key: &str, generation: u64) -> PathBuf {
        let (fan, name) = record_name(key, generation);
        dir.path().join("objects").join(fan).join(name)
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
            let on_disk = fs::metadata(path_of(&dir, &key, 1)).unwrap().len();
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
    fn damaged_records_are_refused_once_then_gone() {
        let dir = TempDir::new("disk-damage");
        let store = open(&dir, 0).unwrap();
        for key in ["flipped", "truncated", "deleted"] {
            put(&store, key, 1, &random(10_000)).unwrap();
        }
        let mut bytes = fs::read(path_of(&dir, "flipped", 1)).unwrap();
        bytes[BLOCK + 5000] ^= 0x40;
        fs::write(path_of(&dir, "flipped", 1), &bytes).unwrap();
        truncate(path_of(&dir, "truncated", 1), 8192);
        fs::remove_file(path_of(&dir, "deleted", 1)).unwrap();
        assert_eq!(get(&store, "flipped", 1).err(), Some(ChecksumMismatch));
        assert_eq!(get(&store, "truncated", 1).err(), Some(ChecksumMismatch));
        assert_eq!(get(&store, "deleted", 1).err(), Some(FileNotFound));
        for key in ["flipped", "truncated", "deleted"] {
            assert_eq!(get(&store, key, 1).err(), Some(ObjectNotFound));
            assert!(!path_of(&dir, key, 1).exists());
        }
        let stats = store.stats();
        assert_eq!((stats.corrupt, stats.objects, stats.used_bytes), (2, 0, 0));
    }

    #[test]
    fn open_keeps_every_generation_and_drops_malformed_files() {
        let dir = TempDir::new("disk-scan");
        let store = open(&dir, 0).unwrap();
        put(&store, "a", 1, b"one").unwrap();
        let old = fs::read(path_of(&dir, "a", 1)).unwrap();
        put(&store, "a", 2, b"two").unwrap();
        put(&store, "b", 1, &random(9000)).unwrap();
        drop(store);
        fs::write(path_of(&dir, "z", 5), &old).unwrap(); // its header says ("a", 1)
        truncate(path_of(&dir, "b", 1), 8192);
        let store = open(&dir, 0).unwrap();
        let mut objects = store.objects();
        objects.sort_by_key(|o| o.generation);
        assert_eq!(objects, vec![stored("a", 1, 3), stored("a", 2, 3)]);
        for (key, generation) in [("z", 5), ("b", 1)] {
            assert!(!path_of(&dir, key, generation).exists(), "{key}");
        }
        let s = store.stats();
        assert_eq!(
            (s.corrupt, s.objects, s.used_bytes),
            (2, 2, 2 * file_len(3))
        );
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
        put(&store, "c", 1, b"x").unwrap();
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
        assert!(!path_of(&dir, "a", 1).exists());
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
        assert!(!store.contains("a", 3) && !path_of(&dir, "a", 3).exists());
        assert_eq!(store.remove("a", 3), Ok(false));
        assert_eq!(get(&store, "a", 3).err(), Some(ObjectNotFound));
        assert_eq!(store.remove_all(), 2);
        assert_eq!((store.stats().objects, store.stats().used_bytes), (0, 0));
        assert!(!path_of(&dir, "b", 1).exists() && !path_of(&dir, "c", 1).exists());
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
        let fan_dir = path_of(&dir, "k", 8).parent().unwrap().to_path_buf();
        assert_eq!(fs::read_dir(fan_dir).unwrap().count(), 8);
    }
}
