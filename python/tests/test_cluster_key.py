"""The cluster key through Python: a keyed mooncake_master serves a store set up with
``cluster_key_file=`` (keyword and dict forms) and refuses stores with another key or none.
One key per process, so each store runs in a subprocess of its own."""

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from conftest import MASTER_START_TIMEOUT_S, _stop, free_port, master_command, port_accepts, wait_until

CLIENT = textwrap.dedent(
    """
    import sys
    from mooncake.store import MooncakeDistributedStore

    master, key, form = sys.argv[1], sys.argv[2], sys.argv[3]
    store = MooncakeDistributedStore()
    if form == "dict":
        config = {"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
                  "global_segment_size": 16 << 20, "local_buffer_size": 16 << 20,
                  "protocol": "tcp", "master_server_addr": master}
        if key:
            config["cluster_key_file"] = key
        rc = store.setup(config)
    else:
        extra = {"cluster_key_file": key} if key else {}
        rc = store.setup("localhost", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", master,
                         **extra)
    if rc != 0:
        print("SETUP", rc)
        sys.exit(0)
    value = bytes(range(256)) * 1024
    assert store.put("py-keyed", value) == 0
    assert store.get("py-keyed") == value
    assert store.upsert("py-keyed", value[:1000]) == 0
    assert store.get("py-keyed") == value[:1000]
    assert store.put_batch(["py-a", "py-b"], [b"a" * 5000, b"b" * 70000]) == 0
    assert store.get_batch(["py-a", "py-b"]) == [b"a" * 5000, b"b" * 70000]
    assert store.remove_by_regex("^py-[ab]$", True) == 2
    assert store.is_exist("py-keyed") == 1
    assert store.remove("py-keyed", True) == 0
    assert store.is_exist("py-keyed") == 0
    store.close()
    print("OK")
    """
)


def key_file(directory, name, hex_key):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(hex_key + "\n")
    os.chmod(path, 0o600)
    return path


def run_client(address, key, form):
    done = subprocess.run([sys.executable, "-c", CLIENT, address, key or "", form],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def keyed_master():
    with tempfile.TemporaryDirectory(prefix="mc-py-key-") as directory:
        ours = key_file(directory, "ours.key", "5c" * 32)
        other = key_file(directory, "other.key", "c5" * 32)
        rpc = free_port()
        log = open(os.path.join(directory, "master.log"), "wb")
        args = master_command() + [
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc}",
            f"--cluster_key_file={ours}",
            "--enable_metric_reporting=false",
        ]
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            up = wait_until(lambda: process.poll() is not None or port_accepts(rpc),
                            MASTER_START_TIMEOUT_S)
            assert up and process.poll() is None, f"mooncake_master did not come up: {args}"
            yield f"127.0.0.1:{rpc}", ours, other
        finally:
            _stop(process)
            log.close()


@pytest.mark.parametrize("form", ["keyword", "dict"])
def test_a_keyed_master_serves_only_stores_with_its_key(keyed_master, form):
    address, ours, other = keyed_master
    assert run_client(address, ours, form) == "OK"
    assert run_client(address, other, form) == "SETUP -9007"  # AUTH_FAILED
    assert run_client(address, None, form).startswith("SETUP")
