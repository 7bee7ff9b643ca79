//! Process-level helpers shared by the binaries and the C surface: logging set-up and waiting
//! for a termination signal.

use once_cell::sync::OnceCell;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::Arc;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

static LOGGING: OnceCell<()> = OnceCell::new();

/// Installs the `tracing` subscriber once per process: log lines go to **stderr** (never
/// stdout), filtered by the `MC_LOG` environment variable (e.g. `MC_LOG=debug`,
/// `MC_LOG=mooncake_rs::transfer=trace`; default `warn`). Later calls do nothing; if the host
/// application installed its own subscriber first, that one stays.
pub fn init_logging() {
    // Without a file nothing can fail.
    let _ = init_logging_with("warn", None);
}

/// Like [`init_logging`], for the binaries: `default_directive` (an `EnvFilter` directive such
/// as `debug`; an invalid one means `warn`) applies unless `MC_LOG` is set to a valid filter,
/// and with `file` every line also goes, without colour codes, to that file (created if
/// missing, appended to otherwise; it stays open for the life of the process).
///
/// Thread-safe. Only the first successful call of this or [`init_logging`] in a process
/// installs anything; later calls return `Ok` and change nothing (they do not open `file`), and
/// a subscriber the host installed first stays. Errors: the `io::Error` of opening `file`; then
/// nothing is installed, so the caller may try again without the file.
pub fn init_logging_with(default_directive: &str, file: Option<&Path>) -> std::io::Result<()> {
    LOGGING
        .get_or_try_init(|| {
            let file = file.map(open_log_file).transpose()?;
            install(filter(default_directive), file);
            Ok(())
        })
        .map(|_| ())
}

fn filter(default_directive: &str) -> EnvFilter {
    crate::env::LOG
        .get()
        .and_then(|text| EnvFilter::try_new(text).ok())
        .or_else(|| EnvFilter::try_new(default_directive).ok())
        .unwrap_or_else(|| EnvFilter::new("warn"))
}

fn open_log_file(path: &Path) -> std::io::Result<Arc<File>> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(Arc::new)
}

fn install(filter: EnvFilter, file: Option<Arc<File>>) {
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let file = file.map(|file| {
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(file)
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(stderr)
        .with(file)
        .try_init();
}

/// SIGINT and SIGTERM, the signals that end a binary.
fn termination_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Blocks SIGINT and SIGTERM in the calling thread, and so in every thread it starts from
/// now on: they stay pending until [`wait_for_termination`] takes them, so a signal that
/// arrives while a binary is still setting up (or just after it said it is ready) is never
/// fatal and never lost. For binaries only; call it before starting any thread.
pub(crate) fn hold_termination_signals() {
    let set = termination_signals();
    // SAFETY: changes this thread's signal mask only.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Blocks the calling thread until SIGINT or SIGTERM arrives (or was already pending, see
/// [`hold_termination_signals`]). For binaries only.
pub fn wait_for_termination() {
    hold_termination_signals();
    let set = termination_signals();
    let mut signal = 0;
    // SAFETY: both signals are blocked in this thread; sigwait takes one of them.
    match unsafe { libc::sigwait(&set, &mut signal) } {
        0 => tracing::debug!(signal, "termination signal"),
        e => {
            tracing::error!(error = e, "cannot wait for signals; waiting forever");
            loop {
                std::thread::park();
            }
        }
    }
}

/// This host's name (`gethostname`), if it has a valid one.
pub(crate) fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: a writable buffer of the given length.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0)?;
    String::from_utf8(buf[..end].to_vec())
        .ok()
        .filter(|name| !name.is_empty())
}
