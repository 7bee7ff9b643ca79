//! The HA cell of a chaos run: a real etcd, two `mooncake_master`s elected on it (journals,
//! a 2 s lease; each reaches etcd through its own [`Proxy`], so one can be cut off alone), an
//! owner and workers following the leader through `etcd://`. The workers use the key space
//! `ha/N`, so the checker judges their histories apart from the main cluster's. Faults:
//! `kill_leader`, `stop_leader` (a deposed leader waking up must not grant), `kill_etcd`
//! (restarted on its data) and `partition_leader` (its etcd proxy resets every connection).

use crate::cluster::{free_port, http_get, metric, sibling, Proc};
use crate::proxy::{Mode, Proxy};
use std::path::Path;
use std::time::Duration;

/// The leader's lease in the cell (short: many failovers per run).
const LEASE_MS: u64 = 2000;

/// See the module documentation.
pub struct HaCell {
    pub etcd: Proc,
    etcd_port: u16,
    pub masters: Vec<Proc>,
    metrics_ports: Vec<u16>,
    /// `etcd_proxies[i]`: master `i`'s way to etcd.
    etcd_proxies: Vec<Proxy>,
    pub owner: Proc,
    pub workers: Vec<Proc>,
    pub incarnations: Vec<u64>,
}

impl HaCell {
    /// Starts etcd, the masters and the owner in `dir` (workers: [`HaCell::start_workers`]).
    pub fn start(dir: &Path, segment: &str, env: &[(String, String)]) -> Result<HaCell, String> {
        // Distinct ports: two calls of `free_port` may return the same one.
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < 6 {
            let port = free_port();
            if port != 0 && !ports.contains(&port) {
                ports.push(port);
            }
        }
        let (etcd_port, peer_port) = (ports[0], ports[1]);
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let etcd_args = vec![
            format!("--data-dir={}", dir.join("ha-etcd").display()),
            format!("--listen-client-urls={}", url(etcd_port)),
            format!("--advertise-client-urls={}", url(etcd_port)),
            format!("--listen-peer-urls={}", url(peer_port)),
            format!("--initial-advertise-peer-urls={}", url(peer_port)),
            format!("--initial-cluster=default={}", url(peer_port)),
        ];
        let mut etcd =
            Proc::new("etcd", "etcd".into(), etcd_args, Vec::new()).ready_on_port(etcd_port);
        etcd.start()?;
        let mut cell = HaCell {
            etcd,
            etcd_port,
            masters: Vec::new(),
            metrics_ports: Vec::new(),
            etcd_proxies: Vec::new(),
            owner: Proc::new(
                "ha-owner",
                sibling("mooncake_client"),
                Vec::new(),
                Vec::new(),
            ),
            workers: Vec::new(),
            incarnations: Vec::new(),
        };
        for index in 0..2 {
            let proxy = Proxy::start(etcd_port, crate::faults::DELAY)
                .map_err(|e| format!("etcd proxy: {e}"))?;
            let (port, metrics) = (ports[2 + 2 * index], ports[3 + 2 * index]);
            let args = vec![
                format!("--rpc_port={port}"),
                "--rpc_address=127.0.0.1".into(),
                format!("--metrics_port={metrics}"),
                "--metrics_host=127.0.0.1".into(),
                "--enable_ha".into(),
                format!("--etcd_endpoints=127.0.0.1:{}", proxy.port),
                format!(
                    "--journal_dir={}",
                    dir.join(format!("ha-journal-{index}")).display()
                ),
                format!("--ha_lease_ttl_ms={LEASE_MS}"),
                "--client_ttl=4".into(),
                "--default_kv_lease_ttl=500".into(),
                "--put_start_discard_timeout_sec=3".into(),
                "--put_start_release_timeout_sec=10".into(),
                "--write_quarantine_ms=10000".into(),
                "--reattach_grace_ms=10000".into(),
            ];
            let label = format!("ha-master-{index}");
            let mut master = Proc::new(&label, sibling("mooncake_master"), args, env.to_vec())
                .ready_on_port(port);
            master.start()?;
            cell.masters.push(master);
            cell.metrics_ports.push(metrics);
            cell.etcd_proxies.push(proxy);
        }
        if !crate::cluster::wait_until(Duration::from_secs(20), || cell.leader().is_some()) {
            return Err("no HA master was elected".into());
        }
        let owner_args = vec![
            format!("--master_server_address={}", cell.master_addr()),
            "--host=127.0.0.1".into(),
            format!("--global_segment_size={segment}"),
            "--local_buffer_size=0".into(),
            // Dummies attach by segment name; no service port (it would clash across owners).
            "--port=0".into(),
            "--metadata_server=P2PHANDSHAKE".into(),
        ];
        cell.owner = Proc::new(
            "ha-owner",
            sibling("mooncake_client"),
            owner_args,
            env.to_vec(),
        )
        .ready_on_line();
        cell.owner.start()?;
        Ok(cell)
    }

    /// The cell's `etcd://` master address.
    pub fn master_addr(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.etcd_port)
    }

    /// The index of the master that serves now, if one does.
    pub fn leader(&self) -> Option<usize> {
        self.metrics_ports.iter().position(|port| {
            let text = http_get(*port, "/metrics").unwrap_or_default();
            metric(&text, "mooncake_master_ha_leader") == Some(1)
        })
    }

    /// Injects `kind` for about `pause`; returns the target's label.
    pub fn inject(
        &mut self,
        kind: &str,
        pause: Duration,
        rng: &mut fastrand::Rng,
    ) -> Result<String, String> {
        let leader = self.leader().unwrap_or(0);
        match kind {
            "kill_leader" => {
                self.masters[leader].kill();
                std::thread::sleep(Duration::from_millis(rng.u64(50..1500)));
                self.masters[leader].start()?;
            }
            "stop_leader" => {
                self.masters[leader].stop();
                std::thread::sleep(pause);
                self.masters[leader].cont();
            }
            "kill_etcd" => {
                self.etcd.kill();
                std::thread::sleep(Duration::from_millis(rng.u64(200..2000)));
                self.etcd.start()?;
                return Ok("etcd".into());
            }
            "partition_leader" => {
                self.etcd_proxies[leader].set_mode(Mode::Reset);
                std::thread::sleep(pause);
                self.etcd_proxies[leader].set_mode(Mode::Pass);
            }
            other => return Err(format!("not an HA fault: {other}")),
        }
        Ok(self.masters[leader].label.clone())
    }
}
