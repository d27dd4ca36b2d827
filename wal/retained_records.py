"""The compactor's window of records just appended, kept in memory so it need not read them back."""

from __future__ import annotations

from typing import Optional

# Memory a kept record costs besides its payload: its tuple, the bytes object, a hint.
RECORD_OVERHEAD = 256


class RetainedRecords:
    """The latest appended records as (lsn, payload, hint), consecutive LSNs in order, at most
    `max_records` of them and `max_bytes` of payloads (RECORD_OVERHEAD more each).

    Past either bound everything kept is dropped (a consumer that fell behind reads the
    segments) and keeping starts over. Not locked: the Wal calls it under its lock, and frees a
    dropped window (`dropped`) outside it.
    """

    def __init__(self, max_records: int, max_bytes: int):
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records: list = []
        self._bytes = 0  # sum of their payload sizes plus RECORD_OVERHEAD each
        self.dropped: Optional[list] = None  # a window dropped by `keep`, to free outside the lock

    def keep(self, lsn: int, payload, hint) -> None:
        """Keep an appended record (the next LSN after the last one kept)."""
        size = len(payload) + RECORD_OVERHEAD
        if len(self._records) >= self.max_records or self._bytes + size > self.max_bytes:
            # The consumer fell behind: it reads this stretch back from the segments instead.
            self.dropped = self._records
            self._records = []
            self._bytes = 0
            if size > self.max_bytes:
                return
        # A copy: exactly the bytes framed now (a caller may reuse a bytearray), and no spare
        # capacity (orjson's output, for one, keeps a 4 KiB allocation behind a short string).
        self._records.append((lsn, bytes(memoryview(payload)), hint))
        self._bytes += size

    def take(self, first_lsn: int, max_records: int, to_lsn: int) -> Optional[list]:
        """Up to `max_records` records from `first_lsn` on, none past `to_lsn`, dropping them
        and any before them; None when `first_lsn` is not kept."""
        kept = self._records
        if not kept:
            return None
        head = kept[0][0]
        if head > first_lsn:
            return None
        start = first_lsn - head  # kept LSNs are consecutive: one entry per appended record
        last = min(to_lsn, first_lsn + max_records - 1, kept[-1][0])
        end = start + max(0, last - first_lsn + 1)
        out = kept[start:end]
        for rec in kept[:end]:
            self._bytes -= len(rec[1]) + RECORD_OVERHEAD
        del kept[:end]
        return out

    def clear(self) -> None:
        """Drop everything kept."""
        self._records = []
        self._bytes = 0
