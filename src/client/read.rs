//! The get family: one master query (which grants a read lease), then bytes move straight
//! from the best replica into the caller's memory — local replica first, the others as
//! fallbacks — and a read that ends after the lease is reported as `LEASE_EXPIRED`.

use super::core::{Client, ClientCore};
use super::counters::ClientCounters;
use super::plan::{self, per_key, Buf, ReadJob};
use crate::error::{fail, ErrorCode, Result};
use crate::transfer::TransferOp;
use crate::types::{QueryResult, ReplicaDescriptor};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where [`ClientCore::query_with`] looks first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lookup {
    /// The location cache, then the master for what it cannot serve.
    Cache,
    /// The master only (a retry after a stale hit; calls that need a fresh lease).
    Master,
}

/// A key's answer from the master (or the location cache) together with the moment its read
/// lease runs out.
#[derive(Clone, Debug)]
pub(super) struct Leased {
    pub query: Arc<QueryResult>,
    pub deadline: Instant,
    /// Served by the location cache: a read that fails with it is tried again with a fresh
    /// answer ([`ClientCore::stale_keys`]).
    pub cached: bool,
}

impl Leased {
    pub(super) fn expired(&self) -> bool {
        self.expired_at(Instant::now())
    }

    /// Whether the lease had run out at `now` (one clock read for a whole batch).
    pub(super) fn expired_at(&self, now: Instant) -> bool {
        now >= self.deadline
    }
}

impl Client {
    /// Reads `key` into `buf`; returns the object size. `INVALID_PARAMS` if `buf` is smaller
    /// than the object, `OBJECT_NOT_FOUND`, `REPLICA_IS_NOT_READY`, `LEASE_EXPIRED`,
    /// `TRANSFER_FAIL`.
    pub fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<u64> {
        let mut out = self
            .core
            .get_into(&[key], vec![vec![Buf::of_mut(buf)]], false);
        out.pop().unwrap_or(Err(ErrorCode::InternalError))
    }

    /// Batch `get_into` with one master query; one result per key (all `INVALID_PARAMS` on a
    /// length mismatch). A key listed twice is read into each of its buffers.
    pub fn batch_get_into<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &mut [&mut [u8]],
    ) -> Vec<Result<u64>> {
        let bufs = bufs.iter_mut().map(|b| vec![Buf::of_mut(b)]).collect();
        self.core.get_into(keys, bufs, false)
    }

    /// Reads each key's object scattered over its buffers in order. The buffer sizes must add
    /// up to the object size exactly: less is `INVALID_PARAMS`, more is `TRANSFER_FAIL`
    /// (Mooncake's behaviour).
    pub fn batch_get_into_multi_buffers<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &mut [Vec<&mut [u8]>],
    ) -> Vec<Result<u64>> {
        let bufs = bufs
            .iter_mut()
            .map(|list| list.iter_mut().map(|b| Buf::of_mut(b)).collect())
            .collect();
        self.core.get_into(keys, bufs, true)
    }

    /// Batch `get_into` (`exact` false: each key's buffers must hold at least the object) or
    /// `batch_get_into_multi_buffers` (`exact` true) with raw addresses that may be device
    /// memory; one result per key (the object size).
    ///
    /// # Safety
    /// Every [`Buf`] is writable memory (host or device) of its length for the whole call,
    /// and no two of them overlap.
    pub unsafe fn get_into_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        exact: bool,
    ) -> Vec<Result<u64>> {
        self.core.get_into(keys, bufs, exact)
    }

    /// Whether `key` has a readable replica (grants a read lease when it does).
    pub fn is_exist(&self, key: &str) -> Result<bool> {
        self.batch_is_exist(&[key])
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError))
    }

    /// `is_exist` for many keys with one master call.
    pub fn batch_is_exist<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<bool>> {
        if let Err(e) = self.core.check_open() {
            return vec![Err(e); keys.len()];
        }
        let names = keys.iter().map(|k| k.as_ref().to_string()).collect();
        per_key(self.core.master.batch_exist_key(names), keys.len())
    }

    /// The readable replicas of each key with one master call (Mooncake's
    /// `batch_get_replica_desc`; grants each found object a read lease). Per key the object
    /// size and replicas, or the query's error (`OBJECT_NOT_FOUND`, ...).
    pub fn batch_get_replica_desc<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<QueryResult>> {
        if let Err(e) = self.core.check_open() {
            return vec![Err(e); keys.len()];
        }
        // Always asked of the master: the caller reads on its own, under a fresh lease.
        self.core
            .query_with(keys, Lookup::Master)
            .into_iter()
            .map(|answer| answer.map(|leased| Arc::unwrap_or_clone(leased.query)))
            .collect()
    }

    /// Size of `key`'s object (grants a read lease).
    pub fn get_size(&self, key: &str) -> Result<u64> {
        self.core.check_open()?;
        let mut answers = self.core.query(&[key]);
        answers
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError))
            .map(|l| l.query.size)
    }
}

impl ClientCore {
    /// Every key's answer: from the location cache where it may serve one, the others with
    /// one master query; each carries its read lease deadline, measured from before the
    /// request was sent.
    pub(super) fn query<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<Leased>> {
        self.query_with(keys, Lookup::Cache)
    }

    /// [`Self::query`], with the cache consulted only for [`Lookup::Cache`] (answers are
    /// cached either way when the cache is on).
    pub(super) fn query_with<K: AsRef<str>>(
        &self,
        keys: &[K],
        lookup: Lookup,
    ) -> Vec<Result<Leased>> {
        let cache = &self.locations;
        let mut answers: Vec<Option<Result<Leased>>> = vec![None; keys.len()];
        let mut asked = Vec::with_capacity(keys.len());
        let now = Instant::now();
        for (i, key) in keys.iter().enumerate() {
            let hit = match lookup {
                Lookup::Cache => cache.lookup(key.as_ref(), now),
                Lookup::Master => None,
            };
            match hit {
                Some((query, deadline)) => {
                    answers[i] = Some(Ok(Leased {
                        query,
                        deadline,
                        cached: true,
                    }))
                }
                None => asked.push(i),
            }
        }
        if !asked.is_empty() {
            let seen = cache.snapshot();
            let started = Instant::now();
            let names: Vec<String> = asked
                .iter()
                .map(|&i| keys[i].as_ref().to_string())
                .collect();
            let replies = match cache.enabled() {
                true => self.master.batch_get_locations(self.id, names),
                false => self.master.batch_get_replica_list(names),
            };
            for (&i, reply) in asked.iter().zip(per_key(replies, asked.len())) {
                answers[i] = Some(reply.map(|query| {
                    let query = Arc::new(query);
                    cache.insert(keys[i].as_ref(), Arc::clone(&query), started, seen);
                    Leased {
                        deadline: started + Duration::from_millis(query.lease_ttl_ms),
                        query,
                        cached: false,
                    }
                }));
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or(Err(ErrorCode::InternalError)))
            .collect()
    }

    /// The keys whose read failed with an answer of the location cache (each is dropped from
    /// it): the caller reads them again with [`Lookup::Master`]. A stale descriptor fails its
    /// read (another epoch, a gone segment, a lease over), it never returns other bytes.
    pub(super) fn stale_keys<T>(
        &self,
        answers: &[Result<Leased>],
        results: &[Result<T>],
    ) -> Vec<usize> {
        answers
            .iter()
            .zip(results)
            .enumerate()
            .filter(|(_, (answer, result))| {
                result.is_err() && answer.as_ref().is_ok_and(|leased| leased.cached)
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Replicas in the order to try them: memory replicas before disk ones, ours first
    /// within each, else the master's order.
    pub(super) fn ordered<'a>(&self, query: &'a QueryResult) -> Vec<&'a ReplicaDescriptor> {
        let local = |r: &&ReplicaDescriptor| self.engine.is_local(&r.buffer.transport_endpoint);
        let mut ordered: Vec<&ReplicaDescriptor> = query.replicas.iter().collect();
        // Stable: memory before disk, and within each, local before remote.
        ordered.sort_by_key(|r| (r.disk.is_some(), !local(r)));
        ordered
    }

    fn get_into<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        exact: bool,
    ) -> Vec<Result<u64>> {
        let n = keys.len();
        if let Err(e) = self.check_open() {
            return vec![Err(e); n];
        }
        if bufs.len() != n {
            let _ = fail::<()>(
                ErrorCode::InvalidParams,
                format!("{n} keys but {} buffer lists", bufs.len()),
            );
            return vec![Err(ErrorCode::InvalidParams); n];
        }
        let results = self.read_answered(keys, |answers, which| {
            self.get_answered(answers, &bufs, which, exact)
        });
        self.count_reads(&results);
        results
    }

    /// Reads `keys` with `read` (given answers, and which keys they are, by index), answered
    /// from the location cache where it may serve; reads that failed with a cached answer are
    /// made once more with fresh answers from the master ([`Self::stale_keys`]). When the
    /// second read fails too, a first failure that was the owner's verdict on the record
    /// itself (corrupt, missing: [`found_damaged`]) is the answer: the second read can only
    /// have found that record dropped (`OBJECT_NOT_FOUND` while the master has not yet
    /// processed the owner's report).
    pub(super) fn read_answered<K: AsRef<str>, T>(
        &self,
        keys: &[K],
        read: impl Fn(&[Result<Leased>], &[usize]) -> Vec<Result<T>>,
    ) -> Vec<Result<T>> {
        let all: Vec<usize> = (0..keys.len()).collect();
        let answers = self.query(keys);
        let mut results = read(&answers, &all);
        let stale = self.stale_keys(&answers, &results);
        if stale.is_empty() {
            return results;
        }
        for &i in &stale {
            self.locations.forget(keys[i].as_ref());
        }
        let again: Vec<&str> = stale.iter().map(|&i| keys[i].as_ref()).collect();
        let fresh = self.query_with(&again, Lookup::Master);
        for (&i, result) in stale.iter().zip(read(&fresh, &stale)) {
            let first_damaged = results[i].as_ref().err().is_some_and(|&e| found_damaged(e));
            if result.is_ok() || !first_damaged {
                results[i] = result;
            }
        }
        results
    }

    /// Reads each answered key into its buffers (`answers[j]` into `bufs[which[j]]`).
    fn get_answered(
        &self,
        answers: &[Result<Leased>],
        bufs: &[Vec<Buf>],
        which: &[usize],
        exact: bool,
    ) -> Vec<Result<u64>> {
        let n = answers.len();
        let mut results: Vec<Result<u64>> = Vec::with_capacity(n);
        let mut jobs = Vec::new();
        let mut job_index = Vec::new();
        for (i, answer) in answers.iter().enumerate() {
            let prepared = match answer {
                Ok(leased) => plan::check_capacity(&bufs[which[i]], leased.query.size, exact)
                    .map(|()| leased.query.size),
                Err(e) => Err(*e),
            };
            if let (Ok(size), Ok(leased)) = (&prepared, answer) {
                job_index.push(i);
                jobs.push(ReadJob {
                    replicas: self.ordered(&leased.query),
                    fragments: plan::truncate(plan::contiguous(&bufs[which[i]]), *size),
                });
            }
            results.push(prepared);
        }
        let outcomes = self.read_jobs(&jobs);
        // Every read has finished by now: a lease over by now was over before a read ended.
        let finished = Instant::now();
        for (&i, outcome) in job_index.iter().zip(outcomes) {
            let leased = answers[i].as_ref().ok();
            results[i] = match (outcome, leased) {
                (Err(e), _) => Err(e),
                (Ok(()), Some(l)) if l.expired_at(finished) => {
                    fail(ErrorCode::LeaseExpired, "the read finished after its lease")
                }
                (Ok(()), _) => results[i],
            };
        }
        results
    }

    pub(super) fn count_reads(&self, results: &[Result<u64>]) {
        for r in results {
            match r {
                Ok(bytes) => {
                    ClientCounters::add(&self.counters.objects_read, 1);
                    ClientCounters::add(&self.counters.bytes_read, *bytes);
                }
                Err(_) => ClientCounters::add(&self.counters.failed_ops, 1),
            }
        }
    }

    /// Reads every job's fragments, trying its replicas in order: round `r` issues, in one
    /// engine batch, the `r`-th replica of every job that has not succeeded yet.
    pub(super) fn read_jobs(&self, jobs: &[ReadJob<'_>]) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = jobs
            .iter()
            .map(|j| {
                if j.replicas.is_empty() {
                    fail(ErrorCode::ReplicaIsNotReady, "no readable replica")
                } else {
                    Err(ErrorCode::TransferFail)
                }
            })
            .collect();
        let rounds = jobs.iter().map(|j| j.replicas.len()).max().unwrap_or(0);
        for round in 0..rounds {
            let mut requests = Vec::new();
            let mut spans = Vec::new();
            let mut from_disk = Vec::new();
            for (j, job) in jobs.iter().enumerate() {
                if results[j].is_ok() || job.replicas.len() <= round {
                    continue;
                }
                if job.replicas[round].disk.is_some() {
                    from_disk.push(j);
                    continue;
                }
                let start = requests.len();
                requests.extend(plan::requests(
                    TransferOp::Read,
                    &job.fragments,
                    job.replicas[round],
                ));
                spans.push((j, start..requests.len()));
            }
            if spans.is_empty() && from_disk.is_empty() {
                break;
            }
            for (j, outcome) in self.read_from_disk(jobs, &from_disk, round) {
                results[j] = outcome;
            }
            // SAFETY: fragments point into caller buffers (or our local buffer) valid and
            // writable for the whole call, and fragments of one call never overlap.
            let done = unsafe { self.engine.transfer(&requests) };
            for (j, span) in spans {
                results[j] = done[span]
                    .iter()
                    .copied()
                    .find(|r| r.is_err())
                    .unwrap_or(Ok(()));
                if results[j].is_err() && round + 1 < jobs[j].replicas.len() {
                    tracing::debug!(round, "replica read failed; trying the next replica");
                }
            }
        }
        results
    }
}

/// Whether a read failed because the owner found its record damaged (a checksum mismatch) or
/// gone (its file missing); the owner then drops the record and reports it lost.
fn found_damaged(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::ChecksumMismatch | ErrorCode::FileNotFound)
}
