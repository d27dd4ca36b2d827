"""Execution ids that sort by creation time.

A generated id is `exec-` and the 32 hex digits of a UUID version 7 (RFC 9562): 48 bits of Unix
milliseconds, then random bits. Ids made close in time sit close together in the primary-key
indexes of `traces` and `trace_steps`, so compacting a batch of interleaved executions writes a
few pages at the end of each index instead of pages scattered through it (random uuid4 ids made
compaction about 2x slower than inserting the same rows in key order).
"""

from __future__ import annotations

import os
import time

PREFIX = "exec-"
# An execution recorded from OpenTelemetry: otel-<trace id> (`tracedb.otel.mapping`).
OTEL_PREFIX = "otel-"


def uuid7_hex(unix_ms: int | None = None) -> str:
    """32 hex digits of a UUIDv7: the time in ms, version 7, variant 10, 74 random bits."""
    ms = time.time_ns() // 1_000_000 if unix_ms is None else unix_ms
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits; 74 are used
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    return f"{value:032x}"


def new_execution_id() -> str:
    """A fresh execution id, time-ordered: `exec-<32 hex digits>`."""
    return PREFIX + uuid7_hex()
