//! The put and upsert families: reserve replicas at the master, move the caller's bytes
//! straight into every replica (one local copy, or one TCP write per replica), then commit —
//! or revoke, so nothing is ever half-visible. No family stages the caller's bytes: the
//! "copying" put family keeps only Mooncake's argument contract (a local buffer that could
//! hold the value), and caller memory may be device memory on every path (`*_raw`).

use super::core::{Client, ClientCore};
use super::counters::ClientCounters;
use super::plan::{self, check_replicas, Buf, GrantedWrite, ReplicaWrite};
use crate::error::{fail, ErrorCode, Result};
use crate::transfer::{TransferOp, TransferRequest};
use crate::types::{ReplicateConfig, WriteToken};
use std::collections::HashMap;
use std::time::Instant;

/// Put keeps an existing key (insert-if-absent); upsert overwrites it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Insert if absent (an existing key is kept and the write reports success).
    Put,
    /// Insert or overwrite.
    Upsert,
}

impl Client {
    /// Zero-copy write of each key's buffers (laid end to end) with raw addresses that may
    /// be device memory; one result per key. The `put_from` / `upsert_from` families
    /// (single, batch, multi-buffer) all reduce to this.
    ///
    /// # Safety
    /// Every [`Buf`] is readable memory (host or device) of its length for the whole call.
    pub unsafe fn write_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        config: &ReplicateConfig,
        mode: WriteMode,
    ) -> Vec<Result<()>> {
        self.core.write(keys, bufs, config, mode)
    }

    /// The copying family (`put`, `put_parts`, `put_batch` and their upserts) with raw
    /// addresses that may be device memory: 0 or the first per-key error. Keeps Mooncake's
    /// contract (`INVALID_PARAMS` when the local buffer is absent or smaller than a value)
    /// but makes no staging copy.
    ///
    /// # Safety
    /// As [`Client::write_raw`].
    pub unsafe fn copying_write_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        config: &ReplicateConfig,
        mode: WriteMode,
    ) -> Result<()> {
        self.core.copying_write(keys, bufs, config, mode)
    }

    /// Copying put (Mooncake's contract; no staging copy is made). An existing key is kept
    /// and 0 returned. `INVALID_PARAMS` when the local buffer is absent or too small.
    pub fn put(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> Result<()> {
        self.put_parts(key, &[value], config)
    }

    /// Copying put of the concatenation of `parts`; a total size of 0 is a no-op.
    pub fn put_parts(&self, key: &str, parts: &[&[u8]], config: &ReplicateConfig) -> Result<()> {
        self.core
            .copying_write(&[key], vec![bufs_of(parts)], config, WriteMode::Put)
    }

    /// Copying batch put; returns 0 if all succeeded, else the first per-key error.
    pub fn put_batch<K: AsRef<str>>(
        &self,
        keys: &[K],
        values: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<()> {
        let parts = values.iter().map(|v| vec![Buf::of(v)]).collect();
        self.core.copying_write(keys, parts, config, WriteMode::Put)
    }

    /// Zero-copy put straight from `buf`. Size 0 is a no-op; an existing or in-flight key is
    /// kept (returns Ok).
    pub fn put_from(&self, key: &str, buf: &[u8], config: &ReplicateConfig) -> Result<()> {
        first(
            self.core
                .write(&[key], vec![vec![Buf::of(buf)]], config, WriteMode::Put),
        )
    }

    /// Zero-copy batch put; one result per key (all `INVALID_PARAMS` on a length mismatch).
    pub fn batch_put_from<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        self.batch_from(keys, bufs, config, WriteMode::Put)
    }

    /// Zero-copy batch put where each key's object is the concatenation of its buffers.
    pub fn batch_put_from_multi_buffers<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &[Vec<&[u8]>],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        self.batch_multi(keys, bufs, config, WriteMode::Put)
    }

    /// Copying upsert (insert or overwrite).
    pub fn upsert(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> Result<()> {
        self.upsert_parts(key, &[value], config)
    }

    /// Copying upsert of the concatenation of `parts`.
    pub fn upsert_parts(&self, key: &str, parts: &[&[u8]], config: &ReplicateConfig) -> Result<()> {
        self.core
            .copying_write(&[key], vec![bufs_of(parts)], config, WriteMode::Upsert)
    }

    /// Copying batch upsert; 0 or the first per-key error.
    pub fn upsert_batch<K: AsRef<str>>(
        &self,
        keys: &[K],
        values: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<()> {
        let parts = values.iter().map(|v| vec![Buf::of(v)]).collect();
        self.core
            .copying_write(keys, parts, config, WriteMode::Upsert)
    }

    /// Zero-copy upsert.
    pub fn upsert_from(&self, key: &str, buf: &[u8], config: &ReplicateConfig) -> Result<()> {
        first(
            self.core
                .write(&[key], vec![vec![Buf::of(buf)]], config, WriteMode::Upsert),
        )
    }

    /// Zero-copy batch upsert.
    pub fn batch_upsert_from<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        self.batch_from(keys, bufs, config, WriteMode::Upsert)
    }

    /// Zero-copy batch upsert from scattered buffers.
    pub fn batch_upsert_from_multi_buffers<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &[Vec<&[u8]>],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        self.batch_multi(keys, bufs, config, WriteMode::Upsert)
    }

    fn batch_from<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &[&[u8]],
        config: &ReplicateConfig,
        mode: WriteMode,
    ) -> Vec<Result<()>> {
        let parts = bufs.iter().map(|b| vec![Buf::of(b)]).collect();
        self.core.write(keys, parts, config, mode)
    }

    fn batch_multi<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &[Vec<&[u8]>],
        config: &ReplicateConfig,
        mode: WriteMode,
    ) -> Vec<Result<()>> {
        let parts = bufs.iter().map(|list| bufs_of(list)).collect();
        self.core.write(keys, parts, config, mode)
    }
}

/// Address ranges of host slices.
fn bufs_of(parts: &[&[u8]]) -> Vec<Buf> {
    parts.iter().map(|p| Buf::of(p)).collect()
}

/// The single result of a one-key batch.
fn first(mut results: Vec<Result<()>>) -> Result<()> {
    results.pop().unwrap_or(Err(ErrorCode::InternalError))
}

impl ClientCore {
    /// The copying family: Mooncake's argument contract (a local buffer that could hold
    /// each value), then the zero-copy write path; 0 or the first per-key error.
    fn copying_write<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        config: &ReplicateConfig,
        mode: WriteMode,
    ) -> Result<()> {
        self.check_open()?;
        if keys.len() != bufs.len() {
            return fail(
                ErrorCode::InvalidParams,
                format!("{} keys but {} values", keys.len(), bufs.len()),
            );
        }
        for list in &bufs {
            let total = plan::total_len(list)?;
            match &self.local_buffer {
                _ if total == 0 => {}
                None => {
                    return fail(
                        ErrorCode::InvalidParams,
                        "copying put needs a local buffer (local_buffer_size is 0)",
                    )
                }
                Some(buffer) if total > buffer.capacity() => {
                    return fail(
                        ErrorCode::InvalidParams,
                        format!("local buffer has no room for {total} bytes"),
                    )
                }
                Some(_) => {}
            }
        }
        let (keys, bufs) = match mode {
            // Insert-if-absent: of a key listed twice the first value wins (Mooncake's
            // put_batch), as if the later occurrence were a put of an existing key.
            WriteMode::Put => first_occurrences(keys, bufs),
            WriteMode::Upsert => (keys.iter().map(AsRef::as_ref).collect(), bufs),
        };
        self.write(&keys, bufs, config, mode)
            .into_iter()
            .find(|r| r.is_err())
            .unwrap_or(Ok(()))
    }

    /// The write path shared by every put/upsert variant. `bufs[i]` are key i's source
    /// buffers, laid end to end. Duplicate keys: the last occurrence's buffers are written and
    /// every occurrence gets its result.
    pub(super) fn write<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        config: &ReplicateConfig,
        mode: WriteMode,
    ) -> Vec<Result<()>> {
        let n = keys.len();
        let invalid = |msg: String| {
            let _ = fail::<()>(ErrorCode::InvalidParams, msg);
            vec![Err(ErrorCode::InvalidParams); n]
        };
        if let Err(e) = self.check_open() {
            return vec![Err(e); n];
        }
        if bufs.len() != n {
            return invalid(format!("{n} keys but {} buffer lists", bufs.len()));
        }
        if config.prefer_alloc_in_same_node {
            return invalid(
                "prefer_alloc_in_same_node is not supported by the client put paths".into(),
            );
        }
        if config.replica_num == 0 {
            return invalid("replica_num must be at least 1".into());
        }
        // Last occurrence of each key wins.
        let mut last: HashMap<&str, usize> = HashMap::with_capacity(n);
        for (i, key) in keys.iter().enumerate() {
            last.insert(key.as_ref(), i);
        }
        let mut results: Vec<Result<()>> = vec![Ok(()); n];
        let mut pending: Vec<(usize, u64)> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            if last.get(key.as_ref()) != Some(&i) {
                continue;
            }
            if key.as_ref().is_empty() {
                results[i] = fail(ErrorCode::InvalidParams, "empty key");
                continue;
            }
            match plan::total_len(&bufs[i]) {
                Ok(0) => tracing::debug!(key = key.as_ref(), "zero-size write ignored"),
                Ok(size) => pending.push((i, size)),
                Err(e) => results[i] = Err(e),
            }
        }
        if !pending.is_empty() {
            self.write_pending(keys, &bufs, &pending, config, mode, &mut results);
        }
        for (i, key) in keys.iter().enumerate() {
            let owner = last[key.as_ref()];
            if owner != i {
                results[i] = results[owner];
            }
        }
        let failed = results.iter().filter(|r| r.is_err()).count() as u64;
        ClientCounters::add(&self.counters.failed_ops, failed);
        results
    }

    fn write_pending<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &[Vec<Buf>],
        pending: &[(usize, u64)],
        config: &ReplicateConfig,
        mode: WriteMode,
        results: &mut [Result<()>],
    ) {
        let names: Vec<String> = pending
            .iter()
            .map(|&(i, _)| keys[i].as_ref().to_string())
            .collect();
        let sizes: Vec<u64> = pending.iter().map(|&(_, s)| s).collect();
        let asked_at = Instant::now();
        let started = match mode {
            WriteMode::Put => {
                self.master
                    .batch_put_start(self.id, names.clone(), sizes, config.clone())
            }
            WriteMode::Upsert => {
                self.master
                    .batch_upsert_start(self.id, names.clone(), sizes, config.clone())
            }
        };
        let started = match started {
            Ok(list) if list.len() == pending.len() => list,
            Ok(_) => vec![
                fail(
                    ErrorCode::RpcFail,
                    "master answered with the wrong number of entries"
                );
                pending.len()
            ],
            Err(e) => vec![Err(e); pending.len()],
        };
        let mut writes: Vec<ReplicaWrite> = Vec::new();
        let mut tokens: HashMap<usize, WriteToken> = HashMap::new();
        let mut revoke = Vec::new();
        for (&(i, size), start) in pending.iter().zip(started) {
            match start {
                Ok(grant) => {
                    let granted = GrantedWrite::new(&grant, asked_at);
                    tokens.insert(i, granted.token);
                    let checked = check_replicas(&grant.replicas, size)
                        .and_then(|()| granted.check_writable());
                    match checked {
                        Ok(()) => writes.push(ReplicaWrite {
                            key: i,
                            replicas: grant.replicas,
                            fragments: plan::contiguous(&bufs[i]),
                            send_by: granted.send_by(),
                        }),
                        Err(e) => {
                            results[i] = Err(e);
                            revoke.push((i, granted.token));
                        }
                    }
                }
                Err(ErrorCode::ObjectAlreadyExists) if mode == WriteMode::Put => {
                    tracing::debug!(
                        key = keys[i].as_ref(),
                        "key exists; put keeps the old value"
                    );
                }
                Err(e) => results[i] = Err(e),
            }
        }
        let outcomes = self.write_replicas(&writes);
        let mut commit = Vec::new();
        for (write, outcome) in writes.iter().zip(outcomes) {
            let (i, token) = (write.key, tokens[&write.key]);
            match outcome {
                Ok(()) => commit.push((i, token)),
                Err(e) => {
                    results[i] = Err(e);
                    revoke.push((i, token));
                }
            }
        }
        for (i, outcome) in self.finish(keys, &commit, true) {
            if let Err(e) = outcome {
                results[i] = Err(e);
            }
        }
        self.finish(keys, &revoke, false);
        let sizes: HashMap<usize, u64> = pending.iter().copied().collect();
        for &(i, _) in commit.iter().filter(|(i, _)| results[*i].is_ok()) {
            ClientCounters::add(&self.counters.objects_written, 1);
            ClientCounters::add(&self.counters.bytes_written, sizes[&i]);
        }
    }

    /// Writes every key's fragments to every one of its replicas in one engine batch; a key
    /// succeeds only if all its replicas were written.
    pub(super) fn write_replicas(&self, writes: &[ReplicaWrite]) -> Vec<Result<()>> {
        let mut requests = Vec::new();
        let mut spans = Vec::with_capacity(writes.len());
        for write in writes {
            let start = requests.len();
            for replica in &write.replicas {
                let planned = plan::requests(TransferOp::Write, &write.fragments, replica);
                requests.extend(planned.map(|r| TransferRequest {
                    send_by: write.send_by,
                    ..r
                }));
            }
            spans.push(start..requests.len());
        }
        // SAFETY: fragments point into caller buffers (or our local buffer) that stay valid
        // for the whole call; writes only read them.
        let done = unsafe { self.engine.transfer(&requests) };
        spans
            .into_iter()
            .map(|span| {
                done[span]
                    .iter()
                    .copied()
                    .find(|r| r.is_err())
                    .unwrap_or(Ok(()))
            })
            .collect()
    }

    /// Commits (`PutEnd`) or revokes (`PutRevoke`) write `token` of `keys[i]` for every
    /// `(i, token)` in `which`; returns each one's outcome (a failed revoke is also logged:
    /// the master reclaims the space later).
    pub(super) fn finish<K: AsRef<str>>(
        &self,
        keys: &[K],
        which: &[(usize, WriteToken)],
        commit: bool,
    ) -> Vec<(usize, Result<()>)> {
        if which.is_empty() {
            return Vec::new();
        }
        let names: Vec<String> = which
            .iter()
            .map(|&(i, _)| keys[i].as_ref().to_string())
            .collect();
        let tokens = which.iter().map(|&(_, token)| token).collect();
        let answer = if commit {
            self.put_end_after_revocations(names, tokens)
        } else {
            self.master.batch_put_revoke(self.id, names, tokens)
        };
        let per_key = match answer {
            Ok(list) if list.len() == which.len() => list,
            Ok(_) => vec![Err(ErrorCode::RpcFail); which.len()],
            Err(e) => vec![Err(e); which.len()],
        };
        for (&(i, _), outcome) in which.iter().zip(&per_key) {
            if let (Err(e), false) = (outcome, commit) {
                tracing::warn!(key = keys[i].as_ref(), error = %e, "revoke failed; the master reclaims the space later");
            }
        }
        which.iter().map(|&(i, _)| i).zip(per_key).collect()
    }
}

/// The first occurrence of each key, with its buffers, in call order.
fn first_occurrences<K: AsRef<str>>(keys: &[K], bufs: Vec<Vec<Buf>>) -> (Vec<&str>, Vec<Vec<Buf>>) {
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.iter()
        .map(AsRef::as_ref)
        .zip(bufs)
        .filter(|&(k, _)| seen.insert(k))
        .unzip()
}
