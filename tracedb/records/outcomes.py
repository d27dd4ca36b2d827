"""What an execution came to, and what it cost: outcome, first error, models, tokens, cost.

Pure functions over events as recorded (no I/O). The compactor folds them into each execution's
`traces` row as its records are applied (`fold_event`, `fold_finish`, `fold_status`), the read
of WAL-only records (`tracedb.reads.wal_tail`) does the same, and migration 0005 runs the same fold over
the steps already stored. The read API marks each event with `event_error`.

Where errors are recorded, per call (`event_error`):
- an `error` on the event: a tool or LLM call that raised (the OpenAI/Anthropic SDK wrappers,
  the Agents SDK processor's tool calls, the OTel mapping of a span with status ERROR), or
  an answer such as `{"status": "error", "error": {"code": "TOOL_TIMEOUT"}}`;
- an HTTP answer of 400 or more recorded by the SDK wrappers (the provider's `error` body);
- an OTel span event (`otel.*`) whose span status is `error`;
- an Agents SDK span (`agents.span.ended`) with an `error`;
- IntentusNet's `AGENT_ATTEMPT_END` with status `error`.

An execution (`fold_finish`) has `failed` when its final response's status is `error`, `failed` or
`failure` (IntentusNet's error responses, an OTel root span with status ERROR, an Agents SDK run
that raised all finish so), `succeeded` when it finished otherwise; `incomplete` when it was
closed unfinished (or invalidated while running), else `running`. Outcome and replayability are
separate: a failure recorded in full replays.

Usage: the token counts of each `llm.responded` (OpenAI's `usage`, the SDK wrappers' and the
OTel mapping's normalised `usage` from `gen_ai.usage.*` or `llm.token_count.*`, the Agents SDK's
response usage), and its model. Cost is priced with `genai-prices` at the event's time; a model
the table does not know, or usage without a model, makes the execution's cost unknown (None)
while its tokens still count: never a guess.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from decimal import Decimal
from functools import lru_cache
from typing import Any, Optional


SUCCEEDED = "succeeded"
FAILED = "failed"
INCOMPLETE = "incomplete"
RUNNING = "running"
OUTCOMES = (SUCCEEDED, FAILED, INCOMPLETE, RUNNING)

FAILED_STATUSES = frozenset({"error", "failed", "failure"})
MESSAGE_CHARS = 200
CODE_CHARS = 200

LLM_RESPONDED = "llm.responded"
AGENTS_SPAN_ENDED = "agents.span.ended"
ATTEMPT_END = "AGENT_ATTEMPT_END"
FINAL_RESPONSE = "FINAL_RESPONSE"

# Token count names, first found wins: tracedb's normalised names (SDK wrappers, OTel mapping,
# Agents SDK), OpenAI chat completions', the GenAI conventions', OpenInference's.
_INPUT_KEYS = ("input_tokens", "prompt_tokens", "gen_ai.usage.input_tokens", "llm.token_count.prompt")
_OUTPUT_KEYS = ("output_tokens", "completion_tokens", "gen_ai.usage.output_tokens", "llm.token_count.completion")
_CACHE_READ_KEYS = ("cache_read_input_tokens", "gen_ai.usage.cache_read.input_tokens")

# The columns of `traces` this module derives, with a new execution's values.
COLUMNS = (
    "outcome", "error_seq", "error_type", "error_code", "error_message", "models",
    "input_tokens", "output_tokens", "cost_usd", "prices_version",
)


def initial() -> dict:
    """The derived columns of an execution just started."""
    return {
        "outcome": RUNNING, "error_seq": None, "error_type": None, "error_code": None,
        "error_message": None, "models": [], "input_tokens": 0, "output_tokens": 0,
        "cost_usd": 0.0, "prices_version": None,
    }


_PRICES_VERSION: Optional[str] = None  # prices_version(), once known


def prices_version() -> str:
    """The version of the genai-prices table costs are computed with (imported on first use:
    it costs a read command more than the rest of its start-up)."""
    global _PRICES_VERSION
    if _PRICES_VERSION is None:
        import genai_prices

        _PRICES_VERSION = genai_prices.__version__
    return _PRICES_VERSION


def _text(value: Any, limit: int) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        value = str(value)
    return value[:limit]


def _error_fields(err: Any, fallback_code: Any = None) -> dict:
    """{code, message} of a recorded error value (an object, a string, anything)."""
    if isinstance(err, dict):
        code = err.get("code") or err.get("type") or fallback_code
        message = err.get("message") or err.get("detail") or err.get("exception")
        if message is None and isinstance(err.get("error"), dict):
            return _error_fields(err["error"], code)
    else:
        code, message = fallback_code, err if err is not True else None
    return {"code": _text(code, CODE_CHARS), "message": _text(message, MESSAGE_CHARS)}


def _http_error(response: dict) -> Optional[dict]:
    status = response.get("status")
    if not isinstance(status, int) or isinstance(status, bool) or status < 400:
        return None
    body = response.get("body")
    err = body.get("error") if isinstance(body, dict) else None
    if err is None:
        err = body if isinstance(body, dict) else response.get("text")
    return _error_fields(err, f"http_{status}")


def response_error(response: Any) -> Optional[dict]:
    """{code, message} when a final (or call) response says it failed, else None."""
    if not isinstance(response, dict):
        return None
    status = response.get("status")
    failed = isinstance(status, str) and status.lower() in FAILED_STATUSES
    err = response.get("error")
    if not failed and not (status is None and err):
        return None
    if err:
        return _error_fields(err)
    return {"code": _text(status, CODE_CHARS), "message": _text(response.get("message"), MESSAGE_CHARS)}


def event_error(event_type: str, payload: Any) -> Optional[dict]:
    """{code, message} of the error an event records (module doc), None when it records none."""
    if not isinstance(payload, dict):
        return None
    if event_type == FINAL_RESPONSE:
        return response_error(payload)
    err = payload.get("error")
    if err:
        return _error_fields(err)
    response = payload.get("response")
    if isinstance(response, dict):
        found = _http_error(response) or response_error(response)
        if found is not None:
            return found
    otel = payload.get("otel")
    if isinstance(otel, dict) and otel.get("status") == "error":
        attrs = otel.get("attributes") if isinstance(otel.get("attributes"), dict) else {}
        return {"code": _text(attrs.get("error.type") or "error", CODE_CHARS),
                "message": _text(otel.get("status_message") or "span status ERROR", MESSAGE_CHARS)}
    status = payload.get("status")
    if isinstance(status, str) and status.lower() in FAILED_STATUSES:
        return {"code": _text(payload.get("code") or status, CODE_CHARS),
                "message": _text(payload.get("message") or payload.get("exception"), MESSAGE_CHARS)}
    return None


def _first(d: dict, keys: tuple) -> Optional[int]:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _tokens(usage: dict, keys: tuple) -> int:
    for k in keys:
        v = usage.get(k)
        if type(v) is int:
            return v
    return 0


def event_usage(event_type: str, payload: Any) -> Optional[tuple[Optional[str], int, int, int]]:
    """(model, input tokens, output tokens, cached input tokens) of a model call's answer, or None
    when the event is not one or names neither a model nor usage."""
    if event_type != LLM_RESPONDED or type(payload) is not dict:
        return None
    # Written out rather than looped over: this runs for every model call compaction applies.
    response = payload.get("response")
    usage = model = None
    if type(response) is dict:
        usage, model = response.get("usage"), response.get("model")
        if usage is None or model is None:
            body = response.get("body")
            if type(body) is dict:
                usage = usage if usage is not None else body.get("usage")
                model = model if model is not None else body.get("model")
    if usage is None:
        usage = payload.get("usage")
    if model is None:
        model = payload.get("model")
    if type(usage) is not dict:
        usage = None
    if type(model) is not str or not model:
        model = None
    if usage is None:
        return None if model is None else (model, 0, 0, 0)
    cached = _tokens(usage, _CACHE_READ_KEYS)
    if not cached:
        details = usage.get("input_tokens_details") or usage.get("prompt_tokens_details")
        cached = _tokens(details, ("cached_tokens",)) if type(details) is dict else 0
    return model, _tokens(usage, _INPUT_KEYS), _tokens(usage, _OUTPUT_KEYS), cached


_DAY_NS = 86_400 * 10**9


@lru_cache(maxsize=1024)
def _rates(model: str, day: int):
    """genai-prices' price of `model` on a UTC day: (input, cached input, output) USD per token
    when it is linear in tokens, else the table's ModelPrice (tiered: priced call by call), None
    when the table does not know the model. Cached: the table's own calculation costs ~75 us a
    call, too much for compaction's hot path."""
    from genai_prices import data_snapshot

    try:
        _provider, info = data_snapshot.get_snapshot().find_provider_model(model, None, None, None)
    except LookupError:
        return None
    price = info.get_prices(datetime.fromtimestamp(day * 86_400, tz=timezone.utc))
    parts = (price.input_mtok, price.cache_read_mtok, price.output_mtok)
    if not all(p is None or isinstance(p, Decimal) for p in parts):
        return price
    per_token = [None if p is None else float(p) / 1e6 for p in parts]
    if per_token[0] is None or per_token[2] is None:
        return price
    if per_token[1] is None:
        per_token[1] = per_token[0]
    return tuple(per_token)


def price_usd(model: Optional[str], input_tokens: int, output_tokens: int, cached_tokens: int, at_ns: Optional[int]) -> Optional[float]:
    """The price of one model call in USD, from genai-prices' table on the call's day (today
    when `at_ns` is None); None when the table does not know the model (or there is none)."""
    if not model:
        return None
    day = (time.time_ns() if at_ns is None else at_ns) // _DAY_NS
    rates = _rates(model, day)
    if rates is None:
        return None
    cached = min(cached_tokens, input_tokens)
    if isinstance(rates, tuple):
        return (input_tokens - cached) * rates[0] + cached * rates[1] + output_tokens * rates[2]
    from genai_prices import Usage

    usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens, cache_read_tokens=cached or None)
    return float(rates.calc_price(usage)["total_price"])


def _note_error(row: dict, seq: int, event_type: str, err: dict) -> None:
    if row.get("error_seq") is None:
        row["error_seq"], row["error_type"] = seq, event_type
        row["error_code"], row["error_message"] = err["code"], err["message"]


def fold_event(row: dict, seq: int, event_type: str, payload: Any, t: int) -> None:
    """Fold one event into the derived columns of `row` (a new row, or a delta whose tokens and
    cost are increments, models new names, and error the batch's first: see the compactor)."""
    err = event_error(event_type, payload)
    used = event_usage(event_type, payload)
    if err is not None or used is not None:
        fold_facts(row, seq, event_type, (err, used), t)


NO_FACTS = ()  # what `event_facts` says of an event that changes no derived column


def event_facts(event_type: str, payload_json: bytes, payload: Any) -> tuple:
    """What an event adds to the derived columns: (error or None, usage or None: `event_error`
    and `event_usage`), NO_FACTS when nothing; `payload` is `payload_json` decoded. A function
    of the payload alone (the price is looked up as the facts are folded). The store has the
    payload decoded at hand when it writes the record and writes these into the record's frame
    (`codec.encode_event`), so that neither compaction nor a read of the WAL decodes a payload."""
    if not may_matter(event_type, payload_json):
        return NO_FACTS
    err = event_error(event_type, payload)
    used = event_usage(event_type, payload)
    if err is None and used is None:
        return NO_FACTS
    return err, used


# (model, day, its `_rates`) of the last model call `call_price` priced: one tuple, read and
# replaced whole, since threads folding at once (the compactor, reads of the WAL) price side by side.
_last_rates: tuple = (None, None, None)


def call_price(used: tuple, t: int) -> Optional[float]:
    """The price in USD of a model call recorded at `t`, `used` its `event_usage`: 0.0 with no
    tokens, None when the table does not know the model. `price_usd` written out for the linear
    prices (nearly every model), the last model's rates kept at hand: this runs for every model
    call folded."""
    model, n_in, n_out, cached = used
    if not (n_in or n_out):
        return 0.0
    if not model:
        return None
    global _last_rates
    day = t // _DAY_NS
    last = _last_rates
    if last[0] == model and last[1] == day:
        rates = last[2]
    else:
        rates = _rates(model, day)
        _last_rates = (model, day, rates)
    if type(rates) is tuple:
        cached = cached if cached < n_in else n_in
        return (n_in - cached) * rates[0] + cached * rates[1] + n_out * rates[2]
    return price_usd(model, n_in, n_out, cached, t)


def fold_facts(row: dict, seq: int, event_type: str, facts: tuple, t: int) -> None:
    """Fold an event's `event_facts` (not NO_FACTS; lists, as read back from a record's frame,
    do as well as tuples) recorded at `t` into the derived columns of `row`, the call priced at
    `t`, as `fold_event` folds its payload. Written for speed: compaction runs it for every
    model call."""
    err, used = facts
    if err is not None:
        _note_error(row, seq, event_type, err)
    if used is None:
        return
    model, n_in, n_out, _cached = used
    models = row.get("models")
    if models is None:
        models = row["models"] = []
    if model is not None and model not in models:
        models.append(model)
    row["input_tokens"] = row.get("input_tokens", 0) + n_in
    row["output_tokens"] = row.get("output_tokens", 0) + n_out
    if n_in or n_out:
        cost = row.get("cost_usd", 0.0)
        if cost is not None:
            price = call_price(used, t)
            row["cost_usd"] = None if price is None else cost + price
        row["prices_version"] = _PRICES_VERSION or prices_version()


def fold_finish(row: dict, seq: int, response: Any) -> None:
    """Fold an execution's final response: failed or succeeded, the failure as the first error
    unless a call failed before."""
    err = response_error(response)
    if err is not None:
        _note_error(row, seq, FINAL_RESPONSE, err)
    row["outcome"] = FAILED if err is not None else SUCCEEDED


def fold_closed(row: dict) -> None:
    """An execution closed without finishing (marked incomplete, or invalidated while running)."""
    if row.get("outcome") in (None, RUNNING):
        row["outcome"] = INCOMPLETE


# Decoded by the fold whatever they hold: a model call's answer (its usage), an Agents SDK span.
_ALWAYS = frozenset({LLM_RESPONDED, AGENTS_SPAN_ENDED})
# Never decoded: what asks or starts, which records no error of its own.
_NEVER = frozenset({"llm.requested", "tool.requested", "agents.span.started", "INTENT_RECEIVED",
                    "AGENT_ATTEMPT_START", "ROUTER_DECISION", "FALLBACK_TRIGGERED"})


def may_matter(event_type: str, body: bytes) -> bool:
    """Whether an event's payload JSON (as written) can change the derived columns: a cheap
    test on the type, then the bytes (every error this module reads is under a key or a status
    value spelled `error...`, or a status `failed`/`failure`), so that the fold decodes only the
    events that can."""
    if event_type in _ALWAYS:
        return True
    if event_type in _NEVER:
        return False
    return _ERROR_BYTES(body) is not None


# One pass over the bytes (six `in` tests cost four times as much).
_ERROR_BYTES = re.compile(rb'"(?:error|fail|Error|ERROR|Fail|FAIL)').search


def derive(status: str, events) -> dict:
    """The derived columns of an execution from its events, (seq, type, payload, time ns) in
    seq order, and its status: the same fold the compactor runs record by record (migration
    0005 fills the rows stored before it with this)."""
    row = initial()
    finished = False
    for seq, event_type, payload, t in events:
        if event_type == FINAL_RESPONSE:
            fold_finish(row, seq, payload)
            finished = True
        else:
            fold_event(row, seq, event_type, payload, t)
    if not finished and status != RUNNING:
        fold_closed(row)
    return row
