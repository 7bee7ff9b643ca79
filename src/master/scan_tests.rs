//! Removal scans past their budget (`scan_budget_ms`). A 1 M-key scan under pings, through
//! the RPC server, is `tests/master_scan.rs` (a process of its own: its load would disturb
//! the timing of the library's other tests).

use super::tests::segment;
use super::{MasterApi, MasterConfig, MasterService};
use crate::types::{ReplicateConfig, Uuid};

#[test]
fn a_scan_past_its_budget_answers_try_again_and_a_new_call_removes_the_rest() {
    let service = MasterService::new(MasterConfig {
        scan_budget_ms: 1,
        ..MasterConfig::default()
    });
    let owner = Uuid::random();
    service
        .mount_segment(owner, segment("budget-owner", 1 << 30))
        .unwrap();
    const KEYS: usize = 200_000;
    for first in (0..KEYS).step_by(1000) {
        let keys: Vec<String> = (first..first + 1000)
            .map(|i| format!("budget-{i:07}"))
            .collect();
        let grants = service
            .batch_put_start(
                owner,
                keys.clone(),
                vec![64; 1000],
                ReplicateConfig::default(),
            )
            .unwrap();
        let tokens = grants.into_iter().map(|g| g.unwrap().token).collect();
        service.batch_put_end(owner, keys, tokens).unwrap();
    }
    let mut calls = 0;
    let mut try_again = 0;
    // Each call removes at least one slice: bounded by the table's slots.
    let finished = loop {
        calls += 1;
        assert!(calls < 100_000, "no progress");
        match service.remove_all(true) {
            Ok(removed) => break removed,
            Err(code) => {
                assert_eq!(code, crate::error::ErrorCode::TryAgain);
                assert!(crate::error::last_error_message().contains("call again"));
                try_again += 1;
            }
        }
    };
    assert!(try_again > 0, "200 000 removals take more than 1 ms");
    assert_eq!(service.metrics().scan_removed, KEYS as u64, "each key once");
    assert!(finished < KEYS as u64);
    assert_eq!(service.metrics().objects, 0);
}
