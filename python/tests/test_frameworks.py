"""The call sequences of vLLM, LMCache and SGLang (spec §10.1), with numpy arrays standing in for
their KV caches."""

import os
import threading

import numpy as np
import pytest

from conftest import LOCAL_BUFFER_SIZE, SEGMENT_SIZE, free_port, ptr, unique_key

NO_AVAILABLE_HANDLE = -200


# ---- vLLM (MooncakeStoreConnector) ---------------------------------------------------------

def test_vllm_dedup_put_then_threaded_gets(store, registered, store_module):
    layers, block, blocks = 4, 8192, 6
    kv = [registered(block * blocks) for _ in range(layers)]
    for i, layer in enumerate(kv):
        layer[:] = np.random.default_rng(i).integers(0, 256, layer.size, dtype=np.uint8)
    base = unique_key("vllm")
    ks = [f"{base}-{b}" for b in range(blocks)]

    def ptrs_sizes(arrays, idx):
        return ([[ptr(a, b * block) for a in arrays] for b in idx],
                [[block] * len(arrays) for _ in idx])

    # First pass stores the first half; the second pass dedups and stores only the rest.
    for wanted in (range(3), range(blocks)):
        exist = store.batch_is_exist([ks[b] for b in wanted])
        todo = [b for b, e in zip(wanted, exist) if e != 1]
        assert len(todo) == 3
        cfg = store_module.ReplicateConfig()
        cfg.preferred_segment = store.get_hostname()
        cfg.group_ids = [base] * len(todo)
        p, s = ptrs_sizes(kv, todo)
        rc = store.batch_put_from_multi_buffers([ks[b] for b in todo], p, s, cfg)
        assert NO_AVAILABLE_HANDLE not in rc
        assert rc == [0] * len(todo)
    assert store.batch_is_exist(ks) == [1] * blocks

    outs = [[registered(block * blocks) for _ in range(layers)] for _ in range(2)]
    results, errors = {}, []

    def receiver(t):
        try:
            idx = list(range(t, blocks, 2))
            p, s = ptrs_sizes(outs[t], idx)
            results[t] = (idx, store.batch_get_into_multi_buffers([ks[b] for b in idx], p, s))
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=receiver, args=(t,), daemon=True) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 2
    for t, (idx, rc) in results.items():
        assert rc == [layers * block] * len(idx)
        for b in idx:
            for src, dst in zip(kv, outs[t]):
                assert dst[b * block:(b + 1) * block].tobytes() == src[b * block:(b + 1) * block].tobytes()


# ---- LMCache (MooncakestoreConnector) ------------------------------------------------------

def test_lmcache_put_parts_and_batch_get_buffer(store):
    key = unique_key("lmc")
    meta = os.urandom(28)
    kv = np.random.default_rng(1).standard_normal(512).astype(np.float16)
    assert store.put_parts(key, meta, kv.view(np.uint8)) == 0
    [h] = store.batch_get_buffer([key])
    assert memoryview(h)[:28].tobytes() == meta
    back = np.frombuffer(h, dtype=np.float16, offset=28, count=kv.size)
    assert np.array_equal(back, kv)


def test_lmcache_partial_chunk_byte_counts(store, registered, store_module):
    chunk = 256 * 1024
    cpu = registered(4 * chunk)
    cpu[:] = np.random.default_rng(2).integers(0, 256, cpu.size, dtype=np.uint8)
    base = unique_key("chunk")
    ks = [f"{base}-0", f"{base}-1"]
    cfg = store_module.ReplicateConfig()
    cfg.preferred_segment = store.get_hostname()
    assert store.put_from(ks[0], ptr(cpu), chunk, cfg) == 0
    assert store.put_from(ks[1], ptr(cpu, chunk), 100 * 1024, cfg) == 0
    dst = registered(4 * chunk)
    n = store.batch_get_into(ks + [f"{base}-missing"],
                             [ptr(dst), ptr(dst, chunk), ptr(dst, 2 * chunk)], [chunk] * 3)
    assert n[:2] == [chunk, 100 * 1024]
    assert n[2] <= 0
    assert dst[:chunk + 100 * 1024].tobytes() == cpu[:chunk + 100 * 1024].tobytes()
    assert bool(store.is_exist(ks[0])) and not store.is_exist(f"{base}-missing")


# ---- SGLang (HiCache Mooncake backend) -----------------------------------------------------

def sglang_setup(store, master, extra_kwargs):
    """SGLang's loop: drop each kwarg a TypeError names and retry; tenant_id must stay."""
    kwargs = dict(extra_kwargs)
    for _ in range(len(kwargs) + 1):
        try:
            return store.setup("localhost", "P2PHANDSHAKE", SEGMENT_SIZE, LOCAL_BUFFER_SIZE,
                               "tcp", "", master.address, None, **kwargs)
        except TypeError as e:
            named = [k for k in kwargs if k in str(e)]
            if not named or "tenant_id" in named:
                raise
            for k in named:
                del kwargs[k]
    pytest.fail("setup kept raising TypeError")


@pytest.mark.parametrize("unsupported", [{}, {"future_option": True}])
def test_sglang_setup_warmup_and_zero_copy(master, store_module, unsupported):
    store = store_module.MooncakeDistributedStore()
    try:
        kwargs = dict(enable_client_http_server=False, client_http_port=free_port(),
                      enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
                      **unsupported)
        assert sglang_setup(store, master, kwargs) == 0
        warm_key, warm = "warmup_key_" + unique_key(), os.urandom(4096)
        assert store.put(warm_key, warm) == 0
        assert store.is_exist(warm_key) == 1
        assert store.get(warm_key) == warm

        pool = np.random.default_rng(3).integers(0, 256, 16 * 4096, dtype=np.uint8)
        assert store.register_buffer(ptr(pool), pool.nbytes) == 0
        base = unique_key("sgl")
        ks = [f"{base}-{i}" for i in range(8)]
        exist = store.batch_is_exist(ks)
        assert len(exist) == len(ks) and exist == [0] * 8
        assert store.batch_put_from(ks, [ptr(pool, i * 4096) for i in range(8)], [4096] * 8) == [0] * 8
        out = np.zeros_like(pool)
        assert store.register_buffer(ptr(out), out.nbytes) == 0
        got = store.batch_get_into(ks, [ptr(out, i * 4096) for i in range(8)], [4096] * 8)
        assert all(n >= 0 for n in got) and got == [4096] * 8
        assert out[:8 * 4096].tobytes() == pool[:8 * 4096].tobytes()
        assert store.unregister_buffer(ptr(out)) == 0
        assert store.unregister_buffer(ptr(pool)) == 0
        assert store.remove_all() >= 0
    finally:
        assert store.close() == 0
