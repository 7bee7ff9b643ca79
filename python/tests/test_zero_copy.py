"""Registered numpy buffers as KV memory (spec §4.3-4.5): register/unregister, *_from, *_into,
multi-buffer, put_from_with_metadata and get_into_ranges."""

import mmap

import numpy as np
import pytest

from conftest import INVALID_PARAMS, MIB, OBJECT_NOT_FOUND, ptr, unique_key

KEY1 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
KEY2 = b"abcdefghijklmnopqrstuvwxyz0123456789"


def keys(n):
    base = unique_key()
    return [f"{base}-{i}" for i in range(n)]


def fill_random(arr, seed):
    arr[:] = np.random.default_rng(seed).integers(0, 256, arr.size, dtype=np.uint8)


# ---- register / unregister -----------------------------------------------------------------

def test_register_two_buffers_then_unregister(store):
    a, b = np.zeros(4096, np.uint8), np.zeros(8192, np.uint8)
    assert store.register_buffer(ptr(a), a.nbytes) == 0
    assert store.register_buffer(buffer_ptr=ptr(b), size=b.nbytes) == 0
    assert store.unregister_buffer(ptr(a)) == 0
    assert store.unregister_buffer(buffer_ptr=ptr(b)) == 0


def test_register_rejects(store):
    a = np.zeros(8192, np.uint8)
    assert store.register_buffer(0, 4096) == INVALID_PARAMS
    assert store.register_buffer(ptr(a), 0) == INVALID_PARAMS
    assert store.register_buffer(ptr(a), a.nbytes) == 0
    try:
        assert store.register_buffer(ptr(a), a.nbytes) == INVALID_PARAMS
        assert store.register_buffer(ptr(a, 4096), 4096) == INVALID_PARAMS
    finally:
        assert store.unregister_buffer(ptr(a)) == 0
    assert store.unregister_buffer(ptr(a)) == INVALID_PARAMS


@pytest.mark.parametrize("bad", [-1, 1 << 64, 1.0, None, "0x1000"])
def test_register_bad_types(store, bad):
    with pytest.raises(TypeError):
        store.register_buffer(bad, 4096)


# ---- put_from / get_into -------------------------------------------------------------------

def test_put_from_then_get(store, registered, store_module):
    buf = registered(MIB)
    fill_random(buf, 1)
    key = unique_key()
    cfg = store_module.ReplicateConfig()
    assert store.put_from(key=key, buffer_ptr=ptr(buf), size=4096, config=cfg) == 0
    assert store.get(key) == buf[:4096].tobytes()
    key2 = unique_key()
    assert store.put_from(key2, ptr(buf, 4096), 1000, cfg) == 0
    assert store.get(key2) == buf[4096:5096].tobytes()


def test_put_from_zero_size_stores_nothing(store, registered):
    buf = registered(4096)
    key = unique_key()
    assert store.put_from(key, ptr(buf), 0) == 0
    assert store.is_exist(key) == 0


def test_get_into(store, registered):
    src, dst = registered(MIB), registered(MIB)
    fill_random(src, 2)
    key = unique_key()
    assert store.put_from(key, ptr(src), 1000) == 0
    assert store.get_into(key, ptr(dst), dst.nbytes) == 1000
    assert dst[:1000].tobytes() == src[:1000].tobytes()
    assert store.get_into(key, ptr(dst), 500) == INVALID_PARAMS
    dst[:] = 0xAB
    assert store.get_into(unique_key("missing"), ptr(dst), dst.nbytes) == OBJECT_NOT_FOUND
    assert (dst == 0xAB).all()


def test_put_from_with_metadata(store, registered):
    data, meta = registered(4096), registered(4096)
    fill_random(data, 3)
    fill_random(meta, 4)
    key = unique_key()
    assert store.put_from_with_metadata(key, ptr(data), ptr(meta), 1000, 28) == 0
    assert store.get(key) == meta[:28].tobytes() + data[:1000].tobytes()
    key0 = unique_key()
    assert store.put_from_with_metadata(key0, ptr(data), ptr(meta), 0, 28) == 0
    assert store.is_exist(key0) == 0


# ---- batch_put_from / batch_get_into -------------------------------------------------------

def test_batch_put_from_and_batch_get_into(store, registered):
    src, dst = registered(3 * MIB), registered(3 * MIB)
    fill_random(src, 5)
    ks = keys(3)
    sizes = [MIB, 1000, 4096]
    ptrs = [ptr(src, i * MIB) for i in range(3)]
    assert store.batch_put_from(keys=ks, buffer_ptrs=ptrs, sizes=sizes) == [0, 0, 0]
    for i, k in enumerate(ks):
        assert store.get(k) == src[i * MIB:i * MIB + sizes[i]].tobytes()
    dptrs = [ptr(dst, i * MIB) for i in range(3)]
    assert store.batch_get_into(ks, dptrs, [MIB] * 3) == sizes
    for i in range(3):
        assert dst[i * MIB:i * MIB + sizes[i]].tobytes() == src[i * MIB:i * MIB + sizes[i]].tobytes()


def test_batch_put_from_errors(store, registered, store_module):
    src = registered(3 * MIB)
    ks = keys(2)
    three = [ptr(src, i * MIB) for i in range(3)]
    assert store.batch_put_from(ks, three, [16] * 3) == [INVALID_PARAMS] * 2
    assert store.batch_put_from([], [], []) == []
    cfg = store_module.ReplicateConfig()
    cfg.group_ids = ["g"]
    assert store.batch_put_from(ks, three[:2], [16, 16], cfg) == [INVALID_PARAMS] * 2
    assert store.batch_is_exist(ks) == [0, 0]
    cfg.group_ids = ["g", ""]
    assert store.batch_put_from(ks, three[:2], [16, 16], cfg) == [0, 0]


def test_batch_put_from_existing_key_is_success(store, registered):
    src = registered(4096)
    src[:] = 7
    key = unique_key()
    assert store.put(key, b"old") == 0
    assert store.batch_put_from([key], [ptr(src)], [100]) == [0]
    assert store.get(key) == b"old"


def test_batch_get_into_errors(store, registered):
    src, dst = registered(4096), registered(2 * 4096)
    src[:] = 9
    ks = keys(2)
    assert store.batch_put_from(ks, [ptr(src), ptr(src)], [100, 200]) == [0, 0]
    assert store.batch_get_into(ks, [ptr(dst)], [4096]) == [INVALID_PARAMS] * 2
    assert store.batch_get_into([], [], []) == []
    missing = unique_key("missing")
    got = store.batch_get_into([missing, ks[1]], [ptr(dst), ptr(dst, 4096)], [4096, 4096])
    assert got == [OBJECT_NOT_FOUND, 200]
    assert store.batch_get_into([ks[1]], [ptr(dst)], [100]) == [INVALID_PARAMS]


# ---- multi-buffer --------------------------------------------------------------------------

def test_multi_buffer_put_and_get(store, registered, store_module):
    layers = [registered(64 * 1024) for _ in range(3)]
    for i, layer in enumerate(layers):
        fill_random(layer, 10 + i)
    ks = keys(2)
    block = 4096
    all_ptrs = [[ptr(layer, b * block) for layer in layers] for b in range(2)]
    all_sizes = [[block] * 3 for _ in range(2)]
    rc = store.batch_put_from_multi_buffers(ks, all_ptrs, all_sizes, store_module.ReplicateConfig())
    assert rc == [0, 0]
    for b, k in enumerate(ks):
        expected = b"".join(layer[b * block:(b + 1) * block].tobytes() for layer in layers)
        assert store.get(k) == expected
    outs = [registered(64 * 1024) for _ in range(3)]
    out_ptrs = [[ptr(o, b * block) for o in outs] for b in range(2)]
    assert store.batch_get_into_multi_buffers(ks, out_ptrs, all_sizes) == [3 * block] * 2
    for layer, out in zip(layers, outs):
        assert out[:2 * block].tobytes() == layer[:2 * block].tobytes()


def test_multi_buffer_errors(store, registered):
    buf = registered(64 * 1024)
    ks = keys(2)
    p = [[ptr(buf)], [ptr(buf, 4096)]]
    s = [[100], [200]]
    assert store.batch_put_from_multi_buffers(ks, p[:1], s) == [INVALID_PARAMS] * 2
    assert store.batch_put_from_multi_buffers(ks, [[ptr(buf), ptr(buf)], p[1]], s) == [INVALID_PARAMS] * 2
    assert store.batch_put_from_multi_buffers([], [], []) == []
    assert store.batch_put_from_multi_buffers(ks, p, s) == [0, 0]
    out = registered(64 * 1024)
    q = [[ptr(out)], [ptr(out, 4096)]]
    assert store.batch_get_into_multi_buffers(ks, q[:1], s) == [INVALID_PARAMS] * 2
    assert store.batch_get_into_multi_buffers([], [], []) == []
    assert store.batch_get_into_multi_buffers(ks, q, [[50], [200]]) == [INVALID_PARAMS, 200]
    missing = unique_key("missing")
    assert store.batch_get_into_multi_buffers([missing], q[:1], s[:1]) == [OBJECT_NOT_FOUND]
    assert store.batch_get_into_multi_buffers(ks, q, s, True) == [100, 200]


# ---- get_into_ranges -----------------------------------------------------------------------

@pytest.fixture
def ranged(store, registered):
    k1, k2 = unique_key("r1"), unique_key("r2")
    assert store.put(k1, KEY1) == 0
    assert store.put(k2, KEY2) == 0
    return k1, k2, registered(32), registered(32)


def test_get_into_ranges_spec_example(store, ranged):
    k1, k2, b0, b1 = ranged
    got = store.get_into_ranges(
        [ptr(b0), ptr(b1)],
        [[k1, k2], [k2, k1]],
        [[[0, 20], [8]], [[4], [16]]],
        [[[1, 30], [2]], [[0], [10]]],
        [[[4, 3], [5]], [[6], [4]]],
    )
    assert got == [[[4, 3], [5]], [[6], [4]]]
    b0, b1 = b0.tobytes(), b1.tobytes()
    assert b0[0:4] == KEY1[1:5]
    assert b0[8:13] == KEY2[2:7]
    assert b0[20:23] == KEY1[30:33]
    assert b1[4:10] == KEY2[0:6]
    assert b1[16:20] == KEY1[10:14]


def test_get_into_ranges_errors(store, ranged):
    k1, _, b0, _ = ranged
    one = [ptr(b0)]
    assert store.get_into_ranges(one, [[k1]], [[[31]]], [[[0]]], [[[4]]])[0][0][0] < 0
    assert store.get_into_ranges(one, [[k1]], [[[0]]], [[[len(KEY1) - 1]]], [[[4]]])[0][0][0] < 0
    got = store.get_into_ranges(one, [["missing-key", k1]], [[[0], [4]]], [[[0], [0]]],
                                [[[4], [4]]])
    assert got[0][0][0] < 0 and got[0][1] == [4]
    assert store.get_into_ranges(one, [[k1]], [[[0]]], [[[0, 1]]], [[[]]]) == [[[INVALID_PARAMS]]]
    assert store.get_into_ranges(one, [[k1]], [[[]]], [[[]]], [[[]]]) == [[[]]]
    got = store.get_into_ranges([ptr(b0), ptr(b0, 16)], [[k1]], [[[0]]], [[[0]]], [[[4]]])
    assert all(v == INVALID_PARAMS for row in got for entry in row for v in entry)


def test_get_into_ranges_unregistered_buffer(store, ranged):
    k1 = ranged[0]
    loose = np.zeros(32, np.uint8)
    got = store.get_into_ranges([ptr(loose)], [[k1]], [[[0]]], [[[0]]], [[[4]]])
    assert got == [[[INVALID_PARAMS]]]
    assert (loose == 0).all()


def test_get_into_ranges_top_level_mismatch_keeps_the_shape(store, ranged):
    """Spec §4.5: len(buffer_ptrs) rows; entry (i, j) has len(all_dst_offsets[i][j]) slots
    (1 where a list is missing), all -600 — the same set up or not."""
    k1, k2, b0, b1 = ranged
    args = ([ptr(b0), ptr(b1)], [[k1, k2]], [[[0, 4], [8]]], [[[0, 0], [0]]], [[[4, 4], [4]]])
    want = [[[INVALID_PARAMS, INVALID_PARAMS], [INVALID_PARAMS]], [[INVALID_PARAMS]]]
    assert store.get_into_ranges(*args) == want
    more_keys = ([ptr(b0)], [[k1, k2], [k1]], [[[0, 4], [8]]], [[[0, 0], [0]]], [[[4, 4], [4]]])
    assert store.get_into_ranges(*more_keys) == [[[INVALID_PARAMS, INVALID_PARAMS], [INVALID_PARAMS]]]
    assert (b0 == 0).all() and (b1 == 0).all()


# ---- addresses the store cannot use ---------------------------------------------------------

def test_bad_addresses_are_invalid_params_not_crashes(store):
    key = unique_key("addr")
    assert store.put(key, b"v" * 64) == 0
    unmapped = 4096  # the first pages of a process are never mapped
    overflowing = (1 << 64) - 16
    for addr in (0, unmapped, overflowing):
        assert store.get_into(key, addr, 64) == INVALID_PARAMS
        assert store.put_from(unique_key("addr"), addr, 64) == INVALID_PARAMS
        assert store.batch_get_into([key], [addr], [64]) == [INVALID_PARAMS]
        assert store.batch_get_into_multi_buffers([key], [[addr]], [[64]]) == [INVALID_PARAMS]
        assert store.batch_put_from_multi_buffers([unique_key("addr")], [[addr]], [[64]]) == [INVALID_PARAMS]
    assert store.register_buffer(unmapped, 4096) == INVALID_PARAMS
    assert store.is_exist(key) == 1


def test_read_only_memory_is_a_source_but_never_a_destination(store):
    region = mmap.mmap(-1, 4096, prot=mmap.PROT_READ)
    view = np.frombuffer(region, dtype=np.uint8)
    key = unique_key("ro")
    assert store.put(key, b"w" * 64) == 0
    assert store.get_into(key, view.ctypes.data, 64) == INVALID_PARAMS
    assert (view == 0).all()
    src = unique_key("ro-src")
    assert store.put_from(src, view.ctypes.data, 64) == 0
    assert store.get(src) == bytes(64)
    del view
    region.close()
