"""Canonical JSON and content hashes shared by the replay engines."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, ASCII only, str() for anything JSON cannot hold.

    The same canonical form as IntentusNet's envelope hash, so equal content always hashes equal.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def content_hash(value: Any) -> str:
    """"sha256:<hex>" of the canonical JSON of `value`."""
    return "sha256:" + hashlib.sha256(canonical_json(value).encode()).hexdigest()


def state_bytes(value: Any) -> bytes:
    """Deterministic bytes for a reconstructed state: canonical JSON, UTF-8."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    ).encode("utf-8")
