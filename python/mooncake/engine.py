"""mooncake.engine: the transfer engine's own Python API (upstream's pybind module `engine`),
on the mooncake-rs transfer engine.

`TransferEngine`, `TransferOpcode` (`Read` = 0, `Write` = 1, also at module level) and
`TransferNotify`, with upstream's method names, arguments and integer return codes; see
docs/python.md of mooncake-rs for what differs.
"""

from mooncake.store import engine as _native

TransferEngine = _native.TransferEngine
TransferOpcode = _native.TransferOpcode
TransferNotify = _native.TransferNotify
Read = _native.Read
Write = _native.Write

__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify", "Read", "Write"]
