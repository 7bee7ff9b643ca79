//! The full client method set against the in-process master (no sockets): round trips,
//! Mooncake's return codes and edge cases, sessions, ranges, pins and copy counters.

use mooncake_rs::client::{Client, RangeRequest, SetupConfig};
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;

const MIB: usize = 1 << 20;

fn embedded(segment: u64, local_buffer: u64) -> Client {
    Client::setup(SetupConfig {
        local_hostname: "embedded-test".into(),
        global_segment_size: segment,
        local_buffer_size: local_buffer,
        master_server_addr: "embedded".into(),
        ..SetupConfig::default()
    })
    .expect("embedded setup")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn cfg() -> ReplicateConfig {
    ReplicateConfig::default()
}

#[test]
fn round_trips_of_every_size_with_exactly_one_copy_each_way() {
    let client = embedded(256 * MIB as u64, 80 * MIB as u64);
    for (i, size) in [1usize, 4096, MIB, 64 * MIB].into_iter().enumerate() {
        let key = format!("rt-{size}");
        let value = pattern(size, i as u8);
        let before = client.metrics().transfer;
        client.put_from(&key, &value, &cfg()).unwrap();
        let mut out = vec![0u8; size];
        assert_eq!(client.get_into(&key, &mut out).unwrap(), size as u64);
        assert_eq!(out, value);
        let after = client.metrics().transfer;
        assert_eq!(
            after.local_copies - before.local_copies,
            2,
            "one copy in, one copy out"
        );
        assert_eq!(
            after.local_copy_bytes - before.local_copy_bytes,
            2 * size as u64
        );
        assert_eq!(
            after.tcp_write_bytes + after.tcp_read_bytes,
            0,
            "embedded mode uses no sockets"
        );
        let handle = client.get_buffer(&key).unwrap();
        assert_eq!(handle.as_slice(), &value[..]);
    }
    // size 0 is a silent no-op: nothing stored
    client.put_from("empty", &[], &cfg()).unwrap();
    assert_eq!(client.is_exist("empty"), Ok(false));
    assert_eq!(
        client.get_into("empty", &mut [0u8; 4]),
        Err(ErrorCode::ObjectNotFound)
    );
}

#[test]
fn mooncake_return_codes_and_quirks() {
    let client = embedded(16 * MIB as u64, 4 * MIB as u64);
    let mut buf = vec![0u8; 64];
    assert_eq!(
        client.get_into("missing", &mut buf),
        Err(ErrorCode::ObjectNotFound)
    );
    assert_eq!(client.get_size("missing"), Err(ErrorCode::ObjectNotFound));
    assert_eq!(client.is_exist("missing"), Ok(false));
    assert_eq!(
        client.remove("missing", false),
        Err(ErrorCode::ObjectNotFound)
    );

    client.put("k", b"first", &cfg()).unwrap();
    // put does not overwrite and does not lease
    client.put("k", b"second!", &cfg()).unwrap();
    client.remove("k", false).unwrap();
    client.put("k", b"first", &cfg()).unwrap();
    client.put_from("k", b"other", &cfg()).unwrap();
    assert_eq!(client.get_into("k", &mut buf), Ok(5));
    assert_eq!(&buf[..5], b"first");
    // the get granted a lease: plain remove is refused, force wins
    assert_eq!(client.remove("k", false), Err(ErrorCode::ObjectHasLease));
    client.remove("k", true).unwrap();
    assert_eq!(client.is_exist("k"), Ok(false));

    client.put("small", b"0123456789", &cfg()).unwrap();
    assert_eq!(
        client.get_into("small", &mut [0u8; 9]),
        Err(ErrorCode::InvalidParams),
        "buffer too small is -600"
    );
    assert_eq!(client.get_size("small"), Ok(10));

    let bad = ReplicateConfig {
        replica_num: 0,
        ..cfg()
    };
    assert_eq!(
        client.put_from("x", b"abc", &bad),
        Err(ErrorCode::InvalidParams)
    );
    let same_node = ReplicateConfig {
        prefer_alloc_in_same_node: true,
        ..cfg()
    };
    assert_eq!(
        client.put("x", b"abc", &same_node),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(
        client.put_from("", b"abc", &cfg()),
        Err(ErrorCode::InvalidParams)
    );
    // two replicas wanted, one segment: best effort succeeds
    let two = ReplicateConfig {
        replica_num: 2,
        ..cfg()
    };
    client.put_from("two", b"abc", &two).unwrap();
    assert_eq!(client.get_size("two"), Ok(3));
    // no space
    let huge = vec![1u8; 17 * MIB];
    assert_eq!(
        client.put_from("huge", &huge, &cfg()),
        Err(ErrorCode::NoAvailableHandle)
    );
    // copying put larger than the local buffer is -600
    let big = vec![1u8; 5 * MIB];
    assert_eq!(
        client.put("big", &big, &cfg()),
        Err(ErrorCode::InvalidParams)
    );
}

#[test]
fn copying_put_needs_a_local_buffer() {
    let client = embedded(4 * MIB as u64, 0);
    assert_eq!(client.put("k", b"v", &cfg()), Err(ErrorCode::InvalidParams));
    client.put_from("k", b"v", &cfg()).unwrap();
    assert!(matches!(
        client.get_buffer("k"),
        Err(ErrorCode::InvalidParams)
    ));
}

#[test]
fn batches_mismatches_and_duplicates() {
    let client = embedded(16 * MIB as u64, 4 * MIB as u64);
    let a = pattern(1000, 1);
    let b = pattern(2000, 2);
    let c = pattern(3000, 3);
    let results = client.batch_put_from(&["a", "b"], &[&a], &cfg());
    assert_eq!(results, vec![Err(ErrorCode::InvalidParams); 2]);
    let results = client.batch_put_from(&["a", "b", "a"], &[&a, &b, &c], &cfg());
    assert_eq!(results, vec![Ok(()), Ok(()), Ok(())]);
    // duplicate keys: the last buffer wins
    assert_eq!(client.get_size("a"), Ok(3000));
    let mut ba = vec![0u8; 3000];
    let mut bb = vec![0u8; 2000];
    let mut bc = [0u8; 10];
    let got = client.batch_get_into(
        &["a", "b", "zz"],
        &mut [&mut ba[..], &mut bb[..], &mut bc[..]],
    );
    assert_eq!(
        got,
        vec![Ok(3000), Ok(2000), Err(ErrorCode::ObjectNotFound)]
    );
    assert_eq!(ba, c);
    assert_eq!(bb, b);
    let got = client.batch_get_into(&["a"], &mut []);
    assert_eq!(got, vec![Err(ErrorCode::InvalidParams)]);
    assert_eq!(
        client.batch_is_exist(&["a", "q"]),
        vec![Ok(true), Ok(false)]
    );
    assert!(client.batch_is_exist::<&str>(&[]).is_empty());
    assert_eq!(
        client.batch_remove(&["a", "a", "q"], true),
        vec![
            Ok(()),
            Err(ErrorCode::ObjectNotFound),
            Err(ErrorCode::ObjectNotFound)
        ]
    );
    assert_eq!(
        client.put_batch(&["p1", "p2"], &[b"one", b"two"], &cfg()),
        Ok(())
    );
    assert_eq!(
        client.put_batch(&["p1"], &[b"one", b"two"], &cfg()),
        Err(ErrorCode::InvalidParams)
    );
    let handles = client.batch_get_buffer(&["p1", "p2", "none"]);
    assert_eq!(handles[0].as_ref().unwrap().as_slice(), b"one");
    assert_eq!(handles[1].as_ref().unwrap().as_slice(), b"two");
    assert!(matches!(handles[2], Err(ErrorCode::ObjectNotFound)));
}

#[test]
fn multi_buffers_scatter_and_gather() {
    let client = embedded(16 * MIB as u64, 0);
    let parts = [pattern(100, 1), pattern(50, 2), pattern(7, 3)];
    let whole: Vec<u8> = parts.concat();
    let lists = vec![parts.iter().map(|p| &p[..]).collect::<Vec<_>>()];
    assert_eq!(
        client.batch_put_from_multi_buffers(&["mb"], &lists, &cfg()),
        vec![Ok(())]
    );
    let (mut x, mut y) = (vec![0u8; 150], vec![0u8; 7]);
    let got = client.batch_get_into_multi_buffers(&["mb"], &mut [vec![&mut x[..], &mut y[..]]]);
    assert_eq!(got, vec![Ok(157)]);
    assert_eq!([x.clone(), y.clone()].concat(), whole);
    let (mut short, mut long) = (vec![0u8; 100], vec![0u8; 200]);
    assert_eq!(
        client.batch_get_into_multi_buffers(&["mb"], &mut [vec![&mut short[..]]]),
        vec![Err(ErrorCode::InvalidParams)]
    );
    assert_eq!(
        client.batch_get_into_multi_buffers(&["mb"], &mut [vec![&mut long[..]]]),
        vec![Err(ErrorCode::TransferFail)]
    );
}

#[test]
fn upsert_overwrites_in_place_or_reallocates() {
    let client = embedded(16 * MIB as u64, 4 * MIB as u64);
    client.upsert("u", b"aaaa", &cfg()).unwrap();
    client.upsert_from("u", b"bbbb", &cfg()).unwrap();
    let mut out = vec![0u8; 16];
    assert_eq!(client.get_into("u", &mut out), Ok(4));
    assert_eq!(&out[..4], b"bbbb");
    client
        .upsert_parts("u", &[b"cc", b"ccccc"], &cfg())
        .unwrap();
    assert_eq!(client.get_into("u", &mut out), Ok(7));
    assert_eq!(&out[..7], b"ccccccc");
    assert_eq!(
        client.batch_upsert_from(&["u", "v"], &[b"1", b"22"], &cfg()),
        vec![Ok(()), Ok(())]
    );
    assert_eq!(client.get_size("u"), Ok(1));
    assert_eq!(client.upsert_batch(&["v"], &[b"333"], &cfg()), Ok(()));
    assert_eq!(client.get_size("v"), Ok(3));
}

#[test]
fn regex_and_remove_all_counts() {
    let client = embedded(16 * MIB as u64, 0);
    for key in ["layer.0.k", "layer.0.v", "layer.1.k", "other"] {
        client.put_from(key, b"xyz", &cfg()).unwrap();
    }
    assert_eq!(
        client.remove_by_regex("(", false),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(client.remove_by_regex(r"layer\.0", false), Ok(2));
    assert_eq!(client.remove_by_regex("^layer", false), Ok(1));
    assert_eq!(client.is_exist("other"), Ok(true));
    assert_eq!(
        client.remove_all(false),
        Ok(0),
        "the is_exist lease protects it"
    );
    assert_eq!(client.remove_all(true), Ok(1));
    assert_eq!(client.remove_all(true), Ok(0));
}

#[test]
fn get_and_put_sessions_per_layer() {
    let client = embedded(32 * MIB as u64, 0);
    let layers = 4usize;
    let page = 4096usize;
    let keys = ["s0", "s1"];
    assert_eq!(
        client.batch_put_session_start(&keys, &[(layers * page) as u64; 2], &cfg()),
        vec![Ok(()), Ok(())]
    );
    assert_eq!(
        client.batch_put_session_start(&["s0"], &[10], &cfg()),
        vec![Err(ErrorCode::InvalidParams)]
    );
    let data: Vec<Vec<u8>> = (0..2)
        .map(|k| pattern(layers * page, k as u8 + 10))
        .collect();
    for layer in 0..layers {
        let range = layer * page..(layer + 1) * page;
        let bufs = vec![vec![&data[0][range.clone()]], vec![&data[1][range.clone()]]];
        let offsets = vec![vec![range.start as u64]; 2];
        let done = client.batch_put_from_multi_buffer_ranges(&keys, &bufs, &offsets);
        assert_eq!(done, vec![Ok(page as u64); 2]);
    }
    let past = vec![vec![&data[0][..page]]];
    assert_eq!(
        client.batch_put_from_multi_buffer_ranges(
            &["s0"],
            &past,
            &[vec![(layers * page - 1) as u64]]
        ),
        vec![Err(ErrorCode::InvalidParams)]
    );
    assert_eq!(client.is_exist("s0"), Ok(false), "not visible before end");
    assert_eq!(client.batch_put_session_end(&keys), vec![Ok(()), Ok(())]);
    assert_eq!(
        client.batch_put_session_end(&keys),
        vec![Err(ErrorCode::InvalidParams); 2]
    );

    assert_eq!(
        client.batch_get_session_start(&["s0", "s1", "nope"]),
        vec![Ok(()), Ok(()), Err(ErrorCode::ObjectNotFound)]
    );
    let before = client.metrics();
    let mut out = vec![vec![0u8; layers * page]; 2];
    for layer in 0..layers {
        let range = layer * page..(layer + 1) * page;
        let (o0, o1) = out.split_at_mut(1);
        let mut bufs = vec![
            vec![&mut o0[0][range.clone()]],
            vec![&mut o1[0][range.clone()]],
        ];
        let got = client.batch_get_into_multi_buffer_ranges(
            &keys,
            &mut bufs,
            &[vec![range.start as u64], vec![range.start as u64]],
        );
        assert_eq!(got, vec![Ok(page as u64); 2]);
    }
    assert_eq!(out, data);
    assert_eq!(
        client.metrics().transfer.local_copies - before.transfer.local_copies,
        (2 * layers) as u64
    );
    client.batch_get_session_end(&keys).unwrap();
    let mut b = [0u8; 4];
    assert_eq!(
        client.batch_get_into_multi_buffer_ranges(&["s0"], &mut [vec![&mut b[..]]], &[vec![0]]),
        vec![Err(ErrorCode::InvalidParams)]
    );

    // revoke leaves nothing behind
    assert_eq!(
        client.batch_put_session_start(&["r"], &[100], &cfg()),
        vec![Ok(())]
    );
    assert_eq!(client.batch_put_session_revoke(&["r"]), vec![Ok(())]);
    assert_eq!(
        client.batch_get_session_start(&["r"]),
        vec![Err(ErrorCode::ObjectNotFound)]
    );
    assert_eq!(
        client.batch_put_session_revoke(&["r"]),
        vec![Err(ErrorCode::InvalidParams)]
    );
}

#[test]
fn ranges_gather_into_one_buffer() {
    let client = embedded(16 * MIB as u64, 0);
    let a = pattern(1000, 5);
    let b = pattern(500, 6);
    client.put_from("ra", &a, &cfg()).unwrap();
    client.put_from("rb", &b, &cfg()).unwrap();
    let mut big = vec![0u8; 310];
    let keys = vec![vec![
        "ra".to_string(),
        "rb".to_string(),
        "missing".to_string(),
    ]];
    let dst = vec![vec![vec![0, 100], vec![200], vec![300]]];
    let src = vec![vec![vec![10, 900], vec![0], vec![0]]];
    let sizes = vec![vec![vec![100, 100], vec![100], vec![10]]];
    let request = RangeRequest {
        keys: &keys,
        dst_offsets: &dst,
        src_offsets: &src,
        sizes: &sizes,
    };
    let got = client.get_into_ranges(&mut [&mut big[..]], &request);
    assert_eq!(
        got,
        vec![vec![
            vec![Ok(100), Ok(100)],
            vec![Ok(100)],
            vec![Err(ErrorCode::ObjectNotFound)]
        ]]
    );
    assert_eq!(&big[..100], &a[10..110]);
    assert_eq!(&big[100..200], &a[900..1000]);
    assert_eq!(&big[200..300], &b[..100]);
    let out_of_range = vec![vec![vec![0], vec![250], vec![0]]];
    let request = RangeRequest {
        keys: &keys,
        dst_offsets: &out_of_range,
        src_offsets: &src,
        sizes: &sizes,
    };
    let got = client.get_into_ranges(&mut [&mut big[..]], &request);
    assert_eq!(
        got[0][0],
        vec![Err(ErrorCode::InvalidParams)],
        "shape mismatch at [0][0]"
    );
    assert_eq!(
        got[0][1],
        vec![Err(ErrorCode::InvalidParams)],
        "250 + 100 > 310"
    );
}

/// Fragments whose destinations share bytes would be two aliasing writes on different
/// transfer lanes: every such fragment is refused with `INVALID_PARAMS` and writes nothing,
/// in one buffer, across keys and across raw buffers; the other fragments still land.
#[test]
fn get_into_ranges_refuses_overlapping_destination_fragments() {
    const FILL: u8 = 0xAB;
    let client = embedded(16 * MIB as u64, 0);
    let (a, b) = (pattern(1000, 11), pattern(1000, 12));
    client.put_from("ov-a", &a, &cfg()).unwrap();
    client.put_from("ov-b", &b, &cfg()).unwrap();
    let keys = vec![vec!["ov-a".to_string(), "ov-b".to_string()]];
    // ov-a: [0, 16) and [8, 24) overlap each other; [100, 108) is fine.
    // ov-b: [20, 30) overlaps ov-a's [8, 24); [200, 210) is fine; [300, 300) is empty.
    let dst = vec![vec![vec![0, 8, 100], vec![20, 200, 300]]];
    let src = vec![vec![vec![0, 16, 0], vec![0, 10, 0]]];
    let sizes = vec![vec![vec![16, 16, 8], vec![10, 10, 0]]];
    let request = RangeRequest {
        keys: &keys,
        dst_offsets: &dst,
        src_offsets: &src,
        sizes: &sizes,
    };
    let mut big = vec![FILL; 400];
    let got = client.get_into_ranges(&mut [&mut big[..]], &request);
    let refused = Err(ErrorCode::InvalidParams);
    assert_eq!(
        got,
        vec![vec![
            vec![refused, refused, Ok(8)],
            vec![refused, Ok(10), Ok(0)]
        ]]
    );
    assert!(
        big[..30].iter().all(|&x| x == FILL),
        "refused fragments write nothing"
    );
    assert_eq!(&big[100..108], &a[..8]);
    assert_eq!(&big[200..210], &b[10..20]);
    assert!(
        mooncake_rs::error::last_error_message().contains("overlap"),
        "{}",
        mooncake_rs::error::last_error_message()
    );

    // Raw buffers that share bytes: fragments overlapping across them are refused as well.
    let mut raw = vec![FILL; 64];
    let base = raw.as_mut_ptr() as usize;
    let bufs = [
        mooncake_rs::client::Buf::new(base, 32),
        mooncake_rs::client::Buf::new(base + 16, 48),
    ];
    let keys = vec![vec!["ov-a".to_string()], vec!["ov-b".to_string()]];
    let dst = vec![vec![vec![16]], vec![vec![0]]];
    let src = vec![vec![vec![0]], vec![vec![0]]];
    let sizes = vec![vec![vec![8]], vec![vec![8]]];
    let request = RangeRequest {
        keys: &keys,
        dst_offsets: &dst,
        src_offsets: &src,
        sizes: &sizes,
    };
    // SAFETY: both buffers lie inside `raw`, writable for the call.
    let got = unsafe { client.get_into_ranges_raw(&bufs, &request) };
    assert_eq!(got, vec![vec![vec![refused]], vec![vec![refused]]]);
    assert!(raw.iter().all(|&x| x == FILL));
}

#[test]
fn pinned_objects_keep_their_bytes_through_forced_removal() {
    let client = embedded(4 * MIB as u64, 0);
    let value = pattern(MIB, 9);
    client.put_from("pinned", &value, &cfg()).unwrap();
    let pin = client.pin(&["pinned"]).pop().unwrap().unwrap();
    client.remove("pinned", true).unwrap();
    assert_eq!(
        client.is_exist("pinned"),
        Ok(false),
        "removal hides the key at once"
    );
    // fill the segment: the pinned bytes must not be handed out
    for i in 0..8 {
        let _ = client.put_from(&format!("fill{i}"), &pattern(MIB, 100 + i as u8), &cfg());
    }
    let mut out = vec![0u8; MIB];
    assert_eq!(client.read_pinned(&pin, &mut out), Ok(MIB as u64));
    assert_eq!(out, value);
    client.unpin(&[pin.pin_id]).unwrap();
    client.remove_all(true).unwrap();
    // The pin also granted the usual 10 s read lease, so the pinned range stays held until
    // that lease ends (checked with a short lease in tests/multi_process.rs); the rest of the
    // segment is free again.
    for i in 0..3 {
        client
            .put_from(&format!("again{i}"), &pattern(MIB, i), &cfg())
            .unwrap();
    }
}

#[test]
fn torn_down_client_refuses_everything() {
    let client = embedded(MIB as u64, 0);
    client.put_from("k", b"v", &cfg()).unwrap();
    assert_eq!(client.health_check(), 0);
    client.teardown();
    client.teardown();
    assert_eq!(client.health_check(), 1);
    assert_eq!(
        client.put_from("k", b"v", &cfg()),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(
        client.get_into("k", &mut [0u8; 1]),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(
        client.batch_is_exist(&["k"]),
        vec![Err(ErrorCode::InvalidParams)]
    );
}

#[test]
fn register_and_unregister_buffers() {
    let client = embedded(MIB as u64, 0);
    let buf = vec![0u8; 8192];
    let addr = buf.as_ptr() as usize;
    assert_eq!(client.register_buffer(0, 10), Err(ErrorCode::InvalidParams));
    assert_eq!(
        client.register_buffer(addr, 0),
        Err(ErrorCode::InvalidParams)
    );
    client.register_buffer(addr, buf.len()).unwrap();
    assert_eq!(
        client.register_buffer(addr + 100, 10),
        Err(ErrorCode::InvalidParams),
        "overlap"
    );
    client.unregister_buffer(addr).unwrap();
    assert_eq!(
        client.unregister_buffer(addr),
        Err(ErrorCode::InvalidParams)
    );
}

#[test]
fn setup_validation() {
    let bad = |c: SetupConfig| Client::setup(c).err();
    let base = SetupConfig {
        master_server_addr: "embedded".into(),
        ..SetupConfig::default()
    };
    assert_eq!(
        bad(SetupConfig {
            local_hostname: String::new(),
            ..base.clone()
        }),
        Some(ErrorCode::InvalidParams)
    );
    assert_eq!(
        bad(SetupConfig {
            global_segment_size: 100,
            ..base.clone()
        }),
        Some(ErrorCode::InvalidParams)
    );
    assert_eq!(
        bad(SetupConfig {
            local_buffer_size: 1,
            ..base.clone()
        }),
        Some(ErrorCode::InvalidParams)
    );
    assert_eq!(
        bad(SetupConfig {
            protocol: "ib".into(),
            ..base
        }),
        Some(ErrorCode::InvalidParams)
    );
}

#[test]
fn an_embedded_store_keeps_its_objects_past_the_client_ttl() {
    // The in-process master expires clients that stop pinging after client_ttl (10 s by
    // default) and drops their objects; an embedded client must ping it like a remote one.
    let client = embedded(16 * MIB as u64, 0);
    client.put_from("durable", b"still here", &cfg()).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(12));
    let mut out = vec![0u8; 10];
    assert_eq!(client.get_into("durable", &mut out), Ok(10));
    assert_eq!(&out, b"still here");
}
