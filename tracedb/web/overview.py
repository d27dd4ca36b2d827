"""The overview page: what `tracedb stats` computes, drawn. Executions and failures, p95 duration,
tokens and cost per day (or hour), and the same by intent and by model, from the read API's
`stats` (computed in SQL). The charts are inline SVG built here: no script, no CDN, nothing
fetched from elsewhere; every key (an intent, a model) goes through `esc`.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Callable, Optional, Sequence
from urllib.parse import urlencode

from tracedb.web.pages import esc, fmt_duration, fmt_usd, layout_page

# Buckets a chart draws at most (the newest): a year of days, a week of hours.
MAX_BUCKETS = {"day": 366, "hour": 24 * 7}
BUCKETS = ("day", "hour")
W, H = 560.0, 190.0
LEFT, RIGHT, TOP, BOTTOM = 58.0, 10.0, 12.0, 26.0


def _bucket_start(key: str) -> datetime:
    return datetime.fromisoformat(key.replace("Z", "+00:00"))


def filled(groups: Sequence[dict], bucket: str) -> list[dict]:
    """The groups of a day or hour grouping with the empty buckets between them put back (a
    chart's bars stand at even steps), the newest MAX_BUCKETS of them."""
    if not groups:
        return []
    step = timedelta(days=1) if bucket == "day" else timedelta(hours=1)
    have = {g["key"]: g for g in groups}
    first, last = _bucket_start(groups[0]["key"]), _bucket_start(groups[-1]["key"])
    n = int((last - first) / step) + 1
    start = max(0, n - MAX_BUCKETS[bucket])
    out = []
    for i in range(start, n):
        key = (first + i * step).isoformat().replace("+00:00", "Z")
        out.append(have.get(key) or {"key": key, "executions": 0, "succeeded": 0, "failed": 0, "incomplete": 0,
                                     "running": 0, "failure_rate": None, "p50_ms": None, "p95_ms": None,
                                     "p99_ms": None, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0,
                                     "cost_unknown": 0})
    return out


def _bucket_label(key: str, bucket: str) -> str:
    t = _bucket_start(key)
    return t.strftime("%b %d") if bucket == "day" else t.strftime("%b %d %H:00")


def _nice(top: float) -> float:
    """The axis top: 1, 2, 2.5 or 5 times a power of ten, at least `top`."""
    if not top > 0:
        return 1.0
    mag = 10.0 ** math.floor(math.log10(top))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= top * (1 - 1e-12))


def fmt_count(n: float) -> str:
    """A count on an axis: 950, 1.2k, 3.4M."""
    if n >= 1e6:
        return f"{n / 1e6:.3g}M"
    if n >= 1e3:
        return f"{n / 1e3:.3g}k"
    return f"{n:.3g}" if n != int(n) else f"{int(n)}"


def bar_chart(title: str, testid: str, buckets: list[dict], bucket: str,
              series: Sequence[tuple[str, str, Callable[[dict], Optional[float]]]],
              fmt: Callable[[float], str]) -> str:
    """A stacked bar per bucket: `series` is (name, css class, value of a group), bottom first."""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    totals = [sum((v(g) or 0) for _, _, v in series) for g in buckets]
    top = _nice(max(totals, default=0))
    parts = []
    for i in range(3):  # gridlines at 0, half, top
        y = TOP + plot_h * (1 - i / 2)
        parts.append(f'<line class="grid" x1="{LEFT:.0f}" y1="{y:.1f}" x2="{W - RIGHT:.0f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 6:.0f}" y="{y + 3.5:.1f}" text-anchor="end">{esc(fmt(top * i / 2))}</text>')
    n = max(1, len(buckets))
    slot = plot_w / n
    bw = max(1.0, min(28.0, slot * 0.78))
    for i, g in enumerate(buckets):
        x = LEFT + slot * i + (slot - bw) / 2
        y = TOP + plot_h
        tip = [_bucket_label(g["key"], bucket)]
        bars = []
        for name, cls, value in series:
            v = value(g) or 0
            tip.append(f"{name}: {fmt(v)}")
            if v <= 0:
                continue
            h = plot_h * v / top
            y -= h
            bars.append(f'<rect class="{cls}" x="{x:.2f}" y="{y:.2f}" width="{bw:.2f}" height="{h:.2f}"/>')
        parts.append(f'<g class="bucket" data-key="{esc(g["key"])}"><title>{esc(" · ".join(tip))}</title>'
                     f'<rect class="hit" x="{LEFT + slot * i:.2f}" y="{TOP:.0f}" width="{slot:.2f}" height="{plot_h:.0f}"/>'
                     + "".join(bars) + "</g>")
    if buckets:
        for i in sorted({0, len(buckets) // 2, len(buckets) - 1}):
            x = LEFT + slot * i + slot / 2
            anchor = "start" if i == 0 and len(buckets) > 1 else "end" if i == len(buckets) - 1 and len(buckets) > 1 else "middle"
            parts.append(f'<text class="axis" x="{x:.1f}" y="{H - 8:.0f}" text-anchor="{anchor}">'
                         f"{esc(_bucket_label(buckets[i]['key'], bucket))}</text>")
    else:
        parts.append(f'<text class="axis" x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2:.0f}" '
                     'text-anchor="middle">no executions</text>')
    legend = "".join(f'<span class="key {cls}">{esc(name)}</span>' for name, cls, _ in series)
    return (f'<figure class="chart" data-testid="{esc(testid)}"><figcaption>{esc(title)}'
            f'<span class="legend">{legend}</span></figcaption>'
            f'<svg viewBox="0 0 {W:.0f} {H:.0f}" role="img" aria-label="{esc(title)}">' + "".join(parts)
            + "</svg></figure>")


def _ms(v: Optional[float]) -> str:
    return "–" if v is None else fmt_duration(int(v * 1e6))


def _rate(g: dict) -> str:
    r = g.get("failure_rate")
    return "–" if r is None else f"{r * 100:.1f}%"


def _cost(g: dict) -> str:
    text = fmt_usd(g["cost_usd"])
    if g.get("cost_unknown"):
        text += f' <span class="unknown" title="executions whose cost is unknown: a model not in the price table">' \
                f'+{g["cost_unknown"]:,} unknown</span>'
    return text


def _link(**params) -> str:
    return esc("/?" + urlencode({k: v for k, v in params.items() if v is not None}))


def group_table(title: str, testid: str, stats: dict, param: str) -> str:
    """Executions by intent or by model: counts, failures, durations, tokens, cost."""
    rows = []
    for g in stats["groups"]:
        key = g["key"]
        name = esc(key if key is not None else "(none)")
        link = f'<a href="{_link(**{param: key})}">{name}</a>' if key is not None else name
        failed = (f'<a class="failed-n" href="{_link(**{param: key, "outcome": "failed"})}">{g["failed"]:,}</a>'
                  if g["failed"] and key is not None else f"{g['failed']:,}")
        marked = ' class="has-failed"' if g["failed"] else ""
        rows.append(
            f'<tr data-key="{esc(key or "")}"{marked}>'
            f"<td>{link}</td><td class=\"num\">{g['executions']:,}</td><td class=\"num\">{failed}</td>"
            f'<td class="num">{_rate(g)}</td><td class="num">{_ms(g["p50_ms"])}</td><td class="num">{_ms(g["p95_ms"])}</td>'
            f'<td class="num">{g["input_tokens"]:,} / {g["output_tokens"]:,}</td><td class="num">{_cost(g)}</td></tr>'
        )
    body = "".join(rows) or '<tr><td colspan="8" class="empty-row">none</td></tr>'
    return (
        f'<section class="groups" data-testid="{esc(testid)}"><h2>{esc(title)}</h2><table class="groups"><thead><tr>'
        f"<th>{esc(param.capitalize())}</th><th class=\"num\">Executions</th><th class=\"num\">Failed</th>"
        '<th class="num">Failure rate</th><th class="num">p50</th><th class="num">p95</th>'
        '<th class="num">Tokens in / out</th><th class="num">Cost</th></tr></thead>'
        f"<tbody>{body}</tbody></table></section>"
    )


def overview_page(by_time: dict, by_intent: dict, by_model: dict, params: dict, bucket: str) -> str:
    """The whole page: the figures (the totals every `stats` answer holds), the four charts, the
    two tables."""
    t = by_time["total"]
    cards = [
        ("Executions", f"{t['executions']:,}", f"{t['succeeded']:,} succeeded · {t['incomplete']:,} incomplete · "
                                               f"{t['running']:,} running"),
        ("Failed", f"{t['failed']:,}", f"failure rate {_rate(t)}"),
        ("Duration p95", _ms(t["p95_ms"]), f"p50 {_ms(t['p50_ms'])} · p99 {_ms(t['p99_ms'])}"),
        ("Tokens", f"{t['input_tokens'] + t['output_tokens']:,}", f"{t['input_tokens']:,} in · {t['output_tokens']:,} out"),
        ("Cost", fmt_usd(t["cost_usd"]), f"{t['cost_unknown']:,} with a cost unknown" if t["cost_unknown"] else "every cost known"),
    ]
    figures = "".join(
        f'<div class="card{" bad" if name == "Failed" and t["failed"] else ""}" data-testid="card-{esc(name.lower().split()[0])}">'
        f'<div class="label">{esc(name)}</div><div class="value">{esc(value)}</div><div class="sub">{esc(sub)}</div></div>'
        for name, value, sub in cards
    )
    per = bucket
    buckets = filled(by_time["groups"], bucket)
    charts = "".join([
        bar_chart(f"Executions and failures per {per}", "chart-executions", buckets, bucket, [
            ("failed", "s-failed", lambda g: g["failed"]),
            ("succeeded", "s-ok", lambda g: g["succeeded"]),
            ("incomplete or running", "s-other", lambda g: g["incomplete"] + g["running"]),
        ], fmt_count),
        bar_chart(f"p95 duration per {per}", "chart-p95", buckets, bucket, [
            ("p95", "s-dur", lambda g: g["p95_ms"]),
        ], lambda v: _ms(v) if v else "0"),
        bar_chart(f"Tokens per {per}", "chart-tokens", buckets, bucket, [
            ("input", "s-in", lambda g: g["input_tokens"]),
            ("output", "s-out", lambda g: g["output_tokens"]),
        ], fmt_count),
        bar_chart(f"Cost per {per} (USD)", "chart-cost", buckets, bucket, [
            ("cost", "s-cost", lambda g: g["cost_usd"]),
        ], lambda v: fmt_usd(v) if v else "$0"),
    ])
    since = params.get("since") or ""
    form = (
        '<form class="filters overview-form" method="get" action="/overview">'
        f'<label>Since<input name="since" value="{esc(since)}" placeholder="7d, 24h, ISO (all)"></label>'
        '<label>Per<select name="per">'
        + "".join(f'<option value="{b}"{" selected" if b == bucket else ""}>{b}</option>' for b in BUCKETS)
        + '</select></label><button type="submit">Show</button><a class="clear" href="/overview">All time</a></form>'
    )
    body = (
        '<div class="titlebar"><h1>Overview</h1><span class="sub">'
        + (f"executions created since {esc(since)}" if since else "every execution")
        + " · the same figures as <code>tracedb stats</code></span></div>"
        + form
        + f'<div class="cards">{figures}</div>'
        + f'<div class="charts">{charts}</div>'
        + group_table("By intent", "by-intent", by_intent, "intent")
        + group_table("By model", "by-model", by_model, "model")
    )
    return layout_page("Overview", body, nav="overview")
