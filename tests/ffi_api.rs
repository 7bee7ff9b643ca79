//! The C API called like C would (through the extern functions), against the in-process
//! master: round trips through `mc_*` and `mooncake_store_*`, the before-setup rules, and one
//! handle shared by 8 threads.

use mooncake_rs::ffi::buffer::*;
use mooncake_rs::ffi::config::*;
use mooncake_rs::ffi::error::*;
use mooncake_rs::ffi::store::*;
use mooncake_rs::ffi::store_admin::*;
use mooncake_rs::ffi::store_c::*;
use mooncake_rs::ffi::store_get::*;
use mooncake_rs::ffi::store_put::*;
use mooncake_rs::ffi::store_session::*;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::{null, null_mut};

const MIB: u64 = 1 << 20;

/// A set-up store with an embedded master.
fn embedded(name: &str) -> *mut mc_store_t {
    let store = mc_store_new();
    let mut cfg = std::mem::MaybeUninit::<mc_setup_config_t>::uninit();
    mc_setup_config_init(cfg.as_mut_ptr());
    // SAFETY: initialised by mc_setup_config_init.
    let mut cfg = unsafe { cfg.assume_init() };
    let name = CString::new(name).unwrap();
    cfg.local_hostname = name.as_ptr();
    cfg.global_segment_size = 64 * MIB;
    cfg.master_server_addr = c"embedded".as_ptr();
    assert_eq!(mc_store_setup(store, &cfg), 0, "{}", last_error());
    store
}

fn last_error() -> String {
    let mut buf = vec![0 as c_char; 512];
    mc_last_error_message(buf.as_mut_ptr(), buf.len());
    // SAFETY: NUL-terminated by mc_last_error_message.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

#[test]
fn mc_round_trips_every_family() {
    let store = embedded("ffi-rt");
    let v = pattern(4096, 1);
    let k = c"k1";
    assert_eq!(
        mc_store_put(store, k.as_ptr(), v.as_ptr().cast(), v.len(), null()),
        0
    );
    assert_eq!(mc_store_is_exist(store, k.as_ptr()), 1);
    assert_eq!(mc_store_get_size(store, k.as_ptr()), 4096);
    let mut out = vec![0u8; 4096];
    assert_eq!(
        mc_store_get_into(store, k.as_ptr(), out.as_mut_ptr().cast(), 4096),
        4096
    );
    assert_eq!(out, v);
    // Buffer too small is -600 (Mooncake).
    assert_eq!(
        mc_store_get_into(store, k.as_ptr(), out.as_mut_ptr().cast(), 10),
        -600
    );

    // put_from / upsert_from with a config.
    let mut rc = std::mem::MaybeUninit::<mc_replicate_config_t>::uninit();
    mc_replicate_config_init(rc.as_mut_ptr());
    // SAFETY: initialised above.
    let rc = unsafe { rc.assume_init() };
    let v2 = pattern(1000, 2);
    assert_eq!(
        mc_store_put_from(store, c"k2".as_ptr(), v2.as_ptr().cast(), v2.len(), &rc),
        0
    );
    let v3 = pattern(1000, 3);
    // Put keeps the old value, upsert overwrites.
    assert_eq!(
        mc_store_put(store, c"k2".as_ptr(), v3.as_ptr().cast(), v3.len(), &rc),
        0
    );
    let mut b: *mut mc_buffer_t = null_mut();
    assert_eq!(mc_store_get_buffer(store, c"k2".as_ptr(), &mut b), 0);
    // SAFETY: the buffer is live and mc_buffer_len bytes long.
    let got =
        unsafe { std::slice::from_raw_parts(mc_buffer_ptr(b).cast::<u8>(), mc_buffer_len(b)) };
    assert_eq!(got, &v2[..]);
    mc_buffer_free(b);
    assert_eq!(
        mc_store_upsert_from(store, c"k2".as_ptr(), v3.as_ptr().cast(), v3.len(), null()),
        0
    );
    assert_eq!(
        mc_store_get_into(store, c"k2".as_ptr(), out.as_mut_ptr().cast(), 4096),
        1000
    );
    assert_eq!(&out[..1000], &v3[..]);

    // parts, copying batch, zero-copy batch, multi-buffers.
    let (a, c) = (pattern(10, 4), pattern(20, 5));
    let parts = [a.as_ptr().cast::<c_void>(), c.as_ptr().cast()];
    let sizes = [10usize, 20];
    assert_eq!(
        mc_store_put_parts(
            store,
            c"parts".as_ptr(),
            parts.as_ptr(),
            sizes.as_ptr(),
            2,
            null()
        ),
        0
    );
    assert_eq!(
        mc_store_get_into(store, c"parts".as_ptr(), out.as_mut_ptr().cast(), 4096),
        30
    );
    assert_eq!(&out[..30], &[a.clone(), c.clone()].concat()[..]);
    let keys = [c"b1".as_ptr(), c"b2".as_ptr()];
    assert_eq!(
        mc_store_put_batch(
            store,
            keys.as_ptr(),
            parts.as_ptr(),
            sizes.as_ptr(),
            2,
            null()
        ),
        0
    );
    assert_eq!(
        mc_store_upsert_batch(
            store,
            keys.as_ptr(),
            parts.as_ptr(),
            sizes.as_ptr(),
            2,
            null()
        ),
        0
    );
    let mut results = [7 as c_int; 2];
    let zkeys = [c"z1".as_ptr(), c"z2".as_ptr()];
    assert_eq!(
        mc_store_batch_put_from(
            store,
            zkeys.as_ptr(),
            parts.as_ptr(),
            sizes.as_ptr(),
            2,
            null(),
            results.as_mut_ptr()
        ),
        0
    );
    assert_eq!(results, [0, 0]);
    assert_eq!(
        mc_store_batch_upsert_from(
            store,
            zkeys.as_ptr(),
            parts.as_ptr(),
            sizes.as_ptr(),
            2,
            null(),
            results.as_mut_ptr()
        ),
        0
    );
    assert_eq!(results, [0, 0]);
    let lists = [parts.as_ptr(), parts.as_ptr()];
    let size_lists = [sizes.as_ptr(), sizes.as_ptr()];
    let counts = [2usize, 2];
    let mkeys = [c"m1".as_ptr(), c"m2".as_ptr()];
    assert_eq!(
        mc_store_batch_put_from_multi_buffers(
            store,
            mkeys.as_ptr(),
            2,
            lists.as_ptr(),
            size_lists.as_ptr(),
            counts.as_ptr(),
            null(),
            results.as_mut_ptr()
        ),
        0
    );
    assert_eq!(results, [0, 0]);
    assert_eq!(
        mc_store_batch_upsert_from_multi_buffers(
            store,
            mkeys.as_ptr(),
            2,
            lists.as_ptr(),
            size_lists.as_ptr(),
            counts.as_ptr(),
            null(),
            results.as_mut_ptr()
        ),
        0
    );

    // Batch gets.
    let (mut o1, mut o2) = (vec![0u8; 30], vec![0u8; 30]);
    let dst = [o1.as_mut_ptr().cast::<c_void>(), o2.as_mut_ptr().cast()];
    let dsizes = [30usize, 30];
    let mut got = [0i64; 2];
    assert_eq!(
        mc_store_batch_get_into(
            store,
            mkeys.as_ptr(),
            dst.as_ptr(),
            dsizes.as_ptr(),
            2,
            got.as_mut_ptr()
        ),
        0
    );
    assert_eq!(got, [30, 30]);
    assert_eq!(o1, [a.clone(), c.clone()].concat());
    let (mut h1, mut h2) = (vec![0u8; 10], vec![0u8; 20]);
    let split = [h1.as_mut_ptr().cast::<c_void>(), h2.as_mut_ptr().cast()];
    let split_lists = [split.as_ptr()];
    let split_sizes = [sizes.as_ptr()];
    let one = [2usize];
    assert_eq!(
        mc_store_batch_get_into_multi_buffers(
            store,
            mkeys.as_ptr(),
            1,
            split_lists.as_ptr(),
            split_sizes.as_ptr(),
            one.as_ptr(),
            got.as_mut_ptr()
        ),
        0
    );
    assert_eq!((got[0], &h1, &h2), (30, &a, &c));

    // Ranged gather: bytes 5..15 of m1 and 0..4 of z2 into one buffer.
    let mut gather = vec![0u8; 14];
    let bufs = [gather.as_mut_ptr().cast::<c_void>()];
    let bsizes = [14usize];
    let ranges = [
        mc_range_t {
            buffer_index: 0,
            key: c"m1".as_ptr(),
            dst_offset: 0,
            src_offset: 5,
            size: 10,
        },
        mc_range_t {
            buffer_index: 0,
            key: c"z2".as_ptr(),
            dst_offset: 10,
            src_offset: 0,
            size: 4,
        },
        mc_range_t {
            buffer_index: 3,
            key: c"z2".as_ptr(),
            dst_offset: 0,
            src_offset: 0,
            size: 4,
        },
    ];
    let mut rr = [0i64; 3];
    assert_eq!(
        mc_store_get_into_ranges(
            store,
            bufs.as_ptr(),
            bsizes.as_ptr(),
            1,
            ranges.as_ptr(),
            3,
            rr.as_mut_ptr()
        ),
        0
    );
    assert_eq!(rr, [10, 4, -600]);
    let m1 = [a.clone(), c.clone()].concat();
    assert_eq!(&gather[..10], &m1[5..15]);
    assert_eq!(&gather[10..], &c[..4]);

    // batch_get_buffer with one missing key.
    let bkeys = [c"m1".as_ptr(), c"missing".as_ptr()];
    let mut outs = [null_mut::<mc_buffer_t>(); 2];
    let mut codes = [0 as c_int; 2];
    assert_eq!(
        mc_store_batch_get_buffer(
            store,
            bkeys.as_ptr(),
            2,
            outs.as_mut_ptr(),
            codes.as_mut_ptr()
        ),
        0
    );
    assert_eq!(codes, [0, -704]);
    assert_eq!(mc_buffer_len(outs[0]), 30);
    assert!(outs[1].is_null());
    outs.iter().for_each(|&b| mc_buffer_free(b));

    // Exist / remove / regex / all, metrics.
    assert_eq!(
        mc_store_batch_is_exist(store, bkeys.as_ptr(), 2, codes.as_mut_ptr()),
        0
    );
    assert_eq!(codes, [1, 0]);
    assert_eq!(mc_store_remove(store, c"m1".as_ptr(), 1), 0);
    assert_eq!(mc_store_remove(store, c"m1".as_ptr(), 1), -704);
    assert_eq!(
        mc_store_batch_remove(store, zkeys.as_ptr(), 2, 1, codes.as_mut_ptr()),
        0
    );
    assert_eq!(codes, [0, 0]);
    assert_eq!(mc_store_remove_by_regex(store, c"^b".as_ptr(), 1), 2);
    assert_eq!(mc_store_remove_by_regex(store, c"(".as_ptr(), 1), -600);
    let mut needed = 0usize;
    assert_eq!(
        mc_store_metrics_json(store, null_mut(), 0, &mut needed),
        -600
    );
    let mut json = vec![0 as c_char; needed];
    assert_eq!(
        mc_store_metrics_json(store, json.as_mut_ptr(), needed, &mut needed),
        0
    );
    // SAFETY: NUL-terminated by the call.
    let json = unsafe { CStr::from_ptr(json.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string();
    assert!(json.contains("\"objects_written\""), "{json}");
    assert!(mc_store_remove_all(store, 1) >= 3);
    let mut host = [0 as c_char; 64];
    assert_eq!(mc_store_get_hostname(store, host.as_mut_ptr(), 64), 0);
    assert_eq!(mc_store_get_hostname(store, host.as_mut_ptr(), 3), -600);
    assert_eq!(mc_store_health_check(store), 0);
    assert_eq!(mc_store_teardown(store), 0);
    assert_eq!(mc_store_teardown(store), 0);
    assert_eq!(mc_store_health_check(store), 1);
    mc_store_free(store);
}

#[test]
fn sessions_round_trip() {
    let store = embedded("ffi-sessions");
    let keys = [c"s1".as_ptr()];
    let sizes = [8u64];
    let mut codes = [9 as c_int; 1];
    assert_eq!(
        mc_store_batch_put_session_start(
            store,
            keys.as_ptr(),
            sizes.as_ptr(),
            1,
            null(),
            codes.as_mut_ptr()
        ),
        0
    );
    assert_eq!(codes, [0]);
    let (lo, hi) = ([1u8, 2, 3, 4], [5u8, 6, 7, 8]);
    let srcs = [lo.as_ptr().cast::<c_void>(), hi.as_ptr().cast()];
    let lens = [4usize, 4];
    let offs = [0u64, 4];
    let (bl, sl, ol, cnt) = ([srcs.as_ptr()], [lens.as_ptr()], [offs.as_ptr()], [2usize]);
    let mut bytes = [0i64; 1];
    assert_eq!(
        mc_store_batch_put_from_multi_buffer_ranges(
            store,
            keys.as_ptr(),
            1,
            bl.as_ptr(),
            sl.as_ptr(),
            ol.as_ptr(),
            cnt.as_ptr(),
            bytes.as_mut_ptr()
        ),
        0
    );
    assert_eq!(bytes, [8]);
    assert_eq!(
        mc_store_batch_put_session_end(store, keys.as_ptr(), 1, codes.as_mut_ptr()),
        0
    );
    assert_eq!(codes, [0]);
    assert_eq!(
        mc_store_batch_put_session_revoke(store, keys.as_ptr(), 1, codes.as_mut_ptr()),
        0
    );
    assert_eq!(codes, [-600]);
    assert_eq!(
        mc_store_batch_get_session_start(store, keys.as_ptr(), 1, codes.as_mut_ptr()),
        0
    );
    assert_eq!(codes, [0]);
    let mut back = [0u8; 4];
    let dst = [back.as_mut_ptr().cast::<c_void>()];
    let (dl, dsl, src_off, one) = ([dst.as_ptr()], [lens.as_ptr()], [[2u64].as_ptr()], [1usize]);
    assert_eq!(
        mc_store_batch_get_into_multi_buffer_ranges(
            store,
            keys.as_ptr(),
            1,
            dl.as_ptr(),
            dsl.as_ptr(),
            src_off.as_ptr(),
            one.as_ptr(),
            bytes.as_mut_ptr()
        ),
        0
    );
    assert_eq!((bytes[0], back), (4, [3, 4, 5, 6]));
    assert_eq!(mc_store_batch_get_session_end(store, keys.as_ptr(), 1), 0);
    mc_store_free(store);
}

#[test]
fn before_setup_and_after_teardown() {
    let store = mc_store_new();
    assert_eq!(mc_store_health_check(store), 1);
    let mut out = [0u8; 4];
    assert_eq!(
        mc_store_put(store, c"k".as_ptr(), out.as_ptr().cast(), 4, null()),
        -600
    );
    assert_eq!(
        mc_store_get_into(store, c"k".as_ptr(), out.as_mut_ptr().cast(), 4),
        -600
    );
    assert_eq!(mc_store_is_exist(store, c"k".as_ptr()), -600);
    assert!(last_error().contains("not set up"), "{}", last_error());
    let keys = [c"k".as_ptr()];
    let mut codes = [0 as c_int; 1];
    assert_eq!(
        mc_store_batch_is_exist(store, keys.as_ptr(), 1, codes.as_mut_ptr()),
        -600
    );
    assert_eq!(codes, [-600]);
    assert_eq!(mc_store_remove_all(store, 0), -600);
    assert_eq!(mc_store_teardown(store), 0);
    assert_eq!(
        mc_store_init_all(store, null(), null(), 16 * MIB),
        0,
        "{}",
        last_error()
    );
    assert_eq!(mc_store_init_all(store, null(), null(), 16 * MIB), -600);
    assert_eq!(mc_store_health_check(store), 0);
    assert_eq!(mc_store_teardown(store), 0);
    assert_eq!(
        mc_store_put(store, c"k".as_ptr(), out.as_ptr().cast(), 4, null()),
        -600
    );
    assert_eq!(mc_store_health_check(store), 1);
    mc_store_free(store);
}

#[test]
fn mooncake_store_api_round_trip_embedded() {
    let store = mooncake_store_create();
    assert!(!store.is_null());
    assert_eq!(mooncake_store_health_check(store), 1);
    let mut host = [0 as c_char; 32];
    // Before setup the hostname is "" (Mooncake returns the empty local_hostname).
    assert_eq!(mooncake_store_get_hostname(store, host.as_mut_ptr(), 32), 0);
    assert_eq!(
        mooncake_store_setup(
            store,
            c"compat".as_ptr(),
            null(),
            32 * MIB,
            16 * MIB,
            null(),
            null(),
            c"embedded".as_ptr()
        ),
        0,
        "{}",
        last_error()
    );
    let v = pattern(100, 9);
    let cfg = mooncake_replicate_config_t {
        replica_num: 1,
        with_soft_pin: 0,
        with_hard_pin: 0,
        preferred_segments: null_mut(),
        preferred_segments_count: 0,
    };
    assert_eq!(
        mooncake_store_put(store, c"c1".as_ptr(), v.as_ptr().cast(), 100, &cfg),
        0
    );
    assert_eq!(
        mooncake_store_put_from(
            store,
            c"c2".as_ptr(),
            v.as_ptr().cast_mut().cast(),
            100,
            null()
        ),
        0
    );
    assert_eq!(mooncake_store_is_exist(store, c"c1".as_ptr()), 1);
    assert_eq!(mooncake_store_get_size(store, c"c2".as_ptr()), 100);
    assert_eq!(mooncake_store_get_size(store, c"nope".as_ptr()), -704);
    let mut out = vec![0u8; 100];
    assert_eq!(
        mooncake_store_get_into(store, c"c1".as_ptr(), out.as_mut_ptr().cast(), 100),
        100
    );
    assert_eq!(out, v);
    let mut keys = [c"c3".as_ptr(), c"c4".as_ptr()];
    let mut bufs = [
        v.as_ptr().cast_mut().cast::<c_void>(),
        v.as_ptr().cast_mut().cast(),
    ];
    let sizes = [100usize, 50];
    let mut rc = [1 as c_int; 2];
    assert_eq!(
        mooncake_store_batch_put_from(
            store,
            keys.as_mut_ptr(),
            bufs.as_mut_ptr(),
            sizes.as_ptr(),
            2,
            null(),
            rc.as_mut_ptr()
        ),
        0
    );
    assert_eq!(rc, [0, 0]);
    let (mut o1, mut o2) = (vec![0u8; 100], vec![0u8; 100]);
    let mut dst = [o1.as_mut_ptr().cast::<c_void>(), o2.as_mut_ptr().cast()];
    let dsizes = [100usize, 100];
    let mut got = [0i64; 2];
    assert_eq!(
        mooncake_store_batch_get_into(
            store,
            keys.as_mut_ptr(),
            dst.as_mut_ptr(),
            dsizes.as_ptr(),
            2,
            got.as_mut_ptr()
        ),
        0
    );
    assert_eq!(got, [100, 50]);
    assert_eq!(&o2[..50], &v[..50]);
    assert_eq!(
        mooncake_store_batch_is_exist(store, keys.as_mut_ptr(), 2, rc.as_mut_ptr()),
        0
    );
    assert_eq!(rc, [1, 1]);
    assert_eq!(mooncake_store_get_hostname(store, host.as_mut_ptr(), 32), 0);
    // SAFETY: NUL-terminated by the call.
    assert_eq!(
        unsafe { CStr::from_ptr(host.as_ptr()) }.to_str().unwrap(),
        "compat"
    );
    assert_eq!(mooncake_store_get_hostname(store, host.as_mut_ptr(), 6), -1);
    assert_eq!(mooncake_store_remove(store, c"c1".as_ptr(), 1), 0);
    assert_eq!(
        mooncake_store_remove_by_regex(store, c"^c[34]$".as_ptr(), 1),
        2
    );
    assert_eq!(mooncake_store_remove_all(store, 1), 1);
    let mut reg = vec![0u8; 4096];
    assert_eq!(
        mooncake_store_register_buffer(store, reg.as_mut_ptr().cast(), 4096),
        0
    );
    assert_eq!(
        mooncake_store_register_buffer(store, reg.as_mut_ptr().cast(), 4096),
        -600
    );
    assert_eq!(
        mooncake_store_unregister_buffer(store, reg.as_mut_ptr().cast()),
        0
    );
    assert_eq!(mooncake_store_health_check(store), 0);
    mooncake_store_destroy(store);
    mooncake_store_destroy(null_mut());

    // init_all and the handle shared with mc_*: a mooncake handle is an mc_store_t.
    let store = mooncake_store_create();
    assert_eq!(
        mooncake_store_init_all(store, c"tcp".as_ptr(), c"".as_ptr(), 16 * MIB),
        0
    );
    assert_eq!(mc_store_health_check(store.cast()), 0);
    mooncake_store_destroy(store);
}

#[test]
fn eight_threads_share_one_handle() {
    let store = embedded("ffi-threads");
    let addr = store as usize;
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            std::thread::spawn(move || {
                let store = addr as *mut mc_store_t;
                for i in 0..50 {
                    let key = CString::new(format!("t{t}-{i}")).unwrap();
                    let v = pattern(512 + i, t);
                    assert_eq!(
                        mc_store_put_from(store, key.as_ptr(), v.as_ptr().cast(), v.len(), null()),
                        0
                    );
                    let mut out = vec![0u8; v.len()];
                    assert_eq!(
                        mc_store_get_into(store, key.as_ptr(), out.as_mut_ptr().cast(), out.len()),
                        v.len() as i64
                    );
                    assert_eq!(out, v);
                    assert_eq!(mc_store_is_exist(store, key.as_ptr()), 1);
                    assert_eq!(mc_store_remove(store, key.as_ptr(), 1), 0);
                    assert_eq!(mc_store_health_check(store), 0);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    mc_store_free(store);
}

#[test]
fn strerror_and_version() {
    // SAFETY: static NUL-terminated strings.
    let name = |c: i64| {
        unsafe { CStr::from_ptr(mc_strerror(c)) }
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(name(MC_ERR_OBJECT_NOT_FOUND.into()), "OBJECT_NOT_FOUND");
    assert_eq!(name(12345), "UNKNOWN_ERROR");
    // SAFETY: static NUL-terminated string.
    assert_eq!(
        unsafe { CStr::from_ptr(mc_version()) }.to_str().unwrap(),
        env!("CARGO_PKG_VERSION")
    );
}
