//! Puts from a producer's stream (issue 7, the save half of seed 000): the call reserves the
//! objects (`PutStart`) and returns; on the stream, after all work enqueued before the call,
//! the source buffers are copied into the reserved replicas — straight into this client's
//! segment when the stream can reach it, otherwise into pinned staging — and a release
//! marker hands the ticket to a worker, which writes staging to the remaining replicas over
//! the transport and commits (`PutEnd`) or, on any failure, revokes (`PutRevoke`). Commits
//! never run on a driver callback thread.
//!
//! A key any of whose copies failed (a host stream reports each refused copy as
//! `TRANSFER_FAIL`) is revoked, never committed.
//!
//! Ordering: until the ticket is final the objects are not readable (a get sees the old
//! state: not found, or the existing value — insert-if-absent is unchanged); once it reports
//! 0 every get sees the new bytes. The sources must stay valid and unchanged until the
//! stream has passed the call (its release point).

use super::core::{Client, ClientCore};
use super::on_stream::check_device_memory;
use super::plan::{self, check_replicas, per_key, Buf, Fragment, GrantedWrite, ReplicaWrite};
use super::sessions::lengths_match;
use crate::error::{fail, ErrorCode, Result};
use crate::stream::{Copy, Hold, Plan, StagingBuf, StreamRef, Ticket};
use crate::transfer::MountHold;
use crate::types::{ReplicaDescriptor, ReplicateConfig, WriteToken};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

/// A key whose bytes reach some replicas through staging after the stream copied them there.
struct StagedWrite {
    key: usize,
    staging: Arc<StagingBuf>,
    size: u64,
    replicas: Vec<ReplicaDescriptor>,
}

impl Client {
    /// `batch_put_from_multi_buffers` (each key's object is the concatenation of its
    /// buffers) on `stream`. Returns once the objects are reserved and the copies enqueued.
    /// Per key in the ticket: the bytes written (0 for an empty object or a key that already
    /// existed — a put keeps the old value), or the error (`PutStart`'s, a transfer's, the
    /// commit's; `CANCELLED` when the store was torn down first).
    ///
    /// Call errors (nothing enqueued, nothing reserved): `INVALID_PARAMS` (closed client,
    /// shape mismatch, a key listed twice, `replica_num` 0, `prefer_alloc_in_same_node`, a
    /// host source on a device stream), `NOT_SUPPORTED`, `STREAM_CAPTURE_UNSUPPORTED`,
    /// `TRY_AGAIN` (ticket slots or staging exhausted; reservations are revoked),
    /// `INTERNAL_ERROR` (the runtime refused an enqueue; reservations then expire at the
    /// master).
    ///
    /// # Safety
    /// Every [`Buf`] is readable memory of its length that stays valid and unchanged until
    /// the stream has passed this call.
    pub unsafe fn batch_put_from_on_stream_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        config: &ReplicateConfig,
        stream: StreamRef<'_>,
    ) -> Result<Ticket> {
        let core = &self.core;
        core.check_open()?;
        lengths_match(keys.len(), &[bufs.len()])?;
        if let StreamRef::Blocking = stream {
            return core.streams.completed(|| {
                let sizes = bufs
                    .iter()
                    .map(|b| plan::total_len(b).unwrap_or(0))
                    .collect::<Vec<_>>();
                let results = core.write(keys, bufs, config, super::WriteMode::Put);
                results
                    .into_iter()
                    .zip(sizes)
                    .map(|(r, n)| r.map(|()| n))
                    .collect()
            });
        }
        check_put_args(keys, config)?;
        let target = core.streams.target(stream)?;
        check_device_memory(&target, bufs.iter().flatten(), "source")?;
        let sizes = bufs
            .iter()
            .map(|b| plan::total_len(b))
            .collect::<Result<Vec<u64>>>()?;
        let slot = core.streams.reserve()?;
        let pending: Vec<usize> = (0..keys.len()).filter(|&i| sizes[i] > 0).collect();
        let names: Vec<String> = pending
            .iter()
            .map(|&i| keys[i].as_ref().to_string())
            .collect();
        let asked_at = Instant::now();
        let started = per_key(
            core.master.batch_put_start(
                core.id,
                names,
                pending.iter().map(|&i| sizes[i]).collect(),
                config.clone(),
            ),
            pending.len(),
        );
        let mut results: Vec<Result<u64>> = sizes.iter().map(|_| Ok(0)).collect();
        let mut plan = Plan {
            commits: true,
            ..Plan::default()
        };
        let mut staged: Vec<StagedWrite> = Vec::new();
        let mut reserved: Vec<(usize, GrantedWrite)> = Vec::new();
        let mut mount_holds: Vec<MountHold> = Vec::new();
        for (&i, start) in pending.iter().zip(started) {
            let grant = match start {
                Ok(grant) => grant,
                Err(ErrorCode::ObjectAlreadyExists) => continue,
                Err(e) => {
                    results[i] = Err(e);
                    continue;
                }
            };
            reserved.push((i, GrantedWrite::new(&grant, asked_at)));
            results[i] = Ok(sizes[i]);
            if let Err(e) = check_replicas(&grant.replicas, sizes[i]) {
                results[i] = Err(e);
                continue;
            }
            let replicas = grant.replicas;
            let sources = plan::contiguous(&bufs[i]);
            let (direct, remote): (Vec<_>, Vec<_>) = replicas.into_iter().partition(|r| {
                core.engine.is_local(&r.buffer.transport_endpoint)
                    && (!target.is_device() || core.segment_is_pinned())
            });
            // The stream writes the resident replicas long after this call: their mount is
            // held until the commit. One of an earlier mount is gone: the key fails.
            let held: Result<Vec<MountHold>> =
                direct.iter().map(|r| core.hold_mount(&r.buffer)).collect();
            match held {
                Ok(held) => mount_holds.extend(held),
                Err(e) => {
                    results[i] = Err(e);
                    continue;
                }
            }
            for replica in &direct {
                let base = replica.buffer.buffer_address as usize;
                plan.direct.extend(sources.iter().map(|f| Copy {
                    key: i,
                    dst: base + f.offset as usize,
                    src: f.local,
                    len: f.len as usize,
                }));
            }
            if remote.is_empty() {
                continue;
            }
            let staging = match core.streams.staging(sizes[i]) {
                Ok(s) => s,
                Err(e) => {
                    core.finish(keys, &tokens(&reserved), false);
                    return Err(e);
                }
            };
            plan.direct.extend(sources.iter().map(|f| Copy {
                key: i,
                dst: staging.addr() + f.offset as usize,
                src: f.local,
                len: f.len as usize,
            }));
            staged.push(StagedWrite {
                key: i,
                staging,
                size: sizes[i],
                replicas: remote,
            });
        }
        let all: Vec<String> = keys.iter().map(|k| k.as_ref().to_string()).collect();
        let hold = commit_hold(core.clone(), all, reserved, staged, mount_holds);
        // SAFETY: sources per the caller's contract; destinations are our reserved replicas
        // and staging, kept reserved/alive by the hold until the release marker.
        unsafe { core.streams.issue(&target, slot, plan, None, results, hold) }
    }
}

/// The put-side argument rules of the blocking path, plus: no key twice in one call.
fn check_put_args<K: AsRef<str>>(keys: &[K], config: &ReplicateConfig) -> Result<()> {
    if config.prefer_alloc_in_same_node {
        return fail(
            ErrorCode::InvalidParams,
            "prefer_alloc_in_same_node is not supported by the client put paths",
        );
    }
    if config.replica_num == 0 {
        return fail(ErrorCode::InvalidParams, "replica_num must be at least 1");
    }
    let mut seen = HashSet::with_capacity(keys.len());
    for key in keys {
        let key = key.as_ref();
        if key.is_empty() {
            return fail(ErrorCode::InvalidParams, "empty key");
        }
        if !seen.insert(key) {
            return fail(
                ErrorCode::InvalidParams,
                format!("key '{key}' appears twice in one on-stream put"),
            );
        }
    }
    Ok(())
}

/// The release of an on-stream put (on a worker, after the stream copied every source):
/// staged keys are written to their remaining replicas, then every reserved key that is
/// still fine is committed and the others revoked. After teardown everything is revoked
/// (`CANCELLED`). `mount_holds` (our segment's mount, written by the stream's direct copies)
/// end with it.
fn commit_hold(
    core: Arc<ClientCore>,
    keys: Vec<String>,
    reserved: Vec<(usize, GrantedWrite)>,
    staged: Vec<StagedWrite>,
    mount_holds: Vec<MountHold>,
) -> Hold {
    Box::new(move |ticket| {
        // The stream passed its direct copies before this release ran: a remount may go ahead
        // while the remaining replicas are written and the commit is made.
        drop(mount_holds);
        if core.check_open().is_err() {
            for &(i, _) in &reserved {
                ticket.fail_key(i, ErrorCode::Cancelled);
            }
            core.finish(&keys, &tokens(&reserved), false);
            return;
        }
        // A stream that reached the call only after the write ttl must not write the
        // replicas any more: the master may have reclaimed them.
        for (i, write) in &reserved {
            if let Err(e) = write.check_writable() {
                ticket.fail_key(*i, e);
            }
        }
        let send_by = |key: usize| {
            let granted = reserved.iter().find(|(i, _)| *i == key);
            granted.and_then(|(_, write)| write.send_by())
        };
        let writes: Vec<ReplicaWrite> = staged
            .iter()
            .filter(|w| !ticket.key_failed(w.key))
            .map(|w| ReplicaWrite {
                key: w.key,
                replicas: w.replicas.clone(),
                fragments: vec![Fragment {
                    local: w.staging.addr(),
                    len: w.size,
                    offset: 0,
                }],
                send_by: send_by(w.key),
            })
            .collect();
        for (write, outcome) in writes.iter().zip(core.write_replicas(&writes)) {
            if let Err(e) = outcome {
                tracing::debug!(key = %keys[write.key], error = %e, "on-stream put: replica write failed");
                ticket.fail_key(write.key, e);
            }
        }
        let (good, bad): (Vec<_>, Vec<_>) = tokens(&reserved)
            .into_iter()
            .partition(|&(i, _)| !ticket.key_failed(i));
        for (i, outcome) in core.finish(&keys, &good, true) {
            if let Err(e) = outcome {
                ticket.fail_key(i, e);
            }
        }
        core.finish(&keys, &bad, false);
        drop(staged);
        core.count_writes(&ticket.results());
    })
}

impl ClientCore {
    /// Counts written objects and failed keys of an on-stream put.
    fn count_writes(&self, results: &[Result<u64>]) {
        use super::counters::ClientCounters;
        for r in results {
            match r {
                Ok(0) => {}
                Ok(bytes) => {
                    ClientCounters::add(&self.counters.objects_written, 1);
                    ClientCounters::add(&self.counters.bytes_written, *bytes);
                }
                Err(_) => ClientCounters::add(&self.counters.failed_ops, 1),
            }
        }
    }
}

/// The `(key index, token)` pairs that commit or revoke `reserved`.
fn tokens(reserved: &[(usize, GrantedWrite)]) -> Vec<(usize, WriteToken)> {
    reserved.iter().map(|(i, w)| (*i, w.token)).collect()
}
