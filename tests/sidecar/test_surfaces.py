"""The sync and asyncio surfaces are one API: the same names, parameters, defaults and result
types, the asyncio ones awaited (an `async def`, or a `def` returning `Awaitable[X]` for X).

Compared: the recording clients (`Client`/`AsyncClient` and their execution handles) and the
embedded store (`Store`/`AsyncStore` and theirs), by `inspect.signature` on the classes
themselves, so that a parameter, a default or an annotation added to one side only fails here.
"""

from __future__ import annotations

import inspect
import re

import pytest

from tracedb.recorder import handles
from tracedb.sidecar import client as C
from tracedb.recorder.store import Execution as StoreExecution
from tracedb.recorder.store import Store, open_store
from tracedb.recorder.store_async import AsyncExecution as StoreAsyncExecution
from tracedb.recorder.store_async import AsyncStore, open_store_async

# What the sync store has that is not on the asyncio one: its engines, LSNs, WAL, redaction and
# the background compaction's last error. (The staging interface the asyncio store, the sidecar and
# OTLP ingest call is `store.staging`, an attribute, not in a class's `dir`.)
STORE_INTERNALS = {
    "engine", "read_engine", "applied_lsn", "durable_lsn", "redactor", "redact_for", "wal", "background_error",
}
# What only the asyncio store has: the sync store it wraps; and `config`, a property there and
# an attribute of the sync store (which `dir` of the class does not show).
ASYNC_STORE_ONLY = {"store", "config"}
# The context managers differ by name only (`__enter__` / `__aenter__`).
CONTEXT = {"__enter__", "__exit__", "__aenter__", "__aexit__"}


def public(cls) -> dict:
    """The public names of `cls` (its bases' included) and what each is."""
    return {
        name: inspect.getattr_static(cls, name)
        for name in dir(cls)
        if (not name.startswith("_") or name == "__init__") and name not in CONTEXT
        and not (name == "__init__" and inspect.getattr_static(cls, name) is object.__init__)
    }


def normal(annotation) -> str:
    """An annotation with the asyncio twins' names read as the sync ones', and `Awaitable[X]` as X."""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    text = text.replace('"', "").replace("'", "")
    m = re.fullmatch(r"Awaitable\[(.*)\]", text)
    if m:
        text = m.group(1)
    return re.sub(r"\bAsync(Client|Execution|Store)\b", r"\1", text)


def shape(member) -> tuple:
    """What a caller sees of a method or property: kind, then each parameter with its kind,
    default and annotation, then the result's annotation."""
    if isinstance(member, property):
        return ("property", normal(inspect.signature(member.fget).return_annotation))
    fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
    sig = inspect.signature(fn)
    params = tuple(
        (p.name, p.kind, repr(p.default), normal(p.annotation)) for p in sig.parameters.values()
    )
    return ("method", params, normal(sig.return_annotation))


def differences(sync_cls, async_cls, *, sync_only=(), async_only=()) -> list:
    """How the two classes' public surfaces differ, leaving out the names given (on both sides)."""
    sync, asyn = public(sync_cls), public(async_cls)
    found = []
    names = (set(sync) | set(asyn)) - set(sync_only) - set(async_only)
    for name in sorted(names):
        if name not in sync or name not in asyn:
            found.append((name, "only in " + (sync_cls if name in sync else async_cls).__name__))
        elif shape(sync[name]) != shape(asyn[name]):
            found.append((name, shape(sync[name]), shape(asyn[name])))
        elif not isinstance(sync[name], property) and name != "__init__":
            if inspect.iscoroutinefunction(sync[name]):
                found.append((name, "the sync one is a coroutine function"))
    return found


def awaited(cls, name) -> bool:
    """Whether calling `cls.name` gives something to await."""
    fn = inspect.getattr_static(cls, name)
    fn = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
    result = inspect.signature(fn).return_annotation
    text = result if isinstance(result, str) else inspect.formatannotation(result)
    return inspect.iscoroutinefunction(fn) or text.startswith("Awaitable[")


def test_the_sync_and_asyncio_clients_have_one_surface():
    # The asyncio client is made by an awaited classmethod with Client's own parameters.
    assert differences(C.Client, C.AsyncClient, async_only={"__init__", "create"}) == []
    init, create = shape(C.Client.__init__), shape(inspect.getattr_static(C.AsyncClient, "create"))
    assert init[1][1:] == create[1][1:]
    assert create[2] == "Client"


def test_the_sync_and_asyncio_execution_handles_have_one_surface():
    assert differences(C.Execution, C.AsyncExecution) == []
    assert differences(StoreExecution, StoreAsyncExecution, sync_only={"store"}, async_only={"astore"}) == []
    assert differences(handles.Execution, handles.AsyncExecution) == []


def test_the_sync_and_asyncio_stores_have_one_surface():
    # Each is made by its opener (the asyncio one wraps the sync store), and those match too.
    assert differences(Store, AsyncStore, sync_only=STORE_INTERNALS | {"__init__"}, async_only=ASYNC_STORE_ONLY) == []
    assert shape(open_store)[1] == shape(open_store_async)[1]
    assert (shape(open_store)[2], shape(open_store_async)[2]) == ("Store", "Store")


@pytest.mark.parametrize("sync_cls, async_cls", [
    (C.Client, C.AsyncClient), (C.Execution, C.AsyncExecution), (Store, AsyncStore),
    (StoreExecution, StoreAsyncExecution),
])
def test_every_asyncio_method_is_awaited_and_no_sync_one_is(sync_cls, async_cls):
    for name, member in public(async_cls).items():
        if isinstance(member, property) or name in ("__init__", "execution", "outage_stats"):
            continue
        if name not in public(sync_cls):
            continue
        assert awaited(async_cls, name), f"{async_cls.__name__}.{name} is not awaited"
        assert not awaited(sync_cls, name), f"{sync_cls.__name__}.{name} is awaited"


def test_an_outage_result_is_annotated_optional():
    # A fail-open client returns None for a record it dropped: the annotations say so.
    for cls in (C.Client, C.AsyncClient, C.Execution, C.AsyncExecution):
        for name in ("event", "finish"):
            assert normal(inspect.signature(getattr(cls, name)).return_annotation) == "Optional[int]", (cls, name)


def test_the_comparison_sees_a_parameter_added_to_one_side():
    class Sync:
        def event(self, execution_id: str, type: str, payload=None) -> int: ...

    class Async:
        async def event(self, execution_id: str, type: str, payload=None, extra: int = 0) -> int: ...

    class AsyncOther:
        async def event(self, execution_id: str, type: str, payload=None) -> str: ...

    assert differences(Sync, Async) and differences(Sync, AsyncOther)
