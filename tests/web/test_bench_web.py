"""Smoke test of scripts/bench's web section at a tiny size: a change that breaks the bench shows
up here, not in the next benchmark run."""

from __future__ import annotations

from benchmarks import web


def test_the_web_section_measures_every_page_and_ingest(tmp_path):
    out = web.run(str(tmp_path), executions=3000, repeats=2, ingest_seconds=1.0, long_events=200)
    pages = out["pages"]
    assert "list page (newest 50)" in pages and "timeline of a 200-event execution" in pages
    assert "timeline and span tree of a 200-event nested execution" in pages
    assert {"filtered: outcome=failed", "overview (stats per day, by intent, by model)"} <= set(pages)
    assert all(fig["p95_ms"] > 0 and fig["bytes"] > 0 for fig in pages.values())
    ing = out["ingest"]
    assert ing["alone_events_per_s"] > 0 and set(ing["with_ui"]) == {"10/s", "flat out"}
    for fig in ing["with_ui"].values():
        assert fig["events_per_s"] > 0 and fig["ui_requests_per_s"] > 0 and fig["ui_requests_failed"] == 0
    # The store is kept for the next run; a second run does not rebuild it.
    assert web.build_store(str(tmp_path / "web-3000"), 3000) == 0.0
