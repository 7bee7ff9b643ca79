"""The tensor APIs of ``MooncakeDistributedStore`` (spec python-api.md section 4.10), on the
module's byte calls. The native class forwards each tensor method here with the store first.

An object written by a tensor call is upstream's layout, so either side reads the other's: a
fixed 304-byte tensor-metadata header (``TensorMetadata`` of Mooncake's
``integration_utils.h``: magic, version, header size, dtype, ndim, layout kind, data offset and
length, global and local shapes of 8 dims padded with -1, up to 4 layout axes), then the raw
bytes of the tensor in C order. The header codec (``pack_header``, ``parse_header``) and the
byte-level layout work (``TensorObject``, ``copy_span``: slicing shards out of a full tensor and
placing them back) need neither torch nor numpy; the calls that take or return tensors import
torch when called and raise ``ImportError`` naming the missing package without it.

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

# A layout axis as upstream stores it: ``reserved0`` holds an EP axis's expert id or a PP axis's
# stage id, ``reserved1`` the local extent along ``split_dim`` (0 without one).
Axis = namedtuple("Axis", "kind axis_index shard_rank shard_count split_dim reserved0 reserved1",
                  defaults=(0, 0))
Header = namedtuple("Header", "dtype global_shape local_shape layout_kind axes data_offset data_bytes")


def tensor_metadata_size():
    """Bytes of the tensor-metadata header (upstream's ``_tensor_metadata_size``)."""
    return METADATA_SIZE


def numel(shape):
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
    data_bytes = numel(local_shape) * DTYPES[dtype][1]
    pad = [-1] * MAX_DIMS
    header = _HEADER.pack(MAGIC, VERSION, METADATA_SIZE, dtype, len(global_shape), layout_kind,
                          0, METADATA_SIZE, data_bytes)
    shapes = _SHAPES.pack(*(list(global_shape) + pad)[:MAX_DIMS],
                          *(list(local_shape) + pad)[:MAX_DIMS], len(axes), 0)
    packed_axes = b"".join(_AXIS.pack(*a) for a in axes)
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
    if data_bytes != numel(local_dims[:ndim]) * DTYPES[dtype][1]:
        return None
    axes = []
    for i in range(axis_count):
        axis = Axis(*_AXIS.unpack_from(view, _HEADER.size + _SHAPES.size + i * _AXIS.size))
        if (not 0 <= axis.kind <= 4 or axis.shard_count <= 0
                or not 0 <= axis.shard_rank < axis.shard_count or not -1 <= axis.split_dim < ndim):
            return None
        axes.append(axis)
    return Header(dtype, tuple(global_dims[:ndim]), tuple(local_dims[:ndim]), layout_kind,
                  tuple(axes), data_offset, data_bytes)


# --- objects as bytes -----------------------------------------------------------------------

# A stored tensor object taken apart: its parsed ``Header`` and a bytes-like view of exactly its
# ``data_bytes`` of data. The view borrows from whatever the caller read or was given, which
# must outlive it.
TensorObject = namedtuple("TensorObject", "header data")

# Largest buffer a ``*_from`` / ``*_into`` call takes (the 48-bit address space).
MAX_BUFFER = 1 << 48


def element_size(header):
    return DTYPES[header.dtype][1]


def object_of_bytes(buffer, length=None):
    """The ``TensorObject`` in ``buffer`` (header + data), or ``None`` when the header is not
    one upstream would accept."""
    header = parse_header(buffer, length)
    if header is None:
        return None
    view = memoryview(buffer).cast("B")
    return TensorObject(header, view[header.data_offset:header.data_offset + header.data_bytes])


def object_of_buffer(buffer_ptr, size):
    """The ``TensorObject`` at ``buffer_ptr`` (``size`` bytes of header + data, caller memory),
    or ``None`` for a null or out-of-range pointer, a size outside the address space, or an
    invalid header."""
    if not 0 < buffer_ptr < MAX_BUFFER or not METADATA_SIZE <= size < MAX_BUFFER:
        return None
    return object_of_bytes(raw(buffer_ptr, size))


def is_full(header):
    """Whether the object holds the whole tensor (its data is the global shape's): a FULL
    header whose local shape differs from its global one does not."""
    return header.local_shape == header.global_shape


def shard_range(dim_size, rank, count):
    """(start, extent) of shard ``rank`` of ``count`` along a dimension of ``dim_size``
    (upstream's ``calculate_shard_range``)."""
    start = dim_size * rank // count
    return start, dim_size * (rank + 1) // count - start


def copy_span(shape, split_dim, item_size, dst, dst_start, dst_extent, src, src_start, src_extent):
    """Copies the rows of ``src`` that lie in ``dst``: both hold the tensor of ``shape`` (C order)
    restricted along ``split_dim`` to ``[start, start + extent)``; the overlap of the two ranges
    is copied, one contiguous run per index of the dimensions before ``split_dim``."""
    low, high = max(dst_start, src_start), min(dst_start + dst_extent, src_start + src_extent)
    if low >= high:
        return
    row = numel(shape[split_dim + 1:]) * item_size
    run = (high - low) * row
    for outer in range(numel(shape[:split_dim])):
        s = (outer * src_extent + low - src_start) * row
        d = (outer * dst_extent + low - dst_start) * row
        dst[d:d + run] = src[s:s + run]


def slice_shard(obj, split_dim, rank, count):
    """(local shape, data) of shard ``rank`` of ``count`` of the full tensor ``obj`` along
    ``split_dim``, the data a new ``bytearray``; ``None`` unless ``obj`` is a full tensor whose
    ``split_dim`` exists and divides evenly (upstream allows uniform splits only)."""
    shape = obj.header.global_shape
    if not is_full(obj.header) or not 0 <= split_dim < len(shape) or not 0 <= rank < count:
        return None
    if shape[split_dim] % count:
        return None
    start, extent = shard_range(shape[split_dim], rank, count)
    local = shape[:split_dim] + (extent,) + shape[split_dim + 1:]
    data = bytearray(numel(local) * element_size(obj.header))
    copy_span(shape, split_dim, element_size(obj.header), data, start, extent, obj.data, 0,
              shape[split_dim])
    return local, data


def layout_axis(kind, index, rank, count, split_dim, local_shape, tag=0):
    """Upstream's ``LayoutAxis`` of a shard: ``split_dim`` ``None`` is stored as -1; with one,
    the local extent along it goes in ``reserved1``; ``tag`` (expert or stage id) in
    ``reserved0``."""
    if split_dim is None:
        return Axis(kind, index, rank, count, -1, tag, 0)
    return Axis(kind, index, rank, count, split_dim, tag, local_shape[split_dim])


# --- torch --------------------------------------------------------------------------------


def torch_module():
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
    return isinstance(obj, torch_module().Tensor)


def raw(address, length):
    """A writable bytes-like view of ``length`` bytes at ``address`` (no copy)."""
    return (ctypes.c_char * length).from_address(address)


def serialize_tensor(tensor):
    """(header bytes, data address, data bytes, owner) of a CPU tensor; ``owner`` keeps the
    data alive (a contiguous copy when the tensor is not contiguous). ``ValueError`` for
    anything else (upstream's ``_serialize_tensor``)."""
    obj, owner = object_of_tensor(tensor)
    return header_bytes(obj.header), owner.data_ptr(), obj.header.data_bytes, owner


def object_of_tensor(tensor):
    """(``TensorObject`` of a full tensor, owner): the object's data is a view of the owner's
    memory (the tensor, its contiguous copy, or for a tensor on a device its copy in host
    memory, as upstream's dummy client makes one), which must outlive it. ``ValueError`` for
    anything that is not a tensor of a dtype upstream serialises with at most 8 dims, or one
    whose bytes torch cannot bring to the host (a ``meta`` tensor has none)."""
    if not _is_tensor(tensor):
        raise ValueError("unsupported tensor for Mooncake tensor serialization")
    torch = torch_module()
    owner = tensor.contiguous()
    if owner.device.type != "cpu":
        try:
            owner = owner.detach().to("cpu")
        except (RuntimeError, NotImplementedError) as e:
            raise ValueError("unsupported tensor for Mooncake tensor serialization") from e
    code = _dtype_code(torch, owner.dtype)
    if code is None or owner.dim() > MAX_DIMS:
        raise ValueError("unsupported tensor for Mooncake tensor serialization")
    shape = tuple(owner.shape)
    length = owner.numel() * owner.element_size()
    data = memoryview(raw(owner.data_ptr(), length)).cast("B") if length else memoryview(b"")
    header = Header(code, shape, shape, LAYOUT_FULL, (), METADATA_SIZE, length)
    return TensorObject(header, data), owner


def header_bytes(header):
    """The packed form of a ``Header`` (its data following at once)."""
    return pack_header(header.dtype, header.global_shape, header.local_shape, header.layout_kind,
                       header.axes)


def to_tensor(buffer, length=None):
    """A CPU tensor over ``buffer`` (header + data; kept alive by the tensor), or ``None`` when
    the header is invalid."""
    torch = torch_module()
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


def write_parts(store, key, header, data, config, upsert):
    """Stores ``header`` (bytes) then ``data`` (bytes-like) as one object: the store's
    ``put_parts`` (or ``upsert_parts``), so nothing is staged here."""
    parts = (header, data) if len(data) else (header,)
    write = store.upsert_parts if upsert else store.put_parts
    return write(key, *parts, config=config)


def write_object(store, key, obj, config, upsert):
    return write_parts(store, key, header_bytes(obj.header), obj.data, config, upsert)


def _address(data, held):
    """The address of bytes-like ``data`` (read in place when writable, else copied into a
    ctypes buffer), kept valid by what is appended to ``held``."""
    try:
        array = (ctypes.c_char * len(data)).from_buffer(data)
    except TypeError:
        array = ctypes.create_string_buffer(bytes(data), len(data))
    held.append(array)
    return ctypes.addressof(array)


def write_batch(store, keys, objects, config, upsert):
    """Stores each ``(header bytes, data)`` of ``objects`` under its key of ``keys`` with one
    batch call (``batch_put_from_multi_buffers``, or its upsert form): one master round trip
    for the batch, the data read in place. Per key 0 or a negative code (every key
    INVALID_PARAMS when the store gives no per-key answer: not set up)."""
    held, pointers, sizes = [], [], []
    for header, data in objects:
        parts = (header, data) if len(data) else (header,)
        pointers.append([_address(part, held) for part in parts])
        sizes.append([len(part) for part in parts])
    write = store._batch_upsert_from_multi_buffers if upsert else store.batch_put_from_multi_buffers
    codes = write(keys, pointers, sizes, config=config)
    del held
    return codes if len(codes) == len(keys) else [INVALID_PARAMS] * len(keys)


def write_all_shards(store, obj, count, split_dim, name, config, upsert):
    """Splits the full tensor ``obj`` into ``count`` uniform shards along ``split_dim`` and
    stores them with one batch write: ``name(rank, local_shape)`` gives each its (key, layout
    axes). INVALID_PARAMS, with nothing stored, when the split is not possible; else 0 or the
    code of the first shard that failed (the others are stored, as upstream's batch)."""
    if slice_shard(obj, split_dim, 0, count) is None:
        return INVALID_PARAMS
    if config is not None and config.group_ids is not None and len(config.group_ids) == 1:
        config = with_groups(config, config.group_ids * count)  # every shard in the key's group
    keys, objects = [], []
    for rank in range(count):
        local, data = slice_shard(obj, split_dim, rank, count)
        key, axes = name(rank, local)
        keys.append(key)
        objects.append((pack_header(obj.header.dtype, obj.header.global_shape, local,
                                    LAYOUT_SHARD, axes), data))
    return next((rc for rc in write_batch(store, keys, objects, config, upsert) if rc != 0), 0)


def _write(store, key, tensor, config, upsert):
    try:
        obj, owner = object_of_tensor(tensor)
    except ValueError:
        return INVALID_PARAMS
    rc = write_object(store, key, obj, config, upsert)
    del owner
    return rc


def batch(keys, values, one):
    """``one(key, value)`` per pair; all INVALID_PARAMS when the lists differ in length."""
    if len(keys) != len(values):
        return [INVALID_PARAMS] * len(keys)
    return [one(k, v) for k, v in zip(keys, values)]


def same_lengths(keys, *lists):
    return all(len(x) == len(keys) for x in lists)


def check_publish(config):
    """Upstream's publish check: preferred segments, when given, one per replica."""
    segments = config.preferred_segments
    return not segments or len(segments) == config.replica_num


# The ReplicateConfig attributes a per-key copy carries over (all but group_ids).
_CONFIG_FIELDS = ("replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_action",
                  "soft_pin_ttl_ms", "with_hard_pin", "preferred_segments",
                  "preferred_nof_segments", "preferred_segment", "prefer_alloc_in_same_node",
                  "data_type")


def per_key_configs(config, n):
    """The config of each of ``n`` keys of a batch (upstream's ``ForSingleKey``): ``config``
    itself (or ``None``) without group ids, else a copy naming only key ``i``'s group. ``None``
    when the group ids are not one per key (upstream's ``ValidateGroupIdsForBatchConfig``:
    every key then fails)."""
    groups = None if config is None else config.group_ids
    if groups is None:
        return [config] * n
    if len(groups) != n:
        return None
    return [with_groups(config, [group]) for group in groups]


def with_groups(config, groups):
    """A copy of ``config`` whose group ids are ``groups``."""
    copy = store_module().ReplicateConfig()
    for name in _CONFIG_FIELDS:
        setattr(copy, name, getattr(config, name))
    copy.group_ids = groups
    return copy


def write_tensors(store, keys, tensors, config, upsert):
    """Stores each tensor of ``tensors`` under its key with one batch write: per key 0 or a
    negative code, INVALID_PARAMS for a tensor that cannot be serialised (the others are
    written), every key INVALID_PARAMS when the lists differ in length or the config's group
    ids are not one per key."""
    n = len(keys)
    groups = None if config is None else config.group_ids
    if len(tensors) != n or (groups is not None and len(groups) != n):
        return [INVALID_PARAMS] * n
    chosen, objects, owners = [], [], []
    for i, tensor in enumerate(tensors):
        try:
            obj, owner = object_of_tensor(tensor)
        except ValueError:
            continue
        chosen.append(i)
        objects.append((header_bytes(obj.header), obj.data))
        owners.append(owner)
    if not chosen:
        return [INVALID_PARAMS] * n
    if groups is not None and len(chosen) < n:
        config = with_groups(config, [groups[i] for i in chosen])
    written = write_batch(store, [keys[i] for i in chosen], objects, config, upsert)
    del owners
    return scattered(n, chosen, written)


def scattered(n, chosen, written):
    """``n`` codes: ``written[j]`` for key ``chosen[j]``, INVALID_PARAMS for the keys not
    chosen."""
    codes = [INVALID_PARAMS] * n
    for i, rc in zip(chosen, written):
        codes[i] = rc
    return codes


def batch_with_config(keys, values, config, one):
    """``one(key, value, config_of_key)`` per pair (``batch``'s rules, and every key
    INVALID_PARAMS when the config's group ids are not one per key)."""
    configs = per_key_configs(config, len(keys))
    if configs is None or len(values) != len(keys):
        return [INVALID_PARAMS] * len(keys)
    return [one(k, v, c) for k, v, c in zip(keys, values, configs)]


def put_tensor(store, key, tensor):
    return _write(store, key, tensor, None, False)


def upsert_tensor(store, key, tensor):
    return _write(store, key, tensor, None, True)


def batch_put_tensor(store, keys, tensors_list):
    return write_tensors(store, keys, tensors_list, None, False)


def batch_upsert_tensor(store, keys, tensors_list):
    return write_tensors(store, keys, tensors_list, None, True)


def pub_tensor(store, key, tensor, config=None):
    config = config or store_module().ReplicateConfig()
    return _write(store, key, tensor, config, False) if check_publish(config) else INVALID_PARAMS


def upsert_pub_tensor(store, key, tensor, config=None):
    config = config or store_module().ReplicateConfig()
    return _write(store, key, tensor, config, True) if check_publish(config) else INVALID_PARAMS


def _batch_pub(store, keys, tensors_list, config, upsert):
    config = config or store_module().ReplicateConfig()
    if not check_publish(config):
        return [INVALID_PARAMS] * len(keys)
    return write_tensors(store, keys, tensors_list, config, upsert)


def batch_pub_tensor(store, keys, tensors_list, config=None):
    return _batch_pub(store, keys, tensors_list, config, False)


def batch_upsert_pub_tensor(store, keys, tensors_list, config=None):
    return _batch_pub(store, keys, tensors_list, config, True)


def get_tensor(store, key):
    handle = store.get_buffer(key)
    return None if handle is None else to_tensor(handle)


def batch_get_tensor(store, keys):
    return [None if h is None else to_tensor(h) for h in store.batch_get_buffer(keys)]


def get_tensor_into(store, key, buffer_ptr, size):
    if not 0 < buffer_ptr < MAX_BUFFER:
        return None
    n = store.get_into(key, buffer_ptr, size)
    return None if n < 0 else to_tensor(raw(buffer_ptr, n))


def batch_get_tensor_into(store, keys, buffer_ptrs, sizes):
    if not same_lengths(keys, buffer_ptrs, sizes):
        return [INVALID_PARAMS] * len(keys)
    got = store.batch_get_into(keys, buffer_ptrs, sizes)
    return [None if n < 0 else to_tensor(raw(p, n)) for n, p in zip(got, buffer_ptrs)]


def put_tensor_from(store, key, buffer_ptr, size):
    if object_of_buffer(buffer_ptr, size) is None:
        return INVALID_PARAMS
    return store.put_from(key, buffer_ptr, size)


def upsert_tensor_from(store, key, buffer_ptr, size):
    if object_of_buffer(buffer_ptr, size) is None:
        return INVALID_PARAMS
    return store.upsert_from(key, buffer_ptr, size)


def _batch_from(store, keys, buffer_ptrs, sizes, upsert):
    """The buffers holding valid tensor objects stored with one batch write (zero-copy),
    INVALID_PARAMS for the others; every key INVALID_PARAMS when the lists differ in length."""
    if not same_lengths(keys, buffer_ptrs, sizes):
        return [INVALID_PARAMS] * len(keys)
    chosen = [i for i, (p, s) in enumerate(zip(buffer_ptrs, sizes))
              if object_of_buffer(p, s) is not None]
    if not chosen:
        return [INVALID_PARAMS] * len(keys)
    write = store.batch_upsert_from if upsert else store.batch_put_from
    written = write([keys[i] for i in chosen], [buffer_ptrs[i] for i in chosen],
                    [sizes[i] for i in chosen])
    return scattered(len(keys), chosen, written)


def batch_put_tensor_from(store, keys, buffer_ptrs, sizes):
    return _batch_from(store, keys, buffer_ptrs, sizes, False)


def batch_upsert_tensor_from(store, keys, buffer_ptrs, sizes):
    return _batch_from(store, keys, buffer_ptrs, sizes, True)


def batch_get_tensor_into_cuda(store, keys, tensors_list):
    """Upstream's dummy-only CUDA read: the payload of each stored tensor object copied into
    the CUDA tensor given for it, which must be contiguous with the stored dtype and shape.
    Per key the bytes copied, or INVALID_PARAMS (absent, mismatched, not a CUDA tensor); all
    INVALID_PARAMS for lists of different lengths or a store that is not a dummy. Upstream has
    the real client write into the tensor over CUDA IPC; here the dummy reads the object
    through its usual path and torch copies it to the device: the same bytes, one host hop."""
    results = [INVALID_PARAMS] * len(keys)
    if len(keys) != len(tensors_list) or not store._is_dummy():
        return results
    torch = torch_module()
    for i, (handle, dst) in enumerate(zip(store.batch_get_buffer(keys), tensors_list)):
        obj = None if handle is None else object_of_bytes(handle)
        if obj is None or not _is_tensor(dst) or not dst.is_cuda or not dst.is_contiguous():
            continue
        if _dtype_code(torch, dst.dtype) != obj.header.dtype:
            continue
        if tuple(dst.shape) != obj.header.local_shape:
            continue
        if obj.header.data_bytes:
            source = torch.frombuffer(handle, dtype=torch.uint8, count=obj.header.data_bytes,
                                      offset=obj.header.data_offset)
            dst.reshape(-1).view(torch.uint8).copy_(source)
        results[i] = obj.header.data_bytes
    return results


def get_tensor_into_cuda(store, key, tensor):
    return batch_get_tensor_into_cuda(store, [key], [tensor])[0]


def tp_key(key, rank):
    """The key of TP shard ``rank`` (upstream's legacy single-axis layout)."""
    return f"{key}_tp_{rank}"


def put_tp_shards(store, key, obj, tp_size, split_dim, config, upsert):
    """All ``tp_size`` shards of the full tensor ``obj`` under ``tp_key(key, rank)``, each with
    its single TP axis."""
    return write_all_shards(store, obj, tp_size, split_dim, lambda rank, local: (
        tp_key(key, rank), (layout_axis(AXIS_TP, 0, rank, tp_size, split_dim, local),)),
        config, upsert)


def _put_with_tp(store, key, tensor, tp_size, split_dim, config, upsert):
    if tp_size <= 1:
        return _write(store, key, tensor, config, upsert)
    try:
        obj, owner = object_of_tensor(tensor)
    except ValueError:
        return INVALID_PARAMS
    rc = put_tp_shards(store, key, obj, tp_size, split_dim, config, upsert)
    del owner
    return rc


def put_tensor_with_tp(store, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
    return _put_with_tp(store, key, tensor, tp_size, split_dim, None, False)


def batch_put_tensor_with_tp(store, base_keys, tensors_list, tp_rank=0, tp_size=1, split_dim=0):
    return batch(base_keys, tensors_list,
                 lambda k, t: put_tensor_with_tp(store, k, t, tp_rank, tp_size, split_dim))


def pub_tensor_with_tp(store, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
    config = config or store_module().ReplicateConfig()
    if not check_publish(config):
        return INVALID_PARAMS
    return _put_with_tp(store, key, tensor, tp_size, split_dim, config, False)


def batch_pub_tensor_with_tp(store, base_keys, tensors_list, config=None, tp_rank=0, tp_size=1,
                             split_dim=0):
    return batch_with_config(base_keys, tensors_list, config, lambda k, t, c: pub_tensor_with_tp(
        store, k, t, c, tp_rank, tp_size, split_dim))


def put_tensor_with_tp_from(store, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
    """Upstream's ``put_tensor_with_tp_from``: the full tensor object at ``buffer_ptr`` split
    into its ``tp_size`` shards, stored as ``put_tensor_with_tp`` stores them (the whole object
    under ``key`` when ``tp_size <= 1``)."""
    if tp_size <= 1:
        return put_tensor_from(store, key, buffer_ptr, size)
    obj = object_of_buffer(buffer_ptr, size)
    if obj is None:
        return INVALID_PARAMS
    return put_tp_shards(store, key, obj, tp_size, split_dim, None, False)


def batch_put_tensor_with_tp_from(store, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                  split_dim=0):
    if not same_lengths(base_keys, buffer_ptrs, sizes):
        return [INVALID_PARAMS] * len(base_keys)
    return [put_tensor_with_tp_from(store, k, p, s, tp_rank, tp_size, split_dim)
            for k, p, s in zip(base_keys, buffer_ptrs, sizes)]


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
