"""The web view's HTML, rendered on the server from the read API's results.

Plain Python string building: every recorded string (intents, ids, event types, payloads, notes)
goes through `esc` (html.escape, quotes too) before it reaches the page, and the pages carry no
inline script or style (the Content-Security-Policy forbids both), so a recorded `<script>` is
text. Numbers for the SVG timeline are attributes, not styles, for the same reason.
"""

from __future__ import annotations

import html
from typing import Iterable, Optional
from urllib.parse import quote, urlencode

import orjson

from tracedb.humanize import format_duration
from tracedb.records.outcomes import FAILED, OUTCOMES
from tracedb.program import program
from tracedb.reads.reader import Lineage, Page, Timeline
from tracedb.records.record import (
    REASON_EXECUTION_INCOMPLETE,
    REASON_MANUALLY_INVALIDATED,
    REASON_RECORD_CORRUPTED,
    REASON_RECORDING_FAILURE,
    STATUS_RUNNING,
    STATUSES,
    lost_records,
    utc_iso,
)
from tracedb.web.timeline import LLM, TOOL, Layout

# Event rows rendered per request; more come with "show more" (a 10,000-event execution's page
# stays quick to paint).
ROWS_PER_PAGE = 200
PREVIEW_CHARS = 160
# Past this many calls the timeline draws merged runs of bars instead of one link per call.
DENSE_BARS = 400


def esc(value) -> str:
    """`value` as text safe inside HTML elements and quoted attributes."""
    return html.escape("" if value is None else str(value), quote=True)


def fmt_duration(ns: Optional[int]) -> str:
    """A duration as the CLI prints it (humanize.format_duration); '–' for none."""
    return format_duration(ns, none="–")


def fmt_time(ns: int) -> str:
    """Creation time as 2026-11-25 00:32:48.123Z."""
    return utc_iso(ns, timespec="milliseconds").replace("T", " ")


def fmt_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1 << 20):.1f} MiB"


def replay_words(status: str, replayable: bool, reason: Optional[str], note: Optional[str] = None) -> str:
    """Why an execution can or cannot be replayed, in words."""
    if replayable:
        return "Replayable: tracedb returns its recorded final response without calling the agent or the model."
    if status == STATUS_RUNNING and reason is None:
        return "Not replayable yet: it is still running, and has no final response."
    words = {
        REASON_EXECUTION_INCOMPLETE: "Not replayable: the execution never finished (the agent or the recorder "
        "stopped before its final response). Every event up to that point is kept; tracedb does not retry it.",
        REASON_RECORDING_FAILURE: "Not replayable: recording failed part-way, so the record may miss events.",
        REASON_MANUALLY_INVALIDATED: "Not replayable: an operator invalidated it.",
        REASON_RECORD_CORRUPTED: "Not replayable: the stored record failed verification.",
    }.get(reason or "", f"Not replayable ({reason or 'no reason recorded'}).")
    lost = lost_records(note) if reason == REASON_RECORDING_FAILURE else None
    if lost is not None:
        return (f"Not replayable: recording failed part-way: {lost.words()}, while the recorder was "
                "unreachable and the agent's client failed open. The record misses them.")
    if note:
        words += f" Note: {note}"
    return words


def error_words(err: Optional[dict], limit: int = 200) -> str:
    """An error ({code, message}, as tracedb.records.outcomes gives it) in words: "CODE: message"."""
    if not err:
        return ""
    code, message = err.get("code"), err.get("message")
    text = f"{code}: {message}" if code and message else str(code or message or "error")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def outcome_badge(outcome: Optional[str]) -> str:
    """What an execution came to: succeeded, failed, incomplete, running ("–": not derived)."""
    if not outcome:
        return '<span class="badge oc-none">–</span>'
    return f'<span class="badge oc-{esc(outcome)}">{esc(outcome)}</span>'


def fmt_models(models) -> str:
    """The models an execution called: the first, and how many more."""
    models = list(models or ())
    if not models:
        return "–"
    return models[0] + (f" +{len(models) - 1}" if len(models) > 1 else "")


def fmt_tokens(input_tokens: Optional[int], output_tokens: Optional[int]) -> str:
    """Input / output tokens: 1,200 / 80; '–' when it called no model."""
    if not input_tokens and not output_tokens:
        return "–"
    return f"{input_tokens or 0:,} / {output_tokens or 0:,}"


def fmt_usd(cost: float) -> str:
    """A cost in USD, to four significant places under a dollar: $0.0012, $1.25."""
    if cost == 0:
        return "$0"
    if cost < 1:
        return f"${cost:.4g}" if cost >= 1e-6 else "<$0.000001"
    return f"${cost:,.2f}"


def fmt_cost(cost: Optional[float], input_tokens: Optional[int] = None, output_tokens: Optional[int] = None) -> str:
    """The cost cell (HTML): the price, '–' for no tokens, "unknown" when the price table does not
    know a model it called (never a guess)."""
    if cost is None:
        return ('<span class="unknown" title="a model it called is not in the price table: '
                'its tokens are counted, its cost is not guessed">unknown</span>')
    if cost == 0 and not input_tokens and not output_tokens:
        return "–"
    return esc(fmt_usd(cost))


def status_badge(status: str) -> str:
    return f'<span class="badge st-{esc(status)}">{esc(status)}</span>'


def replay_badge(replayable: bool, reason: Optional[str], status: Optional[str] = None) -> str:
    if replayable:
        return '<span class="badge rp-yes">replayable</span>'
    if status == STATUS_RUNNING and reason is None:
        return '<span class="badge rp-wait">recording</span>'
    return f'<span class="badge rp-no" title="{esc(reason or "")}">{esc(reason or "not replayable")}</span>'


def copy_button(text: str, label: str = "Copy") -> str:
    return f'<button type="button" class="copy" data-copy="{esc(text)}">{esc(label)}</button>'


def exec_path(execution_id: str) -> str:
    """The path of an execution's page: the id percent-encoded, since an id may hold any
    printable character, "/", "?" and "#" included."""
    return "/e/" + quote(execution_id, safe="")


def api_path(what: str, execution_id: str, **params) -> str:
    """The path of one of an execution's fragments (/api/event, rows, live, overview): the id
    goes in the query string, where no character of it can be mistaken for the path's."""
    return f"/api/{what}?" + urlencode({"id": execution_id, **params})


def _short_id(execution_id: str) -> str:
    return execution_id if len(execution_id) <= 18 else execution_id[:17] + "…"


def exec_link(execution_id: str, text: Optional[str] = None) -> str:
    return f'<a class="mono" href="{esc(exec_path(execution_id))}">{esc(text or execution_id)}</a>'


def layout_page(title: str, body: str, *, nav: str = "", live: bool = False) -> str:
    """A whole HTML page: the top bar, then `body`."""
    def tab(name: str, href: str, text: str) -> str:
        cls = ' class="on"' if nav == name else ""
        return f'<a{cls} href="{href}">{text}</a>'

    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · tracedb</title>"
        '<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/app.css">'
        '<script src="/static/app.js" defer></script>'
        "</head><body>"
        '<header class="top"><a class="brand" href="/">tracedb</a><nav>'
        + tab("executions", "/", "Executions")
        + tab("overview", "/overview", "Overview")
        + tab("diff", "/diff", "Diff")
        + "</nav></header>"
        + ('<main data-live="1">' if live else "<main>") + body + "</main>"
        + "</body></html>\n"
    )


def error_page(status: int, message: str, hint: Optional[str] = None) -> str:
    """The page of a 400, 401, 404, 405 or 5xx: what went wrong and what to do."""
    titles = {400: "Bad request", 401: "Token needed", 404: "Not found", 405: "Read-only", 503: "Unavailable"}
    title = titles.get(status, "Error")
    body = (
        f'<section class="error" data-status="{status}"><h1>{status} · {esc(title)}</h1>'
        f'<p class="message">{esc(message)}</p>'
        + (f'<p class="hint">{esc(hint)}</p>' if hint else "")
        + '<p><a href="/">All executions</a></p></section>'
    )
    return layout_page(title, body)


# -- the list of executions ----------------------------------------------------------------

# The list's filters: any of them set, an empty page says "no match", not "nothing recorded".
FILTERS = ("status", "replayable", "intent", "q", "since", "until", "outcome", "model", "error", "min_cost",
           "slower_than")


def _query(params: dict, **changes) -> str:
    merged = {k: v for k, v in {**params, **changes}.items() if v not in (None, "")}
    return "/?" + urlencode(merged) if merged else "/"


def fmt_count(n: int, limit: int) -> str:
    """A count as shown: 1,234, or 10,000+ past the limit it was counted to."""
    return f"{limit:,}+" if n > limit else f"{n:,}"


def list_page(page: Page, params: dict, *, first_page: bool) -> str:
    """Executions newest first, the filters, the counts per status (filled in by the script
    from /counts) and the pager."""
    p = {k: v for k, v in params.items() if k not in ("before",)}

    def options(name: str, choices: Iterable[tuple[str, str]]) -> str:
        current = params.get(name) or ""
        return "".join(
            f'<option value="{esc(v)}"{" selected" if v == current else ""}>{esc(text)}</option>' for v, text in choices
        )

    form = (
        '<form class="filters" method="get" action="/">'
        '<label>Status<select name="status">'
        + options("status", [("", "any")] + [(s, s) for s in STATUSES])
        + "</select></label>"
        '<label>Replay<select name="replayable">'
        + options("replayable", [("", "any"), ("yes", "replayable"), ("no", "not replayable")])
        + "</select></label>"
        f'<label>Intent<input name="intent" value="{esc(params.get("intent"))}" placeholder="exact intent"></label>'
        f'<label class="grow">Search<input name="q" value="{esc(params.get("q"))}" placeholder="text in the intent"></label>'
        f'<label>Since<input name="since" value="{esc(params.get("since"))}" placeholder="2h, 7d, ISO"></label>'
        f'<label>Until<input name="until" value="{esc(params.get("until"))}" placeholder="ISO time"></label>'
        '<label>Outcome<select name="outcome">'
        + options("outcome", [("", "any")] + [(o, o) for o in OUTCOMES])
        + "</select></label>"
        f'<label>Model<input name="model" value="{esc(params.get("model"))}" placeholder="gpt-4o-mini"></label>'
        f'<label>Error<input name="error" value="{esc(params.get("error"))}" placeholder="error code"></label>'
        f'<label>Min cost<input name="min_cost" value="{esc(params.get("min_cost"))}" placeholder="USD, 0.01"></label>'
        f'<label>Slower than<input name="slower_than" value="{esc(params.get("slower_than"))}" placeholder="2s, 500ms"></label>'
        + (f'<input type="hidden" name="limit" value="{esc(params["limit"])}">' if params.get("limit") else "")
        + '<button type="submit">Filter</button><a class="clear" href="/">Clear</a></form>'
    )
    chips = [
        f'<a class="chip{" on" if not params.get("status") else ""}" data-status="all" href="{esc(_query(p, status=None))}">'
        'all <b class="n">…</b></a>'
    ]
    for s in STATUSES:
        on = " on" if params.get("status") == s else ""
        chips.append(
            f'<a class="chip st-{s}{on}" data-status="{s}" href="{esc(_query(p, status=s))}">'
            f'{s} <b class="n">…</b></a>'
        )
    counts_src = "/counts" + _query(p)[1:] if _query(p) != "/" else "/counts"
    rows = []
    for r in page.items:
        marked = ' class="failed"' if r.outcome == FAILED else ""
        error = ""
        if r.error:
            # A failed call the execution got past (it succeeded) is shown softer than a failure.
            soft = "" if r.outcome == FAILED else " soft"
            error = (f'<a class="err-msg{soft}" data-testid="list-error" '
                     f'href="{esc(exec_path(r.execution_id))}#ev-{esc(r.error.get("seq"))}" '
                     f'title="first error, at #{esc(r.error.get("seq"))} {esc(r.error.get("type"))}">'
                     f"{esc(error_words(r.error, 140))}</a>")
        rows.append(
            f'<tr data-id="{esc(r.execution_id)}" data-outcome="{esc(r.outcome or "")}"{marked}>'
            f'<td class="id" title="{esc(r.execution_id)}">{exec_link(r.execution_id, _short_id(r.execution_id))}'
            + (f'<div class="fork">fork of {exec_link(r.parent_execution_id, _short_id(r.parent_execution_id))}</div>'
               if r.parent_execution_id else "")
            + "</td>"
            f'<td class="when">{esc(fmt_time(r.created_at_ns)[:10])}<br>{esc(fmt_time(r.created_at_ns)[11:19])}</td>'
            f'<td class="intent">{esc(r.intent or "")}{error}</td>'
            f"<td>{outcome_badge(r.outcome)}</td>"
            f'<td><div class="state">{status_badge(r.status)} {replay_badge(r.replayable, r.replayable_reason, r.status)}</div></td>'
            f'<td class="model">{esc(fmt_models(r.models))}</td>'
            f'<td class="num" title="input / output tokens">{esc(fmt_tokens(r.input_tokens, r.output_tokens))}</td>'
            f'<td class="num">{fmt_cost(r.cost_usd, r.input_tokens, r.output_tokens)}</td>'
            f'<td class="num">{r.last_seq}</td>'
            f'<td class="num">{esc(fmt_duration(r.duration_ns))}</td>'
            "</tr>"
        )
    if rows:
        table = (
            '<div class="table-wrap"><table class="executions"><thead><tr><th>Execution</th><th>Created (UTC)</th><th>Intent</th>'
            "<th>Outcome</th><th>Status · replay</th><th>Model</th><th class=\"num\">Tokens</th>"
            "<th class=\"num\">Cost</th><th class=\"num\">Events</th><th class=\"num\">Duration</th>"
            "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>"
        )
    elif first_page and not any(params.get(k) for k in FILTERS):
        table = (
            '<div class="empty"><p>No executions recorded yet.</p>'
            f"<p>Record a few with <code>{esc(program())} demo</code> (next to a running "
            f"<code>{esc(program())} serve</code>), then reload.</p></div>"
        )
    else:
        table = '<div class="empty"><p>No execution matches these filters.</p></div>'
    pager = ['<nav class="pager">']
    if not first_page:
        pager.append(f'<a href="{esc(_query(p))}">« Newest</a>')
    if page.next_cursor:
        pager.append(f'<a class="older" href="{esc(_query(p, before=page.next_cursor))}">Older »</a>')
    pager.append('<span class="total"><b class="n">…</b> matching</span></nav>')
    body = (
        '<div class="titlebar"><h1>Executions</h1><span class="sub">newest first</span></div>'
        + form
        + f'<div class="counts" data-src="{esc(counts_src)}">' + "".join(chips) + "</div>"
        + table
        + "".join(pager)
    )
    return layout_page("Executions", body, nav="executions")


# -- one execution ---------------------------------------------------------------------------


def _preview(payload) -> str:
    text = orjson.dumps(payload).decode() if payload is not None else "null"
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _kind_class(type_: str) -> str:
    if type_.startswith("llm."):
        return "k-llm"
    if type_.startswith("tool."):
        return "k-tool"
    if type_ == "FINAL_RESPONSE":
        return "k-final"
    if type_.isupper():
        return "k-router"
    return "k-other"


def event_rows(
    tl: Timeline, lay: Layout, *, after_seq: int = 0, limit: int = ROWS_PER_PAGE, also: frozenset = frozenset()
) -> tuple[str, int]:
    """The table rows of events after `after_seq` (up to `limit`), and the last seq rendered;
    with the rows of the seqs in `also` (earlier rows whose call got its answer since)."""
    times = {t.seq: t for t in tl.event_times}
    out = []
    last = after_seq
    stopped = lay.stopped_at.seq if lay.stopped_at is not None else None
    eid = tl.record.execution_id
    for e in tl.record.events:
        if e.seq <= after_seq and e.seq not in also:
            continue
        if len(out) >= limit:
            break
        t = times.get(e.seq)
        at = t.recorded_at_ns if t else lay.t0
        bar = lay.call_of_seq.get(e.seq)
        call = ""
        if bar is not None and bar.request_seq == e.seq:
            if bar.response_seq is None:
                call = '<span class="open">no response</span>'
            else:
                call = (f'<a href="#ev-{bar.response_seq}">→ #{bar.response_seq}</a> '
                        f'<span class="dur">{esc(fmt_duration(bar.duration_ns))}</span>')
        elif bar is not None:
            call = f'<a href="#ev-{bar.request_seq}">← #{bar.request_seq}</a>'
        size = len(orjson.dumps(e.payload))
        cls = ["ev"]
        err = lay.errors.get(e.seq)
        if err is not None:
            cls.append("err")
        if e.seq == stopped:
            cls.append("stopped")
            call += '<span class="stop-tag" data-testid="stopped-row">stopped here</span>'
        out.append(
            f'<tr id="ev-{e.seq}" class="{" ".join(cls)}" data-seq="{e.seq}" data-size="{size}" '
            f'data-src="{esc(api_path("event", eid, seq=e.seq))}">'
            f'<td class="num seq">{e.seq}</td>'
            f'<td class="num off">+{esc(fmt_duration(max(0, at - lay.t0)))}</td>'
            f'<td class="type"><span class="etype {_kind_class(e.type)}">{esc(e.type)}</span></td>'
            f'<td class="call">{call}</td>'
            f'<td class="preview">'
            + (f'<span class="err-msg" data-testid="event-error">{esc(error_words(err, 120))}</span>' if err else "")
            + f'<code>{esc(_preview(e.payload))}</code>'
            f'<span class="size">{esc(fmt_size(size))}</span></td></tr>'
        )
        last = max(last, e.seq)
    return "".join(out), last


def overview_svg(lay: Layout, *, running: bool) -> str:
    """The timeline: an axis, a lane per kind of call (bars), every event as a tick, and where an
    execution that will not go on stopped."""
    W, LEFT, RIGHT = 1000.0, 78.0, 8.0
    plot = W - LEFT - RIGHT
    lane_h, gap = 20.0, 6.0
    y = 28.0
    parts: list[str] = []
    rows: list[tuple[str, float]] = []

    def X(ns: int) -> float:
        return LEFT + lay.x(ns, plot)

    bar_y: dict[tuple[str, int], float] = {}
    for kind, name in ((LLM, "LLM calls"), (TOOL, "tool calls")):
        for lane in range(lay.lanes.get(kind, 0)):
            rows.append((name if lane == 0 else "", y))
            bar_y[(kind, lane)] = y
            y += lane_h + gap
    events_y = y
    rows.append(("events", y))
    y += lane_h + gap
    if lay.stopped_at is not None:
        y += 16  # the stop marker's label goes under the lanes
    height = y + 4
    # Axis with five labels.
    span = lay.t1 - lay.t0
    for i in range(5):
        x = LEFT + plot * i / 4
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="18" x2="{x:.1f}" y2="{height - 4:.1f}"/>')
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        parts.append(f'<text class="axis" x="{x:.1f}" y="12" text-anchor="{anchor}">+{esc(fmt_duration(span * i // 4))}</text>')
    for name, ry in rows:
        if name:
            parts.append(f'<text class="lane" x="4" y="{ry + 14:.1f}">{esc(name)}</text>')
    few = len(lay.bars) <= 40
    dense = len(lay.bars) > DENSE_BARS
    spans: dict[tuple, list] = {}  # (kind, lane) -> merged [x0, x1] of a dense timeline
    # What each lane already shows, [x0, x1]: a label beside a bar goes only where it hides nothing.
    taken: dict[float, list] = {}
    if few:
        for b in lay.bars:
            x0 = X(b.start_ns)
            taken.setdefault(bar_y.get((b.kind, b.lane), events_y), []).append(
                (x0, x0 + max(2.0, X(b.end_ns if b.end_ns is not None else lay.t1) - x0)))

    def free(ry: float, a: float, z: float, own: tuple) -> bool:
        return LEFT <= a and z <= W and all(r == own or z <= r[0] or a >= r[1] for r in taken.get(ry, ()))

    for b in lay.bars:
        ry = bar_y.get((b.kind, b.lane), events_y)
        if dense and b.end_ns is not None:
            # Thousands of calls: draw what a pixel can show, runs of bars merged into one rect.
            x0, x1 = X(b.start_ns), max(X(b.end_ns), X(b.start_ns) + 0.5)
            runs = spans.setdefault((b.kind, ry), [])
            if runs and x0 - runs[-1][1] < 0.5:
                runs[-1][1] = max(runs[-1][1], x1)
            else:
                runs.append([x0, x1])
            continue
        x0 = X(b.start_ns)
        x1 = X(b.end_ns if b.end_ns is not None else lay.t1)
        w = max(2.0, x1 - x0)
        open_ = b.end_ns is None
        label = f"{b.label} · {fmt_duration(b.duration_ns)}" if not open_ else f"{b.label} · no response"
        tip = (f"#{b.request_seq} {b.kind} call {b.label}: "
               + (f"answered by #{b.response_seq} after {fmt_duration(b.duration_ns)}" if not open_ else "never answered"))
        cls = f"bar {b.kind}" + (" open" if open_ else "") + (" err" if b.error else "")
        if b.error:
            label = f"{b.label} · {error_words(b.error, 60)}"
            tip += f", with an error: {error_words(b.error)}"
        parts.append(
            f'<a href="#ev-{b.request_seq}"><rect class="{cls}" data-seq="{b.request_seq}" '
            f'x="{x0:.2f}" y="{ry:.1f}" width="{w:.2f}" height="{lane_h:.0f}" rx="3"><title>{esc(tip)}</title></rect>'
        )
        need = 12 + 6.2 * len(label)
        text_cls = "barlabel" + (" err" if b.error else "")
        if w > need:
            parts.append(f'<text class="{text_cls}" x="{x0 + 4:.2f}" y="{ry + 14:.1f}">{esc(label)}</text>')
        elif few:  # beside the bar, where there is room: the whole label, else a shorter one
            own = (x0, x0 + w)
            labels = [label] + ([f"{b.label} · {b.error.get('code') or 'error'}"] if b.error else [])
            for text in labels:
                need = 6.2 * len(text) + 8
                if free(ry, x0 + w, x0 + w + need, own):
                    parts.append(f'<text class="{text_cls} out" x="{x0 + w + 4:.2f}" y="{ry + 14:.1f}">{esc(text)}</text>')
                    taken[ry].append((x0 + w, x0 + w + need))
                    break
                if free(ry, x0 - need, x0, own):
                    parts.append(f'<text class="{text_cls} out" x="{x0 - 4:.2f}" y="{ry + 14:.1f}" '
                                 f'text-anchor="end">{esc(text)}</text>')
                    taken[ry].append((x0 - need, x0))
                    break
        parts.append("</a>")
    for (kind, ry), runs in spans.items():
        parts.append(f'<path class="bar {kind} dense" d="'
                     + "".join(f"M{x0:.1f} {ry:g}h{x1 - x0:.1f}v{lane_h:g}h{x0 - x1:.1f}z" for x0, x1 in runs)
                     + f'"><title>{len(lay.bars):,} calls: open an event row for each</title></path>')
    # Every event as a tick, in one path: cheap however many there are.
    # One tick per distinct position (half a unit, under a pixel): 10,000 events stay a short path.
    xs = sorted({round(X(t.at_ns) * 2) / 2 for t in lay.ticks})
    path = "".join(f"M{x:g} {events_y + 3:g}v{lane_h - 6:g}" for x in xs)
    if path:
        parts.append(f'<path class="ticks" d="{path}"/>')
    for t in lay.ticks:
        if t.type == "FINAL_RESPONSE":
            err = lay.errors.get(t.seq)
            parts.append(
                f'<circle class="final{" err" if err else ""}" cx="{X(t.at_ns):.2f}" cy="{events_y + lane_h / 2:.1f}" r="5">'
                f"<title>#{t.seq} FINAL_RESPONSE{esc(': failed: ' + error_words(err)) if err else ''}</title></circle>"
            )
    if lay.stopped_at is not None:
        sx = X(lay.stopped_at.at_ns)
        label = f"stopped after #{lay.stopped_at.seq} {lay.stopped_at.type}"
        anchor = "end" if sx > LEFT + plot / 2 else "start"
        dx = -6 if anchor == "end" else 6
        parts.append(
            f'<g class="stopped-marker" data-testid="stopped-marker" data-seq="{lay.stopped_at.seq}">'
            f'<line x1="{sx:.2f}" y1="18" x2="{sx:.2f}" y2="{height - 2:.1f}"/>'
            f'<text x="{sx + dx:.2f}" y="{height - 6:.1f}" text-anchor="{anchor}">{esc(label)}</text></g>'
        )
    if running:
        parts.append(
            f'<text class="live" x="{W - RIGHT:.1f}" y="{height - 2:.1f}" text-anchor="end">live: new events appear here</text>'
        )
    return (
        f'<svg class="timeline" data-testid="timeline" viewBox="0 0 {W:.0f} {height:.0f}" '
        f'role="img" aria-label="timeline of events">' + "".join(parts) + "</svg>"
    )


def execution_page(tl: Timeline, lay: Layout, lineage: Lineage, *, replay_command: str, spans: str = "") -> str:
    """Header, replay state, lineage, timeline (and the span tree, `spans`, drawn beside it),
    events, payload viewer."""
    r = tl.record
    eid = r.execution_id
    running = r.status == STATUS_RUNNING
    last_at = lay.ticks[-1].at_ns if lay.ticks else None
    duration = None if (running or last_at is None) else max(0, last_at - lay.t0)
    meta = [
        ("Execution", f'<span class="mono">{esc(eid)}</span> {copy_button(eid)}'),
        ("Created", esc(fmt_time(lay.t0))),
        ("Duration", esc(fmt_duration(duration)) + (" (running)" if running else "")),
        ("Events", f'<span class="n-events">{len(r.events)}</span>'),
        ("Envelope hash", f'<span class="mono small">{esc(r.header.envelopeHash)}</span>'),
        ("Pinned", "yes (never pruned)" if tl.pinned else "no"),
    ]
    oc = tl.outcome or {}
    if oc.get("outcome"):
        meta[2:2] = [
            ("Models", f'<span class="mono">{esc(", ".join(oc.get("models") or ()) or "–")}</span>'),
            ("Tokens in / out", esc(fmt_tokens(oc.get("input_tokens"), oc.get("output_tokens")))),
            ("Cost", fmt_cost(oc.get("cost_usd"), oc.get("input_tokens"), oc.get("output_tokens"))),
        ]
    if r.parentExecutionId:
        meta.append(("Fork of", f"{exec_link(r.parentExecutionId)} at seq {esc(r.forkedAtSeq)}"))
    dl = "".join(f'<div class="kv"><dt>{k}</dt><dd>{v}</dd></div>' for k, v in meta)
    words = replay_words(r.status, r.header.replayable, r.header.replayableReason, tl.status_note)
    if r.header.replayable:
        cmd = f"{replay_command} {eid}"
        replay = (
            f'<section class="replay ok" data-testid="replay"><p>{esc(words)}</p>'
            f'<div class="cmd"><code>{esc(cmd)}</code>{copy_button(cmd)}</div></section>'
        )
    else:
        replay = f'<section class="replay no" data-testid="replay"><p>{esc(words)}</p></section>'
    # Lineage: where it came from, and what was forked from it.
    lin = []
    for parent, seq in lineage.ancestors:
        lin.append(f'<li class="parent">forked from {exec_link(parent)} at seq {esc(seq)} · '
                   f'<a href="/diff?{esc(urlencode({"a": parent, "b": eid}))}">diff</a></li>')
    for child, seq in lineage.forks:
        lin.append(f'<li class="child">fork {exec_link(child)} made at seq {esc(seq)} · '
                   f'<a href="/diff?{esc(urlencode({"a": eid, "b": child}))}">diff</a></li>')
    lineage_html = (
        '<section class="lineage" data-testid="lineage"><h2>Lineage</h2><ul>' + "".join(lin) + "</ul></section>"
        if lin else ""
    )
    rows, last = event_rows(tl, lay)
    more = ""
    if r.events and last < r.events[-1].seq:
        more = (f'<button type="button" class="more" data-after="{last}" '
                f'data-src="{esc(api_path("rows", eid))}">Show more events</button>')
    final = ""
    if r.finalResponse is not None:
        final = (
            '<section class="final"><h2>Final response</h2>'
            f'<pre class="json">{esc(orjson.dumps(r.finalResponse, option=orjson.OPT_INDENT_2).decode())}</pre></section>'
        )
    failure = ""
    err = oc.get("error")
    if err:
        failed = oc.get("outcome") == FAILED
        where = f'<a href="#ev-{esc(err.get("seq"))}">#{esc(err.get("seq"))} {esc(err.get("type"))}</a>'
        failure = (
            f'<section class="failure{"" if failed else " soft"}" data-testid="failure"><p>'
            + ("Failed: " if failed else "A call failed, and the execution went on: ")
            + f'<b class="err-msg">{esc(error_words(err))}</b> at {where}.</p></section>'
        )
    body = (
        f'<div class="titlebar"><h1 class="intent">{esc(r.intent or "(no intent)")}</h1>'
        # The outcome where it says more than the status (succeeded or failed, not "incomplete" twice).
        + (outcome_badge(oc["outcome"]) if oc.get("outcome") and oc["outcome"] != r.status else "")
        + f'<span class="status-now">{status_badge(r.status)}</span>'
        f"{replay_badge(r.header.replayable, r.header.replayableReason, r.status)}</div>"
        f'<dl class="meta">{dl}</dl>'
        + failure
        + replay
        + lineage_html
        + f'<section class="tl"><h2>Timeline</h2><div class="overview" data-src="{esc(api_path("overview", eid))}">'
        + overview_svg(lay, running=running)
        + "</div>"
        + f'<div class="spans">{spans}</div>'
        + "</section>"
        + '<section class="events"><h2>Events <span class="sub">click a row for its payload</span></h2>'
        '<table class="events"><thead><tr><th class="num">#</th><th class="num">At</th><th>Type</th>'
        '<th>Call</th><th>Payload</th></tr></thead>'
        f'<tbody id="event-rows">{rows}</tbody></table>{more}</section>'
        + final
        + f'<form class="compare" method="get" action="/diff"><input type="hidden" name="a" value="{esc(eid)}">'
        '<label>Compare with<input name="b" placeholder="another execution id or prefix" required></label>'
        '<button type="submit">Diff</button></form>'
    )
    attrs = (f'<div id="execution" data-id="{esc(eid)}" data-status="{esc(r.status)}" '
             f'data-last-seq="{r.events[-1].seq if r.events else 0}" data-live-src="{esc(api_path("live", eid))}">')
    return layout_page(r.intent or eid, attrs + body + "</div>", live=running)


# -- diff ------------------------------------------------------------------------------------


def diff_form(a: str = "", b: str = "", message: Optional[str] = None) -> str:
    return (
        '<form class="filters diffform" method="get" action="/diff">'
        f'<label class="grow">A<input name="a" value="{esc(a)}" placeholder="execution id or prefix"></label>'
        f'<label class="grow">B<input name="b" value="{esc(b)}" placeholder="execution id or prefix"></label>'
        '<button type="submit">Diff</button></form>'
        + (f'<p class="message">{esc(message)}</p>' if message else "")
    )


def _cell(entry: Optional[dict]) -> str:
    if entry is None:
        return '<td class="absent">—</td>'
    head = []
    if "seq" in entry:
        head.append(f'<span class="num">#{esc(entry["seq"])}</span>')
    if "type" in entry:
        head.append(f'<span class="etype {_kind_class(str(entry["type"]))}">{esc(entry["type"])}</span>')
    if "skill" in entry:
        head.append(f'<span class="etype k-tool">{esc(entry["skill"])}</span>')
    lines = []
    for k, v in entry.items():
        if k in ("seq", "type", "skill") or v is None:
            continue
        text = v if isinstance(v, str) else orjson.dumps(v).decode()
        if len(text) > 400:
            text = text[:399] + "…"
        lines.append(f'<div class="kvline"><span class="k">{esc(k)}</span> <code>{esc(text)}</code></div>')
    return f'<td>{" ".join(head)}{"".join(lines)}</td>'


def diff_page(d, a_status: str, b_status: str) -> str:
    """Two executions side by side up to their first divergent step (as `tracedb trace diff`)."""
    if d.identical:
        verdict = f'<p class="verdict same" data-testid="verdict">Identical: {d.a_total} {esc(d.unit)}s each, the same.</p>'
    else:
        verdict = (f'<p class="verdict differs" data-testid="verdict" data-step="{d.divergence_step}">'
                   f'First divergence: {esc(d.divergence_reason)}</p>')
    rows = []
    for row in d.rows:
        cls = "same" if row.same else "diverge"
        rows.append(
            f'<tr class="{cls}" data-step="{row.step}"><td class="num">{row.step}</td>{_cell(row.a)}{_cell(row.b)}'
            f'<td class="why">{"" if row.same else esc(row.reason or "")}</td></tr>'
        )
    body = (
        '<div class="titlebar"><h1>Diff</h1><span class="sub">the same answer as <code>tracedb trace diff</code></span></div>'
        + diff_form(d.a_id, d.b_id)
        + verdict
        + '<table class="diff"><thead><tr><th class="num">' + esc(d.unit) + "</th>"
        f"<th>A · {exec_link(d.a_id)} {status_badge(a_status)} <span class=\"sub\">{d.a_total} {esc(d.unit)}s</span></th>"
        f"<th>B · {exec_link(d.b_id)} {status_badge(b_status)} <span class=\"sub\">{d.b_total} {esc(d.unit)}s</span></th>"
        "<th></th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )
    return layout_page("Diff", body, nav="diff")


def diff_start_page(a: str = "", b: str = "") -> str:
    body = (
        '<div class="titlebar"><h1>Diff</h1><span class="sub">two executions side by side, up to their first divergent step</span></div>'
        + diff_form(a, b)
    )
    return layout_page("Diff", body, nav="diff")
