//! Helpers for on-stream tests: a blocker that holds a host stream, buffers as address
//! ranges, an embedded client, a replicate config naming one segment.

use super::wait_until;
use mooncake_rs::client::{Buf, Client, SetupConfig};
use mooncake_rs::stream::HostStream;
use mooncake_rs::types::ReplicateConfig;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A host-stream item that blocks the stream until [`Blocker::release`] (or 30 s).
pub struct Blocker(Arc<AtomicBool>);

impl Blocker {
    pub fn block(stream: &HostStream) -> Blocker {
        let open = Arc::new(AtomicBool::new(false));
        let flag = open.clone();
        stream.launch(move || {
            let _ = wait_until(Duration::from_secs(30), || flag.load(Ordering::Acquire));
        });
        Blocker(open)
    }

    pub fn release(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// One address range over `v`.
pub fn buf(v: &mut [u8]) -> Vec<Buf> {
    vec![Buf::new(v.as_mut_ptr() as usize, v.len() as u64)]
}

/// An embedded client (in-process master, no sockets) with a `segment`-byte segment.
pub fn embedded(segment: u64) -> Client {
    Client::setup(SetupConfig {
        local_hostname: "stream-test".into(),
        global_segment_size: segment,
        local_buffer_size: 0,
        master_server_addr: "embedded".into(),
        ..SetupConfig::default()
    })
    .expect("embedded setup")
}

/// Replicas placed on `segment` first.
pub fn on(segment: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![segment.to_string()],
        ..ReplicateConfig::default()
    }
}
