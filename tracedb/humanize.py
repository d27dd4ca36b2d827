"""Values as a person reads them, shared by the CLI and the web view."""

from __future__ import annotations

from typing import Optional


def format_duration(ns: Optional[int], none: str = "-") -> str:
    """A duration in nanoseconds: 850µs, 4.2ms, 340ms, 1.2s, 3m12s, 2h05m, 3d04h; `none` for None.
    Below a millisecond in microseconds (a tool call's bar on the timeline may be that short)."""
    if ns is None:
        return none
    if ns == 0:
        return "0ms"
    if ns < 1_000_000:
        return f"{max(ns // 1_000, 1)}µs"
    if ns < 10_000_000:
        return f"{ns // 100_000 / 10:.1f}ms"
    if ns < 1_000_000_000:
        return f"{ns // 1_000_000}ms"
    s = ns / 1e9
    if s < 60:
        return f"{s:.1f}s"
    whole = int(s)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
