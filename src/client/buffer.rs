//! `get_buffer`: objects read into client-owned memory from the local buffer, handed to the
//! caller as an owning [`BufferHandle`].

use super::core::{Client, ClientCore};
use super::counters::ClientCounters;
use super::plan::{self, Buf, ReadJob};
use super::read::Leased;
use crate::error::{fail, ErrorCode, Result};
use crate::node::LocalAlloc;

/// An object read into the client's local buffer. Owns that memory: dropping the handle
/// returns it. Valid after the client is torn down (the buffer stays mapped until the last
/// handle drops). `Send + Sync`; the bytes are immutable through this handle.
pub struct BufferHandle {
    alloc: LocalAlloc,
}

impl BufferHandle {
    /// Address of the first byte.
    pub fn ptr(&self) -> *const u8 {
        self.alloc.addr() as *const u8
    }

    /// Object size in bytes.
    pub fn len(&self) -> usize {
        self.alloc.len() as usize
    }

    /// True for an empty object (never produced by the store; objects have ≥ 1 byte).
    pub fn is_empty(&self) -> bool {
        self.alloc.is_empty()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation is ours, `len` bytes long, initialised by the read and kept
        // alive by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len()) }
    }
}

impl Client {
    /// Reads `key` into a new allocation of the pre-faulted (and, with a device runtime,
    /// pinned) local buffer: exactly one copy, no second copy when handing it out — the
    /// caller owns the handle. Errors: those of
    /// `get_into`; `INVALID_PARAMS` when the local buffer is absent or full.
    pub fn get_buffer(&self, key: &str) -> Result<BufferHandle> {
        self.batch_get_buffer(&[key])
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError))
    }

    /// `get_buffer` for many keys with one master query.
    pub fn batch_get_buffer<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Result<BufferHandle>> {
        let core = &self.core;
        if let Err(e) = core.check_open() {
            return keys.iter().map(|_| Err(e)).collect();
        }
        let results = core.read_answered(keys, |answers, _| core.read_into_buffers(answers));
        let sizes: Vec<Result<u64>> = results
            .iter()
            .map(|r| r.as_ref().map(|h| h.len() as u64).map_err(|e| *e))
            .collect();
        for size in sizes.iter().flatten() {
            ClientCounters::add(&core.counters.get_buffer_ops, 1);
            ClientCounters::add(&core.counters.get_buffer_bytes, *size);
        }
        core.count_reads(&sizes);
        results
    }
}

impl ClientCore {
    /// Reads each answered key into a new allocation of the local buffer.
    fn read_into_buffers(&self, answers: &[Result<Leased>]) -> Vec<Result<BufferHandle>> {
        let core = self;
        let mut results: Vec<Result<BufferHandle>> = Vec::with_capacity(answers.len());
        let mut jobs = Vec::new();
        let mut job_index = Vec::new();
        for (i, answer) in answers.iter().enumerate() {
            let alloc =
                answer
                    .as_ref()
                    .map_err(|e| *e)
                    .and_then(|leased| match &core.local_buffer {
                        Some(buffer) => buffer.allocate(leased.query.size),
                        None => fail(
                            ErrorCode::InvalidParams,
                            "get_buffer needs a local buffer (local_buffer_size is 0)",
                        ),
                    });
            if let (Ok(alloc), Ok(leased)) = (&alloc, answer) {
                job_index.push(i);
                jobs.push(ReadJob {
                    replicas: core.ordered(&leased.query),
                    fragments: plan::contiguous(&[Buf {
                        addr: alloc.addr(),
                        len: alloc.len(),
                    }]),
                });
            }
            results.push(alloc.map(|alloc| BufferHandle { alloc }));
        }
        let outcomes = core.read_jobs(&jobs);
        for (&i, outcome) in job_index.iter().zip(outcomes) {
            let expired = answers[i].as_ref().map(|l| l.expired()).unwrap_or(false);
            match outcome {
                Err(e) => results[i] = Err(e),
                Ok(()) if expired => {
                    results[i] = fail(ErrorCode::LeaseExpired, "the read finished after its lease")
                }
                Ok(()) => {}
            }
        }
        results
    }
}
