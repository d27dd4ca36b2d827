"""The README is the page a new user reads first, in five minutes: it stays short, and the
details live in docs/, where it links."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_readme_holds_at_most_300_lines():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move details to docs/ and link them"
