"""Store client configuration read from a JSON file or from ``MOONCAKE_*`` variables.

Pure Python, independent of the native module: ``mooncake.store`` itself reads no
``MOONCAKE_*`` variable. A :class:`MooncakeConfig` is a plain dataclass; nothing here is shared
between threads, and every error is a ``ValueError`` (or the ``OSError``/``json`` error of
reading the file).
"""

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional

logger = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB

KNOWN_PROTOCOLS = frozenset(
    {
        "tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip",
        "barex", "cxl", "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only",
    }
)

# Checked in this order: the two-letter suffixes before the one-letter ones.
_SIZE_SUFFIXES = (
    ("kb", 1024),
    ("mb", 1024**2),
    ("gb", 1024**3),
    ("tb", 1024**4),
    ("k", 1024),
    ("m", 1024**2),
    ("g", 1024**3),
    ("t", 1024**4),
    ("b", 1),
)

_TRUE_WORDS = frozenset({"true", "1", "yes", "on", "enable"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off", "disable", ""})

_REQUIRED_FILE_FIELDS = ("local_hostname", "metadata_server", "master_server_address")


def _parse_segment_size(value: Any) -> int:
    """Parses a byte size: an ``int``, or a string such as ``"16 MB"``, ``"1.5gb"``, ``"4G"``.

    Suffixes (case-insensitive) are powers of 1024; ``b`` or none means bytes. Any other
    non-string is passed to ``int()``. Raises ValueError for an empty string, a suffix without
    a number, or anything ``float()`` rejects.
    """
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return int(value)
    text = value.strip().lower()
    if not text:
        raise ValueError("empty size string")
    for suffix, multiplier in _SIZE_SUFFIXES:
        if text.endswith(suffix):
            number = text[: -len(suffix)].strip()
            if not number:
                raise ValueError(f"size {value!r} has a unit but no number")
            return int(float(number) * multiplier)
    return int(float(text))


def _parse_bool(value: Any) -> bool:
    """Parses a flag: a ``bool``, a number (its truth), ``None`` (False), or one of the words
    true/1/yes/on/enable, false/0/no/off/disable or ``""`` (trimmed, case-insensitive).

    Raises ValueError for any other value.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None:
        return False
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueError(f"cannot parse {value!r} as a boolean")


def _require_text(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


@dataclass
class MooncakeConfig:
    """What ``MooncakeDistributedStore.setup`` needs, plus the optional offload/HTTP settings.

    Construction validates and normalises: ``protocol`` is stripped and lower-cased (an unknown
    one only logs a warning), sizes must not be negative, and the host, metadata and master
    addresses must be non-empty strings; otherwise ValueError.
    """

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"protocol must be a non-empty string, got {self.protocol!r}")
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in KNOWN_PROTOCOLS:
            logger.warning("unknown protocol %r", self.protocol)
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in _REQUIRED_FILE_FIELDS:
            _require_text(name, getattr(self, name))

    @staticmethod
    def from_file(file_path: str) -> "MooncakeConfig":
        """Reads a JSON object; ``local_hostname``, ``metadata_server`` and
        ``master_server_address`` are required (ValueError "Missing required config field")."""
        with open(file_path, encoding="utf-8") as f:
            config: Dict[str, Any] = json.load(f)
        for field in _REQUIRED_FILE_FIELDS:
            if field not in config:
                raise ValueError(f"Missing required config field: {field}")
        ssd_offload_path = config.get("ssd_offload_path", "")
        tenant_id = config.get("tenant_id", "default")
        return MooncakeConfig(
            local_hostname=config["local_hostname"],
            metadata_server=config["metadata_server"],
            global_segment_size=_parse_segment_size(
                config.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)
            ),
            local_buffer_size=_parse_segment_size(
                config.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)
            ),
            protocol=config.get("protocol", "tcp"),
            device_name=config.get("device_name", ""),
            master_server_address=config["master_server_address"],
            enable_ssd_offload=_parse_bool(config.get("enable_ssd_offload", False)),
            ssd_offload_path="" if ssd_offload_path is None else ssd_offload_path,
            tenant_id="default" if tenant_id is None else tenant_id,
            enable_client_http_server=_parse_bool(config.get("enable_client_http_server", False)),
            client_http_port=int(config.get("client_http_port", 9300)),
        )

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        """``from_file($MOONCAKE_CONFIG_PATH)`` when that is set; otherwise the ``MOONCAKE_*``
        variables, of which ``MOONCAKE_MASTER`` is required (ValueError when neither is set)."""
        config_path = os.getenv("MOONCAKE_CONFIG_PATH")
        if config_path:
            return MooncakeConfig.from_file(config_path)
        master = os.getenv("MOONCAKE_MASTER")
        if not master:
            raise ValueError(
                "Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor "
                "'MOONCAKE_MASTER' is set."
            )
        return MooncakeConfig(
            local_hostname=os.getenv("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=os.getenv("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=_parse_segment_size(
                os.getenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE)
            ),
            local_buffer_size=_parse_segment_size(
                os.getenv("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE)
            ),
            protocol=os.getenv("MOONCAKE_PROTOCOL", "tcp"),
            device_name=os.getenv("MOONCAKE_DEVICE", ""),
            master_server_address=master,
            enable_ssd_offload=_parse_bool(os.getenv("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=os.getenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=os.getenv("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=_parse_bool(
                os.getenv("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")
            ),
            client_http_port=int(os.getenv("MOONCAKE_CLIENT_HTTP_PORT", "9300")),
        )

    def to_setup_dict(self) -> Dict[str, Any]:
        """The dict form of ``MooncakeDistributedStore.setup`` for this config (the key names
        ``rdma_devices`` and ``master_server_addr`` are the setup dict's, not the fields')."""
        return {
            "local_hostname": self.local_hostname,
            "metadata_server": self.metadata_server,
            "global_segment_size": self.global_segment_size,
            "local_buffer_size": self.local_buffer_size,
            "protocol": self.protocol,
            "rdma_devices": self.device_name or "",
            "master_server_addr": self.master_server_address,
            "enable_ssd_offload": self.enable_ssd_offload,
            "ssd_offload_path": self.ssd_offload_path,
            "tenant_id": self.tenant_id,
            "enable_client_http_server": self.enable_client_http_server,
            "client_http_port": self.client_http_port,
        }
