//! Layer-wise sessions: a get session resolves keys once (one master query) so each later
//! ranged read needs no master call; a put session reserves objects once, takes ranged writes
//! per layer, then commits or revokes them together.

use super::core::Client;
use super::plan::{self, Buf, Fragment};
use super::plan::{check_replicas, per_key, GrantedWrite, ReadJob, ReplicaWrite};
use super::session_table::{GetSession, PutSession, SessionPin};
use crate::error::{fail, ErrorCode, Result};
use crate::types::ReplicateConfig;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) fn session_fragments(bufs: &[Buf], offsets: &[u64], size: u64) -> Result<Vec<Fragment>> {
    if bufs.len() != offsets.len() {
        return fail(
            ErrorCode::InvalidParams,
            format!("{} buffers but {} offsets", bufs.len(), offsets.len()),
        );
    }
    let fragments: Vec<Fragment> = bufs
        .iter()
        .zip(offsets)
        .filter(|(b, _)| b.len > 0)
        .map(|(b, &offset)| Fragment {
            local: b.addr,
            len: b.len,
            offset,
        })
        .collect();
    plan::check_within(&fragments, size)?;
    Ok(fragments)
}

/// The sessions of `keys` (cloned out, so no lock is held during transfers).
pub(super) fn snapshot<T: Clone, K: AsRef<str>>(
    table: &Mutex<HashMap<String, T>>,
    keys: &[K],
) -> Vec<Option<T>> {
    let table = table.lock();
    keys.iter()
        .map(|k| table.get(k.as_ref()).cloned())
        .collect()
}

/// Removes `key`'s session if it is still `seen` (the same pin), never a session another
/// thread started for the key since; returns the removed session (unpin it outside the lock).
fn remove_if_same(
    table: &mut HashMap<String, GetSession>,
    key: &str,
    seen: &Option<GetSession>,
) -> Option<GetSession> {
    let same = matches!((table.get(key), seen), (Some(a), Some(b)) if Arc::ptr_eq(&a.pin, &b.pin));
    same.then(|| table.remove(key)).flatten()
}

pub(super) fn lengths_match(n: usize, others: &[usize]) -> Result<()> {
    if others.iter().all(|&m| m == n) {
        Ok(())
    } else {
        fail(
            ErrorCode::InvalidParams,
            "argument lists have different lengths",
        )
    }
}

impl Client {
    /// Starts get sessions: one master call for all keys, which also pins each object for
    /// the session (its bytes cannot be evicted or freed by a remove until
    /// [`Client::batch_get_session_end`], so on-stream ranged reads need no further master
    /// call). Per key: 0, the query error, `LEASE_EXPIRED`, or `INVALID_REPLICA` when no
    /// replica is readable. Restarting a key replaces its session.
    pub fn batch_get_session_start<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<()>> {
        let core = &self.core;
        if let Err(e) = core.check_open() {
            return vec![Err(e); keys.len()];
        }
        let started = Instant::now();
        let names = keys.iter().map(|k| k.as_ref().to_string()).collect();
        let answers = per_key(core.master.batch_pin(core.id, names), keys.len());
        let mut replaced = Vec::new();
        let mut table = core.sessions.get.lock();
        let results = keys
            .iter()
            .zip(answers)
            .map(|(key, answer)| {
                let pinned = answer?;
                let pin = Arc::new(SessionPin {
                    master: core.master.clone(),
                    client: core.id,
                    pin_id: Some(pinned.pin_id),
                    pinned_at: started,
                });
                let deadline = started + Duration::from_millis(pinned.query.lease_ttl_ms);
                if Instant::now() >= deadline {
                    replaced.push(pin);
                    return fail(
                        ErrorCode::LeaseExpired,
                        "lease expired before the session started",
                    );
                }
                let Some(replica) = core.ordered(&pinned.query).first().map(|r| (*r).clone())
                else {
                    replaced.push(pin);
                    return fail(ErrorCode::InvalidReplica, "no readable memory replica");
                };
                let session = GetSession {
                    replica,
                    size: pinned.query.size,
                    deadline,
                    pin,
                };
                replaced.extend(
                    table
                        .insert(key.as_ref().to_string(), session)
                        .map(|s| s.pin),
                );
                Ok(())
            })
            .collect();
        drop(table);
        drop(replaced); // unpins outside the lock
        results
    }

    /// Ranged reads within get sessions, no master call: `bufs[i][j]` receives object bytes
    /// `[src_offsets[i][j], + len)`. Per key: bytes read, `INVALID_PARAMS` (no session, shape
    /// mismatch, range past the object) or `LEASE_EXPIRED` (the session is then ended).
    pub fn batch_get_into_multi_buffer_ranges<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &mut [Vec<&mut [u8]>],
        src_offsets: &[Vec<u64>],
    ) -> Vec<Result<u64>> {
        let bufs = bufs
            .iter_mut()
            .map(|list| list.iter_mut().map(|b| Buf::of_mut(b)).collect())
            .collect();
        // SAFETY: exclusive slices are writable host memory and never overlap.
        unsafe { self.batch_get_into_multi_buffer_ranges_raw(keys, bufs, src_offsets) }
    }

    /// [`Client::batch_get_into_multi_buffer_ranges`] with raw destination buffers that may
    /// be device memory.
    ///
    /// # Safety
    /// Every [`Buf`] is writable memory (host or device) of its length for the whole call,
    /// and no two of them overlap.
    pub unsafe fn batch_get_into_multi_buffer_ranges_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        src_offsets: &[Vec<u64>],
    ) -> Vec<Result<u64>> {
        let core = &self.core;
        let n = keys.len();
        if let Err(e) = core
            .check_open()
            .and(lengths_match(n, &[bufs.len(), src_offsets.len()]))
        {
            return vec![Err(e); n];
        }
        let sessions = snapshot(&core.sessions.get, keys);
        let mut results: Vec<Result<u64>> = Vec::with_capacity(n);
        let mut jobs = Vec::new();
        let mut job_index = Vec::new();
        for i in 0..n {
            let prepared = match &sessions[i] {
                None => fail(
                    ErrorCode::InvalidParams,
                    format!("no get session for '{}'", keys[i].as_ref()),
                ),
                Some(s) if Instant::now() >= s.deadline => {
                    fail(ErrorCode::LeaseExpired, "get session lease expired")
                }
                Some(s) => session_fragments(&bufs[i], &src_offsets[i], s.size),
            };
            match prepared {
                Ok(fragments) => {
                    let bytes = fragments.iter().map(|f| f.len).sum();
                    if let Some(session) = &sessions[i] {
                        job_index.push(i);
                        jobs.push(ReadJob {
                            replicas: vec![&session.replica],
                            fragments,
                        });
                    }
                    results.push(Ok(bytes));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        let outcomes = core.read_jobs(&jobs);
        for (&i, outcome) in job_index.iter().zip(outcomes) {
            if let Err(e) = outcome {
                results[i] = Err(e);
            }
        }
        let mut ended = Vec::new();
        let mut table = core.sessions.get.lock();
        for i in 0..n {
            let expired = sessions[i]
                .as_ref()
                .is_some_and(|s| Instant::now() >= s.deadline);
            if expired {
                ended.extend(remove_if_same(&mut table, keys[i].as_ref(), &sessions[i]));
                if results[i].is_ok() || results[i] == Err(ErrorCode::LeaseExpired) {
                    results[i] = fail(ErrorCode::LeaseExpired, "get session lease expired");
                }
            }
        }
        drop(table);
        drop((ended, sessions)); // unpins outside the lock
        core.count_reads(&results);
        results
    }

    /// Ends get sessions (idempotent; always 0). Each object is unpinned here, or when the
    /// last on-stream ticket reading through the session is released.
    pub fn batch_get_session_end<K: AsRef<str>>(&self, keys: &[K]) -> Result<()> {
        let mut table = self.core.sessions.get.lock();
        let ended: Vec<GetSession> = keys
            .iter()
            .filter_map(|key| table.remove(key.as_ref()))
            .collect();
        drop(table);
        drop(ended); // unpins outside the lock
        Ok(())
    }

    /// Starts put sessions: reserves `sizes[i]` bytes for `keys[i]` (master `PutStart`; an
    /// existing key is `OBJECT_ALREADY_EXISTS` here). Per key: 0 or the error;
    /// `INVALID_PARAMS` for a key with an open session.
    pub fn batch_put_session_start<K: AsRef<str>>(
        &self,
        keys: &[K],
        sizes: &[u64],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        let core = &self.core;
        let n = keys.len();
        if let Err(e) = core.check_open().and(lengths_match(n, &[sizes.len()])) {
            return vec![Err(e); n];
        }
        let mut results: Vec<Result<()>> = vec![Ok(()); n];
        let mut start = Vec::new();
        {
            let table = core.sessions.put.lock();
            for (i, key) in keys.iter().enumerate() {
                if table.contains_key(key.as_ref()) {
                    results[i] = fail(
                        ErrorCode::InvalidParams,
                        format!("put session for '{}' already open", key.as_ref()),
                    );
                } else {
                    start.push(i);
                }
            }
        }
        if start.is_empty() {
            return results;
        }
        let names: Vec<String> = start
            .iter()
            .map(|&i| keys[i].as_ref().to_string())
            .collect();
        let asked_at = Instant::now();
        let answer = core.master.batch_put_start(
            core.id,
            names.clone(),
            start.iter().map(|&i| sizes[i]).collect(),
            config.clone(),
        );
        let mut refused = Vec::new();
        let mut table = core.sessions.put.lock();
        for (&i, outcome) in start.iter().zip(per_key(answer, start.len())) {
            let grant = match outcome {
                Ok(grant) => grant,
                Err(e) => {
                    results[i] = Err(e);
                    continue;
                }
            };
            let write = GrantedWrite::new(&grant, asked_at);
            let usable = if grant.replicas.is_empty() {
                fail(ErrorCode::InvalidReplica, "no memory replica allocated")
            } else {
                check_replicas(&grant.replicas, sizes[i])
            };
            if let Err(e) = usable {
                results[i] = Err(e);
                refused.push((i, write.token));
                continue;
            }
            let session = PutSession {
                replicas: grant.replicas,
                size: sizes[i],
                write,
                state: Mutex::default(),
                idle: Condvar::new(),
            };
            table.insert(keys[i].as_ref().to_string(), Arc::new(session));
        }
        drop(table);
        core.finish(keys, &refused, false);
        results
    }

    /// Ranged writes within put sessions, no master call: `bufs[i][j]` goes to object offset
    /// `dst_offsets[i][j]` on every replica. Per key: logical bytes written or an error
    /// (`INVALID_PARAMS` for no/sealed session, shape mismatch, overflow; transfer errors).
    pub fn batch_put_from_multi_buffer_ranges<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: &[Vec<&[u8]>],
        dst_offsets: &[Vec<u64>],
    ) -> Vec<Result<u64>> {
        let bufs = bufs
            .iter()
            .map(|list| list.iter().map(|b| Buf::of(b)).collect())
            .collect();
        // SAFETY: shared slices are readable host memory.
        unsafe { self.batch_put_from_multi_buffer_ranges_raw(keys, bufs, dst_offsets) }
    }

    /// [`Client::batch_put_from_multi_buffer_ranges`] with raw source buffers that may be
    /// device memory.
    ///
    /// # Safety
    /// Every [`Buf`] is readable memory (host or device) of its length for the whole call.
    pub unsafe fn batch_put_from_multi_buffer_ranges_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        bufs: Vec<Vec<Buf>>,
        dst_offsets: &[Vec<u64>],
    ) -> Vec<Result<u64>> {
        let core = &self.core;
        let n = keys.len();
        if let Err(e) = core
            .check_open()
            .and(lengths_match(n, &[bufs.len(), dst_offsets.len()]))
        {
            return vec![Err(e); n];
        }
        let sessions = snapshot(&core.sessions.put, keys);
        let mut results: Vec<Result<u64>> = Vec::with_capacity(n);
        let mut writes = Vec::new();
        let mut entered = Vec::new();
        for i in 0..n {
            let prepared = match &sessions[i] {
                None => fail(
                    ErrorCode::InvalidParams,
                    format!("no put session for '{}'", keys[i].as_ref()),
                ),
                Some(s) => session_fragments(&bufs[i], &dst_offsets[i], s.size)
                    .and_then(|f| s.enter().map(|()| f)),
            };
            match (prepared, &sessions[i]) {
                (Ok(fragments), Some(session)) => {
                    results.push(Ok(fragments.iter().map(|f| f.len).sum()));
                    entered.push(Arc::clone(session));
                    writes.push(ReplicaWrite {
                        key: i,
                        replicas: session.replicas.clone(),
                        fragments,
                        send_by: session.write.send_by(),
                    });
                }
                (Err(e), _) => results.push(Err(e)),
                (Ok(_), None) => results.push(Err(ErrorCode::InternalError)),
            }
        }
        let outcomes = core.write_replicas(&writes);
        for ((session, write), outcome) in entered.iter().zip(&writes).zip(outcomes) {
            session.leave(outcome);
            if let Err(e) = outcome {
                results[write.key] = Err(e);
            }
        }
        results
    }

    /// Seals put sessions, waits for their ranged writes and commits them. Per key: 0 (the
    /// session ends), `INVALID_PARAMS` (no session), the first failed ranged write's error
    /// (nothing is committed: the session is revoked and ends), or the master's error
    /// (`STALE_WRITE_TOKEN` when the master reclaimed the write; otherwise the session is
    /// kept so the caller can retry or revoke).
    pub fn batch_put_session_end<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<()>> {
        self.finish_put_sessions(keys, true)
    }

    /// Seals put sessions, waits for their ranged writes and revokes them. Per key: 0 (also
    /// when the master no longer knows the key), `INVALID_PARAMS` (no session) or the master's
    /// error (session kept).
    pub fn batch_put_session_revoke<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<()>> {
        self.finish_put_sessions(keys, false)
    }

    fn finish_put_sessions<K: AsRef<str>>(&self, keys: &[K], commit: bool) -> Vec<Result<()>> {
        let core = &self.core;
        let n = keys.len();
        if let Err(e) = core.check_open() {
            return vec![Err(e); n];
        }
        let sessions = snapshot(&core.sessions.put, keys);
        let mut results: Vec<Result<()>> = vec![Ok(()); n];
        let mut ends = Vec::new();
        let mut revokes = Vec::new();
        for (i, session) in sessions.iter().enumerate() {
            match session {
                None => {
                    results[i] = fail(
                        ErrorCode::InvalidParams,
                        format!("no put session for '{}'", keys[i].as_ref()),
                    )
                }
                Some(s) => match (commit, s.seal_and_drain()) {
                    (true, Some(e)) => {
                        results[i] = fail(e, "a ranged write of this put session failed");
                        revokes.push((i, s.write.token));
                    }
                    (true, None) => ends.push((i, s.write.token)),
                    (false, _) => revokes.push((i, s.write.token)),
                },
            }
        }
        // A write the master no longer has (reclaimed, superseded) leaves nothing to finish.
        let gone = |outcome: &Result<()>| {
            matches!(
                outcome,
                Ok(()) | Err(ErrorCode::ObjectNotFound | ErrorCode::StaleWriteToken)
            )
        };
        let ended = core.finish(keys, &ends, true);
        let revoked = core.finish(keys, &revokes, false);
        let mut table = core.sessions.put.lock();
        // Only this session leaves the table, never one another thread started since.
        let mut remove = |i: usize| {
            let key = keys[i].as_ref();
            let same =
                matches!((table.get(key), &sessions[i]), (Some(a), Some(b)) if Arc::ptr_eq(a, b));
            if same {
                table.remove(key);
            }
        };
        for (i, outcome) in ended {
            if gone(&outcome) {
                remove(i);
            }
            results[i] = outcome;
        }
        for (i, outcome) in revoked {
            let gone = gone(&outcome);
            if gone {
                remove(i);
            }
            if results[i].is_ok() && !gone {
                results[i] = outcome;
            }
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use super::super::core::tests::embedded_with;
    use crate::error::ErrorCode;
    use crate::master::MasterConfig;
    use crate::types::ReplicateConfig;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn an_expiring_get_session_never_ends_one_restarted_meanwhile() {
        let lease = Duration::from_millis(30);
        let client = embedded_with(
            MasterConfig {
                default_kv_lease_ttl_ms: lease.as_millis() as u64,
                ..MasterConfig::default()
            },
            64 << 20,
        );
        let size = 16 << 20;
        client
            .put_from("k", &vec![5u8; size], &ReplicateConfig::default())
            .unwrap();
        let stop = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_secs(3);
        let lost = std::thread::scope(|s| {
            // Long ranged reads whose session often expires while they run.
            s.spawn(|| {
                let mut buf = vec![0u8; size];
                while !stop.load(Ordering::Acquire) && Instant::now() < deadline {
                    let _ = client.batch_get_into_multi_buffer_ranges(
                        &["k"],
                        &mut [vec![&mut buf[..]]],
                        &[vec![0]],
                    );
                }
            });
            // Restart the session each time it expires; a fresh session must stay open
            // until its own lease ends.
            let mut lost = 0;
            let mut byte = [0u8; 1];
            while Instant::now() < deadline && lost == 0 {
                let asked = Instant::now();
                assert_eq!(client.batch_get_session_start(&["k"]), vec![Ok(())]);
                loop {
                    let read = client.batch_get_into_multi_buffer_ranges(
                        &["k"],
                        &mut [vec![&mut byte[..]]],
                        &[vec![0]],
                    );
                    match read[0] {
                        Ok(_) => continue,
                        Err(ErrorCode::InvalidParams) if Instant::now() < asked + lease => {
                            lost += 1
                        }
                        Err(_) => {}
                    }
                    break;
                }
            }
            stop.store(true, Ordering::Release);
            lost
        });
        assert_eq!(lost, 0, "a session restarted by another thread was ended");
    }
}
