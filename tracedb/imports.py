"""A module imported when it is first used, not when the module that names it is: the lazy seams
that stand at a module's top.

    if TYPE_CHECKING:
        from tracedb.reads import sql as read_sql
    else:
        read_sql = on_first_use("tracedb.reads.sql")  # why it waits, in one line

The import under TYPE_CHECKING keeps the edge in sight of type checkers and readers. Every such
seam, and every import left inside a function, is named in tests/docs/test_lazy_seams.py, so that
none is added unnoticed; docs/modules.md says which they are and why.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class OnFirstUse:
    """Stands for the module `name`, which it imports at its first attribute read."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr: str):
        return getattr(self.module(), attr)

    def module(self) -> ModuleType:
        """The module itself, imported now if it was not yet (once: later reads skip the import
        machinery, which the read path would otherwise go through at every call)."""
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return module

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported at its first use>"


def on_first_use(name: str) -> OnFirstUse:
    """The module `name`, imported at its first attribute read."""
    return OnFirstUse(name)
