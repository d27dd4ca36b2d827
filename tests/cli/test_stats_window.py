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


def test_the_stats_table_has_a_line_per_group_and_counts_the_executions_of_unknown_cost(data_dir, run):
    import tracedb
    from tests.store.test_outcomes import record_mix

    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        record_mix(store)
    result = run("stats", "--all", "--by", "model")
    assert result.exit_code == 0, result.output
    header = result.stderr.split()
    assert header == ["KEY", "EXECUTIONS", "FAILED", "FAILED%", "P50", "P95", "P99", "TOKENS", "COST", "UNPRICED"]
    lines = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert set(lines) == {"total", "gpt-4o-mini", "gpt-4o", "my-own-model"}
    # Four executions (one running), one failed of the three that finished; 1,660 tokens; the
    # one that called a model the price table does not know is counted, not priced.
    total = lines["total"]
    assert total[1:4] == ["4", "1", "33.3%"] and total[7] == "1,660" and total[-1] == "1"
    assert lines["my-own-model"][-2:] == ["unknown", "1"] and lines["gpt-4o"][-1] == "-"  # never $0.0000
    assert lines["gpt-4o"][-2] == "$0.0012"
