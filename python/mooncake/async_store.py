"""``MooncakeDistributedStoreAsync``: every store method ``m`` gets an awaitable ``async_m``.

``await store.async_m(*args, **kwargs)`` runs ``store.m(*args, **kwargs)`` on the running
loop's default executor and returns its result, so it needs a running event loop. Concurrency
comes from the executor's threads; the native methods release the GIL and are thread-safe.
The wrappers are created on first use and cached on the instance (a subclass instance has a
``__dict__``). Errors: AttributeError for names that are not ``async_<an existing method>``;
whatever the sync method raises propagates through the await.
"""

import asyncio
import functools

from mooncake.store import MooncakeDistributedStore

_PREFIX = "async_"


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    """A ``MooncakeDistributedStore`` with ``async_<method>`` twins of its methods."""

    def __getattr__(self, name):
        # Only reached when normal lookup fails, so cached wrappers are found directly.
        cls_name = type(self).__name__
        if not name.startswith(_PREFIX):
            raise AttributeError(f"'{cls_name}' object has no attribute '{name}'")
        sync_name = name[len(_PREFIX):]
        try:
            sync_method = getattr(self, sync_name)
        except AttributeError:
            raise AttributeError(
                f"'{cls_name}' object has no attribute '{name}' (nor '{sync_name}')"
            ) from None
        if not callable(sync_method):
            raise AttributeError(
                f"'{cls_name}' object attribute '{sync_name}' is not callable"
            )
        wrapper = self._make_async_wrapper(sync_method)
        setattr(self, name, wrapper)
        return wrapper

    @staticmethod
    def _make_async_wrapper(sync_method):
        @functools.wraps(sync_method)
        async def wrapper(*args, **kwargs):
            loop = asyncio.get_running_loop()
            call = functools.partial(sync_method, *args, **kwargs)
            return await loop.run_in_executor(None, call)

        return wrapper
