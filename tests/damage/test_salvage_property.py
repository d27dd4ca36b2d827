"""Property: any single bit flip, or any zeroed 512-byte sector, in a sealed or unsealed segment
loses at most the records overlapping the damaged bytes; every record salvage gives back is
exactly the one written, and the damaged ranges it reports name every LSN lost."""

from __future__ import annotations

import os
import random
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wal

pytestmark = pytest.mark.timeout(600)

RECORDS = 260


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A log of several sealed segments and an unsealed last one, written by the real writer."""
    d = str(tmp_path_factory.mktemp("wal") / "wal")
    rng = random.Random(7)
    payloads = [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))) for _ in range(RECORDS)]
    w = wal.open_wal(d, segment_size_bytes=8192, preallocate=False)
    for i in range(0, RECORDS, 5):
        w.append_many(payloads[i : i + 5])
    w.close()
    layout = [(r.lsn, r.segment, r.offset, 20 + len(r.payload) + (-(20 + len(r.payload)) % 8)) for r in wal.read_records(d)]
    assert [x[0] for x in layout] == list(range(1, RECORDS + 1))
    segs = wal.list_segments(d)
    assert len(segs) >= 4
    return d, payloads, layout, [s.name for s in segs]


def salvage_all(d: str):
    segs = wal.list_segments(d)
    out = []
    for i, s in enumerate(segs):
        nxt = segs[i + 1].first_lsn if i + 1 < len(segs) else None
        out.append(wal.salvage_file(s.path, next_first_lsn=nxt, last=i + 1 == len(segs)))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), sector=st.booleans())
def test_damage_loses_only_the_records_it_overlaps(written, tmp_path, data, sector):
    src, payloads, layout, names = written
    d = tempfile.mkdtemp(dir=tmp_path)
    shutil.copytree(src, d, dirs_exist_ok=True)
    seg_index = data.draw(st.integers(0, len(names) - 1), label="segment")
    name = names[seg_index]
    path = os.path.join(d, name)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        buf = bytearray(f.read())
        if sector:
            start = data.draw(st.integers(0, (size - 1) // 512), label="sector") * 512
            stop = min(size, start + 512)
            buf[start:stop] = bytes(stop - start)
        else:
            start = data.draw(st.integers(0, size - 1), label="byte")
            stop = start + 1
            buf[start] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        f.seek(0)
        f.write(buf)
    overlapping = {lsn for lsn, seg, off, n in layout if seg == name and off < stop and off + n > start}
    files = salvage_all(d)
    got = {}
    for fs in files:
        for r in fs.records:
            assert r.payload == payloads[r.lsn - 1], f"LSN {r.lsn} came back changed"
            got[r.lsn] = r
    lost = set(range(1, RECORDS + 1)) - set(got)
    assert lost <= overlapping, (name, start, stop, sorted(lost - overlapping))
    reported = set()
    for fs in files:
        for rng in fs.damages:
            if rng.first_lost_lsn is not None:
                last = rng.last_lost_lsn if rng.last_lost_lsn is not None else RECORDS
                reported.update(range(rng.first_lost_lsn, last + 1))
    assert lost <= reported, (sorted(lost), sorted(reported))
