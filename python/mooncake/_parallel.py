"""Upstream's unified parallel tensor IO (spec python-api.md section 4.10, "Unified parallelism
IO"; Mooncake's ``docs/source/design/store/unified-parallel-tensor-io.md``): the helper classes
``ParallelAxis``, ``TensorParallelism`` and ``ReadTarget`` and the ``*_tensor_with_parallelism*``
methods of ``MooncakeDistributedStore``, which the native class forwards here with the store
first.

Everything below works on tensor objects as bytes (``mooncake._tensor.TensorObject``): the
``*_from`` writes and the byte readers (``read_object``, ``read_object_into``) need no torch;
the calls that take or return tensors convert at the edge.

Objects, keys and manifests are upstream's, so either side reads what the other wrote:

- a shard is stored with a SHARD header whose layout axes are the request's (in the caller's
  order; an EP axis's expert id and a PP axis's stage id in ``reserved0``, the local extent
  along ``split_dim`` in ``reserved1``);
- its key is ``f"{key}_tp_{rank}"`` for a single TP axis, else ``key`` followed by
  ``__{kind}_{rank}of{size}[_sd{d}][_eid{e}][_sid{s}]`` per axis in the order dp, tp, ep, pp;
- a writer partition is stored under ``f"{key}__writer_{r}of{n}_sd{d}"`` with a TP axis;
- manifests (``f"{key}__writer_manifest"``, ``f"{key}__parallelism_manifest"``) are upstream's
  96-byte ``WriterShardManifest``: magic ``0x574d414e``, version 1, header size, dtype, ndim,
  split dim, shard count, then the global shape (8 int64, -1 padded).

Write routes, as upstream's: no parallelism stores the tensor whole; a writer partition stores
shard ``rank`` of the full tensor plus the writer manifest; a single TP axis takes the tensor as
*the shard* of that rank (the global shape inferred) and writes the parallelism manifest, while
the ``*_from`` form takes a full tensor and stores all its TP shards; several axes with a TP axis
take the full tensor and store the requested rank's shard plus the manifest (``*_from``: all
ranks; here with the manifest too, which upstream's ``*_from`` leaves out); axes without TP
store the tensor as it is, tagged. Reads (``ReadTarget``): ``as_stored``
returns the object under ``key``; ``shard`` the object stored for exactly those axes, else (with
a TP axis) the requested shard cut from the reconstructed tensor, so a tensor written at TP 4
reads at TP 2; ``full`` rebuilds the whole tensor from its shards (from the writer manifest when
no parallelism is given). Every shard read for a reconstruction must carry the rank, count,
split dim, dtype, global shape and other axes the manifest or request says, else the read
returns ``None``: never a tensor stitched from mismatched pieces.
"""

import struct
from collections import namedtuple

from mooncake import _tensor as t

INVALID_PARAMS = t.INVALID_PARAMS

KIND_CODES = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}
KIND_NAMES = {code: name for name, code in KIND_CODES.items()}
EP, PP = KIND_CODES["ep"], KIND_CODES["pp"]
MAX_AXES = t.MAX_AXES

MANIFEST_MAGIC = 0x574D414E
MANIFEST_VERSION = 1
# WriterShardManifestHeader (u32, u16, u16, 5 x i32), 4 bytes of padding, TensorShape.
_MANIFEST = struct.Struct("<IHHiiiii4x8q")
MANIFEST_SIZE = _MANIFEST.size  # 96

READ_MODES = ("as_stored", "shard", "full")


# --- the helper classes --------------------------------------------------------------------


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _int(value, name):
    """``value`` when it is an int (not a bool) in int32 range, what upstream's C++ fields
    hold; else ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not INT32_MIN <= value <= INT32_MAX:
        raise TypeError(f"{name} must be an int32")
    return value


def _optional_int(value, name):
    return None if value is None else _int(value, name)


class ParallelAxis:
    """One axis of a shard's identity: ``kind`` ("tp", "dp", "ep" or "pp", any case), ``rank``
    and ``size``, and where the kind needs them ``split_dim`` (TP), ``expert_id`` (EP),
    ``stage_id`` (PP). Plain data; checked when a call uses it."""

    __slots__ = ("_kind", "_rank", "_size", "_split_dim", "_expert_id", "_stage_id")

    def __init__(self):
        self._kind, self._rank, self._size = "", 0, 1
        self._split_dim = self._expert_id = self._stage_id = None

    def _set_kind(self, value):
        if not isinstance(value, str):
            raise TypeError("kind must be a str")
        self._kind = value

    kind = property(lambda self: self._kind, _set_kind)
    rank = property(lambda self: self._rank,
                    lambda self, v: setattr(self, "_rank", _int(v, "rank")))
    size = property(lambda self: self._size,
                    lambda self, v: setattr(self, "_size", _int(v, "size")))
    split_dim = property(lambda self: self._split_dim,
                         lambda self, v: setattr(self, "_split_dim", _optional_int(v, "split_dim")))
    expert_id = property(lambda self: self._expert_id,
                         lambda self, v: setattr(self, "_expert_id", _optional_int(v, "expert_id")))
    stage_id = property(lambda self: self._stage_id,
                        lambda self, v: setattr(self, "_stage_id", _optional_int(v, "stage_id")))


class TensorParallelism:
    """The axes of a shard (a list of ``ParallelAxis``; the getter returns a copy)."""

    __slots__ = ("_axes",)

    def __init__(self):
        self._axes = []

    @property
    def axes(self):
        return list(self._axes)

    @axes.setter
    def axes(self, value):
        value = list(value)
        if not all(isinstance(a, ParallelAxis) for a in value):
            raise TypeError("axes must be a list of ParallelAxis")
        self._axes = value


class ReadTarget:
    """What a read wants: ``mode`` "as_stored" (default), "shard" or "full" (the setter takes
    any case; another value raises RuntimeError), and the ``parallelism`` it names."""

    __slots__ = ("_mode", "_parallelism")

    def __init__(self):
        self._mode, self._parallelism = "as_stored", None

    @property
    def mode(self):
        return self._mode

    @mode.setter
    def mode(self, value):
        mode = str(value).lower()
        if mode not in READ_MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = mode

    @property
    def parallelism(self):
        return self._parallelism

    @parallelism.setter
    def parallelism(self, value):
        if value is not None and not isinstance(value, TensorParallelism):
            raise TypeError("parallelism must be a TensorParallelism or None")
        self._parallelism = value


# --- requests ----------------------------------------------------------------------------------

# An axis as the calls use it: ``kind`` a code of KIND_CODES, the optional fields None or int.
AxisSpec = namedtuple("AxisSpec", "kind rank size split_dim expert_id stage_id")
Writer = namedtuple("Writer", "rank size split_dim")


def _optional(obj, name):
    return _optional_int(getattr(obj, name, None), name)


def parse_parallelism(obj):
    """The valid axes of a ``TensorParallelism``-like object (anything with ``axes`` whose
    items have ``kind``, ``rank``, ``size``, ``split_dim``, ``expert_id``, ``stage_id``), or
    ``None``: no axes or more than 4, an unknown or repeated kind, a rank outside
    ``[0, size)``, a TP axis without ``split_dim``, an EP axis without ``expert_id``, a PP axis
    without ``stage_id``, or a ``split_dim`` on a DP, EP or PP axis (upstream's rules)."""
    try:
        axes = [AxisSpec(KIND_CODES.get(str(a.kind).lower()), _int(a.rank, "rank"),
                         _int(a.size, "size"),
                         _optional(a, "split_dim"), _optional(a, "expert_id"),
                         _optional(a, "stage_id")) for a in obj.axes]
    except (AttributeError, TypeError, ValueError):
        return None
    if not 0 < len(axes) <= MAX_AXES or len({a.kind for a in axes}) != len(axes):
        return None
    for a in axes:
        if a.kind is None or not 0 <= a.rank < a.size:
            return None
        if (a.kind == KIND_CODES["tp"]) != (a.split_dim is not None):
            return None
        if (a.kind == EP) != (a.expert_id is not None) or (a.kind == PP) != (a.stage_id is not None):
            return None
    return axes


def parse_writer(obj):
    """The ``Writer`` of an object with ``rank``, ``size``, ``split_dim``, or ``None``."""
    try:
        writer = Writer(_int(obj.rank, "rank"), _int(obj.size, "size"),
                        _int(obj.split_dim, "split_dim"))
    except (AttributeError, TypeError, ValueError):
        return None
    ok = 0 <= writer.rank < writer.size and writer.split_dim >= 0
    return writer if ok else None


def parse_target(obj):
    """(mode, axes or None) of a ``ReadTarget``-like object (``None``: as stored), or ``None``
    for an unknown mode or invalid axes."""
    if obj is None:
        return "as_stored", None
    mode = str(getattr(obj, "mode", "")).lower()
    if mode not in READ_MODES or not hasattr(obj, "parallelism"):
        return None
    if obj.parallelism is None:
        return mode, None
    axes = parse_parallelism(obj.parallelism)
    return None if axes is None else (mode, axes)


def tp_index(axes):
    return next((i for i, a in enumerate(axes) if a.kind == KIND_CODES["tp"]), None)


def canonical(axes):
    return sorted(axes, key=lambda a: a.kind)


def with_tp(axes, rank, size=None):
    """``axes`` with the TP axis's rank (and size) replaced."""
    i = tp_index(axes)
    axes = list(axes)
    axes[i] = axes[i]._replace(rank=rank, size=axes[i].size if size is None else size)
    return axes


def shard_key(key, axes):
    """Upstream's ``get_parallelism_key_name``."""
    if len(axes) == 1 and axes[0].kind == KIND_CODES["tp"]:
        return t.tp_key(key, axes[0].rank)
    parts = [key]
    for a in canonical(axes):
        part = f"{KIND_NAMES[a.kind]}_{a.rank}of{a.size}"
        part += "" if a.split_dim is None else f"_sd{a.split_dim}"
        part += "" if a.expert_id is None else f"_eid{a.expert_id}"
        part += "" if a.stage_id is None else f"_sid{a.stage_id}"
        parts.append(part)
    return "__".join(parts)


def writer_key(key, writer):
    return f"{key}__writer_{writer.rank}of{writer.size}_sd{writer.split_dim}"


def writer_manifest_key(key):
    return f"{key}__writer_manifest"


def parallelism_manifest_key(key):
    return f"{key}__parallelism_manifest"


def layout_axes(axes, local_shape):
    """The stored layout axes of a shard of ``local_shape`` with ``axes``, or ``None`` when a
    ``split_dim`` is outside the shape."""
    if any(a.split_dim is not None and not 0 <= a.split_dim < len(local_shape) for a in axes):
        return None
    return tuple(t.layout_axis(a.kind, i, a.rank, a.size, a.split_dim, local_shape,
                               a.expert_id if a.kind == EP else a.stage_id if a.kind == PP else 0)
                 for i, a in enumerate(axes))


def axes_of_header(header):
    """The canonical axes a stored shard carries, or ``None`` for a full object."""
    if header.layout_kind != t.LAYOUT_SHARD:
        return None
    return canonical(AxisSpec(a.kind, a.shard_rank, a.shard_count,
                              None if a.split_dim < 0 else a.split_dim,
                              a.reserved0 if a.kind == EP else None,
                              a.reserved0 if a.kind == PP else None) for a in header.axes)


# --- manifests -----------------------------------------------------------------------------

Manifest = namedtuple("Manifest", "dtype global_shape split_dim shard_count")


def pack_manifest(dtype, global_shape, split_dim, shard_count):
    dims = (tuple(global_shape) + (-1,) * t.MAX_DIMS)[:t.MAX_DIMS]
    return _MANIFEST.pack(MANIFEST_MAGIC, MANIFEST_VERSION, MANIFEST_SIZE, dtype,
                          len(global_shape), split_dim, shard_count, 0, *dims)


def parse_manifest(buffer):
    """The ``Manifest`` in ``buffer``, or ``None`` when upstream would refuse it."""
    view = memoryview(buffer).cast("B")
    if len(view) < MANIFEST_SIZE:
        return None
    magic, version, size, dtype, ndim, split_dim, count, _r, *dims = _MANIFEST.unpack_from(view)
    if (magic, version, size) != (MANIFEST_MAGIC, MANIFEST_VERSION, MANIFEST_SIZE):
        return None
    if not 0 <= ndim <= t.MAX_DIMS or count <= 0 or not 0 <= split_dim < ndim:
        return None
    if not 0 <= dtype < len(t.DTYPES) or any(d < 0 for d in dims[:ndim]):
        return None
    return Manifest(dtype, tuple(dims[:ndim]), split_dim, count)


def _read_manifest(store, key):
    handle = store.get_buffer(key)
    return None if handle is None else parse_manifest(handle)


# --- writes --------------------------------------------------------------------------------


def _write_shard(store, key, obj, global_shape, local_shape, data, axes, config, upsert):
    layout = layout_axes(axes, local_shape)
    if layout is None:
        return INVALID_PARAMS
    header = t.pack_header(obj.header.dtype, global_shape, local_shape, t.LAYOUT_SHARD, layout)
    return t.write_parts(store, key, header, data, config, upsert)


def _write_manifest(store, key, dtype, global_shape, split_dim, count, config, upsert):
    manifest = pack_manifest(dtype, global_shape, split_dim, count)
    return t.write_parts(store, key, manifest, b"", config, upsert)


def _write_rank_shard(store, key, obj, axes, name, manifest_key, config, upsert):
    """Shard ``axes``' TP rank of the full ``obj`` under ``name``, then the manifest."""
    tp = axes[tp_index(axes)]
    shard = t.slice_shard(obj, tp.split_dim, tp.rank, tp.size)
    if shard is None:
        return INVALID_PARAMS
    local, data = shard
    global_shape = obj.header.global_shape
    rc = _write_shard(store, name, obj, global_shape, local, data, axes, config, upsert)
    if rc != 0:
        return rc
    return _write_manifest(store, manifest_key, obj.header.dtype, global_shape, tp.split_dim,
                           tp.size, config, upsert)


def _write_given_shard(store, key, obj, axes, config, upsert):
    """``obj`` is the shard of ``axes``' single TP axis: its global shape is inferred."""
    tp = axes[0]
    local = obj.header.local_shape
    if not t.is_full(obj.header) or not 0 <= tp.split_dim < len(local):
        return INVALID_PARAMS
    global_shape = local[:tp.split_dim] + (local[tp.split_dim] * tp.size,) + local[tp.split_dim + 1:]
    rc = _write_shard(store, shard_key(key, axes), obj, global_shape, local, obj.data, axes,
                      config, upsert)
    if rc != 0:
        return rc
    return _write_manifest(store, parallelism_manifest_key(key), obj.header.dtype, global_shape,
                           tp.split_dim, tp.size, config, upsert)


def _write_all_ranks(store, key, obj, axes, config, upsert):
    """Every TP rank of the full ``obj``, each under its own key (upstream's ``*_from`` route),
    then the parallelism manifest (which upstream's route leaves out: with it a read at another
    TP size finds the stored count for any axes, not only for a single TP axis)."""
    tp = axes[tp_index(axes)]

    def name(rank, local):
        rank_axes = with_tp(axes, rank)
        return shard_key(key, rank_axes), layout_axes(rank_axes, local)

    if layout_axes(axes, obj.header.global_shape) is None:
        return INVALID_PARAMS
    rc = t.write_all_shards(store, obj, tp.size, tp.split_dim, name, config, upsert)
    if rc != 0:
        return rc
    return _write_manifest(store, parallelism_manifest_key(key), obj.header.dtype,
                           obj.header.global_shape, tp.split_dim, tp.size, config, upsert)


def write_with_parallelism(store, key, obj, parallelism, config, writer_partition, upsert,
                           from_buffer):
    """Stores the tensor object ``obj`` as the request says (module doc: write routes).
    ``from_buffer`` selects the ``*_from`` behaviour of the TP routes. Returns 0 or a negative
    code; INVALID_PARAMS, with nothing stored, for a request that cannot be met."""
    config = config or t.store_module().ReplicateConfig()
    if not t.check_publish(config):
        return INVALID_PARAMS
    if writer_partition is not None:
        writer = None if parallelism is not None else parse_writer(writer_partition)
        if writer is None:
            return INVALID_PARAMS
        shard = t.slice_shard(obj, writer.split_dim, writer.rank, writer.size)
        if shard is None:
            return INVALID_PARAMS
        local, data = shard
        axes = [AxisSpec(KIND_CODES["tp"], writer.rank, writer.size, writer.split_dim, None, None)]
        rc = _write_shard(store, writer_key(key, writer), obj, obj.header.global_shape, local,
                          data, axes, config, upsert)
        if rc != 0:
            return rc
        return _write_manifest(store, writer_manifest_key(key), obj.header.dtype,
                               obj.header.global_shape, writer.split_dim, writer.size, config,
                               upsert)
    if parallelism is None:
        return t.write_object(store, key, obj, config, upsert)
    axes = parse_parallelism(parallelism)
    if axes is None:
        return INVALID_PARAMS
    if tp_index(axes) is None:
        h = obj.header
        return _write_shard(store, shard_key(key, axes), obj, h.global_shape, h.local_shape,
                            obj.data, axes, config, upsert)
    if from_buffer:
        return _write_all_ranks(store, key, obj, axes, config, upsert)
    if len(axes) == 1:
        return _write_given_shard(store, key, obj, axes, config, upsert)
    return _write_rank_shard(store, key, obj, axes, shard_key(key, axes),
                             parallelism_manifest_key(key), config, upsert)


def _tensor_write(store, key, tensor, parallelism, config, writer_partition, upsert):
    try:
        obj, owner = t.object_of_tensor(tensor)
    except ValueError:
        return INVALID_PARAMS
    rc = write_with_parallelism(store, key, obj, parallelism, config, writer_partition, upsert,
                                False)
    del owner
    return rc


def _buffer_write(store, key, buffer_ptr, size, parallelism, config, writer_partition, upsert):
    obj = t.object_of_buffer(buffer_ptr, size)
    if obj is None:
        return INVALID_PARAMS
    return write_with_parallelism(store, key, obj, parallelism, config, writer_partition, upsert,
                                  True)


def _batch_requests(keys, values, parallelisms, config, writer_partitions, one):
    """``one(key, value, parallelism, writer_partition, config)`` per key, under upstream's
    batch rules: parallelisms and writer_partitions not both; each, when given, a list as long
    as ``keys``; the config's group ids one per key (each key gets a config naming its own);
    otherwise every key INVALID_PARAMS."""
    n = len(keys)
    configs = t.per_key_configs(config, n)
    if parallelisms is not None and writer_partitions is not None or len(values) != n:
        return [INVALID_PARAMS] * n
    for requests in (parallelisms, writer_partitions):
        if requests is not None and (not isinstance(requests, list) or len(requests) != n):
            return [INVALID_PARAMS] * n
    if configs is None:
        return [INVALID_PARAMS] * n
    pars = parallelisms or [None] * n
    writers = writer_partitions or [None] * n
    return [one(*args) for args in zip(keys, values, pars, writers, configs)]


def put_tensor_with_parallelism(store, key, tensor, parallelism=None, config=None,
                                writer_partition=None):
    return _tensor_write(store, key, tensor, parallelism, config, writer_partition, False)


def upsert_tensor_with_parallelism(store, key, tensor, parallelism=None, config=None,
                                   writer_partition=None):
    return _tensor_write(store, key, tensor, parallelism, config, writer_partition, True)


def batch_put_tensor_with_parallelism(store, keys, tensors_list, parallelisms=None, config=None,
                                      writer_partitions=None):
    return _batch_requests(keys, tensors_list, parallelisms, config, writer_partitions,
                           lambda k, v, p, w, c: _tensor_write(store, k, v, p, c, w, False))


def batch_upsert_tensor_with_parallelism(store, keys, tensors_list, parallelisms=None,
                                         config=None, writer_partitions=None):
    return _batch_requests(keys, tensors_list, parallelisms, config, writer_partitions,
                           lambda k, v, p, w, c: _tensor_write(store, k, v, p, c, w, True))


def put_tensor_with_parallelism_from(store, key, buffer_ptr, size, parallelism=None, config=None,
                                     writer_partition=None):
    return _buffer_write(store, key, buffer_ptr, size, parallelism, config, writer_partition,
                         False)


def upsert_tensor_with_parallelism_from(store, key, buffer_ptr, size, parallelism=None,
                                        config=None, writer_partition=None):
    return _buffer_write(store, key, buffer_ptr, size, parallelism, config, writer_partition,
                         True)


def _batch_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, one):
    if not t.same_lengths(keys, buffer_ptrs, sizes):
        return [INVALID_PARAMS] * len(keys)
    return _batch_requests(keys, list(zip(buffer_ptrs, sizes)), parallelisms, config,
                           writer_partitions, lambda k, v, p, w, c: one(k, v[0], v[1], p, w, c))


def batch_put_tensor_with_parallelism_from(store, keys, buffer_ptrs, sizes, parallelisms=None,
                                           config=None, writer_partitions=None):
    return _batch_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions,
                       lambda k, b, s, p, w, c: _buffer_write(store, k, b, s, p, c, w, False))


def batch_upsert_tensor_with_parallelism_from(store, keys, buffer_ptrs, sizes, parallelisms=None,
                                              config=None, writer_partitions=None):
    return _batch_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions,
                       lambda k, b, s, p, w, c: _buffer_write(store, k, b, s, p, c, w, True))


# --- reads ---------------------------------------------------------------------------------

# The shards a full tensor is rebuilt from: its dtype, global shape and split dim, and per
# shard (in rank order) its parsed object, kept alive by the handle it views.
Reconstruction = namedtuple("Reconstruction", "dtype global_shape split_dim shards")


def _objects(store, keys):
    """The ``TensorObject`` under each key (all read in one batch), or ``None`` if any is
    missing or not a valid tensor object."""
    handles = store.batch_get_buffer(keys)
    objects = [None if h is None else t.object_of_bytes(h) for h in handles]
    return None if any(o is None for o in objects) else objects


def _shards_fit(shards, dtype, global_shape, split_dim, count, only_tp):
    """Whether shard ``r`` of ``shards`` is exactly TP rank ``r`` of ``count`` along
    ``split_dim`` of a ``dtype`` tensor of ``global_shape`` (with ``only_tp``, carrying no
    other axis, as a writer partition)."""
    for rank, obj in enumerate(shards):
        h = obj.header
        tp = [a for a in h.axes if a.kind == KIND_CODES["tp"]]
        if h.layout_kind != t.LAYOUT_SHARD or len(tp) != 1 or h.dtype != dtype:
            return False
        if only_tp and len(h.axes) != 1:
            return False
        if (tp[0].shard_rank, tp[0].shard_count, tp[0].split_dim) != (rank, count, split_dim):
            return False
        extent = t.shard_range(global_shape[split_dim], rank, count)[1]
        local = global_shape[:split_dim] + (extent,) + global_shape[split_dim + 1:]
        if h.global_shape != global_shape or h.local_shape != local:
            return False
    return True


def _others_match(shards, axes):
    """Whether every shard carries ``axes``' non-TP axes exactly (and no others)."""
    others = [a for a in canonical(axes) if a.kind != KIND_CODES["tp"]]
    for obj in shards:
        stored = axes_of_header(obj.header)
        if stored is None or [a for a in stored if a.kind != KIND_CODES["tp"]] != others:
            return False
    return True


# Most shards a reconstruction reads when the split dimension is smaller (a manifest or
# header claiming more is refused before any key is named).
MAX_EMPTY_SHARDS = 1 << 16


def _reconstruction(store, name, dtype, global_shape, split_dim, count, only_tp=False):
    """The ``count`` shards ``name(rank)`` of a ``dtype`` tensor of ``global_shape`` split
    along ``split_dim``, or ``None`` when the split is not uniform or any shard is missing or
    does not fit."""
    if not 0 <= split_dim < len(global_shape) or count <= 0:
        return None
    dim = global_shape[split_dim]
    if dim % count or count > max(dim, MAX_EMPTY_SHARDS):
        return None
    shards = _objects(store, [name(rank) for rank in range(count)])
    if shards is None or not _shards_fit(shards, dtype, global_shape, split_dim, count, only_tp):
        return None
    return Reconstruction(dtype, global_shape, split_dim, shards)


def _writer_reconstruction(store, key):
    manifest = _read_manifest(store, writer_manifest_key(key))
    if manifest is None:
        return None
    count, split_dim = manifest.shard_count, manifest.split_dim
    return _reconstruction(store, lambda r: writer_key(key, Writer(r, count, split_dim)),
                           manifest.dtype, manifest.global_shape, split_dim, count, True)


def _shards_of(store, key, axes, dtype, shape, count):
    """The ``count`` TP shards of ``axes``' tensor, whose other axes must be ``axes``'."""
    tp = axes[tp_index(axes)]
    if not 0 <= tp.split_dim < len(shape) or shape[tp.split_dim] % tp.size:
        return None
    found = _reconstruction(store, lambda r: shard_key(key, with_tp(axes, r, count)), dtype,
                            shape, tp.split_dim, count)
    return found if found is not None and _others_match(found.shards, axes) else None


def _parallelism_reconstruction(store, key, axes):
    """The shards of the tensor that ``axes`` (with a TP axis) names one shard of: as the
    parallelism manifest says when there is one that fits, else as the stored shards say (the
    count of a single TP axis's legacy keys from its rank 0 shard, else the request's)."""
    tp = axes[tp_index(axes)]
    manifest = _read_manifest(store, parallelism_manifest_key(key))
    if manifest is not None and manifest.split_dim == tp.split_dim:
        found = _shards_of(store, key, axes, manifest.dtype, manifest.global_shape,
                           manifest.shard_count)
        if found is not None:
            return found
    first = _objects(store, [shard_key(key, with_tp(axes, 0))])
    if first is None:
        return None
    stored_tp = [a for a in first[0].header.axes if a.kind == KIND_CODES["tp"]]
    count = stored_tp[0].shard_count if len(axes) == 1 and stored_tp else tp.size
    return _shards_of(store, key, axes, first[0].header.dtype, first[0].header.global_shape,
                      count)


def _assemble(found, header, start, extent):
    """Header + the ``[start, start + extent)`` span of the rebuilt tensor along its split dim,
    as one ``bytearray``."""
    item = t.DTYPES[found.dtype][1]
    head = t.header_bytes(header)
    out = bytearray(head) + bytearray(header.data_bytes)
    data = memoryview(out)[len(head):]
    count = len(found.shards)
    for rank, shard in enumerate(found.shards):
        s, e = t.shard_range(found.global_shape[found.split_dim], rank, count)
        t.copy_span(found.global_shape, found.split_dim, item, data, start, extent, shard.data, s,
                    e)
    return out


def _full(found):
    shape = found.global_shape
    data_bytes = t.numel(shape) * t.DTYPES[found.dtype][1]
    header = t.Header(found.dtype, shape, shape, t.LAYOUT_FULL, (), t.METADATA_SIZE, data_bytes)
    return _assemble(found, header, 0, shape[found.split_dim])


def _target_shard(found, axes):
    tp = axes[tp_index(axes)]
    shape, dim = found.global_shape, found.split_dim
    start, extent = t.shard_range(shape[dim], tp.rank, tp.size)
    local = shape[:dim] + (extent,) + shape[dim + 1:]
    data_bytes = t.numel(local) * t.DTYPES[found.dtype][1]
    header = t.Header(found.dtype, shape, local, t.LAYOUT_SHARD, layout_axes(axes, local),
                      t.METADATA_SIZE, data_bytes)
    return _assemble(found, header, start, extent)


def _stored_shard(store, key, axes):
    """The object stored for exactly ``axes`` (or, for a single TP axis, the matching writer
    partition), or ``None``."""
    want = canonical(axes)
    names = [shard_key(key, axes)]
    if len(axes) == 1 and axes[0].kind == KIND_CODES["tp"]:
        names.append(writer_key(key, Writer(axes[0].rank, axes[0].size, axes[0].split_dim)))
    for name in names:
        handle = store.get_buffer(name)
        obj = None if handle is None else t.object_of_bytes(handle)
        if obj is not None and axes_of_header(obj.header) == want:
            return handle
    return None


def read_object(store, key, target=None):
    """Header + data of what ``target`` asks for (module doc: reads): the store's buffer or a
    new ``bytearray``; ``None`` when absent, mismatched or the request is invalid. Needs no
    torch."""
    request = parse_target(target)
    if request is None:
        return None
    mode, axes = request
    if axes is None:
        if mode == "shard":
            return None
        found = _writer_reconstruction(store, key) if mode == "full" else None
        if found is not None:
            return _full(found)
        handle = store.get_buffer(key)
        return handle if handle is not None and t.object_of_bytes(handle) else None
    if mode == "shard":
        stored = _stored_shard(store, key, axes)
        if stored is not None or tp_index(axes) is None:
            return stored
        found = _parallelism_reconstruction(store, key, axes)
        return None if found is None else _target_shard(found, axes)
    if mode == "full" and tp_index(axes) is not None:
        found = _parallelism_reconstruction(store, key, axes)
        return None if found is None else _full(found)
    return None


def read_object_into(store, key, buffer_ptr, size, target=None):
    """Bytes of ``read_object``'s answer written at ``buffer_ptr`` (``size`` bytes, caller
    memory), or ``None`` (absent, invalid, or larger than ``size``)."""
    if not 0 < buffer_ptr < t.MAX_BUFFER or not 0 <= size < t.MAX_BUFFER:
        return None
    request = parse_target(target)
    if request == ("as_stored", None):
        n = store.get_into(key, buffer_ptr, size)
        return n if n >= 0 and t.object_of_buffer(buffer_ptr, n) else None
    found = read_object(store, key, target)
    if found is None or len(found) > size:
        return None
    view = memoryview(found).cast("B")
    memoryview(t.raw(buffer_ptr, len(view))).cast("B")[:] = view
    return len(view)


def get_tensor_with_parallelism(store, key, target=None):
    found = read_object(store, key, target)
    return None if found is None else t.to_tensor(found)


def batch_get_tensor_with_parallelism(store, keys, targets=None):
    if targets is None:
        return t.batch_get_tensor(store, keys)
    if not isinstance(targets, list) or len(targets) != len(keys):
        return [None] * len(keys)
    return [get_tensor_with_parallelism(store, k, g) for k, g in zip(keys, targets)]


def get_tensor_with_parallelism_into(store, key, buffer_ptr, size, target=None):
    n = read_object_into(store, key, buffer_ptr, size, target)
    return None if n is None else t.to_tensor(t.raw(buffer_ptr, n))


def batch_get_tensor_with_parallelism_into(store, keys, buffer_ptrs, sizes, targets=None):
    n = len(keys)
    if not t.same_lengths(keys, buffer_ptrs, sizes):
        return [None] * n
    if targets is not None and (not isinstance(targets, list) or len(targets) != n):
        return [None] * n
    return [get_tensor_with_parallelism_into(store, k, p, s, g)
            for k, p, s, g in zip(keys, buffer_ptrs, sizes, targets or [None] * n)]
