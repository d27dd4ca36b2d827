"""tracedb.projection.schema's column declarations, which every SELECT of the read path names its columns
from, are the tables the models declare and the migrations build (PostgreSQL: tests/pg)."""

from __future__ import annotations

import sqlalchemy as sa

from tracedb.projection import db
from tracedb.reads import reader as reads
from tracedb.projection import schema
from tracedb.reads import sqlite as sqlite_reads
from tracedb.projection.models import metadata


def declared_columns_match(engine) -> None:
    """Every table of `schema.TABLES` has exactly the declared columns, in the models and in the
    migrated database `engine`; the models have no table the declaration leaves out."""
    inspector = sa.inspect(engine)
    assert set(schema.TABLES) == set(metadata.tables)
    for name, columns in schema.TABLES.items():
        assert len(set(columns)) == len(columns), name
        assert tuple(c.name for c in metadata.tables[name].columns) == columns, name
        assert {c["name"] for c in inspector.get_columns(name)} == set(columns), name


def test_every_read_names_declared_columns():
    traces, steps = set(schema.TRACES), set(schema.TRACE_STEPS)
    assert sqlite_reads.TRACE_COLUMNS == schema.TRACES
    for read in (sqlite_reads.SUMMARY_COLUMNS, reads.RECORD_COLUMNS, sqlite_reads.JUDGED_COLUMNS):
        assert set(read) <= traces, set(read) - traces
    for read in (sqlite_reads.STEP_COLUMNS, reads.RECORD_STEP_COLUMNS, sqlite_reads.JUDGED_STEP_COLUMNS):
        assert set(read) <= steps, set(read) - steps
    assert schema.JSON_COLUMNS <= traces and schema.BOOL_COLUMNS <= traces


def test_the_declaration_matches_the_migrated_sqlite_schema(tmp_path):
    engine = db.create_engine(str(tmp_path / "t.db"), write=True)
    try:
        db.migrate(engine)
        declared_columns_match(engine)
    finally:
        engine.dispose()
