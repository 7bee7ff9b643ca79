//! `mooncake_client`: a standalone client process that contributes a segment to the pool and
//! serves it until SIGINT/SIGTERM. Prints `READY <segment name>` on stdout once mounted.

use clap::Parser;
use mooncake_rs::client::{parse_size, Client, SetupConfig};
use std::io::Write;

#[derive(Parser, Debug)]
#[command(
    name = "mooncake_client",
    version,
    about = "Mooncake Store standalone client (mooncake-rs)"
)]
struct Flags {
    /// Master address `host:port`.
    #[arg(long = "master_server_address", default_value = "127.0.0.1:50051")]
    master_server_address: String,
    /// This client's host name; the segment name is `host:port`.
    #[arg(long = "host", default_value = "127.0.0.1")]
    host: String,
    /// Data port; 0 picks one in [MC_STORE_CLIENT_MIN_PORT, MC_STORE_CLIENT_MAX_PORT].
    #[arg(long = "port", default_value_t = 0)]
    port: u16,
    /// `P2PHANDSHAKE` or `http://host:port/metadata`.
    #[arg(long = "metadata_server", default_value = "P2PHANDSHAKE")]
    metadata_server: String,
    /// Segment size contributed to the pool, e.g. `4 GB`.
    #[arg(long = "global_segment_size", default_value = "4 GB")]
    global_segment_size: String,
    /// Local buffer size.
    #[arg(long = "local_buffer_size", default_value = "16 MB")]
    local_buffer_size: String,
    /// Transport protocol.
    #[arg(long = "protocol", default_value = "tcp")]
    protocol: String,
    /// RDMA device names (unused by TCP).
    #[arg(long = "device_name", default_value = "")]
    device_name: String,
}

fn run(flags: Flags) -> Result<(), String> {
    let size = |text: &str| parse_size(text).map_err(|e| format!("bad size '{text}': {e}"));
    let local_hostname = match flags.port {
        0 => flags.host.clone(),
        port => format!("{}:{port}", flags.host),
    };
    let client = Client::setup(SetupConfig {
        local_hostname,
        metadata_server: flags.metadata_server.clone(),
        global_segment_size: size(&flags.global_segment_size)?,
        local_buffer_size: size(&flags.local_buffer_size)?,
        protocol: flags.protocol.clone(),
        device_name: flags.device_name.clone(),
        master_server_addr: flags.master_server_address.clone(),
    })
    .map_err(|e| {
        format!(
            "setup failed: {e}: {}",
            mooncake_rs::error::last_error_message()
        )
    })?;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "READY {}", client.get_hostname());
    let _ = out.flush();
    mooncake_rs::wait_for_termination();
    client.teardown();
    Ok(())
}

fn main() {
    mooncake_rs::init_logging();
    if let Err(message) = run(Flags::parse()) {
        eprintln!("mooncake_client: {message}");
        std::process::exit(1);
    }
}
