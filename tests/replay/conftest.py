"""Fixtures for the replay tests: records built by hand, and a real store on tmp_path."""

from __future__ import annotations

import pytest

from replay_helpers import build_record


@pytest.fixture
def record_factory():
    """build_record as a fixture."""
    return build_record
