"""The unified parallelism tensor calls and the safetensors calls (spec section 4.10): keys,
shard headers and manifests laid out as upstream's (checked against ctypes mirrors of its C
structs), every write route and read mode through a real store on pre-serialised buffers (no
torch needed: the byte readers ``read_object``/``read_object_into`` are what the tensor getters
wrap), refusals that store nothing, and reconstructions that refuse mismatched shards. The
safetensors files are checked with the real ``safetensors`` package. Where torch is installed,
the tensor-taking forms are checked too."""

import ctypes
import importlib.util
import os
import types

import numpy as np
import pytest
import safetensors.numpy

from conftest import INVALID_PARAMS, unique_key
from mooncake import _parallel as par
from mooncake import _safetensors as st
from mooncake import _tensor as t

HAVE_TORCH = importlib.util.find_spec("torch") is not None
INT32, FLOAT64 = 6, 1


class ManifestMirror(ctypes.Structure):
    """Mooncake's WriterShardManifest (header, then TensorShape) as the C++ compiler lays it out."""
    _fields_ = [("magic", ctypes.c_uint32), ("version", ctypes.c_uint16),
                ("header_size", ctypes.c_uint16), ("dtype", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("split_dim", ctypes.c_int32),
                ("shard_count", ctypes.c_int32), ("reserved0", ctypes.c_int32),
                ("global_shape", ctypes.c_int64 * 8)]


def axis(kind, rank=0, size=1, split_dim=None, expert_id=None, stage_id=None):
    a = par.ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    a.split_dim, a.expert_id, a.stage_id = split_dim, expert_id, stage_id
    return a


def parallelism(*axes):
    p = par.TensorParallelism()
    p.axes = list(axes)
    return p


def target(mode, *axes):
    r = par.ReadTarget()
    r.mode = mode
    r.parallelism = parallelism(*axes) if axes else None
    return r


class Writer:
    def __init__(self, rank, size, split_dim):
        self.rank, self.size, self.split_dim = rank, size, split_dim


def serialized(registered, array, code):
    """A registered buffer holding ``array`` as a full tensor object (header + data)."""
    header = t.pack_header(code, array.shape)
    buf = registered(len(header) + array.nbytes)
    buf[:len(header)] = np.frombuffer(header, dtype=np.uint8)
    buf[len(header):] = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
    return buf


def parsed(data):
    """(header, numpy view of the data) of header + data bytes."""
    obj = t.object_of_bytes(data)
    assert obj is not None
    return obj.header, bytes(obj.data)


def test_helper_classes_are_upstreams(store_module):
    assert store_module.ParallelAxis is par.ParallelAxis
    assert store_module.TensorParallelism is par.TensorParallelism
    assert store_module.ReadTarget is par.ReadTarget
    a = par.ParallelAxis()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == ("", 0, 1, None,
                                                                               None, None)
    with pytest.raises(TypeError):
        a.rank = "1"
    with pytest.raises(TypeError):
        a.split_dim = 1.5
    with pytest.raises(AttributeError):
        a.other = 1
    p = parallelism(axis("tp", 0, 2, 0))
    p.axes.append(axis("dp"))
    assert len(p.axes) == 1, "the getter returns a copy"
    with pytest.raises(TypeError):
        p.axes = [1]
    r = par.ReadTarget()
    assert (r.mode, r.parallelism) == ("as_stored", None)
    r.mode = "FULL"
    assert r.mode == "full"
    with pytest.raises(RuntimeError, match="Unsupported ReadTarget mode"):
        r.mode = "half"
    with pytest.raises(TypeError):
        r.parallelism = [axis("tp")]


def test_keys_and_manifests_are_upstreams():
    spec = par.parse_parallelism(parallelism(axis("PP", 0, 2, stage_id=3), axis("tp", 1, 4, 1),
                                             axis("dp", 1, 2)))
    assert par.shard_key("w", spec) == "w__dp_1of2__tp_1of4_sd1__pp_0of2_sid3"
    assert par.shard_key("w", par.parse_parallelism(parallelism(axis("tp", 3, 4, 0)))) == "w_tp_3"
    ep = par.parse_parallelism(parallelism(axis("ep", 1, 8, expert_id=5)))
    assert par.shard_key("w", ep) == "w__ep_1of8_eid5"
    assert par.writer_key("w", par.Writer(2, 3, 1)) == "w__writer_2of3_sd1"
    packed = par.pack_manifest(INT32, (4, 6), 1, 3)
    mirror = ManifestMirror(0x574D414E, 1, ctypes.sizeof(ManifestMirror), INT32, 2, 1, 3, 0)
    for i in range(8):
        mirror.global_shape[i] = (4, 6)[i] if i < 2 else -1
    assert ctypes.sizeof(ManifestMirror) == len(packed) == 96
    assert packed == bytes(mirror)
    assert par.parse_manifest(packed) == par.Manifest(INT32, (4, 6), 1, 3)
    for offset, value in [(0, 0), (4, 2), (16, 2), (20, 0)]:  # magic, version, split, count
        bad = bytearray(packed)
        bad[offset] = value
        assert par.parse_manifest(bad) is None, offset
    assert par.parse_manifest(packed[:95]) is None


def test_invalid_axes_are_refused():
    bad = [
        [], [axis("tp", 0, 2)], [axis("xp", 0, 1)], [axis("tp", 2, 2, 0)],
        [axis("dp", 0, 1, split_dim=0)], [axis("ep", 0, 1)], [axis("pp", 0, 1)],
        [axis("ep", 0, 1, 0, expert_id=1)], [axis("tp", 0, 1, 0), axis("TP", 0, 1, 0)],
        [axis("dp"), axis("tp", 0, 1, 0), axis("ep", expert_id=0), axis("pp", stage_id=0),
         axis("dp")],
    ]
    for axes in bad:
        assert par.parse_parallelism(parallelism(*axes)) is None, axes
    assert par.parse_parallelism(object()) is None


def test_writer_partitions_rebuild_the_full_tensor(store, registered):
    full = np.arange(24, dtype=np.int32).reshape(4, 6)
    buf = serialized(registered, full, INT32)
    key = unique_key("writers")
    for rank in range(3):
        rc = store.put_tensor_with_parallelism_from(key, buf.ctypes.data, buf.nbytes,
                                                    writer_partition=Writer(rank, 3, 1))
        assert rc == 0, rank
        header, data = parsed(store.get_buffer(f"{key}__writer_{rank}of3_sd1"))
        assert header.global_shape == (4, 6) and header.local_shape == (4, 2)
        assert header.axes == (t.Axis(t.AXIS_TP, 0, rank, 3, 1, 0, 2),)
        assert data == full[:, 2 * rank:2 * rank + 2].tobytes()
    manifest = par.parse_manifest(store.get_buffer(f"{key}__writer_manifest"))
    assert manifest == par.Manifest(INT32, (4, 6), 1, 3)

    got = par.read_object(store, key, target("full"))
    header, data = parsed(got)
    assert header.layout_kind == t.LAYOUT_FULL and header.local_shape == (4, 6)
    assert data == full.tobytes()
    out = registered(buf.nbytes)
    assert par.read_object_into(store, key, out.ctypes.data, out.nbytes, target("full")) == out.nbytes
    assert np.array_equal(out, buf)
    small = registered(buf.nbytes - 1)
    assert par.read_object_into(store, key, small.ctypes.data, small.nbytes, target("full")) is None
    assert par.read_object(store, key) is None, "nothing is stored under the key itself"
    # A single TP shard request finds the writer partition of the same rank.
    shard = par.read_object(store, key, target("shard", axis("tp", 1, 3, 1)))
    assert parsed(shard)[1] == full[:, 2:4].tobytes()
    # A writer shard gone: the full read refuses instead of returning a tensor with a hole.
    assert store.remove(f"{key}__writer_1of3_sd1", force=True) == 0
    assert par.read_object(store, key, target("full")) is None


def test_tp_from_stores_every_shard_and_reads_at_another_tp_size(store, registered):
    full = np.arange(24, dtype=np.float64).reshape(8, 3)
    buf = serialized(registered, full, FLOAT64)
    key = unique_key("tp-from")
    tp4 = axis("tp", 0, 4, 0)
    assert store.put_tensor_with_parallelism_from(key, buf.ctypes.data, buf.nbytes,
                                                  parallelism(tp4)) == 0
    for rank in range(4):
        header, data = parsed(store.get_buffer(f"{key}_tp_{rank}"))
        assert header.axes == (t.Axis(t.AXIS_TP, 0, rank, 4, 0, 0, 2),)
        assert data == full[2 * rank:2 * rank + 2].tobytes()
    assert par.parse_manifest(store.get_buffer(f"{key}__parallelism_manifest")) == par.Manifest(
        FLOAT64, (8, 3), 0, 4)
    stored = par.read_object(store, key, target("shard", axis("tp", 1, 4, 0)))
    assert bytes(stored) == bytes(store.get_buffer(f"{key}_tp_1"))
    half = par.read_object(store, key, target("shard", axis("tp", 1, 2, 0)))
    header, data = parsed(half)
    assert header.local_shape == (4, 3) and header.global_shape == (8, 3)
    assert header.axes == (t.Axis(t.AXIS_TP, 0, 1, 2, 0, 0, 4),)
    assert data == full[4:].tobytes()
    assert parsed(par.read_object(store, key, target("full", tp4)))[1] == full.tobytes()
    assert par.read_object(store, key, target("full", axis("tp", 0, 4, 1))) is None, "split dim"
    assert par.read_object(store, key, target("as_stored", tp4)) is None

    legacy = unique_key("tp-legacy")
    assert store.put_tensor_with_tp_from(legacy, buf.ctypes.data, buf.nbytes, tp_size=4) == 0
    for rank in range(4):
        assert bytes(store.get_buffer(f"{legacy}_tp_{rank}")) == bytes(
            store.get_buffer(f"{key}_tp_{rank}"))
    assert store.batch_put_tensor_with_tp_from([legacy], [buf.ctypes.data], [], tp_size=2) == [
        INVALID_PARAMS]
    uneven = unique_key("tp-uneven")
    assert store.put_tensor_with_tp_from(uneven, buf.ctypes.data, buf.nbytes, tp_size=3) == \
        INVALID_PARAMS
    assert store.put_tensor_with_parallelism_from(uneven, buf.ctypes.data, buf.nbytes,
                                                  parallelism(axis("tp", 0, 3, 0))) == INVALID_PARAMS
    assert [store.is_exist(f"{uneven}_tp_{r}") for r in range(3)] == [0, 0, 0]
    assert store.put_tensor_with_tp_from(uneven, buf.ctypes.data, buf.nbytes) == 0, "tp_size 1"
    assert bytes(store.get_buffer(uneven)) == buf.tobytes()


def test_several_axes_name_their_shards(store, registered):
    full = np.arange(32, dtype=np.int32).reshape(4, 8)
    buf = serialized(registered, full, INT32)
    key = unique_key("dp-tp")
    dp1, tp = axis("dp", 1, 2), axis("tp", 0, 2, 1)
    assert store.put_tensor_with_parallelism_from(key, buf.ctypes.data, buf.nbytes,
                                                  parallelism(tp, dp1)) == 0
    for rank in range(2):
        header, data = parsed(store.get_buffer(f"{key}__dp_1of2__tp_{rank}of2_sd1"))
        assert header.axes == (t.Axis(t.AXIS_TP, 0, rank, 2, 1, 0, 4), t.Axis(0, 1, 1, 2, -1, 0, 0))
        assert data == full[:, 4 * rank:4 * rank + 4].tobytes()
    shard = par.read_object(store, key, target("shard", dp1, axis("tp", 1, 2, 1)))
    assert parsed(shard)[1] == full[:, 4:].tobytes()
    assert parsed(par.read_object(store, key, target("full", dp1, tp)))[1] == full.tobytes()
    quarter = par.read_object(store, key, target("shard", dp1, axis("tp", 3, 4, 1)))
    assert parsed(quarter)[1] == full[:, 6:].tobytes()
    assert par.read_object(store, key, target("full", axis("dp", 0, 2), tp)) is None, "not stored"
    assert par.read_object(store, key, target("full", dp1, axis("ep", 0, 1, expert_id=0),
                                              tp)) is None


def test_axes_without_tp_store_the_tensor_as_it_is(store, registered):
    experts = np.arange(12, dtype=np.int32).reshape(3, 4)
    buf = serialized(registered, experts, INT32)
    key = unique_key("ep")
    ep = axis("ep", 1, 8, expert_id=5)
    assert store.put_tensor_with_parallelism_from(key, buf.ctypes.data, buf.nbytes,
                                                  parallelism(ep)) == 0
    header, data = parsed(store.get_buffer(f"{key}__ep_1of8_eid5"))
    assert header.layout_kind == t.LAYOUT_SHARD and header.local_shape == (3, 4)
    assert header.axes == (t.Axis(2, 0, 1, 8, -1, 5, 0),)
    assert data == experts.tobytes()
    assert parsed(par.read_object(store, key, target("shard", ep)))[1] == experts.tobytes()
    assert par.read_object(store, key, target("shard", axis("ep", 1, 8, expert_id=6))) is None
    assert par.read_object(store, key, target("full", ep)) is None, "full needs a TP axis"


def test_bad_requests_store_nothing(store, registered):
    buf = serialized(registered, np.zeros((4, 4), dtype=np.int32), INT32)
    key = unique_key("bad")
    p, n = buf.ctypes.data, buf.nbytes
    tp = parallelism(axis("tp", 0, 2, 0))
    cases = [
        dict(parallelism=tp, writer_partition=Writer(0, 2, 0)),
        dict(parallelism=parallelism(axis("tp", 0, 2))),
        dict(parallelism=parallelism(axis("tp", 0, 2, 5))),
        dict(writer_partition=Writer(2, 2, 0)),
        dict(writer_partition=Writer(0, 3, 0)),
        dict(writer_partition=object()),
        dict(parallelism="tp"),
    ]
    for kwargs in cases:
        assert store.put_tensor_with_parallelism_from(key, p, n, **kwargs) == INVALID_PARAMS, kwargs
    assert store.put_tensor_with_parallelism_from(key, p, n - 1) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism_from(key, 0, n) == INVALID_PARAMS
    cfg = store_config(2, ["a"])
    assert store.put_tensor_with_parallelism_from(key, p, n, config=cfg) == INVALID_PARAMS
    assert not any(store.is_exist(k) == 1 for k in [key, f"{key}_tp_0", f"{key}__writer_0of2_sd0",
                                                    f"{key}__writer_manifest"])
    e = [INVALID_PARAMS] * 2
    keys = [key, key + "2"]
    assert store.batch_put_tensor_with_parallelism_from(keys, [p, p], [n]) == e
    assert store.batch_put_tensor_with_parallelism_from(keys, [p, p], [n, n], [tp]) == e
    assert store.batch_put_tensor_with_parallelism_from(keys, [p, p], [n, n], (tp, tp)) == e
    assert store.batch_put_tensor_with_parallelism_from(
        keys, [p, p], [n, n], [tp, tp], writer_partitions=[None, None]) == e
    assert store.batch_put_tensor_with_parallelism_from(keys, [p, p], [n, n], [None, tp]) == [0, 0]
    assert bytes(store.get_buffer(key)) == buf.tobytes()
    assert store.is_exist(f"{key}2_tp_1") == 1
    assert par.read_object(store, key, object()) is None
    assert par.read_object(store, key, target("shard")) is None
    assert store.batch_get_tensor_with_parallelism_into([key], [p], [n, n]) == [None]
    assert store.batch_get_tensor_with_parallelism([key], [None, None]) == [None]
    assert par.read_object_into(store, key, 0, n) is None


def store_config(replicas, segments):
    import mooncake.store

    cfg = mooncake.store.ReplicateConfig()
    cfg.replica_num, cfg.preferred_segments = replicas, segments
    return cfg


def test_reconstruction_refuses_mismatched_shards(store, registered):
    full = np.arange(16, dtype=np.int32).reshape(4, 4)
    buf = serialized(registered, full, INT32)
    key = unique_key("mismatch")
    tp = parallelism(axis("tp", 0, 2, 0))
    assert store.put_tensor_with_parallelism_from(key, buf.ctypes.data, buf.nbytes, tp) == 0
    good = bytes(store.get_buffer(f"{key}_tp_1"))
    # Rank 1 replaced by rank 1 of another tensor (global shape 4 x 2): no stitched result.
    other = serialized(registered, np.zeros((4, 2), dtype=np.int32), INT32)
    other_key = unique_key("other")
    assert store.put_tensor_with_parallelism_from(other_key, other.ctypes.data, other.nbytes,
                                                  tp) == 0
    assert store.upsert(f"{key}_tp_1", bytes(store.get_buffer(f"{other_key}_tp_1"))) == 0
    assert par.read_object(store, key, target("full", axis("tp", 0, 2, 0))) is None
    # The same bytes with another dtype: refused too.
    retyped = bytearray(good)
    retyped[8] = 7  # uint32
    assert store.upsert(f"{key}_tp_1", bytes(retyped)) == 0
    assert par.read_object(store, key, target("full", axis("tp", 0, 2, 0))) is None
    assert store.upsert(f"{key}_tp_1", good) == 0
    assert parsed(par.read_object(store, key, target("full", axis("tp", 0, 2, 0))))[1] == \
        full.tobytes()


def test_upsert_replaces_every_shard(store, registered):
    key = unique_key("upsert-par")
    first = serialized(registered, np.zeros((2, 4), dtype=np.int32), INT32)
    second = serialized(registered, np.arange(8, dtype=np.int32).reshape(2, 4), INT32)
    tp = parallelism(axis("tp", 0, 2, 1))
    assert store.put_tensor_with_parallelism_from(key, first.ctypes.data, first.nbytes, tp) == 0
    assert store.put_tensor_with_parallelism_from(key, second.ctypes.data, second.nbytes, tp) == 0
    assert parsed(par.read_object(store, key, target("full", axis("tp", 0, 2, 1))))[1] == bytes(8 * 4)
    assert store.batch_upsert_tensor_with_parallelism_from(
        [key], [second.ctypes.data], [second.nbytes], [tp]) == [0]
    assert parsed(par.read_object(store, key, target("full", axis("tp", 0, 2, 1))))[1] == \
        np.arange(8, dtype=np.int32).tobytes()


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool", "float16", "int8"])
def test_saved_files_are_safetensors(store, tmp_path, monkeypatch, dtype):
    array = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    code = [name for name, _ in t.DTYPES].index(dtype)
    key = unique_key(f"st-{dtype}")
    assert store.put(key, t.pack_header(code, array.shape) + array.tobytes()) == 0
    path = tmp_path / "out.safetensors"
    assert store.save_tensor_to_safetensor(key, str(path)) == 0
    loaded = safetensors.numpy.load_file(str(path))
    assert list(loaded) == [key] and loaded[key].dtype == array.dtype
    assert np.array_equal(loaded[key], array)
    monkeypatch.chdir(tmp_path)
    assert store.save_tensor_to_safetensor(key) == 0, "the file name defaults to the key"
    assert np.array_equal(safetensors.numpy.load_file(key)[key], array)


def test_save_failures(store, tmp_path):
    assert store.save_tensor_to_safetensor(unique_key("absent"), str(tmp_path / "x")) == -1100
    key = unique_key("st")
    assert store.put(key, t.pack_header(INT32, (1,)) + bytes(4)) == 0
    missing_dir = tmp_path / "no" / "such"
    assert store.save_tensor_to_safetensor(key, str(missing_dir / "f")) == INVALID_PARAMS
    assert store.put(key + "raw", b"not a tensor") == 0
    assert store.save_tensor_to_safetensor(key + "raw", str(tmp_path / "y")) == -1100
    assert os.listdir(tmp_path) == []


def test_loaded_files_are_stored_as_tensor_objects(store, tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(4, dtype=np.int64)
    path = str(tmp_path / "two.safetensors")
    safetensors.numpy.save_file({"b": b, "a": a}, path)
    first = min(["a", "b"], key=lambda name: st_offset(path, name))
    first_bytes = {"a": a, "b": b}[first].tobytes()
    key = unique_key("st-load")
    rc, _h, _d = st.store_safetensor(store, key, path)
    assert rc == 0
    assert parsed(store.get_buffer(key))[1] == first_bytes, "the first tensor in the file"
    for name, value in [("a", a), ("b", b)]:
        assert st.store_safetensor(store, name, path)[0] == 0
        assert parsed(store.get_buffer(name))[1] == value.tobytes()
    assert st.store_safetensor(store, None, path)[0] == 0
    assert parsed(store.get_buffer(path))[1] == first_bytes, "the key defaults to the file name"
    bad = tmp_path / "bad"
    def file(header, data=b""):
        return len(header).to_bytes(8, "little") + header + data

    u8 = b'"dtype":"U8","shape":[%s],"data_offsets":[%s]'
    for content in [b"", b"\xff" * 8, file(b"[1,2,3]"), file(b"{}"),
                    file(b'{"x":{' + u8 % (b"2", b"0,2") + b'}}', b"abc"),  # data past the end
                    file(b'{"x":{' + u8 % (b"2", b"1,3") + b'}}', b"abc"),  # a gap first
                    file(b'{"x":{' + u8 % (b'"2"', b"0,2") + b'}}', b"ab"),  # a string dim
                    file(b'{"x":{' + u8 % (b"2", b"0,2") + b'},"y":{' + u8 % (b"2", b"1,3")
                         + b'}}', b"abc")]:  # overlapping
        bad.write_bytes(content)
        with pytest.raises(ValueError):
            st.store_safetensor(store, unique_key("bad"), str(bad))
    with pytest.raises(TypeError):
        store.load_tensor_from_safetensor("k")


@pytest.mark.skipif(HAVE_TORCH, reason="torch is installed")
def test_without_torch_tensor_calls_name_it(store, tmp_path):
    with pytest.raises(ImportError, match="torch"):
        store.put_tensor_with_parallelism(unique_key("p"), object())
    with pytest.raises(ImportError, match="torch"):
        store.load_tensor_from_safetensor(unique_key("l"), str(tmp_path / "none"))


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_tensor_routes(store):
    import torch

    full = torch.arange(48, dtype=torch.float32).reshape(4, 12)
    key = unique_key("torch-par")
    tp = [axis("tp", r, 3, 1) for r in range(3)]
    for rank in range(3):
        shard = full[:, 4 * rank:4 * rank + 4]
        assert store.put_tensor_with_parallelism(key, shard, parallelism(tp[rank])) == 0
    assert torch.equal(store.get_tensor_with_parallelism(key, target("full", tp[0])), full)
    got = store.get_tensor_with_parallelism(key, target("shard", axis("tp", 0, 1, 1)))
    assert torch.equal(got, full)
    multi = unique_key("torch-multi")
    dp = axis("dp", 0, 2)
    for rank in range(3):
        assert store.put_tensor_with_parallelism(multi, full, parallelism(dp, tp[rank])) == 0
    assert torch.equal(store.get_tensor_with_parallelism(multi, target("full", dp, tp[1])), full)
    writer = unique_key("torch-writer")
    assert store.batch_put_tensor_with_parallelism(
        [writer, writer], [full, full], writer_partitions=[Writer(0, 2, 0), Writer(1, 2, 0)]) == [0, 0]
    assert torch.equal(store.get_tensor_with_parallelism(writer, target("full")), full)
    assert store.batch_get_tensor_with_parallelism([writer], [target("full")])[0].shape == (4, 12)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_safetensors_round_trip_with_torch(store, tmp_path):
    import torch

    tensor = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    key = unique_key("torch-st")
    assert store.put_tensor(key, tensor) == 0
    path = str(tmp_path / "t.safetensors")
    assert store.save_tensor_to_safetensor(key, path) == 0
    loaded = store.load_tensor_from_safetensor(unique_key("again"), path)
    assert torch.equal(loaded, tensor)


def test_review_cases(store, registered, tmp_path):
    """Found by review: each failed before its fix."""
    # A FULL header whose local shape is not its global shape is not a full tensor.
    header = t.pack_header(INT32, (4, 4), (2, 4))
    buf = registered(len(header) + 32)
    buf[:len(header)] = np.frombuffer(header, dtype=np.uint8)
    key = unique_key("crafted")
    assert store.put_tensor_with_tp_from(key, buf.ctypes.data, buf.nbytes, 0, 2, 0) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism_from(
        key, buf.ctypes.data, buf.nbytes, writer_partition=Writer(1, 2, 0)) == INVALID_PARAMS
    assert store.is_exist(f"{key}_tp_1") == 0
    # A batch config's group_ids name one group per key.
    full = serialized(registered, np.arange(8, dtype=np.int32).reshape(2, 4), INT32)
    keys = [unique_key("grouped"), unique_key("grouped")]
    cfg = store_config(1, [])
    cfg.group_ids = ["g1", "g2"]
    p, n = full.ctypes.data, full.nbytes
    assert store.batch_put_tensor_with_parallelism_from(keys, [p, p], [n, n], None, cfg) == [0, 0]
    cfg.group_ids = ["g1"]
    assert store.batch_put_tensor_with_parallelism_from(keys, [p, p], [n, n], None, cfg) == [
        INVALID_PARAMS] * 2
    # A manifest that does not fit the request: the stored shards are read as upstream does.
    multi = unique_key("manifest-fallback")
    dp0, dp1 = axis("dp", 0, 2), axis("dp", 1, 2)
    assert store.put_tensor_with_parallelism_from(multi, p, n, parallelism(dp0, axis("tp", 0, 2, 1))) == 0
    assert store.put_tensor_with_parallelism_from(multi, p, n, parallelism(dp1, axis("tp", 0, 4, 1))) == 0
    got = par.read_object(store, multi, target("full", dp1, axis("tp", 0, 4, 1)))
    assert got is not None and parsed(got)[1] == np.arange(8, dtype=np.int32).tobytes()
    # A manifest claiming 2**31 - 1 shards is refused at once.
    huge = unique_key("huge-manifest")
    assert store.put(f"{huge}__writer_manifest", par.pack_manifest(INT32, (4,), 0, 2**31 - 1)) == 0
    assert par.read_object(store, huge, target("full")) is None
    # Axis fields must be ints in int32 range.
    assert par.parse_parallelism(parallelism(axis("tp", 0, 2, 0))) is not None
    with pytest.raises(TypeError):
        par.ParallelAxis().expert_id = 2**31
    for field, value in [("expert_id", 2**31), ("rank", 1.0), ("size", "2"), ("rank", True)]:
        fields = dict(kind="ep", rank=0, size=2, split_dim=None, expert_id=1, stage_id=None)
        fields[field] = value
        duck = types.SimpleNamespace(axes=[types.SimpleNamespace(**fields)])
        assert par.parse_parallelism(duck) is None, field
        assert store.put_tensor_with_parallelism_from(key, p, n, duck) == INVALID_PARAMS
    # safetensors: the first entry is the first in the file, as upstream's load_file orders them.
    path = str(tmp_path / "order.safetensors")
    safetensors.numpy.save_file({"a": np.zeros(2, dtype=np.float32),
                                 "b": np.ones(2, dtype=np.float64)}, path)
    first = min(["a", "b"], key=lambda name: st_offset(path, name))
    rc, header, _ = st.store_safetensor(store, unique_key("first"), path)
    assert rc == 0 and t.parse_header(header + bytes(16 if first == "b" else 8)).dtype == (
        1 if first == "b" else 0)
    # A save writes the file as open() would (the umask's mode), through a symlink.
    saved = unique_key("mode")
    assert store.put(saved, t.pack_header(INT32, (1,)) + bytes(4)) == 0
    target_file = tmp_path / "real.safetensors"
    link = tmp_path / "link.safetensors"
    link.symlink_to(target_file)
    assert store.save_tensor_to_safetensor(saved, str(link)) == 0
    assert link.is_symlink() and target_file.exists()
    umask = os.umask(0o022)
    os.umask(umask)
    assert target_file.stat().st_mode & 0o777 == 0o666 & ~umask


def st_offset(path, name):
    import json
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))[name]["data_offsets"][0]


def test_save_needs_a_set_up_store(store_module, tmp_path):
    fresh = store_module.MooncakeDistributedStore()
    assert fresh.save_tensor_to_safetensor("k", str(tmp_path / "f")) == INVALID_PARAMS
