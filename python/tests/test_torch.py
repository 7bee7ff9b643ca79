"""The zero-copy KV path with torch tensors (skipped where torch is not installed), and a
torch.cuda.Stream-shaped object refused with NOT_SUPPORTED on a machine without CUDA."""

import ctypes
import types

import pytest

from conftest import INVALID_PARAMS, NOT_SUPPORTED, unique_key

torch = pytest.importorskip("torch")


def storage(t):
    """The tensor's whole storage (``untyped_storage`` from torch 2.0, ``storage`` before)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def test_tensor_storage_as_kv_memory(store):
    kv = torch.randn(4, 1024, dtype=torch.float16)
    out = torch.zeros_like(kv)
    for t in (kv, out):
        assert store.register_buffer(storage(t).data_ptr(), storage(t).nbytes()) == 0
    try:
        row = kv[0].numel() * kv.element_size()
        ks = [unique_key("t") for _ in range(4)]
        rc = store.batch_put_from_multi_buffers(ks, [[kv[i].data_ptr()] for i in range(4)],
                                                [[row]] * 4)
        assert rc == [0] * 4
        got = store.batch_get_into_multi_buffers(ks, [[out[i].data_ptr()] for i in range(4)],
                                                 [[row]] * 4)
        assert got == [row] * 4
        assert torch.equal(out, kv)
        [h] = store.batch_get_buffer(ks[:1])
        assert torch.equal(torch.frombuffer(h, dtype=torch.float16, count=1024), kv[0])
        fake_stream = types.SimpleNamespace(cuda_stream=1234)
        if not torch.cuda.is_available():
            rc = store.batch_get_into_on_stream(ks[:1], [out[0].data_ptr()], [row], fake_stream)
            assert rc == NOT_SUPPORTED
    finally:
        for t in (kv, out):
            assert store.unregister_buffer(storage(t).data_ptr()) == 0


def config(store_module, **fields):
    cfg = store_module.ReplicateConfig()
    for name, value in fields.items():
        setattr(cfg, name, value)
    return cfg


def tensors(n, start=0):
    return [torch.arange(24, dtype=torch.float32).reshape(4, 6) + start + 100 * i
            for i in range(n)]


def object_size(tensor):
    return 304 + tensor.numel() * tensor.element_size()


def serialized(registered, store_module, tensor):
    """A registered buffer holding ``tensor`` as a tensor object (header + data)."""
    header, ptr, nbytes, _owner = store_module._serialize_tensor(tensor)
    buf = registered(len(header) + nbytes)
    buf[:len(header)] = list(header)
    buf[len(header):] = list(bytes((ctypes.c_char * nbytes).from_address(ptr)))
    return buf


def test_batch_and_upsert_tensor_calls_round_trip(store, registered, store_module):
    keys = [unique_key("bt") for _ in range(3)]
    first, second = tensors(3), tensors(3, start=7)
    assert store.batch_put_tensor(keys, first) == [0, 0, 0]
    assert store.batch_put_tensor(keys[:1], first[:1]) == [store.put_tensor(keys[0], first[0])]
    got = store.batch_get_tensor(keys + [unique_key("absent")])
    assert all(torch.equal(g, x) for g, x in zip(got, first)) and got[3] is None
    assert store.batch_upsert_tensor(keys, second) == [0, 0, 0]
    assert all(torch.equal(store.get_tensor(k), x) for k, x in zip(keys, second))
    one = unique_key("up")
    assert store.upsert_tensor(one, first[0]) == 0
    assert store.upsert_tensor(one, second[0]) == 0
    assert torch.equal(store.get_tensor(one), second[0])
    # A tensor that cannot be serialised fails its own key only; mismatched lists fail all.
    mixed = [unique_key("mixed") for _ in range(3)]
    assert store.batch_put_tensor(mixed, [first[0], torch.zeros(2, dtype=torch.complex64),
                                          torch.zeros(2, device="meta")]) == [
        0, INVALID_PARAMS, INVALID_PARAMS]
    assert store.is_exist(mixed[1]) == 0 and store.is_exist(mixed[2]) == 0
    assert store.batch_upsert_tensor(mixed, first[:1]) == [INVALID_PARAMS] * 3
    # Into registered buffers, one batch.
    size = object_size(first[0])
    bufs = [registered(size) for _ in keys]
    got = store.batch_get_tensor_into(keys, [b.ctypes.data for b in bufs], [size] * 3)
    assert all(torch.equal(g, x) for g, x in zip(got, second))
    # Pre-serialised buffers upserted in one batch; a short one fails alone.
    ptrs = [serialized(registered, store_module, x).ctypes.data for x in first]
    assert store.batch_upsert_tensor_from(keys, ptrs, [size, size, size - 1]) == [
        0, 0, INVALID_PARAMS]
    assert [torch.equal(store.get_tensor(k), x) for k, x in zip(keys, first)] == [
        True, True, False]


def test_publish_calls_take_a_config(store, store_module):
    cfg = config(store_module, replica_num=1)
    bad = config(store_module, replica_num=1, preferred_segments=["a:1", "b:2"])
    key, up = unique_key("pub"), unique_key("pub-up")
    (x, y), (z, w) = tensors(2), tensors(2, start=3)
    assert store.pub_tensor(key, x, cfg) == 0
    assert store.pub_tensor(unique_key("pub-bad"), x, bad) == INVALID_PARAMS
    assert store.upsert_pub_tensor(up, x, cfg) == 0
    assert store.upsert_pub_tensor(up, y) == 0
    assert torch.equal(store.get_tensor(up), y)
    keys = [unique_key("bpub") for _ in range(2)]
    assert store.batch_pub_tensor(keys, [x, y], cfg) == [0, 0]
    assert store.batch_pub_tensor([unique_key("bpub-bad")], [x], bad) == [INVALID_PARAMS]
    grouped = config(store_module, group_ids=["g1", "g2"])
    assert store.batch_upsert_pub_tensor(keys, [z, w], grouped) == [0, 0]
    assert [torch.equal(store.get_tensor(k), v) for k, v in zip(keys, (z, w))] == [True, True]
    # Group ids must be one per key; with one tensor unusable the others keep their groups.
    assert store.batch_upsert_pub_tensor(keys, [z, w], config(
        store_module, group_ids=["g1"])) == [INVALID_PARAMS] * 2
    assert store.batch_upsert_pub_tensor(keys, [object(), x], grouped) == [INVALID_PARAMS, 0]
    assert torch.equal(store.get_tensor(keys[1]), x)


def test_tp_calls_store_and_read_every_rank(store, registered, store_module):
    full = tensors(2)
    keys = [unique_key("btp") for _ in range(2)]
    assert store.batch_put_tensor_with_tp(keys, full, tp_size=2, split_dim=1) == [0, 0]
    shards = store.batch_get_tensor_with_tp(keys, tp_rank=1, tp_size=2)
    assert all(torch.equal(s, f[:, 3:]) for s, f in zip(shards, full))
    pub = unique_key("ptp")
    assert store.pub_tensor_with_tp(pub, full[0], config(store_module), tp_size=3,
                                    split_dim=1) == 0
    grouped = config(store_module, group_ids=["a", "b"])
    bkeys = [unique_key("bptp") for _ in range(2)]
    assert store.batch_pub_tensor_with_tp(bkeys, full, grouped, tp_size=2, split_dim=0) == [0, 0]
    size = 304 + 2 * 4 * 4
    buf = registered(size)
    got = store.get_tensor_with_tp_into(pub, buf.ctypes.data, size, tp_rank=2, tp_size=3)
    assert torch.equal(got, full[0][:, 4:])
    size = 304 + 2 * 6 * 4
    bufs = [registered(size) for _ in bkeys]
    got = store.batch_get_tensor_with_tp_into(bkeys, [b.ctypes.data for b in bufs], [size] * 2,
                                              tp_rank=1, tp_size=2)
    assert all(torch.equal(g, f[2:]) for g, f in zip(got, full))
    # The TP forms of a buffer: every shard of the full object in its buffer.
    src = serialized(registered, store_module, full[1])
    frm = unique_key("tp-from")
    assert store.batch_put_tensor_with_tp_from([frm], [src.ctypes.data], [src.nbytes],
                                               tp_size=2, split_dim=1) == [0]
    assert torch.equal(store.get_tensor_with_tp(frm, tp_rank=0, tp_size=2), full[1][:, :3])


def test_parallelism_upserts_and_reads_into_buffers(store, registered, store_module):
    def parallelism(rank, size):
        axis = store_module.ParallelAxis()
        axis.kind, axis.rank, axis.size, axis.split_dim = "tp", rank, size, 1
        p = store_module.TensorParallelism()
        p.axes = [axis]
        return p

    def as_stored():
        return store_module.ReadTarget()

    old, new = tensors(1)[0], tensors(1, start=5)[0]
    key = unique_key("par-up")
    for rank in range(2):
        assert store.put_tensor_with_parallelism(key, old[:, 3 * rank:3 * rank + 3],
                                                 parallelism(rank, 2)) == 0
    for rank in range(2):
        assert store.upsert_tensor_with_parallelism(key, new[:, 3 * rank:3 * rank + 3],
                                                    parallelism(rank, 2)) == 0
    full = store_module.ReadTarget()
    full.mode, full.parallelism = "full", parallelism(0, 2)
    assert torch.equal(store.get_tensor_with_parallelism(key, full), new)
    whole = unique_key("par-whole")
    assert store.batch_upsert_tensor_with_parallelism([whole], [old]) == [0]
    assert store.batch_upsert_tensor_with_parallelism([whole], [new]) == [0]
    size = object_size(new)
    buf = registered(size)
    assert torch.equal(store.get_tensor_with_parallelism_into(whole, buf.ctypes.data, size,
                                                              as_stored()), new)
    src = serialized(registered, store_module, old)
    assert store.upsert_tensor_with_parallelism_from(whole, src.ctypes.data, src.nbytes) == 0
    assert torch.equal(store.get_tensor(whole), old)
    assert store.get_tensor_with_parallelism_into(whole, buf.ctypes.data, size - 1) is None


def test_tensors_on_other_devices(store):
    """A CUDA tensor is stored from its host copy (upstream's dummy copies it to host too); a
    ``meta`` tensor has no bytes and is refused."""
    assert store.put_tensor(unique_key("meta"), torch.zeros(2, device="meta")) == INVALID_PARAMS
    if torch.cuda.is_available():
        x = torch.arange(12, dtype=torch.float16, device="cuda").reshape(3, 4)
        key = unique_key("cuda")
        assert store.put_tensor(key, x) == 0
        assert torch.equal(store.get_tensor(key), x.cpu())
