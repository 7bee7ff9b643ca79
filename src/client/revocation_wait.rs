//! A writer's side of location-cache revocations (`docs/location-cache.md`): before a write
//! or a removal is acknowledged to the caller, every client that cached the key's old
//! replica list has dropped it or its cached lease ran out. The master enforces it for writes
//! (`put_end` answers `REVOCATION_PENDING` until then); removals wait here after the master
//! removed the keys.

use super::core::ClientCore;
use crate::error::{fail, ErrorCode, Result};
use std::time::{Duration, Instant};

/// How long a writer waits for revocations at most: the master ends every wait within one
/// cache lease (at most the read lease), so this only bounds a master that stopped answering.
fn wait_limit() -> Duration {
    Duration::from_millis(crate::env::RPC_TIMEOUT_MS.get())
}

impl ClientCore {
    /// Waits until the revocations of `keys` (every revocation so far when empty) are done.
    /// Errors: the master's RPC errors; `REVOCATION_PENDING` after [`wait_limit`].
    pub(super) fn await_revocations(&self, keys: &[String]) -> Result<()> {
        let until = Instant::now() + wait_limit();
        loop {
            if self.master.await_revocations(keys.to_vec())? {
                return Ok(());
            }
            if Instant::now() >= until {
                return fail(
                    ErrorCode::RevocationPending,
                    format!(
                        "location caches did not let go of {} key(s) within {:?}",
                        keys.len(),
                        wait_limit()
                    ),
                );
            }
        }
    }

    /// Ends (`PutEnd`) write `tokens[i]` of `names[i]`, waiting for revocations and ending
    /// again those the master answered `REVOCATION_PENDING`; one outcome per key.
    pub(super) fn put_end_after_revocations(
        &self,
        names: Vec<String>,
        tokens: Vec<crate::types::WriteToken>,
    ) -> Result<Vec<Result<()>>> {
        let mut outcomes = self
            .master
            .batch_put_end(self.id, names.clone(), tokens.clone())?;
        if outcomes.len() != names.len() {
            return Ok(outcomes);
        }
        let until = Instant::now() + wait_limit();
        loop {
            let pending: Vec<usize> = (0..names.len())
                .filter(|&i| outcomes[i] == Err(ErrorCode::RevocationPending))
                .collect();
            if pending.is_empty() || Instant::now() >= until {
                return Ok(outcomes);
            }
            let keys: Vec<String> = pending.iter().map(|&i| names[i].clone()).collect();
            if let Err(e) = self.await_revocations(&keys) {
                for &i in &pending {
                    outcomes[i] = Err(e);
                }
                return Ok(outcomes);
            }
            let again = self.master.batch_put_end(
                self.id,
                keys,
                pending.iter().map(|&i| tokens[i]).collect(),
            )?;
            if again.len() != pending.len() {
                return Ok(outcomes);
            }
            for (&i, outcome) in pending.iter().zip(again) {
                outcomes[i] = outcome;
            }
        }
    }
}
