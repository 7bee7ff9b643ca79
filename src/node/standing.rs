//! [`Standing`]: whether a handle's master can have expired it since a given moment, as far
//! as the handle can know from its pings.
//!
//! A pin (and everything held for a client) lasts until it is released or the client dies:
//! the master expires a client it has not heard from for its client TTL and releases its
//! pins, and the pinned ranges may then be reused for other objects. A client that was
//! stopped, starved or cut off for longer than the TTL cannot tell from inside a copy that
//! this happened, so a read that relies on pins (not on a lease deadline) asks afterwards
//! whether the pins were still held all along: [`Standing::check_since`].
//!
//! The proof is a *chain* of pings the master answered as usual (`Ok`) with the same view and
//! the same registration number: the master numbers each registration of a client it did not
//! know, so the client was registered, and never expired, from the first of these pings'
//! receipts to the last's; and the master expires it no sooner than a TTL after the last
//! ping's receipt, which is after that ping was sent. A `NeedRemount` answer (expired, or a
//! master that restarted and never knew it), another view (a master restart) or another
//! registration number (expired and registered again meanwhile) starts a new chain. A pin
//! asked for after the chain's first answer was therefore received while the chain's
//! registration was live, and is held at least until `last sent + TTL` while the chain lasts.
//! The TTL is shortened by a margin ([`margin`]) for clocks that run at slightly different
//! rates on the two machines. A slow or lost ping only delays the chain (reads fail while the
//! last ping is too old), it never ends it.
//!
//! The embedded master never expires its in-process client: its standing is permanent.
//! Thread-safety: one leaf mutex; the liveness loop writes, readers only compare.

use crate::error::{fail, ErrorCode, Result};
use crate::types::{ClientStatus, PingResponse};
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// A handle's standing with its master. See the module documentation.
pub(crate) struct Standing {
    /// `None`: permanent (the embedded master).
    chain: Option<Mutex<Chain>>,
}

/// The current chain of confirmed pings.
struct Chain {
    /// When the chain's first ping was answered; `None` while there is no chain (before the
    /// first answer, after a `NeedRemount`).
    since: Option<Instant>,
    /// When the chain's latest ping was sent.
    last_sent: Instant,
    /// The view of the master that answered the chain's pings.
    view: u64,
    /// The client's registration number at that master.
    registration: u64,
    /// That master's client TTL, less the [`margin`].
    ttl: Duration,
}

/// What is taken off the master's TTL: 2 % (clocks of two machines may run at rates up to
/// 0.05 % apart) and 5 ms.
pub(crate) fn margin(ttl: Duration) -> Duration {
    ttl / 50 + Duration::from_millis(5)
}

impl Standing {
    /// The standing of a handle of the embedded master: never expired.
    pub(crate) fn permanent() -> Standing {
        Standing { chain: None }
    }

    /// The standing of a handle of a remote master: no chain until the first ping is
    /// answered.
    pub(crate) fn remote() -> Standing {
        Standing {
            chain: Some(Mutex::new(Chain {
                since: None,
                last_sent: Instant::now(),
                view: 0,
                registration: 0,
                ttl: Duration::ZERO,
            })),
        }
    }

    /// The master answered the ping sent at `sent` with `answer` at `answered`. Pings may be
    /// reported out of order; an older one never moves the chain back.
    pub(crate) fn on_ping(&self, sent: Instant, answered: Instant, answer: &PingResponse) {
        let Some(chain) = &self.chain else { return };
        let mut chain = chain.lock();
        if answer.status != ClientStatus::Ok {
            chain.since = None;
            return;
        }
        let full = Duration::from_millis(answer.client_ttl_ms);
        let ttl = full.saturating_sub(margin(full));
        let continues = chain.since.is_some()
            && chain.view == answer.view_version
            && chain.registration == answer.registration;
        if continues {
            chain.last_sent = chain.last_sent.max(sent);
            chain.ttl = chain.ttl.min(ttl);
        } else {
            *chain = Chain {
                since: Some(answered),
                last_sent: sent,
                view: answer.view_version,
                registration: answer.registration,
                ttl,
            };
        }
    }

    /// Whether everything this handle was granted at `granted_at` or later (a pin asked for
    /// then) can have been released by its master's expiry of it before now.
    ///
    /// Errors: `LEASE_EXPIRED` when the handle cannot show that its master still holds what
    /// it granted then: no confirmed ping since (a stop or a cut longer than the TTL, an
    /// expiry, a master restart), or the last one sent a TTL ago or more.
    pub(crate) fn check_since(&self, granted_at: Instant) -> Result<()> {
        let Some(chain) = &self.chain else {
            return Ok(());
        };
        let chain = chain.lock();
        let now = Instant::now();
        match chain.since {
            Some(since) if since <= granted_at && now < chain.last_sent + chain.ttl => Ok(()),
            Some(since) if since > granted_at => fail(
                ErrorCode::LeaseExpired,
                "what this client held may have been released: its master expired or forgot \
                 it (or it was out of touch for a client TTL) after the pin was taken",
            ),
            _ => fail(
                ErrorCode::LeaseExpired,
                format!(
                    "what this client held may have been released: its master last confirmed \
                     it {:?} ago (client TTL {:?})",
                    now.saturating_duration_since(chain.last_sent),
                    chain.ttl
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: ClientStatus, view: u64) -> PingResponse {
        registered(status, view, 1)
    }

    fn registered(status: ClientStatus, view: u64, registration: u64) -> PingResponse {
        PingResponse {
            view_version: view,
            status,
            client_ttl_ms: 2000,
            registration,
        }
    }

    #[test]
    fn pins_count_only_inside_an_unbroken_chain_of_confirmed_pings() {
        let standing = Standing::remote();
        let t0 = Instant::now();
        let ok = answer(ClientStatus::Ok, 7);
        assert!(standing.check_since(t0).is_err(), "no ping answered yet");
        standing.on_ping(t0, t0 + Duration::from_millis(5), &ok);
        let pinned = t0 + Duration::from_millis(10);
        assert!(standing.check_since(pinned).is_ok());
        // A pin asked for before the chain's first answer is not covered by it.
        assert!(standing.check_since(t0).is_err());
        // Pings a second apart keep the chain.
        let t1 = t0 + Duration::from_secs(1);
        standing.on_ping(t1, t1 + Duration::from_millis(5), &ok);
        assert!(standing.check_since(pinned).is_ok());
        // A gap of a TTL (a stop, a slow master) with the same registration keeps the chain.
        let t2 = t1 + Duration::from_millis(2500);
        standing.on_ping(t2, t2, &ok);
        assert!(standing.check_since(pinned).is_ok());
        // Another registration (expired and registered again meanwhile) starts a new chain:
        // the old pin is no longer covered.
        standing.on_ping(t2, t2, &registered(ClientStatus::Ok, 7, 2));
        assert_eq!(standing.check_since(pinned), Err(ErrorCode::LeaseExpired));
        assert!(standing.check_since(t2 + Duration::from_millis(1)).is_ok());
        // Another view (a restarted master) starts a new chain too.
        let t3 = t2 + Duration::from_millis(500);
        standing.on_ping(t3, t3, &answer(ClientStatus::Ok, 8));
        assert!(standing.check_since(t2 + Duration::from_millis(1)).is_err());
        // NeedRemount ends the chain until the next confirmed ping.
        let pinned = t3 + Duration::from_millis(1);
        standing.on_ping(
            t3,
            t3 + Duration::from_millis(2),
            &answer(ClientStatus::NeedRemount, 8),
        );
        assert!(standing.check_since(pinned).is_err());
        // An older ping reported late never moves the chain back.
        let t4 = Instant::now();
        standing.on_ping(t4, t4, &ok);
        standing.on_ping(t0, t4, &ok);
        assert!(standing.check_since(t4).is_ok());
    }

    #[test]
    fn the_chain_ends_a_ttl_after_its_last_ping_was_sent() {
        let standing = Standing::remote();
        let long_ago = Instant::now() - Duration::from_secs(3);
        standing.on_ping(long_ago, long_ago, &answer(ClientStatus::Ok, 1));
        let err = standing.check_since(long_ago).unwrap_err();
        assert_eq!(err, ErrorCode::LeaseExpired);
        assert!(Standing::permanent().check_since(long_ago).is_ok());
    }
}
