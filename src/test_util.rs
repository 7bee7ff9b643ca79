//! Helpers shared by the crate's unit tests (compiled only for `cargo test`).

use std::time::{Duration, Instant};

/// Polls `condition` every millisecond for at most `limit`; whether it became true (it is
/// checked once more at the end, so a condition true at the limit counts).
pub(crate) fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    condition()
}

/// Runs a process of another user (uid and gid 65534, through `setpriv`) that connects to the
/// abstract Unix socket `name`, sends `hello` and reports what the server did: `"CLOSED"` (the
/// connection was closed with no answer), `"ANSWERED"` (bytes came back) or `"TIMEOUT"` (nothing
/// within 5 s). `None`, with a note, when this test does not run as root; as root (as CI runs)
/// a missing `setpriv` or `python3` fails the test instead of skipping it.
pub(crate) fn other_user_connects(name: &str, hello: &[u8]) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to start a process of another user");
        return None;
    }
    for tool in ["/usr/bin/setpriv", "/usr/bin/python3"] {
        assert!(
            std::path::Path::new(tool).exists(),
            "{tool} is missing: the other-user test cannot run as root"
        );
    }
    let hex: String = hello.iter().map(|b| format!("{b:02x}")).collect();
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.settimeout(5)\n\
         s.connect('\\0{name}')\n\
         try:\n    s.sendall(bytes.fromhex('{hex}'))\n    \
         d = s.recv(4096)\n    print('ANSWERED' if d else 'CLOSED')\n\
         except socket.timeout:\n    print('TIMEOUT')\n\
         except OSError:\n    print('CLOSED')\n"
    );
    let output = std::process::Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["/usr/bin/python3", "-c", &script])
        .output()
        .expect("run a process of another user");
    assert!(output.status.success(), "{output:?}");
    Some(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// Strict overcommit (`vm.overcommit_memory=2`) with a commit limit of 1 KiB, far below what is
/// committed already, until dropped: no page of shared memory that is not allocated yet can be
/// accounted, so a fault on a hole punched in a memfd raises SIGBUS. The sysctl files are opened
/// first and the old values restored on drop (also when the test fails). The window must be
/// short and allocate nothing new: every process of the machine is refused new memory in it.
///
/// Needs root on a kernel of its own — the RDMA VM (`scripts/rdma-tests.sh` runs the tests that
/// use it by name): anywhere else it panics, so such a test is `#[ignore]`d, never skipped.
pub(crate) struct StrictOvercommit {
    memory: std::fs::File,
    ratio: std::fs::File,
    old_memory: String,
    old_ratio: String,
}

impl StrictOvercommit {
    /// Switches the machine to strict overcommit at a 1 KiB commit limit.
    pub(crate) fn enter() -> StrictOvercommit {
        use std::io::Write;
        let open = |name: &str| {
            let path = format!("/proc/sys/vm/{name}");
            let old = std::fs::read_to_string(&path).unwrap().trim().to_string();
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| {
                    panic!("{path} is not writable here ({e}): this test runs in the RDMA VM")
                });
            (file, old)
        };
        let (memory, old_memory) = open("overcommit_memory");
        let (ratio, old_ratio) = open("overcommit_ratio");
        let (mut kbytes, _) = open("overcommit_kbytes");
        // kbytes and ratio exclude each other: writing one zeroes the other; drop restores
        // the ratio (and so kbytes = 0).
        kbytes.write_all(b"1").unwrap();
        let mut strict = StrictOvercommit {
            memory,
            ratio,
            old_memory,
            old_ratio,
        };
        strict.memory.write_all(b"2").unwrap();
        strict
    }
}

impl Drop for StrictOvercommit {
    fn drop(&mut self) {
        use std::io::Write;
        let _ = self.memory.write_all(self.old_memory.as_bytes());
        let _ = self.ratio.write_all(self.old_ratio.as_bytes());
    }
}

/// Punches a hole of `len` bytes at `offset` in the shared file `fd`, as a hostile holder of it
/// can (no seal but `F_SEAL_WRITE` stops it).
pub(crate) fn punch_hole(fd: std::os::fd::BorrowedFd<'_>, offset: usize, len: usize) {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on a descriptor we borrow; the result is checked.
    let rc = unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    assert_eq!(rc, 0, "punch: {}", std::io::Error::last_os_error());
}

/// A fresh directory under the system temp dir, deleted (with its contents) when dropped.
pub(crate) struct TempDir(std::path::PathBuf);

impl TempDir {
    /// Creates `<tmp>/mc-<name>-<pid>-<random>`.
    pub(crate) fn new(name: &str) -> TempDir {
        let unique = format!("mc-{name}-{}-{:x}", std::process::id(), fastrand::u64(..));
        let path = std::env::temp_dir().join(unique);
        std::fs::create_dir_all(&path).expect("a temporary directory");
        TempDir(path)
    }

    /// The directory.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
