"""``BufferPool`` / ``RegisteredBufferPool`` from ``mooncake.store``, or ``None`` where the
native module does not provide them (mooncake-rs does not build BufferPool)."""

try:
    from mooncake.store import BufferPool, RegisteredBufferPool
except (ImportError, AttributeError):
    BufferPool = None
    RegisteredBufferPool = None

__all__ = ["BufferPool", "RegisteredBufferPool"]
