//! Removal: by key, by batch, by regex and all.

use super::core::Client;
use super::plan::per_key;
use crate::error::{ErrorCode, Result};

impl Client {
    /// Removes `key`. `OBJECT_NOT_FOUND`; `OBJECT_HAS_LEASE` under a read lease unless
    /// `force`; `REPLICA_IS_NOT_READY` while being written.
    pub fn remove(&self, key: &str, force: bool) -> Result<()> {
        self.batch_remove(&[key], force)
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError))
    }

    /// Removes many keys; duplicates: the first gets 0, later ones `OBJECT_NOT_FOUND`.
    pub fn batch_remove<K: AsRef<str>>(&self, keys: &[K], force: bool) -> Vec<Result<()>> {
        if let Err(e) = self.core.check_open() {
            return vec![Err(e); keys.len()];
        }
        if keys.is_empty() {
            return Vec::new();
        }
        let names: Vec<String> = keys.iter().map(|k| k.as_ref().to_string()).collect();
        let mut results = per_key(
            self.core.master.batch_remove(names.clone(), force),
            keys.len(),
        );
        // Acknowledged once no location cache serves a removed key any more.
        let removed: Vec<String> = (names.into_iter().zip(&results))
            .filter(|(_, r)| r.is_ok())
            .map(|(name, _)| name)
            .collect();
        if !removed.is_empty() {
            if let Err(e) = self.core.await_revocations(&removed) {
                for r in results.iter_mut().filter(|r| r.is_ok()) {
                    *r = Err(e);
                }
            }
        }
        results
    }

    /// Removes complete objects whose key contains a match of `pattern` (unleased ones unless
    /// `force`); returns how many. `INVALID_PARAMS` for a bad pattern.
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64> {
        self.core.check_open()?;
        let removed = self
            .core
            .master
            .remove_by_regex(pattern.to_string(), force)?;
        self.after_removals(removed)
    }

    /// Removes every complete object (unleased ones unless `force`); returns how many.
    pub fn remove_all(&self, force: bool) -> Result<u64> {
        self.core.check_open()?;
        let removed = self.core.master.remove_all(force)?;
        self.after_removals(removed)
    }

    /// `removed` once every revocation the removals sent is done (none when nothing went).
    fn after_removals(&self, removed: u64) -> Result<u64> {
        if removed > 0 {
            self.core.await_revocations(&[])?;
        }
        Ok(removed)
    }
}
