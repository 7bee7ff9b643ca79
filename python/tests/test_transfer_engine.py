"""mooncake.engine.TransferEngine: a target process that registers memory and serves, an
initiator that writes and reads it back; SGLang's and vLLM's call sequences; bad arguments.
Everything runs over TCP on 127.0.0.1 (protocol "rdma" falls back to TCP without a device),
except the two-process test over RDMA, which exists only inside the soft-RoCE VM
(``RDMA_VM=1``; ``scripts/python-tests.sh`` runs it there)."""

import hashlib
import json
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest

from mooncake.engine import Read, TransferEngine, TransferNotify, TransferOpcode, Write

TARGET_BYTES = 4 * 1024 * 1024
START_TIMEOUT_S = 30.0

# The target: registers a buffer (or a managed one), prints where it is, then answers
# "sum" with the SHA-256 of its buffer and "quit" by leaving.
TARGET = r"""
import ctypes, hashlib, json, sys
from mooncake.engine import TransferEngine
hostname, metadata, size, managed = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
protocol, device = sys.argv[5], sys.argv[6]
engine = TransferEngine()
assert engine.initialize(hostname, metadata, protocol, device) == 0
if managed:
    addr = engine.allocate_managed_buffer(size)
    assert addr != 0
else:
    buf = ctypes.create_string_buffer(size)
    addr = ctypes.addressof(buf)
    assert engine.register_memory(addr, size) == 0
print(json.dumps({"segment": engine.get_local_segment_name(), "port": engine.get_rpc_port(),
                  "addr": addr}), flush=True)
for line in sys.stdin:
    if line.strip() == "sum":
        data = ctypes.string_at(addr, size)
        print(hashlib.sha256(data).hexdigest(), flush=True)
    elif line.strip() == "quit":
        break
"""


class Target:
    def __init__(self, hostname, metadata, managed=False, protocol="tcp", device=""):
        self.process = subprocess.Popen(
            [sys.executable, "-c", TARGET, hostname, metadata, str(TARGET_BYTES),
             "1" if managed else "0", protocol, device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert line, "the target did not start"
        self.info = json.loads(line)

    def checksum(self):
        self.process.stdin.write("sum\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def stop(self):
        if self.process.poll() is None:
            self.process.stdin.write("quit\n")
            self.process.stdin.flush()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@pytest.fixture
def target_factory():
    made = []

    def make(*args, **kwargs):
        target = Target(*args, **kwargs)
        made.append(target)
        return target

    yield make
    for target in made:
        target.stop()


def engine(hostname="127.0.0.1", metadata="P2PHANDSHAKE", protocol="tcp", device=""):
    e = TransferEngine()
    assert e.initialize(hostname, metadata, protocol, device) == 0
    return e


def registered(e, nbytes):
    arr = np.zeros(nbytes, dtype=np.uint8)
    assert e.register_memory(arr.ctypes.data, nbytes) == 0
    return arr


def thousand_rounds(initiator, segment, remote, seed):
    """1 000 rounds of random sizes, single and batch, sync and async; checks every read-back
    and returns the model of the target's buffer."""
    rng = random.Random(seed)
    model = np.zeros(TARGET_BYTES, dtype=np.uint8)
    src = registered(initiator, TARGET_BYTES)
    dst = registered(initiator, TARGET_BYTES)
    for round_ in range(1000):
        n = rng.choice([1, 2]) if round_ % 3 else rng.randint(1, 8)
        spans = []
        for _ in range(n):
            length = rng.randint(1, 64 * 1024)
            spans.append((rng.randrange(0, TARGET_BYTES - length), length))
        # Disjoint remote spans within a round, so the model is unambiguous.
        spans.sort()
        spans = [s for i, s in enumerate(spans) if i == 0 or spans[i - 1][0] + spans[i - 1][1] <= s[0]]
        # Local spans at a round-wide shift of the remote ones: disjoint too.
        shift = rng.randrange(0, TARGET_BYTES - max(o + l for o, l in spans) + 1)
        locals_ = [off + shift if off + shift + length <= TARGET_BYTES else off for off, length in spans]
        for (off, length), at in zip(spans, locals_):
            src[at:at + length] = np.frombuffer(rng.randbytes(length), dtype=np.uint8)
            model[off:off + length] = src[at:at + length]
        bufs = [src.ctypes.data + at for at in locals_]
        peers = [remote + off for off, _ in spans]
        lens = [length for _, length in spans]
        mode = round_ % 4
        if mode == 0 and len(spans) == 1:
            assert initiator.transfer_sync_write(segment, bufs[0], peers[0], lens[0]) == 0
        elif mode == 1:
            assert initiator.batch_transfer_sync(segment, bufs, peers, lens, TransferOpcode.Write) == 0
        elif mode == 2:
            batch = initiator.batch_transfer_async_write(segment, bufs, peers, lens)
            assert batch != 0
            assert initiator.get_batch_transfer_status([batch]) == 0
        else:
            ids = [initiator.transfer_submit_write(segment, b, p, l) for b, p, l in zip(bufs, peers, lens)]
            assert 0 not in ids
            deadline = time.monotonic() + 30
            pending = set(ids)
            while pending and time.monotonic() < deadline:
                for batch in list(pending):
                    status = initiator.transfer_check_status(batch)
                    assert status in (0, 1), status
                    if status == 1:
                        pending.discard(batch)
            assert not pending
        # Read back into dst at the same local offsets, single or batch, sync or async.
        dbufs = [dst.ctypes.data + at for at in locals_]
        if round_ % 2 == 0:
            assert initiator.batch_transfer_sync_read(segment, dbufs, peers, lens) == 0
        elif len(spans) == 1 and round_ % 5 == 1:
            assert initiator.transfer_sync_read(segment, dbufs[0], peers[0], lens[0]) == 0
        else:
            batch = initiator.batch_transfer_async(segment, dbufs, peers, lens, Read)
            assert initiator.get_batch_transfer_status([batch]) == 0
        for (off, length), at in zip(spans, locals_):
            assert np.array_equal(dst[at:at + length], model[off:off + length]), f"round {round_}"
    return model


@pytest.mark.parametrize("managed", [False, True], ids=["registered", "managed"])
def test_two_processes_p2p_handshake(target_factory, managed):
    target = target_factory("127.0.0.1", "P2PHANDSHAKE", managed=managed)
    segment = target.info["segment"]
    assert segment == f"127.0.0.1:{target.info['port']}"
    initiator = engine()
    assert initiator.get_first_buffer_address(segment) == target.info["addr"]
    model = thousand_rounds(initiator, segment, target.info["addr"], seed=managed)
    assert target.checksum() == hashlib.sha256(model.tobytes()).hexdigest()


if os.environ.get("RDMA_VM") == "1":
    # Defined only in the VM: elsewhere it would be a skip, which the test script refuses.
    def test_two_processes_over_rdma(target_factory):
        """The P2P-handshake test over soft-RoCE: both engines open the VM's RDMA device (with
        MC_FORCE_HCA=1 a missing device is a failure, not a TCP fallback)."""
        host, device = os.environ["RDMA_VM_ADDR"], os.environ["RDMA_VM_DEV"]
        target = target_factory(host, "P2PHANDSHAKE", protocol="rdma", device=device)
        segment = target.info["segment"]
        assert segment == f"{host}:{target.info['port']}"
        initiator = engine(host, protocol="rdma", device=device)
        model = thousand_rounds(initiator, segment, target.info["addr"], seed=11)
        assert target.checksum() == hashlib.sha256(model.tobytes()).hexdigest()


def test_two_processes_through_the_http_metadata_service(target_factory, master):
    target = target_factory("127.0.0.1:7", master.metadata_url)
    assert target.info["segment"] == "127.0.0.1:7", "named verbatim"
    initiator = engine("127.0.0.1:8", master.metadata_url)
    assert initiator.get_first_buffer_address("127.0.0.1:7") == target.info["addr"]
    model = thousand_rounds(initiator, "127.0.0.1:7", target.info["addr"], seed=7)
    assert target.checksum() == hashlib.sha256(model.tobytes()).hexdigest()
    bare = TransferEngine()
    url = master.metadata_url.removeprefix("http://")
    assert bare.initialize_ext("127.0.0.1:9", url, "tcp", "", "http") == 0
    assert bare.get_first_buffer_address("127.0.0.1:7") == target.info["addr"]


def test_sglang_mooncake_transfer_engine_sequence(target_factory):
    # sglang/srt/disaggregation/mooncake/transfer_engine.py: initialize with "rdma" (TCP here),
    # session id from get_rpc_port, register each buffer, batch write with the session id.
    decode = engine(protocol="rdma")
    kv = registered(decode, 1 << 20)
    decode_session = f"127.0.0.1:{decode.get_rpc_port()}"
    prefill = engine(protocol="rdma")
    own = np.arange(1 << 20, dtype=np.uint64).view(np.uint8)[: 1 << 20].copy()
    assert prefill.register_memory(own.ctypes.data, own.nbytes) == 0
    item = 4096
    idx = [3, 7, 8, 100]
    src = [own.ctypes.data + i * item for i in idx]
    dst = [kv.ctypes.data + i * item for i in idx]
    assert prefill.batch_transfer_sync_write(decode_session, src, dst, [item] * len(idx)) == 0
    for i in idx:
        assert np.array_equal(kv[i * item:(i + 1) * item], own[i * item:(i + 1) * item])
    assert prefill.transfer_sync_write(decode_session, src[0], dst[1], item) == 0
    assert prefill.send_probe(decode_session) == 0
    assert prefill.unregister_memory(own.ctypes.data) == 0
    assert decode.batch_unregister_memory([kv.ctypes.data]) == 0


def test_vllm_mooncake_connector_sequence():
    # vllm/.../mooncake_connector.py: batch_register_memory of the KV data pointers, then the
    # prefill pushes merged block runs with batch_transfer_sync_write to f"{host}:{port}".
    blocks, block_len = 16, 2048
    d = engine(protocol="rdma")
    d_layers = [np.zeros(blocks * block_len, dtype=np.uint8) for _ in range(2)]
    assert d.batch_register_memory([a.ctypes.data for a in d_layers], [a.nbytes for a in d_layers]) == 0
    p = engine(protocol="rdma")
    p_layers = [np.random.default_rng(i).integers(0, 256, blocks * block_len, dtype=np.uint8)
                for i in range(2)]
    assert p.batch_register_memory([a.ctypes.data for a in p_layers], [a.nbytes for a in p_layers]) == 0
    runs = [(0, 3), (5, 6), (9, 16)]
    src, dst, lens = [], [], []
    for layer in range(2):
        for start, end in runs:
            src.append(p_layers[layer].ctypes.data + start * block_len)
            dst.append(d_layers[layer].ctypes.data + start * block_len)
            lens.append((end - start) * block_len)
    assert p.batch_transfer_sync_write(f"127.0.0.1:{d.get_rpc_port()}", src, dst, lens) == 0
    for layer in range(2):
        for start, end in runs:
            s = slice(start * block_len, end * block_len)
            assert np.array_equal(d_layers[layer][s], p_layers[layer][s])
        assert not d_layers[layer][3 * block_len:5 * block_len].any(), "untouched blocks stay"


def test_bad_arguments_get_upstreams_codes_and_never_crash():
    fresh = TransferEngine()
    assert fresh.get_rpc_port() == -1
    assert fresh.register_memory(1, 1) == -1
    assert fresh.transfer_sync_write("127.0.0.1:1", 1, 1, 1) == -1
    assert fresh.allocate_managed_buffer(4096) == 0
    assert fresh.get_first_buffer_address("x") == 0
    assert fresh.transfer_submit_write("x", 1, 1, 1) == 0
    assert fresh.transfer_check_status(1) == -1
    assert fresh.get_notifies() == []
    assert TransferEngine().initialize("127.0.0.1", "redis://127.0.0.1:6379", "tcp", "") == -1
    assert TransferEngine().initialize("127.0.0.1", "P2PHANDSHAKE", "xgmi", "") == -1

    e = engine()
    peer = engine()
    remote = registered(peer, 1 << 16)
    seg = f"127.0.0.1:{peer.get_rpc_port()}"
    local = registered(e, 1 << 16)
    stray = np.zeros(4096, dtype=np.uint8)
    assert e.register_memory(local.ctypes.data + 8, 8) == -7, "overlap"
    assert e.register_memory(stray.ctypes.data, 0) == -1, "zero length"
    assert e.unregister_memory(stray.ctypes.data) == -3
    assert e.transfer_sync_write(seg, stray.ctypes.data, remote.ctypes.data, 64) == -1, "local not registered"
    assert e.transfer_sync_write(seg, local.ctypes.data, remote.ctypes.data + (1 << 16) - 8, 64) == -1, "past the peer's range"
    assert e.transfer_sync_write(seg, local.ctypes.data, stray.ctypes.data, 64) == -1, "never registered there"
    assert e.transfer_sync_write("127.0.0.1:1", local.ctypes.data, remote.ctypes.data, 64) == -1
    assert e.batch_transfer_sync_write(seg, [local.ctypes.data], [], [8]) == -1, "lists differ"
    assert e.batch_transfer_async_write(seg, [local.ctypes.data], [remote.ctypes.data], []) == 0
    assert not remote.any(), "nothing landed"
    with pytest.raises(TypeError):
        e.transfer_sync(seg, local.ctypes.data, remote.ctypes.data, 8, 5)
    with pytest.raises(TypeError):
        e.transfer_sync_write(seg, -1, remote.ctypes.data, 8)
    note = TransferNotify("me", "done")
    assert (note.name, note.msg) == ("me", "done")
    assert e.transfer_sync(seg, local.ctypes.data, remote.ctypes.data, 8, Write, note) == 0
    assert e.batch_transfer_sync(seg, [local.ctypes.data], [remote.ctypes.data], [8], Read,
                                 TransferNotify("me", "read")) == 0
    got = peer.get_notifies()
    assert [(n.name, n.msg) for n in got] == [("me", "done"), ("me", "read")]
    assert peer.get_notifies() == []
    assert e.transfer_sync(seg, stray.ctypes.data, remote.ctypes.data, 8, Write, note) == -1
    assert peer.get_notifies() == [], "no notification after a failed transfer"
    failed = e.transfer_submit_write(seg, local.ctypes.data, stray.ctypes.data, 8)
    assert failed != 0
    deadline = time.monotonic() + 30
    while (status := e.transfer_check_status(failed)) == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert status == -1
    assert e.transfer_check_status(failed) == -1, "freed: unknown now"
    assert e.get_batch_transfer_status([123456]) == -1
    managed = e.allocate_managed_buffer(100)
    assert managed != 0
    assert e.unregister_memory(managed) == -1, "a managed pool: freed with free_managed_buffer"
    assert e.free_managed_buffer(managed, 99) == -1
    assert e.free_managed_buffer(managed, 100) == 0
    assert e.write_bytes_to_buffer(local.ctypes.data, b"hello", 5) == 0
    assert e.read_bytes_from_buffer(local.ctypes.data, 5) == b"hello"
    assert e.write_bytes_to_buffer(stray.ctypes.data, b"hello", 5) == -1
    assert e.read_bytes_from_buffer(stray.ctypes.data, 5) == b""
    assert e.send_probe("127.0.0.1:1") == -1
    assert TransferOpcode.Read == 0 and TransferOpcode.Write == 1 and TransferEngine.TransferOpcode is TransferOpcode


def test_store_setup_takes_a_transfer_engine_positionally_as_sglang_passes_it(master, store_module):
    te = engine()
    s = store_module.MooncakeDistributedStore()
    try:
        mib = 1024 * 1024
        assert s.setup("localhost", "P2PHANDSHAKE", 16 * mib, 16 * mib, "tcp", "", master.address,
                       te) == 0
        assert s.put("te-shared", b"v") == 0 and s.get("te-shared") == b"v"
    finally:
        s.close()
    with pytest.raises(RuntimeError):
        store_module.MooncakeDistributedStore().setup(
            "localhost", "P2PHANDSHAKE", 0, 0, "tcp", "", master.address, object())
