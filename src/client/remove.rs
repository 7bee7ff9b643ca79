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
        let names = keys.iter().map(|k| k.as_ref().to_string()).collect();
        per_key(self.core.master.batch_remove(names, force), keys.len())
    }

    /// Removes complete objects whose key contains a match of `pattern` (unleased ones unless
    /// `force`); returns how many. `INVALID_PARAMS` for a bad pattern.
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64> {
        self.core.check_open()?;
        self.core.master.remove_by_regex(pattern.to_string(), force)
    }

    /// Removes every complete object (unleased ones unless `force`); returns how many.
    pub fn remove_all(&self, force: bool) -> Result<u64> {
        self.core.check_open()?;
        self.core.master.remove_all(force)
    }
}
