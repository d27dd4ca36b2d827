"""The overview page's pieces that need no store: the buckets a chart stands on, its axis, its
bars (the page itself, over a real store, is in test_http and test_browser)."""

from __future__ import annotations

import pytest

from tracedb.web.overview import MAX_BUCKETS, _nice, bar_chart, filled


def group(key, executions=1, failed=0):
    return {"key": key, "executions": executions, "succeeded": executions - failed, "failed": failed,
            "incomplete": 0, "running": 0, "failure_rate": None, "p50_ms": None, "p95_ms": None, "p99_ms": None,
            "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "cost_unknown": 0}


def test_empty_days_between_two_are_put_back_in_order():
    days = filled([group("2026-01-30T00:00:00Z", 3), group("2026-02-02T00:00:00Z", 5)], "day")
    assert [(g["key"], g["executions"]) for g in days] == [
        ("2026-01-30T00:00:00Z", 3), ("2026-01-31T00:00:00Z", 0), ("2026-02-01T00:00:00Z", 0),
        ("2026-02-02T00:00:00Z", 5)]
    hours = filled([group("2026-01-30T22:00:00Z"), group("2026-01-31T01:00:00Z")], "hour")
    assert [g["key"][11:13] for g in hours] == ["22", "23", "00", "01"]
    assert filled([], "day") == []


def test_a_long_range_keeps_its_newest_buckets():
    days = filled([group("2020-01-01T00:00:00Z"), group("2026-01-01T00:00:00Z", 7)], "day")
    assert len(days) == MAX_BUCKETS["day"] and days[-1] == group("2026-01-01T00:00:00Z", 7)


@pytest.mark.parametrize("top, axis", [(0, 1), (1, 1), (3, 5), (7, 10), (11, 20), (240, 250), (0.00042, 0.0005),
                                       (1_000_001, 2_000_000)])
def test_the_axis_top_is_a_round_number_at_least_the_highest_bar(top, axis):
    assert _nice(top) == pytest.approx(axis)


def test_bars_stack_bottom_first_and_scale_to_the_axis():
    svg = bar_chart("t", "c", [group("2026-01-01T00:00:00Z", 4, failed=1), group("2026-01-02T00:00:00Z", 2)],
                    "day", [("failed", "s-failed", lambda g: g["failed"]), ("ok", "s-ok", lambda g: g["succeeded"])],
                    str)
    first = svg.split('data-key="2026-01-01T00:00:00Z">')[1].split("</g>")[0]
    # Axis top 5 over a plot 152 high: the failure 30.4 high at the bottom, 3 successes on it.
    failed = first.split('class="s-failed"')[1]
    ok = first.split('class="s-ok"')[1]
    assert 'height="30.40"' in failed and 'y="133.60"' in failed
    assert 'height="91.20"' in ok and 'y="42.40"' in ok
    second = svg.split('data-key="2026-01-02T00:00:00Z">')[1].split("</g>")[0]
    assert "s-failed" not in second  # no failures, no bar
    assert "<title>Jan 01 · failed: 1 · ok: 3</title>" in svg
