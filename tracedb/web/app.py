"""The web view as a Starlette application over the asyncio read API.

`create_app(reader)` serves, read-only (GET and HEAD only):

    /                       executions newest first: filters, keyset pages
    /counts                 executions per status under the same filters (the list loads them)
    /overview?since=&per=   the aggregates of `tracedb stats`: per day or hour, by intent and model
    /e/{id}                 one execution (a unique prefix redirects to the whole id)
    /api/event?id=&seq=     one event's payload as JSON (the payload viewer loads it on demand)
    /api/rows?id=&after=N   more event rows, as HTML in JSON
    /api/live?id=&after=N   what a running execution recorded since seq N (the page polls it)
    /api/overview?id=       the timeline alone, as SVG
    /diff?a=ID&b=ID         two executions side by side, the first divergent step highlighted
    /static/...             the stylesheet and the script, shipped in the package

Every read goes through `tracedb.reads.reader.AsyncReader` (aiosqlite or psycopg's async mode), so the
event loop never waits on the database. `tracedb ui` runs it alone; `tracedb serve --http-port`
adds `/metrics` and `/health` to the same server.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import os
import re
from datetime import datetime, timezone
from typing import Iterable, Optional, Sequence
from urllib.parse import parse_qsl, unquote_to_bytes, urlencode

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from tracedb.sidecar.asgi import AUTHENTICATED, HostCheck, bearer_token
from tracedb.config import parse_duration_s
from tracedb.errors import (
    AmbiguousExecutionIdError,
    DatabaseUnavailableError,
    ExecutionNotFoundError,
    InvalidInputError,
    TraceDBError,
)
from tracedb.records.outcomes import OUTCOMES
from tracedb.reads.paging import DEFAULT_PAGE_SIZE, decode_cursor
from tracedb.reads.reader import NS_MAX, NS_MIN, AsyncReader, Filter, Timeline, to_ns
from tracedb.records.record import STATUS_RUNNING, STATUSES, utc_iso
from tracedb.records.spans import span_tree
from tracedb.records.validation import ID_LENGTH, INTENT_LENGTH
from tracedb.web import overview, pages
from tracedb.web.spanview import span_tree_svg
from tracedb.web.timeline import layout

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
MAX_PAGE_SIZE = 500
# Counts per status stop past this many: an exact count reads every matching row.
COUNT_LIMIT = 10_000
TOKEN_COOKIE = "tracedb_token"
# No inline script or style anywhere: a recorded string that slipped through escaping still
# could not run.
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     b"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


class BadRequest(Exception):
    """A malformed query parameter: a 400 page with the message and a hint."""

    def __init__(self, message: str, hint: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers={"cache-control": "no-store"})


def _json(value, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json",
                    headers={"cache-control": "no-store"})


_TIME_HINT = "give an ISO time (2026-01-15T10:30:00Z) or an age back from now (2h, 7d)"
# What a time filter can be compared with: nanoseconds since the epoch in 64 bits.
_TIME_RANGE_HINT = "give a time from 1677-09-22 to 2262-04-11 (what nanoseconds since 1970 in 64 bits hold)"


def parse_time(text: str, name: str) -> datetime:
    """An ISO time (no zone: UTC) or an age back from now (2h, 7d), as the CLI takes them, within
    the times the store can hold."""
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        dt = dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
    except ValueError:
        try:
            seconds = datetime.now(timezone.utc).timestamp() - parse_duration_s(text)
        except TraceDBError:
            raise BadRequest(f"{name}={_shown(text)} is not a time", hint=_TIME_HINT) from None
        try:
            dt = datetime.fromtimestamp(seconds, tz=timezone.utc)
        except (ValueError, OverflowError, OSError):
            raise BadRequest(f"{name}={_shown(text)} is too long ago", hint=_TIME_RANGE_HINT) from None
    try:
        # As the read API turns it into nanoseconds (reads.to_ns).
        ns = int(dt.timestamp() * 1e9)
    except (ValueError, OverflowError):
        ns = None
    if ns is None or not NS_MIN <= ns <= NS_MAX:
        raise BadRequest(f"{name}={_shown(text)} is outside the times the store can hold", hint=_TIME_RANGE_HINT)
    return dt


def _shown(text: str, limit: int = 80) -> str:
    """A parameter's value as a message quotes it: repr, cut short."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


# -- the query string ----------------------------------------------------------------------------

_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def _decoded(raw: bytes, what: str) -> str:
    """One percent-encoded part of a URL, strictly: well-formed escapes, UTF-8, no NUL."""
    if _BAD_ESCAPE.search(raw) is not None:
        raise BadRequest(f"{what} holds a malformed percent-escape", hint="escape '%' as %25")
    try:
        text = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{what} is not UTF-8 once percent-decoded", hint="encode the text as UTF-8") from None
    if "\x00" in text:
        raise BadRequest(f"{what} holds a NUL character", hint="no execution id, intent or time holds one")
    return text


def query_of(request: Request) -> dict:
    """The query string as {name: value}: each parameter at most once (a repeated one would be
    read one way here and another way by a proxy or a script), strictly decoded."""
    params = request.scope.get("state", {}).get("tracedb_query")
    if params is not None:
        return params
    params = {}
    raw = request.scope.get("query_string", b"")
    for part in raw.split(b"&"):
        if not part:
            continue
        name_raw, _, value_raw = part.partition(b"=")
        name = _decoded(name_raw.replace(b"+", b" "), "a parameter name")
        value = _decoded(value_raw.replace(b"+", b" "), f"the {name[:40]!r} parameter")
        if name in params:
            raise BadRequest(f"{name[:40]!r} is given more than once", hint="give each parameter once")
        params[name] = value
    request.scope.setdefault("state", {})["tracedb_query"] = params
    return params


def check_path(request: Request) -> None:
    """Refuse a path whose percent-encoding is malformed or not UTF-8 (the server decoded it
    leniently before routing)."""
    raw = request.scope.get("raw_path")
    if raw is not None:
        _decoded(raw, "the path")


def _id_param(text: str, what: str) -> str:
    """An execution id or a prefix of one, as given: within the longest id there can be."""
    if len(text) > ID_LENGTH:
        raise BadRequest(f"{what} is {len(text)} characters long; an execution id has at most {ID_LENGTH}",
                         hint="give the id, or a unique prefix of it")
    if "\x00" in text:
        raise BadRequest(f"{what} holds a NUL character", hint="give the id, or a unique prefix of it")
    return text


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    return _int_value(query_of(request).get(name), name, default, low, high)


def _int_value(raw: Optional[str], name: str, default: int, low: int, high: int) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}={_shown(raw)} is not a whole number", hint=f"give a number from {low} to {high}") from None
    if not low <= value <= high:
        raise BadRequest(f"{name}={value} is out of range", hint=f"give a number from {low} to {high}")
    return value


def _status(text: str, name: str = "status") -> str:
    if text not in STATUSES:
        raise BadRequest(f"{name}={_shown(text)} is not a status", hint="one of " + ", ".join(STATUSES))
    return text


def _cursor(text: str) -> str:
    """A page cursor as a listing wrote it: a creation time that fits in 64 bits and an id."""
    try:
        ns, execution_id = decode_cursor(text)
    except TraceDBError as e:
        raise BadRequest(e.message if len(text) <= 200 else f"{_shown(text)} is not a page cursor",
                         hint="follow the Older link of the previous page") from None
    if not NS_MIN <= ns <= NS_MAX or len(execution_id) > ID_LENGTH or "\x00" in execution_id:
        raise BadRequest(f"{_shown(text)} is not a page cursor", hint="follow the Older link of the previous page")
    return text


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?) *(ms|s|m|h)?")
_DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
# What a cost or a duration filter can ask for: more than any execution costs or lasts.
MAX_COST_USD = 1e9
MAX_DURATION_S = 10_000 * 365 * 86400.0
FILTER_TEXT = 200  # a model name or an error code longer than this matches nothing stored


def parse_seconds(text: str, name: str) -> float:
    """A duration as `inspect --slower-than` takes it: 500ms, 2s, 1.5m, 1h; a bare number is seconds."""
    m = _DURATION.fullmatch(text.strip().lower())
    seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)] if m else None
    if seconds is None or seconds > MAX_DURATION_S:
        raise BadRequest(f"{name}={_shown(text)} is not a duration", hint="write it like 500ms, 2s, 1.5m or 1h")
    return seconds


def parse_cost(text: str, name: str) -> float:
    """A cost in USD, at least 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_COST_USD:  # NaN too
        raise BadRequest(f"{name}={_shown(text)} is not a cost", hint="give US dollars, 0 or more, such as 0.05")
    return value


def _outcome(text: str) -> str:
    if text not in OUTCOMES:
        raise BadRequest(f"outcome={_shown(text)} is not an outcome", hint="one of " + ", ".join(OUTCOMES))
    return text


def _short_text(text: str, name: str, what: str) -> str:
    if len(text) > FILTER_TEXT:
        raise BadRequest(f"{name} is {len(text)} characters long", hint=f"{what} has at most {FILTER_TEXT} characters")
    return text


LIST_PARAMS = ("status", "replayable", "intent", "q", "since", "until", "before", "limit",
               "outcome", "model", "error", "min_cost", "slower_than")


def list_params(request: Request) -> tuple[Filter, dict, Optional[str], int]:
    """The list page's filters from the query string; BadRequest for a malformed one."""
    q = query_of(request)
    params = {k: q.get(k, "").strip() for k in LIST_PARAMS}
    status = _status(params["status"]) if params["status"] else None
    replayable = {"": None, "yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}.get(
        params["replayable"].lower(), "bad"
    )
    if replayable == "bad":
        raise BadRequest(f"replayable={_shown(params['replayable'])} is not yes or no",
                         hint="replayable=yes or replayable=no")
    for name, what in (("intent", "an intent"), ("q", "a search of the intent")):
        # No intent is longer; a longer LIKE pattern is one SQLite may refuse as too complex.
        if len(params[name]) > INTENT_LENGTH:
            raise BadRequest(f"{name} is {len(params[name])} characters long",
                             hint=f"{what} has at most {INTENT_LENGTH} characters")
    since = parse_time(params["since"], "since") if params["since"] else None
    until = parse_time(params["until"], "until") if params["until"] else None
    before = _cursor(params["before"]) if params["before"] else None
    limit = _int_param(request, "limit", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    where = Filter(status=status, since=since, until=until, intent=params["intent"] or None,
                   search=params["q"] or None, replayable=replayable,
                   outcome=_outcome(params["outcome"]) if params["outcome"] else None,
                   model=_short_text(params["model"], "model", "a model name") or None,
                   error=_short_text(params["error"], "error", "an error code") or None,
                   min_cost=parse_cost(params["min_cost"], "min_cost") if params["min_cost"] else None,
                   slower_than=parse_seconds(params["slower_than"], "slower_than") if params["slower_than"] else None)
    return where, {k: v for k, v in params.items() if v}, before, limit


class Views:
    """The route handlers, over one AsyncReader."""

    def __init__(self, reader: AsyncReader, replay_command: str):
        self.reader = reader
        self.replay_command = replay_command

    async def executions(self, request: Request) -> Response:
        # The counts come separately (/counts): on millions they take longer than the page.
        check_path(request)
        where, params, before, limit = list_params(request)
        page = await self.reader.page(where, before=before, limit=limit)
        return _html(pages.list_page(page, params, first_page=before is None))

    async def counts(self, request: Request) -> Response:
        """Executions per status under the list's other filters, each counted up to COUNT_LIMIT."""
        check_path(request)
        where, params, _before, _limit = list_params(request)
        counts = await self.reader.status_counts(where, at_most=COUNT_LIMIT)
        shown = {s: pages.fmt_count(n, COUNT_LIMIT) for s, n in counts.items()}
        if where.status:
            total = shown[where.status]
        else:
            capped = any(n > COUNT_LIMIT for n in counts.values())
            total = f"{sum(min(n, COUNT_LIMIT) for n in counts.values()):,}" + ("+" if capped else "")
        return _json({"counts": counts, "shown": shown, "limit": COUNT_LIMIT, "total": total})

    async def overview_page(self, request: Request) -> Response:
        """The aggregates of `tracedb stats`, drawn: per day or hour, by intent, by model."""
        check_path(request)
        q = query_of(request)
        since_text = q.get("since", "").strip()
        since = parse_time(since_text, "since") if since_text else None
        per = q.get("per", "").strip() or "day"
        if per not in overview.BUCKETS:
            raise BadRequest(f"per={_shown(per)} is not day or hour", hint="per=day or per=hour")
        since_ns = None if since is None else to_ns(since, "since")
        # Three groupings at once (each in a worker thread); each answer holds the totals too.
        by_time, by_intent, by_model = await asyncio.gather(*(
            self.reader.stats(since_ns=since_ns, by=by) for by in (per, "intent", "model")))
        return _html(overview.overview_page(by_time, by_intent, by_model, {"since": since_text}, per))

    async def _exact(self, request: Request) -> str:
        check_path(request)
        given = query_of(request).get("id")
        if not given:
            raise BadRequest("which execution? the id parameter is missing", hint="?id=EXECUTION_ID")
        return await self.reader.resolve(_id_param(given, "id"))

    async def execution(self, request: Request) -> Response:
        check_path(request)
        query_of(request)  # none is read, but a malformed one is still refused
        given = _id_param(request.path_params["rest"], "the id in the path")
        eid = await self.reader.resolve(given)
        if eid != given:
            return RedirectResponse(pages.exec_path(eid), status_code=302)
        tl = await self.reader.timeline(eid)
        lineage = await self.reader.lineage(eid)
        return _html(pages.execution_page(tl, layout(tl), lineage, replay_command=self.replay_command,
                                          spans=_spans(tl)))

    async def event(self, request: Request) -> Response:
        eid = await self._exact(request)
        seq = _int_param(request, "seq", 0, 1, 2**31 - 1)
        if not seq:
            raise BadRequest("which event? the seq parameter is missing", hint="&seq=N, N from 1")
        ev = await self.reader.event(eid, seq)
        body = orjson.dumps(ev.payload)
        return _json({"execution_id": eid, "seq": ev.seq, "type": ev.type, "recorded": utc_iso(ev.recorded_at_ns),
                      "size": len(body), "payload": ev.payload})

    async def rows(self, request: Request) -> Response:
        eid = await self._exact(request)
        after = _int_param(request, "after", 0, 0, 2**31 - 1)
        tl = await self.reader.timeline(eid)
        html, last = pages.event_rows(tl, layout(tl), after_seq=after)
        more = bool(tl.record.events) and last < tl.record.events[-1].seq
        return _json({"html": html, "last_seq": last, "more": more})

    async def overview(self, request: Request) -> Response:
        eid = await self._exact(request)
        tl = await self.reader.timeline(eid)
        return _html(pages.overview_svg(layout(tl), running=tl.record.status == STATUS_RUNNING))

    async def live(self, request: Request) -> Response:
        """What changed since the page's last seq: nothing (cheap), new rows and the redrawn
        timeline, or a status change (the page reloads to show the new header)."""
        eid = await self._exact(request)
        after = _int_param(request, "after", 0, 0, 2**31 - 1)
        known = _status(query_of(request).get("status") or STATUS_RUNNING)
        progress = await self.reader.progress(eid, after, limit=1)
        if progress.status != known:
            return _json({"status": progress.status, "reload": True, "last_seq": progress.last_seq})
        if not progress.events:
            return _json({"status": progress.status, "changed": False, "last_seq": after})
        tl = await self.reader.timeline(eid)
        lay = layout(tl)
        answered = frozenset(
            b.request_seq for b in lay.bars
            if b.request_seq <= after and b.response_seq is not None and b.response_seq > after
        )
        html, last = pages.event_rows(tl, lay, after_seq=after, also=answered)
        return _json({
            "status": tl.record.status, "changed": True, "last_seq": last, "rows": html,
            "events": len(tl.record.events),
            "overview": pages.overview_svg(lay, running=tl.record.status == STATUS_RUNNING),
            "spans": _spans(tl),
        })

    async def diff(self, request: Request) -> Response:
        check_path(request)
        q = query_of(request)
        a = _id_param(q.get("a", "").strip(), "a")
        b = _id_param(q.get("b", "").strip(), "b")
        if not a and not b:
            return _html(pages.diff_start_page())
        if not a or not b:
            raise BadRequest("a diff needs two executions, a and b", hint="/diff?a=ID&b=ID (ids or unique prefixes)")
        a_id, b_id = await self.reader.resolve(a), await self.reader.resolve(b)
        d = await self.reader.diff(a_id, b_id)
        pa = await self.reader.progress(a_id, 2**31 - 1, limit=1)
        pb = await self.reader.progress(b_id, 2**31 - 1, limit=1)
        return _html(pages.diff_page(d, pa.status, pb.status))


def _spans(tl: Timeline) -> str:
    """The span tree of an execution that came with nesting, drawn; "" for one without."""
    return span_tree_svg(span_tree(tl.record.events, {t.seq: t.recorded_at_ns for t in tl.event_times}))


def _is_api(request: Request) -> bool:
    path = request.scope.get("path", "")
    return path.startswith("/api/") or path == "/counts"


def _error(request: Request, status: int, message: str, hint: Optional[str] = None) -> Response:
    """The styled error page, or for the routes the page's script fetches, the same as JSON."""
    if _is_api(request):
        return _json({"error": {"status": status, "message": message, "hint": hint}}, status)
    return _html(pages.error_page(status, message, hint), status)


async def _bad_request(request: Request, exc: BadRequest) -> Response:
    return _error(request, 400, exc.message, exc.hint)


async def _tracedb_error(request: Request, exc: TraceDBError) -> Response:
    if isinstance(exc, ExecutionNotFoundError):
        status = 404
    elif isinstance(exc, (AmbiguousExecutionIdError, InvalidInputError)):
        status = 400  # what the request asked for, refused by the read API
    elif isinstance(exc, DatabaseUnavailableError):
        status = 503
    elif exc.exit_code == 2:
        status = 400
    else:
        status = 500
    return _error(request, status, exc.message, exc.hint)


async def _server_error(request: Request, exc: Exception) -> Response:
    # A bug, or a database gone: still the styled page, and no traceback to the browser.
    return _error(request, 500, "the view could not answer this request",
                  "try again; if it persists, the recorder's logs say why")


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        return _error(request, 404, f"nothing at {request.url.path}", "start from the list of executions")
    if exc.status_code == 405:
        resp = _html(pages.error_page(405, f"{request.method} is not allowed: this view only reads",
                                      "use GET; change executions with the tracedb command line"), 405)
        resp.headers["allow"] = "GET, HEAD"
        return resp
    return _html(pages.error_page(exc.status_code, str(exc.detail)), exc.status_code)


class SecurityHeaders:
    """Adds the Content-Security-Policy and friends to every response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, with_headers)


class TokenGate:
    """Lets a request through only with the bearer token: an `Authorization: Bearer` header, the
    cookie a first visit with `?token=` sets, or that visit itself (redirected without it, so
    that the token leaves the address bar and the history). `open_paths` pass without it, marked
    unauthenticated in the scope (/health says less then)."""

    def __init__(self, app, token: str, open_paths: Sequence[str] = ()):
        self.app = app
        self.token = token.encode()
        self.open_paths = frozenset(open_paths)

    def _ok(self, given: Optional[str]) -> bool:
        return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self.token)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        cookie = token_cookie(scope)
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if self._ok(given):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            # The path as it was sent (still percent-encoded): an id may hold "?" or "#".
            path = (scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
            path = "/" + path.lstrip("/")  # "//host/..." would send the browser to another host
            resp = RedirectResponse(path + (f"?{rest}" if rest else ""), status_code=303)
            resp.set_cookie(cookie, given, httponly=True, samesite="strict")
            return await resp(scope, receive, send)
        if self._ok(bearer_token(request.headers)) or self._ok(request.cookies.get(cookie)):
            scope[AUTHENTICATED] = True
            return await self.app(scope, receive, send)
        if scope["path"] in self.open_paths:
            scope[AUTHENTICATED] = False
            return await self.app(scope, receive, send)
        resp = _html(pages.error_page(401, "this view needs the access token",
                                      "open the address tracedb ui printed (it carries ?token=), "
                                      "or send Authorization: Bearer TOKEN; the token is in the "
                                      "data directory's token file"), 401)
        resp.headers["www-authenticate"] = "Bearer"
        await resp(scope, receive, send)


def token_cookie(scope) -> str:
    """The cookie holding the token: one per port, since a browser sends a host's cookies to
    every port of it, and two views on one host may have two tokens."""
    server = scope.get("server")
    return f"{TOKEN_COOKIE}_{server[1]}" if server and server[1] else TOKEN_COOKIE


def create_app(
    reader: AsyncReader,
    *,
    replay_command: str = "tracedb replay",
    token: Optional[str] = None,
    extra_routes: Sequence[BaseRoute] = (),
    open_paths: Sequence[str] = (),
    allowed_hosts: Optional[Iterable[str]] = None,
) -> Starlette:
    """The web view over `reader` (not closed by the app). `extra_routes` go first (the
    recorder's /metrics and /health); with `token`, every request must carry it but those to
    `open_paths`; with `allowed_hosts`, a request naming another Host gets 403."""
    v = Views(reader, replay_command)
    get = ["GET", "HEAD"]
    routes = [
        *extra_routes,
        Route("/", v.executions, methods=get),
        Route("/counts", v.counts, methods=get),
        Route("/overview", v.overview_page, methods=get),
        # The whole path after /e/ is the id: an id may hold "/" (percent-encoded in links,
        # decoded before routing). The fragments take the id as a query parameter.
        Route("/e/{rest:path}", v.execution, methods=get),
        Route("/api/event", v.event, methods=get),
        Route("/api/rows", v.rows, methods=get),
        Route("/api/live", v.live, methods=get),
        Route("/api/overview", v.overview, methods=get),
        Route("/diff", v.diff, methods=get),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={BadRequest: _bad_request, TraceDBError: _tracedb_error, HTTPException: _http_error,
                            Exception: _server_error},
    )
    # The last added runs first: the Host check, then the headers (on a 401 page too), then the token.
    if token:
        app.add_middleware(TokenGate, token=token, open_paths=open_paths)
    app.add_middleware(SecurityHeaders)
    if allowed_hosts is not None:
        app.add_middleware(HostCheck, allowed=allowed_hosts)
    return app
