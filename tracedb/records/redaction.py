"""Redaction: secrets rewritten before anything reaches the WAL.

Agents put API keys, tokens and personal data into prompts and tool arguments. The store passes
every envelope, event payload and final response through a `Redactor` (built from the
`[redaction]` table of the configuration) before it encodes the WAL record, on every way in: the
sync and asyncio APIs, the sidecar, imports. What the rules match never reaches the WAL, the
database, exports or logs:

- `keys`: key names, at any depth, whose whole value becomes REDACTED ("[REDACTED]"). Names match
  without regard to case, "-", "_" or nothing between words ("API-Key", "api_key" and "apiKey"
  are one name). A dotted name (an OpenTelemetry or OpenInference attribute) matches by its last
  part ("llm.api_key"), and `http.request.header.<name>` (`http.response.header.`,
  `rpc.request.header.`, `rpc.response.header.`, `rpc.grpc.request.metadata.`,
  `rpc.grpc.response.metadata.`) by the header it names. A list of [name, value] pairs (a header
  list as HTTP clients give it) is read as the mapping it spells. A string holding a JSON
  object or array (`llm.invocation_parameters`, `input.value`, a tool call's arguments) is
  parsed and the same rules apply inside it; if anything is redacted there, the string becomes
  that document written back as compact JSON. Other text is for `patterns`.
- `patterns`: regular expressions (Python syntax) over every string value (keys are not
  rewritten); each match becomes REDACTED.
- `[redaction.intents.<intent>]`: more keys and patterns for the executions of one intent.

The envelope hash is computed before redaction (`Staging.reserve_start`), so replay with the
original envelope still verifies; the store keeps the hash of the envelope as stored in the
trace's `meta` for `verify`. A record lists where it was redacted (`ExecutionRecord.redacted_paths`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import orjson
from ahocorasick_rs import BytesAhoCorasick, Implementation

from tracedb.errors import ConfigError
from tracedb.records.record import REDACTED

DEFAULT_KEYS = (
    "authorization", "proxy_authorization", "api_key", "apikey", "x_api_key", "password", "passwd",
    "secret", "client_secret", "access_token", "refresh_token", "id_token", "cookie", "set_cookie",
)

# Where OpenTelemetry puts a header (or gRPC metadata) as an attribute of its own: the part after
# the prefix is the header's name, matched against the keys as a whole (it may hold dots).
HEADER_PREFIXES = (
    "http.request.header.", "http.response.header.", "rpc.request.header.", "rpc.response.header.",
    "rpc.grpc.request.metadata.", "rpc.grpc.response.metadata.",
)


def _norm(key: str) -> str:
    # "API-Key", "api_key" and "apiKey" are one name.
    return key.lower().replace("-", "").replace("_", "")


def _secret_name(key: str, keys: frozenset) -> bool:
    """Whether a key (of a mapping, or a name of a [name, value] pair) names a secret: the whole
    name, its last dotted part ("llm.api_key", an OpenTelemetry attribute), or the header an
    `http.request.header.<name>`-style attribute names."""
    n = _norm(key)
    if n in keys:
        return True
    if "." not in n:
        return False
    if n.rsplit(".", 1)[1] in keys:
        return True
    for prefix in HEADER_PREFIXES:
        if n.startswith(prefix) and n[len(prefix):] in keys:
            return True
    return False


_LEAVES = frozenset({str, int, float, bool, type(None)})
# Payloads of one application repeat their key names: each rule set decides once per name.
_SEEN_MAX = 65536


def _is_pairs(value: Any) -> bool:
    """A list of [name, value] pairs with string names: a header map in the form HTTP clients
    give (httpx's multi_items, ASGI, OpenAI's recorded responses), read as the mapping it spells."""
    for item in value:
        if type(item) not in (list, tuple) or len(item) != 2 or not isinstance(item[0], str):
            return False
    return bool(value)


# The first character of a string that may hold a JSON object or array.
_JSON_START = frozenset("{[ \t\r\n")


def _document(text: str) -> Any:
    """The JSON object or array a string holds (an OpenInference `llm.invocation_parameters`,
    a tool call's arguments), else None. orjson parses faster than any scan for key names."""
    c = text[:1]
    if c != "{" and c != "[":
        if not c.isspace():
            return None
        c = text.lstrip()[:1]
        if c != "{" and c != "[":
            return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _text_has_key(text: str, secret: dict, keys: frozenset) -> bool:
    doc = _document(text)
    if doc is None or type(doc) not in (dict, list):
        return False
    try:
        return _has_key(doc, secret, keys)
    except RecursionError:
        return True  # too deep to look into: redaction decides, and redacts it whole


def _has_key(value: Any, secret: dict, keys: frozenset) -> bool:
    """Whether a key of `keys` (normalised) names a value anywhere inside `value`, a pair of a
    header list included, or may inside a string holding a document; `secret` caches the
    answer per key name."""
    t = type(value)
    if t is dict:
        items = value.items()
    elif t is list or t is tuple:
        if value and type(value[0]) in (list, tuple) and _is_pairs(value):
            items = value
        else:
            for v in value:
                tv = type(v)
                if tv is str:
                    if v[:1] in _JSON_START and _text_has_key(v, secret, keys):
                        return True
                elif tv not in _LEAVES and _has_key(v, secret, keys):
                    return True
            return False
    elif t is str:
        return _text_has_key(value, secret, keys)
    elif t in _LEAVES:
        return False
    elif isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        return any(_has_key(v, secret, keys) for v in value)
    elif isinstance(value, str):
        return _text_has_key(value, secret, keys)
    else:
        return False
    seen = secret.get
    for k, v in items:
        hit = seen(k)
        if hit is None:
            hit = isinstance(k, str) and _secret_name(k, keys)
            if len(secret) >= _SEEN_MAX:
                secret.clear()
            secret[k] = hit
        if hit:
            return True
        tv = type(v)
        if tv is str:
            if v[:1] in _JSON_START and _text_has_key(v, secret, keys):
                return True
        elif tv not in _LEAVES and _has_key(v, secret, keys):
            return True
    return False


# Beyond this many keys a search key by key costs more than the walk it saves; the automaton's
# one pass costs about the same whatever the number of keys.
_NEEDLES_MAX = 64
# One pass over the text: ASCII capitals lowered, "-" and "_" taken out (`_norm`'s normalisation).
_LOWER = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz")
# Searched for with the keys: a \\u escape could spell one (lowering makes a \\U one too, which
# costs a needless walk at most).
_ESCAPE = b"\\u"
# Needles sharing a first part this long are searched for once by it ("passw": "password",
# "passwd"): each search is a pass over the whole text, whatever the needle.
_SHARED_PREFIX = 5


def _plain_name(key: str) -> bool:
    """A normalised key that JSON text holds as its own bytes: printable ASCII, none of the
    characters JSON may write as an escape (a quote, a backslash, a slash)."""
    return key.isascii() and key.isprintable() and not any(c in key for c in '"\\/')


def _search_plan(needles: tuple) -> tuple:
    """(anchor, needles) pairs: the needles whose first `_SHARED_PREFIX` bytes are the same are
    looked for only when that shared start is in the text; a needle on its own is its anchor."""
    groups: dict = {}
    for k in needles:
        groups.setdefault(k[:_SHARED_PREFIX] if len(k) > _SHARED_PREFIX else k, []).append(k)
    return tuple((a, tuple(ks)) if len(ks) > 1 else (ks[0], ()) for a, ks in groups.items())


def _on_loop_thread() -> bool:
    """Whether an asyncio event loop runs on this thread (asyncio is not imported for it: a read
    command that never imported it has no loop)."""
    # While another thread imports asyncio for the first time, the module is there before the
    # function is: no loop can run on this thread yet.
    running = getattr(sys.modules.get("asyncio"), "_get_running_loop", None)
    return running is not None and running() is not None


def _names_absent(value: Any, plan: Optional[tuple], matcher: Any, text: Optional[bytes] = None) -> bool:
    """True when no key can name a secret anywhere in `value`: its JSON text (`text` when the
    caller has it), lowered and with "-" and "_" taken out (the
    normalisation of `_norm`), holds none of the keys. A key that
    matches, as a whole, by its last dotted part or after a header prefix, inside a [name,
    value] pair or inside a string holding a document, has its normalised name in that text.
    Only ASCII text without escapes is read so (a \\u escape, or a non-ASCII letter whose lower
    case is ASCII, could spell a key otherwise); anything else is left to the walk (False).

    On a thread running an event loop (the asyncio API, the sidecar: one thread records for
    many callers) the text is searched in one pass by `matcher`, an Aho-Corasick automaton of
    the keys and `_ESCAPE`, which lets go of the GIL while it searches. Elsewhere (the sync
    API, called from many threads at once) each key of `plan` is searched for with the GIL
    held: a thread that lets go of it waits behind the other callers to get it back, which cost
    the sync API more than the single pass saves (docs/benchmarks.md); `plan` is None when
    there are more keys than `_NEEDLES_MAX`, and such a thread walks the value instead."""
    on_loop = _on_loop_thread()
    if plan is None and not on_loop:
        return False  # more keys than a search key by key pays for: the walk
    if text is None:
        try:
            text = orjson.dumps(value)
        except (TypeError, orjson.JSONEncodeError):
            return False
    if not text.isascii():
        return False
    if on_loop:
        return not matcher.find_matches_as_indexes(text.translate(_LOWER, b"-_"))
    # A backslash is found by memchr; the two-byte search runs only on text that has one.
    if b"\\" in text and _ESCAPE in text:
        return False
    text = text.translate(_LOWER, b"-_")
    for anchor, group in plan:
        if anchor in text:
            if not group:
                return False
            for k in group:
                if k in text:
                    return False
    return True


@dataclass(frozen=True)
class Rules:
    """The rules for one intent: normalised key names and compiled patterns."""

    keys: frozenset
    patterns: tuple
    # key name -> whether it is one of `keys` (filled as payloads are seen)
    seen: dict = field(default_factory=dict, compare=False, repr=False)
    # `needles`, once worked out (None: not yet; False: the keys cannot be searched as text)
    _needles: Any = field(default=None, compare=False, repr=False, init=False)
    # `needles` grouped for the search (`_search_plan`), set with them; None: too many to search
    # for one by one (more than `_NEEDLES_MAX`)
    _plan: Optional[tuple] = field(default=(), compare=False, repr=False, init=False)
    # `needles` and `_ESCAPE` as one automaton (`_names_absent`), set with them
    _matcher: Any = field(default=None, compare=False, repr=False, init=False)

    @property
    def empty(self) -> bool:
        return not self.keys and not self.patterns

    def might_match(self, value: Any, text: Optional[bytes] = None) -> bool:
        """False when redaction cannot change `value` (the common case: it is then recorded
        without being copied); with patterns, every string has to be tried. `text`: JSON text
        that `value` was written as or decoded from, when the caller has it (saves writing it
        again): in ASCII text without a \\u escape, a key's characters are its own bytes."""
        if self.patterns:
            return True
        if not self.keys:
            return False
        if self.needles is not None and _names_absent(value, self._plan, self._matcher, text):
            return False
        return _has_key(value, self.seen, self.keys)

    @property
    def needles(self) -> Optional[tuple]:
        """The keys as bytes for `_names_absent`, or None when a key could be written other than
        as its own characters in JSON text (then every value is walked)."""
        got = self._needles
        if got is None:
            ok = all(_plain_name(k) for k in self.keys)
            # A key that holds another is found through it ("xapikey" through "apikey").
            got = tuple(k.encode() for k in self.keys if not any(o != k and o in k for o in self.keys)) if ok else False
            # The plan and the automaton first: a thread that finds `_needles` set searches with them.
            plan = _search_plan(got) if got and len(got) <= _NEEDLES_MAX else None
            object.__setattr__(self, "_plan", plan)
            if got:
                object.__setattr__(
                    self, "_matcher", BytesAhoCorasick([*got, _ESCAPE], implementation=Implementation.DFA))
            object.__setattr__(self, "_needles", got)
        return got or None


def _rules(keys, patterns) -> Rules:
    return Rules(frozenset(_norm(k) for k in keys), tuple(patterns))


def _compile_patterns(items: Any, where: str) -> list:
    if not isinstance(items, list) or not all(isinstance(p, str) and p for p in items):
        raise ConfigError(f"{where} must be a list of regular expressions (non-empty strings)")
    out = []
    for p in items:
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise ConfigError(
                f"{where}: {p!r} is not a valid regular expression ({e})",
                hint="patterns use Python's re syntax; in TOML write them as '...' literal strings",
            ) from None
    return out


def _key_list(items: Any, where: str) -> list:
    if not isinstance(items, list) or not all(isinstance(k, str) and k for k in items):
        raise ConfigError(f"{where} must be a list of key names (non-empty strings)")
    return list(items)


class Redactor:
    """Rewrites values by the configured rules; `for_intent` picks one intent's rules."""

    def __init__(self, keys=DEFAULT_KEYS, patterns=(), intents: Optional[Mapping[str, tuple]] = None):
        """`patterns`: compiled or source regular expressions; `intents`: intent -> (keys,
        patterns) added to the common ones for that intent."""
        pats = [p if isinstance(p, re.Pattern) else re.compile(p) for p in patterns]
        self.common = _rules(keys, pats)
        self.by_intent = {}
        for intent, (ikeys, ipats) in (intents or {}).items():
            ipats = [p if isinstance(p, re.Pattern) else re.compile(p) for p in ipats]
            self.by_intent[intent] = _rules([*keys, *ikeys], [*pats, *ipats])

    @classmethod
    def from_table(cls, table: Any, where: str = "[redaction]") -> Optional["Redactor"]:
        """A redactor from the `[redaction]` table of the configuration (None: the defaults);
        None when redaction is turned off (`enabled = false`) or no rule is left."""
        if table is None:
            table = {}
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where} must be a table")
        unknown = set(table) - {"enabled", "keys", "patterns", "intents"}
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {sorted(unknown)[0]!r}",
                hint="[redaction] takes enabled, keys, patterns and [redaction.intents.<intent>] tables",
            )
        enabled = table.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError(f"{where} enabled must be true or false")
        if not enabled:
            return None
        keys = _key_list(table.get("keys", list(DEFAULT_KEYS)), f"{where} keys")
        patterns = _compile_patterns(table.get("patterns", []), f"{where} patterns")
        intents = {}
        raw_intents = table.get("intents", {})
        if not isinstance(raw_intents, Mapping):
            raise ConfigError(f"{where} intents must be a table of [redaction.intents.<intent>] tables")
        for intent, body in raw_intents.items():
            w = f"[redaction.intents.{intent}]"
            if not isinstance(body, Mapping) or set(body) - {"keys", "patterns"}:
                raise ConfigError(f"{w} takes keys and patterns only")
            intents[intent] = (
                _key_list(body.get("keys", []), f"{w} keys"),
                _compile_patterns(body.get("patterns", []), f"{w} patterns"),
            )
        r = cls(keys, patterns, intents)
        if r.common.empty and all(x.empty for x in r.by_intent.values()):
            return None
        return r

    def for_intent(self, intent: Optional[str]) -> Optional[Rules]:
        """The rules that apply to an intent's executions; None when there are none."""
        rules = self.by_intent.get(intent, self.common) if intent is not None else self.common
        return None if rules.empty else rules


def redact(value: Any, rules: Rules) -> tuple[Any, bool]:
    """`value` with the rules applied, and whether anything changed. Containers are copied only
    where something inside them changed; `value` itself is never modified."""
    if isinstance(value, str):
        out = value
        if rules.keys and _text_has_key(value, rules.seen, rules.keys):
            out = _redact_text(value, rules)
        for p in rules.patterns:
            out = p.sub(REDACTED, out)
        return out, out != value
    if isinstance(value, Mapping):
        changed = False
        out = {}
        for k, v in value.items():
            if isinstance(k, str) and _is_secret(k, rules):
                nv, c = REDACTED, v != REDACTED
            else:
                nv, c = redact(v, rules)
            out[k] = nv
            changed = changed or c
        return (out if changed else value), changed
    if isinstance(value, (list, tuple)):
        if rules.keys and _is_pairs(value):
            items = [
                ([p[0], REDACTED], p[1] != REDACTED) if _is_secret(p[0], rules) else _pair(p, rules)
                for p in value
            ]
        else:
            items = [redact(v, rules) for v in value]
        if any(c for _, c in items):
            return [v for v, _ in items], True
        return value, False
    return value, False


def _is_secret(key: str, rules: Rules) -> bool:
    hit = rules.seen.get(key)
    if hit is None:
        hit = _secret_name(key, rules.keys)
        if len(rules.seen) >= _SEEN_MAX:
            rules.seen.clear()
        rules.seen[key] = hit
    return hit


def _pair(pair, rules: Rules) -> tuple[Any, bool]:
    v, c = redact(pair[1], rules)
    return ([pair[0], v] if c else pair), c


def _redact_text(text: str, rules: Rules) -> str:
    """A string holding a JSON document in which a key rule matches: the document redacted and
    written back (compact JSON). One too deep to walk is redacted whole."""
    doc = _document(text)
    try:
        out, changed = redact(doc, rules)
    except RecursionError:
        return REDACTED
    return orjson.dumps(out).decode() if changed else text
