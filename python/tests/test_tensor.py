"""The tensor APIs (spec section 4.10): upstream's tensor-metadata header checked against an
independent ctypes mirror of Mooncake's C structs and validated like ValidateTensorMetadata
(no torch needed), objects written from pre-serialised buffers read back byte for byte, and,
where torch is installed, tensor round trips for every dtype upstream serialises and the TP
shard layout. Without torch the tensor-taking calls raise ImportError naming it."""

import ctypes
import importlib.util

import numpy as np
import pytest

from conftest import INVALID_PARAMS, unique_key
from mooncake import _tensor as t

HAVE_TORCH = importlib.util.find_spec("torch") is not None


class LayoutAxis(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("axis_index", ctypes.c_int32),
                ("shard_rank", ctypes.c_int32), ("shard_count", ctypes.c_int32),
                ("split_dim", ctypes.c_int32), ("reserved0", ctypes.c_int32),
                ("reserved1", ctypes.c_int64)]


class TensorMetadata(ctypes.Structure):
    """Mooncake's TensorObjectHeader + TensorLayoutMetadata, as the C++ compiler lays them out."""
    _fields_ = [("magic", ctypes.c_uint32), ("version", ctypes.c_uint16),
                ("header_size", ctypes.c_uint16), ("dtype", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("layout_kind", ctypes.c_uint32),
                ("reserved_flags", ctypes.c_uint32), ("data_offset", ctypes.c_uint64),
                ("data_bytes", ctypes.c_uint64),
                ("global_shape", ctypes.c_int64 * 8), ("local_shape", ctypes.c_int64 * 8),
                ("axis_count", ctypes.c_uint32), ("reserved0", ctypes.c_uint32),
                ("axes", LayoutAxis * 4)]


def mirror(dtype, shape, local=None, kind=0, axes=()):
    local = shape if local is None else local
    m = TensorMetadata()
    m.magic, m.version, m.header_size = 0x4D4F4F4E, 1, ctypes.sizeof(TensorMetadata)
    m.dtype, m.ndim, m.layout_kind = dtype, len(shape), kind
    m.data_offset = ctypes.sizeof(TensorMetadata)
    n = 1
    for d in local:
        n *= d
    m.data_bytes = n * t.DTYPES[dtype][1]
    for i in range(8):
        m.global_shape[i] = shape[i] if i < len(shape) else -1
        m.local_shape[i] = local[i] if i < len(local) else -1
    m.axis_count = len(axes)
    for i, a in enumerate(axes):
        m.axes[i] = LayoutAxis(*a)
    return bytes(m)


def test_the_header_is_upstreams_struct_for_every_dtype(store_module):
    assert ctypes.sizeof(TensorMetadata) == t.METADATA_SIZE == 304
    assert store_module._tensor_metadata_size() == 304
    for code in range(len(t.DTYPES)):
        for shape in [(), (0,), (3,), (2, 3, 4), (1,) * 8]:
            packed = t.pack_header(code, shape)
            assert packed == mirror(code, shape), (code, shape)
            size = t.DTYPES[code][1]
            n = int(np.prod(shape)) if shape else 1
            parsed = t.parse_header(packed + bytes(n * size))
            assert parsed == t.Header(code, shape, shape, 0, (), 304, n * size)
    axis = t.Axis(t.AXIS_TP, 0, 1, 4, 1, 0, 4)
    sharded = t.pack_header(0, (8, 16), (8, 4), t.LAYOUT_SHARD, (axis,))
    assert sharded == mirror(0, (8, 16), (8, 4), 1, (axis,))
    assert t.parse_header(sharded + bytes(8 * 4 * 4)).axes == (axis,)


def test_headers_upstream_would_refuse_are_refused():
    good = bytearray(t.pack_header(6, (2, 2)) + bytes(16))
    assert t.parse_header(good) is not None
    assert t.parse_header(good[:-1]) is None, "data shorter than the header says"
    assert t.parse_header(good + b"x") is None, "data longer"
    assert t.parse_header(good[:100]) is None, "shorter than a header"
    for offset, value in [(0, 0), (4, 2), (6, 0x31), (8, 15), (12, 9), (16, 2)]:
        bad = bytearray(good)
        bad[offset] = value  # magic, version, header size, dtype, ndim, layout kind
        assert t.parse_header(bad) is None, offset
    padded = bytearray(good)
    padded[40 + 2 * 8:40 + 3 * 8] = (5).to_bytes(8, "little", signed=True)  # global dim 2 of 2
    assert t.parse_header(padded) is None, "dims past ndim must be -1"
    axis = t.Axis(t.AXIS_TP, 0, 4, 4, 0)  # rank == count
    assert t.parse_header(t.pack_header(0, (4,), (4,), 1, (axis,)) + bytes(16)) is None
    with pytest.raises(ValueError):
        t.pack_header(15, (1,))
    with pytest.raises(ValueError):
        t.pack_header(0, (1,) * 9)


def test_pre_serialised_buffers_round_trip_through_the_store(store, registered):
    header = t.pack_header(8, (4, 3))  # int64
    data = np.arange(12, dtype=np.int64)
    buf = registered(len(header) + data.nbytes)
    buf[:len(header)] = np.frombuffer(header, dtype=np.uint8)
    buf[len(header):] = data.view(np.uint8)
    key = unique_key("tensor-from")
    assert store.put_tensor_from(key, buf.ctypes.data, buf.nbytes) == 0
    out = registered(buf.nbytes)
    assert store.get_into(key, out.ctypes.data, out.nbytes) == buf.nbytes
    assert np.array_equal(out, buf)
    assert t.parse_header(out).local_shape == (4, 3)
    # A buffer that is not header + data is refused before anything is stored.
    bad = unique_key("tensor-bad")
    assert store.put_tensor_from(bad, buf.ctypes.data, buf.nbytes - 8) == INVALID_PARAMS
    assert store.is_exist(bad) == 0
    assert store.batch_put_tensor_from([bad], [buf.ctypes.data], []) == [INVALID_PARAMS]
    assert store.upsert_tensor_from(key, buf.ctypes.data, buf.nbytes) == 0
    assert store.batch_put_tensor([], []) == []
    assert store.batch_put_tensor_from(["a", "b"], [1], [1, 2]) == [INVALID_PARAMS] * 2
    assert store.put_tensor_from(bad, 0, 400) == INVALID_PARAMS
    assert store.put_tensor_from(bad, buf.ctypes.data, 1 << 60) == INVALID_PARAMS


@pytest.mark.skipif(HAVE_TORCH, reason="torch is installed")
def test_without_torch_tensor_calls_name_it(store):
    key = unique_key("no-torch")
    assert store.put(key, t.pack_header(3, (2,)) + b"ab") == 0
    with pytest.raises(ImportError, match="torch"):
        store.get_tensor(key)
    with pytest.raises(ImportError, match="torch"):
        store.put_tensor(key, object())


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_tensor_round_trips_for_every_dtype(store, registered, store_module):
    import torch

    for name, _size in t.DTYPES:
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
        tensor = base.to(dtype) if name != "bool" else base > 11
        key = unique_key(f"tensor-{name}")
        assert store.put_tensor(key, tensor) == 0, name
        got = store.get_tensor(key)
        assert got.dtype == dtype and got.shape == tensor.shape, name
        assert torch.equal(got.view(torch.uint8), tensor.contiguous().view(torch.uint8)), name
        header, ptr, nbytes, _ = store_module._serialize_tensor(tensor)
        assert header == t.pack_header(t._dtype_code(torch, dtype), (2, 3, 4))
        assert torch.equal(store_module._deserialize_tensor(header + bytes(
            (ctypes.c_char * nbytes).from_address(ptr))).view(torch.uint8),
            tensor.view(torch.uint8))
        buf = registered(t.METADATA_SIZE + nbytes)
        into = store.get_tensor_into(key, buf.ctypes.data, buf.nbytes)
        assert torch.equal(into.view(torch.uint8), tensor.view(torch.uint8)), name
    empty = unique_key("tensor-empty")
    assert store.put_tensor(empty, torch.zeros(0, 5)) == 0
    assert store.get_tensor(empty).shape == (0, 5)
    assert store.put_tensor(unique_key("t"), torch.zeros(2, dtype=torch.complex64)) == INVALID_PARAMS
    assert store.get_tensor(unique_key("absent")) is None


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_tp_shards_are_stored_under_their_keys(store):
    import torch

    full = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    key = unique_key("tp")
    assert store.put_tensor_with_tp(key, full, tp_size=4, split_dim=1) == 0
    for rank in range(4):
        shard = store.get_tensor_with_tp(key, tp_rank=rank, tp_size=4)
        assert torch.equal(shard, full[:, rank * 2:(rank + 1) * 2])
        handle = store.get_buffer(t.tp_key(key, rank))
        header = t.parse_header(handle)
        assert header.global_shape == (4, 8) and header.layout_kind == t.LAYOUT_SHARD
        assert header.axes == (t.Axis(t.AXIS_TP, 0, rank, 4, 1, 0, 2),)
    assert store.put_tensor_with_tp(key, full, tp_size=3, split_dim=1) == INVALID_PARAMS
