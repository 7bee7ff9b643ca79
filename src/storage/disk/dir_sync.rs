//! Group commit of directory syncs: a new record file is durable only once its directory is
//! synced, and one `fsync` of a directory makes every entry created in it before the call
//! durable, so writers that created files in the same directory meanwhile share one call
//! instead of each making its own.
//!
//! Thread-safety: [`DirSyncs`] is `Send + Sync`; each directory has its own mutex (a leaf,
//! held only to read and update counters, never across the `fsync`) and condition variable.

use parking_lot::{Condvar, Mutex};
use std::fs::File;
use std::io;
use std::path::Path;

/// What one directory's mutex guards.
#[derive(Default)]
struct Progress {
    /// Creations registered so far (tickets handed out).
    created: u64,
    /// Every creation with a ticket up to this one is durable.
    durable: u64,
    /// Whether a sync of the directory is running.
    syncing: bool,
}

#[derive(Default)]
struct Dir {
    progress: Mutex<Progress>,
    synced: Condvar,
}

/// The sync state of a fixed number of directories, addressed by index.
pub(super) struct DirSyncs {
    dirs: Vec<Dir>,
}

impl DirSyncs {
    /// State for directories `0..count`.
    pub(super) fn new(count: usize) -> DirSyncs {
        DirSyncs {
            dirs: (0..count).map(|_| Dir::default()).collect(),
        }
    }

    /// Returns once an entry created in directory `index` (at `path`) before this call is
    /// durable: after a sync that started after this call, this caller's own or another's.
    /// A caller makes at most one sync itself, so it returns after a bounded wait.
    ///
    /// Errors: the OS error of this caller's own sync (a failed sync of another caller
    /// makes this one try its own); an `index` out of range is `InvalidInput`.
    pub(super) fn sync(&self, index: usize, path: &Path) -> io::Result<()> {
        let Some(dir) = self.dirs.get(index) else {
            return Err(io::ErrorKind::InvalidInput.into());
        };
        let mut progress = dir.progress.lock();
        progress.created += 1;
        let ticket = progress.created;
        loop {
            if progress.durable >= ticket {
                return Ok(());
            }
            if progress.syncing {
                dir.synced.wait(&mut progress);
                continue;
            }
            progress.syncing = true;
            let covers = progress.created;
            drop(progress);
            let result = File::open(path).and_then(|dir| dir.sync_all());
            progress = dir.progress.lock();
            progress.syncing = false;
            if result.is_ok() {
                progress.durable = progress.durable.max(covers);
            }
            dir.synced.notify_all();
            return result;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::TempDir;
    use std::sync::Arc;

    #[test]
    fn concurrent_creators_share_syncs_and_all_return() {
        let tmp = TempDir::new("dir-sync");
        let syncs = Arc::new(DirSyncs::new(2));
        let path = tmp.path().to_path_buf();
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let (syncs, path) = (syncs.clone(), path.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        syncs.sync(i % 2, &path).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        for dir in &syncs.dirs {
            let progress = dir.progress.lock();
            assert_eq!((progress.created, progress.durable), (400, 400));
        }
        assert!(syncs.sync(2, &path).is_err());
        let missing = tmp.path().join("missing");
        assert!(syncs.sync(0, &missing).is_err());
        // A failed sync makes nothing durable; the next caller syncs again.
        assert_eq!(syncs.dirs[0].progress.lock().durable, 400);
        syncs.sync(0, &path).unwrap();
        assert_eq!(syncs.dirs[0].progress.lock().durable, 402);
    }
}
