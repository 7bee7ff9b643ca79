"""Module layout (spec §1), ReplicateConfig (§2), enums (§3), BufferHandle's class (§5.1)."""

import pytest

import mooncake.store as store

CLASSES = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ObjectDataType",
           "ReplicaStatus", "TaskType", "TaskStatus", "BufferHandle"]


def test_module_name_and_class_modules():
    assert store.__name__ == "mooncake.store"
    for name in CLASSES:
        assert getattr(store, name).__module__ == "mooncake.store", name


def test_package_reexports_buffer_pool():
    import mooncake
    import mooncake.buffer_pool as bp

    assert mooncake.BufferPool is bp.BufferPool
    assert mooncake.RegisteredBufferPool is bp.RegisteredBufferPool
    assert bp.BufferPool is getattr(store, "BufferPool", None)
    assert bp.RegisteredBufferPool is getattr(store, "RegisteredBufferPool", None)
    assert sorted(mooncake.__all__) == ["BufferPool", "RegisteredBufferPool"]


def test_console_script_modules():
    import mooncake.cli
    import mooncake.cli_client

    assert callable(mooncake.cli.main) and callable(mooncake.cli_client.main)
    assert callable(store._run_master) and callable(store._run_client)


# ---- ReplicateConfig -----------------------------------------------------------------------

DEFAULT_STR = (
    "ReplicateConfig: { replica_num: 1, nof_replica_num: 0, dfs_replica_num: 0, "
    "soft_pin_action: PRESERVE, soft_pin_ttl_ms: default, with_hard_pin: 0, "
    "preferred_segments: [], preferred_nof_segments: [], prefer_alloc_in_same_node: 0, "
    "data_type: UNKNOWN }"
)


def test_replicate_config_defaults():
    c = store.ReplicateConfig()
    assert c.replica_num == 1
    assert c.nof_replica_num == 0
    assert c.dfs_replica_num == 0
    assert c.soft_pin_action == store.SoftPinAction.PRESERVE
    assert c.soft_pin_ttl_ms is None
    assert c.with_hard_pin is False
    assert c.preferred_segments == []
    assert c.preferred_nof_segments == []
    assert c.preferred_segment == ""
    assert c.prefer_alloc_in_same_node is False
    assert c.data_type == store.ObjectDataType.UNKNOWN
    assert c.group_ids is None


def test_replicate_config_str_default():
    assert str(store.ReplicateConfig()) == DEFAULT_STR


def test_replicate_config_str_every_field():
    c = store.ReplicateConfig()
    c.replica_num = 2
    c.soft_pin_action = store.SoftPinAction.ENABLE
    c.soft_pin_ttl_ms = 1000
    c.with_hard_pin = True
    c.preferred_segments = ["a:1", "b:2"]
    c.preferred_segment = "x:3"
    c.preferred_nof_segments = ["n"]
    c.prefer_alloc_in_same_node = True
    c.data_type = store.ObjectDataType.KVCACHE
    c.group_ids = ["g1", ""]
    assert str(c) == (
        "ReplicateConfig: { replica_num: 2, nof_replica_num: 0, dfs_replica_num: 0, "
        "soft_pin_action: ENABLE, soft_pin_ttl_ms: 1000, with_hard_pin: 1, "
        "preferred_segments: [a:1, b:2], preferred_segment (deprecated): x:3, "
        "preferred_nof_segments: [n], prefer_alloc_in_same_node: 1, data_type: KVCACHE, "
        "group_ids: [g1, ] }"
    )


def test_replicate_config_repr_is_the_default():
    assert repr(store.ReplicateConfig()).startswith("<mooncake.store.ReplicateConfig object at 0x")


def test_replicate_config_takes_no_arguments():
    with pytest.raises(TypeError):
        store.ReplicateConfig(replica_num=2)
    with pytest.raises(TypeError):
        store.ReplicateConfig(2)


def test_replicate_config_identity_equality_and_no_dict():
    a, b = store.ReplicateConfig(), store.ReplicateConfig()
    assert a == a and a != b
    with pytest.raises(AttributeError):
        a.no_such_field = 1


@pytest.mark.parametrize(
    "name, value",
    [
        ("replica_num", 3), ("replica_num", 0), ("replica_num", (1 << 64) - 1),
        ("nof_replica_num", 1), ("dfs_replica_num", 2),
        ("soft_pin_ttl_ms", 0), ("soft_pin_ttl_ms", 5000), ("soft_pin_ttl_ms", None),
        ("with_hard_pin", True), ("prefer_alloc_in_same_node", True),
        ("preferred_segments", ["h:1", "h:2"]), ("preferred_nof_segments", ["n1"]),
        ("preferred_segment", "localhost:12345"),
        ("group_ids", ["group-a", ""]), ("group_ids", None),
    ],
)
def test_replicate_config_attribute_round_trip(name, value):
    c = store.ReplicateConfig()
    setattr(c, name, value)
    assert getattr(c, name) == value


def test_replicate_config_enum_attributes():
    c = store.ReplicateConfig()
    for member in (store.SoftPinAction.ENABLE, store.SoftPinAction.DISABLE):
        c.soft_pin_action = member
        assert c.soft_pin_action == member
    c.data_type = store.ObjectDataType.WEIGHT
    assert c.data_type == store.ObjectDataType.WEIGHT


def test_replicate_config_sequences_accept_tuples():
    c = store.ReplicateConfig()
    c.preferred_segments = ("a", "b")
    assert c.preferred_segments == ["a", "b"]


@pytest.mark.parametrize(
    "name, value",
    [
        ("soft_pin_ttl_ms", -1), ("soft_pin_ttl_ms", 1 << 64), ("soft_pin_ttl_ms", 1.5),
        ("soft_pin_ttl_ms", "10"),
        ("replica_num", -1), ("replica_num", 1 << 64), ("replica_num", 1.0),
        ("replica_num", None), ("replica_num", "1"),
        ("nof_replica_num", -1), ("dfs_replica_num", 1 << 64),
        ("soft_pin_action", 1), ("soft_pin_action", None),
        ("data_type", 1), ("data_type", store.SoftPinAction.ENABLE),
        ("preferred_segments", "abc"), ("preferred_segments", [1]),
        ("group_ids", [None]), ("preferred_segment", 5),
    ],
)
def test_replicate_config_rejects(name, value):
    c = store.ReplicateConfig()
    with pytest.raises(TypeError):
        setattr(c, name, value)


def test_replicate_config_list_getters_return_copies():
    c = store.ReplicateConfig()
    c.preferred_segments.append("x")
    assert c.preferred_segments == []
    c.group_ids = ["g"]
    c.group_ids.append("h")
    assert c.group_ids == ["g"]


def test_replicate_config_fields_are_class_descriptors():
    for name in ("group_ids", "replica_num", "soft_pin_ttl_ms", "preferred_segment"):
        assert hasattr(store.ReplicateConfig, name)


# ---- enums ---------------------------------------------------------------------------------

ENUMS = {
    "SoftPinAction": {"PRESERVE": 0, "ENABLE": 1, "DISABLE": 2},
    "ObjectDataType": {"UNKNOWN": 0, "KVCACHE": 1, "TENSOR": 2, "WEIGHT": 3, "SAMPLE": 4,
                       "ACTIVATION": 5, "GRADIENT": 6, "OPTIMIZER_STATE": 7, "METADATA": 8,
                       "GENERAL": 9},
    "ReplicaStatus": {"UNDEFINED": 0, "INITIALIZED": 1, "PROCESSING": 2, "COMPLETE": 3,
                      "REMOVED": 4, "FAILED": 5},
    "TaskType": {"REPLICA_COPY": 0, "REPLICA_MOVE": 1},
    "TaskStatus": {"PENDING": 0, "PROCESSING": 1, "FAILED": 2, "SUCCESS": 3},
}


@pytest.mark.parametrize("enum_name", sorted(ENUMS))
def test_enum_members_and_values(enum_name):
    enum = getattr(store, enum_name)
    assert set(enum.__members__) == set(ENUMS[enum_name])
    for name, value in ENUMS[enum_name].items():
        member = getattr(enum, name)
        assert enum.__members__[name] == member
        assert member.name == name
        assert member.value == value
        assert int(member) == value
        assert enum(value) == member
        assert str(member) == f"{enum_name}.{name}"
        assert hash(member) == hash(enum(value))


@pytest.mark.parametrize("enum_name", sorted(ENUMS))
def test_enum_comparison_is_strict(enum_name):
    enum = getattr(store, enum_name)
    members = [getattr(enum, n) for n in ENUMS[enum_name]]
    for i, a in enumerate(members):
        for j, b in enumerate(members):
            assert (a == b) is (i == j)
        assert (a == ENUMS[enum_name][a.name]) is False
        with pytest.raises(TypeError):
            a < members[0]  # noqa: B015 (no ordering)


def test_enums_of_different_types_differ():
    assert store.ReplicaStatus.PROCESSING != store.TaskStatus.PROCESSING


def test_module_scope_exports():
    exported = {
        "ObjectDataType": ENUMS["ObjectDataType"],
        "ReplicaStatus": {"UNDEFINED": 0, "INITIALIZED": 1, "COMPLETE": 3, "REMOVED": 4},
        "TaskType": ENUMS["TaskType"],
        "TaskStatus": ENUMS["TaskStatus"],
    }
    for enum_name, members in exported.items():
        for name in members:
            value = getattr(store, name)
            assert type(value) is getattr(store, enum_name), name
            assert value == getattr(getattr(store, enum_name), name), name
    for name in ("PRESERVE", "ENABLE", "DISABLE"):
        assert not hasattr(store, name)


def test_processing_and_failed_collision_resolves_to_task_status():
    assert type(store.PROCESSING) is store.TaskStatus
    assert type(store.FAILED) is store.TaskStatus
    assert store.PROCESSING == store.TaskStatus.PROCESSING
    assert store.FAILED == store.TaskStatus.FAILED


def test_buffer_handle_has_no_constructor():
    with pytest.raises(TypeError):
        store.BufferHandle()
