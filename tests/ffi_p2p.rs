//! The P2P C API called like C would, against a real `mooncake_master --deployment_mode P2P`
//! and a `mooncake_client` owner process: setup with every argument, per-request directions
//! on put / get / batch put / batch get, argument errors.

mod common;

use common::{dram_tiers, pattern, Master, P2pOwnerProcess};
use mooncake_rs::ffi::p2p::*;
use std::ffi::{c_char, c_void, CString};

fn accessor(master: &str, mode: &std::ffi::CStr) -> *mut mc_p2p_store_t {
    let store = mc_p2p_store_new();
    let master = CString::new(master).unwrap();
    let mut config: mc_p2p_setup_config_t = unsafe { std::mem::zeroed() };
    mc_p2p_setup_config_init(&mut config);
    config.master_server_addr = master.as_ptr();
    config.local_buffer_size = 32 << 20;
    config.p2p_transfer_direction_mode = mode.as_ptr();
    assert_eq!(mc_p2p_store_setup(store, &config), 0);
    assert_eq!(mc_p2p_store_setup(store, &config), -600, "already set up");
    store
}

#[test]
fn p2p_c_api_round_trips_in_both_directions() {
    let master = Master::start(&["--deployment_mode=P2P"]);
    let _owner = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let store = accessor(&master.addr(), c"forward");
    let directions = [
        MC_P2P_DIRECTION_DEFAULT,
        MC_P2P_DIRECTION_REVERSE,
        MC_P2P_DIRECTION_FORWARD,
    ];
    for (i, &put_dir) in directions.iter().enumerate() {
        let key = CString::new(format!("c-{i}")).unwrap();
        let value = pattern(100_000 + i, i as u8);
        let put = mc_p2p_store_put(
            store,
            key.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            put_dir,
        );
        assert_eq!(put, 0);
        for &get_dir in &directions {
            let mut out = vec![0u8; value.len()];
            let n = mc_p2p_store_get_into(
                store,
                key.as_ptr(),
                out.as_mut_ptr().cast(),
                out.len(),
                get_dir,
            );
            assert_eq!(n, value.len() as i64);
            assert_eq!(out, value);
        }
        assert_eq!(mc_p2p_store_is_exist(store, key.as_ptr()), 1);
    }
    let keys: Vec<CString> = (0..4)
        .map(|k| CString::new(format!("cb-{k}")).unwrap())
        .collect();
    let key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
    let values: Vec<Vec<u8>> = (0..4).map(|k| pattern(5000 * (k + 1), k as u8)).collect();
    let bufs: Vec<*const c_void> = values.iter().map(|v| v.as_ptr().cast()).collect();
    let sizes: Vec<usize> = values.iter().map(Vec::len).collect();
    let mut put_results = [7; 4];
    let rc = mc_p2p_store_batch_put(
        store,
        key_ptrs.as_ptr(),
        bufs.as_ptr(),
        sizes.as_ptr(),
        4,
        MC_P2P_DIRECTION_REVERSE,
        put_results.as_mut_ptr(),
    );
    assert_eq!((rc, put_results), (0, [0; 4]));
    for dir in [MC_P2P_DIRECTION_FORWARD, MC_P2P_DIRECTION_REVERSE] {
        let mut outs: Vec<Vec<u8>> = values.iter().map(|v| vec![0; v.len()]).collect();
        let out_ptrs: Vec<*mut c_void> = outs.iter_mut().map(|o| o.as_mut_ptr().cast()).collect();
        let mut results = [0i64; 4];
        let rc = mc_p2p_store_batch_get_into(
            store,
            key_ptrs.as_ptr(),
            out_ptrs.as_ptr(),
            sizes.as_ptr(),
            4,
            dir,
            results.as_mut_ptr(),
        );
        assert_eq!(rc, 0);
        assert_eq!(
            results.to_vec(),
            sizes.iter().map(|&s| s as i64).collect::<Vec<_>>()
        );
        assert_eq!(outs, values);
    }
    // Errors: unknown direction, NULL key, missing key, removal.
    let key = c"c-0";
    assert_eq!(mc_p2p_store_put(store, key.as_ptr(), bufs[0], 4, 7), -600);
    assert_eq!(
        mc_p2p_store_put(store, std::ptr::null(), bufs[0], 4, 0),
        -600
    );
    assert_eq!(mc_p2p_store_remove(store, key.as_ptr()), 0);
    assert_eq!(mc_p2p_store_is_exist(store, key.as_ptr()), 0);
    let mut out = [0u8; 8];
    assert_eq!(
        mc_p2p_store_get_into(store, key.as_ptr(), out.as_mut_ptr().cast(), 8, 0),
        -704
    );
    let mut results = [0i64; 4];
    let rc = mc_p2p_store_batch_get_into(
        store,
        key_ptrs.as_ptr(),
        std::ptr::null(),
        sizes.as_ptr(),
        4,
        0,
        results.as_mut_ptr(),
    );
    assert_eq!((rc, results), (-600, [-600; 4]));
    assert_eq!(mc_p2p_store_teardown(store), 0);
    assert_eq!(mc_p2p_store_is_exist(store, key.as_ptr()), -600);
    mc_p2p_store_free(store);
    mc_p2p_store_free(std::ptr::null_mut());
}

#[test]
fn p2p_c_setup_rejects_bad_arguments() {
    let master = Master::start(&["--deployment_mode=P2P"]);
    let addr = CString::new(master.addr()).unwrap();
    let store = mc_p2p_store_new();
    assert_eq!(mc_p2p_store_setup(store, std::ptr::null()), -600);
    let mut config: mc_p2p_setup_config_t = unsafe { std::mem::zeroed() };
    mc_p2p_setup_config_init(&mut config);
    config.master_server_addr = addr.as_ptr();
    let bad_tiers = CString::new(r#"{"tiers":[{"type":"HBM","capacity":1}]}"#).unwrap();
    config.tiered_backend_config_json = bad_tiers.as_ptr();
    assert_eq!(mc_p2p_store_setup(store, &config), -600);
    config.tiered_backend_config_json = c"{\"tiers\":[]}".as_ptr();
    config.p2p_transfer_direction_mode = c"sideways".as_ptr();
    assert_eq!(mc_p2p_store_setup(store, &config), -600);
    // An owner with every argument set.
    let tiers = CString::new(dram_tiers(8 << 20)).unwrap();
    config.p2p_transfer_direction_mode = c"reverse".as_ptr();
    config.tiered_backend_config_json = tiers.as_ptr();
    config.client_rpc_port = 0;
    config.client_rpc_thread_num = 4;
    config.p2p_key_lease_duration_ms = 2000;
    config.p2p_key_lease_scan_interval_ms = 0;
    config.rdma_devices = c"".as_ptr();
    assert_eq!(mc_p2p_store_setup(store, &config), 0);
    let value = pattern(3000, 1);
    let key = c"own";
    assert_eq!(
        mc_p2p_store_put(store, key.as_ptr(), value.as_ptr().cast(), value.len(), -1),
        0
    );
    let mut out = vec![0u8; 3000];
    assert_eq!(
        mc_p2p_store_get_into(store, key.as_ptr(), out.as_mut_ptr().cast(), 3000, 1),
        3000
    );
    assert_eq!(out, value);
    mc_p2p_store_free(store);
}
