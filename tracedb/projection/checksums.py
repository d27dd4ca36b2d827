"""The projection's per-row checksums: a CRC32C beside every stored value no hash covers.

`trace_steps.payload_crc` covers the step's payload; `traces.router_decision_crc`,
`traces.final_response_crc` and `traces.meta_crc` cover those columns (the envelope has its
hash already). A checksum is the CRC32C (the WAL's) of the exact JSON text the compactor wrote,
in UTF-8; of SQL NULL, 0 (the CRC of no bytes). Both databases give that text back as written:
SQLite keeps text as it is, and PostgreSQL's `json` type (not `jsonb`) keeps "an exact copy of
the input text", read back with `CAST(column AS TEXT)`. One exception, on SQLite: a column
declared JSON has NUMERIC affinity, so a document that is a bare number is stored as a number
and comes back as one; its text is then orjson's text of that number, which is what the
recorder wrote (the store serialises with orjson).

No SQLAlchemy here: the sqlite3 read path uses it too.
"""

from __future__ import annotations

from typing import Mapping, Optional

import orjson

from wal.format import crc32c

# The `traces` columns with a checksum, each in the column named `<column>_crc`.
TRACE_VALUE_COLUMNS = ("router_decision", "final_response", "meta")


def crc_column(column: str) -> str:
    """The name of the column holding `column`'s checksum."""
    return column + "_crc"


def of_bytes(data: Optional[bytes]) -> int:
    """The checksum of JSON text about to be written (None: SQL NULL)."""
    return 0 if data is None else crc32c(data)


def of_stored(value) -> int:
    """The checksum of a JSON column's value as the database hands it back undecoded: None, JSON
    text, or (SQLite, a bare number) the number."""
    if value.__class__ is str:  # the common case first: a read checks every step
        return crc32c(value.encode())
    if value is None:
        return 0
    return crc32c(orjson.dumps(value))


def damaged_columns(row: Mapping) -> list[str]:
    """The `traces` value columns of `row` (undecoded values and their checksums) whose value no
    longer matches its checksum. A missing checksum (NULL) does not match either."""
    return [c for c in TRACE_VALUE_COLUMNS if of_stored(row[c]) != row[crc_column(c)]]
