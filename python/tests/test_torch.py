"""The zero-copy KV path with torch tensors (skipped where torch is not installed), and a
torch.cuda.Stream-shaped object refused with NOT_SUPPORTED on a machine without CUDA."""

import types

import pytest

from conftest import NOT_SUPPORTED, unique_key

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
