"""Alembic revisions of tracedb's schema; run them with `tracedb migrate` or `tracedb.projection.db.migrate`."""
