"""Get and put sessions (spec §4.6): layer-wise ranged reads and writes."""

import numpy as np

from conftest import INVALID_PARAMS, OBJECT_ALREADY_EXISTS, OBJECT_NOT_FOUND, ptr, unique_key


def keys(n):
    base = unique_key("sess")
    return [f"{base}-{i}" for i in range(n)]


def test_get_session_ranges(store, registered):
    ks = keys(2)
    values = [bytes(range(200)), bytes(range(200, 0, -1))]
    assert store.put_batch(ks, values) == 0
    assert store.batch_get_session_start(ks) == [0, 0]
    out = registered(4096)
    all_ptrs = [[ptr(out, 0), ptr(out, 100)], [ptr(out, 1000)]]
    all_sizes = [[10, 20], [50]]
    all_src = [[0, 150], [100]]
    got = store.batch_get_into_multi_buffer_ranges(ks, all_ptrs, all_sizes, all_src)
    assert got == [30, 50]
    assert out[0:10].tobytes() == values[0][0:10]
    assert out[100:120].tobytes() == values[0][150:170]
    assert out[1000:1050].tobytes() == values[1][100:150]
    assert store.batch_get_session_end(ks) == 0
    assert store.batch_get_session_end(ks) == 0
    again = store.batch_get_into_multi_buffer_ranges(ks, all_ptrs, all_sizes, all_src)
    assert again == [INVALID_PARAMS] * 2


def test_get_session_errors(store, registered):
    key, missing = keys(2)
    assert store.put(key, b"x" * 100) == 0
    assert store.batch_get_session_start([key, missing]) == [0, OBJECT_NOT_FOUND]
    assert store.batch_get_session_start([]) == []
    out = registered(4096)
    past_end = store.batch_get_into_multi_buffer_ranges([key], [[ptr(out)]], [[10]], [[95]])
    assert past_end == [INVALID_PARAMS]
    mismatch = store.batch_get_into_multi_buffer_ranges([key], [[ptr(out)]], [[10, 10]], [[0]])
    assert mismatch == [INVALID_PARAMS]
    top = store.batch_get_into_multi_buffer_ranges([key, missing], [[ptr(out)]], [[10]], [[0]])
    assert top == [INVALID_PARAMS] * 2
    assert store.batch_get_into_multi_buffer_ranges([key], [[ptr(out)]], [[10]], [[90]]) == [10]
    assert store.batch_get_session_end([key]) == 0


def test_put_session_write_then_end(store, registered):
    ks = keys(2)
    src = registered(4096)
    src[:] = np.arange(4096, dtype=np.uint32).astype(np.uint8)
    assert store.batch_put_session_start(ks, [100, 50]) == [0, 0]
    assert store.batch_put_session_start(ks[:1], [100]) == [INVALID_PARAMS]
    assert store.batch_is_exist(ks) == [0, 0]
    got = store.batch_put_from_multi_buffer_ranges(
        ks, [[ptr(src, 0), ptr(src, 500)], [ptr(src, 1000)]], [[60, 40], [50]], [[0, 60], [0]])
    assert got == [100, 50]
    overflow = store.batch_put_from_multi_buffer_ranges(ks[1:], [[ptr(src)]], [[10]], [[45]])
    assert overflow == [INVALID_PARAMS]
    assert store.batch_put_session_end(ks) == [0, 0]
    assert store.get(ks[0]) == src[0:60].tobytes() + src[500:540].tobytes()
    assert store.get(ks[1]) == src[1000:1050].tobytes()
    assert store.batch_put_session_end(ks) == [INVALID_PARAMS] * 2


def test_put_session_errors_and_revoke(store, registered):
    existing, fresh = keys(2)
    assert store.put(existing, b"here") == 0
    assert store.batch_put_session_start([existing, fresh], [4, 64]) == [OBJECT_ALREADY_EXISTS, 0]
    assert store.batch_put_session_start([fresh], [1, 2]) == [INVALID_PARAMS]
    assert store.batch_put_session_start([], []) == []
    assert store.batch_put_session_revoke([fresh]) == [0]
    assert store.is_exist(fresh) == 0
    assert store.batch_put_session_revoke([fresh]) == [INVALID_PARAMS]
    src = registered(64)
    written = store.batch_put_from_multi_buffer_ranges([fresh], [[ptr(src)]], [[8]], [[0]])
    assert written == [INVALID_PARAMS]
