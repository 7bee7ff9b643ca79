"""``save_tensor_to_safetensor`` and ``load_tensor_from_safetensor`` of
``MooncakeDistributedStore`` (spec python-api.md section 4.10, "Files"), forwarded here by the
native class with the store first.

The file is the safetensors format (an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and data offsets, padded with spaces to 8 bytes, then the data), read
and written here byte for byte so that neither call needs torch or the ``safetensors`` package to
move the bytes: the tests check the files against the real ``safetensors`` package. Upstream's
rules: a save names the tensor after the key and writes the file ``file_name`` (default: the
key); a load stores the tensor named ``key`` (or, when the file has no such tensor, the first in
the file, as ``safetensors``' ``load_file`` orders them) under ``key`` (default: ``file_name``)
and returns it. A file is read as strictly as the ``safetensors`` package reads it: the
tensors' data must tile the data section in order, without gaps or overlaps.
"""

import json
import os
import struct
import tempfile

from mooncake import _tensor as t

FILE_NOT_FOUND = -1100

# Upstream's dtype codes (mooncake._tensor.DTYPES order) as safetensors names them.
NAMES = ["F32", "F64", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL", "F16",
         "BF16", "F8_E4M3", "F8_E5M2"]
CODES = {name: code for code, name in enumerate(NAMES)}
# A header larger than this is refused (the safetensors package's own limit).
MAX_HEADER = 100 * 1000 * 1000


def encode(name, obj):
    """The safetensors file holding ``obj`` (a ``TensorObject``) as the tensor ``name``:
    (file header bytes, data) to write one after the other."""
    entry = {"dtype": NAMES[obj.header.dtype], "shape": list(obj.header.local_shape),
             "data_offsets": [0, obj.header.data_bytes]}
    header = json.dumps({name: entry}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header, obj.data


def decode(content, name):
    """(stored name, header bytes of the tensor object, data view) of the tensor ``name`` in
    the safetensors file ``content`` (the first in the file when ``name`` is ``None`` or
    absent). ``ValueError`` naming the problem for a file that is not safetensors, holds no
    tensor, or a dtype upstream cannot store."""
    view = memoryview(content).cast("B")
    if len(view) < 8:
        raise ValueError("not a safetensors file: shorter than its header length")
    (length,) = struct.unpack_from("<Q", view)
    if length > MAX_HEADER or 8 + length > len(view):
        raise ValueError("not a safetensors file: header length past the end")
    try:
        entries = json.loads(bytes(view[8:8 + length]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not a safetensors file: {e}") from None
    if not isinstance(entries, dict):
        raise ValueError("not a safetensors file: the header is not an object")
    data = view[8 + length:]
    tensors = {k: _entry(k, v) for k, v in entries.items() if k != "__metadata__"}
    if not tensors:
        raise ValueError("the safetensors file holds no tensor")
    in_file = sorted(tensors, key=lambda k: tensors[k][2])
    at = 0
    for k in in_file:
        _code, _shape, begin, end = tensors[k]
        if begin != at:
            raise ValueError(f"tensor {k!r}: data offsets leave a gap or overlap")
        at = end
    if at != len(data):
        raise ValueError("the tensors' data does not end where the file does")
    chosen = name if name in tensors else in_file[0]
    code, shape, begin, end = tensors[chosen]
    return chosen, t.pack_header(code, shape), data[begin:end]


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(name, entry):
    """(dtype code, shape, begin, end) of one tensor entry of a header, or ``ValueError``."""
    try:
        code = CODES[entry["dtype"]]
        shape, offsets = entry["shape"], entry["data_offsets"]
    except (KeyError, TypeError):
        raise ValueError(f"tensor {name!r}: a dtype upstream stores, a shape and data offsets "
                         f"are needed") from None
    if not isinstance(shape, list) or not all(map(_is_count, shape)) or len(shape) > t.MAX_DIMS:
        raise ValueError(f"tensor {name!r}: bad shape {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets)):
        raise ValueError(f"tensor {name!r}: bad data offsets {offsets!r}")
    begin, end = offsets
    if end - begin != t.numel(shape) * t.DTYPES[code][1]:
        raise ValueError(f"tensor {name!r}: data offsets do not match its shape and dtype")
    return code, tuple(shape), begin, end


def save_tensor_to_safetensor(store, key, file_name=None):
    """0; INVALID_PARAMS when the store is not set up or the file cannot be written (nothing is
    left behind: the file is written beside its final name, through a symlink, with the mode
    ``open`` would give it, and renamed into place); FILE_NOT_FOUND when no tensor object is
    stored under ``key``."""
    if not store._is_set_up():
        return t.INVALID_PARAMS
    handle = store.get_buffer(key)
    obj = None if handle is None else t.object_of_bytes(handle)
    if obj is None:
        return FILE_NOT_FOUND
    path = os.path.realpath(key if file_name is None else os.fspath(file_name))
    head, data = encode(key, obj)
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".mooncake-safetensors-")
    except OSError:
        return t.INVALID_PARAMS
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(head)
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        return t.INVALID_PARAMS
    return 0


def _umask():
    """The process's umask, read without changing it (``/proc/self/status``, Linux 4.7+;
    the usual 022 where that is unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def store_safetensor(store, key, file_name):
    """Stores the chosen tensor of ``file_name`` under ``key`` (default ``file_name``):
    (the store's code, header bytes, data); ``ValueError`` or ``OSError`` for a file that
    cannot be read as safetensors."""
    with open(file_name, "rb") as f:
        content = f.read()
    target = file_name if key is None else key
    _name, header, data = decode(content, target if key is not None else None)
    return t.write_parts(store, target, header, data, None, False), header, data


def load_tensor_from_safetensor(store, key=None, file_name=None):
    """The tensor stored from the file, or ``None`` when the file cannot be read or the store
    refuses it (upstream's contract). ``TypeError`` without ``file_name``; ``ImportError``
    without torch, before anything is read or stored."""
    if file_name is None:
        raise TypeError("load_tensor_from_safetensor() needs file_name")
    t.torch_module()
    try:
        rc, header, data = store_safetensor(store, key, os.fspath(file_name))
    except (OSError, ValueError):
        return None
    return t.to_tensor(bytearray(header) + bytearray(data)) if rc == 0 else None
