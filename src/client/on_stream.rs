//! Gets on a caller's stream (seed 000, `crate::stream`): the call pins the replicas (one
//! master call, or none through a get session), enqueues copies from resident replicas, a
//! gate and copies from staging for remote ones, and a release marker; it returns a
//! [`Ticket`] without waiting for any transfer.
//!
//! Destinations: on a device stream every destination must be device memory (a host
//! destination would need a synchronous host-to-host copy); on a host stream any memory
//! works. The caller keeps destinations valid and untouched until the stream has passed the
//! call. After a failed key a device stream may still have written unspecified bytes into
//! that key's destination; a host stream copies nothing more into it once the key failed
//! (a copy the driver refused fails the key with `TRANSFER_FAIL`; fragments copied before it
//! may hold new bytes).

use super::core::{Client, ClientCore};
use super::plan::{self, per_key, Buf, Fragment, ReadJob};
use super::session_table::SessionPin;
use super::sessions::{lengths_match, session_fragments, snapshot};
use crate::device;
use crate::error::{fail, ErrorCode, Result};
use crate::stream::{Copy, Fetch, GateSlot, Hold, Plan, StagingBuf, StreamRef, Target, Ticket};
use crate::transfer::MountHold;
use crate::types::ReplicaDescriptor;
use std::sync::Arc;
use std::time::Instant;

impl Client {
    /// `batch_get_into` (`exact` false: each key's buffers hold at least the object) or
    /// `batch_get_into_multi_buffers` (`exact` true: the sizes add up to the object) on
    /// `stream`. Returns once the work is enqueued; per-key outcomes are in the ticket.
    ///
    /// Errors (nothing enqueued): `INVALID_PARAMS` (closed client, shape mismatch, a host
    /// destination on a device stream), `NOT_SUPPORTED` (no runtime for the stream kind),
    /// `STREAM_CAPTURE_UNSUPPORTED`, `TRY_AGAIN` (no ticket slot or staging room now),
    /// `CANCELLED` (torn down meanwhile), `INTERNAL_ERROR` (the runtime refused an enqueue).
    ///
    /// # Safety
    /// Every [`Buf`] is writable memory of its length that stays valid, and is not used by
    /// anyone else, until the stream has passed this call; no two overlap.
    pub unsafe fn batch_get_into_on_stream_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        exact: bool,
        stream: StreamRef<'_>,
    ) -> Result<Ticket> {
        let core = &self.core;
        core.check_open()?;
        lengths_match(keys.len(), &[bufs.len()])?;
        if let StreamRef::Blocking = stream {
            // SAFETY: forwarded from the caller.
            return core
                .streams
                .completed(|| unsafe { self.get_into_raw(keys, bufs, exact) });
        }
        let target = core.streams.target(stream)?;
        check_device_memory(&target, bufs.iter().flatten(), "destination")?;
        let slot = core.streams.reserve()?;
        let names = keys.iter().map(|k| k.as_ref().to_string()).collect();
        let started = Instant::now();
        let pinned = per_key(core.master.batch_pin(core.id, names), keys.len());
        let mut call = Call::new(core, &target);
        call.pins = pinned.iter().flatten().map(|p| p.pin_id).collect();
        for (i, answer) in pinned.into_iter().enumerate() {
            let planned = answer.and_then(|p| {
                let size = p.query.size;
                plan::check_capacity(&bufs[i], size, exact)?;
                call.note_lease(started + std::time::Duration::from_millis(p.query.lease_ttl_ms));
                call.note_pin(started);
                let replicas = core.ordered(&p.query).into_iter().cloned().collect();
                Ok((replicas, plan::truncate(plan::contiguous(&bufs[i]), size)))
            });
            match planned {
                Ok((replicas, fragments)) => call.add(i, replicas, fragments)?,
                Err(e) => call.results.push(Err(e)),
            }
        }
        // SAFETY: the caller's contract covers destinations; `Call` keeps sources alive.
        unsafe { call.issue(slot) }
    }

    /// `batch_get_into_multi_buffer_ranges` on `stream`, inside get sessions started with
    /// [`Client::batch_get_session_start`]: no master call at all (the session's pin keeps
    /// the object). `bufs[i][j]` receives object bytes `[src_offsets[i][j], + len)`. Per-key
    /// errors (in the ticket): `INVALID_PARAMS` (no session, shape, range past the object).
    /// A session whose lease ran out still works (its pin holds the bytes); the overrun is
    /// counted (`lease_overruns`). Call errors as
    /// [`Client::batch_get_into_on_stream_raw`].
    ///
    /// # Safety
    /// As [`Client::batch_get_into_on_stream_raw`].
    pub unsafe fn batch_get_into_multi_buffer_ranges_on_stream_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        src_offsets: &[Vec<u64>],
        stream: StreamRef<'_>,
    ) -> Result<Ticket> {
        let core = &self.core;
        core.check_open()?;
        lengths_match(keys.len(), &[bufs.len(), src_offsets.len()])?;
        if let StreamRef::Blocking = stream {
            // SAFETY: forwarded from the caller.
            return core.streams.completed(|| unsafe {
                self.batch_get_into_multi_buffer_ranges_raw(keys, bufs, src_offsets)
            });
        }
        let target = core.streams.target(stream)?;
        check_device_memory(&target, bufs.iter().flatten(), "destination")?;
        let slot = core.streams.reserve()?;
        let sessions = snapshot(&core.sessions.get, keys);
        let mut call = Call::new(core, &target);
        for (i, session) in sessions.into_iter().enumerate() {
            let Some(session) = session else {
                let missing = format!("no get session for '{}'", keys[i].as_ref());
                call.results.push(fail(ErrorCode::InvalidParams, missing));
                continue;
            };
            match session_fragments(&bufs[i], &src_offsets[i], session.size) {
                Ok(fragments) => {
                    call.note_lease(session.deadline);
                    call.note_pin(session.pin.pinned_at);
                    call.session_pins.push(session.pin.clone());
                    call.add(i, vec![session.replica.clone()], fragments)?;
                }
                Err(e) => call.results.push(Err(e)),
            }
        }
        // SAFETY: as above.
        unsafe { call.issue(slot) }
    }
}

/// On a device stream every non-empty buffer (`what`: "destination" / "source") must be
/// device memory.
pub(super) fn check_device_memory<'a>(
    target: &Target,
    bufs: impl Iterator<Item = &'a Buf>,
    what: &str,
) -> Result<()> {
    if !target.is_device() {
        return Ok(());
    }
    for b in bufs.filter(|b| b.len > 0) {
        if device::runtime().classify(b.addr).device().is_none() {
            return fail(
                ErrorCode::InvalidParams,
                format!(
                    "{what} {:#x} is host memory: on a device stream it must be device memory \
                     (use a host stream for host buffers)",
                    b.addr
                ),
            );
        }
    }
    Ok(())
}

/// A key whose bytes come from another client: read into `staging` by a fetch worker.
struct StagedRead {
    key: usize,
    replicas: Vec<ReplicaDescriptor>,
    fragments: Vec<Fragment>,
}

/// One on-stream get being assembled.
struct Call<'a> {
    core: &'a Arc<ClientCore>,
    target: &'a Target,
    results: Vec<Result<u64>>,
    plan: Plan,
    reads: Vec<StagedRead>,
    staging: Vec<Arc<StagingBuf>>,
    pins: Vec<u64>,
    session_pins: Vec<Arc<SessionPin>>,
    /// Holds of our own segment's mount for the direct copies (see `TransferEngine::hold_mount`).
    mount_holds: Vec<MountHold>,
    lease_deadline: Option<Instant>,
    /// When the earliest of the call's pins was asked for: staged bytes count only if the
    /// pins were still held when their fetch ended (`ClientCore::check_pins_held`).
    pinned_at: Option<Instant>,
}

impl<'a> Call<'a> {
    fn new(core: &'a Arc<ClientCore>, target: &'a Target) -> Call<'a> {
        Call {
            core,
            target,
            results: Vec::new(),
            plan: Plan::default(),
            reads: Vec::new(),
            staging: Vec::new(),
            pins: Vec::new(),
            session_pins: Vec::new(),
            mount_holds: Vec::new(),
            lease_deadline: None,
            pinned_at: None,
        }
    }

    fn note_pin(&mut self, pinned_at: Instant) {
        self.pinned_at = Some(self.pinned_at.map_or(pinned_at, |t| t.min(pinned_at)));
    }

    fn note_lease(&mut self, deadline: Instant) {
        self.lease_deadline = Some(self.lease_deadline.map_or(deadline, |d| d.min(deadline)));
    }

    /// Plans key `key` (the next result slot): copies straight from a resident replica the
    /// stream can read, else through staging. `TRY_AGAIN` (after unpinning) when staging is
    /// full.
    fn add(
        &mut self,
        key: usize,
        replicas: Vec<ReplicaDescriptor>,
        fragments: Vec<Fragment>,
    ) -> Result<()> {
        let bytes: u64 = fragments.iter().map(|f| f.len).sum();
        let Some(first) = replicas.first() else {
            self.results
                .push(fail(ErrorCode::ReplicaIsNotReady, "no readable replica"));
            return Ok(());
        };
        self.results.push(Ok(bytes));
        let resident = self.core.engine.is_local(&first.buffer.transport_endpoint)
            && (!self.target.is_device() || self.core.segment_is_pinned());
        // A resident replica is read by the stream long after this call: its mount is held
        // until the release marker ran. One of an earlier mount is gone; the staged path
        // (through the engine, which refuses it) tries the other replicas.
        let buffer = &first.buffer;
        let held = resident
            .then(|| {
                let (addr, len) = (buffer.buffer_address as usize, buffer.size as usize);
                self.core.engine.hold_mount(addr, len, buffer.epoch)
            })
            .flatten();
        if let Some(hold) = held {
            self.mount_holds.push(hold);
            let base = first.buffer.buffer_address as usize;
            self.plan.direct.extend(
                fragments
                    .iter()
                    .map(|f| copy(key, f.local, base + f.offset as usize, f.len)),
            );
            return Ok(());
        }
        if bytes == 0 {
            return Ok(());
        }
        let staging = match self.core.streams.staging(bytes) {
            Ok(s) => s,
            Err(e) => {
                self.unpin_now();
                return Err(e);
            }
        };
        let mut at = staging.addr();
        let mut staged = Vec::with_capacity(fragments.len());
        for f in &fragments {
            self.plan.staged.push(copy(key, f.local, at, f.len));
            staged.push(Fragment {
                local: at,
                len: f.len,
                offset: f.offset,
            });
            at += f.len as usize;
        }
        self.plan.gated = true;
        self.reads.push(StagedRead {
            key,
            replicas,
            fragments: staged,
        });
        self.staging.push(staging);
        Ok(())
    }

    /// Gives the pins back at once (the call is abandoned before anything was enqueued; the
    /// caller's thread just made the pin call and `TRY_AGAIN` promises the pins are back).
    fn unpin_now(&mut self) {
        if !self.pins.is_empty() {
            let pins = std::mem::take(&mut self.pins);
            if let Err(e) = self.core.master.unpin(self.core.id, pins) {
                tracing::debug!(error = %e, "unpin of an abandoned on-stream call failed");
            }
        }
    }

    /// Enqueues everything and returns the ticket.
    ///
    /// # Safety
    /// Destinations per the public contract; sources are resident pinned replicas or staging,
    /// both kept alive by the hold until the release marker.
    unsafe fn issue(mut self, slot: GateSlot) -> Result<Ticket> {
        let core = self.core.clone();
        let fetch: Option<Fetch> = (!self.reads.is_empty()).then(|| {
            let reads = std::mem::take(&mut self.reads);
            let staging = self.staging.clone();
            let core = core.clone();
            let pinned_at = self.pinned_at;
            Box::new(move |ticket: &crate::stream::TicketState| {
                let jobs: Vec<ReadJob<'_>> = reads
                    .iter()
                    .map(|r| ReadJob {
                        replicas: r.replicas.iter().collect(),
                        fragments: r.fragments.clone(),
                    })
                    .collect();
                let outcomes = core.read_jobs(&jobs);
                // The replicas were read under pins: if the master may have expired this
                // client meanwhile (a stop or a cut longer than its TTL), the pins may have
                // been released and the ranges reused, so the bytes count for nothing.
                let held = pinned_at.map_or(Ok(()), |at| core.check_pins_held(at));
                for (read, outcome) in reads.iter().zip(outcomes) {
                    if let Err(e) = outcome.and(held) {
                        ticket.fail_key(read.key, e);
                    }
                }
                ticket.open_gate(Ok(()));
                drop(staging); // the transfer is terminal: its hold on staging ends here
            }) as Fetch
        });
        let pins = std::mem::take(&mut self.pins);
        let session_pins = std::mem::take(&mut self.session_pins);
        let staging = std::mem::take(&mut self.staging);
        let mount_holds = std::mem::take(&mut self.mount_holds);
        let lease_deadline = self.lease_deadline;
        let held = (pins.len() + session_pins.len()) as u64;
        core.streams.note_pins(held);
        let keeper = core.clone();
        let hold: Hold = Box::new(move |ticket| {
            // No master call here (this runs on the housekeeper): the unpinner batches them.
            let last_session_pins = session_pins.into_iter().filter_map(SessionPin::take_last);
            let mut pins = pins;
            pins.extend(last_session_pins);
            keeper.streams.unpin_later(&keeper.master, keeper.id, pins);
            drop(staging);
            drop(mount_holds); // the stream passed its copies: a remount may go ahead
            keeper.streams.note_unpinned(held);
            if lease_deadline.is_some_and(|d| Instant::now() > d) {
                keeper.streams.note_lease_overrun();
                tracing::debug!(
                    "on-stream get released after its read lease (pins held the bytes)"
                );
            }
            keeper.count_reads(&ticket.results());
        });
        let results = std::mem::take(&mut self.results);
        // SAFETY: forwarded from the caller.
        unsafe {
            core.streams.issue(
                self.target,
                slot,
                std::mem::take(&mut self.plan),
                fetch,
                results,
                hold,
            )
        }
    }
}

fn copy(key: usize, dst: usize, src: usize, len: u64) -> Copy {
    Copy {
        key,
        dst,
        src,
        len: len as usize,
    }
}
