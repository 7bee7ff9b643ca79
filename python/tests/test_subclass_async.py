"""Subclassing MooncakeDistributedStore and the async wrapper (spec §8)."""

import asyncio

import pytest

from conftest import unique_key


def test_base_instances_have_no_dict(store_module):
    s = store_module.MooncakeDistributedStore()
    assert not hasattr(s, "__dict__")
    with pytest.raises(AttributeError):
        s.foo = 1


def test_subclass_gets_a_dict_and_overrides(make_store, store_module):
    class Tagged(store_module.MooncakeDistributedStore):
        def __init__(self):
            super().__init__()
            self.tag = "t"

        def get(self, key):
            return b"override:" + super().get(key)

    s = make_store(cls=Tagged)
    assert s.tag == "t"
    s.extra = 5
    assert s.extra == 5
    key = unique_key()
    assert s.put(key, b"v") == 0
    assert s.get(key) == b"override:v"
    assert isinstance(s, store_module.MooncakeDistributedStore)


@pytest.fixture
def async_store(make_store):
    from mooncake.async_store import MooncakeDistributedStoreAsync

    return make_store(cls=MooncakeDistributedStoreAsync)


def test_async_put_get_exist(async_store):
    key = unique_key()

    async def go():
        assert await async_store.async_put(key, b"async") == 0
        assert await async_store.async_get(key) == b"async"
        assert await async_store.async_batch_is_exist([key, unique_key()]) == [1, 0]
        assert await async_store.async_put(key=key, value=b"kw") == 0

    asyncio.run(asyncio.wait_for(go(), 30))


def test_async_concurrent_puts(async_store):
    ks = [unique_key() for _ in range(16)]

    async def go():
        rcs = await asyncio.gather(*(async_store.async_put(k, k.encode()) for k in ks))
        assert rcs == [0] * 16
        return await asyncio.gather(*(async_store.async_get(k) for k in ks))

    assert asyncio.run(asyncio.wait_for(go(), 60)) == [k.encode() for k in ks]


def test_async_wrapper_is_cached_and_wraps(async_store):
    w = async_store.async_put
    assert async_store.async_put is w
    assert w.__name__ == "put"
    assert asyncio.iscoroutinefunction(w)


def test_async_attribute_errors(async_store):
    with pytest.raises(AttributeError, match="no_such"):
        async_store.no_such
    with pytest.raises(AttributeError, match=r"\(nor 'no_such'\)"):
        async_store.async_no_such
    async_store.plain_value = 3
    with pytest.raises(AttributeError):
        async_store.async_plain_value
