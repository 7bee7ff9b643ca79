"""Copying put/get (spec §4.2), existence/size/removal (§4.7) and BufferHandle (§5.1)."""

import os

import numpy as np
import pytest

from conftest import (
    INVALID_PARAMS, OBJECT_HAS_LEASE, OBJECT_NOT_FOUND, lease_sleep, unique_key,
)


def keys(n, prefix="k"):
    base = unique_key(prefix)
    return [f"{base}-{i}" for i in range(n)]


# ---- put / get -----------------------------------------------------------------------------

@pytest.mark.parametrize("make", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8)])
def test_put_get_any_byte_buffer(store, make):
    key, data = unique_key(), os.urandom(10000)
    assert store.put(key, make(data)) == 0
    assert store.get(key) == data
    assert store.get_size(key) == len(data)


def test_put_keywords_and_unknown_keyword(store, store_module):
    key = unique_key()
    assert store.put(key=key, value=b"kw", config=store_module.ReplicateConfig()) == 0
    assert store.get(key) == b"kw"
    with pytest.raises(TypeError, match="key_arg_name_error"):
        store.put(key_arg_name_error=key, value=b"kw")


def test_put_existing_key_returns_0_and_keeps_the_old_value(store):
    key = unique_key()
    assert store.put(key, b"first") == 0
    assert store.put(key, b"second!") == 0
    assert store.get(key) == b"first"


def test_put_rejects(store):
    assert store.put(unique_key(), b"") == INVALID_PARAMS
    assert store.put("", b"x") == INVALID_PARAMS
    with pytest.raises(TypeError):
        store.put(unique_key(), "a str is not a buffer")


def test_put_prefer_alloc_in_same_node_is_rejected(store, store_module):
    cfg = store_module.ReplicateConfig()
    cfg.prefer_alloc_in_same_node = True
    assert store.put(unique_key(), b"x", cfg) == INVALID_PARAMS


def test_put_non_byte_buffer_is_whole_or_refused(store):
    key, arr = unique_key(), np.arange(4, dtype=np.float32)
    try:
        rc = store.put(key, arr)
    except (TypeError, BufferError, ValueError):
        return
    assert rc == 0
    assert store.get(key) == arr.tobytes()


def test_put_replica_num_two_with_one_segment_is_best_effort(store, store_module):
    cfg = store_module.ReplicateConfig()
    cfg.replica_num = 2
    key = unique_key()
    assert store.put(key, b"twice?", cfg) == 0
    assert store.get(key) == b"twice?"


def test_get_missing_is_empty_bytes(store):
    assert store.get(unique_key("missing")) == b""


def test_put_parts(store, store_module):
    key = unique_key()
    meta, payload = b"M" * 28, os.urandom(4096)
    assert store.put_parts(key, meta, bytearray(payload), config=store_module.ReplicateConfig()) == 0
    assert store.get(key) == meta + payload


def test_put_parts_zero_total_stores_nothing(store):
    for parts in [(), (b"",), (b"", bytearray())]:
        key = unique_key()
        assert store.put_parts(key, *parts) == 0
        assert store.is_exist(key) == 0


def test_put_parts_rejects_non_bytes_parts(store):
    with pytest.raises(RuntimeError, match="1-D bytes-like"):
        store.put_parts(unique_key(), np.zeros((2, 2), dtype=np.uint8))
    with pytest.raises(RuntimeError, match="1-D bytes-like"):
        store.put_parts(unique_key(), np.zeros(4, dtype=np.float32))
    with pytest.raises(TypeError):
        store.put_parts(unique_key(), "text")


def test_put_batch_and_get_batch(store, store_module):
    ks = keys(5)
    values = [os.urandom(100 + i) for i in range(5)]
    assert store.put_batch(keys=ks, values=values, config=store_module.ReplicateConfig()) == 0
    assert store.get_batch(ks) == values
    missing = unique_key("missing")
    assert store.get_batch([ks[0], missing]) == [values[0], b""]


def test_put_batch_errors(store):
    ks = keys(2)
    assert store.put_batch(ks, [b"only-one"]) == INVALID_PARAMS
    assert store.put_batch([], []) == 0
    assert store.put_batch(ks, [b"ok", b""]) == INVALID_PARAMS
    assert store.batch_is_exist(ks) == [0, 0]


def test_put_batch_duplicate_keys_first_value_wins(store):
    key = unique_key()
    assert store.put_batch([key, key], [b"first", b"second"]) == 0
    assert store.get(key) == b"first"


def test_get_batch_empty_is_one_empty_bytes(store):
    assert store.get_batch([]) == [b""]


# ---- get_buffer / batch_get_buffer / BufferHandle ------------------------------------------

def test_get_buffer_handle(store):
    key, data = unique_key(), os.urandom(1000)
    assert store.put(key, data) == 0
    h = store.get_buffer(key)
    assert h is not None
    assert isinstance(h.ptr(), int) and h.ptr() != 0
    assert h.size() == len(h) == len(data)
    assert bool(h)
    assert bytes(h) == data
    mv = memoryview(h)
    assert (mv.format, mv.itemsize, mv.ndim, mv.shape, mv.strides) == ("b", 1, 1, (1000,), (1,))
    assert mv.readonly is False
    assert mv[:28].tobytes() == data[:28]
    assert mv[10:20].tobytes() == data[10:20]
    with pytest.raises(TypeError):
        h[0]


def test_buffer_handle_numpy_zero_copy_and_writable(store):
    key, data = unique_key(), bytes(range(256)) * 4
    assert store.put(key, data) == 0
    h = store.get_buffer(key)
    arr = np.asarray(h)
    assert arr.dtype == np.int8
    assert arr.ctypes.data == h.ptr()
    u8 = np.frombuffer(h, dtype=np.uint8)
    assert u8.ctypes.data == h.ptr()
    assert u8.tobytes() == data
    memoryview(h).cast("B")[0] = 0xFF
    assert bytes(h)[0] == 0xFF
    assert np.frombuffer(h, dtype=np.uint8, offset=28, count=4).tobytes() == data[28:32]


def test_buffer_handle_outlives_close(store):
    key, data = unique_key(), os.urandom(512)
    assert store.put(key, data) == 0
    h = store.get_buffer(key)
    view = memoryview(h)
    assert store.close() == 0
    assert bytes(h) == data
    assert view.tobytes() == data


def test_get_buffer_missing_is_none(store):
    assert store.get_buffer(unique_key("missing")) is None


def test_batch_get_buffer(store):
    ks = keys(2)
    values = [os.urandom(300), os.urandom(700)]
    assert store.put_batch(ks, values) == 0
    handles = store.batch_get_buffer(ks)
    assert [h.size() for h in handles] == [300, 700]
    assert [bytes(h) for h in handles] == values
    mixed = store.batch_get_buffer([ks[0], unique_key("missing")])
    assert bytes(mixed[0]) == values[0] and mixed[1] is None
    assert store.batch_get_buffer([unique_key("missing")]) == [None]
    assert store.batch_get_buffer([]) == []


# ---- existence, size, removal --------------------------------------------------------------

def test_is_exist_and_batch_is_exist(store):
    ks = keys(20)
    assert store.put_batch(ks[:10], [b"v"] * 10) == 0
    assert store.batch_is_exist(keys=ks) == [1] * 10 + [0] * 10
    assert store.batch_is_exist([ks[0]]) == [1]
    assert store.batch_is_exist(["non_existent_key"]) == [0]
    assert store.batch_is_exist([]) == []
    assert store.is_exist(ks[0]) == 1
    assert store.is_exist(ks[19]) == 0


def test_get_size_missing(store):
    assert store.get_size(unique_key("missing")) == OBJECT_NOT_FOUND


def test_remove_right_after_put(store):
    key = unique_key()
    assert store.put(key, b"x") == 0
    assert store.remove(key) == 0
    assert store.is_exist(key) == 0
    assert store.remove(key) == OBJECT_NOT_FOUND


def test_remove_during_lease_then_after_ttl(store):
    key = unique_key()
    assert store.put(key, b"leased") == 0
    assert store.get(key) == b"leased"
    assert store.remove(key) == OBJECT_HAS_LEASE
    lease_sleep()
    assert store.remove(key) == 0


def test_remove_force_skips_the_lease(store):
    key = unique_key()
    assert store.put(key, b"leased") == 0
    assert store.is_exist(key) == 1
    assert store.remove(key, force=True) == 0
    assert store.get(key) == b""


def test_remove_by_regex(store):
    prefix = unique_key("rx")
    ks = [f"{prefix}-{i}" for i in range(3)]
    other = unique_key("other")
    assert store.put_batch(ks + [other], [b"v"] * 4) == 0
    assert store.remove_by_regex(f"^{prefix}-") == 3
    assert store.batch_is_exist(ks + [other]) == [0, 0, 0, 1]
    assert store.remove_by_regex("([unclosed") == INVALID_PARAMS


def test_remove_by_regex_skips_leased_unless_forced(store):
    prefix = unique_key("rxl")
    ks = [f"{prefix}-{i}" for i in range(2)]
    assert store.put_batch(ks, [b"v", b"w"]) == 0
    assert store.get(ks[0]) == b"v"
    assert store.remove_by_regex(f"^{prefix}") == 1
    assert store.remove_by_regex(f"^{prefix}", force=True) == 1


def test_batch_remove(store):
    a, b = keys(2)
    assert store.put_batch([a, b], [b"a", b"b"]) == 0
    assert store.batch_remove([a, a, b, unique_key("missing")]) == [0, OBJECT_NOT_FOUND, 0,
                                                                    OBJECT_NOT_FOUND]
    assert store.batch_remove([]) == []


def test_remove_all(store):
    ks = keys(4)
    assert store.put_batch(ks, [b"v"] * 4) == 0
    assert store.remove_all() >= 4
    assert store.batch_is_exist(ks) == [0] * 4
    assert store.remove_all(force=True) >= 0
