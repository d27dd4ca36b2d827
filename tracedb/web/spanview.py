"""The span tree beside the timeline, as inline SVG: one row per span, indented under its parent,
with a bar where it ran on the span tree's own time axis (OTel spans carry their own times, which
the events' recording times do not show). Built from `tracedb.records.spans.span_tree`; every recorded
string goes through `esc`, and numbers are attributes, not styles (the pages' CSP).
"""

from __future__ import annotations

from typing import Optional

from tracedb.records.spans import SpanNode, SpanTree
from tracedb.web.pages import error_words, esc, fmt_duration

# Rows drawn at most: a tree of thousands of spans draws its first ones and says how many more.
MAX_ROWS = 400
WIDTH, NAME_W, ROW_H, INDENT = 1000.0, 330.0, 22.0, 14.0
BAR_X0, BAR_X1 = NAME_W + 10.0, WIDTH - 150.0
CHAR_W = 6.4  # a character of the 11.5px labels, roughly


def _cut(text: str, width: float) -> str:
    n = max(4, int(width / CHAR_W))
    return text if len(text) <= n else text[: n - 1] + "…"


def _tip(n: SpanNode) -> str:
    parts = [f"{n.kind} span {n.name}"]
    if not n.recorded:
        parts.append("not recorded yet (a span is recorded when it ends)")
    else:
        parts.append(f"events #{n.seqs[0]}" + (f"–#{n.seqs[-1]}" if len(n.seqs) > 1 else ""))
    if n.duration_ns is not None:
        parts.append(fmt_duration(n.duration_ns))
    if n.error:
        parts.append(f"error: {error_words(n.error)}")
    parts.append(f"span id {n.span_id}")
    return " · ".join(parts)


def span_tree_svg(tree: Optional[SpanTree]) -> str:
    """The tree under its heading, or "" for an execution without nesting."""
    if tree is None:
        return ""
    rows = tree.walk()
    shown = rows[:MAX_ROWS]
    t0, t1 = tree.start_ns, tree.end_ns
    span = max(1, (t1 - t0)) if t0 is not None and t1 is not None else None

    def X(ns: int) -> float:
        return BAR_X0 + (ns - t0) / span * (BAR_X1 - BAR_X0)

    height = 8 + ROW_H * len(shown) + (ROW_H if len(rows) > len(shown) else 0) + 4
    parts: list[str] = []
    row_of = {n.span_id: i for i, n in enumerate(shown)}
    # Guides from each parent down to its children, under everything else.
    guides = []
    for i, n in enumerate(shown):
        p = row_of.get(n.parent_id) if n.parent_id is not None else None
        if p is None:
            continue
        px = 10 + shown[p].depth * INDENT
        y = 8 + i * ROW_H + ROW_H / 2
        guides.append(f"M{px:.0f} {8 + p * ROW_H + ROW_H - 4:.0f}V{y:.0f}H{px + INDENT - 4:.0f}")
    if guides:
        parts.append(f'<path class="guides" d="{"".join(guides)}"/>')
    for i, n in enumerate(shown):
        y = 8 + i * ROW_H
        x = 6 + n.depth * INDENT
        cls = ["span", f"k-{esc(n.kind)}"]
        if n.error:
            cls.append("err")
        if not n.recorded:
            cls.append("unrecorded")
        href = f"#ev-{n.seqs[0]}" if n.seqs else "#"
        name = n.name if n.recorded else f"{n.name} (not ended yet)"
        parts.append(
            f'<a href="{href}" class="{" ".join(cls)}" data-span="{esc(n.span_id)}" data-depth="{n.depth}">'
            f"<title>{esc(_tip(n))}</title>"
            f'<rect class="hit" x="0" y="{y:.0f}" width="{WIDTH:.0f}" height="{ROW_H:.0f}"/>'
            f'<rect class="dot" x="{x:.0f}" y="{y + 6:.0f}" width="8" height="8" rx="2"/>'
            f'<text class="name" x="{x + 13:.0f}" y="{y + 15:.0f}">{esc(_cut(name, NAME_W - x - 18))}</text>'
        )
        if span is not None and n.start_ns is not None:
            x0 = X(n.start_ns)
            x1 = X(n.end_ns) if n.end_ns is not None else x0
            w = max(2.0, x1 - x0)
            parts.append(f'<rect class="bar" x="{x0:.2f}" y="{y + 4:.0f}" width="{w:.2f}" height="{ROW_H - 8:.0f}" rx="2"/>')
            label = fmt_duration(n.duration_ns) if n.duration_ns is not None else ""
            if n.error:
                label = f"{label} · {error_words(n.error, 80)}" if label else error_words(n.error, 80)
            if label:
                parts.append(f'<text class="dur" x="{x0 + w + 5:.2f}" y="{y + 15:.0f}">'
                             f"{esc(_cut(label, WIDTH - x0 - w - 8))}</text>")
        parts.append("</a>")
    if len(rows) > len(shown):
        y = 8 + ROW_H * len(shown)
        parts.append(f'<text class="more" x="6" y="{y + 15:.0f}">and {len(rows) - len(shown):,} more spans: '
                     "their events are in the table below</text>")
    return (
        f'<h2>Spans <span class="sub">{len(rows):,}, nested as they ran; click one for its events</span></h2>'
        f'<svg class="spantree" data-testid="span-tree" data-spans="{len(rows)}" '
        f'viewBox="0 0 {WIDTH:.0f} {height:.0f}" role="img" aria-label="span tree">' + "".join(parts) + "</svg>"
    )
