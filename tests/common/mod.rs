//! Test harness for multi-process scenarios on 127.0.0.1: the real `mooncake_master` and
//! `mooncake_client` binaries, started on free ports and killed on drop. Every wait is bounded.

#![allow(dead_code)]

pub mod churn;
pub mod net_fuzz;
pub mod standin;
pub mod streams;

use mooncake_rs::client::{Client, SetupConfig};
use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A port nobody listens on right now, in 20000..32000: below the kernel's ephemeral range
/// (32768 and up here), so no outgoing connection can take it before the test's server binds it
/// and a client polling it before that server listens cannot connect to itself; above the
/// clients' own data ports (from 12300).
pub fn free_port() -> u16 {
    for _ in 0..1_000 {
        let port = fastrand::u16(20_000..32_000);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000..32000 after 1000 tries")
}

/// `count` distinct ports nobody listens on right now (each listener is closed at once, so two
/// plain free_port() calls can return the same port).
pub fn free_ports(count: usize) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::with_capacity(count);
    for _ in 0..count * 100 {
        if ports.len() == count {
            break;
        }
        let port = free_port();
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), count, "not enough distinct free ports");
    ports
}

/// Polls `check` every 20 ms until it is true or `limit` passes; returns whether it became true.
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

/// A running `mooncake_master`.
pub struct Master {
    child: Child,
    pub port: u16,
    pub metrics_port: u16,
    pub extra: Vec<String>,
}

impl Master {
    /// Starts a master with test-friendly timing (client_ttl 2 s unless `extra` sets it) plus
    /// `extra` flags. A port
    /// taken between `free_port()` and the master's bind (another test's process) makes the
    /// master exit: then it is started again on another port, up to 5 times.
    pub fn start(extra: &[&str]) -> Master {
        for _ in 0..4 {
            if let Some(master) = Master::try_start_on(free_port(), extra) {
                return master;
            }
        }
        Master::start_on(free_port(), extra)
    }

    /// Starts a master on `port` (used to restart one in place).
    pub fn start_on(port: u16, extra: &[&str]) -> Master {
        let master = Master::try_start_on(port, extra);
        master.unwrap_or_else(|| panic!("master did not start listening on {port}"))
    }

    /// Starts a master on `port`; `None` when it exits (e.g. the port is taken) before it
    /// listens or within a moment after (the listener seen may be another process's).
    fn try_start_on(port: u16, extra: &[&str]) -> Option<Master> {
        // Two free_port() calls can return the same port (each listener is closed at once).
        let metrics_port = (0..100)
            .map(|_| free_port())
            .find(|&p| p != port)
            .expect("a second free port");
        let mut args = vec![
            format!("--rpc_port={port}"),
            "--rpc_address=127.0.0.1".into(),
            format!("--metrics_port={metrics_port}"),
            "--metrics_host=127.0.0.1".into(),
        ];
        if !extra.iter().any(|flag| flag.starts_with("--client_ttl")) {
            args.push("--client_ttl=2".into());
        }
        // No restart grace unless a test asks for one (it restarts a P2P master): a fresh
        // master would otherwise hold P2P commits for its first seconds.
        if !extra
            .iter()
            .any(|flag| flag.starts_with("--p2p_route_grace_ms"))
        {
            args.push("--p2p_route_grace_ms=0".into());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_mooncake_master"))
            .args(&args)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn mooncake_master");
        let listening = wait_until(Duration::from_secs(10), || {
            matches!(child.try_wait(), Ok(Some(_)))
                || TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        std::thread::sleep(Duration::from_millis(50));
        if !listening || !matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        Some(Master {
            child,
            port,
            metrics_port,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        })
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the master.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` to the master; see [`signal_child`].
    pub fn signal(&self, signal: i32) {
        signal_child(&self.child, signal);
    }

    /// The master's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// GETs `path` from the metrics port.
    pub fn http_get(&self, path: &str) -> String {
        http_get(self.metrics_port, path)
    }

    /// The value of the master's Prometheus series `mooncake_master_<name>`.
    pub fn gauge(&self, name: &str) -> u64 {
        let text = self.http_get("/metrics");
        let prefix = format!("mooncake_master_{name}{{");
        text.lines()
            .find(|line| line.starts_with(&prefix))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.trim().parse::<f64>().ok())
            .map(|value| value as u64)
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        self.kill();
    }
}

/// GETs `path` from 127.0.0.1:`port` and returns the whole response (status line included);
/// panics when nothing listens there.
pub fn http_get(port: u16, path: &str) -> String {
    try_http_get(port, path).expect("connect http")
}

/// GETs `path` from 127.0.0.1:`port`: the whole response, or `None` when the connection is
/// refused (a server still starting, or one just killed).
pub fn try_http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    Some(text)
}

/// The first line `child` prints on stdout (its `READY ...` line), waiting at most 20 s.
fn first_line(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("mooncake_client did not become ready")
}

/// The flags of a `mooncake_client` peer contributing a `segment` to `master`.
pub fn peer_args(master: &str, segment: &str, metadata_server: &str) -> Vec<String> {
    vec![
        format!("--master_server_address={master}"),
        "--host=127.0.0.1".into(),
        // No service port: tests run many at once (one may be added; the last one wins).
        "--port=0".into(),
        format!("--global_segment_size={segment}"),
        "--local_buffer_size=0".into(),
        format!("--metadata_server={metadata_server}"),
    ]
}

/// Sends `signal` to `child`; for `SIGSTOP`, returns only once every thread of the child is
/// stopped (bounded by 10 s). kill(2) returns as soon as the signal is queued, and the group
/// stop begins only when the one thread the kernel woke for it gets a CPU: on a loaded 2-core
/// machine the child's other threads went on serving requests for milliseconds after the
/// kill (seen as a fetch from a "stopped" peer that succeeded).
pub fn signal_child(child: &Child, signal: i32) {
    let pid = child.id();
    // SAFETY: a plain kill(2) on our own child's pid.
    unsafe { libc::kill(pid as i32, signal) };
    if signal == libc::SIGSTOP {
        let stopped = wait_until(Duration::from_secs(10), || all_threads_stopped(pid));
        assert!(
            stopped,
            "pid {pid}: not every thread stopped within 10 s of SIGSTOP"
        );
    }
}

/// Whether every thread of `pid` is in state `T` (stopped) per /proc.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| {
                // The state follows the parenthesised command name, which may hold spaces.
                let (_, rest) = stat.rsplit_once(')')?;
                rest.split_whitespace().next().map(|state| state == "T")
            })
            .unwrap_or(false)
    })
}

/// A `mooncake_master` or `mooncake_client` started with exactly the given flags (nothing
/// added), its stdout piped and its stderr collected in the background; SIGKILLed on drop.
pub struct Launched {
    child: Child,
    stderr: Arc<Mutex<String>>,
    stderr_closed: std::sync::mpsc::Receiver<()>,
}

impl Launched {
    /// Spawns `binary` (a `CARGO_BIN_EXE_*` path) with `args`.
    pub fn spawn(binary: &str, args: &[String]) -> Launched {
        let mut child = Command::new(binary)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {binary}: {e}"));
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("piped stderr");
        let sink = Arc::clone(&stderr);
        let (closed, stderr_closed) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
            let _ = closed.send(());
        });
        Launched {
            child,
            stderr,
            stderr_closed,
        }
    }

    /// Waits up to 10 s until something accepts connections on 127.0.0.1:`port`, failing the
    /// test (with the stderr so far) if the process exits first or the port stays closed.
    pub fn wait_listening(&mut self, port: u16) {
        let ready = wait_until(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
                || matches!(self.child.try_wait(), Ok(Some(_)))
        });
        let exited = self.child.try_wait().ok().flatten();
        assert!(
            ready && exited.is_none(),
            "not listening on {port} (exit {exited:?}); stderr:\n{}",
            self.stderr()
        );
    }

    /// The first line on stdout (e.g. `READY ...`), waiting at most 20 s.
    /// The process, to signal it ([`signal_child`]).
    pub fn child(&self) -> &Child {
        &self.child
    }

    pub fn first_line(&mut self) -> String {
        first_line(&mut self.child)
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Whether stderr contains `needle` within `limit`.
    pub fn stderr_shows(&self, needle: &str, limit: Duration) -> bool {
        wait_until(limit, || self.stderr().contains(needle))
    }

    /// Sends SIGTERM and returns the exit code, waiting at most 10 s for the exit and 5 s more
    /// for the rest of stderr (None: still running or killed by a signal). After an exit,
    /// [`Launched::stderr`] holds everything the process wrote.
    pub fn terminate(&mut self) -> Option<i32> {
        // SAFETY: a plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let mut status = None;
        wait_until(Duration::from_secs(10), || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        if status.is_some() {
            let _ = self.stderr_closed.recv_timeout(Duration::from_secs(5));
        }
        status.and_then(|s| s.code())
    }
}

impl Launched {
    /// SIGKILLs the process and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `mooncake_client` process contributing a segment.
pub struct PeerClient {
    child: Child,
    pub name: String,
}

impl PeerClient {
    /// Starts a peer with a `segment` of the given size (e.g. "64 MB").
    pub fn start(master: &str, segment: &str) -> PeerClient {
        PeerClient::start_with_metadata(master, segment, "P2PHANDSHAKE")
    }

    /// Starts a peer that publishes itself to `metadata_server`. Like every peer started
    /// here but [`PeerClient::start_same_host`]'s, it runs with `MC_SAME_HOST=0`: clients of
    /// the test process reach it over TCP, as a peer on another host would be reached (the
    /// tests that stop or time out peers are about that path).
    pub fn start_with_metadata(master: &str, segment: &str, metadata_server: &str) -> PeerClient {
        PeerClient::spawn(
            master,
            segment,
            metadata_server,
            &[],
            &[("MC_SAME_HOST", "0")],
        )
    }

    /// Starts a peer that offers its segment to same-host clients (`MC_SAME_HOST=1`), with
    /// the extra flags `args` (e.g. `--host=127.0.0.1:N` for a fixed data port).
    pub fn start_same_host(master: &str, segment: &str, args: &[String]) -> PeerClient {
        PeerClient::spawn(
            master,
            segment,
            "P2PHANDSHAKE",
            args,
            &[("MC_SAME_HOST", "1")],
        )
    }

    /// Starts a peer with the extra flags `args` and environment `env`.
    pub fn spawn(
        master: &str,
        segment: &str,
        metadata_server: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> PeerClient {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mooncake_client"))
            .args(peer_args(master, segment, metadata_server))
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn mooncake_client");
        let line = first_line(&mut child);
        let name = line
            .trim()
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("unexpected line {line:?}"))
            .to_string();
        PeerClient { child, name }
    }

    /// The peer's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILLs the peer.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` to the peer; see [`signal_child`].
    pub fn signal(&self, signal: i32) {
        signal_child(&self.child, signal);
    }
}

impl Drop for PeerClient {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An in-process client of `master` with its own segment and local buffer.
pub fn local_client(master: &str, segment: u64, local_buffer: u64) -> Client {
    local_client_with_metadata(master, segment, local_buffer, "P2PHANDSHAKE")
}

/// An in-process client that discovers peers through `metadata_server`.
pub fn local_client_with_metadata(
    master: &str,
    segment: u64,
    local_buffer: u64,
    metadata_server: &str,
) -> Client {
    Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata_server.into(),
        global_segment_size: segment,
        local_buffer_size: local_buffer,
        master_server_addr: master.into(),
        ..SetupConfig::default()
    })
    .expect("client setup")
}

/// An in-process client of `master` with no segment and a `local_buffer`-byte buffer, that
/// finds peers through `metadata_server` and proves the cluster key file `key` (the process's
/// key from then on).
pub fn keyed_client(
    master: &str,
    metadata_server: &str,
    key: Option<&std::path::Path>,
    local_buffer: u64,
) -> Client {
    Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        local_buffer_size: local_buffer,
        master_server_addr: master.into(),
        metadata_server: metadata_server.into(),
        cluster_key_file: key.map(|k| k.display().to_string()).unwrap_or_default(),
        ..SetupConfig::default()
    })
    .unwrap_or_else(|e| panic!("setup: {e}: {}", mooncake_rs::error::last_error_message()))
}

/// Deterministic bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The JSON of one DRAM tier of `capacity` bytes.
pub fn dram_tiers(capacity: u64) -> String {
    format!(
        r#"{{"tiers":[{{"type":"DRAM","capacity":{capacity},"priority":100,"allocator_type":"OFFSET"}}]}}"#
    )
}

/// A running `mooncake_client --deployment_mode P2P` owner process.
pub struct P2pOwnerProcess {
    child: Child,
    /// Its transfer segment name.
    pub name: String,
    /// Its client RPC address.
    pub rpc_addr: String,
}

impl P2pOwnerProcess {
    /// Starts an owner with a 64 MiB DRAM tier, `extra` flags and `env` variables.
    pub fn start(master: &str, extra: &[&str], env: &[(&str, &str)]) -> P2pOwnerProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mooncake_client"));
        command
            .args([
                format!("--master_server_address={master}"),
                "--host=127.0.0.1".into(),
                "--deployment_mode=P2P".into(),
                format!("--tiered_backend_config={}", dram_tiers(64 << 20)),
                "--local_buffer_size=16 MB".into(),
            ])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped());
        let mut child = command.spawn().expect("spawn mooncake_client");
        let line = first_line(&mut child);
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("READY"), "unexpected line {line:?}");
        let name = words.next().expect("name").to_string();
        let rpc_addr = words.next().expect("rpc address").to_string();
        P2pOwnerProcess {
            child,
            name,
            rpc_addr,
        }
    }

    /// Sends `signal` to the owner (see [`signal_child`]).
    pub fn signal(&self, signal: i32) {
        signal_child(&self.child, signal);
    }

    /// SIGKILLs the owner.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for P2pOwnerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An in-process P2P accessor (no tiers) with a 64 MiB staging buffer.
pub fn p2p_accessor(
    master: &str,
    direction: mooncake_rs::p2p::TransferDirection,
) -> mooncake_rs::p2p::P2pClient {
    mooncake_rs::p2p::P2pClient::setup_p2p(mooncake_rs::p2p::P2pSetupConfig {
        tiered_backend_config_json: r#"{"tiers":[]}"#.into(),
        local_buffer_size: 64 << 20,
        master_server_addr: master.into(),
        p2p_transfer_direction_mode: direction,
        ..Default::default()
    })
    .expect("P2P accessor setup")
}

/// A running etcd member (Debian's `etcd-server`), on loopback ports, with a fresh data
/// directory; killed and its directory deleted on drop.
pub struct EtcdMember {
    child: Option<Child>,
    pub client_port: u16,
    pub peer_port: u16,
    pub name: String,
    dir: std::path::PathBuf,
    cluster: String,
}

impl EtcdMember {
    /// `count` members forming one cluster.
    pub fn cluster(count: usize) -> Vec<EtcdMember> {
        let ports = free_ports(2 * count);
        let names: Vec<String> = (0..count).map(|i| format!("m{i}")).collect();
        let cluster = names
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{name}=http://127.0.0.1:{}", ports[2 * i + 1]))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<EtcdMember> = (0..count)
            .map(|i| {
                let unique = format!("mc-etcd-{}-{:x}", std::process::id(), fastrand::u64(..));
                EtcdMember {
                    child: None,
                    client_port: ports[2 * i],
                    peer_port: ports[2 * i + 1],
                    name: names[i].clone(),
                    dir: std::env::temp_dir().join(unique),
                    cluster: cluster.clone(),
                }
            })
            .collect();
        for member in &mut members {
            member.spawn();
        }
        for member in &members {
            assert!(
                wait_until(Duration::from_secs(20), || member.healthy()),
                "etcd member {} did not become healthy",
                member.name
            );
        }
        members
    }

    fn spawn(&mut self) {
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let child = Command::new("etcd")
            .args([
                format!("--name={}", self.name),
                format!("--data-dir={}", self.dir.display()),
                format!("--listen-client-urls={}", url(self.client_port)),
                format!("--advertise-client-urls={}", url(self.client_port)),
                format!("--listen-peer-urls={}", url(self.peer_port)),
                format!("--initial-advertise-peer-urls={}", url(self.peer_port)),
                format!("--initial-cluster={}", self.cluster),
                "--initial-cluster-state=new".into(),
                "--heartbeat-interval=50".into(),
                "--election-timeout=500".into(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd (Debian package etcd-server)");
        self.child = Some(child);
    }

    /// Whether the member answers `/health` with `"health":"true"`.
    pub fn healthy(&self) -> bool {
        try_http_get(self.client_port, "/health")
            .is_some_and(|text| text.contains("\"health\":\"true\""))
    }

    /// `127.0.0.1:<client port>`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// SIGKILLs the member.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` to the member.
    pub fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            signal_child(child, signal);
        }
    }
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `etcd://` master address of `members`.
pub fn etcd_master_addr(members: &[EtcdMember]) -> String {
    let list: Vec<String> = members.iter().map(EtcdMember::endpoint).collect();
    format!("etcd://{}", list.join(";"))
}

/// A TCP proxy on a loopback port forwarding to `127.0.0.1:<target>`, that can cut every
/// connection and refuse new ones (a partition of whoever connects through it) and heal, and
/// that may hold every chunk it forwards for a fixed delay (a slow network).
pub struct TcpProxy {
    pub port: u16,
    cut: Arc<std::sync::atomic::AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl TcpProxy {
    /// Starts forwarding to `target`.
    pub fn start(target: u16) -> TcpProxy {
        TcpProxy::start_delayed(target, Duration::ZERO)
    }

    /// Starts forwarding to `target`, each chunk `delay` after it arrived (both ways).
    pub fn start_delayed(target: u16, delay: Duration) -> TcpProxy {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (flag, list) = (Arc::clone(&cut), Arc::clone(&streams));
        std::thread::spawn(move || {
            for inbound in listener.incoming().flatten() {
                if flag.load(Ordering::Acquire) {
                    continue; // dropped: the connection is refused
                }
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let pairs = [
                    (inbound.try_clone(), outbound.try_clone()),
                    (outbound.try_clone(), inbound.try_clone()),
                ];
                list.lock().unwrap().extend([inbound, outbound]);
                for pair in pairs {
                    if let (Ok(mut from), Ok(mut to)) = pair {
                        std::thread::spawn(move || {
                            let mut chunk = vec![0u8; 64 << 10];
                            while let Ok(n @ 1..) = from.read(&mut chunk) {
                                std::thread::sleep(delay);
                                if to.write_all(&chunk[..n]).is_err() {
                                    break;
                                }
                            }
                            let _ = to.shutdown(std::net::Shutdown::Both);
                        });
                    }
                }
            }
        });
        TcpProxy { port, cut, streams }
    }

    /// Cuts every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::Release);
        for stream in self.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::Release);
    }
}
