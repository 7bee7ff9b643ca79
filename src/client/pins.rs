//! Pins: holding objects beyond one call. A pinned object's replicas are never freed or
//! reused until it is unpinned (or this client dies), whatever removal or eviction happens
//! meanwhile; the pinned replicas can be read with no further master call.

use super::core::Client;
use super::plan::{self, per_key, Buf, ReadJob};
use crate::error::{fail, ErrorCode, Result};
use crate::types::PinnedObject;

impl Client {
    /// Pins each key (one master call). Per key: the pin (id, size, replicas) or
    /// `OBJECT_NOT_FOUND` / `REPLICA_IS_NOT_READY`.
    pub fn pin<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<PinnedObject>> {
        if let Err(e) = self.core.check_open() {
            return vec![Err(e); keys.len()];
        }
        let names = keys.iter().map(|k| k.as_ref().to_string()).collect();
        per_key(self.core.master.batch_pin(self.core.id, names), keys.len())
    }

    /// Releases pins taken by this client; unknown ids are ignored.
    pub fn unpin(&self, pin_ids: &[u64]) -> Result<()> {
        self.core.check_open()?;
        self.core.master.unpin(self.core.id, pin_ids.to_vec())
    }

    /// Reads a pinned object into `buf` (no master call); returns its size.
    /// `INVALID_PARAMS` if `buf` is too small; `TRANSFER_FAIL` if no replica could be read.
    pub fn read_pinned(&self, pinned: &PinnedObject, buf: &mut [u8]) -> Result<u64> {
        self.core.check_open()?;
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
        outcome.map(|()| size)
    }
}
