"""The tensor APIs of ``MooncakeDistributedStore`` (spec python-api.md section 4.10), on the
module's byte calls. The native class forwards each tensor method here with the store first.

An object written by a tensor call is upstream's layout, so either side reads the other's: a
fixed 304-byte tensor-metadata header (``TensorMetadata`` of Mooncake's
``integration_utils.h``: magic, version, header size, dtype, ndim, layout kind, data offset and
length, global and local shapes of 8 dims padded with -1, up to 4 layout axes), then the raw
bytes of the tensor in C order. The header codec (``pack_header``, ``parse_header``) needs
neither torch nor numpy; the calls that take or return tensors import torch when called and
raise ``ImportError`` naming the missing package without it.

Return conventions as upstream: writers return 0 or a negative code (-600 for a tensor or
buffer they cannot take, or mismatched batch lists), readers return a CPU tensor or ``None``.
"""

import ctypes
import struct
from collections import namedtuple

INVALID_PARAMS = -600

MAGIC = 0x4D4F4F4E
VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4
LAYOUT_FULL = 0
LAYOUT_SHARD = 1
AXIS_TP = 1

# TensorObjectHeader: magic u32, version u16, header_size u16, dtype i32, ndim i32,
# layout_kind u32, reserved_flags u32, data_offset u64, data_bytes u64.
_HEADER = struct.Struct("<IHHiiIIQQ")
# TensorLayoutMetadata: global and local shapes (8 x i64 each), axis_count u32, reserved u32.
_SHAPES = struct.Struct("<8q8qII")
# LayoutAxis: kind, axis_index, shard_rank, shard_count, split_dim, reserved0 (i32), reserved1 i64.
_AXIS = struct.Struct("<iiiiiiq")
METADATA_SIZE = _HEADER.size + _SHAPES.size + MAX_AXES * _AXIS.size  # 304

# Upstream's TensorDtype codes, their torch names and element sizes.
DTYPES = [
    ("float32", 4), ("float64", 8), ("int8", 1), ("uint8", 1), ("int16", 2), ("uint16", 2),
    ("int32", 4), ("uint32", 4), ("int64", 8), ("uint64", 8), ("bool", 1), ("float16", 2),
    ("bfloat16", 2), ("float8_e4m3fn", 1), ("float8_e5m2", 1),
]

Axis = namedtuple("Axis", "kind axis_index shard_rank shard_count split_dim")
Header = namedtuple("Header", "dtype global_shape local_shape layout_kind axes data_offset data_bytes")


def tensor_metadata_size():
    """Bytes of the tensor-metadata header (upstream's ``_tensor_metadata_size``)."""
    return METADATA_SIZE


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def pack_header(dtype, global_shape, local_shape=None, layout_kind=LAYOUT_FULL, axes=()):
    """The header of a tensor of dtype code ``dtype`` and ``local_shape`` (default: the global
    one), its data following at once. ``ValueError`` for an unknown dtype, more than 8 dims or
    more than 4 axes."""
    local_shape = global_shape if local_shape is None else local_shape
    if not 0 <= dtype < len(DTYPES):
        raise ValueError(f"unknown tensor dtype code {dtype}")
    if len(global_shape) > MAX_DIMS or len(local_shape) != len(global_shape):
        raise ValueError("a tensor has at most 8 dimensions, the same number locally")
    if len(axes) > MAX_AXES:
        raise ValueError("at most 4 layout axes")
    data_bytes = _numel(local_shape) * DTYPES[dtype][1]
    pad = [-1] * MAX_DIMS
    header = _HEADER.pack(MAGIC, VERSION, METADATA_SIZE, dtype, len(global_shape), layout_kind,
                          0, METADATA_SIZE, data_bytes)
    shapes = _SHAPES.pack(*(list(global_shape) + pad)[:MAX_DIMS],
                          *(list(local_shape) + pad)[:MAX_DIMS], len(axes), 0)
    packed_axes = b"".join(_AXIS.pack(a.kind, a.axis_index, a.shard_rank, a.shard_count,
                                      a.split_dim, 0, 0) for a in axes)
    return header + shapes + packed_axes + bytes(_AXIS.size * (MAX_AXES - len(axes)))


def parse_header(buffer, total_length=None):
    """The ``Header`` at the start of ``buffer`` (bytes-like) of a ``total_length``-byte object
    (default: the buffer's length), or ``None`` when upstream's ``ValidateTensorMetadata``
    would refuse it."""
    view = memoryview(buffer).cast("B")
    total = len(view) if total_length is None else total_length
    if total < METADATA_SIZE or len(view) < METADATA_SIZE:
        return None
    (magic, version, header_size, dtype, ndim, layout_kind, _flags, data_offset,
     data_bytes) = _HEADER.unpack_from(view, 0)
    fields = _SHAPES.unpack_from(view, _HEADER.size)
    global_dims, local_dims, axis_count = fields[:MAX_DIMS], fields[MAX_DIMS:2 * MAX_DIMS], fields[16]
    if (magic, version, header_size) != (MAGIC, VERSION, METADATA_SIZE):
        return None
    if not 0 <= dtype < len(DTYPES) or not 0 <= ndim <= MAX_DIMS or axis_count > MAX_AXES:
        return None
    if layout_kind > LAYOUT_SHARD or not METADATA_SIZE <= data_offset <= total:
        return None
    if data_bytes != total - data_offset:
        return None
    if any(d < 0 for d in global_dims[:ndim] + local_dims[:ndim]):
        return None
    if any(d != -1 for d in global_dims[ndim:] + local_dims[ndim:]):
        return None
    if data_bytes != _numel(local_dims[:ndim]) * DTYPES[dtype][1]:
        return None
    axes = []
    for i in range(axis_count):
        kind, index, rank, count, split_dim, _r0, _r1 = _AXIS.unpack_from(
            view, _HEADER.size + _SHAPES.size + i * _AXIS.size)
        if not 0 <= kind <= 4 or count <= 0 or not 0 <= rank < count or not -1 <= split_dim < ndim:
            return None
        axes.append(Axis(kind, index, rank, count, split_dim))
    return Header(dtype, tuple(global_dims[:ndim]), tuple(local_dims[:ndim]), layout_kind,
                  tuple(axes), data_offset, data_bytes)


# --- torch --------------------------------------------------------------------------------


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("the tensor APIs of mooncake.store need torch (pip install torch)") from e
    return torch


def _dtype_code(torch, dtype):
    for code, (name, _) in enumerate(DTYPES):
        if getattr(torch, name, None) == dtype:
            return code
    return None


def _is_tensor(obj):
    return isinstance(obj, _torch().Tensor)


# Largest buffer a ``*_from`` / ``*_into`` call takes (the 48-bit address space).
_MAX_BUFFER = 1 << 48


def _raw(address, length):
    """A writable bytes-like view of ``length`` bytes at ``address`` (no copy)."""
    return (ctypes.c_char * length).from_address(address)


def serialize_tensor(tensor, global_shape=None, layout_kind=LAYOUT_FULL, axes=()):
    """(header bytes, data address, data bytes, owner) of a CPU tensor; ``owner`` keeps the
    data alive (a contiguous copy when the tensor is not contiguous). ``ValueError`` for
    anything else (upstream's ``_serialize_tensor``)."""
    if not _is_tensor(tensor) or tensor.device.type != "cpu":
        raise ValueError("unsupported tensor for Mooncake tensor serialization")
    torch = _torch()
    owner = tensor.contiguous()
    code = _dtype_code(torch, owner.dtype)
    if code is None or owner.dim() > MAX_DIMS:
        raise ValueError("unsupported tensor for Mooncake tensor serialization")
    shape = tuple(owner.shape)
    header = pack_header(code, shape if global_shape is None else global_shape, shape,
                         layout_kind, axes)
    return header, owner.data_ptr(), owner.numel() * owner.element_size(), owner


def to_tensor(buffer, length=None):
    """A CPU tensor over ``buffer`` (header + data; kept alive by the tensor), or ``None`` when
    the header is invalid."""
    torch = _torch()
    header = parse_header(buffer, length)
    if header is None:
        return None
    dtype = getattr(torch, DTYPES[header.dtype][0], None)
    if dtype is None:
        return None
    if header.data_bytes == 0:
        return torch.empty(header.local_shape, dtype=dtype)
    flat = torch.frombuffer(buffer, dtype=torch.uint8, count=header.data_bytes,
                            offset=header.data_offset)
    return flat.view(dtype).reshape(header.local_shape)


def deserialize_tensor(payload):
    """Upstream's ``_deserialize_tensor``: a tensor from header + data bytes (copied), or
    ``ValueError``."""
    tensor = to_tensor(bytearray(payload))
    if tensor is None:
        raise ValueError("invalid serialized Mooncake tensor payload")
    return tensor


# --- the store's tensor methods (``store`` first) -----------------------------------------------


def _write(store, key, tensor, config, upsert, global_shape=None, layout_kind=LAYOUT_FULL, axes=()):
    try:
        header, address, length, owner = serialize_tensor(tensor, global_shape, layout_kind, axes)
    except ValueError:
        return INVALID_PARAMS
    parts = (header, _raw(address, length)) if length else (header,)
    write = store.upsert_parts if upsert else store.put_parts
    rc = write(key, *parts, config=config)
    del owner
    return rc


def _batch(keys, values, one):
    if len(keys) != len(values):
        return [INVALID_PARAMS] * len(keys)
    return [one(k, v) for k, v in zip(keys, values)]


def _same_lengths(keys, *lists):
    return all(len(x) == len(keys) for x in lists)


def _check_publish(config):
    segments = config.preferred_segments
    return not segments or len(segments) == config.replica_num


def put_tensor(store, key, tensor):
    return _write(store, key, tensor, None, False)


def upsert_tensor(store, key, tensor):
    return _write(store, key, tensor, None, True)


def batch_put_tensor(store, keys, tensors_list):
    return _batch(keys, tensors_list, lambda k, t: put_tensor(store, k, t))


def batch_upsert_tensor(store, keys, tensors_list):
    return _batch(keys, tensors_list, lambda k, t: upsert_tensor(store, k, t))


def pub_tensor(store, key, tensor, config=None):
    config = config or store_module().ReplicateConfig()
    return _write(store, key, tensor, config, False) if _check_publish(config) else INVALID_PARAMS


def upsert_pub_tensor(store, key, tensor, config=None):
    config = config or store_module().ReplicateConfig()
    return _write(store, key, tensor, config, True) if _check_publish(config) else INVALID_PARAMS


def batch_pub_tensor(store, keys, tensors_list, config=None):
    return _batch(keys, tensors_list, lambda k, t: pub_tensor(store, k, t, config))


def batch_upsert_pub_tensor(store, keys, tensors_list, config=None):
    return _batch(keys, tensors_list, lambda k, t: upsert_pub_tensor(store, k, t, config))


def get_tensor(store, key):
    handle = store.get_buffer(key)
    return None if handle is None else to_tensor(handle)


def batch_get_tensor(store, keys):
    return [None if h is None else to_tensor(h) for h in store.batch_get_buffer(keys)]


def get_tensor_into(store, key, buffer_ptr, size):
    if not 0 < buffer_ptr < _MAX_BUFFER:
        return None
    n = store.get_into(key, buffer_ptr, size)
    return None if n < 0 else to_tensor(_raw(buffer_ptr, n))


def batch_get_tensor_into(store, keys, buffer_ptrs, sizes):
    if not _same_lengths(keys, buffer_ptrs, sizes):
        return [INVALID_PARAMS] * len(keys)
    got = store.batch_get_into(keys, buffer_ptrs, sizes)
    return [None if n < 0 else to_tensor(_raw(p, n)) for n, p in zip(got, buffer_ptrs)]


def _valid_buffer(buffer_ptr, size):
    if not 0 < buffer_ptr < _MAX_BUFFER or not METADATA_SIZE <= size < _MAX_BUFFER:
        return False
    return parse_header(_raw(buffer_ptr, size)) is not None


def put_tensor_from(store, key, buffer_ptr, size):
    if not _valid_buffer(buffer_ptr, size):
        return INVALID_PARAMS
    return store.put_from(key, buffer_ptr, size)


def upsert_tensor_from(store, key, buffer_ptr, size):
    if not _valid_buffer(buffer_ptr, size):
        return INVALID_PARAMS
    return store.upsert_from(key, buffer_ptr, size)


def batch_put_tensor_from(store, keys, buffer_ptrs, sizes):
    if not _same_lengths(keys, buffer_ptrs, sizes):
        return [INVALID_PARAMS] * len(keys)
    return [put_tensor_from(store, k, p, s) for k, p, s in zip(keys, buffer_ptrs, sizes)]


def batch_upsert_tensor_from(store, keys, buffer_ptrs, sizes):
    if not _same_lengths(keys, buffer_ptrs, sizes):
        return [INVALID_PARAMS] * len(keys)
    return [upsert_tensor_from(store, k, p, s) for k, p, s in zip(keys, buffer_ptrs, sizes)]


def tp_key(key, rank):
    """The key of TP shard ``rank`` (upstream's legacy single-axis layout)."""
    return f"{key}_tp_{rank}"


def _tp_shards(tensor, tp_size, split_dim):
    """The ``tp_size`` equal shards of ``tensor`` along ``split_dim``, or ``None`` when the
    dimension does not split evenly (upstream allows uniform splits only)."""
    if not _is_tensor(tensor) or not 0 <= split_dim < tensor.dim():
        return None
    if tensor.shape[split_dim] % tp_size:
        return None
    return tensor.chunk(tp_size, dim=split_dim)


def _put_with_tp(store, key, tensor, tp_size, split_dim, config, upsert):
    if tp_size <= 1:
        return _write(store, key, tensor, config, upsert)
    shards = _tp_shards(tensor, tp_size, split_dim)
    if shards is None:
        return INVALID_PARAMS
    shape = tuple(tensor.shape)
    for rank, shard in enumerate(shards):
        axis = Axis(AXIS_TP, 0, rank, tp_size, split_dim)
        rc = _write(store, tp_key(key, rank), shard, config, upsert, shape, LAYOUT_SHARD, (axis,))
        if rc != 0:
            return rc
    return 0


def put_tensor_with_tp(store, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
    return _put_with_tp(store, key, tensor, tp_size, split_dim, None, False)


def batch_put_tensor_with_tp(store, base_keys, tensors_list, tp_rank=0, tp_size=1, split_dim=0):
    return _batch(base_keys, tensors_list,
                  lambda k, t: put_tensor_with_tp(store, k, t, tp_rank, tp_size, split_dim))


def pub_tensor_with_tp(store, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
    config = config or store_module().ReplicateConfig()
    if not _check_publish(config):
        return INVALID_PARAMS
    return _put_with_tp(store, key, tensor, tp_size, split_dim, config, False)


def batch_pub_tensor_with_tp(store, base_keys, tensors_list, config=None, tp_rank=0, tp_size=1,
                             split_dim=0):
    return _batch(base_keys, tensors_list, lambda k, t: pub_tensor_with_tp(
        store, k, t, config, tp_rank, tp_size, split_dim))


def get_tensor_with_tp(store, key, tp_rank=0, tp_size=1, split_dim=0):
    return get_tensor(store, key if tp_size <= 1 else tp_key(key, tp_rank))


def batch_get_tensor_with_tp(store, base_keys, tp_rank=0, tp_size=1):
    keys = base_keys if tp_size <= 1 else [tp_key(k, tp_rank) for k in base_keys]
    return batch_get_tensor(store, keys)


def get_tensor_with_tp_into(store, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
    return get_tensor_into(store, key if tp_size <= 1 else tp_key(key, tp_rank), buffer_ptr, size)


def batch_get_tensor_with_tp_into(store, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1):
    keys = base_keys if tp_size <= 1 else [tp_key(k, tp_rank) for k in base_keys]
    return batch_get_tensor_into(store, keys, buffer_ptrs, sizes)


def store_module():
    import mooncake.store

    return mooncake.store


# The store methods the native class forwards here (and nothing else).
METHODS = (
    "put_tensor", "upsert_tensor", "batch_put_tensor", "batch_upsert_tensor", "pub_tensor",
    "upsert_pub_tensor", "batch_pub_tensor", "batch_upsert_pub_tensor", "get_tensor",
    "batch_get_tensor", "get_tensor_into", "batch_get_tensor_into", "put_tensor_from",
    "upsert_tensor_from", "batch_put_tensor_from", "batch_upsert_tensor_from",
    "put_tensor_with_tp", "batch_put_tensor_with_tp", "pub_tensor_with_tp",
    "batch_pub_tensor_with_tp", "get_tensor_with_tp", "batch_get_tensor_with_tp",
    "get_tensor_with_tp_into", "batch_get_tensor_with_tp_into",
)
