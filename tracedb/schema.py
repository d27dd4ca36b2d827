"""The schema revision this code reads and writes: the newest of the Alembic revisions in
migrations/versions/. Kept apart from `tracedb.db` so that a read can check it without loading
SQLAlchemy."""

HEAD_REVISION = "0006"
