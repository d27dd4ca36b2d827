import pytest


@pytest.fixture
def wal_dir(tmp_path):
    """A fresh directory for one WAL (created by the writer on open)."""
    return str(tmp_path / "wal")
