"""The schema this code reads and writes, readable without SQLAlchemy: the revision (the newest
of the Alembic revisions in migrations/versions/) and the columns of each table, by name. Kept
apart from `tracedb.projection.db` and `tracedb.projection.models` so that a read can check the revision and name its
columns without loading SQLAlchemy.

Every SELECT of `tracedb.reads.sqlite` and `tracedb.reads.reader` names its columns from these tuples and
builds its rows by name from them. The tables themselves are `tracedb.projection.models` and the migrations;
a test holds these tuples to both (SQLite and PostgreSQL)."""

HEAD_REVISION = "0010"

# Every column of `traces`, in the order of tracedb.projection.models.
TRACES = (
    "execution_id", "recorder_id", "intent", "status", "replayable", "replayable_reason", "status_note",
    "envelope", "envelope_hash", "router_decision", "final_response", "last_seq", "created_at_ns",
    "updated_at_ns", "parent_execution_id", "forked_at_seq", "pinned", "meta",
    "router_decision_crc", "final_response_crc", "meta_crc", "outcome", "error_seq", "error_type",
    "error_code", "error_message", "models", "input_tokens", "output_tokens", "cost_usd",
    "prices_version", "last_event_ns",
)
# Every column of `trace_steps`, in the order of tracedb.projection.models.
TRACE_STEPS = ("execution_id", "seq", "type", "payload", "recorded_at_ns", "lsn", "payload_crc")
# Every column of `compaction_checkpoint`, in the order of tracedb.projection.models.
COMPACTION_CHECKPOINT = ("recorder_id", "applied_lsn", "updated_at_ns")

TABLES = {"traces": TRACES, "trace_steps": TRACE_STEPS, "compaction_checkpoint": COMPACTION_CHECKPOINT}

# The `traces` columns that hold JSON, and those that hold booleans (SQLite hands back 0 or 1).
JSON_COLUMNS = frozenset({"envelope", "router_decision", "final_response", "meta", "models"})
BOOL_COLUMNS = frozenset({"replayable", "pinned"})
