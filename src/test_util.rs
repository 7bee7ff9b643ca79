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
