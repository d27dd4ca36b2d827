"""What an execution is and what the store accepts: records, values, their WAL encoding, the fold of records into rows (pure, no I/O)."""
