"""Redaction: secrets rewritten before anything reaches the WAL.

Agents put API keys, tokens and personal data into prompts and tool arguments. The store passes
every envelope, event payload and final response through a `Redactor` (built from the
`[redaction]` table of the configuration) before it encodes the WAL record, on every way in: the
sync and asyncio APIs, the sidecar, imports. What the rules match never reaches the WAL, the
database, exports or logs:

- `keys`: key names, at any depth, whose whole value becomes REDACTED ("[REDACTED]"). Names match
  without regard to case, and "-" and "_" are the same ("API-Key" is "api_key").
- `patterns`: regular expressions (Python syntax) over every string value (keys are not
  rewritten); each match becomes REDACTED.
- `[redaction.intents.<intent>]`: more keys and patterns for the executions of one intent.

The envelope hash is computed before redaction (`Store.reserve_start`), so replay with the
original envelope still verifies; the store keeps the hash of the envelope as stored in the
trace's `meta` for `verify`. A record lists where it was redacted (`ExecutionRecord.redacted_paths`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .errors import ConfigError
from .record import REDACTED

DEFAULT_KEYS = (
    "authorization", "proxy_authorization", "api_key", "apikey", "x_api_key", "password", "passwd",
    "secret", "client_secret", "access_token", "refresh_token", "id_token", "cookie", "set_cookie",
)


def _norm(key: str) -> str:
    return key.lower().replace("-", "_")


_LEAVES = frozenset({str, int, float, bool, type(None)})
# Payloads of one application repeat their key names: each rule set decides once per name.
_SEEN_MAX = 65536


def _has_key(value: Any, secret: dict, keys: frozenset) -> bool:
    """Whether a key of `keys` (normalised) names a value anywhere inside `value`; `secret`
    caches the answer per key name."""
    t = type(value)
    if t is dict:
        items = value.items()
    elif t is list or t is tuple:
        for v in value:
            if type(v) not in _LEAVES and _has_key(v, secret, keys):
                return True
        return False
    elif t in _LEAVES:
        return False
    elif isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        return any(_has_key(v, secret, keys) for v in value)
    else:
        return False
    seen = secret.get
    for k, v in items:
        hit = seen(k)
        if hit is None:
            hit = isinstance(k, str) and _norm(k) in keys
            if len(secret) >= _SEEN_MAX:
                secret.clear()
            secret[k] = hit
        if hit:
            return True
        if type(v) not in _LEAVES and _has_key(v, secret, keys):
            return True
    return False


@dataclass(frozen=True)
class Rules:
    """The rules for one intent: normalised key names and compiled patterns."""

    keys: frozenset
    patterns: tuple
    # key name -> whether it is one of `keys` (filled as payloads are seen)
    seen: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def empty(self) -> bool:
        return not self.keys and not self.patterns

    def might_match(self, value: Any) -> bool:
        """False when redaction cannot change `value` (the common case: it is then recorded
        without being copied); with patterns, every string has to be tried."""
        if self.patterns:
            return True
        return bool(self.keys) and _has_key(value, self.seen, self.keys)


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
        if not rules.patterns:
            return value, False
        out = value
        for p in rules.patterns:
            out = p.sub(REDACTED, out)
        return out, out != value
    if isinstance(value, Mapping):
        changed = False
        out = {}
        for k, v in value.items():
            if isinstance(k, str) and _norm(k) in rules.keys:
                nv, c = REDACTED, v != REDACTED
            else:
                nv, c = redact(v, rules)
            out[k] = nv
            changed = changed or c
        return (out if changed else value), changed
    if isinstance(value, (list, tuple)):
        items = [redact(v, rules) for v in value]
        if any(c for _, c in items):
            return [v for v, _ in items], True
        return value, False
    return value, False
