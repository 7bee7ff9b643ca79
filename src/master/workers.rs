//! Background threads that run a job periodically on a weakly-held service and stop promptly
//! on [`Workers::stop`] or when the service is dropped.

use parking_lot::{Condvar, Mutex};
use std::panic::AssertUnwindSafe;
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
    /// `target` is gone. A failure to spawn is logged (the master then runs without that job);
    /// a round that panics is logged and the thread goes on with the next round.
    pub(crate) fn spawn<T: Send + Sync + 'static>(
        &self,
        name: &str,
        period: Duration,
        target: Weak<T>,
        job: fn(&T),
    ) {
        let signal = Arc::clone(&self.signal);
        let thread_name = name.to_string();
        let spawned = std::thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || {
                while !signal.wait(period) {
                    let Some(target) = target.upgrade() else {
                        break;
                    };
                    // A panicking round is a bug; it is logged, and the next round still
                    // runs (a dead maintenance thread would stop every free and eviction).
                    let round = std::panic::catch_unwind(AssertUnwindSafe(|| job(&target)));
                    if round.is_err() {
                        tracing::error!(name = %thread_name, "a master background round panicked");
                    }
                }
            });
        match spawned {
            Ok(handle) => self.handles.lock().push(handle),
            Err(error) => tracing::error!(%error, name, "cannot start master thread"),
        }
    }

    /// Runs every thread's next round now instead of at the end of its period (a thread in a
    /// round runs its next one after its period, as usual).
    pub(crate) fn nudge(&self) {
        self.signal.wake.notify_all();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::wait_until;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Counts rounds; the first one panics.
    struct Flaky(AtomicU32);

    fn flaky_round(target: &Flaky) {
        if target.0.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("first round fails");
        }
    }

    #[test]
    fn a_panicking_round_does_not_end_the_thread() {
        let workers = Workers::default();
        let target = Arc::new(Flaky(AtomicU32::new(0)));
        workers.spawn(
            "mc-test-flaky",
            Duration::from_millis(1),
            Arc::downgrade(&target),
            flaky_round,
        );
        let went_on = wait_until(Duration::from_secs(10), || {
            target.0.load(Ordering::SeqCst) >= 3
        });
        workers.stop();
        assert!(went_on, "rounds stopped after a panic");
    }
}
