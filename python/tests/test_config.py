"""mooncake.mooncake_config (spec §7.1): the size and bool grammars, the JSON file and the
MOONCAKE_* environment loaders, validation; and a loaded config driving the dict setup."""

import json

import pytest

from conftest import unique_key
from mooncake.mooncake_config import MooncakeConfig, _parse_bool, _parse_segment_size

ENV_VARS = [
    "MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER", "MOONCAKE_LOCAL_HOSTNAME",
    "MOONCAKE_TE_META_DATA_SERVER", "MOONCAKE_GLOBAL_SEGMENT_SIZE", "MOONCAKE_LOCAL_BUFFER_SIZE",
    "MOONCAKE_PROTOCOL", "MOONCAKE_DEVICE", "MOONCAKE_OFFLOAD_ENABLED",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "MOONCAKE_TENANT_ID",
    "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "MOONCAKE_CLIENT_HTTP_PORT",
]


@pytest.fixture
def clean_env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "text, expected",
    [
        (123, 123),
        ("512", 512),
        ("16 MB", 16 * 1024**2),
        ("16mb", 16 * 1024**2),
        ("1.5gb", int(1.5 * 1024**3)),
        ("4G", 4 * 1024**3),
        ("2k", 2048),
        ("3 KB", 3072),
        ("1t", 1024**4),
        ("1TB", 1024**4),
        ("100b", 100),
        ("  7M  ", 7 * 1024**2),
        ("1_000", 1000),
        (2.9, 2),
    ],
)
def test_parse_segment_size_accepts(text, expected):
    assert _parse_segment_size(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "MB", "k", "50%", "abc", "0x10", "16 MiB"])
def test_parse_segment_size_rejects(text):
    with pytest.raises(ValueError):
        _parse_segment_size(text)


@pytest.mark.parametrize(
    "value, expected",
    [
        (True, True), (False, False), (1, True), (0, False), (0.5, True), (0.0, False),
        (None, False), ("true", True), (" TRUE ", True), ("1", True), ("yes", True),
        ("On", True), ("enable", True), ("false", False), ("0", False), ("NO", False),
        ("off", False), ("disable", False), ("", False), ("  ", False),
    ],
)
def test_parse_bool_accepts(value, expected):
    assert _parse_bool(value) is expected


@pytest.mark.parametrize("value", ["maybe", "2", "enabled", [], {}])
def test_parse_bool_rejects(value):
    with pytest.raises(ValueError):
        _parse_bool(value)


def write_json(tmp_path, obj):
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps(obj))
    return str(path)


REQUIRED = {
    "local_hostname": "node1",
    "metadata_server": "P2PHANDSHAKE",
    "master_server_address": "127.0.0.1:50051",
}


def test_from_file_defaults(tmp_path):
    cfg = MooncakeConfig.from_file(write_json(tmp_path, REQUIRED))
    assert cfg == MooncakeConfig(
        local_hostname="node1",
        metadata_server="P2PHANDSHAKE",
        global_segment_size=3355443200,
        local_buffer_size=1073741824,
        protocol="tcp",
        device_name="",
        master_server_address="127.0.0.1:50051",
        enable_ssd_offload=False,
        ssd_offload_path="",
        tenant_id="default",
        enable_client_http_server=False,
        client_http_port=9300,
    )


def test_from_file_every_field(tmp_path):
    obj = dict(
        REQUIRED,
        global_segment_size="1.5gb",
        local_buffer_size="16 MB",
        protocol=" RDMA ",
        device_name="mlx5_0",
        enable_ssd_offload="yes",
        ssd_offload_path=None,
        tenant_id=None,
        enable_client_http_server="on",
        client_http_port="9400",
    )
    cfg = MooncakeConfig.from_file(write_json(tmp_path, obj))
    assert cfg.global_segment_size == int(1.5 * 1024**3)
    assert cfg.local_buffer_size == 16 * 1024**2
    assert cfg.protocol == "rdma"
    assert cfg.device_name == "mlx5_0"
    assert cfg.enable_ssd_offload is True
    assert cfg.ssd_offload_path == ""
    assert cfg.tenant_id == "default"
    assert cfg.enable_client_http_server is True
    assert cfg.client_http_port == 9400


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_from_file_missing_required_field(tmp_path, missing):
    obj = {k: v for k, v in REQUIRED.items() if k != missing}
    with pytest.raises(ValueError, match=f"Missing required config field: {missing}"):
        MooncakeConfig.from_file(write_json(tmp_path, obj))


def test_load_from_env_defaults(clean_env):
    clean_env.setenv("MOONCAKE_MASTER", "10.0.0.1:50051")
    cfg = MooncakeConfig.load_from_env()
    assert cfg.master_server_address == "10.0.0.1:50051"
    assert cfg.local_hostname == "localhost"
    assert cfg.metadata_server == "P2PHANDSHAKE"
    assert cfg.global_segment_size == 3355443200
    assert cfg.local_buffer_size == 1073741824
    assert cfg.protocol == "tcp"
    assert cfg.device_name == ""
    assert cfg.enable_ssd_offload is False
    assert cfg.ssd_offload_path == ""
    assert cfg.tenant_id == "default"
    assert cfg.enable_client_http_server is False
    assert cfg.client_http_port == 9300


def test_load_from_env_every_variable(clean_env):
    values = {
        "MOONCAKE_MASTER": "10.0.0.1:50051",
        "MOONCAKE_LOCAL_HOSTNAME": "node7",
        "MOONCAKE_TE_META_DATA_SERVER": "http://10.0.0.1:8080/metadata",
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": "4G",
        "MOONCAKE_LOCAL_BUFFER_SIZE": "512",
        "MOONCAKE_PROTOCOL": "TCP",
        "MOONCAKE_DEVICE": "erdma_0",
        "MOONCAKE_OFFLOAD_ENABLED": "1",
        "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": "/data/ssd",
        "MOONCAKE_TENANT_ID": "t1",
        "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER": "true",
        "MOONCAKE_CLIENT_HTTP_PORT": "9555",
    }
    for name, value in values.items():
        clean_env.setenv(name, value)
    cfg = MooncakeConfig.load_from_env()
    assert (cfg.master_server_address, cfg.local_hostname, cfg.metadata_server) == (
        "10.0.0.1:50051", "node7", "http://10.0.0.1:8080/metadata")
    assert (cfg.global_segment_size, cfg.local_buffer_size) == (4 * 1024**3, 512)
    assert (cfg.protocol, cfg.device_name) == ("tcp", "erdma_0")
    assert (cfg.enable_ssd_offload, cfg.ssd_offload_path, cfg.tenant_id) == (True, "/data/ssd", "t1")
    assert (cfg.enable_client_http_server, cfg.client_http_port) == (True, 9555)


def test_load_from_env_prefers_config_path(clean_env, tmp_path):
    clean_env.setenv("MOONCAKE_MASTER", "10.0.0.1:50051")
    clean_env.setenv("MOONCAKE_CONFIG_PATH", write_json(tmp_path, REQUIRED))
    cfg = MooncakeConfig.load_from_env()
    assert cfg.master_server_address == "127.0.0.1:50051"
    assert cfg.local_hostname == "node1"


def test_load_from_env_needs_master_or_path(clean_env):
    with pytest.raises(ValueError, match="MOONCAKE_CONFIG_PATH.*MOONCAKE_MASTER"):
        MooncakeConfig.load_from_env()


def make_config(**overrides):
    fields = dict(
        local_hostname="h", metadata_server="P2PHANDSHAKE", global_segment_size=0,
        local_buffer_size=0, protocol="tcp", device_name=None, master_server_address="m:1",
    )
    fields.update(overrides)
    return MooncakeConfig(**fields)


@pytest.mark.parametrize(
    "overrides",
    [
        {"protocol": ""}, {"protocol": "  "}, {"protocol": None}, {"protocol": 3},
        {"global_segment_size": -1}, {"local_buffer_size": -1},
        {"local_hostname": ""}, {"metadata_server": ""}, {"master_server_address": ""},
        {"local_hostname": None},
    ],
)
def test_validation_rejects(overrides):
    with pytest.raises(ValueError):
        make_config(**overrides)


def test_unknown_protocol_only_warns(caplog):
    cfg = make_config(protocol=" Carrier-Pigeon ")
    assert cfg.protocol == "carrier-pigeon"
    assert "carrier-pigeon" in caplog.text


def test_dict_setup_from_loaded_config(clean_env, master, store_module):
    """The dict that mc_store_rest_server passes to setup, built from MOONCAKE_* variables."""
    clean_env.setenv("MOONCAKE_MASTER", master.address)
    clean_env.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "32 MB")
    clean_env.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "16mb")
    setup_dict = MooncakeConfig.load_from_env().to_setup_dict()
    assert setup_dict["rdma_devices"] == ""
    assert setup_dict["master_server_addr"] == master.address
    store = store_module.MooncakeDistributedStore()
    try:
        assert store.setup(setup_dict) == 0
        key = unique_key()
        assert store.put(key, b"from-env") == 0
        assert store.get(key) == b"from-env"
    finally:
        assert store.close() == 0
