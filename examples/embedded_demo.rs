//! The main job in one command: an embedded store (master and client in this process, no
//! sockets) doing a put, a get, a batch and a remove, with the copy counters.
//!
//! Run: `cargo run --release --example embedded_demo`

use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::types::ReplicateConfig;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    mooncake_rs::init_logging();
    let store = Client::setup(SetupConfig {
        local_hostname: "demo".into(),
        global_segment_size: 64 << 20,
        local_buffer_size: 16 << 20,
        master_server_addr: "embedded".into(),
        ..SetupConfig::default()
    })?;
    let config = ReplicateConfig::default();

    let value = b"hello, mooncake".to_vec();
    store.put_from("greeting", &value, &config)?;
    let mut out = vec![0u8; 64];
    let n = store.get_into("greeting", &mut out)? as usize;
    println!(
        "get_into(greeting) -> {} bytes: {:?}",
        n,
        String::from_utf8_lossy(&out[..n])
    );

    let layers: Vec<Vec<u8>> = (0..4).map(|i| vec![i as u8; 4096]).collect();
    let keys: Vec<String> = (0..4).map(|i| format!("layer.{i}")).collect();
    let bufs: Vec<&[u8]> = layers.iter().map(|l| &l[..]).collect();
    let put = store.batch_put_from(&keys, &bufs, &config);
    println!("batch_put_from(4 x 4 KiB) -> {put:?}");
    let mut outs: Vec<Vec<u8>> = vec![vec![0u8; 4096]; 4];
    let mut views: Vec<&mut [u8]> = outs.iter_mut().map(|o| &mut o[..]).collect();
    let got = store.batch_get_into(&keys, &mut views);
    println!("batch_get_into -> {got:?}, bytes match: {}", outs == layers);

    println!(
        "remove(greeting, force) -> {:?}",
        store.remove("greeting", true)
    );
    println!("is_exist(greeting) -> {:?}", store.is_exist("greeting"));
    let m = store.metrics();
    println!(
        "local copies: {} ({} bytes); TCP bytes: {}",
        m.transfer.local_copies,
        m.transfer.local_copy_bytes,
        m.transfer.tcp_read_bytes + m.transfer.tcp_write_bytes
    );
    store.teardown();
    Ok(())
}
