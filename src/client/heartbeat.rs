//! The liveness ping of a segment-owning client: once a second, `ping` the master; a failed
//! ping marks the master unreachable (`health_check` = 2); `NeedRemount` (the master restarted
//! or expired us) remounts the segment, empty, under a new epoch.

use super::core::ClientCore;
use crate::types::ClientStatus;
use crossbeam_channel::{bounded, RecvTimeoutError, Sender};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Interval between pings (Mooncake: 1 s).
const PING_INTERVAL: Duration = Duration::from_secs(1);

/// A running heartbeat thread. It holds only a weak reference to the client, so dropping the
/// last `Client` ends it; [`Heartbeat::stop`] ends it at once.
pub(super) struct Heartbeat {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    pub(super) fn start(core: &Arc<ClientCore>) -> Heartbeat {
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
                ping_once(&core);
            })
            .ok();
        if thread.is_none() {
            tracing::error!(
                "could not start the heartbeat thread; health_check will not track the master"
            );
        }
        Heartbeat { stop, thread }
    }

    /// Stops the thread and waits for it (at most one in-flight ping).
    pub(super) fn stop(mut self) {
        let _ = self.stop.try_send(());
        if let Some(thread) = self.thread.take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

fn ping_once(core: &ClientCore) {
    match core.master.ping(core.id) {
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
