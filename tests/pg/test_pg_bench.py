"""The PostgreSQL bench scripts/bench calls (benchmarks/pg.py): it runs, counts every event, and cleans up after itself."""

from __future__ import annotations

import pytest

from benchmarks import pg as bench_pg

pytestmark = pytest.mark.postgres


def test_the_bench_hook_measures_one_and_several_recorders_next_to_sqlite(pg_server, pg_admin, tmp_path):
    result = bench_pg.run(pg_server, events=2000, recorders=(1, 2), events_per_execution=10,
                          batch_records=500, workdir=str(tmp_path))
    assert set(result["postgresql"]) == {"1", "2"}
    assert result["postgresql"]["2"]["events"] == 2000 and result["sqlite"]["1"]["events"] == 2000
    assert all(r["events_per_s"] > 0 for r in [*result["postgresql"].values(), result["sqlite"]["1"]])
    assert result["scaling"] > 0 and result["pg_vs_sqlite"] > 0
    assert len(bench_pg.report_lines(result)) == 6
    assert len(result["schemas"]) == 2
    left = pg_admin.execute(
        "SELECT count(*) FROM pg_namespace WHERE nspname = ANY(%s)", (result["schemas"],)
    ).fetchone()[0]
    assert left == 0  # the schemas it made are gone
    assert list(tmp_path.iterdir()) == []


def test_the_outcomes_bench_times_stats_on_postgresql_from_the_rollup_the_backfill_made(pg_server, pg_admin, tmp_path):
    from benchmarks import outcomes as bench_outcomes

    before = {r[0] for r in pg_admin.execute("SELECT nspname FROM pg_namespace")}
    got = bench_outcomes.scale_pg(pg_server, str(tmp_path), sizes=(3000, 6000))
    assert set(got) == {3000, 6000}
    for size, fig in got.items():
        # Migration 0009's backfill summed the rows put in before it: five groupings, four shards.
        assert fig["rollup_rows"] > 0, size
        assert "stats --all --by model" in fig["queries"] and all(t > 0 for t in fig["queries"].values())
        assert 0 < fig["merged_rollup_rows"] < fig["rollup_rows"], size  # the prune merged the shards
    lines = bench_outcomes._scale_lines(got, "PostgreSQL")
    assert any("stats --all at 6,000: " in line for line in lines)
    assert {r[0] for r in pg_admin.execute("SELECT nspname FROM pg_namespace")} == before  # schemas dropped
    assert list(tmp_path.iterdir()) == []
