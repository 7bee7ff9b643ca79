"""Upsert family (spec §4.8) and the soft-pin rules of put/upsert (§2, §3)."""

import pytest

from conftest import INVALID_PARAMS, MIB, ptr, unique_key


def pin_config(store_module, action, ttl=None):
    cfg = store_module.ReplicateConfig()
    cfg.soft_pin_action = getattr(store_module.SoftPinAction, action)
    cfg.soft_pin_ttl_ms = ttl
    return cfg


def test_upsert_inserts_and_updates(store):
    key = unique_key()
    assert store.upsert(key, b"one") == 0
    assert store.get(key) == b"one"
    assert store.upsert(key, b"two") == 0
    assert store.get(key) == b"two"
    assert store.upsert(key, b"a longer third value") == 0
    assert store.get(key) == b"a longer third value"
    assert store.upsert(key, b"") == INVALID_PARAMS


def test_upsert_ignores_read_leases(store):
    key = unique_key()
    assert store.put(key, b"old") == 0
    assert store.get(key) == b"old"
    assert store.upsert(key, b"new") == 0
    assert store.get(key) == b"new"


def test_upsert_parts_and_batch(store):
    key = unique_key()
    assert store.upsert_parts(key, b"ab", bytearray(b"cd")) == 0
    assert store.upsert_parts(key, b"xy", b"zw") == 0
    assert store.get(key) == b"xyzw"
    assert store.upsert_parts(unique_key()) == 0
    k1, k2 = unique_key(), unique_key()
    assert store.put(k1, b"before") == 0
    assert store.upsert_batch([k1, k2], [b"after", b"fresh"]) == 0
    assert store.get_batch([k1, k2]) == [b"after", b"fresh"]
    assert store.upsert_batch([k1], [b"a", b"b"]) == INVALID_PARAMS


def test_upsert_from_and_batch_upsert_from(store, registered):
    buf = registered(MIB)
    buf[:4096] = 1
    buf[4096:8192] = 2
    key = unique_key()
    assert store.upsert_from(key, ptr(buf), 4096) == 0
    assert store.upsert_from(key, ptr(buf, 4096), 4096) == 0
    assert store.get(key) == bytes([2]) * 4096
    zero = unique_key()
    assert store.upsert_from(zero, ptr(buf), 0) == 0
    assert store.is_exist(zero) == 0
    ks = [key, unique_key()]
    assert store.batch_upsert_from(ks, [ptr(buf), ptr(buf, 4096)], [100, 200]) == [0, 0]
    assert store.get_batch(ks) == [bytes([1]) * 100, bytes([2]) * 200]
    assert store.batch_upsert_from(ks, [ptr(buf)], [100]) == [INVALID_PARAMS] * 2


def test_soft_pin_rules(store, store_module):
    key = unique_key()
    assert store.put(key, b"pinned", pin_config(store_module, "ENABLE", 1000)) == 0
    assert store.upsert(key, b"x", pin_config(store_module, "PRESERVE", 1000)) == INVALID_PARAMS
    assert store.upsert(key, b"x", pin_config(store_module, "DISABLE", 1000)) == INVALID_PARAMS
    assert store.upsert(key, b"y", store_module.ReplicateConfig()) == 0
    assert store.upsert(key, b"z", pin_config(store_module, "DISABLE")) == 0
    assert store.get(key) == b"z"


@pytest.mark.parametrize("action, ttl, expected", [
    ("ENABLE", None, 0), ("ENABLE", 5000, 0), ("PRESERVE", 10, INVALID_PARAMS),
    ("DISABLE", 10, INVALID_PARAMS), ("ENABLE", 25 * 3600 * 1000, INVALID_PARAMS),
])
def test_soft_pin_on_put(store, store_module, action, ttl, expected):
    assert store.put(unique_key(), b"v", pin_config(store_module, action, ttl)) == expected


def test_hard_pin_put(store, store_module):
    cfg = store_module.ReplicateConfig()
    cfg.with_hard_pin = True
    key = unique_key()
    assert store.put(key, b"hard", cfg) == 0
    assert store.get(key) == b"hard"
