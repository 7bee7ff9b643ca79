//! The liveness ping of a client of a remote master (every such client, with or without a
//! segment: the master expires clients that stop pinging, with their pins). Once a second it
//! pings the master over its own connection with a short timeout (`MC_PING_TIMEOUT_MS`), so a
//! slow data-path call or a stalled server shard cannot make it miss `client_ttl`. A failed
//! ping is retried once on a fresh connection; a second failure marks the master unreachable
//! (`health_check` = 2). `NeedRemount` (the master restarted or expired us) remounts the
//! segment, empty, under a new epoch; a client without a segment just keeps pinging (the
//! master registers it again on its next pin).
//!
//! An embedded client runs no heartbeat: its master keeps it alive (see
//! `MasterService::keep_alive`).

use super::core::ClientCore;
use crate::error::Result;
use crate::master::MasterApi;
use crate::types::{ClientStatus, PingResponse};
use crossbeam_channel::{bounded, RecvTimeoutError, Sender};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Interval between pings (Mooncake: 1 s).
const PING_INTERVAL: Duration = Duration::from_secs(1);

/// Default of `MC_PING_TIMEOUT_MS`: well below the master's default `client_ttl` (10 s) even
/// with the retry (2 × 2 s + the 1 s interval).
pub(super) const DEFAULT_PING_TIMEOUT_MS: u64 = 2000;

/// The ping timeout: `MC_PING_TIMEOUT_MS` (ms, default [`DEFAULT_PING_TIMEOUT_MS`]) bounds
/// connecting and waiting for each answer. Unset, unparsable or 0: the default (a bad value
/// is logged). Keep `2 × timeout + 1 s` below the master's `client_ttl`.
pub(super) fn ping_timeout() -> Duration {
    let default = Duration::from_millis(DEFAULT_PING_TIMEOUT_MS);
    let Ok(text) = std::env::var("MC_PING_TIMEOUT_MS") else {
        return default;
    };
    match text.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Duration::from_millis(ms),
        _ => {
            tracing::warn!(value = %text, default = DEFAULT_PING_TIMEOUT_MS, "ignoring invalid MC_PING_TIMEOUT_MS");
            default
        }
    }
}

/// A running heartbeat thread. It holds only a weak reference to the client, so dropping the
/// last `Client` ends it; [`Heartbeat::stop`] ends it at once.
pub(super) struct Heartbeat {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts pinging through `pinger` (a connection of its own, see
    /// [`crate::rpc::client::connect_pinger`]) on a thread named `mc-heartbeat`. A thread that
    /// cannot be started is logged; `health_check` then does not track the master.
    pub(super) fn start(core: &Arc<ClientCore>, pinger: Arc<dyn MasterApi>) -> Heartbeat {
        let (stop, stopped) = bounded::<()>(1);
        let weak: Weak<ClientCore> = Arc::downgrade(core);
        let thread = std::thread::Builder::new()
            .name("mc-heartbeat".into())
            .spawn(move || loop {
                match stopped.recv_timeout(PING_INTERVAL) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let Some(core) = weak.upgrade() else { return };
                ping_once(&core, &*pinger);
            })
            .ok();
        if thread.is_none() {
            tracing::error!(
                "could not start the heartbeat thread; health_check will not track the master"
            );
        }
        Heartbeat { stop, thread }
    }

    /// Stops the thread and waits for it (at most one in-flight ping, bounded by the ping
    /// timeout and its retry).
    pub(super) fn stop(mut self) {
        let _ = self.stop.try_send(());
        if let Some(thread) = self.thread.take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// One ping, retried once: the failed attempt dropped its connection, so the retry connects
/// afresh.
fn ping_with_retry(core: &ClientCore, pinger: &dyn MasterApi) -> Result<PingResponse> {
    pinger.ping(core.id).or_else(|e| {
        tracing::debug!(error = %e, "ping failed; retrying on a fresh connection");
        pinger.ping(core.id)
    })
}

fn ping_once(core: &ClientCore, pinger: &dyn MasterApi) {
    match ping_with_retry(core, pinger) {
        Ok(answer) => {
            if answer.status == ClientStatus::NeedRemount {
                if let Some(own) = &core.segment {
                    let remounted = own.next_mount(&core.engine).and_then(|segment| {
                        tracing::warn!(segment = %segment.name, epoch = segment.epoch, "master lost our segment; remounting it (empty, new epoch)");
                        core.master.remount_segments(core.id, vec![segment])
                    });
                    if let Err(e) = remounted {
                        tracing::warn!(error = %e, "remount failed; will retry");
                        core.master_reachable.store(false, Ordering::Release);
                        return;
                    }
                }
            }
            if !core.master_reachable.swap(true, Ordering::AcqRel) {
                tracing::info!("master reachable again");
            }
        }
        Err(e) => {
            if core.master_reachable.swap(false, Ordering::AcqRel) {
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
