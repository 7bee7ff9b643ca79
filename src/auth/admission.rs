//! What a connection proved, kept for its life, so that a key a rotation retired stops
//! opening doors: a server closes a connection once the key it was admitted with is no
//! longer listed in its key file ([`Admission`], checked between requests and while idle,
//! at most once a second), and a client stops reusing a pooled connection once its process
//! connects with another key ([`KeyRing::connects_with`]).
//!
//! A server closes such a connection only between requests, with nothing of a next request
//! read (as an idle close), so a client sees the orderly close its pool already handles.
//! Thread-safety: an `Admission` belongs to one connection's task; the ring is shared.

use super::keys::KeyRing;
use super::refusals;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A key's public identifier (see [`super::Key::id`]).
pub type KeyId = [u8; 8];

/// How often a connection looks at its key file's keys.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The key a server connection was admitted with, and whether it is still listed.
pub struct Admission {
    ring: Arc<KeyRing>,
    id: KeyId,
    role: &'static str,
    next_check: Instant,
    listed: bool,
}

impl Admission {
    /// A connection of the `role` service admitted with key `id` of `ring`.
    pub fn new(ring: Arc<KeyRing>, id: KeyId, role: &'static str) -> Admission {
        Admission {
            ring,
            id,
            role,
            next_check: Instant::now() + CHECK_EVERY,
            listed: true,
        }
    }

    /// Whether the key is no longer listed (looked up at most once a second; once retired,
    /// always retired). The first time it answers true the closing is counted.
    pub fn retired(&mut self) -> bool {
        if !self.listed {
            return true;
        }
        let now = Instant::now();
        if now < self.next_check {
            return false;
        }
        self.next_check = now + CHECK_EVERY;
        self.listed = self.ring.keys().by_id(&self.id).is_some();
        if !self.listed {
            refusals::retired_closed();
            tracing::debug!(
                role = self.role,
                "closing a connection: its cluster key was retired"
            );
        }
        !self.listed
    }
}

/// How waiting for a connection's next request ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Waited<T> {
    /// `ready` finished with this.
    Ready(T),
    /// Nothing came within the idle timeout.
    Idle,
    /// The connection's key was retired while it waited.
    Retired,
}

/// Runs `ready` (a cancel-safe wait for the first bytes of a connection's next request,
/// such as `fill_buf`) for at most `idle`, looking every second whether the key the
/// connection was admitted with (if any) was retired meanwhile.
pub async fn wait_admitted<F: Future>(
    ready: F,
    idle: Duration,
    mut admission: Option<&mut Admission>,
) -> Waited<F::Output> {
    // An idle timeout past any real one (a `Duration::MAX` limit) is a year.
    let year = Duration::from_secs(365 * 24 * 3600);
    let idle_until = Instant::now() + idle.min(year);
    tokio::pin!(ready);
    loop {
        let step = match admission {
            Some(_) => idle_until.min(Instant::now() + CHECK_EVERY),
            None => idle_until,
        };
        if let Ok(done) = tokio::time::timeout_at(step, &mut ready).await {
            return Waited::Ready(done);
        }
        if admission.as_mut().is_some_and(|a| a.retired()) {
            return Waited::Retired;
        }
        if Instant::now() >= idle_until {
            return Waited::Idle;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Key, Keys};

    fn keys(bytes: &[u8]) -> Keys {
        let keys = bytes.iter().map(|&b| Key::new(vec![b; 32]).unwrap());
        Keys::from_keys(keys.collect()).unwrap()
    }

    #[test]
    fn a_connection_is_retired_once_its_key_leaves_the_file() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let file = crate::auth::KeyFile::new(&[1, 2]);
            let ring = file.ring();
            let old = keys(&[1]).primary().id;
            let mut admission = Admission::new(Arc::clone(&ring), old, "test");
            let before = refusals::counters().retired_closed;
            // Listed: the wait ends by its idle timeout, never as retired.
            let short = Duration::from_millis(100);
            let waited =
                wait_admitted(std::future::pending::<()>(), short, Some(&mut admission)).await;
            assert_eq!(waited, Waited::Idle);
            assert!(ring.connects_with(&old));
            // The file drops the key: within a second the waiting connection is retired.
            file.list(&[2]);
            ring.expire_reload_check();
            let waited = wait_admitted(
                std::future::pending::<()>(),
                CHECK_EVERY * 60,
                Some(&mut admission),
            )
            .await;
            assert_eq!(waited, Waited::Retired);
            assert!(admission.retired());
            assert!(!ring.connects_with(&old));
            assert!(ring.connects_with(&keys(&[2]).primary().id));
            assert!(refusals::counters().retired_closed > before);
            // Without a key nothing retires; a ready future is answered at once.
            let waited = wait_admitted(std::future::pending::<()>(), short, None).await;
            assert_eq!(waited, Waited::Idle);
            assert_eq!(
                wait_admitted(async { 7 }, short, None).await,
                Waited::Ready(7)
            );
        });
    }
}
