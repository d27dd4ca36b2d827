"""Generated execution ids sort by creation time, and are still unique and well formed."""

import uuid

import tracedb
from tracedb.records.ids import new_execution_id, uuid7_hex


def test_ids_are_uuid_version_7_with_the_creation_time_first():
    u = uuid.UUID(hex=uuid7_hex(unix_ms=1_700_000_000_123))
    assert u.version == 7 and u.variant == uuid.RFC_4122
    assert u.int >> 80 == 1_700_000_000_123


def _id_at(ms):
    return "exec-" + uuid7_hex(unix_ms=ms)


def test_ids_made_later_sort_later_and_never_repeat():
    earlier = [_id_at(ms) for ms in range(1000, 1100)]
    assert earlier == sorted(earlier)
    many = {new_execution_id() for _ in range(10_000)}
    assert len(many) == 10_000
    assert all(i.startswith("exec-") and len(i) == 37 for i in many)


def test_the_store_and_the_client_generate_time_ordered_ids(tmp_path):
    from tracedb.client import connect

    with tracedb.open(str(tmp_path / "d"), config={"compact_interval_ms": 0}) as store:
        a = store.start("X", {}).execution_id
        b = store.start("X", {}).execution_id
    assert uuid.UUID(hex=a[5:]).version == 7 and a[5:17] <= b[5:17]
    with connect(data_dir=str(tmp_path / "e"), embedded=True) as client:
        c = client.start("X", {}).execution_id
    assert uuid.UUID(hex=c[5:]).version == 7
