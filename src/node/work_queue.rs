//! A queue of tasks drained by a fixed set of threads, whose completions are reported in
//! groups as they come (used by the SSD tier's owner, [`super::disk_tier`]): the producer
//! tops the queue up while earlier tasks still run, so the threads never wait for the slowest
//! task of a batch, and one report covers everything that finished meanwhile.
//!
//! Ownership and threads: the queue is shared by reference (scoped threads): any number of
//! [`WorkQueue::serve`] loops, one producer calling [`WorkQueue::push`] /
//! [`WorkQueue::wait_for_room`], and [`WorkQueue::close`] to end them. All methods take
//! `&self`; a panic in a task gives its result's default and the loop goes on.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

/// Tasks of type `T` and their completions, (task, result `R`).
pub(crate) struct WorkQueue<T, R> {
    state: Mutex<State<T, R>>,
    /// Signalled when a task is queued, a task ends, or the queue closes.
    changed: Condvar,
    /// Held by the thread that reports completions (one report at a time, in order).
    reporting: Mutex<()>,
}

struct State<T, R> {
    tasks: VecDeque<T>,
    done: Vec<(T, R)>,
    closed: bool,
}

impl<T, R: Default> WorkQueue<T, R> {
    pub(crate) fn new() -> WorkQueue<T, R> {
        WorkQueue {
            state: Mutex::new(State {
                tasks: VecDeque::new(),
                done: Vec::new(),
                closed: false,
            }),
            changed: Condvar::new(),
            reporting: Mutex::new(()),
        }
    }

    /// Queues `urgent` before every waiting task and `rest` after them.
    pub(crate) fn push(&self, urgent: Vec<T>, rest: Vec<T>) {
        let mut state = self.state.lock();
        for task in urgent.into_iter().rev() {
            state.tasks.push_front(task);
        }
        state.tasks.extend(rest);
        drop(state);
        self.changed.notify_all();
    }

    /// Waits (up to `wait`) until fewer than `limit` tasks wait to start; whether they do.
    pub(crate) fn wait_for_room(&self, limit: usize, wait: Duration) -> bool {
        let mut state = self.state.lock();
        if state.tasks.len() >= limit && !state.closed {
            self.changed.wait_for(&mut state, wait);
        }
        state.tasks.len() < limit
    }

    /// Ends every [`WorkQueue::serve`] loop once its current task is done; tasks that have
    /// not started are dropped.
    pub(crate) fn close(&self) {
        let mut state = self.state.lock();
        state.closed = true;
        state.tasks.clear();
        drop(state);
        self.changed.notify_all();
    }

    /// One thread's loop, until [`WorkQueue::close`]: takes the next task, runs it with this
    /// thread's own state (`S::default()` at first, e.g. a buffer it reuses), and hands the
    /// completions to `report` — all that finished since the last report, in one call, from
    /// whichever thread finishes while no report is under way.
    pub(crate) fn serve<S: Default>(
        &self,
        run: impl Fn(&mut S, &T) -> R,
        report: impl Fn(Vec<(T, R)>),
    ) {
        let mut own = S::default();
        loop {
            let task = {
                let mut state = self.state.lock();
                loop {
                    if state.closed {
                        return;
                    }
                    if let Some(task) = state.tasks.pop_front() {
                        break task;
                    }
                    self.changed.wait(&mut state);
                }
            };
            let ran = std::panic::catch_unwind(AssertUnwindSafe(|| run(&mut own, &task)));
            self.state.lock().done.push((task, ran.unwrap_or_default()));
            self.changed.notify_all();
            self.report_done(&report);
        }
    }

    /// Reports the completions, unless another thread is reporting: then that thread sees
    /// them, in its loop or in its check after letting go (so none waits for a later task).
    fn report_done(&self, report: &impl Fn(Vec<(T, R)>)) {
        loop {
            let Some(reporting) = self.reporting.try_lock() else {
                return;
            };
            loop {
                let done = std::mem::take(&mut self.state.lock().done);
                if done.is_empty() {
                    break;
                }
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| report(done)));
            }
            drop(reporting);
            if self.state.lock().done.is_empty() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    /// Every task runs once, in parallel, each completion is reported exactly once, and a
    /// slow task does not hold back the others' reports.
    #[test]
    fn tasks_run_in_parallel_and_every_completion_is_reported_once() {
        let queue: WorkQueue<u64, u64> = WorkQueue::new();
        let reported = Mutex::new(Vec::new());
        let running = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let started = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    queue.serve(
                        |count: &mut u64, &task| {
                            *count += 1;
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            // Task 0 is slow: the rest must be reported while it runs.
                            let pause = if task == 0 { 400 } else { 5 };
                            std::thread::sleep(Duration::from_millis(pause));
                            running.fetch_sub(1, Ordering::SeqCst);
                            task * 10
                        },
                        |done| reported.lock().extend(done),
                    )
                });
            }
            queue.push(vec![0], (1..40).collect());
            let until = Instant::now() + Duration::from_secs(10);
            while reported.lock().len() < 39 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(
                started.elapsed() < Duration::from_millis(390),
                "39 quick tasks waited for the slow one: {:?}",
                started.elapsed()
            );
            while reported.lock().len() < 40 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            queue.close();
        });
        let mut done = reported.into_inner();
        done.sort();
        let want: Vec<(u64, u64)> = (0..40).map(|t| (t, t * 10)).collect();
        assert_eq!(done, want);
        assert_eq!(most.load(Ordering::SeqCst), 4, "four threads ran at once");
    }

    /// An urgent task goes first; room is what waits to start; a panicking task reports
    /// the default result; a closed queue ends its loops and drops what had not started.
    #[test]
    fn urgent_first_room_panics_and_close() {
        let queue: WorkQueue<u32, bool> = WorkQueue::new();
        queue.push(vec![], vec![1, 2, 3]);
        queue.push(vec![7], vec![]);
        assert!(!queue.wait_for_room(4, Duration::from_millis(10)));
        assert!(queue.wait_for_room(5, Duration::ZERO));
        let order = Mutex::new(Vec::new());
        let reported = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            scope.spawn(|| {
                queue.serve(
                    |_: &mut (), &task| {
                        order.lock().push(task);
                        assert_ne!(task, 2, "task 2 panics");
                        true
                    },
                    |done| reported.lock().extend(done),
                )
            });
            let until = Instant::now() + Duration::from_secs(10);
            while reported.lock().len() < 4 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            queue.close();
        });
        assert_eq!(*order.lock(), vec![7, 1, 2, 3]);
        assert_eq!(
            *reported.lock(),
            vec![(7, true), (1, true), (2, false), (3, true)]
        );
        queue.push(vec![], vec![9]);
        queue.serve(|_: &mut (), _| true, |_| panic!("closed: nothing runs"));
    }
}
