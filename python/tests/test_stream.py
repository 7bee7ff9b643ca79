"""On-stream calls (seed 000 in Python): tickets, HostStream/HostEvent, a CPU-only layerwise
pipeline, the blocking stream 0, and device streams refused with NOT_SUPPORTED here."""

import subprocess
import sys
import threading
import types

import numpy as np
import pytest

from conftest import INVALID_PARAMS, NOT_SUPPORTED, OBJECT_NOT_FOUND, ptr, unique_key

WAIT_S = 20.0
TRY_AGAIN = -9001


@pytest.fixture
def loaded(store, registered):
    """Three 4 KiB objects and a registered 64 KiB destination."""
    src = registered(3 * 4096)
    src[:] = np.random.default_rng(7).integers(0, 256, src.size, dtype=np.uint8)
    base = unique_key("strm")
    ks = [f"{base}-{i}" for i in range(3)]
    assert store.batch_put_from(ks, [ptr(src, i * 4096) for i in range(3)], [4096] * 3) == [0] * 3
    return ks, src, registered(64 * 1024)


def finish(ticket):
    """Waits (bounded) for a ticket and returns its status."""
    assert not isinstance(ticket, int), f"call failed with {ticket}"
    status = ticket.wait(timeout=WAIT_S)
    assert status != ticket.PENDING, "ticket still pending"
    return status


def test_ticket_constants(store_module):
    assert store_module.Ticket.PENDING == 1


def test_stream_zero_is_blocking(store, loaded):
    ks, src, dst = loaded
    t = store.batch_get_into_on_stream(ks, [ptr(dst, i * 4096) for i in range(3)], [4096] * 3, 0)
    assert t.status() == 0
    assert dst[:3 * 4096].tobytes() == src.tobytes()
    assert t.results() == [4096] * 3
    assert t.key_count() == 3
    t.release()


def test_host_stream_get_ticket(store, store_module, loaded):
    ks, src, dst = loaded
    s = store_module.HostStream()
    with store.batch_get_into_on_stream(ks, [ptr(dst, i * 4096) for i in range(3)],
                                        [4096] * 3, s) as t:
        assert finish(t) == 0
        assert t.wait() == 0
        assert t.status() == 0
        assert t.results() == [4096] * 3
        assert s.synchronize(timeout=WAIT_S) is True
        assert dst[:3 * 4096].tobytes() == src.tobytes()
    assert t.status() == INVALID_PARAMS


def test_release_then_status(store, store_module, loaded):
    ks, _, dst = loaded
    t = store.batch_get_into_on_stream(ks[:1], [ptr(dst)], [4096], store_module.HostStream())
    finish(t)
    t.release()
    t.release()
    assert t.status() == INVALID_PARAMS


def test_missing_key_leaves_destination_untouched(store, store_module, loaded):
    ks, _, dst = loaded
    dst[:] = 0xAB
    t = store.batch_get_into_on_stream([unique_key("missing")], [ptr(dst)], [4096],
                                       store_module.HostStream())
    assert finish(t) == OBJECT_NOT_FOUND
    assert t.results() == [OBJECT_NOT_FOUND]
    assert (dst == 0xAB).all()
    t.release()


def test_bad_arguments_return_invalid_params(store, store_module, loaded):
    ks, _, dst = loaded
    s = store_module.HostStream()
    assert store.batch_get_into_on_stream(ks, [ptr(dst)], [4096], s) == INVALID_PARAMS
    assert store.batch_put_from_on_stream(ks, [ptr(dst)], [4096], s) == INVALID_PARAMS


@pytest.mark.parametrize("stream", [
    types.SimpleNamespace(cuda_stream=1234),
    1234,
    types.SimpleNamespace(npu_stream=99),
])
def test_device_streams_not_supported_without_a_device(store, loaded, stream):
    ks, _, dst = loaded
    dst[:] = 0
    assert store.batch_get_into_on_stream(ks[:1], [ptr(dst)], [4096], stream) == NOT_SUPPORTED
    assert (dst == 0).all()


def test_ascend_stream_kind_not_supported(store, loaded):
    ks, _, dst = loaded
    rc = store.batch_get_into_on_stream(ks[:1], [ptr(dst)], [4096], 1234, stream_kind="ascend")
    assert rc == NOT_SUPPORTED


def test_multi_buffers_on_stream(store, store_module, loaded):
    ks, src, dst = loaded
    stride = 16384
    all_ptrs = [[ptr(dst, i * stride), ptr(dst, i * stride + 6000)] for i in range(3)]
    all_sizes = [[1000, 3096]] * 3
    t = store.batch_get_into_multi_buffers_on_stream(ks, all_ptrs, all_sizes,
                                                     store_module.HostStream())
    assert finish(t) == 0
    assert t.results() == [4096] * 3
    for i in range(3):
        obj = src[i * 4096:(i + 1) * 4096].tobytes()
        assert dst[i * stride:i * stride + 1000].tobytes() == obj[:1000]
        assert dst[i * stride + 6000:i * stride + 9096].tobytes() == obj[1000:]
    t.release()


def test_get_into_ranges_on_stream_inside_a_session(store, store_module, loaded):
    ks, src, dst = loaded
    assert store.batch_get_session_start(ks) == [0] * 3
    try:
        t = store.get_into_ranges_on_stream(ks, [[ptr(dst, i * 100)] for i in range(3)],
                                            [[50]] * 3, [[10]] * 3, store_module.HostStream())
        assert finish(t) == 0
        assert t.results() == [50] * 3
        for i in range(3):
            assert dst[i * 100:i * 100 + 50].tobytes() == src[i * 4096 + 10:i * 4096 + 60].tobytes()
        t.release()
    finally:
        assert store.batch_get_session_end(ks) == 0


def test_get_into_ranges_on_stream_without_session(store, store_module, loaded):
    ks, _, dst = loaded
    t = store.get_into_ranges_on_stream(ks[:1], [[ptr(dst)]], [[50]], [[0]],
                                        store_module.HostStream())
    if isinstance(t, int):
        assert t == INVALID_PARAMS
    else:
        assert finish(t) == INVALID_PARAMS
        t.release()


def test_puts_on_stream(store, store_module, registered):
    src = registered(4 * 4096)
    src[:] = np.random.default_rng(8).integers(0, 256, src.size, dtype=np.uint8)
    s = store_module.HostStream()
    k1, k2 = unique_key("sp"), unique_key("sp")
    t = store.batch_put_from_on_stream([k1], [ptr(src)], [4096], s, config=store_module.ReplicateConfig())
    assert finish(t) == 0
    t.release()
    t = store.batch_put_from_multi_buffers_on_stream(
        [k2], [[ptr(src, 4096), ptr(src, 3 * 4096)]], [[100, 200]], s)
    assert finish(t) == 0
    t.release()
    assert store.get(k1) == src[:4096].tobytes()
    assert store.get(k2) == src[4096:4196].tobytes() + src[3 * 4096:3 * 4096 + 200].tobytes()
    t0 = store.batch_put_from_on_stream([unique_key("sp0")], [ptr(src)], [10], 0)
    assert t0.status() == 0
    t0.release()


def test_host_stream_launch_order_and_events(store_module):
    s, other = store_module.HostStream(), store_module.HostStream()
    order, gate = [], threading.Event()
    s.launch(lambda: gate.wait(WAIT_S))
    for i in range(5):
        s.launch(lambda i=i: order.append(i))
    ev = store_module.HostEvent()
    ev.record(s)
    other.wait_event(ev)
    other.launch(lambda: order.append("after-event"))
    assert ev.query() is False
    gate.set()
    assert ev.wait(timeout=WAIT_S) is True
    assert ev.query() is True
    assert other.synchronize(timeout=WAIT_S) is True
    assert order == [0, 1, 2, 3, 4, "after-event"]


def test_host_stream_synchronize_times_out(store_module):
    s, gate = store_module.HostStream(), threading.Event()
    s.launch(lambda: gate.wait(WAIT_S))
    try:
        assert s.synchronize(timeout=0.05) is False
    finally:
        gate.set()
    assert s.synchronize(timeout=WAIT_S) is True


def test_layerwise_pipeline_on_host_stream(store, store_module, registered):
    layers, size = 6, 32 * 1024
    src = registered(layers * size)
    src[:] = np.random.default_rng(9).integers(0, 256, src.size, dtype=np.uint8)
    base = unique_key("layer")
    ks = [f"{base}-{i}" for i in range(layers)]
    assert store.batch_put_from(ks, [ptr(src, i * size) for i in range(layers)],
                                [size] * layers) == [0] * layers
    dst = registered(layers * size)
    load = store_module.HostStream()
    events, tickets, checked, errors = [], [], [], []
    for i in range(layers):
        t = store.batch_get_into_on_stream([ks[i]], [ptr(dst, i * size)], [size], load)
        assert not isinstance(t, int), t
        tickets.append(t)
        ev = store_module.HostEvent()
        ev.record(load)
        events.append(ev)

    def consumer():
        try:
            for i, ev in enumerate(events):
                assert ev.wait(timeout=WAIT_S) is True, f"layer {i}"
                got = dst[i * size:(i + 1) * size].tobytes()
                assert got == src[i * size:(i + 1) * size].tobytes(), f"layer {i}"
                checked.append(i)
        except BaseException as e:
            errors.append(repr(e))

    c = threading.Thread(target=consumer, daemon=True)
    c.start()
    c.join(WAIT_S * 2)
    assert not c.is_alive() and not errors, errors
    assert checked == list(range(layers))
    for t in tickets:
        # The event orders the data; the ticket becomes final at its release point, which
        # may trail the stream, so it is waited for.
        assert finish(t) == 0 and t.results() == [size]
        t.release()


def test_try_again_is_a_valid_call_result(store, store_module, loaded):
    """Under load a call may answer TRY_AGAIN; any int result is one of the documented codes."""
    ks, _, dst = loaded
    s = store_module.HostStream()
    tickets = [store.batch_get_into_on_stream(ks[:1], [ptr(dst)], [4096], s) for _ in range(32)]
    for t in tickets:
        if isinstance(t, int):
            assert t == TRY_AGAIN
        else:
            assert finish(t) == 0
            t.release()


CLOSE_RACE_PROGRAM = r"""
import sys, threading, time, uuid
import numpy as np
import mooncake.store as ms
s = ms.MooncakeDistributedStore()
assert s.setup("localhost", "P2PHANDSHAKE", 64 << 20, 64 << 20, "tcp", "", sys.argv[1]) == 0
k = "close-race-" + uuid.uuid4().hex
assert s.put(k, b"x" * 4096) == 0
buf = np.zeros(1 << 20, np.uint8)
assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
hs = ms.HostStream()
gate = threading.Event()
hs.launch(lambda: gate.wait(20))      # a queued callable that needs the GIL to finish
stop = threading.Event()
def issue():
    while not stop.is_set():
        try:
            s.batch_get_into_on_stream([k], [buf.ctypes.data], [4096], hs)
        except RuntimeError:          # the stream was closed
            return
t = threading.Thread(target=issue); t.start()
time.sleep(0.3)
closer = threading.Thread(target=hs.close); closer.start()
time.sleep(0.5)
gate.set()
closer.join(20); stop.set(); t.join(20)
print("done", closer.is_alive() or t.is_alive())
"""


def test_closing_a_host_stream_during_on_stream_calls_does_not_deadlock(master):
    """The last handle of a host stream may be the one an in-flight call holds; dropping it
    joins the stream thread, whose queued Python callable needs the GIL. Found by review: the
    interpreter hung 4 times out of 4 before the handles released the GIL on drop."""
    run = subprocess.run([sys.executable, "-c", CLOSE_RACE_PROGRAM, master.address],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "done False"
