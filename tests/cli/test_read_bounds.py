"""The read API checks the bounds of what a query compares with: a time outside the store's 64-bit
nanoseconds, a search SQLite would refuse as too complex a LIKE pattern, a cursor holding a
number past 64 bits. The command line says so with an error and a hint, not a traceback; the
same filters through the library raise InvalidInputError."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from datetime import datetime, timezone

import pytest

import tracedb
from tracedb.config import load_config
from tracedb.reads.reader import Filter, Reader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CURSOR_26_DIGITS = base64.urlsafe_b64encode(b"12345678901234567890123456:exec-a").decode().rstrip("=")


@pytest.fixture
def store_dir(tmp_path):
    d = str(tmp_path / "data")
    with tracedb.open(d, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as s:
        s.start("Refund", {"intent": "Refund"}, "exec-a").finish({"status": "success"})
    return d


@pytest.mark.parametrize("args, words", [
    (["--until", "0001-01-01"], "outside the times the store can hold"),
    (["--since", "9999-12-31"], "outside the times the store can hold"),
    (["--search", "a" * 50_000], "an intent has at most 1024"),
    (["--search", "%" * 30_000], "an intent has at most 1024"),
    (["--before", CURSOR_26_DIGITS], "is not a page cursor"),
])
def test_out_of_range_list_filters_are_an_error_and_a_hint(store_dir, args, words):
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", store_dir, "inspect", "--list", *args],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "error: " in r.stderr and words in r.stderr and "hint: " in r.stderr, r.stderr


def test_the_read_api_refuses_the_same_bounds(store_dir):
    year_one = datetime(1, 1, 1, tzinfo=timezone.utc)
    with Reader.open(load_config(overrides={"data_dir": store_dir})) as r:
        for where in (Filter(until=year_one), Filter(since=datetime(9999, 12, 31, tzinfo=timezone.utc)),
                      Filter(since=float("inf")), Filter(search="a" * 1025)):
            with pytest.raises(tracedb.InvalidInputError):
                r.page(where)
        with pytest.raises(tracedb.InvalidInputError, match="not a page cursor"):
            r.page(before=CURSOR_26_DIGITS)
        # Inside the bounds, the filters still filter.
        assert [t.execution_id for t in r.page(Filter(search="refund", since=datetime(1677, 9, 22, tzinfo=timezone.utc))).items] == ["exec-a"]
        assert not r.page(Filter(search="x" * 1024)).items
