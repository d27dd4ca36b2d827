"""docs/sqlite.md's queries run as written against a real store and answer what they say."""

from __future__ import annotations

import os
import re
import sqlite3

import tracedb

from .conftest import settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_queries_of_the_sqlite_page(data_dir):
    with tracedb.open(data_dir, config=settings()) as store:
        done = store.start("Answer", {"q": 1})
        done.event("tool.requested", {"name": "web_search"})
        done.finish({"status": "success"})
        crashed = store.start("Answer", {"q": 2})
        crashed.event("tool.requested", {"name": "calculator"})
    # Closing the store marked the unfinished one incomplete, as recovery would after a crash.
    with open(os.path.join(ROOT, "docs", "sqlite.md"), encoding="utf-8") as f:
        queries = re.findall(r"```sql\n(.*?)```", f.read(), flags=re.S)
    assert len(queries) == 4
    con = sqlite3.connect(f"file:{os.path.join(data_dir, 'traces.db')}?mode=ro", uri=True)
    counts, recent, tools, stops = (con.execute(q).fetchall() for q in queries)
    assert sorted(counts) == [("completed", 1, 1), ("incomplete", 0, 1)]
    assert [r[0] for r in recent] == [crashed.execution_id, done.execution_id] and recent[1][4] >= 0
    assert sorted(t[2] for t in tools) == ["calculator", "web_search"]
    assert stops == [(crashed.execution_id, 1, "tool.requested")]
