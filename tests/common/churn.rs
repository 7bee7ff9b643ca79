//! Concurrent churn on a few keys: threads put, get and remove at random, and every get that
//! succeeds must return one whole committed value (never a mix of two, never stale bytes
//! over fresh ones). Shared by the TCP (`multi_process.rs`) and RDMA (`rdma.rs`) scenarios.

use super::pattern;
use mooncake_rs::client::Client;
use mooncake_rs::types::ReplicateConfig;
use std::time::Instant;

/// Runs 4 threads of at most 400 random operations each, until `deadline`, on 16 keys:
/// puts of 4–60 KiB (a value whose first byte names its seed) on one of `segments`, gets
/// into a 64 KiB buffer (each checked byte for byte against its seed), forced removes.
/// Returns the number of gets verified; panics on a torn read.
pub fn churn(client: &Client, segments: &[String], deadline: Instant) -> u64 {
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let client = client.clone();
            let segments = segments.to_vec();
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t);
                let mut verified = 0u64;
                for _ in 0..400 {
                    if Instant::now() > deadline {
                        break;
                    }
                    let key = format!("churn-{}", rng.u8(..16));
                    match rng.u8(..3) {
                        0 => {
                            let seed = rng.u8(..);
                            let len = 4096 * rng.usize(1..16);
                            let mut value = pattern(len, seed);
                            value[0] = seed;
                            let on = ReplicateConfig {
                                preferred_segments: vec![
                                    segments[rng.usize(..segments.len())].clone()
                                ],
                                ..ReplicateConfig::default()
                            };
                            let _ = client.put_from(&key, &value, &on);
                        }
                        1 => {
                            let mut out = vec![0u8; 64 * 1024];
                            if let Ok(n) = client.get_into(&key, &mut out) {
                                let n = n as usize;
                                let mut expect = pattern(n, out[0]);
                                expect[0] = out[0];
                                assert_eq!(&out[..n], &expect[..], "torn read of {key}");
                                verified += 1;
                            }
                        }
                        _ => {
                            let _ = client.remove(&key, true);
                        }
                    }
                }
                verified
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}
