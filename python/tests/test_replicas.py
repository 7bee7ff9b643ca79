"""Replica descriptors (spec §4.9): get_replica_desc / batch_get_replica_desc and their views,
as vLLM's optional tier logging reads them."""

import pytest

from conftest import unique_key


def test_get_replica_desc_describes_the_memory_replica(store, store_module):
    key = unique_key("rd")
    assert store.put(key, b"x" * 100) == 0
    replicas = store.get_replica_desc(key)
    assert len(replicas) == 1
    r = replicas[0]
    assert r.status == store_module.ReplicaStatus.COMPLETE
    assert r.is_memory_replica() and not r.is_disk_replica() and not r.is_local_disk_replica()
    d = r.get_memory_descriptor().buffer_descriptor
    assert d.size == 100
    assert d.buffer_address != 0
    assert d.transport_endpoint == store.get_hostname()
    assert repr(d) == (f"<Descriptor size=100 buffer_address={d.buffer_address} "
                       f"transport_endpoint={d.transport_endpoint}>")
    with pytest.raises(RuntimeError, match="Expected DiskDescriptor"):
        r.get_disk_descriptor()


def test_missing_keys_are_empty_or_absent(store):
    key = unique_key("rd")
    assert store.put(key, b"abc") == 0
    assert store.get_replica_desc(unique_key("missing")) == []
    found = store.batch_get_replica_desc([key, "rd-missing-key"])
    assert list(found) == [key]
    assert found.get("rd-missing-key") is None
    assert found[key][0].is_memory_replica()


def test_descriptor_is_constructible_plain_data(store_module):
    d = store_module.Descriptor()
    assert (d.size, d.buffer_address, d.transport_endpoint) == (0, 0, "")
    d.size = 7
    assert d.size == 7
    with pytest.raises(TypeError):
        store_module.ReplicaDescriptor()
