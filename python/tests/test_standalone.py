"""Dummy mode (spec §4.1 setup_dummy, §4.11) and MooncakeHostMemAllocator (§5.3) against a real
``mooncake_client`` process (the binary named by ``MC_TEST_CLIENT_BIN``, else the venv's
console script). Every wait is bounded."""

import ctypes
import importlib.util
import os
import select
import shutil
import subprocess
import time

import pytest

from conftest import INVALID_PARAMS, MIB, free_port, unique_key

READY_TIMEOUT_S = 30.0


def client_command():
    binary = os.environ.get("MC_TEST_CLIENT_BIN") or shutil.which("mooncake_client")
    if not binary:
        pytest.fail("no mooncake_client: install the package or set MC_TEST_CLIENT_BIN")
    return [binary]


@pytest.fixture(scope="module")
def real_client(master):
    """A real client with a 64 MiB segment serving dummies on a free service port (upstream's
    --port); yields the address dummies name, 127.0.0.1:<that port>."""
    port = free_port()
    args = client_command() + [
        f"--master_server_address={master.address}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--global_segment_size=64 MB",
        "--local_buffer_size=0",
        "--metadata_server=P2PHANDSHAKE",
    ]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        line = b""
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(process.stdout.fileno(), 1)
                if not chunk:
                    break
                line += chunk
        assert line.startswith(b"READY "), f"mooncake_client said {line!r}"
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def dummy(store_module, real_client):
    store = store_module.MooncakeDistributedStore()
    assert store.setup_dummy(0, 16 * MIB, real_client) == 0
    yield store
    store.close()


def test_setup_dummy_fails_with_minus_one_without_a_real_client(store_module):
    store = store_module.MooncakeDistributedStore()
    assert store.setup_dummy(0, 16 * MIB, "127.0.0.1:1") == -1
    assert store.health_check() == 1


def test_a_dummy_reads_and_writes_through_the_real_client(dummy):
    assert dummy.health_check() == 0
    assert dummy.get_hostname() == ""
    key = unique_key("dummy")
    value = bytes(range(256)) * 4096
    assert dummy.put(key, value) == 0
    assert dummy.get(key) == value
    assert dummy.is_exist(key) == 1
    assert dummy.remove(key, True) == 0
    assert dummy.is_exist(key) == 0


def test_host_mem_allocator_memory_is_registered_and_moved_zero_copy(store_module, dummy):
    allocator = store_module.MooncakeHostMemAllocator()
    size = 2 * MIB
    addr = allocator.alloc(size)
    assert addr != 0
    assert dummy.register_buffer(addr, size) == 0
    src = (ctypes.c_ubyte * MIB).from_address(addr)
    dst = (ctypes.c_ubyte * MIB).from_address(addr + MIB)
    for i in range(0, MIB, 4099):
        src[i] = (i * 7) & 0xFF
    key = unique_key("shm")
    assert dummy.put_from(key, addr, MIB) == 0
    assert dummy.get_into(key, addr + MIB, MIB) == MIB
    assert bytes(dst) == bytes(src)
    pool_block = dummy.alloc_from_mem_pool(4096)
    assert pool_block != 0
    assert dummy.register_buffer(pool_block, 4096) == 0
    assert dummy.unregister_buffer(pool_block) == 0
    assert dummy.unregister_buffer(addr) == 0
    assert allocator.free(addr) == 0
    assert allocator.free(addr) == -1


def test_a_dummy_refuses_to_register_memory_the_real_client_cannot_map(dummy):
    heap = ctypes.create_string_buffer(8192)
    # As upstream's DummyClient: -1 (not -600) for memory outside the shared pool.
    assert dummy.register_buffer(ctypes.addressof(heap), 8192) == -1


def test_cuda_tensor_reads_serve_only_dummies(store, dummy):
    key = unique_key("cuda-read")
    assert store.get_tensor_into_cuda(key, object()) == INVALID_PARAMS, "not a dummy"
    assert dummy.batch_get_tensor_into_cuda([key, key], [object()]) == [INVALID_PARAMS] * 2


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_cuda_tensor_reads_check_the_destination(dummy):
    import torch

    from mooncake import _tensor as t

    key = unique_key("cuda-read")
    stored = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    assert dummy.put_tensor(key, stored) == 0
    cpu = torch.zeros(3, 4, dtype=torch.int32)
    assert dummy.get_tensor_into_cuda(key, cpu) == INVALID_PARAMS, "not a CUDA tensor"
    assert torch.equal(cpu, torch.zeros(3, 4, dtype=torch.int32))
    assert dummy.get_tensor_into_cuda(unique_key("absent"), cpu) == INVALID_PARAMS
    if torch.cuda.is_available():
        dst = torch.zeros(3, 4, dtype=torch.int32, device="cuda")
        assert dummy.get_tensor_into_cuda(key, dst) == stored.numel() * 4
        assert torch.equal(dst.cpu(), stored)
        wrong = torch.zeros(4, 3, dtype=torch.int32, device="cuda")
        assert dummy.batch_get_tensor_into_cuda([key], [wrong]) == [INVALID_PARAMS]
    assert t.parse_header(dummy.get_buffer(key)).local_shape == (3, 4)
