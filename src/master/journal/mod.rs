//! The master's journal (`--journal_dir`): what must survive a restart, appended as records,
//! made durable by group commit, replayed at start, compacted into snapshots.
//!
//! - [`Journal::append`] encodes a record into the pending batch and returns its LSN; it never
//!   waits for the disk. Callers append under the lock that orders the change (an object's
//!   shard, the segment registry), so records of one key or segment are in the order the
//!   changes happened.
//! - One flusher thread writes the pending batch, `fdatasync`s it and publishes the durable
//!   LSN; appends that arrive meanwhile form the next batch (group commit). After each flush
//!   it releases the ranges waiting at the [`FreeGate`]: a range dropped after record `n` was
//!   appended is reused only once `n` is durable. So a range is freed only after its removal
//!   is on disk, while a commit may be acknowledged before it is (a crash may lose the
//!   newest commits, never resurrect a key over reused bytes).
//! - A failed write or sync is retried (the file cut back to its length before the batch)
//!   every 100 ms; meanwhile nothing becomes durable, no range is freed, and
//!   [`Journal::is_failing`] tells the master to refuse new writes.
//! - Logs rotate at `rotate_bytes`; when closed logs exceed `compact_bytes`, a compactor
//!   thread folds the snapshot and the closed logs into a new snapshot and deletes them.
//! - Standby masters copy the files ([`Journal::files`], [`Journal::read_file`]) and report
//!   how far their copy is durable ([`Journal::follower_ack`]). While followers are
//!   registered, "safe" means durable here *and* at every follower: freed ranges wait for
//!   it, and so does [`Journal::wait_durable`]. So a standby promoted after this master dies
//!   knows every removal whose range was reused. The HA layer drops a follower that stopped
//!   copying ([`Journal::drop_follower`]) after recording in etcd that it is out of sync.
//!
//! Thread-safety: `Journal` is `Send + Sync`. The pending batch's mutex is a leaf (nothing
//! else is locked while it is held), so appends may run under any master lock.

mod files;
mod frame;
mod record;

pub(crate) use files::{is_journal_file, snapshot_lsn, sync_dir, TornTail};
pub(crate) use record::{DiskCopy, JournalState, ObjectRecord, Record, ReplicaRecord};

use crate::alloc::FreeGate;
use crate::error::{fail, ErrorCode, Result};
use crate::types::ClientId;
use files::{fold, list, log_path, remove_all, write_snapshot};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long [`Journal::wait_durable`] waits before it gives up, by default
/// ([`JournalOptions::safe_wait`]).
const DURABLE_WAIT: Duration = Duration::from_secs(5);
/// Longest a standby's poll ([`Journal::wait_beyond`]) waits for new durable records.
pub(crate) const FOLLOWER_POLL: Duration = Duration::from_millis(100);
/// How long a standby's poll lets new records gather while nobody waits for them to be safe
/// (a removal waiting answers it at once): fewer, larger copy rounds under a write load.
const FOLLOWER_BATCH: Duration = Duration::from_millis(10);
/// Most bytes one [`Journal::read_file`] answer carries.
pub(crate) const MAX_READ: u64 = 4 << 20;
/// Pause between attempts after a failed write or sync.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Shortest time between two group commits while nobody waits in [`Journal::wait_durable`]:
/// appends arriving meanwhile join the next batch (fewer syncs under a write load). A caller
/// that starts waiting ends the pause: removals are acknowledged a sync later, not a pause.
const FLUSH_SPACING: Duration = Duration::from_millis(1);

/// Where and how the journal keeps its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalOptions {
    /// The directory (created if missing). One master per directory.
    pub dir: PathBuf,
    /// A log file is closed and a new one started once it holds this many bytes.
    pub rotate_bytes: u64,
    /// Closed logs are folded into a snapshot once they hold this many bytes.
    pub compact_bytes: u64,
    /// Longest a removal's acknowledgement or a write's grant waits for a record to be safe
    /// (5 s). An HA leader needs more than the time it takes to stop waiting for a silent
    /// standby (see `crate::ha::member`), so that such a standby delays writes, never fails them.
    pub safe_wait: Duration,
}

impl JournalOptions {
    /// Defaults: 64 MiB logs, compaction past 256 MiB of closed logs.
    pub fn new(dir: impl Into<PathBuf>) -> JournalOptions {
        JournalOptions {
            dir: dir.into(),
            rotate_bytes: 64 << 20,
            compact_bytes: 256 << 20,
            safe_wait: DURABLE_WAIT,
        }
    }
}

/// The length of the whole records at the start of `log_bytes` and the LSN of the last one.
pub(crate) fn last_whole_record(log_bytes: &[u8]) -> (u64, Option<u64>) {
    let scan = frame::scan_log(log_bytes);
    let last = scan.records.last().map(|(lsn, _)| *lsn);
    (scan.valid_len, last)
}

/// Counters of a journal (all since this process opened it). Plain data.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct JournalMetrics {
    pub records: u64,
    pub bytes_written: u64,
    pub flushes: u64,
    pub durable_lsn: u64,
    pub write_errors: u64,
    pub compactions: u64,
    /// Freed ranges waiting for their removal to be durable.
    pub held_ranges: u64,
    /// Records replayed at open, and the bytes cut from a torn tail then.
    pub replayed_records: u64,
    pub torn_tail_bytes: u64,
    /// Size of the newest snapshot this process wrote (0: none yet).
    pub snapshot_bytes: u64,
}

impl JournalMetrics {
    /// Prometheus series: `(name, kind, help, value)`.
    pub(crate) fn series(&self) -> Vec<(&'static str, &'static str, &'static str, u64)> {
        vec![
            (
                "journal_records_total",
                "counter",
                "Records journaled",
                self.records,
            ),
            (
                "journal_bytes_written_total",
                "counter",
                "Journal bytes written",
                self.bytes_written,
            ),
            (
                "journal_flushes_total",
                "counter",
                "Journal group commits (fdatasync)",
                self.flushes,
            ),
            (
                "journal_durable_lsn",
                "gauge",
                "Last durable journal record",
                self.durable_lsn,
            ),
            (
                "journal_write_errors_total",
                "counter",
                "Failed journal writes",
                self.write_errors,
            ),
            (
                "journal_compactions_total",
                "counter",
                "Journal compactions",
                self.compactions,
            ),
            (
                "journal_held_ranges",
                "gauge",
                "Freed ranges waiting for a durable removal",
                self.held_ranges,
            ),
            (
                "journal_replayed_records",
                "gauge",
                "Records replayed at start",
                self.replayed_records,
            ),
            (
                "journal_torn_tail_bytes",
                "gauge",
                "Bytes cut from a torn tail at start",
                self.torn_tail_bytes,
            ),
            (
                "journal_snapshot_bytes",
                "gauge",
                "Size of the newest snapshot written",
                self.snapshot_bytes,
            ),
        ]
    }
}

/// One file of a journal directory, as a standby copies it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JournalFile {
    /// File name (a snapshot or a log; nothing else is listed).
    pub name: String,
    /// Bytes in it now.
    pub len: u64,
}

/// A standby copying this journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Follower {
    /// Records its copy holds durably.
    pub acked: u64,
    /// When it last reported.
    pub seen: Instant,
    /// The last record appended when it registered: ranges freed by earlier removals may
    /// have been reused without waiting for it, so its copy is complete (it may take over)
    /// only once `acked` reaches this.
    pub joined: u64,
}

/// What opening a journal found.
#[derive(Debug)]
pub(crate) struct Replayed {
    /// The state to start from (settled: only replicas of current mounts).
    pub state: JournalState,
    pub torn: Option<TornTail>,
}

struct Pending {
    buf: Vec<u8>,
    next_lsn: u64,
    records: u64,
}

#[derive(Default)]
struct Counters {
    bytes_written: AtomicU64,
    flushes: AtomicU64,
    write_errors: AtomicU64,
    compactions: AtomicU64,
    replayed_records: AtomicU64,
    torn_tail_bytes: AtomicU64,
    snapshot_bytes: AtomicU64,
}

struct Shared {
    options: JournalOptions,
    pending: Mutex<Pending>,
    /// Signalled when the pending batch gains a record or the journal stops.
    wake: Condvar,
    durable_lsn: AtomicU64,
    durable_lock: Mutex<()>,
    /// Signalled after each flush, each follower report, and when a caller starts waiting
    /// in [`Journal::wait_durable`].
    durable: Condvar,
    /// Callers inside [`Journal::wait_durable`] (a standby's poll answers at once then, and
    /// the flusher does not pause).
    safe_waiters: AtomicUsize,
    /// Signalled (with `durable_lock`) when a caller starts waiting in
    /// [`Journal::wait_durable`]: ends the flusher's pause between group commits.
    hurry: Condvar,
    gate: Arc<FreeGate>,
    /// Standbys copying the journal (see the module documentation).
    followers: Mutex<HashMap<ClientId, Follower>>,
    stop: AtomicBool,
    failing: AtomicBool,
    compacting: AtomicBool,
    /// The compaction thread started last (spawned by the flusher, joined by
    /// [`Journal::shutdown`] so that no compaction outlives the journal: one left running
    /// would read and delete files under the next open of the directory).
    compactor: Mutex<Option<JoinHandle<()>>>,
    counters: Counters,
}

/// An open journal. Dropping it flushes what is pending and stops its threads.
pub(crate) struct Journal {
    shared: Arc<Shared>,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

/// The log file being appended to (owned by the flusher thread).
struct Active {
    file: File,
    path: PathBuf,
    len: u64,
    /// Bytes in closed logs not yet handed to a compaction.
    closed_bytes: u64,
}

impl Journal {
    /// Opens (or creates) the journal in `options.dir`: replays the snapshot and the logs,
    /// cuts a torn tail of the newest log (reported in [`Replayed::torn`]), starts a fresh
    /// log and the flusher. Dropped ranges wait at `gate`. Errors: `INTERNAL_ERROR` naming
    /// the file for an unusable directory or corruption other than a torn tail (nothing is
    /// changed then, except the cut of a torn tail).
    pub(crate) fn open(
        options: JournalOptions,
        gate: Arc<FreeGate>,
    ) -> Result<(Journal, Replayed)> {
        if let Err(error) = std::fs::create_dir_all(&options.dir) {
            return fail(
                ErrorCode::InternalError,
                format!("journal: cannot create {}: {error}", options.dir.display()),
            );
        }
        let listing = list(&options.dir)?;
        remove_all(listing.stale);
        let folded = fold(listing.snapshot.as_ref(), &listing.logs, true)?;
        let mut state = folded.state;
        state.settle();
        if let Some(torn) = &folded.torn {
            tracing::warn!(
                path = %torn.path.display(), kept = torn.kept, cut = torn.cut,
                reason = %torn.reason, "journal: cut a torn tail"
            );
        }
        let next_lsn = folded.last_lsn + 1;
        let path = log_path(&options.dir, next_lsn);
        let file = match File::options().create(true).append(true).open(&path) {
            Ok(file) => file,
            Err(error) => {
                return fail(
                    ErrorCode::InternalError,
                    format!("journal: cannot create {}: {error}", path.display()),
                )
            }
        };
        sync_dir(&options.dir)?;
        let closed_bytes = listing.logs.iter().map(|log| file_len(&log.path)).sum();
        gate.stamp(folded.last_lsn);
        let counters = Counters::default();
        counters
            .replayed_records
            .store(folded.records, Ordering::Relaxed);
        let torn_bytes = folded.torn.as_ref().map_or(0, |torn| torn.cut);
        counters
            .torn_tail_bytes
            .store(torn_bytes, Ordering::Relaxed);
        let shared = Arc::new(Shared {
            options,
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                next_lsn,
                records: 0,
            }),
            wake: Condvar::new(),
            durable_lsn: AtomicU64::new(folded.last_lsn),
            durable_lock: Mutex::new(()),
            durable: Condvar::new(),
            safe_waiters: AtomicUsize::new(0),
            hurry: Condvar::new(),
            gate,
            followers: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            failing: AtomicBool::new(false),
            compacting: AtomicBool::new(false),
            compactor: Mutex::new(None),
            counters,
        });
        let active = Active {
            file,
            path,
            len: 0,
            closed_bytes,
        };
        let flusher = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("mc-journal".into())
                .spawn(move || shared.run_flusher(active))
        };
        let flusher = match flusher {
            Ok(handle) => handle,
            Err(error) => {
                return fail(
                    ErrorCode::InternalError,
                    format!("journal: no flusher thread: {error}"),
                )
            }
        };
        let journal = Journal {
            shared,
            flusher: Mutex::new(Some(flusher)),
        };
        let replayed = Replayed {
            state,
            torn: folded.torn,
        };
        Ok((journal, replayed))
    }

    /// Appends `record`; returns its LSN. Never waits for the disk.
    pub(crate) fn append(&self, record: &Record) -> u64 {
        let mut pending = self.shared.pending.lock();
        let lsn = pending.next_lsn;
        frame::encode_frame(lsn, record, &mut pending.buf);
        pending.next_lsn += 1;
        pending.records += 1;
        self.shared.gate.stamp(lsn);
        drop(pending);
        self.shared.wake.notify_one();
        lsn
    }

    /// The LSN of the last record appended (0: none yet).
    pub(crate) fn last_appended(&self) -> u64 {
        self.shared.pending.lock().next_lsn - 1
    }

    /// Waits until record `lsn` is safe (durable here and at every follower). Errors:
    /// `INTERNAL_ERROR` when it is not within [`JournalOptions::safe_wait`] (a disk or a standby is
    /// failing or stuck) or the journal stopped first.
    pub(crate) fn wait_durable(&self, lsn: u64) -> Result<()> {
        let shared = &self.shared;
        let limit = shared.options.safe_wait;
        let until = Instant::now() + limit;
        let mut guard = shared.durable_lock.lock();
        if shared.safe_lsn() >= lsn {
            return Ok(());
        }
        shared.safe_waiters.fetch_add(1, Ordering::AcqRel);
        // The flusher syncs without its pause, standbys' polls copy without theirs.
        shared.hurry.notify_one();
        shared.durable.notify_all();
        let mut outcome = Ok(());
        while shared.safe_lsn() < lsn {
            if shared.stop.load(Ordering::Acquire)
                || shared.durable.wait_until(&mut guard, until).timed_out()
            {
                if shared.safe_lsn() < lsn {
                    outcome = fail(
                        ErrorCode::InternalError,
                        format!("journal: record {lsn} not safe within {limit:?}"),
                    );
                }
                break;
            }
        }
        shared.safe_waiters.fetch_sub(1, Ordering::AcqRel);
        outcome
    }

    /// A standby's long poll: waits until a record after `lsn` is durable here and either
    /// someone waits in [`Journal::wait_durable`] or [`FOLLOWER_BATCH`] passed (so records
    /// gather into fewer copy rounds); or until the journal stops or `limit` passes.
    pub(crate) fn wait_beyond(&self, lsn: u64, limit: Duration) {
        let shared = &self.shared;
        let started = Instant::now();
        let (batched, until) = (started + FOLLOWER_BATCH, started + limit);
        let mut guard = shared.durable_lock.lock();
        while !shared.stop.load(Ordering::Acquire) {
            let news = shared.durable_lsn.load(Ordering::Acquire) > lsn;
            let urgent = shared.safe_waiters.load(Ordering::Acquire) > 0;
            let now = Instant::now();
            if (news && (urgent || now >= batched)) || now >= until {
                return;
            }
            let wake = if news { batched.min(until) } else { until };
            shared.durable.wait_until(&mut guard, wake);
        }
    }

    /// Records that standby `follower` holds the records up to `acked` durably (registering
    /// it if new), and releases what became safe.
    ///
    /// A follower registers (or registers again: its copy went back, it started over) with
    /// `joined` = the last record appended, read under the followers' lock after it is
    /// counted, so every range freed after that point waits for it.
    pub(crate) fn follower_ack(&self, follower: ClientId, acked: u64) {
        let seen = Instant::now();
        let mut followers = self.shared.followers.lock();
        let known = followers.get(&follower).copied();
        let joined = match known {
            Some(known) if acked >= known.acked => known.joined,
            // New, or its copy went back: everything appended so far may lack it.
            _ => self.last_appended(),
        };
        followers.insert(
            follower,
            Follower {
                acked,
                seen,
                joined,
            },
        );
        drop(followers);
        self.shared.publish_safe();
    }

    /// The registered followers.
    pub(crate) fn followers(&self) -> HashMap<ClientId, Follower> {
        self.shared.followers.lock().clone()
    }

    /// Stops counting `follower` (the HA layer recorded that it is out of sync); releases
    /// what became safe.
    pub(crate) fn drop_follower(&self, follower: ClientId) {
        self.shared.followers.lock().remove(&follower);
        self.shared.publish_safe();
    }

    /// The journal's files (snapshot first, then logs in order) and their lengths now.
    /// Errors: `INTERNAL_ERROR` when the directory cannot be listed.
    pub(crate) fn files(&self) -> Result<Vec<JournalFile>> {
        let listing = list(&self.shared.options.dir)?;
        let snapshot = listing.snapshot.into_iter().map(|(_, path)| path);
        let logs = listing.logs.into_iter().map(|log| log.path);
        Ok(snapshot
            .chain(logs)
            .filter_map(|path| {
                let len = std::fs::metadata(&path).ok()?.len();
                let name = path.file_name()?.to_string_lossy().into_owned();
                Some(JournalFile { name, len })
            })
            .collect())
    }

    /// Up to `max` bytes of journal file `name` from `offset` (fewer at its end). Errors:
    /// `INVALID_PARAMS` for a name that is not a journal file's; `FILE_NOT_FOUND` when it is
    /// gone (compacted: the reader starts over from the listing); `FILE_READ_FAIL`.
    pub(crate) fn read_file(&self, name: &str, offset: u64, max: u64) -> Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        if !files::is_journal_file(name) {
            return fail(
                ErrorCode::InvalidParams,
                format!("{name:?} is not a journal file"),
            );
        }
        let path = self.shared.options.dir.join(name);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(error) => return fail(ErrorCode::FileNotFound, format!("{name}: {error}")),
        };
        let mut out = Vec::new();
        let read = file
            .seek(SeekFrom::Start(offset))
            .and_then(|_| file.take(max).read_to_end(&mut out));
        match read {
            Ok(_) => Ok(out),
            Err(error) => fail(ErrorCode::FileReadFail, format!("{name}: {error}")),
        }
    }

    /// Whether the last write or sync failed (new writes should be refused until it works).
    pub(crate) fn is_failing(&self) -> bool {
        self.shared.failing.load(Ordering::Acquire)
    }

    /// A snapshot of the counters.
    pub(crate) fn metrics(&self) -> JournalMetrics {
        let shared = &self.shared;
        let c = &shared.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        JournalMetrics {
            records: shared.pending.lock().records,
            bytes_written: load(&c.bytes_written),
            flushes: load(&c.flushes),
            durable_lsn: load(&shared.durable_lsn),
            write_errors: load(&c.write_errors),
            compactions: load(&c.compactions),
            held_ranges: shared.gate.held() as u64,
            replayed_records: load(&c.replayed_records),
            torn_tail_bytes: load(&c.torn_tail_bytes),
            snapshot_bytes: load(&c.snapshot_bytes),
        }
    }

    /// Blocks the flusher after its next sync, before it releases freed ranges, until the
    /// guard is dropped (tests of what waits for durability).
    #[cfg(test)]
    pub(crate) fn hold_release(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.shared.durable_lock.lock()
    }

    /// Flushes what is pending, stops the flusher and waits for a running compaction (it
    /// stops after the fold in progress). Idempotent.
    pub(crate) fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        if let Some(flusher) = self.flusher.lock().take() {
            let _ = flusher.join();
        }
        // Taken after the flusher is joined: only the flusher spawns compactions.
        if let Some(compactor) = self.shared.compactor.lock().take() {
            let _ = compactor.join();
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn file_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |meta| meta.len())
}

impl Shared {
    /// Durable here and at every registered follower.
    fn safe_lsn(&self) -> u64 {
        let durable = self.durable_lsn.load(Ordering::Acquire);
        let followers = self.followers.lock();
        followers.values().map(|f| f.acked).fold(durable, u64::min)
    }

    /// Wakes the waiters of [`Journal::wait_durable`] and releases the ranges that are safe.
    fn publish_safe(&self) {
        drop(self.durable_lock.lock());
        self.durable.notify_all();
        self.gate.release_through(self.safe_lsn());
    }

    /// Waits until `until`, or until someone waits in [`Journal::wait_durable`] or the journal
    /// stops.
    fn pause_unless_waited_for(&self, until: Instant) {
        let mut guard = self.durable_lock.lock();
        while self.safe_waiters.load(Ordering::Acquire) == 0
            && !self.stop.load(Ordering::Acquire)
            && !self.hurry.wait_until(&mut guard, until).timed_out()
        {}
    }

    /// The flusher: writes and syncs batches until stopped (then drains what is pending).
    fn run_flusher(self: Arc<Self>, mut active: Active) {
        let mut last_flush = Instant::now();
        loop {
            {
                let mut pending = self.pending.lock();
                while pending.buf.is_empty() && !self.stop.load(Ordering::Acquire) {
                    self.wake.wait_for(&mut pending, Duration::from_millis(100));
                }
                if pending.buf.is_empty() {
                    return;
                }
            }
            self.pause_unless_waited_for(last_flush + FLUSH_SPACING);
            let (batch, last_lsn) = {
                let mut pending = self.pending.lock();
                (std::mem::take(&mut pending.buf), pending.next_lsn - 1)
            };
            last_flush = Instant::now();
            if !self.write_batch(&mut active, &batch) {
                return;
            }
            self.durable_lsn.store(last_lsn, Ordering::Release);
            self.publish_safe();
            if active.len >= self.options.rotate_bytes {
                self.rotate(&mut active, last_lsn + 1);
            }
        }
    }

    /// Writes and syncs `batch`, retrying until it works; `false` if the journal stopped
    /// while it was failing (the batch is then lost, and nothing it held was freed).
    fn write_batch(&self, active: &mut Active, batch: &[u8]) -> bool {
        loop {
            let written = active
                .file
                .write_all(batch)
                .and_then(|()| active.file.sync_data());
            match written {
                Ok(()) => {
                    active.len += batch.len() as u64;
                    let c = &self.counters;
                    c.bytes_written
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    c.flushes.fetch_add(1, Ordering::Relaxed);
                    self.failing.store(false, Ordering::Release);
                    return true;
                }
                Err(error) => {
                    self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                    if !self.failing.swap(true, Ordering::AcqRel) {
                        tracing::error!(path = %active.path.display(), %error, "journal: write failed; retrying");
                    }
                    // A partial write must not stay in front of the retry.
                    let _ = active.file.set_len(active.len);
                    if self.stop.load(Ordering::Acquire) {
                        return false;
                    }
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    /// Closes the active log and starts `log-<next_lsn>`; starts a compaction when the closed
    /// logs are large enough. A failure keeps appending to the active log.
    fn rotate(self: &Arc<Self>, active: &mut Active, next_lsn: u64) {
        let dir = &self.options.dir;
        let path = log_path(dir, next_lsn);
        let opened = File::options().create(true).append(true).open(&path);
        let file = match opened.map_err(|e| e.to_string()).and_then(|file| {
            sync_dir(dir).map_err(|_| crate::error::last_error_message())?;
            Ok(file)
        }) {
            Ok(file) => file,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "journal: cannot rotate");
                return;
            }
        };
        active.path = path;
        active.file = file;
        active.closed_bytes += std::mem::take(&mut active.len);
        if active.closed_bytes >= self.options.compact_bytes
            && !self.compacting.swap(true, Ordering::AcqRel)
        {
            active.closed_bytes = 0;
            let shared = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("mc-journal-compact".into())
                .spawn(move || shared.compact(next_lsn));
            match spawned {
                // The previous compactor has cleared `compacting`: it is ending or ended.
                Ok(handle) => {
                    if let Some(previous) = self.compactor.lock().replace(handle) {
                        let _ = previous.join();
                    }
                }
                Err(error) => {
                    self.compacting.store(false, Ordering::Release);
                    tracing::warn!(%error, "journal: no compaction thread");
                }
            }
        }
    }

    /// The compaction thread: folds the closed logs (see [`Shared::compact_once`]), again as
    /// long as the logs closed meanwhile reach `compact_bytes` (a burst that ends while a
    /// compaction runs would otherwise leave them for the next rotation), then clears
    /// `compacting`.
    fn compact(&self, active_lsn: u64) {
        let mut active_lsn = Some(active_lsn);
        while let Some(lsn) = active_lsn {
            let folded = self.compact_once(lsn);
            active_lsn = match folded && !self.stop.load(Ordering::Acquire) {
                true => self.closed_past_threshold(),
                false => None,
            };
        }
        self.compacting.store(false, Ordering::Release);
    }

    /// The first LSN of the newest log (taken as the active one) when the logs before it hold
    /// at least `compact_bytes`.
    fn closed_past_threshold(&self) -> Option<u64> {
        let logs = list(&self.options.dir).ok()?.logs;
        let (active, closed) = logs.split_last()?;
        let bytes: u64 = closed.iter().map(|log| file_len(&log.path)).sum();
        (bytes >= self.options.compact_bytes).then_some(active.first_lsn)
    }

    /// Folds the snapshot and the closed logs (those starting before `active_lsn`, the first
    /// LSN of the log being appended to) into a new snapshot, then deletes them; whether it
    /// did. On failure everything stays as it was (the next compaction folds the logs).
    fn compact_once(&self, active_lsn: u64) -> bool {
        let dir = &self.options.dir;
        let outcome = list(dir).and_then(|listing| {
            let mut logs = listing.logs;
            logs.retain(|log| log.first_lsn < active_lsn);
            let mut folded = fold(listing.snapshot.as_ref(), &logs, false)?;
            folded.state.settle();
            let (path, bytes) = write_snapshot(dir, folded.last_lsn, &folded.state)?;
            let old = listing
                .snapshot
                .map(|(_, old)| old)
                .filter(|old| *old != path);
            remove_all(
                old.into_iter()
                    .chain(logs.iter().map(|log| log.path.clone())),
            );
            sync_dir(dir)?;
            Ok(bytes)
        });
        match outcome {
            Ok(bytes) => {
                let c = &self.counters;
                c.snapshot_bytes.store(bytes, Ordering::Relaxed);
                c.compactions.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(_) => {
                tracing::warn!(
                    detail = %crate::error::last_error_message(),
                    "journal: compaction failed; the logs stay"
                );
                false
            }
        }
    }
}

#[cfg(test)]
mod tests;
