//! [`ConnPool`]: the connections of one dummy link to its real client. Each call borrows one
//! ([`Lent`]) for its whole length, so calls of one dummy run at once, one per connection;
//! connections are opened on demand up to a limit, and returned (or, after a failure,
//! closed) when the call ends, also when it unwinds.

use super::pool::BlockGuard;
use crate::error::{fail, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One connection, what the real client has mapped on it, and its staging block. Owned by
/// the pool while idle and by one call while lent.
pub(super) struct Conn {
    pub(super) stream: UnixStream,
    /// Ids of the blocks the real client has mapped on this connection.
    pub(super) mapped: HashSet<u64>,
    /// Position in the shared pool's log of freed blocks up to which this connection has
    /// unmapped them at the real client.
    pub(super) freed_cursor: usize,
    /// This connection's staging block, made on first use (dropped with the connection).
    pub(super) staging: Option<BlockGuard>,
    /// When a call or ping last got an answer on it.
    last_answer: Instant,
}

impl Conn {
    /// A fresh connection (greeted, nothing mapped) whose walk of the freed-block log starts
    /// at `freed_cursor`.
    pub(super) fn new(stream: UnixStream, freed_cursor: usize) -> Conn {
        Conn {
            stream,
            mapped: HashSet::new(),
            freed_cursor,
            staging: None,
            last_answer: Instant::now(),
        }
    }

    /// Notes that the real client just answered on this connection (so a ping waits).
    pub(super) fn answered(&mut self) {
        self.last_answer = Instant::now();
    }

    /// Whether the real client closed this connection (it restarted, or dropped us).
    pub(super) fn hung_up(&self) -> bool {
        crate::transfer::hung_up(self.stream.as_raw_fd())
    }
}

struct State {
    idle: Vec<Conn>,
    /// Connections open: idle or lent.
    open: usize,
    /// Of the lent ones, those lent for a ping: a call that finds none idle waits for them
    /// (a ping is short) up to [`PING_WAIT`] rather than open one more.
    pinging: usize,
    /// A connection was lost to a failure since the last successful open.
    lost: bool,
    closed: bool,
}

/// How long a call that finds no idle connection waits for one out for a ping before it
/// opens another (a ping to a hung real client lasts the TTL).
const PING_WAIT: Duration = Duration::from_millis(100);

/// The connections of one link. Thread-safe.
pub(super) struct ConnPool {
    state: Mutex<State>,
    /// Signalled when a connection is returned or closed, and on [`ConnPool::close`].
    returned: Condvar,
    /// Signalled on [`ConnPool::close`] only (for [`ConnPool::closed_within`]).
    closing: Condvar,
    max: usize,
    reconnects: AtomicU64,
}

impl ConnPool {
    /// A pool holding `first` (idle) that opens at most `max` (at least 1) connections.
    pub(super) fn new(first: Conn, max: usize) -> ConnPool {
        ConnPool {
            state: Mutex::new(State {
                idle: vec![first],
                open: 1,
                pinging: 0,
                lost: false,
                closed: false,
            }),
            returned: Condvar::new(),
            closing: Condvar::new(),
            max: max.max(1),
            reconnects: AtomicU64::new(0),
        }
    }

    /// The most connections it opens.
    pub(super) fn capacity(&self) -> usize {
        self.max
    }

    /// Connections open now (idle or lent).
    pub(super) fn open_count(&self) -> usize {
        self.state.lock().open
    }

    /// Successful opens that followed the loss of a connection (one per recovery).
    pub(super) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Lends a connection for one call: the idle one used last (one the real client closed
    /// meanwhile is dropped, not lent); else, while fewer than `max` are open, a new one from
    /// `open` (after waiting up to [`PING_WAIT`] for one out for a ping); else the next one
    /// returned. The wait ends with the calls holding connections, each of whose socket
    /// operations is bounded by the caller's timeouts.
    ///
    /// Errors: `TRANSFER_FAIL` once the pool is closed; `open`'s error.
    pub(super) fn lend(&self, open: impl FnOnce() -> Result<Conn>) -> Result<Lent<'_>> {
        let asked = Instant::now();
        // Closed outside the lock: dropping a staging block takes the shared pool's table.
        let mut hung_up = Vec::new();
        let mut state = self.state.lock();
        loop {
            if state.closed {
                return closed();
            }
            while let Some(conn) = state.idle.pop() {
                if !conn.hung_up() {
                    return Ok(self.lent(conn, false));
                }
                state.open -= 1;
                state.lost = true;
                hung_up.push(conn);
            }
            if state.open < self.max && (state.pinging == 0 || asked.elapsed() >= PING_WAIT) {
                break;
            }
            self.returned.wait_for(&mut state, PING_WAIT);
        }
        state.open += 1;
        drop(state);
        drop(hung_up);
        let opened = open();
        let mut state = self.state.lock();
        match opened {
            Ok(conn) if !state.closed => {
                if std::mem::take(&mut state.lost) {
                    self.reconnects.fetch_add(1, Ordering::Relaxed);
                }
                Ok(self.lent(conn, false))
            }
            outcome => {
                state.open -= 1;
                drop(state);
                self.returned.notify_one();
                outcome.and_then(|_| closed())
            }
        }
    }

    /// Lends, for a ping, an idle connection that got no answer for at least `quiet` (one
    /// in use needs none: its calls keep it alive at the real client); `None` when there is
    /// none or the pool is closed.
    pub(super) fn lend_quiet(&self, quiet: Duration) -> Option<Lent<'_>> {
        let mut state = self.state.lock();
        if state.closed {
            return None;
        }
        let at = state
            .idle
            .iter()
            .position(|conn| conn.last_answer.elapsed() >= quiet)?;
        let conn = state.idle.remove(at);
        state.pinging += 1;
        Some(self.lent(conn, true))
    }

    /// Closes the pool: idle connections now, lent ones when their call ends; later
    /// [`ConnPool::lend`]s fail. Idempotent.
    pub(super) fn close(&self) {
        let idle = {
            let mut state = self.state.lock();
            state.closed = true;
            state.open -= state.idle.len();
            std::mem::take(&mut state.idle)
        };
        drop(idle);
        self.returned.notify_all();
        self.closing.notify_all();
    }

    /// Waits up to `period` unless the pool is closed or gets closed meanwhile; returns
    /// whether it is closed.
    pub(super) fn closed_within(&self, period: Duration) -> bool {
        let deadline = crate::spin::deadline(Instant::now(), period);
        let mut state = self.state.lock();
        while !state.closed && !self.closing.wait_until(&mut state, deadline).timed_out() {}
        state.closed
    }

    fn lent(&self, conn: Conn, ping: bool) -> Lent<'_> {
        Lent {
            pool: self,
            conn: Some(conn),
            ping,
        }
    }

    /// Takes back `conn`: idle again, or closed when `failed` or the pool is closed.
    fn take_back(&self, conn: Conn, ping: bool, failed: bool) {
        let mut state = self.state.lock();
        state.pinging -= usize::from(ping);
        if failed || state.closed {
            state.open -= 1;
            state.lost |= failed;
            drop(state);
            drop(conn);
        } else {
            state.idle.push(conn);
            drop(state);
        }
        self.returned.notify_one();
    }
}

fn closed<T>() -> Result<T> {
    fail(
        ErrorCode::TransferFail,
        "the link to the real client is closed",
    )
}

/// A connection lent to one call. [`Lent::give_back`] returns it; dropped without that (the
/// call unwound), it is closed, so the pool never loses count of it.
pub(super) struct Lent<'a> {
    pool: &'a ConnPool,
    conn: Option<Conn>,
    ping: bool,
}

impl Lent<'_> {
    /// Returns the connection after its call; `failed` (an I/O failure or a missing answer:
    /// the connection is unusable) closes it instead.
    pub(super) fn give_back(mut self, failed: bool) {
        if let Some(conn) = self.conn.take() {
            self.pool.take_back(conn, self.ping, failed);
        }
    }
}

impl std::ops::Deref for Lent<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn
            .as_ref()
            .expect("a lent connection until given back")
    }
}

impl std::ops::DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a lent connection until given back")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.take_back(conn, self.ping, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_within_takes_any_period_and_sees_a_close() {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let pool = ConnPool::new(Conn::new(ours, 0), 1);
        assert!(!pool.closed_within(Duration::from_millis(1)));
        pool.close();
        // A huge period (MC_DUMMY_TTL_MS is not capped) must not overflow `Instant`.
        assert!(pool.closed_within(Duration::MAX));
    }
}
