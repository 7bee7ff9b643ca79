//! Reads of LOCAL_DISK replicas (the SSD tier, `docs/ssd-tier.md`) inside
//! [`ClientCore::read_jobs`]: each job's fragments are filled from the record's verified bytes,
//! read from this client's own tier or from its owner's read service. Several jobs of one
//! round read in parallel (one thread each, at most [`DISK_READ_PARALLELISM`] at once).

use super::core::ClientCore;
use super::plan::{Fragment, ReadJob};
use crate::error::{fail, ErrorCode, Result};
use crate::transfer::copy::copy_or_fail;
use crate::types::ReplicaDescriptor;

/// Most disk reads of one round in flight at once.
const DISK_READ_PARALLELISM: usize = 8;

impl ClientCore {
    /// Reads round `round`'s replica (a LOCAL_DISK one) of each job in `indexes`; returns
    /// each job's index and outcome.
    pub(super) fn read_from_disk(
        &self,
        jobs: &[ReadJob<'_>],
        indexes: &[usize],
        round: usize,
    ) -> Vec<(usize, Result<()>)> {
        let read = |j: usize| (j, self.read_disk_job(&jobs[j], jobs[j].replicas[round]));
        if indexes.len() <= 1 {
            return indexes.iter().map(|&j| read(j)).collect();
        }
        let mut outcomes = Vec::with_capacity(indexes.len());
        for batch in indexes.chunks(DISK_READ_PARALLELISM) {
            std::thread::scope(|scope| {
                let runs: Vec<_> = batch
                    .iter()
                    .map(|&j| scope.spawn(move || read(j)))
                    .collect();
                for (run, &j) in runs.into_iter().zip(batch) {
                    outcomes.push(run.join().unwrap_or_else(|_| {
                        (j, fail(ErrorCode::InternalError, "disk read panicked"))
                    }));
                }
            });
        }
        outcomes
    }

    /// Fills `job`'s fragments from the disk replica `replica`.
    fn read_disk_job(&self, job: &ReadJob<'_>, replica: &ReplicaDescriptor) -> Result<()> {
        let Some(record) = &replica.disk else {
            return fail(ErrorCode::InvalidReplica, "not a disk replica");
        };
        let fragments = &job.fragments;
        let start = fragments.iter().map(|f| f.offset).min().unwrap_or(0);
        let end = fragments
            .iter()
            .map(|f| f.offset + f.len)
            .max()
            .unwrap_or(0);
        if start >= end {
            return Ok(());
        }
        let endpoint = &replica.buffer.transport_endpoint;
        self.disk_readers
            .read(record, endpoint, (start, end), &mut |at, bytes| {
                fill(fragments, at, bytes)
            })
    }
}

/// Copies object bytes `[at, at + bytes.len())` into the parts of `fragments` they cover.
fn fill(fragments: &[Fragment], at: u64, bytes: &[u8]) -> Result<()> {
    let piece_end = at + bytes.len() as u64;
    for f in fragments {
        let (lo, hi) = (f.offset.max(at), (f.offset + f.len).min(piece_end));
        if lo >= hi {
            continue;
        }
        let dst = f.local + (lo - f.offset) as usize;
        let src = bytes[(lo - at) as usize..].as_ptr();
        // SAFETY: fragments point into caller memory (host or device) valid and writable for
        // the whole call (`read_jobs`' contract); `src` has `hi - lo` bytes left in `bytes`.
        unsafe { copy_or_fail(dst as *mut u8, src, (hi - lo) as usize)? };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_fill_exactly_the_fragments_they_cover() {
        let mut out = vec![0u8; 10];
        let base = out.as_mut_ptr() as usize;
        // Object bytes 2..6 go to out[0..4], object bytes 6..9 to out[7..10].
        let fragments = [
            Fragment {
                local: base,
                len: 4,
                offset: 2,
            },
            Fragment {
                local: base + 7,
                len: 3,
                offset: 6,
            },
        ];
        let object: Vec<u8> = (0u8..12).collect();
        fill(&fragments, 0, &object[0..5]).unwrap();
        fill(&fragments, 5, &object[5..12]).unwrap();
        assert_eq!(out, vec![2, 3, 4, 5, 0, 0, 0, 6, 7, 8]);
    }
}
