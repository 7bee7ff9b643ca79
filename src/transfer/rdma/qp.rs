//! One reliable-connected queue pair with its own completion queue: connecting it to a peer's
//! endpoint, and running RDMA READ/WRITE work requests with bounded outstanding work.
//!
//! Completions are taken by the thread that runs the work (the one holding the QP), so a
//! batch's completions never wait behind another batch's; between empty polls it yields
//! (`MC_RDMA_COMPLETION=poll`) or sleeps until the device's event thread reports a
//! completion event for its CQ (`event`, see `super::events`). An asynchronous CQ or QP
//! error (a CQ overrun) fails the run at once. A QP that saw an error completion
//! or a timeout is moved to the error state, drained (every posted request has completed,
//! flushed, before [`QueuePair::run`] returns, so the NIC touches no caller memory after
//! it) and reported broken; the owner drops it and connects a new one.

use super::device::{RdmaDevice, PORT};
use super::events::{CompletionMode, CqSignal};
use super::verbs::{self, Cq, Gid, Qp, QpAttr, QpCap, QpInitAttr, SendWr, Sge, WorkCompletion};
use crate::env;
use crate::error::{fail, ErrorCode, Result};
use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a peer needs to connect its QP to ours: exchanged in the handshake.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
}

/// Bytes of an encoded [`Endpoint`].
pub(crate) const ENDPOINT_LEN: usize = 26;

impl Endpoint {
    /// Little-endian `qpn, psn, lid`, then the raw GID.
    pub(crate) fn encode(&self) -> [u8; ENDPOINT_LEN] {
        let mut out = [0u8; ENDPOINT_LEN];
        out[0..4].copy_from_slice(&self.qpn.to_le_bytes());
        out[4..8].copy_from_slice(&self.psn.to_le_bytes());
        out[8..10].copy_from_slice(&self.lid.to_le_bytes());
        out[10..26].copy_from_slice(&self.gid);
        out
    }

    /// Inverse of [`Endpoint::encode`].
    pub(crate) fn decode(bytes: &[u8; ENDPOINT_LEN]) -> Endpoint {
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[10..26]);
        Endpoint {
            qpn: word(0),
            psn: word(4),
            lid: u16::from_le_bytes([bytes[8], bytes[9]]),
            gid,
        }
    }
}

/// Queue-pair tunables (Mooncake's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpSettings {
    /// `MC_MAX_WR`: work requests outstanding on one QP.
    pub(crate) max_wr: u32,
    /// `MC_CQ_DEPTH`: entries asked for the QP's completion queue (default `max_wr`; the
    /// provider may round it up). Smaller than `max_wr` lets the CQ overrun.
    pub(crate) cq_depth: u32,
    /// `MC_IB_TIMEOUT`: local ACK timeout exponent (4.096 µs × 2^n).
    pub(crate) ack_timeout: u8,
    /// `MC_IB_RETRY_CNT`: transport retries before a work request fails.
    pub(crate) retry_cnt: u8,
    /// `MC_RDMA_COMPLETION`: how the runner waits for completions.
    pub(crate) completion: CompletionMode,
}

impl QpSettings {
    /// From the environment; a value that does not parse or is out of range falls back to
    /// the default, silently (max_wr 1..=4096, default 256; CQ depth 1..=65536, default
    /// max_wr; timeout 1..=31, default 14; retries 0..=7, default 7; see `env.rs`).
    pub(crate) fn from_env() -> QpSettings {
        let max_wr = env::MAX_WR.get() as u32;
        QpSettings {
            max_wr,
            // 0: unset or out of range, which stands for max_wr.
            cq_depth: match env::CQ_DEPTH.get() {
                0 => max_wr,
                depth => depth as u32,
            },
            ack_timeout: env::IB_TIMEOUT.get() as u8,
            retry_cnt: env::IB_RETRY_CNT.get() as u8,
            completion: CompletionMode::from_env(),
        }
    }
}

/// One one-sided operation: `len` bytes between local `[local, local+len)` (in a region
/// with key `lkey`) and the peer's `remote` (in a region with key `rkey`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkRequest {
    /// `true`: RDMA READ (remote → local); `false`: RDMA WRITE.
    pub(crate) read: bool,
    pub(crate) local: u64,
    pub(crate) lkey: u32,
    pub(crate) len: u32,
    pub(crate) remote: u64,
    pub(crate) rkey: u32,
}

/// How [`QueuePair::run`] ended for one work request.
pub(crate) type Completion = std::result::Result<(), String>;

/// An RC QP and its CQ. `Send`, not shared: one thread runs work on it at a time.
pub(crate) struct QueuePair {
    device: Arc<RdmaDevice>,
    cq: *mut Cq,
    qp: *mut Qp,
    settings: QpSettings,
    psn: u32,
    broken: bool,
    /// The CQ's and QP's context: completion events and asynchronous errors. Freed after
    /// both are destroyed (field order: after `Drop::drop` ran).
    signal: Box<CqSignal>,
    /// Event mode: the CQ is armed for its next completion event.
    armed: bool,
}

// SAFETY: the QP and CQ are handles usable from any thread; `&mut self` serialises use.
unsafe impl Send for QueuePair {}

impl QueuePair {
    /// Creates a QP (in RESET) with a CQ of `settings.cq_depth` entries (attached to the
    /// device's completion channel in event mode).
    ///
    /// Errors: `TRANSFER_FAIL` when the device's event thread cannot start or the device
    /// refuses the CQ or QP.
    pub(crate) fn new(device: &Arc<RdmaDevice>, settings: QpSettings) -> Result<QueuePair> {
        let verbs = device.verbs;
        let depth = settings.cq_depth as c_int;
        let events = device.events()?;
        let channel = match settings.completion {
            CompletionMode::Poll => std::ptr::null_mut(),
            CompletionMode::Event => events.channel(),
        };
        let signal = Box::<CqSignal>::default();
        let context = &*signal as *const CqSignal as *mut std::ffi::c_void;
        // SAFETY: a live context and channel; `context` outlives the CQ; vector 0.
        let cq = unsafe { (verbs.create_cq)(device.context, depth, context, channel.cast(), 0) };
        if cq.is_null() {
            return fail(
                ErrorCode::TransferFail,
                format_args!(
                    "ibv_create_cq({depth}) failed: {}",
                    std::io::Error::last_os_error()
                ),
            );
        }
        let mut init = QpInitAttr {
            qp_context: context,
            send_cq: cq,
            recv_cq: cq,
            srq: std::ptr::null_mut(),
            cap: QpCap {
                max_send_wr: settings.max_wr,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: verbs::QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: a live PD; `init` is a filled ibv_qp_init_attr.
        let qp = unsafe { (verbs.create_qp)(device.pd, &mut init) };
        if qp.is_null() {
            let error = std::io::Error::last_os_error();
            // SAFETY: created above, unused.
            unsafe { (verbs.destroy_cq)(cq) };
            return fail(
                ErrorCode::TransferFail,
                format_args!("ibv_create_qp failed: {error}"),
            );
        }
        Ok(QueuePair {
            device: Arc::clone(device),
            cq,
            qp,
            settings,
            psn: fresh_psn(),
            broken: false,
            signal,
            armed: false,
        })
    }

    /// What the peer needs to connect to this QP.
    pub(crate) fn endpoint(&self) -> Endpoint {
        Endpoint {
            // SAFETY: live until drop.
            qpn: unsafe { (*self.qp).qp_num },
            psn: self.psn,
            lid: self.device.lid,
            gid: self.device.gid.raw,
        }
    }

    /// The QP's current state as the library reports it (`ibv_query_qp`; the layout check).
    #[cfg(test)]
    pub(crate) fn state(&self) -> Result<u32> {
        let mut attr = QpAttr::default();
        let mut init = QpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: std::ptr::null_mut(),
            recv_cq: std::ptr::null_mut(),
            srq: std::ptr::null_mut(),
            cap: QpCap::default(),
            qp_type: 0,
            sq_sig_all: 0,
        };
        // SAFETY: a live QP; both out-structs are the header's.
        let rc =
            unsafe { (self.device.verbs.query_qp)(self.qp, &mut attr, verbs::QP_STATE, &mut init) };
        if rc != 0 {
            return fail(
                ErrorCode::TransferFail,
                format_args!("ibv_query_qp returned {rc}"),
            );
        }
        Ok(attr.qp_state)
    }

    fn modify(&self, attr: &mut QpAttr, mask: c_int, what: &str) -> Result<()> {
        // SAFETY: a live QP; `attr` is a filled ibv_qp_attr.
        let rc = unsafe { (self.device.verbs.modify_qp)(self.qp, attr, mask) };
        if rc != 0 {
            return fail(
                ErrorCode::TransferFail,
                format_args!(
                    "ibv_modify_qp to {what} returned {rc} ({})",
                    std::io::Error::from_raw_os_error(rc)
                ),
            );
        }
        Ok(())
    }

    /// Moves the QP through INIT and RTR to RTS, connected to `remote`.
    ///
    /// Errors: `TRANSFER_FAIL` when a transition is refused.
    pub(crate) fn connect(&mut self, remote: &Endpoint) -> Result<()> {
        let access =
            verbs::ACCESS_LOCAL_WRITE | verbs::ACCESS_REMOTE_WRITE | verbs::ACCESS_REMOTE_READ;
        let mut attr = QpAttr {
            qp_state: verbs::QPS_INIT,
            pkey_index: 0,
            port_num: PORT,
            qp_access_flags: access as u32,
            ..QpAttr::default()
        };
        self.modify(
            &mut attr,
            verbs::QP_STATE | verbs::QP_PKEY_INDEX | verbs::QP_PORT | verbs::QP_ACCESS_FLAGS,
            "INIT",
        )?;
        let mut attr = QpAttr {
            qp_state: verbs::QPS_RTR,
            path_mtu: self.device.active_mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            ..QpAttr::default()
        };
        attr.ah_attr.is_global = 1;
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.port_num = PORT;
        attr.ah_attr.grh.dgid = Gid { raw: remote.gid };
        attr.ah_attr.grh.sgid_index = self.device.gid_index;
        attr.ah_attr.grh.hop_limit = 64;
        self.modify(
            &mut attr,
            verbs::QP_STATE
                | verbs::QP_AV
                | verbs::QP_PATH_MTU
                | verbs::QP_DEST_QPN
                | verbs::QP_RQ_PSN
                | verbs::QP_MAX_DEST_RD_ATOMIC
                | verbs::QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        let mut attr = QpAttr {
            qp_state: verbs::QPS_RTS,
            timeout: self.settings.ack_timeout,
            retry_cnt: self.settings.retry_cnt,
            rnr_retry: 7,
            sq_psn: self.psn,
            max_rd_atomic: 16,
            ..QpAttr::default()
        };
        self.modify(
            &mut attr,
            verbs::QP_STATE
                | verbs::QP_TIMEOUT
                | verbs::QP_RETRY_CNT
                | verbs::QP_RNR_RETRY
                | verbs::QP_SQ_PSN
                | verbs::QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    /// Whether an error completion or timeout broke this QP (drop it and connect anew).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Runs `requests`, at most `max_wr` outstanding, and waits for every completion; one
    /// result per request, in order. No request is posted at or after `post_by` (a writer's
    /// grant ended): the rest fail as not posted, and the QP stays usable, not broken (so an
    /// error with [`Self::is_broken`] false means exactly that). After an error completion
    /// nothing more is posted (the QP is in error; the rest fail as not run); at `deadline`,
    /// when `peer_alive` (asked every [`LIVENESS_PERIOD`] without a completion) says the peer
    /// is gone, or when the device reported an asynchronous error for the CQ or QP (a CQ
    /// overrun), the QP is moved to the error state and drained. A completion naming no
    /// request of this run also fails it. Either way the QP is marked broken, and every
    /// posted request has completed (or flushed, or the QP is destroyed) before this
    /// returns, so no caller memory is touched after.
    ///
    /// # Safety
    /// Every request's local range is registered with its `lkey` and valid for the
    /// operation until this returns.
    pub(crate) unsafe fn run(
        &mut self,
        requests: &[WorkRequest],
        deadline: Instant,
        post_by: Option<Instant>,
        peer_alive: &dyn Fn() -> bool,
    ) -> Vec<Completion> {
        let mut results: Vec<Option<Completion>> = vec![None; requests.len()];
        if self.broken {
            return vec![Err("queue pair is in error state".into()); requests.len()];
        }
        let mut next = 0;
        let mut outstanding = 0u32;
        let mut failure: Option<String> = None;
        let mut late = false;
        let mut completions = vec![WorkCompletion::default(); 32];
        let mut progress = Instant::now();
        loop {
            while failure.is_none()
                && !late
                && next < requests.len()
                && outstanding < self.settings.max_wr
            {
                if post_by.is_some_and(|by| Instant::now() >= by) {
                    late = true;
                    break;
                }
                // SAFETY: forwarded from the caller.
                match unsafe { self.post(next as u64, &requests[next]) } {
                    Ok(()) => {
                        outstanding += 1;
                        next += 1;
                    }
                    Err(problem) => failure = Some(problem),
                }
            }
            if outstanding == 0 {
                break;
            }
            let polled = self.poll(&mut completions);
            if polled < 0 {
                let cause = failure.get_or_insert_with(|| format!("ibv_poll_cq returned {polled}"));
                self.drain(cause, &mut results, &mut outstanding);
                break;
            }
            for wc in &completions[..polled as usize] {
                outstanding = outstanding.saturating_sub(1);
                let slot = results.get_mut(wc.wr_id as usize);
                let outcome = if wc.status == verbs::WC_SUCCESS {
                    Ok(())
                } else {
                    let problem = describe(wc);
                    failure.get_or_insert_with(|| problem.clone());
                    Err(problem)
                };
                match slot {
                    Some(slot) => *slot = Some(outcome),
                    // Not one of ours: the provider misbehaves; trust nothing of this QP.
                    None => {
                        failure.get_or_insert_with(|| {
                            format!("a completion names unknown work request {}", wc.wr_id)
                        });
                    }
                }
            }
            let now = Instant::now();
            if polled > 0 {
                progress = now;
            } else if let Some(fault) = self.signal.fault() {
                let cause = failure.get_or_insert(fault);
                self.drain(cause, &mut results, &mut outstanding);
                break;
            } else if now >= deadline {
                let cause =
                    failure.get_or_insert_with(|| "timed out waiting for completions".into());
                self.drain(cause, &mut results, &mut outstanding);
                break;
            } else if now >= progress + LIVENESS_PERIOD {
                if !peer_alive() {
                    let cause = failure.get_or_insert_with(|| {
                        "the peer closed its control connection (it died or shut down)".into()
                    });
                    self.drain(cause, &mut results, &mut outstanding);
                    break;
                }
                progress = now;
            }
            if polled == 0 {
                self.idle(deadline.min(progress + LIVENESS_PERIOD));
            }
        }
        if failure.is_some() {
            self.broken = true;
        }
        let unrun = match &failure {
            Some(problem) => format!("not run: {problem}"),
            None if late => "not posted: its writer's grant ended".into(),
            None => "not run".into(),
        };
        results
            .into_iter()
            .map(|slot| slot.unwrap_or_else(|| Err(unrun.clone())))
            .collect()
    }

    /// Posts one signalled work request with `wr_id`.
    ///
    /// # Safety
    /// As [`QueuePair::run`].
    unsafe fn post(&self, wr_id: u64, request: &WorkRequest) -> std::result::Result<(), String> {
        let mut sge = Sge {
            addr: request.local,
            length: request.len,
            lkey: request.lkey,
        };
        let opcode = if request.read {
            verbs::WR_RDMA_READ
        } else {
            verbs::WR_RDMA_WRITE
        };
        let mut wr = SendWr::rdma(wr_id, opcode, &mut sge, request.remote, request.rkey);
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP whose context holds the ops table; `wr` and `sge` outlive the
        // call (the library copies them into the send queue).
        let rc = unsafe {
            let context = (*self.qp).context;
            match (*context).ops.post_send {
                Some(post_send) => post_send(self.qp, &mut wr, &mut bad),
                None => return Err("the provider has no post_send".into()),
            }
        };
        if rc != 0 {
            return Err(format!(
                "ibv_post_send returned {rc} ({})",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(())
    }

    /// Waits (at most until `until`) after an empty poll: poll mode yields; event mode arms
    /// the CQ first (and returns, so the caller polls once more before sleeping: a
    /// completion that came before the arm raises no event), then sleeps on the signal.
    fn idle(&mut self, until: Instant) {
        match self.settings.completion {
            CompletionMode::Poll => std::thread::yield_now(),
            CompletionMode::Event if !self.armed => {
                // SAFETY: a live CQ whose context holds the ops table.
                let rc = unsafe {
                    let context = (*self.cq).context;
                    (*context).ops.req_notify_cq.map(|arm| arm(self.cq, 0))
                };
                self.armed = rc == Some(0);
                if !self.armed {
                    std::thread::yield_now();
                }
            }
            CompletionMode::Event => {
                if self.signal.wait(until) {
                    self.armed = false;
                }
            }
        }
    }

    /// Polls up to `out.len()` completions; the count, or a negative provider error.
    fn poll(&self, out: &mut [WorkCompletion]) -> c_int {
        // SAFETY: a live CQ whose context holds the ops table; `out` has room for the count.
        unsafe {
            let context = (*self.cq).context;
            match (*context).ops.poll_cq {
                Some(poll_cq) => poll_cq(self.cq, out.len() as c_int, out.as_mut_ptr()),
                None => -1,
            }
        }
    }

    /// Moves the QP to the error state because of `cause` and waits (bounded) until every
    /// outstanding request has flushed, filling their results with `cause` and the
    /// completion (a flushed request's own status says only "flushed"). If the flush does
    /// not finish in time, or cannot (an asynchronous CQ error: completions were lost), the
    /// QP is destroyed now, which also stops the NIC touching the memory.
    fn drain(&mut self, cause: &str, results: &mut [Option<Completion>], outstanding: &mut u32) {
        self.broken = true;
        let mut attr = QpAttr {
            qp_state: verbs::QPS_ERR,
            ..QpAttr::default()
        };
        let _ = self.modify(&mut attr, verbs::QP_STATE, "ERR");
        let until = Instant::now() + DRAIN_WAIT;
        let mut completions = vec![WorkCompletion::default(); 32];
        while *outstanding > 0 && Instant::now() < until && self.signal.fault().is_none() {
            let polled = self.poll(&mut completions);
            if polled < 0 {
                break;
            }
            for wc in &completions[..polled as usize] {
                *outstanding = outstanding.saturating_sub(1);
                if let Some(slot) = results.get_mut(wc.wr_id as usize) {
                    slot.get_or_insert_with(|| Err(format!("{cause}; {}", describe(wc))));
                }
            }
            if polled == 0 {
                std::thread::yield_now();
            }
        }
        if *outstanding > 0 {
            // Destroying the QP is what stops the NIC now.
            self.destroy();
        }
    }

    fn destroy(&mut self) {
        let verbs = self.device.verbs;
        // SAFETY: owned handles, destroyed once (nulled here).
        unsafe {
            if !self.qp.is_null() {
                (verbs.destroy_qp)(self.qp);
                self.qp = std::ptr::null_mut();
            }
            if !self.cq.is_null() {
                (verbs.destroy_cq)(self.cq);
                self.cq = std::ptr::null_mut();
            }
        }
    }
}

/// How long [`QueuePair::run`] waits without a completion before it asks whether the peer
/// is still there.
const LIVENESS_PERIOD: Duration = Duration::from_millis(10);
/// How long a broken QP's flush is waited for.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

fn describe(wc: &WorkCompletion) -> String {
    let name = match wc.status {
        // Only a drain reports a success as an error: the run had already failed.
        verbs::WC_SUCCESS => "success, but the run had already failed",
        verbs::WC_REM_ACCESS_ERR => "remote access error (stale or wrong rkey)",
        5 => "flushed (queue pair in error)",
        12 => "transport retry counter exceeded (peer gone?)",
        13 => "RNR retry counter exceeded",
        _ => "error",
    };
    format!(
        "work completion status {} ({name}), vendor error {:#x}",
        wc.status, wc.vendor_err
    )
}

/// A 24-bit packet sequence number that differs between QPs.
fn fresh_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(std::process::id().into());
    (hasher.finish() as u32) & 0x00ff_ffff
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.destroy();
    }
}
