//! Every bad argument to every `mc_*` function returns an error code and leaves a message —
//! never a crash: NULL store, NULL key, NULL buffer with size > 0, NULL results, count
//! mismatch, overflowing sizes, bad enum values. Also Mooncake's `mooncake_store_*` NULL
//! rules (-1).

use mooncake_rs::ffi::buffer::*;
use mooncake_rs::ffi::config::*;
use mooncake_rs::ffi::error::*;
use mooncake_rs::ffi::store::*;
use mooncake_rs::ffi::store_admin::*;
use mooncake_rs::ffi::store_c::*;
use mooncake_rs::ffi::store_get::*;
use mooncake_rs::ffi::store_put::*;
use mooncake_rs::ffi::store_session::*;
use mooncake_rs::ffi::store_stream::*;
use mooncake_rs::ffi::stream::*;
use std::ffi::{c_char, c_int, c_void};
use std::ptr::{null, null_mut};

const BAD: i32 = MC_ERR_INVALID_PARAMS;

/// One deferred C call (so each call's message is checked right after it).
type Call<'a> = Box<dyn Fn() -> c_int + 'a>;

/// Asserts the code and that a message was recorded for it.
fn expect(rc: i64, code: i32, what: &str) {
    assert_eq!(rc, i64::from(code), "{what}");
    let len = mc_last_error_message(null_mut(), 0);
    assert!(len > 0, "{what}: no message");
    // Clear it so the next check proves its own message.
    mooncake_rs::error::set_last_error_message("");
}

fn store() -> *mut mc_store_t {
    let s = mc_store_new();
    assert_eq!(mc_store_init_all(s, null(), null(), 16 << 20), 0);
    s
}

#[test]
fn null_store_everywhere() {
    let n: *mut mc_store_t = null_mut();
    let k = c"k".as_ptr();
    let keys = [k];
    let mut r = [0 as c_int; 1];
    let mut r64 = [0i64; 1];
    let mut buf = [0u8; 8];
    let p = buf.as_mut_ptr().cast::<c_void>();
    let cfg = {
        let mut c = std::mem::MaybeUninit::uninit();
        mc_setup_config_init(c.as_mut_ptr());
        // SAFETY: initialised above.
        unsafe { c.assume_init() }
    };
    expect(mc_store_setup(n, &cfg).into(), BAD, "setup");
    expect(
        mc_store_init_all(n, null(), null(), 0).into(),
        BAD,
        "init_all",
    );
    expect(mc_store_teardown(n).into(), BAD, "teardown");
    expect(mc_store_health_check(n).into(), BAD, "health");
    expect(
        mc_store_get_hostname(n, buf.as_mut_ptr().cast(), 8).into(),
        BAD,
        "hostname",
    );
    expect(mc_store_register_buffer(n, p, 8).into(), BAD, "register");
    expect(mc_store_unregister_buffer(n, p).into(), BAD, "unregister");
    expect(mc_store_put(n, k, p, 8, null()).into(), BAD, "put");
    expect(mc_store_upsert(n, k, p, 8, null()).into(), BAD, "upsert");
    expect(
        mc_store_put_from(n, k, p, 8, null()).into(),
        BAD,
        "put_from",
    );
    expect(
        mc_store_upsert_from(n, k, p, 8, null()).into(),
        BAD,
        "upsert_from",
    );
    expect(
        mc_store_put_parts(n, k, null(), null(), 0, null()).into(),
        BAD,
        "put_parts",
    );
    expect(
        mc_store_upsert_parts(n, k, null(), null(), 0, null()).into(),
        BAD,
        "upsert_parts",
    );
    expect(
        mc_store_put_batch(n, keys.as_ptr(), null(), null(), 0, null()).into(),
        BAD,
        "put_batch",
    );
    expect(
        mc_store_upsert_batch(n, keys.as_ptr(), null(), null(), 0, null()).into(),
        BAD,
        "upsert_batch",
    );
    expect(
        mc_store_batch_put_from(n, keys.as_ptr(), null(), null(), 0, null(), r.as_mut_ptr()).into(),
        BAD,
        "bpf",
    );
    expect(
        mc_store_batch_upsert_from(n, keys.as_ptr(), null(), null(), 0, null(), r.as_mut_ptr())
            .into(),
        BAD,
        "buf",
    );
    expect(
        mc_store_batch_put_from_multi_buffers(
            n,
            null(),
            0,
            null(),
            null(),
            null(),
            null(),
            r.as_mut_ptr(),
        )
        .into(),
        BAD,
        "bpfm",
    );
    expect(
        mc_store_batch_upsert_from_multi_buffers(
            n,
            null(),
            0,
            null(),
            null(),
            null(),
            null(),
            r.as_mut_ptr(),
        )
        .into(),
        BAD,
        "bufm",
    );
    expect(mc_store_get_into(n, k, p, 8), BAD, "get_into");
    expect(
        mc_store_batch_get_into(n, null(), null(), null(), 0, r64.as_mut_ptr()).into(),
        BAD,
        "bgi",
    );
    expect(
        mc_store_batch_get_into_multi_buffers(
            n,
            null(),
            0,
            null(),
            null(),
            null(),
            r64.as_mut_ptr(),
        )
        .into(),
        BAD,
        "bgim",
    );
    expect(
        mc_store_get_into_ranges(n, null(), null(), 0, null(), 0, r64.as_mut_ptr()).into(),
        BAD,
        "ranges",
    );
    let mut b: *mut mc_buffer_t = null_mut();
    expect(mc_store_get_buffer(n, k, &mut b).into(), BAD, "get_buffer");
    expect(
        mc_store_batch_get_buffer(n, null(), 0, null_mut(), null_mut()).into(),
        BAD,
        "bgb",
    );
    expect(
        mc_store_batch_get_session_start(n, null(), 0, null_mut()).into(),
        BAD,
        "gss",
    );
    expect(
        mc_store_batch_get_into_multi_buffer_ranges(
            n,
            null(),
            0,
            null(),
            null(),
            null(),
            null(),
            null_mut(),
        )
        .into(),
        BAD,
        "gimr",
    );
    expect(
        mc_store_batch_get_session_end(n, null(), 0).into(),
        BAD,
        "gse",
    );
    expect(
        mc_store_batch_put_session_start(n, null(), null(), 0, null(), null_mut()).into(),
        BAD,
        "pss",
    );
    expect(
        mc_store_batch_put_from_multi_buffer_ranges(
            n,
            null(),
            0,
            null(),
            null(),
            null(),
            null(),
            null_mut(),
        )
        .into(),
        BAD,
        "pfmr",
    );
    expect(
        mc_store_batch_put_session_end(n, null(), 0, null_mut()).into(),
        BAD,
        "pse",
    );
    expect(
        mc_store_batch_put_session_revoke(n, null(), 0, null_mut()).into(),
        BAD,
        "psr",
    );
    expect(mc_store_is_exist(n, k).into(), BAD, "is_exist");
    expect(
        mc_store_batch_is_exist(n, null(), 0, null_mut()).into(),
        BAD,
        "bie",
    );
    expect(mc_store_get_size(n, k), BAD, "get_size");
    expect(mc_store_remove(n, k, 0).into(), BAD, "remove");
    expect(
        mc_store_batch_remove(n, null(), 0, 0, null_mut()).into(),
        BAD,
        "bremove",
    );
    expect(mc_store_remove_by_regex(n, k, 0), BAD, "regex");
    expect(mc_store_remove_all(n, 0), BAD, "all");
    expect(
        mc_store_metrics_json(n, null_mut(), 0, null_mut()).into(),
        BAD,
        "metrics",
    );
    let mut t: *mut mc_ticket_t = null_mut();
    expect(
        mc_store_batch_get_into_on_stream(n, null(), null(), null(), 0, 0, null_mut(), &mut t)
            .into(),
        BAD,
        "get on stream",
    );
    expect(
        mc_store_batch_get_into_multi_buffers_on_stream(
            n,
            null(),
            0,
            null(),
            null(),
            null(),
            0,
            null_mut(),
            &mut t,
        )
        .into(),
        BAD,
        "multi on stream",
    );
    expect(
        mc_store_get_into_ranges_on_stream(
            n,
            null(),
            0,
            null(),
            null(),
            null(),
            null(),
            0,
            null_mut(),
            &mut t,
        )
        .into(),
        BAD,
        "ranges on stream",
    );
    expect(
        mc_store_batch_put_from_on_stream(
            n,
            null(),
            null(),
            null(),
            0,
            null(),
            0,
            null_mut(),
            &mut t,
        )
        .into(),
        BAD,
        "put on stream",
    );
    expect(
        mc_store_batch_put_from_multi_buffers_on_stream(
            n,
            null(),
            0,
            null(),
            null(),
            null(),
            null(),
            0,
            null_mut(),
            &mut t,
        )
        .into(),
        BAD,
        "put multi on stream",
    );
    assert!(t.is_null());
    // NULL-tolerant functions.
    mc_store_free(null_mut());
    mc_buffer_free(null_mut());
    mc_ticket_free(null_mut());
    mc_host_stream_free(null_mut());
    mc_host_event_free(null_mut());
    mc_setup_config_init(null_mut());
    mc_replicate_config_init(null_mut());
    assert!(mc_buffer_ptr(null()).is_null());
    assert_eq!(mc_buffer_len(null()), 0);
}

#[test]
fn bad_single_key_arguments() {
    let s = store();
    let k = c"k".as_ptr();
    let mut buf = [0u8; 8];
    let p = buf.as_mut_ptr().cast::<c_void>();
    expect(
        mc_store_put(s, null(), p, 8, null()).into(),
        BAD,
        "NULL key",
    );
    expect(
        mc_store_put(s, k, null(), 8, null()).into(),
        BAD,
        "NULL value, size 8",
    );
    assert_eq!(
        mc_store_put(s, k, null(), 0, null()),
        0,
        "NULL value, size 0 is a no-op"
    );
    expect(
        mc_store_put_from(s, k, p, usize::MAX, null()).into(),
        BAD,
        "size overflow",
    );
    expect(
        mc_store_put(s, c"\xff".as_ptr(), p, 8, null()).into(),
        BAD,
        "non-UTF-8 key",
    );
    expect(mc_store_get_into(s, null(), p, 8), BAD, "get NULL key");
    expect(mc_store_get_into(s, k, null_mut(), 8), BAD, "get NULL buf");
    expect(
        mc_store_get_into(s, k, p, isize::MAX as usize + 1),
        BAD,
        "get overflow",
    );
    expect(
        mc_store_get_buffer(s, k, null_mut()).into(),
        BAD,
        "get_buffer NULL out",
    );
    let mut b: *mut mc_buffer_t = std::ptr::dangling_mut::<mc_buffer_t>();
    expect(
        mc_store_get_buffer(s, null(), &mut b).into(),
        BAD,
        "get_buffer NULL key",
    );
    assert!(b.is_null());
    expect(mc_store_is_exist(s, null()).into(), BAD, "exist NULL key");
    expect(mc_store_get_size(s, null()), BAD, "size NULL key");
    expect(mc_store_remove(s, null(), 1).into(), BAD, "remove NULL key");
    expect(mc_store_remove_by_regex(s, null(), 1), BAD, "regex NULL");
    expect(
        mc_store_get_hostname(s, null_mut(), 8).into(),
        BAD,
        "hostname NULL buf",
    );
    expect(
        mc_store_get_hostname(s, buf.as_mut_ptr().cast(), 0).into(),
        BAD,
        "hostname len 0",
    );
    expect(
        mc_store_register_buffer(s, null_mut(), 8).into(),
        BAD,
        "register NULL",
    );
    expect(
        mc_store_register_buffer(s, p, 0).into(),
        BAD,
        "register size 0",
    );
    expect(
        mc_store_unregister_buffer(s, null_mut()).into(),
        BAD,
        "unregister NULL",
    );
    expect(
        mc_store_unregister_buffer(s, p).into(),
        BAD,
        "unregister unknown",
    );
    expect(
        mc_store_metrics_json(s, null_mut(), 8, null_mut()).into(),
        BAD,
        "metrics NULL buf",
    );
    expect(mc_store_setup(s, null()).into(), BAD, "setup NULL config");
    expect(
        mc_store_init_all(s, null(), null(), 0).into(),
        BAD,
        "already set up",
    );
    expect(
        mc_store_batch_get_session_end(s, null(), 2).into(),
        BAD,
        "session end NULL keys",
    );
    mc_store_free(s);

    let fresh = mc_store_new();
    let mut cfg = std::mem::MaybeUninit::uninit();
    mc_setup_config_init(cfg.as_mut_ptr());
    // SAFETY: initialised above.
    let mut cfg: mc_setup_config_t = unsafe { cfg.assume_init() };
    cfg.local_hostname = null();
    expect(
        mc_store_setup(fresh, &cfg).into(),
        BAD,
        "setup NULL hostname",
    );
    cfg.local_hostname = c"x".as_ptr();
    cfg.global_segment_size = 10;
    expect(
        mc_store_setup(fresh, &cfg).into(),
        BAD,
        "setup tiny segment",
    );
    mc_store_free(fresh);
}

#[test]
fn bad_replicate_configs() {
    let s = store();
    let v = [1u8; 8];
    let mut rc = std::mem::MaybeUninit::uninit();
    mc_replicate_config_init(rc.as_mut_ptr());
    // SAFETY: initialised above.
    let good: mc_replicate_config_t = unsafe { rc.assume_init() };
    let put = |cfg: &mc_replicate_config_t| {
        i64::from(mc_store_put(s, c"cfg".as_ptr(), v.as_ptr().cast(), 8, cfg))
    };
    expect(
        put(&mc_replicate_config_t {
            soft_pin_action: 3,
            ..good
        }),
        BAD,
        "bad enum",
    );
    expect(
        put(&mc_replicate_config_t {
            soft_pin_action: -1,
            ..good
        }),
        BAD,
        "negative enum",
    );
    expect(
        put(&mc_replicate_config_t {
            replica_num: 0,
            ..good
        }),
        BAD,
        "zero replicas",
    );
    expect(
        put(&mc_replicate_config_t {
            preferred_segments_count: 2,
            ..good
        }),
        BAD,
        "NULL preferred list with count 2",
    );
    expect(
        put(&mc_replicate_config_t {
            preferred_segments_count: usize::MAX,
            ..good
        }),
        BAD,
        "preferred count overflow",
    );
    let names = [null(), c"localhost".as_ptr()];
    let ok = mc_replicate_config_t {
        preferred_segments: names.as_ptr(),
        preferred_segments_count: 2,
        ..good
    };
    assert_eq!(put(&ok), 0, "NULL entries are skipped");
    mc_store_free(s);
}

#[test]
fn bad_batch_arguments() {
    let s = store();
    let keys = [c"a".as_ptr(), c"b".as_ptr()];
    let null_key = [c"a".as_ptr(), null()];
    let v = [1u8; 8];
    let bufs = [v.as_ptr().cast::<c_void>(), null()];
    let sizes = [8usize, 8];
    let huge = [8usize, usize::MAX];
    let mut r = [5 as c_int; 2];
    let mut r64 = [5i64; 2];

    // NULL results with count > 0: -600, nothing written.
    expect(
        mc_store_batch_put_from(
            s,
            keys.as_ptr(),
            bufs.as_ptr(),
            sizes.as_ptr(),
            2,
            null(),
            null_mut(),
        )
        .into(),
        BAD,
        "NULL results",
    );
    expect(
        mc_store_batch_is_exist(s, keys.as_ptr(), 2, null_mut()).into(),
        BAD,
        "NULL results",
    );
    expect(
        mc_store_batch_get_into(s, keys.as_ptr(), null(), null(), 2, null_mut()).into(),
        BAD,
        "NULL results",
    );
    // Per-entry problems: -600 in the return value and in every slot.
    let rp = r.as_mut_ptr();
    let calls: Vec<(&str, Call)> = vec![
        (
            "NULL buffer with size",
            Box::new(|| {
                mc_store_batch_put_from(
                    s,
                    keys.as_ptr(),
                    bufs.as_ptr(),
                    sizes.as_ptr(),
                    2,
                    null(),
                    rp,
                )
            }),
        ),
        (
            "NULL key",
            Box::new(|| {
                mc_store_batch_put_from(
                    s,
                    null_key.as_ptr(),
                    bufs.as_ptr(),
                    sizes.as_ptr(),
                    2,
                    null(),
                    rp,
                )
            }),
        ),
        (
            "NULL keys",
            Box::new(|| {
                mc_store_batch_upsert_from(s, null(), bufs.as_ptr(), sizes.as_ptr(), 2, null(), rp)
            }),
        ),
        (
            "NULL sizes",
            Box::new(|| {
                mc_store_batch_put_from(s, keys.as_ptr(), bufs.as_ptr(), null(), 2, null(), rp)
            }),
        ),
        (
            "NULL bufs (multi)",
            Box::new(|| {
                mc_store_batch_put_from_multi_buffers(
                    s,
                    keys.as_ptr(),
                    2,
                    null(),
                    null(),
                    [1usize, 1].as_ptr(),
                    null(),
                    rp,
                )
            }),
        ),
        (
            "NULL buf_counts",
            Box::new(|| {
                mc_store_batch_upsert_from_multi_buffers(
                    s,
                    keys.as_ptr(),
                    2,
                    null(),
                    null(),
                    null(),
                    null(),
                    rp,
                )
            }),
        ),
        (
            "exist NULL key",
            Box::new(|| mc_store_batch_is_exist(s, null_key.as_ptr(), 2, rp)),
        ),
        (
            "remove NULL keys",
            Box::new(|| mc_store_batch_remove(s, null(), 2, 1, rp)),
        ),
        (
            "get session NULL key",
            Box::new(|| mc_store_batch_get_session_start(s, null_key.as_ptr(), 2, rp)),
        ),
        (
            "put session NULL sizes",
            Box::new(|| mc_store_batch_put_session_start(s, keys.as_ptr(), null(), 2, null(), rp)),
        ),
        (
            "put session end NULL key",
            Box::new(|| mc_store_batch_put_session_end(s, null_key.as_ptr(), 2, rp)),
        ),
        (
            "put session revoke NULL keys",
            Box::new(|| mc_store_batch_put_session_revoke(s, null(), 2, rp)),
        ),
    ];
    for (what, call) in calls {
        expect(call().into(), BAD, what);
    }
    // The slots of such a call all carry the code.
    r = [5; 2];
    expect(
        mc_store_batch_put_from(
            s,
            keys.as_ptr(),
            bufs.as_ptr(),
            sizes.as_ptr(),
            2,
            null(),
            r.as_mut_ptr(),
        )
        .into(),
        BAD,
        "slots",
    );
    assert_eq!(r, [BAD, BAD]);
    // Overflowing sizes and counts.
    let ok_bufs = [v.as_ptr().cast::<c_void>(), v.as_ptr().cast()];
    expect(
        mc_store_batch_put_from(
            s,
            keys.as_ptr(),
            ok_bufs.as_ptr(),
            huge.as_ptr(),
            2,
            null(),
            r.as_mut_ptr(),
        )
        .into(),
        BAD,
        "size overflow",
    );
    expect(
        mc_store_put_batch(s, keys.as_ptr(), ok_bufs.as_ptr(), huge.as_ptr(), 2, null()).into(),
        BAD,
        "copy batch overflow",
    );
    expect(
        mc_store_put_parts(
            s,
            keys[0],
            ok_bufs.as_ptr(),
            sizes.as_ptr(),
            usize::MAX,
            null(),
        )
        .into(),
        BAD,
        "count overflow",
    );
    expect(
        mc_store_batch_is_exist(s, keys.as_ptr(), usize::MAX, r.as_mut_ptr()).into(),
        BAD,
        "results count overflow",
    );

    // Gets: NULL destination with size, overlapping destinations, count mismatch in multi.
    let mut out = [0u8; 16];
    let dst_null = [out.as_mut_ptr().cast::<c_void>(), null_mut()];
    expect(
        mc_store_batch_get_into(
            s,
            keys.as_ptr(),
            dst_null.as_ptr(),
            sizes.as_ptr(),
            2,
            r64.as_mut_ptr(),
        )
        .into(),
        BAD,
        "NULL dst",
    );
    assert_eq!(r64, [i64::from(BAD); 2]);
    let overlap = [
        out.as_mut_ptr().cast::<c_void>(),
        out[4..].as_mut_ptr().cast(),
    ];
    expect(
        mc_store_batch_get_into(
            s,
            keys.as_ptr(),
            overlap.as_ptr(),
            sizes.as_ptr(),
            2,
            r64.as_mut_ptr(),
        )
        .into(),
        BAD,
        "overlap",
    );
    let one = [overlap[0]];
    let lists = [one.as_ptr(), null()];
    let size_lists = [sizes.as_ptr(), sizes.as_ptr()];
    let counts = [1usize, 3];
    expect(
        mc_store_batch_get_into_multi_buffers(
            s,
            keys.as_ptr(),
            2,
            lists.as_ptr(),
            size_lists.as_ptr(),
            counts.as_ptr(),
            r64.as_mut_ptr(),
        )
        .into(),
        BAD,
        "count mismatch: NULL row with 3 entries",
    );
    expect(
        mc_store_batch_get_into_multi_buffer_ranges(
            s,
            keys.as_ptr(),
            2,
            lists.as_ptr(),
            size_lists.as_ptr(),
            null(),
            counts.as_ptr(),
            r64.as_mut_ptr(),
        )
        .into(),
        BAD,
        "NULL src_offsets",
    );
    expect(
        mc_store_batch_put_from_multi_buffer_ranges(
            s,
            keys.as_ptr(),
            2,
            null(),
            null(),
            null(),
            counts.as_ptr(),
            r64.as_mut_ptr(),
        )
        .into(),
        BAD,
        "NULL bufs",
    );
    let ranges = [mc_range_t {
        buffer_index: 0,
        key: null(),
        dst_offset: 0,
        src_offset: 0,
        size: 1,
    }];
    expect(
        mc_store_get_into_ranges(
            s,
            overlap.as_ptr(),
            sizes.as_ptr(),
            1,
            ranges.as_ptr(),
            1,
            r64.as_mut_ptr(),
        )
        .into(),
        BAD,
        "range NULL key",
    );
    expect(
        mc_store_get_into_ranges(
            s,
            overlap.as_ptr(),
            sizes.as_ptr(),
            2,
            ranges.as_ptr(),
            1,
            r64.as_mut_ptr(),
        )
        .into(),
        BAD,
        "overlapping range buffers",
    );
    expect(
        mc_store_get_into_ranges(s, null(), null(), 1, ranges.as_ptr(), 1, r64.as_mut_ptr()).into(),
        BAD,
        "NULL buffers",
    );
    let mut outs = [null_mut::<mc_buffer_t>(); 2];
    expect(
        mc_store_batch_get_buffer(s, keys.as_ptr(), 2, null_mut(), r.as_mut_ptr()).into(),
        BAD,
        "NULL out array",
    );
    expect(
        mc_store_batch_get_buffer(s, null_key.as_ptr(), 2, outs.as_mut_ptr(), r.as_mut_ptr())
            .into(),
        BAD,
        "NULL key",
    );
    assert!(outs.iter().all(|b| b.is_null()));
    // NULL results: -600 and, as documented, nothing written to `out`.
    let sentinel = std::ptr::NonNull::<mc_buffer_t>::dangling().as_ptr();
    let mut untouched = [sentinel; 2];
    expect(
        mc_store_batch_get_buffer(s, keys.as_ptr(), 2, untouched.as_mut_ptr(), null_mut()).into(),
        BAD,
        "NULL results array",
    );
    assert!(
        untouched.iter().all(|b| *b == sentinel),
        "a call refused for NULL results wrote to out"
    );
    // count 0 is valid everywhere, with NULL arrays.
    assert_eq!(
        mc_store_batch_put_from(s, null(), null(), null(), 0, null(), null_mut()),
        0
    );
    assert_eq!(
        mc_store_batch_get_into(s, null(), null(), null(), 0, null_mut()),
        0
    );
    assert_eq!(mc_store_put_batch(s, null(), null(), null(), 0, null()), 0);
    mc_store_free(s);
}

/// An on-stream call made with a ticket out-pointer preset to garbage.
type TicketCall<'a> = Box<dyn Fn(*mut *mut mc_ticket_t) -> c_int + 'a>;

unsafe extern "C" fn noop(_: *mut c_void) {}

#[test]
fn bad_on_stream_ticket_host_stream_and_event_arguments() {
    let s = store();
    assert_eq!(
        mc_store_put(s, c"known".as_ptr(), b"v".as_ptr().cast(), 1, null()),
        0
    );
    let hs = mc_host_stream_new();
    assert!(!hs.is_null());
    let stream = hs.cast::<c_void>();
    let key = [c"known".as_ptr()];
    let null_key = [null::<c_char>()];
    let mut out = [0u8; 8];
    let bufs = [out.as_mut_ptr().cast::<c_void>()];
    let sizes = [8usize];
    let rows = [bufs.as_ptr()];
    let size_rows = [sizes.as_ptr()];
    let zero = [0u64];
    let offset_rows = [zero.as_ptr()];
    let one = [1usize];
    let (k, b, z) = (key.as_ptr(), bufs.as_ptr(), sizes.as_ptr());
    let (r, zr, o, c) = (
        rows.as_ptr(),
        size_rows.as_ptr(),
        offset_rows.as_ptr(),
        one.as_ptr(),
    );
    let host = MC_STREAM_HOST;
    let srcs = [b"v".as_ptr().cast::<c_void>()];
    let src_rows = [srcs.as_ptr()];
    let one_rows = [one.as_ptr()];
    let (p, pr, pz) = (srcs.as_ptr(), src_rows.as_ptr(), one_rows.as_ptr());
    let dup = [c"dup".as_ptr(), c"dup".as_ptr()];
    let two_srcs = [p.cast::<c_void>(), p.cast()];
    let two_sizes = [1usize, 1];
    let mut bad_cfg = std::mem::MaybeUninit::uninit();
    mc_replicate_config_init(bad_cfg.as_mut_ptr());
    // SAFETY: initialised above.
    let bad_cfg = mc_replicate_config_t {
        soft_pin_action: 9,
        ..unsafe { bad_cfg.assume_init() }
    };

    // Each on-stream call with one argument spoiled: -600, a message, *ticket reset to NULL.
    let calls: Vec<(&str, TicketCall)> = vec![
        (
            "get: NULL store",
            Box::new(|t| {
                mc_store_batch_get_into_on_stream(null_mut(), k, b, z, 1, host, stream, t)
            }),
        ),
        (
            "get: NULL keys",
            Box::new(|t| mc_store_batch_get_into_on_stream(s, null(), b, z, 1, host, stream, t)),
        ),
        (
            "get: NULL key entry",
            Box::new(|t| {
                mc_store_batch_get_into_on_stream(s, null_key.as_ptr(), b, z, 1, host, stream, t)
            }),
        ),
        (
            "get: NULL bufs",
            Box::new(|t| mc_store_batch_get_into_on_stream(s, k, null(), z, 1, host, stream, t)),
        ),
        (
            "get: NULL sizes",
            Box::new(|t| mc_store_batch_get_into_on_stream(s, k, b, null(), 1, host, stream, t)),
        ),
        (
            "get: unknown kind",
            Box::new(|t| mc_store_batch_get_into_on_stream(s, k, b, z, 1, 3, stream, t)),
        ),
        (
            "get: negative kind",
            Box::new(|t| mc_store_batch_get_into_on_stream(s, k, b, z, 1, -1, stream, t)),
        ),
        (
            "get: unknown kind, NULL stream",
            Box::new(|t| mc_store_batch_get_into_on_stream(s, k, b, z, 1, 9, null_mut(), t)),
        ),
        (
            "multi: NULL store",
            Box::new(|t| {
                mc_store_batch_get_into_multi_buffers_on_stream(
                    null_mut(),
                    k,
                    1,
                    r,
                    zr,
                    c,
                    host,
                    stream,
                    t,
                )
            }),
        ),
        (
            "multi: NULL bufs",
            Box::new(|t| {
                mc_store_batch_get_into_multi_buffers_on_stream(
                    s,
                    k,
                    1,
                    null(),
                    zr,
                    c,
                    host,
                    stream,
                    t,
                )
            }),
        ),
        (
            "multi: NULL sizes",
            Box::new(|t| {
                mc_store_batch_get_into_multi_buffers_on_stream(
                    s,
                    k,
                    1,
                    r,
                    null(),
                    c,
                    host,
                    stream,
                    t,
                )
            }),
        ),
        (
            "multi: NULL buf_counts",
            Box::new(|t| {
                mc_store_batch_get_into_multi_buffers_on_stream(
                    s,
                    k,
                    1,
                    r,
                    zr,
                    null(),
                    host,
                    stream,
                    t,
                )
            }),
        ),
        (
            "multi: unknown kind",
            Box::new(|t| {
                mc_store_batch_get_into_multi_buffers_on_stream(s, k, 1, r, zr, c, 3, stream, t)
            }),
        ),
        (
            "ranges: NULL store",
            Box::new(|t| {
                mc_store_get_into_ranges_on_stream(null_mut(), k, 1, r, zr, o, c, host, stream, t)
            }),
        ),
        (
            "ranges: NULL keys",
            Box::new(|t| {
                mc_store_get_into_ranges_on_stream(s, null(), 1, r, zr, o, c, host, stream, t)
            }),
        ),
        (
            "ranges: NULL src_offsets",
            Box::new(|t| {
                mc_store_get_into_ranges_on_stream(s, k, 1, r, zr, null(), c, host, stream, t)
            }),
        ),
        (
            "ranges: NULL buf_counts",
            Box::new(|t| {
                mc_store_get_into_ranges_on_stream(s, k, 1, r, zr, o, null(), host, stream, t)
            }),
        ),
        (
            "ranges: unknown kind",
            Box::new(|t| mc_store_get_into_ranges_on_stream(s, k, 1, r, zr, o, c, 3, stream, t)),
        ),
        (
            "put: NULL store",
            Box::new(|t| {
                mc_store_batch_put_from_on_stream(
                    null_mut(),
                    k,
                    p,
                    one.as_ptr(),
                    1,
                    null(),
                    host,
                    stream,
                    t,
                )
            }),
        ),
        (
            "put: NULL bufs",
            Box::new(|t| {
                mc_store_batch_put_from_on_stream(
                    s,
                    k,
                    null(),
                    one.as_ptr(),
                    1,
                    null(),
                    host,
                    stream,
                    t,
                )
            }),
        ),
        (
            "put: key listed twice",
            Box::new(|t| {
                mc_store_batch_put_from_on_stream(
                    s,
                    dup.as_ptr(),
                    two_srcs.as_ptr(),
                    two_sizes.as_ptr(),
                    2,
                    null(),
                    host,
                    stream,
                    t,
                )
            }),
        ),
        (
            "put: bad cfg",
            Box::new(|t| {
                mc_store_batch_put_from_on_stream(
                    s,
                    k,
                    p,
                    one.as_ptr(),
                    1,
                    &bad_cfg,
                    host,
                    stream,
                    t,
                )
            }),
        ),
        (
            "put: unknown kind",
            Box::new(|t| {
                mc_store_batch_put_from_on_stream(s, k, p, one.as_ptr(), 1, null(), 3, stream, t)
            }),
        ),
        (
            "put multi: NULL store",
            Box::new(|t| {
                mc_store_batch_put_from_multi_buffers_on_stream(
                    null_mut(),
                    k,
                    1,
                    pr,
                    pz,
                    c,
                    null(),
                    host,
                    stream,
                    t,
                )
            }),
        ),
        (
            "put multi: NULL buf_counts",
            Box::new(|t| {
                mc_store_batch_put_from_multi_buffers_on_stream(
                    s,
                    k,
                    1,
                    pr,
                    pz,
                    null(),
                    null(),
                    host,
                    stream,
                    t,
                )
            }),
        ),
        (
            "put multi: unknown kind",
            Box::new(|t| {
                mc_store_batch_put_from_multi_buffers_on_stream(
                    s,
                    k,
                    1,
                    pr,
                    pz,
                    c,
                    null(),
                    -1,
                    stream,
                    t,
                )
            }),
        ),
    ];
    for (what, call) in calls {
        let mut ticket = std::ptr::NonNull::<mc_ticket_t>::dangling().as_ptr();
        expect(call(&mut ticket).into(), BAD, what);
        assert!(ticket.is_null(), "{what}: *ticket not reset");
    }
    // NULL ticket out-pointer.
    expect(
        mc_store_batch_get_into_on_stream(s, k, b, z, 1, host, stream, null_mut()).into(),
        BAD,
        "get: NULL ticket",
    );
    expect(
        mc_store_batch_get_into_multi_buffers_on_stream(
            s,
            k,
            1,
            r,
            zr,
            c,
            host,
            stream,
            null_mut(),
        )
        .into(),
        BAD,
        "multi: NULL ticket",
    );
    expect(
        mc_store_get_into_ranges_on_stream(s, k, 1, r, zr, o, c, host, stream, null_mut()).into(),
        BAD,
        "ranges: NULL ticket",
    );
    expect(
        mc_store_batch_put_from_on_stream(
            s,
            k,
            p,
            one.as_ptr(),
            1,
            null(),
            host,
            stream,
            null_mut(),
        )
        .into(),
        BAD,
        "put: NULL ticket",
    );
    expect(
        mc_store_batch_put_from_multi_buffers_on_stream(
            s,
            k,
            1,
            pr,
            pz,
            c,
            null(),
            host,
            stream,
            null_mut(),
        )
        .into(),
        BAD,
        "put multi: NULL ticket",
    );
    // No refused put reserved anything.
    assert_eq!(mc_store_is_exist(s, c"dup".as_ptr()), 0);

    // Tickets: NULL → -600 (0 / NULL where the return type has no code), plus a message.
    let mut r64 = [0i64; 2];
    expect(mc_ticket_status(null()).into(), BAD, "status NULL");
    expect(mc_ticket_wait(null(), 0).into(), BAD, "wait NULL");
    expect(mc_ticket_key_count(null()) as i64, 0, "key_count NULL");
    expect(
        mc_ticket_status_word(null()) as usize as i64,
        0,
        "status_word NULL",
    );
    expect(
        mc_ticket_results(null(), r64.as_mut_ptr(), 1).into(),
        BAD,
        "results NULL ticket",
    );
    // A real (final) ticket: the count must be mc_ticket_key_count, results non-NULL.
    let mut ticket = null_mut();
    assert_eq!(
        mc_store_batch_get_into_on_stream(s, k, b, z, 1, host, null_mut(), &mut ticket),
        0
    );
    assert_eq!(mc_ticket_key_count(ticket), 1);
    expect(
        mc_ticket_results(ticket, r64.as_mut_ptr(), 2).into(),
        BAD,
        "results count 2",
    );
    expect(
        mc_ticket_results(ticket, r64.as_mut_ptr(), 0).into(),
        BAD,
        "results count 0",
    );
    expect(
        mc_ticket_results(ticket, null_mut(), 1).into(),
        BAD,
        "results NULL array",
    );
    assert_eq!(mc_ticket_results(ticket, r64.as_mut_ptr(), 1), 0);
    assert_eq!(r64[0], 1);
    mc_ticket_free(ticket);

    // Host streams and events.
    let ev = mc_host_event_new();
    assert!(!ev.is_null());
    expect(
        mc_host_stream_launch(null_mut(), Some(noop), null_mut()).into(),
        BAD,
        "launch NULL stream",
    );
    expect(
        mc_host_stream_launch(hs, None, null_mut()).into(),
        BAD,
        "launch NULL func",
    );
    expect(
        mc_host_stream_wait_event(null_mut(), ev).into(),
        BAD,
        "wait_event NULL stream",
    );
    expect(
        mc_host_stream_wait_event(hs, null()).into(),
        BAD,
        "wait_event NULL event",
    );
    expect(
        mc_host_stream_synchronize(null_mut(), 0).into(),
        BAD,
        "synchronize NULL",
    );
    expect(
        mc_host_event_record(null_mut(), hs).into(),
        BAD,
        "record NULL event",
    );
    expect(
        mc_host_event_record(ev, null_mut()).into(),
        BAD,
        "record NULL stream",
    );
    expect(mc_host_event_query(null()).into(), BAD, "query NULL");
    expect(mc_host_event_wait(null(), 0).into(), BAD, "event wait NULL");
    // Nothing above reached the stream or the store: both still work.
    assert_eq!(mc_host_stream_synchronize(hs, 10_000), 0);
    assert_eq!(mc_store_get_size(s, c"known".as_ptr()), 1);
    mc_host_event_free(ev);
    mc_host_stream_free(hs);
    mc_store_free(s);
}

#[test]
fn mooncake_store_null_rules_return_minus_one() {
    let n: mooncake_store_t = null_mut();
    let k = c"k".as_ptr();
    let mut v = [0u8; 8];
    let p = v.as_mut_ptr().cast::<c_void>();
    let mut r = [0 as c_int; 1];
    let mut r64 = [0i64; 1];
    let mut keys = [k];
    let mut bufs = [p];
    let sizes = [8usize];
    expect(
        mooncake_store_setup(n, k, null(), 0, 0, null(), null(), null()).into(),
        -1,
        "setup",
    );
    expect(
        mooncake_store_init_all(n, null(), null(), 0).into(),
        -1,
        "init_all",
    );
    expect(mooncake_store_health_check(n).into(), -1, "health");
    expect(mooncake_store_put(n, k, p, 8, null()).into(), -1, "put");
    expect(
        mooncake_store_put_from(n, k, p, 8, null()).into(),
        -1,
        "put_from",
    );
    expect(mooncake_store_get_into(n, k, p, 8), -1, "get_into");
    expect(mooncake_store_is_exist(n, k).into(), -1, "is_exist");
    expect(mooncake_store_get_size(n, k), -1, "get_size");
    expect(
        mooncake_store_get_hostname(n, v.as_mut_ptr().cast::<c_char>(), 8).into(),
        -1,
        "hostname",
    );
    expect(mooncake_store_remove(n, k, 0).into(), -1, "remove");
    expect(mooncake_store_remove_by_regex(n, k, 0), -1, "regex");
    expect(mooncake_store_remove_all(n, 0), -1, "all");
    expect(
        mooncake_store_register_buffer(n, p, 8).into(),
        -1,
        "register",
    );
    expect(
        mooncake_store_unregister_buffer(n, p).into(),
        -1,
        "unregister",
    );
    expect(
        mooncake_store_batch_put_from(
            n,
            keys.as_mut_ptr(),
            bufs.as_mut_ptr(),
            sizes.as_ptr(),
            1,
            null(),
            r.as_mut_ptr(),
        )
        .into(),
        -1,
        "bpf",
    );
    expect(
        mooncake_store_batch_get_into(
            n,
            keys.as_mut_ptr(),
            bufs.as_mut_ptr(),
            sizes.as_ptr(),
            1,
            r64.as_mut_ptr(),
        )
        .into(),
        -1,
        "bgi",
    );
    expect(
        mooncake_store_batch_is_exist(n, keys.as_mut_ptr(), 1, r.as_mut_ptr()).into(),
        -1,
        "bie",
    );
    mooncake_store_destroy(n);

    let s = mooncake_store_create();
    assert_eq!(mooncake_store_init_all(s, null(), null(), 16 << 20), 0);
    expect(
        mooncake_store_put(s, null(), p, 8, null()).into(),
        -1,
        "NULL key",
    );
    expect(
        mooncake_store_put(s, k, null(), 8, null()).into(),
        -1,
        "NULL value with size",
    );
    expect(
        mooncake_store_put_from(s, k, null_mut(), 8, null()).into(),
        -1,
        "NULL buffer with size",
    );
    expect(mooncake_store_get_into(s, null(), p, 8), -1, "get NULL key");
    expect(
        mooncake_store_is_exist(s, null()).into(),
        -1,
        "exist NULL key",
    );
    expect(mooncake_store_get_size(s, null()), -1, "size NULL key");
    expect(
        mooncake_store_get_hostname(s, null_mut(), 8).into(),
        -1,
        "hostname NULL buf",
    );
    expect(
        mooncake_store_get_hostname(s, v.as_mut_ptr().cast(), 2).into(),
        -1,
        "hostname too small",
    );
    expect(
        mooncake_store_remove(s, null(), 1).into(),
        -1,
        "remove NULL key",
    );
    expect(
        mooncake_store_remove_by_regex(s, null(), 1),
        -1,
        "regex NULL",
    );
    expect(
        mooncake_store_register_buffer(s, null_mut(), 8).into(),
        -1,
        "register NULL",
    );
    expect(
        mooncake_store_register_buffer(s, p, 0).into(),
        -1,
        "register 0",
    );
    expect(
        mooncake_store_unregister_buffer(s, null_mut()).into(),
        -1,
        "unregister NULL",
    );
    let mut null_keys = [null::<c_char>()];
    let mut null_bufs = [null_mut::<c_void>()];
    expect(
        mooncake_store_batch_put_from(
            s,
            null_keys.as_mut_ptr(),
            bufs.as_mut_ptr(),
            sizes.as_ptr(),
            1,
            null(),
            r.as_mut_ptr(),
        )
        .into(),
        -1,
        "batch NULL key",
    );
    expect(
        mooncake_store_batch_put_from(
            s,
            keys.as_mut_ptr(),
            null_bufs.as_mut_ptr(),
            sizes.as_ptr(),
            1,
            null(),
            r.as_mut_ptr(),
        )
        .into(),
        -1,
        "batch NULL buffer",
    );
    expect(
        mooncake_store_batch_put_from(
            s,
            keys.as_mut_ptr(),
            bufs.as_mut_ptr(),
            null(),
            1,
            null(),
            r.as_mut_ptr(),
        )
        .into(),
        -1,
        "batch NULL sizes",
    );
    expect(
        mooncake_store_batch_put_from(
            s,
            keys.as_mut_ptr(),
            bufs.as_mut_ptr(),
            sizes.as_ptr(),
            1,
            null(),
            null_mut(),
        )
        .into(),
        -1,
        "batch NULL results",
    );
    expect(
        mooncake_store_batch_get_into(
            s,
            keys.as_mut_ptr(),
            bufs.as_mut_ptr(),
            sizes.as_ptr(),
            1,
            null_mut(),
        )
        .into(),
        -1,
        "bgi NULL results",
    );
    expect(
        mooncake_store_batch_is_exist(s, null_mut(), 1, r.as_mut_ptr()).into(),
        -1,
        "bie NULL keys",
    );
    // A config with replica_num 0 is copied verbatim: -600 (not -1).
    let cfg = mooncake_replicate_config_t {
        replica_num: 0,
        with_soft_pin: 0,
        with_hard_pin: 0,
        preferred_segments: null_mut(),
        preferred_segments_count: 0,
    };
    expect(
        mooncake_store_put(s, k, p, 8, &cfg).into(),
        BAD,
        "replica_num 0",
    );
    mooncake_store_destroy(s);
}
