"""Fixtures of the mooncake.store suite: one real mooncake_master per session on free loopback
ports, and set-up stores that are closed after each test.

The master is the venv's console script ``mooncake_master`` unless ``MC_TEST_MASTER_BIN``
names another binary (e.g. ``target/release/mooncake_master``). Every wait is bounded.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass

import pytest

# The suite is CPU-only (device paths are checked by scripts/gpu-check): never load a device
# runtime, so the tests that pass made-up stream handles get NOT_SUPPORTED on any machine.
os.environ["MC_DEVICE_RUNTIME"] = "none"

LEASE_TTL_MS = 500
MIB = 1024 * 1024
SEGMENT_SIZE = 64 * MIB
LOCAL_BUFFER_SIZE = 64 * MIB
MASTER_START_TIMEOUT_S = 30.0
MASTER_STOP_TIMEOUT_S = 10.0

# Error codes the tests assert (spec §6).
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
NOT_SUPPORTED = -1012

_handed_out_ports = set()


def free_port():
    """A loopback TCP port that was free just now and that no earlier call returned."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out_ports:
            _handed_out_ports.add(port)
            return port
    raise RuntimeError("no fresh free port after 100 tries")


def wait_until(predicate, timeout_s, interval_s=0.02):
    """Polls ``predicate`` until it is true (returns True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def port_accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def unique_key(prefix="k"):
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass
class Master:
    rpc_port: int
    http_metadata_port: int
    metrics_port: int
    process: subprocess.Popen
    log_path: str

    @property
    def address(self):
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_url(self):
        return f"http://127.0.0.1:{self.http_metadata_port}/metadata"

    def log_tail(self, n=4000):
        with open(self.log_path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")


def master_command():
    binary = os.environ.get("MC_TEST_MASTER_BIN") or shutil.which("mooncake_master")
    if not binary:
        pytest.fail("no mooncake_master: install the package or set MC_TEST_MASTER_BIN")
    return [binary]


def _stop(process):
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=MASTER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=MASTER_STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def master():
    rpc, http, metrics = free_port(), free_port(), free_port()
    log = tempfile.NamedTemporaryFile(prefix="mooncake_master-", suffix=".log", delete=False)
    args = master_command() + [
        "--rpc_address=127.0.0.1",
        f"--rpc_port={rpc}",
        f"--default_kv_lease_ttl={LEASE_TTL_MS}",
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host=127.0.0.1",
        f"--http_metadata_server_port={http}",
        "--metrics_host=127.0.0.1",
        f"--metrics_port={metrics}",
    ]
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    m = Master(rpc, http, metrics, process, log.name)
    try:
        up = wait_until(lambda: process.poll() is not None or port_accepts(rpc),
                        MASTER_START_TIMEOUT_S)
        if not up or process.poll() is not None:
            pytest.fail(f"mooncake_master did not come up: {args}\n{m.log_tail()}")
        yield m
    finally:
        _stop(process)
        log.close()


@pytest.fixture(scope="session")
def store_module():
    # A plain import: a wheel whose native module does not load fails the suite, never skips it.
    import mooncake.store

    return mooncake.store


def setup_store(store, master, segment=SEGMENT_SIZE, local_buffer=LOCAL_BUFFER_SIZE,
                metadata="P2PHANDSHAKE"):
    """Runs the 7-positional setup and asserts it returned 0."""
    rc = store.setup("localhost", metadata, segment, local_buffer, "tcp", "", master.address)
    assert rc == 0, f"setup returned {rc}"
    return store


@pytest.fixture
def make_store(master, store_module):
    """Factory of set-up stores (keyword arguments as ``setup_store``); all closed afterwards."""
    made = []

    def make(cls=None, **kwargs):
        store = (cls or store_module.MooncakeDistributedStore)()
        made.append(store)
        return setup_store(store, master, **kwargs)

    yield make
    for store in made:
        store.close()


@pytest.fixture
def store(make_store):
    """A store with a 64 MiB segment and a 64 MiB local buffer, closed after the test."""
    return make_store()


def lease_sleep():
    """Sleeps one read-lease TTL plus a margin: the lease a read granted has then expired."""
    time.sleep(LEASE_TTL_MS / 1000.0 + 0.25)


@pytest.fixture
def registered(store):
    """Factory: a zeroed numpy uint8 array of ``nbytes`` registered with ``store`` (or with the
    store given), unregistered after the test while the array is still alive."""
    import numpy as np

    held = []

    def make(nbytes, on=None):
        target = on or store
        arr = np.zeros(nbytes, dtype=np.uint8)
        assert target.register_buffer(arr.ctypes.data, nbytes) == 0
        held.append((target, arr))
        return arr

    yield make
    for target, arr in held:
        target.unregister_buffer(arr.ctypes.data)


def ptr(arr, offset=0):
    """Address of byte ``offset`` of a numpy array."""
    return arr.ctypes.data + offset
