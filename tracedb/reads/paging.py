"""Pages of executions: how many rows a page holds, and the cursor that continues a listing.

A cursor is the position after one execution in the newest-first order, (created_at_ns,
execution_id), as opaque text. Light on purpose: the command line parses cursors before it loads
anything that reads a database.
"""

from __future__ import annotations

import base64
import binascii

from tracedb.errors import InvalidInputError

DEFAULT_PAGE_SIZE = 50
# Rows per query when every execution is read (`Reader.each`): memory holds one page at a time.
STREAM_PAGE_SIZE = 1000


def encode_cursor(created_at_ns: int, execution_id: str) -> str:
    """The opaque text of a position in the newest-first order (after the given execution)."""
    raw = f"{created_at_ns}:{execution_id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(text: str) -> tuple[int, str]:
    """(created_at_ns, execution_id) of a cursor from `encode_cursor`; InvalidInputError if it is not one."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        ns, sep, execution_id = raw.partition(":")
        if sep and ns.isdigit() and execution_id:
            return int(ns), execution_id
    except (ValueError, binascii.Error, UnicodeDecodeError):
        pass
    raise InvalidInputError(
        f"{text!r} is not a page cursor", hint="copy the cursor printed with the previous page"
    )
