//! `--auth`: what the cluster key costs. Two pools side by side, one with a key and one
//! without: each a `mooncake_master` and a `mooncake_client` peer owning a 256 MB segment
//! (`MC_SAME_HOST=0`: reads go through the peer's TCP data port, as from another host), and a
//! measuring process per pool (this binary as `--auth-leg`: one key per process), asked in
//! interleaved rounds of the same length for
//! - the p50 latency of a 4 KiB get (one thread),
//! - the throughput of 4 MiB gets (one thread),
//! - the cost of a new master connection: connect, handshake (with the key) and one call,
//!   mean over the round.
//!
//! Pooled connections amortise the handshake, so the gets are expected to cost the same; the
//! connection line shows what a handshake adds.
//!
//! A third pool runs the master with TLS as well (a CA and a certificate for 127.0.0.1 made
//! with the `openssl` command; without it those lines are skipped, with a note): its 4 KiB
//! get (whose master call is encrypted; the data port stays authenticated-only) and its new
//! master connection (TCP, TLS and key handshakes, one call) against the open pool's.

use crate::children::{client_process, free_port, master_process, Process};
use crate::interleave::{judge, Judged};
use crate::journal::Scratch;
use crate::report::Report;
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::master::{MasterApi, RemoteMaster, RpcMasterClient};
use mooncake_rs::rpc::Timeouts;
use mooncake_rs::types::ReplicateConfig;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const SMALL: usize = 4096;
const LARGE: usize = 4 << 20;

/// One pool: its measuring process, peer and master (killed on drop, in that order, so no
/// client outlives its master).
struct Pool {
    leg: Leg,
    _peer: Process,
    _master: Process,
}

/// A measuring process: answers one number per command line.
struct Leg {
    _process: Process,
    commands: ChildStdin,
    answers: BufReader<ChildStdout>,
}

impl Leg {
    fn ask(&mut self, command: &str) -> Result<f64, String> {
        writeln!(self.commands, "{command}").map_err(|e| format!("leg: {e}"))?;
        let mut line = String::new();
        self.answers
            .read_line(&mut line)
            .map_err(|e| format!("leg: {e}"))?;
        line.trim()
            .parse()
            .map_err(|_| format!("leg answered {line:?} to {command}"))
    }
}

/// The TLS files of the third pool, in the run's scratch directory.
struct TlsFiles {
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl TlsFiles {
    /// Makes a CA and a certificate it signs for 127.0.0.1 with `openssl` in `dir`.
    ///
    /// Errors: why not (no `openssl`, or a step failed), for the skip note.
    fn make(dir: &std::path::Path) -> Result<TlsFiles, String> {
        let path = |name: &str| dir.join(name).display().to_string();
        let (ca_key, ca, key, csr, cert, ext) = (
            path("ca.key"),
            path("ca.pem"),
            path("server.key"),
            path("server.csr"),
            path("server.pem"),
            path("san.ext"),
        );
        std::fs::write(&ext, "subjectAltName=IP:127.0.0.1\n").map_err(|e| format!("{ext}: {e}"))?;
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        let ca_subject = [
            "-keyout", &ca_key, "-out", &ca, "-days", "2", "-subj", "/CN=ca",
        ];
        openssl(&[&["req", "-x509"][..], &ec, &ca_subject].concat())?;
        let leaf_subject = ["-keyout", &key, "-out", &csr, "-subj", "/CN=127.0.0.1"];
        openssl(&[&["req"][..], &ec, &leaf_subject].concat())?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &ext,
        ])?;
        Ok(TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        })
    }
}

/// Runs `openssl args`. Errors: why it could not run or failed (its stderr).
fn openssl(args: &[&str]) -> Result<(), String> {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    match output.status.success() {
        true => Ok(()),
        false => Err(format!(
            "openssl {}: {}",
            args[0],
            String::from_utf8_lossy(&output.stderr)
        )),
    }
}

impl Pool {
    fn start(key: Option<&std::path::Path>, tls: Option<&TlsFiles>) -> Result<Pool, String> {
        let port = free_port()?;
        let key_flag: Vec<String> = key
            .map(|k| format!("--cluster_key_file={}", k.display()))
            .into_iter()
            .collect();
        let mut master_flags = key_flag.clone();
        let mut leg_env = vec![("MC_SAME_HOST".to_string(), "0".to_string())];
        let mut peer_flags = key_flag.clone();
        if let Some(tls) = tls {
            master_flags.push(format!("--tls_cert_file={}", tls.cert.display()));
            master_flags.push(format!("--tls_key_file={}", tls.key.display()));
            peer_flags.push(format!("--tls_ca_file={}", tls.ca.display()));
            leg_env.push(("MC_TLS_CA_FILE".into(), tls.ca.display().to_string()));
        }
        let master = master_process(port, &master_flags)?;
        let addr = format!("127.0.0.1:{port}");
        let mut peer_args = vec![
            format!("--master_server_address={addr}"),
            "--host=127.0.0.1".into(),
            "--global_segment_size=256 MB".into(),
            "--local_buffer_size=0".into(),
        ];
        peer_args.extend(peer_flags);
        let (peer, _) = client_process(&peer_args, &[("MC_SAME_HOST", "0")])?;
        let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .arg("--auth-leg")
            .arg(&addr)
            .arg(key.map(|k| k.display().to_string()).unwrap_or_default())
            .envs(leg_env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start a leg: {e}"))?;
        let commands = child.stdin.take().ok_or("no stdin")?;
        let answers = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut leg = Leg {
            _process: Process(child),
            commands,
            answers,
        };
        leg.ask("ready")?;
        Ok(Pool {
            leg,
            _peer: peer,
            _master: master,
        })
    }
}

/// Runs the `--auth` lines.
pub fn run(report: &mut Report, quick: bool) -> Result<(), String> {
    let ms = if quick { 300 } else { 1500 };
    let rounds = if quick { 3 } else { 5 };
    let scratch = Scratch::new("auth");
    let key = scratch.0.join("cluster.key");
    let hex: String = (0..32)
        .map(|_| format!("{:02x}", fastrand::u8(..)))
        .collect();
    std::fs::create_dir_all(&scratch.0)
        .and_then(|()| std::fs::write(&key, format!("{hex}\n")))
        .and_then(|()| std::fs::set_permissions(&key, PermissionsExt::from_mode(0o600)))
        .map_err(|e| format!("{}: {e}", key.display()))?;
    let mut open = Pool::start(None, None)?;
    let mut keyed = Pool::start(Some(&key), None)?;
    let lines = [
        (
            "cluster key on: 4 KiB get p50 (1 thr)",
            "us",
            "the same get, no key (1 thr)",
            "p50",
        ),
        (
            "cluster key on: 4 MiB get MB/s (1 thr)",
            "MB/s",
            "the same gets, no key (1 thr)",
            "rate",
        ),
        (
            "cluster key on: new master connection + first call, mean (1 thr)",
            "us",
            "the same, no key (1 thr)",
            "connect",
        ),
    ];
    judge_lines(report, &lines, rounds, ms, &mut open.leg, &mut keyed.leg)?;
    drop(keyed);
    let tls = match TlsFiles::make(&scratch.0) {
        Ok(files) => files,
        Err(why) => {
            println!("TLS lines SKIPPED: {why}");
            return Ok(());
        }
    };
    let mut tls_pool = Pool::start(Some(&key), Some(&tls))?;
    let lines = [
        (
            "TLS and key on: 4 KiB get p50 (1 thr)",
            "us",
            "the same get, neither (1 thr)",
            "p50",
        ),
        (
            "TLS and key on: new master connection + first call, mean (1 thr)",
            "us",
            "the same, neither (1 thr)",
            "connect",
        ),
    ];
    judge_lines(report, &lines, rounds, ms, &mut open.leg, &mut tls_pool.leg)
}

/// Judges each line (name, unit, limit name, leg command) of `measured` against `limit`, in
/// interleaved rounds of `ms` milliseconds.
fn judge_lines(
    report: &mut Report,
    lines: &[(&str, &'static str, &str, &str)],
    rounds: usize,
    ms: u64,
    limit: &mut Leg,
    measured: &mut Leg,
) -> Result<(), String> {
    for &(name, unit, limit_name, command) in lines {
        let command = format!("{command} {ms}");
        let judged = Judged {
            name,
            unit,
            limit_name,
            rounds,
        };
        judge(
            report,
            &judged,
            || limit.ask(&command),
            || measured.ask(&command),
        )?;
    }
    Ok(())
}

/// The measuring process (`mc_bench --auth-leg <master> <key file or "">`): sets up a client
/// of the master with that key, puts one 4 KiB and one 4 MiB object, then answers commands
/// on stdin with one number each: `ready`, `p50 <ms>` (µs), `rate <ms>` (MB/s), `connect
/// <ms>` (µs per new connection and first call). Returns the exit code.
pub fn serve_leg(args: &[String]) -> i32 {
    match leg(args) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("mc_bench --auth-leg: {message}");
            1
        }
    }
}

fn leg(args: &[String]) -> Result<(), String> {
    let [master, key] = args else {
        return Err("usage: mc_bench --auth-leg <master> <key file or \"\">".into());
    };
    let client = Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        local_buffer_size: 64 << 20,
        master_server_addr: master.clone(),
        cluster_key_file: key.clone(),
        ..SetupConfig::default()
    })
    .map_err(|e| format!("setup: {e}: {}", mooncake_rs::error::last_error_message()))?;
    let config = ReplicateConfig::default();
    let put = |k: &str, len: usize| client.put(k, &vec![7u8; len], &config);
    put("small", SMALL)
        .and_then(|()| put("large", LARGE))
        .map_err(|e| format!("put: {e}"))?;
    let mut buf = vec![0u8; LARGE];
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let mut words = line.split_whitespace();
        let command = words.next().unwrap_or("");
        let ms: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        let until = Instant::now() + Duration::from_millis(ms);
        let value = match command {
            "ready" => 1.0,
            "p50" => {
                let mut samples = Vec::new();
                while Instant::now() < until {
                    let started = Instant::now();
                    client
                        .get_into("small", &mut buf[..SMALL])
                        .map_err(|e| format!("get: {e}"))?;
                    samples.push(started.elapsed().as_secs_f64() * 1e6);
                }
                samples.sort_by(f64::total_cmp);
                samples.get(samples.len() / 2).copied().unwrap_or(0.0)
            }
            "rate" => {
                let (started, mut bytes) = (Instant::now(), 0usize);
                while Instant::now() < until {
                    bytes += client
                        .get_into("large", &mut buf)
                        .map_err(|e| format!("get: {e}"))? as usize;
                }
                bytes as f64 / started.elapsed().as_secs_f64() / 1e6
            }
            "connect" => {
                let (started, mut count) = (Instant::now(), 0u32);
                while Instant::now() < until || count == 0 {
                    let fresh = RpcMasterClient::with_timeouts(master, Timeouts::default())
                        .map(RemoteMaster)
                        .map_err(|e| format!("connect: {e}"))?;
                    fresh.service_ready().map_err(|e| format!("call: {e}"))?;
                    count += 1;
                }
                started.elapsed().as_secs_f64() * 1e6 / f64::from(count)
            }
            other => return Err(format!("unknown command {other:?}")),
        };
        writeln!(out, "{value}")
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())?;
    }
    client.teardown();
    Ok(())
}
