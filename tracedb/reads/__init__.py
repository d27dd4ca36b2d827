"""The read API: the Reader, its SQLite fast path, what only the WAL holds, stats, pages.

`from tracedb.reads import Reader, AsyncReader, Filter` is the public way in (`reads/reader.py`);
the rest of the folder is what they read with."""

from tracedb.reads.reader import AsyncReader, Filter, Page, Progress, Reader, TimedEvent, Timeline

__all__ = ["AsyncReader", "Filter", "Page", "Progress", "Reader", "TimedEvent", "Timeline"]
