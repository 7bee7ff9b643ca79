//! Host streams and host events: an in-order queue of work run by one dedicated thread, with
//! CUDA-like events. They stand for a device stream where there is none (CI, CPU-only
//! deployments) and let a caller model compute: [`HostStream::launch`] runs a function in
//! stream order, [`HostEvent::record`] / [`HostStream::wait_event`] order two streams.
//!
//! Thread-safety: every method takes `&self` and may be called from any thread. Work items
//! run one at a time, in enqueue order, on the stream's own thread.
//!
//! Lifetime: a [`HostStream`] is a handle; clones share the stream. When the last handle is
//! dropped the thread finishes every item already enqueued, then exits (the drop waits for
//! it, except when it happens on the stream's own thread).

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

/// One unit of stream work.
pub(crate) type Work = Box<dyn FnOnce() + Send + 'static>;

struct Queue {
    items: VecDeque<Work>,
    /// Items enqueued so far / finished so far (for synchronize).
    enqueued: u64,
    finished: u64,
    closing: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when an item is enqueued, finished, or the stream closes.
    changed: Condvar,
}

struct Owner {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    thread_id: ThreadId,
}

/// A host stream: work runs in order on one thread. Cheap to clone (shares the stream).
#[derive(Clone)]
pub struct HostStream {
    owner: Arc<Owner>,
}

impl HostStream {
    /// Starts a stream and its thread. `INTERNAL_ERROR` text when the thread cannot start.
    pub fn new() -> Result<HostStream, String> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                enqueued: 0,
                finished: 0,
                closing: false,
            }),
            changed: Condvar::new(),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("mc-host-stream".into())
            .spawn(move || run(&worker))
            .map_err(|e| format!("cannot start a host stream thread: {e}"))?;
        Ok(HostStream {
            owner: Arc::new(Owner {
                shared,
                thread_id: thread.thread().id(),
                thread: Some(thread),
            }),
        })
    }

    /// Appends `work`; it runs after everything enqueued before it.
    pub(crate) fn enqueue(&self, work: Work) {
        let shared = &self.owner.shared;
        let mut queue = shared.queue.lock();
        queue.items.push_back(work);
        queue.enqueued += 1;
        drop(queue);
        shared.changed.notify_all();
    }

    /// Runs `f` in stream order (the stream's "kernel launch"). `f` may block; later work
    /// waits for it.
    pub fn launch(&self, f: impl FnOnce() + Send + 'static) {
        self.enqueue(Box::new(f));
    }

    /// Makes later work on this stream wait until `event`'s most recent record (as of this
    /// call) has completed. An event never recorded imposes no wait.
    pub fn wait_event(&self, event: &HostEvent) {
        let target = event.state.lock().recorded;
        let state = event.clone();
        self.enqueue(Box::new(move || {
            state.wait_for(target, None);
        }));
    }

    /// Waits until everything enqueued before this call has run. True when done, false when
    /// `timeout` (None: no limit) passed first.
    pub fn synchronize(&self, timeout: Option<Duration>) -> bool {
        let shared = &self.owner.shared;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut queue = shared.queue.lock();
        let target = queue.enqueued;
        while queue.finished < target {
            match deadline {
                None => shared.changed.wait(&mut queue),
                Some(d) => {
                    if shared.changed.wait_until(&mut queue, d).timed_out()
                        && queue.finished < target
                    {
                        return false;
                    }
                }
            }
        }
        true
    }
}

fn run(shared: &Shared) {
    loop {
        let work = {
            let mut queue = shared.queue.lock();
            loop {
                if let Some(work) = queue.items.pop_front() {
                    break work;
                }
                if queue.closing {
                    return;
                }
                shared.changed.wait(&mut queue);
            }
        };
        // A panicking work item must not kill the stream (later items, and waiters, would
        // hang); it is logged and the stream goes on.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
            tracing::error!("a host stream work item panicked; the stream continues");
        }
        shared.queue.lock().finished += 1;
        shared.changed.notify_all();
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.shared.queue.lock().closing = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            if std::thread::current().id() != self.thread_id {
                let _ = thread.join();
            }
        }
    }
}

struct EventState {
    /// Records made / records completed (a record completes when the stream reaches it).
    recorded: u64,
    completed: u64,
}

/// A host event: marks a point in a host stream. Cheap to clone (shares the event).
#[derive(Clone)]
pub struct HostEvent {
    state: Arc<Mutex<EventState>>,
    done: Arc<Condvar>,
}

impl Default for HostEvent {
    fn default() -> Self {
        HostEvent::new()
    }
}

impl HostEvent {
    /// A new event; never recorded, so it counts as complete.
    pub fn new() -> HostEvent {
        HostEvent {
            state: Arc::new(Mutex::new(EventState {
                recorded: 0,
                completed: 0,
            })),
            done: Arc::new(Condvar::new()),
        }
    }

    /// Records the event on `stream`: it completes when the stream has run everything
    /// enqueued before this call. Re-recording moves the event to the new point.
    pub fn record(&self, stream: &HostStream) {
        let seq = {
            let mut state = self.state.lock();
            state.recorded += 1;
            state.recorded
        };
        let event = self.clone();
        stream.enqueue(Box::new(move || {
            let mut state = event.state.lock();
            state.completed = state.completed.max(seq);
            drop(state);
            event.done.notify_all();
        }));
    }

    /// Whether the most recent record has completed (true for a never-recorded event).
    pub fn query(&self) -> bool {
        let state = self.state.lock();
        state.completed >= state.recorded
    }

    /// Waits for the most recent record (as of this call) to complete. True when complete,
    /// false when `timeout` (None: no limit) passed first.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let target = self.state.lock().recorded;
        self.wait_for(target, timeout)
    }

    fn wait_for(&self, target: u64, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.state.lock();
        while state.completed < target {
            match deadline {
                None => self.done.wait(&mut state),
                Some(d) => {
                    if self.done.wait_until(&mut state, d).timed_out() && state.completed < target {
                        return false;
                    }
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn work_runs_in_order_and_events_order_streams() {
        let load = HostStream::new().unwrap();
        let compute = HostStream::new().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (l, g) = (log.clone(), gate.clone());
        load.launch(move || {
            let mut open = g.0.lock();
            while !*open {
                g.1.wait(&mut open);
            }
            l.lock().push("load");
        });
        let loaded = HostEvent::new();
        loaded.record(&load);
        assert!(!loaded.query());
        compute.wait_event(&loaded);
        let l = log.clone();
        compute.launch(move || l.lock().push("compute"));
        assert!(!compute.synchronize(Some(Duration::from_millis(50))));
        *gate.0.lock() = true;
        gate.1.notify_all();
        assert!(compute.synchronize(Some(Duration::from_secs(10))));
        assert!(loaded.query());
        assert_eq!(*log.lock(), vec!["load", "compute"]);
    }

    #[test]
    fn a_panicking_item_does_not_stop_the_stream_and_drop_drains() {
        let stream = HostStream::new().unwrap();
        let count = Arc::new(AtomicU64::new(0));
        stream.launch(|| panic!("boom"));
        for _ in 0..100 {
            let c = count.clone();
            stream.launch(move || {
                c.fetch_add(1, Ordering::Relaxed);
            });
        }
        drop(stream);
        assert_eq!(count.load(Ordering::Relaxed), 100);
        assert!(HostEvent::new().query());
        assert!(HostEvent::new().wait(Some(Duration::ZERO)));
    }
}
