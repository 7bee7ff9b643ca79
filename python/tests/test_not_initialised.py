"""Spec §0.3: every method before setup, after close and after a failed setup returns the
not-initialised value instead of crashing."""

import numpy as np
import pytest

from conftest import INVALID_PARAMS, free_port, setup_store

E = INVALID_PARAMS
KEYS = ["a", "b"]
# Real, mapped addresses: only the not-initialised check may produce these values
# (unmapped ones would get -600 from the address check even on a set-up store).
_MEMORY = np.zeros(64, np.uint8)
A = _MEMORY.ctypes.data
B = A + 32
PTRS = [A, B]
SIZES = [16, 16]


def calls(store_module):
    """(name, args, kwargs, expected) for every non-tensor method."""
    cfg = store_module.ReplicateConfig()
    return [
        ("health_check", (), {}, 1),
        ("get_hostname", (), {}, ""),
        ("get", ("a",), {}, b""),
        ("get_batch", (KEYS,), {}, [b""]),
        ("get_batch", ([],), {}, [b""]),
        ("get_buffer", ("a",), {}, None),
        ("batch_get_buffer", (KEYS,), {}, [None, None]),
        ("put", ("a", b"xyz"), {}, E),
        ("put", ("a", b"xyz", cfg), {}, E),
        ("put_parts", ("a", b"x", b"y"), {}, E),
        ("put_batch", (KEYS, [b"x", b"y"]), {}, E),
        ("put_from", ("a", A, 16), {}, E),
        ("batch_put_from", (KEYS, PTRS, SIZES), {}, [E, E]),
        ("get_into", ("a", A, 16), {}, E),
        ("batch_get_into", (KEYS, PTRS, SIZES), {}, [E, E]),
        ("register_buffer", (A, 16), {}, E),
        ("unregister_buffer", (A,), {}, E),
        ("batch_put_from_multi_buffers", (KEYS, [[A], [B]], [[16], [16]]), {}, []),
        ("batch_get_into_multi_buffers", (KEYS, [[A], [B]], [[16], [16]]), {}, [E, E]),
        ("get_into_ranges", ([A], [["a", "b"]], [[[0, 4], [8]]], [[[0, 0], [0]]],
                             [[[4, 4], [4]]]), {}, [[[E, E], [E]]]),
        ("batch_get_session_start", (KEYS,), {}, []),
        ("batch_get_into_multi_buffer_ranges", (KEYS, [[A], [B]], [[16], [16]],
                                                [[0], [0]]), {}, []),
        ("batch_get_session_end", (KEYS,), {}, -1),
        ("batch_put_session_start", (KEYS, SIZES), {}, []),
        ("batch_put_from_multi_buffer_ranges", (KEYS, [[A], [B]], [[16], [16]],
                                                [[0], [0]]), {}, []),
        ("batch_put_session_end", (KEYS,), {}, []),
        ("batch_put_session_revoke", (KEYS,), {}, []),
        ("is_exist", ("a",), {}, E),
        ("batch_is_exist", (KEYS,), {}, [E, E]),
        ("get_size", ("a",), {}, E),
        ("remove", ("a",), {}, E),
        ("remove", ("a",), {"force": True}, E),
        ("remove_by_regex", ("^a",), {}, E),
        ("remove_all", (), {}, E),
        ("batch_remove", (KEYS,), {}, [E, E]),
        ("upsert", ("a", b"xyz"), {}, E),
        ("upsert_parts", ("a", b"x", b"y"), {}, E),
        ("upsert_batch", (KEYS, [b"x", b"y"]), {}, E),
        ("upsert_from", ("a", A, 16), {}, E),
        ("batch_upsert_from", (KEYS, PTRS, SIZES), {}, [E, E]),
        ("get_offload_rpc_read_count", (), {}, 0),
    ]


# Out of scope for mooncake-rs (replica-descriptor, task and segment-mount APIs): when
# present they must give the recommended not-initialised values.
OPTIONAL_CALLS = [
    ("get_replica_desc", ("a",), []),
    ("batch_replica_clear", (KEYS,), []),
    ("batch_get_replica_desc", (KEYS,), {}),
    ("create_copy_task", ("a", ["seg"]), ((0, 0), E)),
    ("create_move_task", ("a", "s1", "s2"), ((0, 0), E)),
    ("query_task", ((1, 2),), (None, E)),
    ("mount_segment", ("/dev/null", 4096), {"ret": -1, "segment_ids": []}),
]


@pytest.fixture(params=["never_set_up", "after_close", "after_failed_setup"])
def uninitialised(request, store_module, master):
    s = store_module.MooncakeDistributedStore()
    if request.param == "after_close":
        setup_store(s, master)
        assert s.close() == 0
    elif request.param == "after_failed_setup":
        dead_master = f"127.0.0.1:{free_port()}"
        rc = s.setup("localhost", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", dead_master)
        assert rc < 0
    yield request.param, s
    assert s.close() == 0


def test_every_method_gives_its_not_initialised_value(uninitialised, store_module):
    state, s = uninitialised
    wrong = []
    for name, args, kwargs, expected in calls(store_module):
        if name == "get_hostname" and state == "after_failed_setup":
            continue  # the hostname setup last tried, or ""
        got = getattr(s, name)(*args, **kwargs)
        if got != expected:
            wrong.append(f"{name}{args}: expected {expected!r}, got {got!r}")
    assert not wrong, "\n".join(wrong)


def test_put_from_with_metadata_fails(uninitialised):
    _, s = uninitialised
    assert s.put_from_with_metadata("a", A, B, 16, 8) < 0


def test_empty_batches_not_initialised(uninitialised):
    _, s = uninitialised
    assert s.batch_is_exist([]) == []
    assert s.batch_put_from([], [], []) == []
    assert s.batch_get_into([], [], []) == []


def test_optional_apis_absent_or_not_initialised(uninitialised):
    _, s = uninitialised
    for name, args, expected in OPTIONAL_CALLS:
        if hasattr(s, name):
            assert getattr(s, name)(*args) == expected, name
