//! `mooncake_http_metadata_server`: Mooncake's HTTP metadata service on its own (what
//! upstream's `python -m mooncake.http_metadata_server` runs, and what `mooncake_master
//! --enable_http_metadata_server` serves next to the master). Prints `READY <host>:<port>` on
//! stdout once listening; serves until SIGINT/SIGTERM. The store lives in this process: a
//! restart starts empty, and clients publish their segments again as they re-register.

use super::glog::GlogFlags;
use super::Program;
use clap::Parser;
use std::io::Write;

#[derive(Parser, Debug)]
#[command(
    name = "mooncake_http_metadata_server",
    version,
    about = "Mooncake HTTP metadata server (mooncake-rs)"
)]
pub(super) struct Flags {
    #[command(flatten)]
    glog: GlogFlags,
    /// Address to listen on (upstream's default: every interface).
    #[arg(long = "host", default_value = "0.0.0.0")]
    host: String,
    /// Port to listen on (0 picks one; the `READY` line names it).
    #[arg(long = "port", default_value_t = 8080)]
    port: u16,
    /// The cluster key file (mooncake-rs flag; README, "Cluster key"): writes and descriptor
    /// reads need the key's handshake. Empty: `MC_CLUSTER_KEY_FILE`, else no key.
    #[arg(long = "cluster_key_file", default_value = "")]
    cluster_key_file: String,
    /// Certificate (PEM) to serve TLS with (mooncake-rs flag); needs `--tls_key_file`.
    #[arg(long = "tls_cert_file", default_value = "")]
    tls_cert_file: String,
    /// The private key (PEM) of `--tls_cert_file`.
    #[arg(long = "tls_key_file", default_value = "")]
    tls_key_file: String,
}

impl Program for Flags {
    const NAME: &'static str = "mooncake_http_metadata_server";

    fn glog(&self) -> &GlogFlags {
        &self.glog
    }

    fn run(self) -> Result<(), String> {
        super::use_cluster_key(&self.cluster_key_file)?;
        let tls = super::server_tls(&self.tls_cert_file, &self.tls_key_file)?;
        let server = super::serve_metadata(&self.host, self.port, tls)?;
        let port = server.local_addr().port();
        tracing::info!(host = %self.host, port, "HTTP metadata server started");
        let mut out = std::io::stdout();
        let _ = writeln!(out, "READY {}:{port}", self.host);
        let _ = out.flush();
        crate::wait_for_termination();
        drop(server);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_defaults_and_flags() {
        let flags = Flags::try_parse_from(["mooncake_http_metadata_server"]).unwrap();
        assert_eq!((flags.host.as_str(), flags.port), ("0.0.0.0", 8080));
        let flags = Flags::try_parse_from(["m", "--host=127.0.0.1", "--port=0", "--minloglevel=1"])
            .unwrap();
        assert_eq!((flags.host.as_str(), flags.port), ("127.0.0.1", 0));
        assert!(Flags::try_parse_from(["m", "--port=x"]).is_err());
    }
}
