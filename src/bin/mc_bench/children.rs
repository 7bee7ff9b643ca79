//! Child processes the benchmarks start: the `mooncake_master` and `mooncake_client`
//! binaries built next to `mc_bench`, killed when their handle drops.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest wait for a child to listen.
const START_LIMIT: Duration = Duration::from_secs(30);

/// A port free on 127.0.0.1 now.
pub fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

/// A child process killed on drop.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `ready` every 5 ms until it holds (true) or `limit` passes (false).
pub fn wait_for(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// The binary `name` next to `mc_bench`.
pub fn sibling(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let path = exe.with_file_name(name);
    match path.exists() {
        true => Ok(path),
        false => Err(format!(
            "{} not built (cargo build --release)",
            path.display()
        )),
    }
}

/// A `mooncake_master` on 127.0.0.1:`port` with `extra` flags, once it listens.
pub fn master_process(port: u16, extra: &[String]) -> Result<Process, String> {
    let child = Command::new(sibling("mooncake_master")?)
        .arg(format!("--rpc_port={port}"))
        .arg("--rpc_address=127.0.0.1")
        .arg("--enable_metric_reporting=false")
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start mooncake_master: {e}"))?;
    let process = Process(child);
    let listening = wait_for(START_LIMIT, || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    match listening {
        true => Ok(process),
        false => Err("mooncake_master did not listen".into()),
    }
}

/// A `mooncake_client` with `args` (without a service port unless `args` names one) and
/// `env`, once it printed its `READY <name>` line; with that name.
pub fn client_process(args: &[String], env: &[(&str, &str)]) -> Result<(Process, String), String> {
    use std::io::BufRead;
    let mut child = Command::new(sibling("mooncake_client")?)
        // No service port (several run at once); `args` may name one (the last one wins).
        .arg("--port=0")
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start mooncake_client: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let process = Process(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(START_LIMIT)
        .map_err(|_| "mooncake_client did not start")?;
    match line.trim().strip_prefix("READY ") {
        Some(name) => Ok((process, name.to_string())),
        None => Err(format!("mooncake_client: {line:?}")),
    }
}
