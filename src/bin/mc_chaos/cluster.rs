//! The processes of a chaos run on 127.0.0.1: one `mooncake_master`, the `mooncake_client`
//! owners contributing tiny segments, and the worker processes (this binary, `worker`
//! subcommand). Each can be SIGKILLed and restarted in place, or stopped and continued.
//! Every wait is bounded; every child is SIGKILLed on drop.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Polls `check` every 20 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// A sibling binary of this one (`target/<profile>/NAME`).
pub fn sibling(name: &str) -> PathBuf {
    let me = std::env::current_exe().unwrap_or_default();
    me.with_file_name(name)
}

/// One restartable child: the command that starts it and, when running, the child.
pub struct Proc {
    pub label: String,
    program: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    /// Wait for a `READY` line on stdout (mooncake_client) before counting it started.
    ready_line: bool,
    /// Wait for this address (`host:port`) to accept (mooncake_master).
    ready_addr: Option<String>,
    child: Option<Child>,
    pub stopped: bool,
}

impl Proc {
    pub fn new(
        label: &str,
        program: PathBuf,
        args: Vec<String>,
        envs: Vec<(String, String)>,
    ) -> Proc {
        Proc {
            label: label.into(),
            program,
            args,
            envs,
            ready_line: false,
            ready_addr: None,
            child: None,
            stopped: false,
        }
    }

    pub fn ready_on_line(mut self) -> Proc {
        self.ready_line = true;
        self
    }

    pub fn ready_on_port(self, port: u16) -> Proc {
        self.ready_on_addr(&format!("127.0.0.1:{port}"))
    }

    pub fn ready_on_addr(mut self, addr: &str) -> Proc {
        self.ready_addr = Some(addr.to_string());
        self
    }

    /// Replaces the arguments used by the next start (a worker's next incarnation).
    pub fn set_args(&mut self, args: Vec<String>) {
        self.args = args;
    }

    /// Starts the process and waits (20 s at most) until it is ready.
    pub fn start(&mut self) -> Result<(), String> {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(if self.ready_line {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: spawn {}: {e}", self.label, self.program.display()))?;
        if self.ready_line {
            let stdout = child.stdout.take().ok_or("no stdout")?;
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stdout);
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let _ = tx.send(line);
                // Keep draining so the child never blocks on a full pipe.
                let mut rest = String::new();
                while matches!(reader.read_line(&mut rest), Ok(1..)) {
                    rest.clear();
                }
            });
            let line = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
            if !line.starts_with("READY") {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{}: not ready (first line {line:?})", self.label));
            }
        }
        if let Some(addr) = &self.ready_addr {
            let up = wait_until(Duration::from_secs(20), || {
                matches!(child.try_wait(), Ok(Some(_))) || TcpStream::connect(addr).is_ok()
            });
            if !up || !matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{}: not listening on {addr}", self.label));
            }
        }
        self.child = Some(child);
        self.stopped = false;
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.stopped = false;
    }

    fn signal(&self, signal: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    /// SIGSTOP, returning once every thread is stopped (5 s at most).
    pub fn stop(&mut self) {
        self.signal(libc::SIGSTOP);
        self.stopped = true;
        if let Some(pid) = self.pid() {
            wait_until(Duration::from_secs(5), || all_threads_stopped(pid));
        }
    }

    /// SIGCONT.
    pub fn cont(&mut self) {
        self.signal(libc::SIGCONT);
        self.stopped = false;
    }

    /// Waits up to `limit` for the process to exit by itself; whether it did.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let Some(child) = self.child.as_mut() else {
            return true;
        };
        wait_until(limit, || !matches!(child.try_wait(), Ok(None)))
    }

    /// Open descriptors and resident bytes, from /proc.
    pub fn usage(&self) -> Option<(usize, u64)> {
        let pid = self.pid()?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let rss_kb = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())?;
        Some((fds, rss_kb * 1024))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.stopped {
            self.cont();
        }
        self.kill();
    }
}

fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| {
                let (_, rest) = stat.rsplit_once(')')?;
                rest.split_whitespace().next().map(|state| state == "T")
            })
            .unwrap_or(false)
    })
}

/// GETs `path` from 127.0.0.1:`port` (5 s timeouts); the body, if the status is 200.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(5)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// The value of the first un-labelled-or-labelled sample of `name` in a Prometheus text.
pub fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            return None;
        }
        rest.rsplit(' ')
            .next()?
            .trim()
            .parse::<f64>()
            .ok()
            .map(|v| v as u64)
    })
}
