//! Process-level helpers shared by the binaries and the C surface: logging set-up and waiting
//! for a termination signal.

use once_cell::sync::OnceCell;

static LOGGING: OnceCell<()> = OnceCell::new();

/// Installs the `tracing` subscriber once per process: log lines go to **stderr** (never
/// stdout), filtered by the `MC_LOG` environment variable (e.g. `MC_LOG=debug`,
/// `MC_LOG=mooncake_rs::transfer=trace`; default `warn`). Later calls do nothing; if the host
/// application installed its own subscriber first, that one stays.
pub fn init_logging() {
    LOGGING.get_or_init(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("MC_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    });
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
