"""`tracedb stats` reads the last 24 hours unless told otherwise: --since, or --all."""

from __future__ import annotations

import json


def test_stats_reads_the_last_24_hours_unless_given_since_or_all(seeded, run):
    # seeded's two executions were created in January 2024.
    day = json.loads(run("stats", "--json").output)
    assert day["total"]["executions"] == 0 and day["since_ns"] is not None
    every = json.loads(run("stats", "--all", "--json").output)
    assert every["since_ns"] is None and every["total"]["executions"] == 2
    assert every["total"]["p50_ms"] is not None  # the index walk found the finished one
    since = json.loads(run("stats", "--since", "2024-01-01T00:00:00Z", "--json").output)
    assert since["total"]["executions"] == 2
    both = run("stats", "--all", "--since", "7d")
    assert both.exit_code == 2 and "--since or --all, not both" in both.output
