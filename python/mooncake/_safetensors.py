"""``save_tensor_to_safetensor`` and ``load_tensor_from_safetensor`` of
``MooncakeDistributedStore`` (spec python-api.md section 4.10, "Files"), forwarded here by the
native class with the store first.

The file is the safetensors format (an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and data offsets, padded with spaces to 8 bytes, then the data), read
and written here byte for byte so that neither call needs torch or the ``safetensors`` package to
move the bytes: the tests check the files against the real ``safetensors`` package. Upstream's
rules: a save names the tensor after the key and writes the file ``file_name`` (default: the
key); a load stores the tensor named ``key`` (or, when the file has no such tensor, the first in
name order) under ``key`` (default: ``file_name``) and returns it.
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
    the safetensors file ``content`` (the first in name order when ``name`` is ``None`` or
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
    names = sorted(k for k in entries if k != "__metadata__")
    if not names:
        raise ValueError("the safetensors file holds no tensor")
    chosen = name if name in names else names[0]
    entry = entries[chosen]
    try:
        code = CODES[entry["dtype"]]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"tensor {chosen!r}: a dtype upstream stores, a shape and data "
                         f"offsets are needed") from None
    if any(d < 0 for d in shape) or len(shape) > t.MAX_DIMS:
        raise ValueError(f"tensor {chosen!r}: bad shape {shape}")
    data = view[8 + length:]
    if not 0 <= begin <= end <= len(data) or end - begin != t.numel(shape) * t.DTYPES[code][1]:
        raise ValueError(f"tensor {chosen!r}: data offsets do not match its shape and dtype")
    return chosen, t.pack_header(code, shape), data[begin:end]


def save_tensor_to_safetensor(store, key, file_name=None):
    """0, FILE_NOT_FOUND when no tensor object is stored under ``key``, INVALID_PARAMS when the
    file cannot be written (nothing is left behind: the file is written beside its final name
    and renamed into place)."""
    handle = store.get_buffer(key)
    obj = None if handle is None else t.object_of_bytes(handle)
    if obj is None:
        return FILE_NOT_FOUND
    path = key if file_name is None else os.fspath(file_name)
    head, data = encode(key, obj)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".mooncake-safetensors-")
    except OSError:
        return t.INVALID_PARAMS
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        return t.INVALID_PARAMS
    return 0


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
