"""Per-row checksums: trace_steps.payload_crc; traces.router_decision_crc, final_response_crc, meta_crc

A CRC32C of each stored value's exact JSON text (tracedb.projection.checksums), so that `verify` and every
read of a record find a value changed in the database file. Rows already stored get theirs here,
a batch at a time in primary-key order (memory does not grow with the store): after this
revision every row has its checksums, and a NULL checksum is damage like a wrong one.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tracedb.projection import checksums

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_BATCH = 2000

_STEP_CRCS = {"payload": "payload_crc"}
_TRACE_CRCS = {c: checksums.crc_column(c) for c in checksums.TRACE_VALUE_COLUMNS}


def upgrade() -> None:
    # Plain ALTER TABLE on both databases: a batch rebuild of `traces` on SQLite would drop the
    # table, and its steps with it (ON DELETE CASCADE).
    op.add_column("trace_steps", sa.Column("payload_crc", sa.BigInteger, nullable=True))
    for crc in _TRACE_CRCS.values():
        op.add_column("traces", sa.Column(crc, sa.BigInteger, nullable=True))
    bind = op.get_bind()
    _backfill(bind, "trace_steps", ("execution_id", "seq"), _STEP_CRCS)
    _backfill(bind, "traces", ("execution_id",), _TRACE_CRCS)


def _stored_text(bind, column: str) -> str:
    # PostgreSQL's json gives its text back verbatim through a cast; SQLite's column as it is
    # (a cast would spell a REAL its own way).
    return f"CAST({column} AS TEXT)" if bind.dialect.name == "postgresql" else column


def _backfill(bind, table: str, keys: tuple[str, ...], crcs: dict[str, str]) -> None:
    """Set every row's checksums from its stored values, `_BATCH` rows a statement, keyset over
    the primary key `keys`."""
    values = ", ".join(_stored_text(bind, c) for c in crcs)
    key_list = ", ".join(keys)
    after = f"({key_list}) > ({', '.join(':k_' + k for k in keys)})"
    update = sa.text(
        f"UPDATE {table} SET {', '.join(f'{crc} = :{crc}' for crc in crcs.values())} "
        f"WHERE {' AND '.join(f'{k} = :k_{k}' for k in keys)}"
    )
    last = None
    while True:
        where = f"WHERE {after} " if last is not None else ""
        rows = bind.execute(
            sa.text(f"SELECT {key_list}, {values} FROM {table} {where}ORDER BY {key_list} LIMIT {_BATCH}"),
            {} if last is None else {f"k_{k}": v for k, v in zip(keys, last)},
        ).all()
        if not rows:
            return
        params = []
        for r in rows:
            p = {f"k_{k}": v for k, v in zip(keys, r)}
            for crc, value in zip(crcs.values(), r[len(keys):]):
                p[crc] = checksums.of_stored(value)
            params.append(p)
        bind.execute(update, params)
        last = tuple(rows[-1][: len(keys)])


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 and later), for the reason in upgrade().
    for crc in _TRACE_CRCS.values():
        op.execute(f"ALTER TABLE traces DROP COLUMN {crc}")
    op.execute("ALTER TABLE trace_steps DROP COLUMN payload_crc")
