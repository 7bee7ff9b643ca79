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
    EnvFilter::try_from_env("MC_LOG")
        .or_else(|_| EnvFilter::try_new(default_directive))
        .unwrap_or_else(|_| EnvFilter::new("warn"))
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

/// Blocks the calling thread until SIGINT or SIGTERM arrives. For binaries only.
pub fn wait_for_termination() {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "no runtime to wait for signals; waiting forever");
            loop {
                std::thread::park();
            }
        }
    };
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    });
}
