//! Pins: holding objects beyond one call. A pinned object's replicas are never freed or
//! reused until it is unpinned (or this client dies), whatever removal or eviction happens
//! meanwhile; the pinned replicas can be read with no further master call.

use super::core::Client;
use super::plan::{self, per_key, Buf, ReadJob};
use crate::error::{fail, ErrorCode, Result};
use crate::types::PinnedObject;
use std::time::Instant;

impl Client {
    /// Pins each key (one master call). Per key: the pin (id, size, replicas, and when it
    /// was asked for) or `OBJECT_NOT_FOUND` / `REPLICA_IS_NOT_READY`.
    pub fn pin<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<PinnedObject>> {
        if let Err(e) = self.core.check_open() {
            return vec![Err(e); keys.len()];
        }
        let names = keys.iter().map(|k| k.as_ref().to_string()).collect();
        let pinned_at = Instant::now();
        let answers = per_key(self.core.master.batch_pin(self.core.id, names), keys.len());
        answers
            .into_iter()
            .map(|answer| {
                answer.map(|pinned| PinnedObject {
                    pinned_at: Some(pinned_at),
                    pinned_by: Some(self.core.id),
                    ..pinned
                })
            })
            .collect()
    }

    /// Releases pins taken by this client; unknown ids are ignored.
    pub fn unpin(&self, pin_ids: &[u64]) -> Result<()> {
        self.core.check_open()?;
        self.core.master.unpin(self.core.id, pin_ids.to_vec())
    }

    /// Reads a pinned object into `buf` (no master call); returns its size.
    /// `INVALID_PARAMS` if `buf` is too small or `pinned` did not come from
    /// [`Client::pin`]; `TRANSFER_FAIL` if no replica could be read; `LEASE_EXPIRED` when the
    /// master may have expired this client since the pin was taken (a stop or a cut longer
    /// than its client TTL: it then released the pin, and the bytes read may be another
    /// object's). Unpin it and pin again.
    pub fn read_pinned(&self, pinned: &PinnedObject, buf: &mut [u8]) -> Result<u64> {
        self.core.check_open()?;
        let (Some(pinned_at), true) = (pinned.pinned_at, pinned.pinned_by == Some(self.core.id))
        else {
            return fail(
                ErrorCode::InvalidParams,
                "read_pinned takes a pin this client's pin() returned",
            );
        };
        let size = pinned.query.size;
        if (buf.len() as u64) < size {
            return fail(
                ErrorCode::InvalidParams,
                format!(
                    "user buffer of {} bytes is too small for {size} bytes",
                    buf.len()
                ),
            );
        }
        let job = ReadJob {
            replicas: self.core.ordered(&pinned.query),
            fragments: plan::truncate(plan::contiguous(&[Buf::of_mut(buf)]), size),
        };
        let outcome = self
            .core
            .read_jobs(&[job])
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError));
        // Checked after the copy: the pin held all through it only if it still holds now.
        outcome.and(self.core.check_pins_held(pinned_at))?;
        Ok(size)
    }
}
