"""mooncake: Mooncake Store's Python package, backed by the mooncake-rs client (Rust).

`mooncake.store` is the native module (pyo3); importing this package imports it tolerantly
through `mooncake.buffer_pool`, as upstream's package does.
"""

from mooncake.buffer_pool import BufferPool, RegisteredBufferPool

__all__ = ["BufferPool", "RegisteredBufferPool"]
