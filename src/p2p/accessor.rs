//! The accessor side of cross-client puts and gets with one owner: FORWARD (our engine
//! moves the bytes between PreWrite/WriteCommit, or after PinKey) and REVERSE (one RPC; the
//! owner's engine moves them).
//!
//! REVERSE buffers: the owner's engine needs a remotely accessible registered buffer of
//! ours. We stage through the client's registered, remotely accessible staging buffer
//! (`local_buffer_size`) rather than registering the caller's memory for the call: a peer
//! that is still moving bytes after our RPC timed out could otherwise write into memory the
//! caller has already reused or freed. Cost: one local memcpy per value on the accessor
//! (put: caller → staging; get: staging → caller); none on the owner. A staging slot whose
//! item failed in transfer (`TRANSFER_FAIL`, `TRANSFER_TIMEOUT`) or whose RPC failed at the
//! transport level is held in quarantine for `MC_P2P_QUARANTINE_MS` (default: twice the
//! transfer timeout) before reuse: the owner's push may still land in it. Every REVERSE item
//! carries `valid_for_ms` (our RPC timeout): the owner starts no transfer of it later than
//! that after it read the request. FORWARD puts start no slice after the PreWrite's lease,
//! counted from when we sent the PreWrite (`send_by`; never later than the owner's deadline).
//! FORWARD needs no staging: our engine reads from / writes into the caller's memory
//! directly (zero extra copies).

use super::api::{PeerApi, RemoteBufferDesc, RemoteRead, RemoteWrite, WriteGrant};
use super::counters::{bump, Counters};
use super::quarantine::Quarantine;
use crate::error::{fail, ErrorCode, Result};
use crate::node::{LocalAlloc, LocalBuffer};
use crate::spin::deadline;
use crate::transfer::{copy, TransferEngine, TransferOp, TransferRequest};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Retries of WriteRevoke / UnPinKey after a recoverable (transport) error.
pub const CLEANUP_RETRIES: u32 = 3;

/// Test hooks on the accessor's FORWARD path. Thread-safe; all off by default.
#[derive(Default)]
pub struct FaultInjection {
    fail_transfers: AtomicU64,
    commit_delay_ms: AtomicU64,
    read_delay_ms: AtomicU64,
    write_delay_ms: AtomicU64,
}

impl FaultInjection {
    /// The next `n` FORWARD transfers move only their first half, then fail with
    /// `TRANSFER_FAIL` (a transfer killed mid-write or mid-read).
    pub fn fail_next_transfers(&self, n: u64) {
        self.fail_transfers.store(n, Ordering::Relaxed);
    }

    /// Sleep this long between a FORWARD write's transfer and its WriteCommit.
    pub fn delay_commits(&self, delay: Duration) {
        self.commit_delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Sleep this long between a FORWARD read's PinKey and its transfer (a reader that is
    /// still mid-read when the key changes).
    pub fn delay_reads(&self, delay: Duration) {
        self.read_delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Sleep this long between a FORWARD write's PreWrites and its transfer (a writer that
    /// is slow to start, e.g. queued behind other work, while its lease runs out).
    pub fn delay_writes(&self, delay: Duration) {
        self.write_delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    fn take_failure(&self) -> bool {
        self.fail_transfers
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Sleeps for the milliseconds in `delay` (a [`FaultInjection`] hook; 0 = no pause).
fn pause(delay: &AtomicU64) {
    let ms = delay.load(Ordering::Relaxed);
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// Runs `rpc` until it succeeds, answers `LEASE_EXPIRED` (the record is already gone: clean)
/// or fails with a non-recoverable error; recoverable (`RPC_FAIL`, `RPC_TIMEOUT`) failures
/// are retried up to [`CLEANUP_RETRIES`] times. Counts every attempt in `sent`.
pub(crate) fn cleanup(sent: &AtomicU64, mut rpc: impl FnMut() -> Result<()>) -> Result<()> {
    let mut attempt = 0;
    loop {
        bump(sent);
        match rpc() {
            Ok(()) | Err(ErrorCode::LeaseExpired) => return Ok(()),
            Err(code @ (ErrorCode::RpcFail | ErrorCode::RpcTimeout))
                if attempt < CLEANUP_RETRIES =>
            {
                attempt += 1;
                tracing::debug!(%code, attempt, "cleanup RPC failed; retrying");
                std::thread::sleep(Duration::from_millis(10 << attempt));
            }
            Err(code) => return Err(code),
        }
    }
}

/// The accessor's transfer resources. Thread-safe.
pub(crate) struct Accessor {
    pub(crate) engine: Arc<TransferEngine>,
    pub(crate) staging: Option<Arc<LocalBuffer>>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) faults: Arc<FaultInjection>,
    held: Quarantine<LocalAlloc>,
    quarantine: Duration,
    /// How long we wait for an owner's REVERSE answer; sent as each item's `valid_for_ms`.
    rpc_timeout: Duration,
}

/// Whether a peer may still be moving bytes of an item that ended with `code`: its transfer
/// failed or timed out, or we lost track of the RPC.
fn may_still_move(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::TransferFail
            | ErrorCode::TransferTimeout
            | ErrorCode::RpcFail
            | ErrorCode::RpcTimeout
    )
}

impl Accessor {
    /// Staging slots of failed items are held for `quarantine` before reuse; `rpc_timeout`
    /// is how long our RPC client waits for an owner's answer (the owner starts no REVERSE
    /// transfer later than that after it read the request).
    pub(crate) fn new(
        engine: Arc<TransferEngine>,
        staging: Option<Arc<LocalBuffer>>,
        counters: Arc<Counters>,
        faults: Arc<FaultInjection>,
        quarantine: Duration,
        rpc_timeout: Duration,
    ) -> Accessor {
        Accessor {
            engine,
            staging,
            counters,
            faults,
            held: Quarantine::default(),
            quarantine,
            rpc_timeout,
        }
    }

    /// Runs FORWARD transfers, applying the fault hook.
    ///
    /// # Safety
    /// As [`TransferEngine::transfer`].
    unsafe fn forward_transfers(&self, requests: &mut [TransferRequest<'_>]) -> Vec<Result<()>> {
        let faulted: Vec<bool> = requests
            .iter_mut()
            .map(|r| {
                let fault = self.faults.take_failure();
                if fault {
                    r.len /= 2;
                }
                fault
            })
            .collect();
        // SAFETY: forwarded from the caller (lengths were only shortened).
        let outcomes = unsafe { self.engine.transfer(requests) };
        outcomes
            .into_iter()
            .zip(faulted)
            .map(|(outcome, fault)| match fault {
                true => fail(ErrorCode::TransferFail, "injected: transfer killed mid-way"),
                false => outcome,
            })
            .collect()
    }

    /// FORWARD puts of `keys[i]` = `values[i]` to `peer`.
    pub(crate) fn forward_put(
        &self,
        peer: &dyn PeerApi,
        keys: &[&str],
        values: &[&[u8]],
    ) -> Vec<Result<()>> {
        let grants: Vec<Result<(WriteGrant, Instant)>> = keys
            .iter()
            .zip(values)
            .map(|(key, value)| {
                let sent = Instant::now();
                let grant = peer.pre_write(key.to_string(), value.len() as u64)?;
                if grant.buffer.len != value.len() as u64 {
                    let _ = self.revoke(peer, key, grant.write_operation_id);
                    return fail(ErrorCode::InvalidReplica, "PreWrite granted a wrong size");
                }
                let send_by = deadline(sent, Duration::from_millis(grant.lease_ms));
                Ok((grant, send_by))
            })
            .collect();
        let mut requests = Vec::new();
        let mut index = Vec::new();
        for (i, grant) in grants.iter().enumerate() {
            if let Ok((grant, send_by)) = grant {
                index.push(i);
                requests.push(TransferRequest {
                    op: TransferOp::Write,
                    local_addr: values[i].as_ptr() as usize,
                    len: grant.buffer.len,
                    endpoint: &grant.buffer.endpoint,
                    remote_addr: grant.buffer.addr,
                    epoch: 0,
                    send_by: Some(*send_by),
                });
            }
        }
        pause(&self.faults.write_delay_ms);
        // SAFETY: each local range is a caller slice, borrowed (readable) for this call.
        let moved = unsafe { self.forward_transfers(&mut requests) };
        let mut outcomes: Vec<Option<Result<()>>> = vec![None; keys.len()];
        for (i, outcome) in index.into_iter().zip(moved) {
            outcomes[i] = Some(outcome);
        }
        pause(&self.faults.commit_delay_ms);
        keys.iter()
            .zip(grants)
            .zip(outcomes)
            .map(|((key, grant), moved)| {
                let id = grant?.0.write_operation_id;
                match moved.unwrap_or(Err(ErrorCode::InternalError)) {
                    Ok(()) => {
                        peer.write_commit(key.to_string(), id)?;
                        bump(&self.counters.forward_puts);
                        Ok(())
                    }
                    Err(code) => {
                        if let Err(revoke) = self.revoke(peer, key, id) {
                            tracing::warn!(key, %revoke, "WriteRevoke failed; the lease reclaims the write");
                        }
                        Err(code)
                    }
                }
            })
            .collect()
    }

    fn revoke(&self, peer: &dyn PeerApi, key: &str, id: u64) -> Result<()> {
        cleanup(&self.counters.revokes_sent, || {
            peer.write_revoke(key.to_string(), id)
        })
    }

    /// FORWARD gets of `keys[i]` into `buffers[i]`; per key the value size.
    pub(crate) fn forward_get(
        &self,
        peer: &dyn PeerApi,
        keys: &[&str],
        buffers: &mut [&mut [u8]],
    ) -> Vec<Result<u64>> {
        let started = Instant::now();
        let grants: Vec<_> = keys
            .iter()
            .zip(buffers.iter())
            .map(|(key, buffer)| {
                let grant = peer.pin_key(key.to_string())?;
                if grant.buffer.len > buffer.len() as u64 {
                    let _ = self.unpin(peer, key, grant.read_operation_id);
                    return fail(
                        ErrorCode::InvalidParams,
                        format!(
                            "{key} needs {} bytes, buffer has {}",
                            grant.buffer.len,
                            buffer.len()
                        ),
                    );
                }
                Ok(grant)
            })
            .collect();
        let mut requests = Vec::new();
        let mut index = Vec::new();
        for (i, (grant, buffer)) in grants.iter().zip(buffers.iter_mut()).enumerate() {
            if let Ok(grant) = grant {
                index.push(i);
                requests.push(TransferRequest {
                    op: TransferOp::Read,
                    local_addr: buffer.as_mut_ptr() as usize,
                    len: grant.buffer.len,
                    endpoint: &grant.buffer.endpoint,
                    remote_addr: grant.buffer.addr,
                    epoch: 0,
                    send_by: None,
                });
            }
        }
        pause(&self.faults.read_delay_ms);
        // SAFETY: each local range is a distinct caller slice, exclusively borrowed for this
        // call and at least `len` bytes long (checked above).
        let moved = unsafe { self.forward_transfers(&mut requests) };
        let mut outcomes: Vec<Option<Result<()>>> = vec![None; keys.len()];
        for (i, outcome) in index.into_iter().zip(moved) {
            outcomes[i] = Some(outcome);
        }
        keys.iter()
            .zip(grants)
            .zip(outcomes)
            .map(|((key, grant), moved)| {
                let grant = grant?;
                match moved.unwrap_or(Err(ErrorCode::InternalError)) {
                    Ok(()) if started.elapsed() >= Duration::from_millis(grant.lease_ms) => fail(
                        ErrorCode::LeaseExpired,
                        format!("the read of {key} finished after its pin's lease"),
                    ),
                    Ok(()) => {
                        bump(&self.counters.forward_gets);
                        Ok(grant.buffer.len)
                    }
                    Err(code) => {
                        if let Err(unpin) = self.unpin(peer, key, grant.read_operation_id) {
                            tracing::warn!(key, %unpin, "UnPinKey failed; the lease reclaims the pin");
                        }
                        Err(code)
                    }
                }
            })
            .collect()
    }

    fn unpin(&self, peer: &dyn PeerApi, key: &str, id: u64) -> Result<()> {
        cleanup(&self.counters.unpins_sent, || {
            peer.un_pin_key(key.to_string(), id)
        })
    }

    /// A staging slot of `len` bytes (slots whose quarantine has passed are freed first).
    fn stage(&self, len: u64) -> Result<LocalAlloc> {
        let Some(staging) = &self.staging else {
            return fail(
                ErrorCode::InvalidParams,
                "REVERSE transfers need a staging buffer (local_buffer_size > 0); use FORWARD",
            );
        };
        self.held.release_due(Instant::now());
        staging.allocate(len)
    }

    /// The `valid_for_ms` of our REVERSE items: our RPC timeout.
    fn valid_for_ms(&self) -> u64 {
        u64::try_from(self.rpc_timeout.as_millis()).unwrap_or(u64::MAX)
    }

    fn describe(&self, slot: &LocalAlloc) -> RemoteBufferDesc {
        RemoteBufferDesc {
            endpoint: self.engine.local_name().to_string(),
            addr: slot.addr() as u64,
            len: slot.len(),
        }
    }

    /// REVERSE puts: one WriteRemoteData RPC for all values.
    pub(crate) fn reverse_put(
        &self,
        peer: &dyn PeerApi,
        keys: &[&str],
        values: &[&[u8]],
    ) -> Vec<Result<()>> {
        let slots: Vec<Result<LocalAlloc>> = values
            .iter()
            .map(|value| {
                let slot = self.stage(value.len() as u64)?;
                // SAFETY: the slot is ours, `value.len()` bytes; the source is the caller's
                // slice; distinct memory.
                unsafe { copy::copy_or_fail(slot.addr() as *mut u8, value.as_ptr(), value.len()) }?;
                bump(&self.counters.staging_copies);
                Ok(slot)
            })
            .collect();
        let answers = self.call_with_slots(
            keys,
            &slots,
            |key, source| RemoteWrite {
                key,
                source,
                valid_for_ms: self.valid_for_ms(),
            },
            |items| peer.write_remote_data(items),
        );
        let results = answers
            .iter()
            .map(|answer| {
                let outcome = *answer;
                if outcome.is_ok() {
                    bump(&self.counters.reverse_puts);
                }
                outcome
            })
            .collect();
        self.release(slots, &answers);
        results
    }

    /// Makes one RPC for the staged slots (item `make(key, slot descriptor)` each) and
    /// spreads its answers back over `slots` (an entry whose slot failed keeps its error).
    fn call_with_slots<I, T: Clone>(
        &self,
        keys: &[&str],
        slots: &[Result<LocalAlloc>],
        make: impl Fn(String, RemoteBufferDesc) -> I,
        rpc: impl FnOnce(Vec<I>) -> Result<Vec<Result<T>>>,
    ) -> Vec<Result<T>> {
        let items: Vec<I> = keys
            .iter()
            .zip(slots)
            .filter_map(|(key, slot)| {
                let slot = slot.as_ref().ok()?;
                Some(make(key.to_string(), self.describe(slot)))
            })
            .collect();
        let staged = items.len();
        let mut answers = match rpc(items) {
            Ok(answers) if answers.len() == staged => answers,
            Ok(_) => vec![Err(ErrorCode::RpcFail); staged],
            Err(code) => vec![Err(code); staged],
        }
        .into_iter();
        slots
            .iter()
            .map(|slot| match slot {
                Ok(_) => answers.next().unwrap_or(Err(ErrorCode::InternalError)),
                Err(code) => Err(*code),
            })
            .collect()
    }

    /// Returns each staging slot, or holds it in quarantine when the owner may still be
    /// moving bytes of its item ([`may_still_move`]).
    fn release<T>(&self, slots: Vec<Result<LocalAlloc>>, answers: &[Result<T>]) {
        let until = deadline(Instant::now(), self.quarantine);
        for (slot, answer) in slots.into_iter().zip(answers) {
            if let (Ok(slot), Err(code)) = (slot, answer) {
                if may_still_move(*code) {
                    bump(&self.counters.staging_quarantined);
                    self.held.hold(slot, until);
                }
            }
        }
    }

    /// REVERSE gets: one ReadRemoteData RPC for all keys; `sizes[i]` from the route.
    pub(crate) fn reverse_get(
        &self,
        peer: &dyn PeerApi,
        keys: &[&str],
        sizes: &[u64],
        buffers: &mut [&mut [u8]],
    ) -> Vec<Result<u64>> {
        let slots: Vec<Result<LocalAlloc>> = sizes
            .iter()
            .zip(buffers.iter())
            .zip(keys)
            .map(|((&size, buffer), key)| {
                if size > buffer.len() as u64 {
                    return fail(
                        ErrorCode::InvalidParams,
                        format!("{key} needs {size} bytes, buffer has {}", buffer.len()),
                    );
                }
                self.stage(size)
            })
            .collect();
        let answers = self.call_with_slots(
            keys,
            &slots,
            |key, target| RemoteRead {
                key,
                target,
                valid_for_ms: self.valid_for_ms(),
            },
            |items| peer.read_remote_data(items),
        );
        let results: Vec<Result<u64>> = slots
            .iter()
            .zip(answers.iter().cloned())
            .zip(buffers.iter_mut())
            .map(|((slot, answer), buffer)| {
                let slot = slot.as_ref().map_err(|e| *e)?;
                let len = answer?;
                if len > slot.len() || len > buffer.len() as u64 {
                    return fail(
                        ErrorCode::RpcFail,
                        "owner reported a larger value than staged",
                    );
                }
                // SAFETY: the owner filled `len` ≤ slot bytes of our slot; the target is the
                // caller's exclusive slice of at least `len` bytes.
                unsafe {
                    copy::copy_or_fail(buffer.as_mut_ptr(), slot.addr() as *const u8, len as usize)
                }?;
                bump(&self.counters.staging_copies);
                bump(&self.counters.reverse_gets);
                Ok(len)
            })
            .collect();
        self.release(slots, &answers);
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::MasterApi;
    use crate::p2p::api::{ReadGrant, RemoteWrite};
    use crate::p2p::counters::P2pCounters;
    use crate::p2p::owner::{DataManager, OwnerParts};
    use crate::p2p::tiered::TieredBackend;
    use crate::transfer::{DirectResolver, EngineConfig};
    use parking_lot::Mutex;

    /// An owner whose every REVERSE item fails with `TRANSFER_FAIL`; records the slots it
    /// was given.
    #[derive(Default)]
    struct FailingOwner {
        slots: Mutex<Vec<RemoteBufferDesc>>,
    }

    impl FailingOwner {
        fn fail_all<T>(
            &self,
            descs: impl Iterator<Item = RemoteBufferDesc>,
        ) -> Result<Vec<Result<T>>> {
            let mut slots = self.slots.lock();
            let before = slots.len();
            slots.extend(descs);
            Ok((before..slots.len())
                .map(|_| Err(ErrorCode::TransferFail))
                .collect())
        }
    }

    impl PeerApi for FailingOwner {
        fn write_remote_data(&self, items: Vec<RemoteWrite>) -> Result<Vec<Result<()>>> {
            self.fail_all(items.into_iter().map(|i| i.source))
        }
        fn read_remote_data(&self, items: Vec<RemoteRead>) -> Result<Vec<Result<u64>>> {
            self.fail_all(items.into_iter().map(|i| i.target))
        }
        fn pre_write(&self, _: String, _: u64) -> Result<WriteGrant> {
            Err(ErrorCode::InternalError)
        }
        fn write_commit(&self, _: String, _: u64) -> Result<()> {
            Err(ErrorCode::InternalError)
        }
        fn write_revoke(&self, _: String, _: u64) -> Result<()> {
            Err(ErrorCode::InternalError)
        }
        fn pin_key(&self, _: String) -> Result<ReadGrant> {
            Err(ErrorCode::InternalError)
        }
        fn un_pin_key(&self, _: String, _: u64) -> Result<()> {
            Err(ErrorCode::InternalError)
        }
        fn remove_data(&self, _: Vec<String>) -> Result<Vec<Result<()>>> {
            Err(ErrorCode::InternalError)
        }
        fn counters(&self) -> Result<P2pCounters> {
            Err(ErrorCode::InternalError)
        }
    }

    /// The RPC timeout of the test accessor (and of [`TimingOut`]).
    const RPC_TIMEOUT: Duration = Duration::from_millis(100);

    fn accessor() -> Accessor {
        accessor_with(Duration::from_millis(300))
    }

    fn accessor_with(quarantine: Duration) -> Accessor {
        let engine = TransferEngine::new(EngineConfig {
            local_name: "accessor".into(),
            listener: None,
            resolver: Arc::new(DirectResolver),
            memcpy_enabled: true,
            rdma: None,
        })
        .unwrap();
        let staging = Arc::new(LocalBuffer::with_access(1 << 20, &engine, true).unwrap());
        Accessor::new(
            engine,
            Some(staging),
            Arc::default(),
            Arc::default(),
            quarantine,
            RPC_TIMEOUT,
        )
    }

    /// An owner in this process on `engine` (1 MiB DRAM tier) with its own P2P master.
    fn owner(engine: &Arc<TransferEngine>, lease: Duration, quarantine: Duration) -> DataManager {
        let master = crate::master::MasterService::new(crate::master::MasterConfig {
            deployment_mode: crate::types::DeploymentMode::P2p,
            ..Default::default()
        });
        let id = crate::types::Uuid::random();
        master
            .p2p_register_owner(crate::types::P2pOwner {
                client: id,
                name: engine.local_name().to_string(),
                rpc_addr: "127.0.0.1:1".into(),
            })
            .unwrap();
        let tiers = crate::p2p::config::TieredConfig::parse(
            r#"{"tiers":[{"type":"DRAM","capacity":1048576}]}"#,
        )
        .unwrap();
        DataManager::new(OwnerParts {
            backend: TieredBackend::new(&tiers, engine, 4).unwrap(),
            engine: Arc::clone(engine),
            master,
            id,
            lease,
            shards: 4,
            counters: Arc::default(),
            quarantine,
        })
    }

    use crate::test_util::wait_until;

    /// Review of issue 11, P2P (1): a FORWARD put whose PreWrite lease ended before its
    /// transfer started writes no byte into the owner's tier — the range already belongs to
    /// another key — and reports an error.
    #[test]
    fn forward_put_never_writes_after_its_prewrite_lease() {
        let accessor = accessor();
        let owner = owner(&accessor.engine, Duration::from_millis(50), Duration::ZERO);
        accessor.faults.delay_writes(Duration::from_millis(600));
        let (v1, v2) = (vec![1u8; 4096], vec![2u8; 4096]);
        std::thread::scope(|s| {
            let late = s.spawn(|| accessor.forward_put(&owner, &["k1"], &[&v1[..]]));
            assert!(
                wait_until(Duration::from_secs(3), || {
                    owner.scan();
                    let now = owner.counters().unwrap();
                    now.pending_created == 1 && now.pending_records == 0
                }),
                "k1's PreWrite expired"
            );
            owner.put_local("k2", &v2).unwrap();
            let outcome = late.join().unwrap();
            assert!(
                matches!(
                    outcome[..],
                    [Err(ErrorCode::StaleWriteToken | ErrorCode::LeaseExpired)]
                ),
                "{outcome:?}"
            );
        });
        let mut got = vec![0u8; 4096];
        assert_eq!(owner.get_local("k2", &mut got), Ok(4096));
        assert!(got == v2, "k2 holds bytes of k1's expired write");
        assert_eq!(
            owner.get_local("k1", &mut got),
            Err(ErrorCode::ObjectNotFound)
        );
    }

    /// Forwards REVERSE calls to `owner` on a thread of its own, but answers `RPC_TIMEOUT`
    /// after `wait` like an RPC client whose owner is overloaded; the call goes on. The
    /// handlers still running are in `late`.
    struct TimingOut {
        owner: Arc<DataManager>,
        wait: Duration,
        late: Mutex<Vec<std::thread::JoinHandle<()>>>,
    }

    impl TimingOut {
        fn call<T: Send + 'static>(
            &self,
            f: impl FnOnce(&DataManager) -> Result<T> + Send + 'static,
        ) -> Result<T> {
            let (tx, rx) = std::sync::mpsc::channel();
            let owner = Arc::clone(&self.owner);
            self.late.lock().push(std::thread::spawn(move || {
                let _ = tx.send(f(&owner));
            }));
            rx.recv_timeout(self.wait)
                .unwrap_or(Err(ErrorCode::RpcTimeout))
        }

        /// Waits for every handler to end.
        fn join(&self) {
            for handler in self.late.lock().drain(..) {
                handler.join().unwrap();
            }
        }
    }

    impl PeerApi for TimingOut {
        fn write_remote_data(&self, items: Vec<RemoteWrite>) -> Result<Vec<Result<()>>> {
            self.call(move |owner| owner.write_remote_data(items))
        }
        fn read_remote_data(&self, items: Vec<RemoteRead>) -> Result<Vec<Result<u64>>> {
            self.call(move |owner| owner.read_remote_data(items))
        }
        fn pre_write(&self, _: String, _: u64) -> Result<WriteGrant> {
            Err(ErrorCode::InternalError)
        }
        fn write_commit(&self, _: String, _: u64) -> Result<()> {
            Err(ErrorCode::InternalError)
        }
        fn write_revoke(&self, _: String, _: u64) -> Result<()> {
            Err(ErrorCode::InternalError)
        }
        fn pin_key(&self, _: String) -> Result<ReadGrant> {
            Err(ErrorCode::InternalError)
        }
        fn un_pin_key(&self, _: String, _: u64) -> Result<()> {
            Err(ErrorCode::InternalError)
        }
        fn remove_data(&self, _: Vec<String>) -> Result<Vec<Result<()>>> {
            Err(ErrorCode::InternalError)
        }
        fn counters(&self) -> Result<P2pCounters> {
            self.owner.counters()
        }
    }

    /// Frees the accessor's quarantined slots once due (bounded wait).
    fn drain_quarantine(accessor: &Accessor) {
        assert!(wait_until(Duration::from_secs(3), || {
            accessor.held.release_due(Instant::now());
            accessor.held.len() == 0
        }));
    }

    /// Review of issue 11, P2P (2): a REVERSE owner whose handler starts after the accessor
    /// gave up (RPC timeout; the staging slot was quarantined, then reused for another
    /// key) moves no byte: put(k1) does not commit k2's bytes, get(k1) does not push into
    /// the slot another get is using. The owner counts the refusals.
    #[test]
    fn reverse_owner_never_transfers_after_the_accessor_gave_up() {
        let accessor = accessor();
        let slow = TimingOut {
            owner: Arc::new(
                owner(&accessor.engine, Duration::from_secs(5), Duration::ZERO)
                    .with_stage_delay(Duration::from_millis(800)),
            ),
            wait: RPC_TIMEOUT,
            late: Mutex::default(),
        };
        let fast = owner(&accessor.engine, Duration::from_secs(5), Duration::ZERO);
        let (v1, v2) = (vec![1u8; 4096], vec![2u8; 4096]);
        assert_eq!(
            accessor.reverse_put(&slow, &["k1"], &[&v1[..]]),
            vec![Err(ErrorCode::RpcTimeout)]
        );
        drain_quarantine(&accessor);
        assert_eq!(
            accessor.reverse_put(&fast, &["k2"], &[&v2[..]]),
            vec![Ok(())]
        );
        slow.join();
        let mut got = vec![0u8; 4096];
        match slow.owner.get_local("k1", &mut got) {
            Ok(_) => assert!(got == v1, "k1 was committed with k2's bytes"),
            Err(code) => assert_eq!(code, ErrorCode::ObjectNotFound),
        }
        // REVERSE get: the late push must not land in the slot a later get is filling.
        slow.owner.put_local("k3", &v1).unwrap();
        let mut buffer = vec![0u8; 4096];
        let get = |peer: &dyn PeerApi, key: &str, buffer: &mut Vec<u8>| {
            accessor.reverse_get(peer, &[key], &[4096], &mut [&mut buffer[..]])
        };
        assert_eq!(
            get(&slow, "k3", &mut buffer),
            vec![Err(ErrorCode::RpcTimeout)]
        );
        drain_quarantine(&accessor);
        let slot = accessor.stage(4096).unwrap();
        // SAFETY: our own fresh slot of 4096 bytes.
        unsafe { std::ptr::write_bytes(slot.addr() as *mut u8, 9, 4096) };
        slow.join();
        // SAFETY: as above; the slot is still ours.
        let after = unsafe { std::slice::from_raw_parts(slot.addr() as *const u8, 4096) };
        assert!(
            after.iter().all(|&b| b == 9),
            "a late push landed in a reused slot"
        );
        let refused = slow.owner.counters().unwrap().reverse_late_refused;
        assert_eq!(refused, 2, "the owner counts both refusals");
    }

    /// Review of issue 11, P2P (3): a quarantine (and lease) of `u64::MAX` ms never panics,
    /// on the owner's and on the accessor's paths.
    #[test]
    fn huge_quarantine_and_lease_never_panic() {
        let max = Duration::from_millis(u64::MAX);
        let accessor = accessor_with(max);
        let value = vec![3u8; 4096];
        assert_eq!(
            accessor.reverse_put(&FailingOwner::default(), &["k"], &[&value[..]]),
            vec![Err(ErrorCode::TransferFail)]
        );
        assert_eq!(accessor.held.len(), 1);
        let owner = owner(&accessor.engine, max, max);
        let grant = owner.pre_write("k".into(), 4096).unwrap();
        owner
            .write_revoke("k".into(), grant.write_operation_id)
            .unwrap();
        owner.put_local("k", &value).unwrap();
        owner.pin_key("k".into()).unwrap();
        owner.remove_data(vec!["k".into()]).unwrap();
        owner.scan();
        assert_eq!(owner.counters().unwrap().quarantined_allocations, 2);
        assert_eq!(
            accessor.forward_put(&owner, &["f"], &[&value[..]]),
            vec![Ok(())]
        );
    }

    fn overlap(a: &RemoteBufferDesc, b: &RemoteBufferDesc) -> bool {
        a.addr < b.addr + b.len && b.addr < a.addr + a.len
    }

    /// Failure 3 (REVERSE half): a staging slot whose item failed with `TRANSFER_FAIL` is
    /// not handed out again while the failed transfer may still land bytes in it.
    #[test]
    fn slots_of_failed_reverse_items_are_quarantined_before_reuse() {
        let accessor = accessor();
        let owner = FailingOwner::default();
        let value = vec![7u8; 4096];
        let mut buffer = vec![0u8; 4096];
        let get = |accessor: &Accessor, buffer: &mut Vec<u8>| {
            accessor.reverse_get(&owner, &["k"], &[4096], &mut [&mut buffer[..]])
        };
        assert_eq!(
            get(&accessor, &mut buffer),
            vec![Err(ErrorCode::TransferFail)]
        );
        assert_eq!(
            accessor.reverse_put(&owner, &["k"], &[&value[..]]),
            vec![Err(ErrorCode::TransferFail)]
        );
        assert_eq!(
            get(&accessor, &mut buffer),
            vec![Err(ErrorCode::TransferFail)]
        );
        let slots = owner.slots.lock().clone();
        assert_eq!(slots.len(), 3);
        for (i, a) in slots.iter().enumerate() {
            for b in &slots[i + 1..] {
                assert!(
                    !overlap(a, b),
                    "a failed slot was reused at once: {slots:?}"
                );
            }
        }
        assert_eq!(
            accessor
                .counters
                .staging_quarantined
                .load(Ordering::Relaxed),
            3
        );
        // After the quarantine the first slot is handed out again (best fit, lowest offset).
        let started = Instant::now();
        let mut back = false;
        while !back && started.elapsed() < Duration::from_secs(5) {
            back = accessor.stage(4096).unwrap().addr() as u64 == slots[0].addr;
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(back, "quarantined slots come back");
        assert_eq!(accessor.held.len(), 0);
    }
}
