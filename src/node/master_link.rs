//! A process handle's link to its master: which master (decided once, from
//! `master_server_addr`: the in-process [`MasterService`] for `embedded` or empty, else a
//! remote one over RPC), the handle's data-path [`MasterApi`], and the **single liveness
//! loop** both clients use.
//!
//! Liveness: every handle that a remote master must keep alive (every centralized client, with
//! or without a segment; every P2P owner) pings once a second over a connection of its own
//! with a short timeout (`MC_PING_TIMEOUT_MS`), so a slow data-path call or a stalled server
//! shard cannot make it miss `client_ttl`. A failed ping is retried once on a fresh
//! connection; a second failure marks the master unreachable (`health_check` = 2). Each
//! answer updates the handle's [`Standing`] (the proof that pins it took are still held) and
//! goes to the handle's [`LivenessHook`] with the time its ping was sent: the
//! centralized client remounts its segment on `NeedRemount`, a P2P owner re-registers and
//! republishes its keys. A hook that fails leaves the master marked unreachable, and runs
//! again on the next answer. An embedded handle runs no loop: its master keeps it alive (see
//! `MasterService::keep_alive`).
//!
//! Ownership and threads: the link owns the loop's thread, which holds the hook weakly, so
//! dropping the handle ends it; [`MasterLink::stop_liveness`] ends it at once and
//! [`MasterLink::shutdown`] also shuts the embedded master down. All methods take `&self` and are thread-safe.

use super::standing::Standing;
use crate::env;
use crate::error::Result;
use crate::ha::{is_etcd_addr, LeaderView};
use crate::master::{
    connect_master, connect_pinger, MasterApi, MasterConfig, MasterService, RemoteMaster,
    RpcMasterClient,
};
use crate::rpc::{Resolve, Timeouts};
use crate::types::{ClientId, PingResponse, EMBEDDED_MASTER};
use crossbeam_channel::{bounded, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Interval between pings (Mooncake: 1 s).
pub(crate) const PING_INTERVAL: Duration = Duration::from_secs(1);
/// Interval between pings while the master is unreachable (a restart, a failover): the
/// handle re-attaches soon after a master serves again.
pub(crate) const UNREACHABLE_PING_INTERVAL: Duration = Duration::from_millis(250);

/// The ping timeout: `MC_PING_TIMEOUT_MS` (ms, default 2000, see `env.rs`) bounds
/// connecting and waiting for each answer. Unset, unparsable or 0: the default (a bad value
/// is logged). Keep `2 × timeout + 1 s` below the master's `client_ttl`.
pub(crate) fn ping_timeout() -> Duration {
    Duration::from_millis(env::PING_TIMEOUT_MS.get())
}

/// Connect timeout towards an HA group's leader: at most 1 s, with jitter (0.75–1 s), so
/// clients that lost a leader together do not reconnect in lockstep.
fn ha_connect_timeout() -> Duration {
    Duration::from_millis(750 + fastrand::u64(..=250))
}

/// True when `master_server_addr` selects the in-process master.
pub(crate) fn is_embedded_addr(addr: &str) -> bool {
    let addr = addr.trim();
    addr.is_empty() || addr == EMBEDDED_MASTER
}

/// What a handle does with each answer of its liveness loop. Implemented by the centralized
/// client's core (remount on `NeedRemount`) and by the P2P client (re-register, republish,
/// confirm its standing). Called on the loop's thread only, one answer at a time.
pub(crate) trait LivenessHook: Send + Sync {
    /// The master answered the ping sent at `sent_at` with `answer`. An error (a remount or
    /// re-registration that failed) marks the master unreachable until the next answer.
    fn on_answer(&self, sent_at: Instant, answer: &PingResponse) -> Result<()>;
}

/// A handle's master: see the module documentation.
pub(crate) struct MasterLink {
    api: Arc<dyn MasterApi>,
    /// `host:port` of a remote master (its `etcd://` address for an HA group); `None` for the
    /// embedded one.
    remote_addr: Option<String>,
    /// An HA group's view of its leader (`etcd://` addresses).
    view: Option<Arc<LeaderView>>,
    embedded: Option<Arc<MasterService>>,
    reachable: Arc<AtomicBool>,
    standing: Arc<Standing>,
    liveness: Mutex<Option<Liveness>>,
}

impl MasterLink {
    /// The master `master_server_addr` names: the in-process master (configured by
    /// `embedded_config`) for `embedded` or empty, the leader of an HA group for
    /// `etcd://h1:p;h2:p` (followed through failovers), else a connection to the remote
    /// master.
    ///
    /// Errors: RPC errors and `INVALID_VERSION` from connecting to a remote master;
    /// `INVALID_PARAMS` for an `etcd://` address without members, `ETCD_OPERATION_ERROR` when
    /// no etcd member answers.
    pub(crate) fn open(master_server_addr: &str, embedded_config: MasterConfig) -> Result<Self> {
        let addr = master_server_addr.trim();
        let mut view = None;
        let (api, remote_addr, embedded): (Arc<dyn MasterApi>, _, _) = if is_embedded_addr(addr) {
            let service = MasterService::new(embedded_config);
            (service.clone(), None, Some(service))
        } else if is_etcd_addr(addr) {
            let leader = Arc::new(LeaderView::parse(addr)?);
            let timeouts = Timeouts {
                connect: ha_connect_timeout(),
                ..Timeouts::from_env()
            };
            let resolver: Arc<dyn Resolve> = leader.clone();
            let client = RpcMasterClient::resolved_master(addr, resolver, timeouts)?;
            view = Some(leader);
            (Arc::new(RemoteMaster(client)), Some(addr.to_string()), None)
        } else {
            (connect_master(addr)?, Some(addr.to_string()), None)
        };
        let standing = match embedded {
            Some(_) => Standing::permanent(),
            None => Standing::remote(),
        };
        Ok(MasterLink {
            api,
            remote_addr,
            view,
            embedded,
            reachable: Arc::new(AtomicBool::new(true)),
            standing: Arc::new(standing),
            liveness: Mutex::new(None),
        })
    }

    /// The master for data-path calls (the embedded one is called directly).
    pub(crate) fn api(&self) -> &Arc<dyn MasterApi> {
        &self.api
    }

    /// Whether this is the in-process master.
    pub(crate) fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    /// The in-process master, for tests that look inside it.
    #[cfg(test)]
    pub(crate) fn embedded_service(&self) -> Option<&Arc<MasterService>> {
        self.embedded.as_ref()
    }

    /// This handle's standing with its master: whether pins it took at some moment are
    /// still held (see [`Standing`]).
    pub(crate) fn standing(&self) -> &Standing {
        &self.standing
    }

    /// Whether the last ping (if any) was answered and its hook succeeded.
    pub(crate) fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Acquire)
    }

    /// For the in-process master: tells it never to expire `client` (its own process cannot
    /// be dead while it runs; a process stall would otherwise race its monitor against the
    /// client). Call before the client's first mount, so no stall between the mount and this
    /// call can expire it. No-op for a remote master.
    pub(crate) fn never_expire(&self, client: ClientId) {
        if let Some(service) = &self.embedded {
            service.keep_alive(client);
        }
    }

    /// For a remote master: starts the liveness loop on a thread named `mc-heartbeat`,
    /// pinging as `client` and giving each answer to `hook`, and waits (at most twice the
    /// ping timeout and a second) for its first round, which pings at once: the handle's
    /// [`Standing`] then covers what it is granted from the start. Call after the first mount
    /// (an answer may remount). A second call starts nothing (the first loop keeps running). A
    /// thread that cannot be started is logged; `health_check` then does not track the
    /// master. No-op for the embedded master (see [`MasterLink::never_expire`]).
    pub(crate) fn start_liveness(&self, client: ClientId, hook: Weak<dyn LivenessHook>) {
        let Some(addr) = &self.remote_addr else {
            return;
        };
        let mut liveness = self.liveness.lock();
        if liveness.is_none() {
            let pinger: Arc<dyn MasterApi> = match &self.view {
                Some(view) => {
                    let timeouts = Timeouts {
                        connect: ping_timeout().min(ha_connect_timeout()),
                        request: ping_timeout(),
                    };
                    let resolver: Arc<dyn Resolve> = view.clone();
                    let client = RpcMasterClient::resolved(addr, resolver, timeouts);
                    Arc::new(RemoteMaster(client))
                }
                None => connect_pinger(addr, ping_timeout()),
            };
            let (first_round, first_done) = bounded::<()>(1);
            *liveness = Some(Liveness::start(
                client,
                pinger,
                hook,
                Probe {
                    reachable: Arc::clone(&self.reachable),
                    standing: Arc::clone(&self.standing),
                    view: self.view.clone(),
                },
                first_round,
            ));
            drop(liveness);
            let _ = first_done.recv_timeout(2 * ping_timeout() + PING_INTERVAL);
        }
    }

    /// Stops the liveness loop, waiting for at most one in-flight ping (bounded by the ping
    /// timeout and its retry). Idempotent.
    pub(crate) fn stop_liveness(&self) {
        if let Some(liveness) = self.liveness.lock().take() {
            liveness.stop();
        }
    }

    /// [`MasterLink::stop_liveness`], then shuts an embedded master down. Idempotent.
    pub(crate) fn shutdown(&self) {
        self.stop_liveness();
        if let Some(master) = &self.embedded {
            master.shutdown();
        }
    }
}

/// What the liveness loop records of each round: whether the master answered (and the hook
/// succeeded), and the handle's standing; with an HA group, the view its answers must match.
struct Probe {
    reachable: Arc<AtomicBool>,
    standing: Arc<Standing>,
    view: Option<Arc<LeaderView>>,
}

impl Probe {
    /// Whether `answer` comes from the leader of the current view (always, without HA). A
    /// master answering under another view is a deposed leader, or the view moved on: the
    /// view is looked up again and the answer not used.
    fn current(&self, answer: &PingResponse) -> bool {
        let Some(view) = &self.view else { return true };
        let current = view
            .leader()
            .is_ok_and(|leader| leader.view == answer.view_version);
        if !current {
            view.invalidate();
        }
        current
    }
}

/// A running liveness thread.
struct Liveness {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Liveness {
    fn start(
        client: ClientId,
        pinger: Arc<dyn MasterApi>,
        hook: Weak<dyn LivenessHook>,
        probe: Probe,
        first_round: Sender<()>,
    ) -> Liveness {
        let (stop, stopped) = bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("mc-heartbeat".into())
            .spawn(move || {
                let mut first_round = Some(first_round);
                loop {
                    // The first round pings at once, later ones a ping interval apart (a
                    // shorter one while the master is unreachable).
                    if first_round.is_none() {
                        let interval = match probe.reachable.load(Ordering::Acquire) {
                            true => PING_INTERVAL,
                            false => UNREACHABLE_PING_INTERVAL,
                        };
                        match stopped.recv_timeout(interval) {
                            Err(RecvTimeoutError::Timeout) => {}
                            _ => return,
                        }
                    }
                    let Some(hook) = hook.upgrade() else { return };
                    // A panicking hook costs one round, never the loop (an owner that
                    // stopped pinging would be expired and stay fenced).
                    let round = std::panic::AssertUnwindSafe(|| {
                        ping_once(client, &*pinger, &*hook, &probe)
                    });
                    if std::panic::catch_unwind(round).is_err() {
                        tracing::error!("a liveness round panicked; the loop continues");
                        probe.reachable.store(false, Ordering::Release);
                    }
                    if let Some(done) = first_round.take() {
                        let _ = done.try_send(());
                    }
                }
            })
            .ok();
        if thread.is_none() {
            tracing::error!(
                "could not start the heartbeat thread; health_check will not track the master"
            );
        }
        Liveness { stop, thread }
    }

    fn stop(mut self) {
        let _ = self.stop.try_send(());
        if let Some(thread) = self.thread.take() {
            // The last handle may be dropped on the loop's own thread (it held the hook).
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// One ping, retried once: the failed attempt dropped its connection, so the retry connects
/// afresh. Returns the answer with the time the answered attempt was sent.
fn ping_with_retry(client: ClientId, pinger: &dyn MasterApi) -> Result<(Instant, PingResponse)> {
    let sent_at = Instant::now();
    match pinger.ping(client) {
        Ok(answer) => Ok((sent_at, answer)),
        Err(e) => {
            tracing::debug!(error = %e, "ping failed; retrying on a fresh connection");
            let sent_at = Instant::now();
            pinger.ping(client).map(|answer| (sent_at, answer))
        }
    }
}

fn ping_once(client: ClientId, pinger: &dyn MasterApi, hook: &dyn LivenessHook, probe: &Probe) {
    let reachable = &probe.reachable;
    match ping_with_retry(client, pinger) {
        Ok((_, answer)) if !probe.current(&answer) => {
            if reachable.swap(false, Ordering::AcqRel) {
                tracing::warn!(
                    view = answer.view_version,
                    "a master of another view answered"
                );
            }
        }
        Ok((sent_at, answer)) => {
            probe.standing.on_ping(sent_at, Instant::now(), &answer);
            if let Err(e) = hook.on_answer(sent_at, &answer) {
                tracing::warn!(error = %e, "acting on the master's answer failed; will retry");
                reachable.store(false, Ordering::Release);
                return;
            }
            if !reachable.swap(true, Ordering::AcqRel) {
                tracing::info!("master reachable again");
            }
        }
        Err(e) => {
            if let Some(view) = &probe.view {
                view.invalidate();
            }
            if reachable.swap(false, Ordering::AcqRel) {
                tracing::warn!(error = %e, "master ping failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ping_timeout_comes_from_the_environment_with_a_safe_default() {
        const DEFAULT_PING_TIMEOUT_MS: u64 = env::PING_TIMEOUT_MS.default;
        // The only test of this binary that sets MC_PING_TIMEOUT_MS.
        for (value, ms) in [
            (Some("250"), 250),
            (Some("0"), DEFAULT_PING_TIMEOUT_MS),
            (Some("soon"), DEFAULT_PING_TIMEOUT_MS),
            (None, DEFAULT_PING_TIMEOUT_MS),
        ] {
            match value {
                Some(v) => std::env::set_var("MC_PING_TIMEOUT_MS", v),
                None => std::env::remove_var("MC_PING_TIMEOUT_MS"),
            }
            assert_eq!(ping_timeout(), Duration::from_millis(ms));
        }
        std::env::remove_var("MC_PING_TIMEOUT_MS");
    }
}
