//! Background threads that run a job periodically on a weakly-held service and stop promptly
//! on [`Workers::stop`] or when the service is dropped.

use parking_lot::{Condvar, Mutex};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Default)]
struct StopSignal {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl StopSignal {
    /// Sleeps up to `period`; returns `true` if stop was requested.
    fn wait(&self, period: Duration) -> bool {
        let mut stopped = self.stopped.lock();
        if !*stopped {
            self.wake.wait_for(&mut stopped, period);
        }
        *stopped
    }
}

/// A set of periodic threads. Thread-safe; `stop` is idempotent.
#[derive(Default)]
pub(crate) struct Workers {
    signal: Arc<StopSignal>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    /// Runs `job(&target)` every `period` on a new thread named `name` until stopped or until
    /// `target` is gone. A failure to spawn is logged (the master then runs without that job).
    pub(crate) fn spawn<T: Send + Sync + 'static>(
        &self,
        name: &str,
        period: Duration,
        target: Weak<T>,
        job: fn(&T),
    ) {
        let signal = Arc::clone(&self.signal);
        let spawned = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                while !signal.wait(period) {
                    let Some(target) = target.upgrade() else {
                        break;
                    };
                    job(&target);
                }
            });
        match spawned {
            Ok(handle) => self.handles.lock().push(handle),
            Err(error) => tracing::error!(%error, name, "cannot start master thread"),
        }
    }

    /// Signals every thread and joins them (except the calling thread, if it is one of them).
    pub(crate) fn stop(&self) {
        *self.signal.stopped.lock() = true;
        self.signal.wake.notify_all();
        let handles = std::mem::take(&mut *self.handles.lock());
        let me = std::thread::current().id();
        for handle in handles {
            if handle.thread().id() != me && handle.join().is_err() {
                tracing::error!("master thread panicked");
            }
        }
    }
}
