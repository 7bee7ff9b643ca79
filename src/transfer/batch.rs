//! Running a batch of jobs: splitting requests into slices, grouping small slices to one
//! peer into pipelined units, and executing the units on the caller's thread plus a fixed
//! pool of persistent worker threads.
//!
//! The caller thread always works on its own batch, so a single unit never leaves the
//! caller's thread, and a batch completes even when every worker is busy elsewhere. Idle
//! workers are woken through a crossbeam channel, one wake-up per extra unit (up to the pool
//! size); each claims units from the shared batch until none are left.

use super::copy::copy_bytes;
use super::metrics::{bump, Metrics};
use super::rdma::RdmaTransport;
use super::registry::{Registry, StaleEpoch};
use super::same_host::{copy_mapped, MappedTarget};
use super::settings::{MIN_SLICE, PIPELINE_GROUP_BYTES, PIPELINE_GROUP_SLICES, PIPELINE_MAX_SLICE};
use super::staging::Staging;
use super::tcp::pool::ConnectionPool;
use super::transport::Opcode;
use super::transport::{Slice, SliceError};
use crate::error::ErrorCode;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Where a job's bytes go.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Route {
    /// `remote` is an address in this process: one local copy.
    Local,
    /// `remote` is an address in the process serving at this socket address.
    Remote(SocketAddr),
    /// As `Remote`, moved by one-sided RDMA (the socket address is the peer's control port).
    Rdma(SocketAddr),
    /// `remote` is an address in a same-host peer whose segment this process mapped: one
    /// copy through the mapping.
    Mapped(MappedTarget),
}

/// One unit of work: a slice of request number `request`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Job {
    pub(crate) request: usize,
    pub(crate) route: Route,
    pub(crate) slice: Slice,
    /// The local memory is device memory: a remote job goes through a bounce buffer, or over
    /// RDMA straight to the NIC when GPUDirect registered the range (its slice is at most
    /// [`STAGE_CHUNK`](super::staging::STAGE_CHUNK) bytes).
    pub(crate) staged: bool,
    /// The job is not started after this instant ([`super::TransferRequest::send_by`]).
    pub(crate) send_by: Option<Instant>,
}

/// How one request of a batch ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The first error of its jobs (`None`: all succeeded).
    pub(crate) error: Option<SliceError>,
    /// Bytes copied locally for it (local copies and bounce copies).
    pub(crate) copied: u64,
}

/// What executing jobs needs: the connections, the bounce buffers, and the registry and
/// counters for the epoch check of local copies.
pub(crate) struct Io {
    pub(crate) pool: Arc<ConnectionPool>,
    pub(crate) staging: Arc<Staging>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) metrics: Arc<Metrics>,
    /// The RDMA transport, when the engine runs it ([`Route::Rdma`] jobs).
    pub(crate) rdma: Option<Arc<RdmaTransport>>,
}

/// The `(offset, len)` parts a request of `len` bytes is split into: parts of at least
/// [`MIN_SLICE`] bytes, at most `lanes` of them, sizes differing by at most one byte.
pub(crate) fn split(len: u64, lanes: usize) -> impl Iterator<Item = (u64, u64)> {
    let parts = (len / MIN_SLICE).clamp(1, lanes.max(1) as u64);
    let (base, extra) = (len / parts, len % parts);
    (0..parts).map(move |i| {
        let offset = i * base + i.min(extra);
        (offset, base + u64::from(i < extra))
    })
}

/// Orders `jobs` into units, each a range of the returned jobs executed together by one
/// thread: every local job and every remote job over [`PIPELINE_MAX_SLICE`] bytes alone
/// (largest first, so big slices start early), then, per peer, the small remote jobs in
/// request order, dealt into contiguous pipelined groups of nearly equal count: as few as
/// keep each within [`PIPELINE_GROUP_SLICES`] and about [`PIPELINE_GROUP_BYTES`], at most
/// `lanes` (one pipelined connection is cheaper than several while it keeps up).
pub(crate) fn units(jobs: Vec<Job>, lanes: usize) -> (Vec<Job>, Vec<Range<usize>>) {
    let mut singles = Vec::new();
    // Small remote jobs per peer, peers in order of first appearance.
    let mut peers: Vec<(SocketAddr, Vec<Job>)> = Vec::new();
    for job in jobs {
        match job.route {
            Route::Remote(peer) if job.slice.len <= PIPELINE_MAX_SLICE => {
                match peers.iter_mut().find(|(p, _)| *p == peer) {
                    Some((_, list)) => list.push(job),
                    None => peers.push((peer, vec![job])),
                }
            }
            _ => singles.push(job),
        }
    }
    singles.sort_by_key(|job| std::cmp::Reverse(job.slice.len));
    let mut ranges: Vec<Range<usize>> = (0..singles.len()).map(|i| i..i + 1).collect();
    let mut ordered = singles;
    for (_, list) in peers {
        let bytes: usize = list.iter().map(|job| job.slice.len).sum();
        let wanted = list
            .len()
            .div_ceil(PIPELINE_GROUP_SLICES)
            .max(bytes.div_ceil(PIPELINE_GROUP_BYTES));
        let groups = wanted.clamp(1, lanes.clamp(1, list.len()));
        let (base, extra) = (list.len() / groups, list.len() % groups);
        for group in 0..groups {
            let start = ordered.len() + group * base + group.min(extra);
            ranges.push(start..start + base + usize::from(group < extra));
        }
        ordered.extend(list);
    }
    (ordered, ranges)
}

/// Jobs shared between the caller and the workers.
struct Batch {
    jobs: Vec<Job>,
    /// Ranges of `jobs` claimed (and executed) as a whole.
    units: Vec<Range<usize>>,
    next: AtomicUsize,
    state: Mutex<BatchState>,
    finished: Condvar,
}

struct BatchState {
    /// Units finished.
    completed: usize,
    /// Per request.
    outcomes: Vec<Outcome>,
}

// SAFETY: the raw pointers in `jobs` are only dereferenced while executing a claimed unit,
// and `Executor::run` (which the caller keeps the memory valid for) returns only after every
// unit has completed. A worker holding a clone of the `Arc` afterwards claims nothing.
unsafe impl Send for Batch {}
// SAFETY: as above; shared state is behind atomics and a mutex.
unsafe impl Sync for Batch {}

impl Batch {
    /// Claims and executes units until none are left.
    fn work(&self, io: &Io) {
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(range) = self.units.get(index) else {
                return;
            };
            let unit = &self.jobs[range.clone()];
            // SAFETY: see the `Send` impl; the jobs' memory is valid until the batch ends.
            let outcomes = unsafe { execute(io, unit) };
            let mut state = self.state.lock();
            for (job, outcome) in unit.iter().zip(outcomes) {
                let slot = &mut state.outcomes[job.request];
                match outcome {
                    Ok(copied) => slot.copied += copied,
                    Err(message) => {
                        slot.error.get_or_insert(message);
                    }
                }
            }
            state.completed += 1;
            if state.completed == self.units.len() {
                self.finished.notify_all();
            }
        }
    }

    fn wait(&self) -> Vec<Outcome> {
        let mut state = self.state.lock();
        while state.completed < self.units.len() {
            self.finished.wait(&mut state);
        }
        std::mem::take(&mut state.outcomes)
    }
}

/// Executes one unit (a local job, or remote jobs to one peer) on the calling thread; per
/// job the bytes copied locally, or the error.
///
/// # Safety
/// The jobs' local ranges (and, for [`Route::Local`], their `remote` ranges) must be valid
/// for the operation and not overlap.
unsafe fn execute(io: &Io, unit: &[Job]) -> Vec<Result<u64, SliceError>> {
    let Some(first) = unit.first() else {
        return Vec::new();
    };
    // The clock is read only for a unit with a deadline (a grant's writes), not for reads.
    let now = unit
        .iter()
        .any(|job| job.send_by.is_some())
        .then(Instant::now);
    if let Some(late) = unit
        .iter()
        .find(|job| job.send_by.zip(now).is_some_and(|(by, now)| now >= by))
    {
        bump(&io.metrics.late_sends_refused);
        let error = SliceError {
            code: ErrorCode::StaleWriteToken,
            message: format!(
                "{:?} of {} bytes at {:#x} not started: its writer's grant ended",
                late.slice.op, late.slice.len, late.slice.remote
            ),
            unreachable: false,
        };
        return unit.iter().map(|_| Err(error.clone())).collect();
    }
    match first.route {
        Route::Local => unit
            .iter()
            // SAFETY: forwarded from the caller.
            .map(|job| unsafe { copy_local(io, &job.slice) })
            .collect(),
        // SAFETY: forwarded from the caller; `units` puts only jobs to `peer` together.
        Route::Remote(peer) => unsafe { execute_remote(io, peer, unit) },
        Route::Rdma(peer) => unit
            .iter()
            .map(|job| match &io.rdma {
                // SAFETY: forwarded from the caller.
                Some(rdma) => unsafe {
                    rdma.execute(peer, &job.slice, job.staged, &io.staging, job.send_by)
                },
                None => Err(SliceError::from(
                    "RDMA job without the RDMA transport".to_string(),
                )),
            })
            .collect(),
        Route::Mapped(target) => unit
            .iter()
            // SAFETY: forwarded from the caller (a mapped job is alone in its unit).
            .map(|job| unsafe { copy_mapped(&io.metrics, &target, &job.slice, job.send_by) })
            .collect(),
    }
}

/// One local copy between `slice.local` and our own registered `slice.remote`, after the
/// epoch check: a slice naming an epoch (≠ 0) that is not the current one of its range fails
/// with `STALE_SEGMENT_EPOCH` and copies nothing. Returns the bytes copied.
///
/// # Safety
/// As [`execute`], for one [`Route::Local`] job.
unsafe fn copy_local(io: &Io, slice: &Slice) -> Result<u64, SliceError> {
    let Slice {
        op,
        local,
        len,
        remote,
        epoch,
    } = *slice;
    let target = remote as usize as *mut u8;
    // SAFETY: the caller guarantees both ranges (the engine checked `remote` against the
    // registry and that the ranges do not overlap); the copy runs under the epoch fence.
    let copy = || unsafe {
        match op {
            Opcode::Read => copy_bytes(local, target, len),
            Opcode::Write => copy_bytes(target, local, len),
        }
    };
    let named = (epoch != 0).then_some(epoch);
    let copied = match io.registry.fenced(remote, len as u64, named, copy) {
        Ok(copied) => copied,
        Err(StaleEpoch(current)) => {
            bump(&io.metrics.stale_epoch_rejections);
            return Err(SliceError {
                code: ErrorCode::StaleSegmentEpoch,
                message: format!(
                    "{op:?} of {len} bytes at {remote:#x}: segment epoch {epoch:#x} is not the \
                     current one ({current:#x?})"
                ),
                unreachable: false,
            });
        }
    };
    copied.map(|_| len as u64).map_err(SliceError::from)
}

/// Remote jobs to one peer; staged jobs go through bounce buffers (see `staging`).
///
/// # Safety
/// As [`execute`].
unsafe fn execute_remote(io: &Io, peer: SocketAddr, unit: &[Job]) -> Vec<Result<u64, SliceError>> {
    let mut slices: Vec<Slice> = Vec::with_capacity(unit.len());
    let mut bounces = Vec::new();
    for job in unit.iter() {
        let mut slice = job.slice;
        if job.staged {
            let bounce = match io.staging.take() {
                Ok(bounce) => bounce,
                Err(e) => return unit.iter().map(|_| Err(e.clone().into())).collect(),
            };
            if slice.op == Opcode::Write {
                // SAFETY: the bounce holds STAGE_CHUNK >= len bytes; the caller guarantees
                // the source.
                if let Err(e) = unsafe { io.staging.copy(bounce.ptr(), slice.local, slice.len) } {
                    return unit.iter().map(|_| Err(e.clone().into())).collect();
                }
            }
            slice.local = bounce.ptr();
            bounces.push(Some(bounce));
        } else {
            bounces.push(None);
        }
        slices.push(slice);
    }
    // SAFETY: forwarded from the caller; bounces are our own, alive until the end.
    let sent = unsafe { io.pool.execute(peer, &slices) };
    sent.into_iter()
        .zip(unit.iter().zip(bounces))
        .map(|(result, (job, bounce))| {
            result?;
            let Some(bounce) = bounce else {
                return Ok(0);
            };
            let len = job.slice.len;
            if job.slice.op == Opcode::Read {
                // SAFETY: the caller guarantees the destination; the bounce holds the data.
                unsafe { io.staging.copy(job.slice.local, bounce.ptr(), len) }?;
            }
            Ok(len as u64)
        })
        .collect()
}

/// The worker pool. Thread-safe; stopping it is idempotent.
pub(crate) struct Executor {
    io: Arc<Io>,
    wake: Mutex<Option<Sender<Arc<Batch>>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    workers: usize,
    lanes: usize,
}

impl Executor {
    /// Starts `workers` persistent threads that execute jobs through `io`; small remote
    /// jobs to one peer are pipelined over up to `lanes` connections.
    pub(crate) fn new(workers: usize, lanes: usize, io: Io) -> std::io::Result<Executor> {
        let io = Arc::new(io);
        let (sender, receiver) = crossbeam_channel::unbounded::<Arc<Batch>>();
        let mut threads = Vec::with_capacity(workers);
        for index in 0..workers {
            let receiver: Receiver<Arc<Batch>> = receiver.clone();
            let io = Arc::clone(&io);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("mc-transfer-{index}"))
                    .spawn(move || {
                        for batch in receiver {
                            batch.work(&io);
                        }
                    })?,
            );
        }
        Ok(Executor {
            io,
            wake: Mutex::new(Some(sender)),
            threads: Mutex::new(threads),
            workers,
            lanes,
        })
    }

    /// Runs every job and returns the outcome of each of `requests` requests. Blocks until
    /// all jobs finished.
    ///
    /// # Safety
    /// Every job's memory must be valid for its operation until this returns, and no two
    /// jobs may write overlapping local memory.
    pub(crate) unsafe fn run(&self, jobs: Vec<Job>, requests: usize) -> Vec<Outcome> {
        let (jobs, units) = units(jobs, self.lanes);
        let helpers = units.len().saturating_sub(1).min(self.workers);
        let batch = Arc::new(Batch {
            jobs,
            units,
            next: AtomicUsize::new(0),
            state: Mutex::new(BatchState {
                completed: 0,
                outcomes: vec![Outcome::default(); requests],
            }),
            finished: Condvar::new(),
        });
        if helpers > 0 {
            if let Some(wake) = self.wake.lock().as_ref() {
                for _ in 0..helpers {
                    // Workers gone (shut down): the caller does the work alone.
                    let _ = wake.send(Arc::clone(&batch));
                }
            }
        }
        batch.work(&self.io);
        batch.wait()
    }

    /// Stops the worker threads and waits for them: each finishes what it is doing (bounded
    /// by the I/O timeout) and exits, so no transfer thread outlives the engine (a thread still
    /// exiting while the process ends confuses tools such as LeakSanitizer). Later batches run
    /// on the caller's thread only. Idempotent.
    pub(crate) fn stop(&self) {
        self.wake.lock().take();
        let me = std::thread::current().id();
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for thread in threads {
            if thread.thread().id() != me {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(len: u64, lanes: usize) -> Vec<(u64, u64)> {
        split(len, lanes).collect()
    }

    #[test]
    fn split_uses_big_parts_and_at_most_lanes() {
        assert_eq!(parts(1, 4), vec![(0, 1)]);
        assert_eq!(parts(MIN_SLICE * 2 - 1, 4), vec![(0, MIN_SLICE * 2 - 1)]);
        assert_eq!(
            parts(MIN_SLICE * 2 + 1, 4),
            vec![(0, MIN_SLICE + 1), (MIN_SLICE + 1, MIN_SLICE)]
        );
        let big = parts(64 * MIN_SLICE + 3, 4);
        assert_eq!(big.len(), 4);
        assert_eq!(big.iter().map(|p| p.1).sum::<u64>(), 64 * MIN_SLICE + 3);
        for w in big.windows(2) {
            assert_eq!(w[0].0 + w[0].1, w[1].0);
        }
        assert_eq!(parts(8 * MIN_SLICE, 1), vec![(0, 8 * MIN_SLICE)]);
        let huge = parts(5 << 32, 16);
        assert_eq!(huge.len(), 16);
        assert_eq!(huge.iter().map(|p| p.1).sum::<u64>(), 5 << 32);
    }

    fn remote_job(request: usize, peer: u16, len: usize) -> Job {
        Job {
            request,
            route: Route::Remote(SocketAddr::from(([127, 0, 0, 1], peer))),
            slice: Slice {
                op: Opcode::Read,
                local: std::ptr::null_mut(),
                len,
                remote: 0,
                epoch: 0,
            },
            staged: false,
            send_by: None,
        }
    }

    #[test]
    fn units_pipeline_small_slices_per_peer() {
        let mut jobs: Vec<Job> = (0..40)
            .map(|i| remote_job(i, 1 + (i % 2) as u16, 4096))
            .collect();
        jobs.push(remote_job(40, 1, PIPELINE_MAX_SLICE + 1));
        jobs.push(Job {
            route: Route::Local,
            ..remote_job(41, 1, 10)
        });
        let (ordered, ranges) = units(jobs, 4);
        assert_eq!(ordered.len(), 42);
        // Two singles (largest first), then one group per peer (20 small slices each).
        assert_eq!(ranges, vec![0..1, 1..2, 2..22, 22..42]);
        assert_eq!(ordered[0].request, 40);
        let peer_one: Vec<usize> = ordered[2..22].iter().map(|j| j.request).collect();
        assert_eq!(peer_one, (0..40).step_by(2).collect::<Vec<_>>());

        // 100 slices of 64 KiB to one peer: spread over all lanes, nearly equal counts.
        let many: Vec<Job> = (0..100)
            .map(|i| remote_job(i, 1, PIPELINE_MAX_SLICE))
            .collect();
        let (_, ranges) = units(many, 4);
        assert_eq!(ranges, vec![0..25, 25..50, 50..75, 75..100]);
        let (_, ranges) = units((0..3).map(|i| remote_job(i, 1, 1)).collect(), 1);
        assert_eq!(ranges, vec![0..3]);
    }
}
