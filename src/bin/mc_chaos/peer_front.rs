//! The fault proxy in front of a peer's data port, without library changes: owners bind and
//! advertise `127.0.0.1:<port>` (src/client/core.rs `bind_endpoint`), so under P2PHANDSHAKE a
//! reader dials exactly that. With the master's HTTP metadata service instead, a reader
//! resolves a segment through its `ram` entry's `tcp_data_port`
//! (src/metadata/client.rs); this directory rewrites owner-0's entry to point at the
//! suite's proxy, which forwards to the owner's real port, and publishes every owner's
//! entries again after a master restart (the service keeps them in memory only; owners
//! publish once, at setup).
//!
//! Single-threaded: owned by the fault driver.

use crate::cluster::wait_until;
use mooncake_rs::rpc::http::percent_encode;
use std::time::Duration;

/// The proxied owner's index.
pub const PROXIED_OWNER: usize = 0;

/// Per owner, the two metadata entries the driver publishes.
#[derive(Clone, Default)]
struct Entries {
    ram: String,
    rpc_meta: String,
}

/// The metadata entries of every owner, as the driver wants readers to see them.
pub struct Directory {
    /// The master's HTTP metadata port.
    port: u16,
    /// Per owner: its segment name (`127.0.0.1:<data port>`).
    names: Vec<String>,
    entries: Vec<Option<Entries>>,
    /// The data proxy's port, in front of [`PROXIED_OWNER`].
    proxy_port: u16,
}

fn path(kind: &str, name: &str) -> String {
    format!(
        "/metadata?key={}",
        percent_encode(&format!("mooncake/{kind}/{name}"))
    )
}

/// `ram` with `tcp_data_port` set to `port`.
fn redirect(ram: &str, port: u16) -> Result<String, String> {
    let mut value: serde_json::Value =
        serde_json::from_str(ram).map_err(|e| format!("ram entry {ram:?}: {e}"))?;
    let field = value
        .get_mut("tcp_data_port")
        .ok_or_else(|| format!("ram entry without tcp_data_port: {ram}"))?;
    *field = port.into();
    Ok(value.to_string())
}

impl Directory {
    /// A directory for owners named `names`, served by the metadata service on `port`.
    pub fn new(port: u16, names: Vec<String>, proxy_port: u16) -> Directory {
        let entries = vec![None; names.len()];
        Directory {
            port,
            names,
            entries,
            proxy_port,
        }
    }

    /// The metadata base URL for clients.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/metadata", self.port)
    }

    /// After owner `index` (re)started and published itself: reads its entries (5 s at
    /// most), points the proxied owner's at the proxy, publishes and remembers them.
    pub fn refresh(&mut self, index: usize) -> Result<(), String> {
        let name = &self.names[index];
        let (ram_path, meta_path) = (path("ram", name), path("rpc_meta", name));
        let mut found = None;
        wait_until(Duration::from_secs(5), || {
            let get = |path: &str| metadata_request(self.port, "GET", path, "");
            found = get(&ram_path).zip(get(&meta_path));
            found.is_some()
        });
        let (ram, rpc_meta) = found.ok_or_else(|| format!("{name}: no metadata entries"))?;
        let ram = if index == PROXIED_OWNER {
            redirect(&ram, self.proxy_port)?
        } else {
            ram
        };
        let entries = Entries { ram, rpc_meta };
        self.publish(index, &entries)?;
        self.entries[index] = Some(entries);
        Ok(())
    }

    /// After a master restart: publishes every remembered entry again (10 s at most for the
    /// service to come up).
    pub fn republish(&self) -> Result<(), String> {
        for (index, entries) in self.entries.iter().enumerate() {
            if let Some(entries) = entries {
                let mut result = Err(String::new());
                wait_until(Duration::from_secs(10), || {
                    result = self.publish(index, entries);
                    result.is_ok()
                });
                result?;
            }
        }
        Ok(())
    }

    fn publish(&self, index: usize, entries: &Entries) -> Result<(), String> {
        let name = &self.names[index];
        for (kind, body) in [("ram", &entries.ram), ("rpc_meta", &entries.rpc_meta)] {
            if metadata_request(self.port, "PUT", &path(kind, name), body).is_none() {
                return Err(format!("{name}: PUT {kind} failed"));
            }
        }
        Ok(())
    }
}

/// Sends one request to the metadata service on 127.0.0.1:`port` (5 s timeouts), proving the
/// process's cluster key when the run has one; the body, if the status was 200.
fn metadata_request(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    use mooncake_rs::rpc::http::http_request_with;
    let key = mooncake_rs::auth::process_key().ok()?;
    let door = key
        .as_deref()
        .map(|k| (k, mooncake_rs::auth::ROLE_METADATA));
    let timeouts = mooncake_rs::rpc::net::Timeouts {
        connect: Duration::from_secs(5),
        request: Duration::from_secs(5),
    };
    let url = format!("http://127.0.0.1:{port}{path}");
    let reply = http_request_with(method, &url, body.as_bytes(), timeouts, door).ok()?;
    (reply.status == 200).then(|| String::from_utf8_lossy(&reply.body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::redirect;

    #[test]
    fn redirect_rewrites_only_the_port() {
        let ram = r#"{"name":"127.0.0.1:5","protocol":"tcp","tcp_data_port":5,"buffers":[]}"#;
        let out: serde_json::Value = serde_json::from_str(&redirect(ram, 7).unwrap()).unwrap();
        assert_eq!(out["tcp_data_port"], 7);
        assert_eq!(out["name"], "127.0.0.1:5");
        assert!(redirect("{}", 7).is_err());
    }
}
