"""The projection of the WAL into SQLite or PostgreSQL: tables, engines, the compactor."""
