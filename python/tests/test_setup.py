"""setup in both forms (spec §4.1), close, health_check, get_hostname, re-setup."""

import socket
import time
import urllib.request

import pytest

from conftest import (
    INVALID_PARAMS, LOCAL_BUFFER_SIZE, MIB, SEGMENT_SIZE, free_port, unique_key, wait_until,
)


@pytest.fixture
def fresh(store_module):
    s = store_module.MooncakeDistributedStore()
    yield s
    s.close()


def positional(master, **over):
    args = dict(
        local_hostname="localhost", metadata_server="P2PHANDSHAKE",
        global_segment_size=SEGMENT_SIZE, local_buffer_size=LOCAL_BUFFER_SIZE,
        protocol="tcp", rdma_devices="", master_server_addr=master.address,
    )
    args.update(over)
    return args


def assert_usable(store):
    key = unique_key()
    assert store.put(key, b"usable") == 0
    assert store.get(key) == b"usable"


def test_seven_positional(fresh, master):
    assert fresh.setup(*positional(master).values()) == 0
    assert fresh.health_check() == 0
    host = fresh.get_hostname()
    assert host.startswith("localhost:")
    assert 12300 <= int(host.rsplit(":", 1)[1]) <= 14300
    assert_usable(fresh)


def test_all_keywords(fresh, master):
    assert fresh.setup(**positional(master)) == 0
    assert_usable(fresh)


def test_explicit_port_is_kept(fresh, master):
    port = free_port()
    assert fresh.setup(**positional(master, local_hostname=f"localhost:{port}")) == 0
    assert fresh.get_hostname() == f"localhost:{port}"


def test_http_metadata_server(fresh, master):
    assert fresh.setup(**positional(master, metadata_server=master.metadata_url)) == 0
    assert_usable(fresh)


def test_sglang_form_engine_none_and_every_kwarg(fresh, master):
    rc = fresh.setup(
        *positional(master).values(), None,
        enable_client_http_server=False, client_http_port=free_port(),
        enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
    )
    assert rc == 0
    assert_usable(fresh)


def test_ssd_offload_kwargs_turn_the_tier_on(fresh, master, tmp_path):
    rc = fresh.setup(
        *positional(master, global_segment_size=4 * 1024 * 1024).values(), None,
        enable_ssd_offload=True, ssd_offload_path=str(tmp_path / "ssd"),
    )
    assert rc == 0
    assert_usable(fresh)
    # Four times the segment: the evicted values go to the tier and read back exactly.
    values = {f"{unique_key()}-{i}": bytes([i]) * (512 * 1024) for i in range(32)}
    for key, value in values.items():
        for _ in range(2000):  # bounded: a full pool waits for demotions
            rc = fresh.put(key, value)
            if rc != -200:
                break
            time.sleep(0.005)
        assert rc == 0, rc
    for key, value in values.items():
        assert fresh.get(key) == value
    on_disk = [
        key for key, replicas in fresh.batch_get_replica_desc(list(values)).items()
        if replicas and replicas[0].is_local_disk_replica()
    ]
    assert on_disk, "some values were demoted to the SSD tier"
    # The directory is the tier's: locked, with its identity file.
    assert (tmp_path / "ssd" / "LOCK").exists() and (tmp_path / "ssd" / "TIER_ID").exists()
    second = type(fresh)()
    try:
        assert second.setup(
            *positional(master).values(), None,
            enable_ssd_offload=True, ssd_offload_path=str(tmp_path / "ssd"),
        ) != 0, "a second client on the directory is refused"
    finally:
        second.close()


def test_ssd_offload_without_a_directory_is_refused(fresh, master, monkeypatch):
    monkeypatch.delenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", raising=False)
    rc = fresh.setup(*positional(master).values(), None, enable_ssd_offload=True)
    assert rc != 0


def test_unknown_kwarg_is_a_type_error_naming_it(fresh, master):
    with pytest.raises(TypeError, match="no_such_option"):
        fresh.setup(*positional(master).values(), no_such_option=1)


def test_missing_required_argument(fresh, master):
    with pytest.raises(TypeError):
        fresh.setup(*list(positional(master).values())[:6])
    with pytest.raises(TypeError):
        fresh.setup()


@pytest.mark.parametrize("bad", ["16MB", -1, 1 << 64, 1.5, None])
def test_bad_size_types(fresh, master, bad):
    with pytest.raises(TypeError):
        fresh.setup(**positional(master, global_segment_size=bad))


def test_setup_again_after_close(fresh, master):
    assert fresh.setup(**positional(master)) == 0
    key = unique_key()
    assert fresh.put(key, b"lives-in-my-segment") == 0
    assert fresh.close() == 0
    assert fresh.health_check() == 1
    assert fresh.setup(**positional(master)) == 0
    assert fresh.get(key) == b""
    assert fresh.is_exist(key) == 0
    assert_usable(fresh)


def test_setup_replaces_the_client(fresh, master):
    assert fresh.setup(**positional(master)) == 0
    assert fresh.setup(**positional(master)) == 0
    assert_usable(fresh)


def test_close_is_idempotent(fresh, master):
    assert fresh.close() == 0
    assert fresh.setup(**positional(master)) == 0
    assert fresh.close() == 0
    assert fresh.close() == 0


def test_zero_local_buffer(fresh, master):
    assert fresh.setup(**positional(master, local_buffer_size=0)) == 0
    key = unique_key()
    assert fresh.put(key, b"x" * 100) == INVALID_PARAMS
    assert fresh.is_exist(key) == 0
    assert fresh.get(key) == b""
    assert fresh.get_buffer(key) is None


def test_init_all_after_setup(fresh, master):
    assert fresh.setup(**positional(master)) == 0
    assert fresh.init_all("tcp", "", 16 * MIB) == INVALID_PARAMS


def test_alloc_from_mem_pool_is_zero_for_a_real_client(fresh, master):
    assert fresh.setup(**positional(master)) == 0
    assert fresh.alloc_from_mem_pool(4096) == 0


# ---- the dict form -------------------------------------------------------------------------

def setup_dict(master, **over):
    d = {
        "local_hostname": "localhost",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": "64MB",
        "local_buffer_size": "16 MB",
        "protocol": "tcp",
        "rdma_devices": "",
        "master_server_addr": master.address,
    }
    d.update(over)
    return {k: v for k, v in d.items() if v is not None}


def test_dict_positional(fresh, master):
    assert fresh.setup(setup_dict(master)) == 0
    assert_usable(fresh)


def test_dict_keyword(fresh, master):
    assert fresh.setup(config=setup_dict(master)) == 0
    assert_usable(fresh)


def test_dict_values_are_stringified(fresh, master):
    d = setup_dict(master, global_segment_size=SEGMENT_SIZE, local_buffer_size=16 * MIB,
                   enable_ssd_offload=False, enable_client_http_server=False)
    assert fresh.setup(d) == 0
    assert_usable(fresh)


def test_dict_unknown_keys_are_ignored(fresh, master):
    assert fresh.setup(setup_dict(master, some_future_key="whatever")) == 0


@pytest.mark.parametrize("size", ["16MB", "16 mb", "16M", "0.015625GB", "16777216", "1e7"])
def test_dict_size_grammar_accepts(fresh, master, size):
    assert fresh.setup(setup_dict(master, local_buffer_size=size)) == 0


def test_dict_zero_sizes(fresh, master):
    assert fresh.setup(setup_dict(master, global_segment_size="0", local_buffer_size="0")) == 0


@pytest.mark.parametrize(
    "over",
    [
        {"global_segment_size": "50%"},
        {"local_buffer_size": "50%"},
        {"local_buffer_size": "16 MiB"},
        {"local_buffer_size": "16KiB"},
        {"local_buffer_size": "M16"},
        {"local_buffer_size": ""},
        {"local_buffer_size": "None"},
        {"local_buffer_size": "True"},
        {"local_buffer_size": "-5MB"},
        {"local_buffer_size": "1.5"},
        {"local_buffer_size": "1023"},
        {"local_buffer_size": "2TB"},
        {"global_segment_size": "1023"},
        {"global_segment_size": "infinite"},
        {"client_http_port": "abc"},
        {"local_hostname": ""},
        {"metadata_server": ""},
        {"local_hostname": None},
        {"metadata_server": None},
    ],
)
def test_dict_invalid_values(fresh, master, over):
    assert fresh.setup(setup_dict(master, **over)) == INVALID_PARAMS


def http_health_ok(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("word", ["1", "true", "YES", " on ", "Enable", True])
def test_dict_bool_grammar_true(fresh, master, word):
    port = free_port()
    d = setup_dict(master, enable_client_http_server=word, client_http_port=str(port))
    assert fresh.setup(d) == 0
    assert wait_until(lambda: http_health_ok(port), 10.0)


def test_client_http_server_answers_upstreams_routes(fresh, master):
    port = free_port()
    assert fresh.setup(setup_dict(master, enable_client_http_server=True,
                                  client_http_port=port)) == 0
    assert wait_until(lambda: http_health_ok(port), 10.0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        assert r.read() == b'{"status":"healthy","code":0}'
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    samples = dict(line.rsplit(" ", 1) for line in lines if not line.startswith("#"))
    assert samples["mooncake_client_objects_written"] == "0"
    assert samples["mooncake_client_location_cache_enabled"] == "1"
    assert 'mooncake_auth_handshakes_total{result="no_handshake"}' in samples
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/summary", timeout=5) as r:
        assert b"objects written: 0" in r.read()
    fresh.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


@pytest.mark.parametrize("word", ["0", "false", "No", "off", "disable", "maybe", False])
def test_dict_bool_grammar_false_or_default(fresh, master, word):
    port = free_port()
    d = setup_dict(master, enable_client_http_server=word, client_http_port=f" {port} ")
    assert fresh.setup(d) == 0
    assert not http_health_ok(port)


def test_dict_and_kwargs_form_are_exclusive(fresh, master):
    with pytest.raises(TypeError):
        fresh.setup(setup_dict(master), "extra")
