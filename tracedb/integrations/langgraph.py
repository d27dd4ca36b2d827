"""LangGraph checkpoints in tracedb's log: `TraceDBSaver`, a checkpointer whose every checkpoint
and pending write is durable in the WAL (group commit, fdatasync) before the call returns.

    from tracedb.integrations.langgraph import TraceDBSaver

    with tracedb.open("graph-traces") as store, TraceDBSaver(store) as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "chat-42"}})

It records through any recorder: `tracedb.open` / `tracedb.open_async` (embedded) or
`tracedb.client.connect` / `connect_async` (a running `tracedb serve`), with LangGraph's sync
calls (`invoke`, `stream`) and async ones (`ainvoke`, `astream`) alike.

**A run is an execution.** Each call of `invoke`/`stream` on a thread (LangGraph's own run: one
top-level Pregel loop, subgraphs included) is one execution, `lg-<thread>.<UUIDv7>`; its intent
is `langgraph:<thread_id>`, so a thread's runs list together (`tracedb inspect --list --intent
langgraph:ID`). Its envelope names the thread, why the run began (`input`, `resume`, `fork`,
`update`, `copy`, `delete`) and LangGraph's `run_id` when the config's metadata carries one.
Its events, in the order the graph made them:

    langgraph.checkpoint  {ns, checkpoint_id, parent_id, step, source, next, metadata,
                           values, typed, checkpoint_typed}   every checkpoint LangGraph saves
    langgraph.writes      {ns, checkpoint_id, task_id, task_path, node, writes, typed}
                                                          the writes a task made on a checkpoint
    langgraph.deleted     {scope} | {checkpoints}         delete_thread, delete_for_runs, prune
    FINAL_RESPONSE        {status, payload: {values, checkpoint_id, next, ...}}

A value that JSON holds exactly (dicts, lists, strings, numbers, booleans, null) is recorded as
it is, readable in `tracedb trace get`; any other (LangChain messages, tuples, datetimes, ...) as
LangGraph's serializer writes it (`typed`: type and base64). A run is finished (`completed`,
status `success`) by the checkpoint after which no node is triggered; a run that stopped with a
node waiting (an interrupt, `interrupt_before`, an error) is finished with status
`interrupted`, `error` or `stopped` when the thread's next run begins or the saver closes. A run
whose process died is `incomplete` (recovery, or `abandon` when the thread resumes elsewhere).

A run that continues from a checkpoint it did not take as the thread's latest new input (a resume
after an interrupt or a crash, a fork from an earlier checkpoint, `update_state`) is a tracedb
fork of the run that holds that checkpoint (`parent_execution_id`, `forked_at_seq`: the seq of
the last record of that checkpoint there), as `tracedb trace lineage ID` shows.

**Reads.** The saver keeps each thread it touched in memory, built from what it recorded, and
after a restart from the store: the thread's executions (a new thread ends at its id prefix;
others are found through the read API by intent, once the recorder has compacted everything
durable) replayed in order. `get_tuple` and `list` read that index. Deleting (`delete_thread`, `delete_for_runs`, `prune`) records a
`langgraph.deleted` event: LangGraph no longer sees those checkpoints; the recorded executions
stay in tracedb until `tracedb prune` removes them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import random
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import orjson

from tracedb.errors import (
    AmbiguousExecutionIdError,
    ExecutionClosedError,
    ExecutionNotFoundError,
    ExtraNotInstalledError,
    IntegrityError,
    InvalidInputError,
    UsageError,
)
from tracedb.config import load_config
from tracedb.reads.reader import Filter, Reader
from tracedb.records.ids import uuid7_hex
from tracedb.records.record import STATUS_RUNNING, ExecutionEvent
from tracedb.records.redaction import redact
from tracedb.integrations.recorded import is_async_recorder, on_loop

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.types import ERROR, INTERRUPT
except ModuleNotFoundError as e:
    raise ExtraNotInstalledError(__name__, "langgraph", e.name) from None

log = logging.getLogger(__name__)

INTENT_PREFIX = "langgraph:"
CHECKPOINT = "langgraph.checkpoint"
WRITES = "langgraph.writes"
DELETED = "langgraph.deleted"

# LangGraph's per-call runtime in a checkpoint's config; its `control` is shared by a call's
# subgraphs and made anew by each invoke/stream, so it tells one run from the next.
_RUNTIME_KEY = "__pregel_runtime"
# Channels whose update triggers a node in the next superstep (StateGraph edges and joins, the
# graph's input, Send): a checkpoint with none of them updated ends its run.
_TRIGGER_PREFIXES = ("branch:to:", "join:")
_TRIGGER_CHANNELS = frozenset({"__start__", "__pregel_tasks"})
# An id no execution is expected to have: `get` of it makes the recorder compact everything
# durable, so that the read API then sees the threads' executions.
_SYNC_PROBE = "langgraph~compact-probe"
_PASSTHROUGH = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def intent_of(thread_id: Any) -> str:
    """The intent of a thread's executions."""
    return INTENT_PREFIX + str(thread_id)


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def thread_prefix(thread_id: Any) -> str:
    """The start of the ids of a thread's executions: `lg-<thread id>.`, or, for a thread id
    that is not 1-64 letters, digits, '-' or '_', `lg-:<32 hex digits of its SHA-256>.`."""
    text = str(thread_id)
    if not _PLAIN_KEY.fullmatch(text):
        text = ":" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"lg-{text}."


def run_execution_id(thread_id: Any) -> str:
    """A new execution id of a thread: its prefix, then a UUIDv7 (time first, as tracedb's own)."""
    return thread_prefix(thread_id) + uuid7_hex()


def _refuse(value: Any) -> Any:
    raise TypeError


# -- values: as JSON where JSON holds them exactly, else the serializer's typed bytes ----------

# A stored value: ("json", bytes of its JSON) or (type, bytes) from `serde.dumps_typed`, or None
# for a channel version with no value ("empty", as LangGraph's own savers keep it).
Stored = Optional[tuple]


def _as_json(value: Any) -> Optional[bytes]:
    """The JSON of `value` if reading it back gives an equal value of the same types, else None."""
    try:
        data = orjson.dumps(value, option=_PASSTHROUGH, default=_refuse)
    except (TypeError, orjson.JSONEncodeError):
        return None
    try:
        return data if orjson.loads(data) == value else None
    except orjson.JSONDecodeError:
        return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _view(value: Any) -> Any:
    """A JSON view of a value for people (the final response): models as their fields."""

    def default(v: Any) -> Any:
        dump = getattr(v, "model_dump", None)
        if dump is not None:
            try:
                return dump(mode="json")
            except Exception:  # noqa: BLE001 - a view: fall back to the text
                return str(v)
        if isinstance(v, (set, frozenset, tuple)):
            return list(v)
        return str(v)

    try:
        return orjson.loads(orjson.dumps(value, default=default, option=orjson.OPT_NON_STR_KEYS))
    except (TypeError, orjson.JSONEncodeError):
        return str(value)


def _next_nodes(updated: Optional[Sequence[str]]) -> Optional[list]:
    """The nodes a checkpoint's updated channels trigger (None when LangGraph did not say)."""
    if updated is None:
        return None
    out = []
    for ch in updated:
        if ch.startswith("branch:to:"):
            out.append(ch[len("branch:to:"):])
        elif ch.startswith("join:"):
            out.append(ch.rsplit(":", 1)[-1])
        elif ch == "__start__":
            out.append("__start__")
        elif ch == "__pregel_tasks":
            out.append("(send)")
    return out


def _ends_run(updated: Optional[Sequence[str]]) -> bool:
    return updated is not None and not any(
        ch in _TRIGGER_CHANNELS or ch.startswith(_TRIGGER_PREFIXES) for ch in updated
    )


def _node_of(task_path: str) -> Optional[str]:
    parts = task_path.split(", ")
    if len(parts) >= 2 and parts[0] == "~__pregel_pull":
        return parts[1]
    return None


# -- the index of one thread -------------------------------------------------------------------


@dataclass
class _Run:
    """One execution of a thread: a run this saver records (`ours`) or one read from the store."""

    execution_id: str
    ours: bool
    status: str = STATUS_RUNNING
    call: Any = None  # LangGraph's RunControl of the call recording into it
    run_id: Optional[str] = None
    last_root: Optional[str] = None  # id of its last root-namespace checkpoint
    full_ns: set = field(default_factory=set)  # namespaces whose values it recorded whole
    inflight: int = 0
    closing: bool = False
    drained: Any = None  # an asyncio future a closing run's last record in flight resolves

    @property
    def open(self) -> bool:
        return self.ours and self.status == STATUS_RUNNING and not self.closing


@dataclass
class _Ckpt:
    ns: str
    id: str
    parent: Optional[str]
    doc: tuple  # the checkpoint without its channel values, stored as a value
    metadata: tuple
    md: dict  # the metadata, decoded: for list's filter
    execution_id: str
    seq: int


@dataclass
class _Write:
    task_id: str
    channel: str
    value: Stored
    task_path: str
    execution_id: str
    seq: int


class _Thread:
    """What the saver holds of one thread, guarded by `lock` (never held across a recorder call)."""

    def __init__(self, thread_id: str):
        self.thread_id = thread_id
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.loaded = False
        self.loading: Any = None  # an asyncio future while an async load runs
        self.starting = False  # a run is being started (sync)
        self.gate: Optional[asyncio.Future] = None  # a run is being started (async)
        self.ckpts: dict[str, dict[str, _Ckpt]] = {}
        self.blobs: dict[tuple, Stored] = {}
        self.writes: dict[tuple, dict[tuple, _Write]] = {}
        self.runs: dict[str, _Run] = {}
        self.stale: set[str] = set()  # executions of other processes still running
        self.open: Optional[_Run] = None
        self.heads: dict[str, str] = {}  # namespace -> its latest checkpoint id

    # reads
    def latest(self, ns: str) -> Optional[_Ckpt]:
        head = self.heads.get(ns)
        return None if head is None else self.ckpts[ns][head]

    def find(self, ns: str, checkpoint_id: Optional[str]) -> Optional[_Ckpt]:
        if checkpoint_id is None:
            return self.latest(ns)
        return self.ckpts.get(ns, {}).get(checkpoint_id)

    def fork_point(self, ck: _Ckpt) -> int:
        """The seq of the last record of checkpoint `ck` in the execution that holds it."""
        seq = ck.seq
        for w in self.writes.get((ck.ns, ck.id), {}).values():
            if w.execution_id == ck.execution_id and w.seq > seq:
                seq = w.seq
        return seq

    # changes (from a live call or replayed from the store)
    def add_checkpoint(self, ck: _Ckpt, blobs: dict) -> None:
        self.ckpts.setdefault(ck.ns, {})[ck.id] = ck
        self.blobs.update(blobs)
        head = self.heads.get(ck.ns)
        if head is None or ck.id > head:
            self.heads[ck.ns] = ck.id

    def add_writes(self, ns: str, checkpoint_id: str, items: list) -> None:
        """`items`: (key, _Write) with key (task_id, idx); a regular write is kept once, a
        special one (error, interrupt, ...) replaced, as LangGraph's savers do."""
        stored = self.writes.setdefault((ns, checkpoint_id), {})
        for key, w in items:
            if key[1] >= 0 and key in stored:
                continue
            stored[key] = w

    def new_writes(self, ns: str, checkpoint_id: str, task_id: str, writes) -> list:
        """(idx, channel, value) of `writes` that are not stored yet."""
        stored = self.writes.get((ns, checkpoint_id), {})
        out = []
        for idx, (channel, value) in enumerate(writes):
            i = WRITES_IDX_MAP.get(channel, idx)
            if i >= 0 and (task_id, i) in stored:
                continue
            out.append((i, channel, value))
        return out

    def delete(self, payload: dict) -> None:
        if payload.get("scope") == "thread":
            self.ckpts.clear()
            self.blobs.clear()
            self.writes.clear()
            self.heads.clear()
            return
        for ns, cid in payload.get("checkpoints") or ():
            self.ckpts.get(ns, {}).pop(cid, None)
            self.writes.pop((ns, cid), None)
        for ns, cps in list(self.ckpts.items()):
            if cps:
                self.heads[ns] = max(cps)
            else:
                del self.ckpts[ns]
                self.heads.pop(ns, None)


# -- encoding records --------------------------------------------------------------------------


class _Codec:
    def __init__(self, serde, readable: bool):
        self.serde = serde
        self.readable = readable

    def encode(self, value: Any, opaque: bool) -> tuple[tuple, bool, Any]:
        """`value` as kept in the index, and as recorded: (stored, True, the value itself) when
        JSON holds it exactly, else (stored, False, [type, base64])."""
        if self.readable and not opaque:
            data = _as_json(value)
            if data is not None:
                return ("json", data), True, value
        stored = self.serde.dumps_typed(value)
        return stored, False, [stored[0], _b64(stored[1])]

    def load(self, stored: tuple) -> Any:
        if stored[0] == "json":
            return orjson.loads(stored[1])
        return self.serde.loads_typed(stored)

    @staticmethod
    def recorded(stored: tuple) -> tuple[bool, Any]:
        """(True, the JSON value) or (False, [type, base64])."""
        if stored[0] == "json":
            return True, orjson.loads(stored[1])
        return False, [stored[0], _b64(stored[1])]

    @staticmethod
    def from_recorded(plain: bool, item: Any) -> tuple:
        if plain:
            return ("json", orjson.dumps(item))
        return (item[0], base64.b64decode(item[1]))


def _doc_field(payload: dict, name: str, plain: bool, item: Any) -> None:
    if plain:
        payload[name] = item
    else:
        payload[name + "_typed"] = item


def _checkpoint_payload(ck: _Ckpt, md_item: tuple, versions: dict, blobs: list, next_nodes, opaque: bool) -> dict:
    """The `langgraph.checkpoint` event of a checkpoint, its metadata as recorded (plain, item)
    and its values (channel, version, plain, item; plain None: the version has no value); a
    value at the version the checkpoint names is keyed by its channel, any other is listed with
    its version. `opaque`: no channel name as a key (what the store's key rules could rewrite)."""
    md = ck.md
    payload: dict = {
        "ns": ck.ns, "checkpoint_id": ck.id, "parent_id": ck.parent,
        "step": md.get("step"), "source": md.get("source"), "next": next_nodes,
    }
    _doc_field(payload, "checkpoint", *_Codec.recorded(ck.doc))
    _doc_field(payload, "metadata", *md_item)
    values: dict = {}
    typed: dict = {}
    other: list = []
    for ch, version, plain, item in blobs:
        if plain is None:
            other.append([ch, version, None])
            continue
        if opaque or versions.get(ch) != version:
            other.append([ch, version, "json" if plain else "typed", item])
        elif plain:
            values[ch] = item
        else:
            typed[ch] = item
    if opaque:
        payload["blobs"] = other
    else:
        payload["values"] = values
        if typed:
            payload["typed"] = typed
        if other:
            payload["blobs"] = other
    return payload


def _writes_payload(ns: str, checkpoint_id: str, task_id: str, task_path: str, items: list) -> dict:
    """`items`: (idx, channel, plain, item) as `_Codec.encode` records them."""
    writes = []
    typed = {}
    for i, (idx, channel, plain, item) in enumerate(items):
        if plain:
            writes.append([idx, channel, item])
        else:
            writes.append([idx, channel, None])
            typed[str(i)] = item
    payload = {
        "ns": ns, "checkpoint_id": checkpoint_id, "task_id": task_id, "task_path": task_path,
        "node": _node_of(task_path), "writes": writes,
    }
    if typed:
        payload["typed"] = typed
    return payload


def _replay(thread: _Thread, codec: _Codec, record) -> None:
    """Add to `thread` what one recorded execution holds."""
    eid = record.execution_id
    redacted = record.redacted_paths().get("events", {})
    for ev in record.events:
        if ev.type not in (CHECKPOINT, WRITES, DELETED):
            continue
        if redacted.get(ev.seq) or redacted.get(str(ev.seq)):
            raise IntegrityError(
                f"LangGraph {ev.type} event {ev.seq} of execution {eid!r} was rewritten by the "
                f"store's [redaction] rules; the checkpoints of thread {thread.thread_id!r} "
                "cannot be read back as LangGraph saved them",
                hint="give the intent `langgraph:<thread>` no redaction rules, or encrypt the "
                "graph's state with LangGraph's EncryptedSerializer",
            )
        p = ev.payload
        if ev.type == DELETED:
            thread.delete(p)
        elif ev.type == CHECKPOINT:
            ck, blobs = _checkpoint_from_payload(codec, p, eid, ev.seq)
            thread.add_checkpoint(ck, blobs)
        else:
            typed = p.get("typed") or {}
            items = []
            for i, (idx, channel, value) in enumerate(p["writes"]):
                t = typed.get(str(i))
                stored = _Codec.from_recorded(t is None, value if t is None else t)
                items.append(((p["task_id"], idx), _Write(p["task_id"], channel, stored, p.get("task_path") or "", eid, ev.seq)))
            thread.add_writes(p["ns"], p["checkpoint_id"], items)


def _checkpoint_from_payload(codec: _Codec, p: dict, eid: str, seq: int) -> tuple[_Ckpt, dict]:
    def doc(name):
        if name in p:
            return ("json", orjson.dumps(p[name]))
        return _Codec.from_recorded(False, p[name + "_typed"])

    d = doc("checkpoint")
    m = doc("metadata")
    ns = p["ns"]
    md = orjson.loads(m[1]) if m[0] == "json" else {"source": p.get("source"), "step": p.get("step")}
    ck = _Ckpt(ns, p["checkpoint_id"], p.get("parent_id"), d, m, md, eid, seq)
    blobs: dict = {}
    versions = codec.load(d).get("channel_versions", {})
    for ch, value in (p.get("values") or {}).items():
        blobs[(ns, ch, versions[ch])] = ("json", orjson.dumps(value))
    for ch, item in (p.get("typed") or {}).items():
        blobs[(ns, ch, versions[ch])] = _Codec.from_recorded(False, item)
    for entry in p.get("blobs") or ():
        ch, version, kind = entry[0], entry[1], entry[2]
        blobs[(ns, ch, version)] = None if kind is None else _Codec.from_recorded(kind == "json", entry[3])
    return ck, blobs


# -- what a call decides before it records -----------------------------------------------------


@dataclass
class _Start:
    """A run to start: the open run to close first, stale runs to abandon, its lineage."""

    reason: str
    envelope: dict
    close: Optional[_Run] = None
    close_response: Optional[dict] = None
    abandon: list = field(default_factory=list)
    parent: Optional[str] = None
    fork_seq: Optional[int] = None
    call: Any = None
    run_id: Optional[str] = None


def _call_of(config: RunnableConfig) -> Any:
    runtime = (config.get("configurable") or {}).get(_RUNTIME_KEY)
    return getattr(runtime, "control", None)


def _put_route(config: RunnableConfig, metadata: CheckpointMetadata) -> tuple[dict, dict]:
    """A checkpoint's metadata as LangGraph merges it, and what chooses the run that records the
    checkpoint (`_join`'s arguments)."""
    conf = config["configurable"]
    md = get_checkpoint_metadata(config, metadata)
    run_id = md.get("run_id")
    return md, dict(kind="put", ns=conf.get("checkpoint_ns", ""), call=_call_of(config), base=conf.get("checkpoint_id"),
                    source=md.get("source"), run_id=run_id if isinstance(run_id, str) else None)


def _response(thread: _Thread, codec: _Codec, run: _Run, status: Optional[str] = None) -> dict:
    """The final response of a run: the values of its last root checkpoint, and why it stopped."""
    ck = thread.find("", run.last_root) if run.last_root else None
    if ck is None:
        return {"status": status or "stopped", "payload": {}}
    doc = codec.load(ck.doc)
    values = {}
    for ch, version in doc.get("channel_versions", {}).items():
        stored = thread.blobs.get(("", ch, version))
        if stored is not None:
            values[ch] = _view(codec.load(stored))
    payload: dict = {
        "values": values, "checkpoint_id": ck.id, "step": ck.md.get("step"),
        "next": _next_nodes(doc.get("updated_channels")),
    }
    if status is None:
        pending = thread.writes.get(("", ck.id), {}).values()
        interrupts = []
        for w in pending:
            if w.channel == INTERRUPT and w.value:
                value = codec.load(w.value)
                interrupts += [_view(i) for i in value] if isinstance(value, (list, tuple)) else [_view(value)]
        errors = [_view(codec.load(w.value)) for w in pending if w.channel == ERROR and w.value]
        if interrupts:
            status, payload["interrupts"] = "interrupted", interrupts
        elif errors:
            status, payload["error"] = "error", errors[-1]
        else:
            status = "stopped"
    return {"status": status, "payload": payload}


class TraceDBSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over tracedb's record API (see the module doc).

    `recorder`: `tracedb.open(...)`, `await tracedb.open_async(...)`, `tracedb.client.connect()`
    or `await tracedb.client.connect_async()`. `reader`: a `tracedb.reads.reader.Reader` of the
    recorder's store, to find a thread's executions after a restart; by default the store's own
    database for an embedded store, and `Reader.open(config)` for a client (`config`: a
    `tracedb.Config`; None: `tracedb.config.load_config()`, the data directory the client
    defaults to). `max_threads`: threads kept in memory (the least recently used one without a
    run in progress is read again from the store when next needed).
    """

    def __init__(self, recorder: Any, *, reader: Any = None, config: Any = None, serde: Any = None,
                 max_threads: int = 10_000):
        super().__init__(serde=serde)
        self.recorder = recorder
        self._async = is_async_recorder(recorder)
        self._reader = reader
        self._owns_reader = False
        self._config = config
        self._codec = _Codec(self.serde, readable=serde is None)
        self._threads: OrderedDict[str, _Thread] = OrderedDict()
        self._lock = threading.Lock()
        self._max_threads = max_threads
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # The redaction rules the recorder applies, to see before recording what they would
        # rewrite: the embedded store's own; for a client, those of the data directory's
        # configuration, which a `tracedb serve` on it reads too.
        store = getattr(recorder, "store", recorder)
        if hasattr(store, "redact_for"):
            self._redactor = store.redactor
        else:
            if self._config is None:
                self._config = load_config()
            self._redactor = self._config.redactor()
        self._closed = False

    # -- plumbing --------------------------------------------------------------------------------

    def _get_reader(self):
        if self._reader is None:
            store = getattr(self.recorder, "store", self.recorder)
            engine = getattr(store, "engine", None) if hasattr(store, "compact") else None
            if engine is not None:
                self._reader = Reader(engine)
            else:
                self._reader = Reader.open(self._config)
                self._owns_reader = True
        return self._reader

    def _on_loop(self, make):
        """Run an awaitable of the asyncio recorder from a sync call (on another thread)."""
        loop = self._loop
        if loop is None:
            raise UsageError(
                "a sync call of TraceDBSaver over an asyncio recorder before any async call",
                hint="call the graph with `ainvoke`/`astream`, or give the saver a sync recorder "
                "(`tracedb.open`, `tracedb.client.connect`)",
            )
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise UsageError(
                "a sync call of TraceDBSaver on the event loop of its asyncio recorder would block it",
                hint="use the graph's async methods (`ainvoke`, `astream`) on this loop",
            )
        return on_loop(loop, make)

    def _note_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    def _thread_obj(self, thread_id: str) -> _Thread:
        with self._lock:
            t = self._threads.get(thread_id)
            if t is None:
                t = self._threads[thread_id] = _Thread(thread_id)
                self._evict()
            else:
                self._threads.move_to_end(thread_id)
            return t

    def _evict(self) -> None:
        excess = len(self._threads) - self._max_threads
        if excess <= 0:
            return
        for tid in list(self._threads)[:excess]:
            t = self._threads[tid]
            if t.open is None and not t.starting and t.gate is None and t.loading is None:
                del self._threads[tid]

    def _thread_ids_in_store(self) -> list[str]:
        reader = self._get_reader()
        seen: dict[str, None] = {}
        for row in reader.each(Filter(search=INTENT_PREFIX), judge=False):
            if row.intent.startswith(INTENT_PREFIX):
                seen[row.intent[len(INTENT_PREFIX):]] = None
        return list(seen)

    def _execution_ids(self, thread_id: str) -> list[str]:
        """A thread's executions in the store, oldest first."""
        reader = self._get_reader()
        # A new thread (the common case) is known by its id prefix, an index range; only a
        # thread with executions is looked for by its intent, which no index serves.
        try:
            reader.resolve(thread_prefix(thread_id))
        except ExecutionNotFoundError:
            return []
        except AmbiguousExecutionIdError:
            pass
        rows = list(reader.each(Filter(intent=intent_of(thread_id)), judge=False))
        rows.sort(key=lambda r: (r.created_at_ns, r.execution_id))
        return [r.execution_id for r in rows]

    # -- loading a thread from the store ---------------------------------------------------------

    def _thread(self, thread_id: str) -> _Thread:
        if self._async:
            return self._on_loop(lambda: self._athread(thread_id))
        t = self._thread_obj(thread_id)
        if t.loaded:
            return t
        with t.lock:
            while t.loading is not None:
                t.cond.wait()
            if t.loaded:
                return t
            t.loading = True
        try:
            self._compact_recorder()
            records = [self.recorder.get(eid) for eid in self._execution_ids(thread_id)]
            self._apply_loaded(t, records)
        finally:
            with t.lock:
                t.loading = None
                t.cond.notify_all()
        return t

    def _compact_recorder(self) -> None:
        try:
            self.recorder.get(_SYNC_PROBE)
        except ExecutionNotFoundError:
            pass

    async def _acompact_recorder(self) -> None:
        try:
            await self.recorder.get(_SYNC_PROBE)
        except ExecutionNotFoundError:
            pass

    async def _athread(self, thread_id: str) -> _Thread:
        self._note_loop()
        if not self._async:
            return await asyncio.to_thread(self._thread, thread_id)
        t = self._thread_obj(thread_id)
        while not t.loaded:
            if t.loading is not None:
                await asyncio.shield(t.loading)
                continue
            t.loading = asyncio.get_running_loop().create_future()
            try:
                await self._aload(t)
            finally:
                fut, t.loading = t.loading, None
                fut.set_result(None)
        return t

    async def _aload(self, t: _Thread) -> None:
        await self._acompact_recorder()
        ids = await asyncio.to_thread(self._execution_ids, t.thread_id)
        records = [await self.recorder.get(eid) for eid in ids]
        self._apply_loaded(t, records)

    def _apply_loaded(self, t: _Thread, records: list) -> None:
        with t.lock:
            for record in records:
                _replay(t, self._codec, record)
                run = _Run(record.execution_id, ours=False, status=record.status)
                t.runs[run.execution_id] = run
                if run.status == STATUS_RUNNING:
                    t.stale.add(run.execution_id)
            t.loaded = True

    # -- deciding where a record goes ------------------------------------------------------------

    def _route(self, t: _Thread, *, kind: str, ns: str, call: Any, base: Optional[str],
               source: Optional[str] = None, run_id: Optional[str] = None):
        """The open run a record joins, or the `_Start` of a new one (t.lock held)."""
        run = t.open
        if run is not None and run.open:
            if call is not None or run.call is not None:
                if call is not None and run.call is call:
                    return run
            elif not (
                (kind == "put" and ns == "" and source in ("input", "update", "fork") and run.last_root is not None)
                or (run_id is not None and run.run_id is not None and run_id != run.run_id)
            ):
                if run_id is not None and run.run_id is None:
                    run.run_id = run_id
                return run
        if kind == "writes" and call is None:
            # Writes from no Pregel call: `update_state` stores its writes before its checkpoint.
            reason = "update"
        else:
            reason = {"input": "input", "update": "update", "fork": "fork"}.get(source or "", "resume")
        start = _Start(reason=reason, envelope={}, call=call, run_id=run_id)
        if run is not None and run.open:
            start.close = run
            start.close_response = _response(t, self._codec, run)
        start.abandon = list(t.stale)
        base_ck = t.find(ns, base) if base is not None else None
        if base_ck is None and base is not None and ns != "":
            base_ck = t.latest("")
        latest = t.latest(base_ck.ns) if base_ck is not None else None
        if base_ck is not None and (reason != "input" or latest is not base_ck):
            start.parent = base_ck.execution_id
            start.fork_seq = t.fork_point(base_ck)
        envelope = {"intent": intent_of(t.thread_id), "thread_id": t.thread_id, "reason": reason}
        if run_id is not None:
            envelope["run_id"] = run_id
        if base_ck is not None:
            envelope["from_checkpoint"] = base_ck.id
        previous = t.latest("")
        if previous is not None:
            envelope["previous_execution"] = previous.execution_id
        start.envelope = envelope
        return start

    def _new_run(self, t: _Thread, start: _Start, execution_id: str) -> _Run:
        run = _Run(execution_id, ours=True, call=start.call, run_id=start.run_id)
        t.runs[execution_id] = run
        t.open = run
        return run

    def _check_redaction(self, intent: str, payload: dict) -> bool:
        """True when the store would record `payload` as it is."""
        if self._redactor is None:
            return True
        rules = self._redactor.for_intent(intent)
        if rules is None or not rules.might_match(payload):
            return True
        return not redact(payload, rules)[1]

    # -- sync recording ----------------------------------------------------------------------------

    def _join(self, t: _Thread, **route) -> _Run:
        """The run a record goes into, started if need be; its `inflight` counted."""
        while True:
            with t.lock:
                got = self._route(t, **route)
                if isinstance(got, _Run):
                    got.inflight += 1
                    return got
                if t.starting:
                    t.cond.wait()
                    continue
                t.starting = True
                if got.close is not None:
                    got.close.closing = True
            try:
                self._start_run(t, got)
            finally:
                with t.lock:
                    t.starting = False
                    t.cond.notify_all()

    def _start_run(self, t: _Thread, start: _Start) -> None:
        if start.close is not None:
            self._finish_run(t, start.close, start.close_response)
        for eid in start.abandon:
            self._abandon(t, eid)
        try:
            ex = self.recorder.start(intent_of(t.thread_id), start.envelope, run_execution_id(t.thread_id),
                                     parent_execution_id=start.parent, forked_at_seq=start.fork_seq)
        except (ExecutionNotFoundError, InvalidInputError):
            if start.parent is None:
                raise
            # The run it continues was pruned meanwhile: the new one goes without a parent.
            ex = self.recorder.start(intent_of(t.thread_id), start.envelope, run_execution_id(t.thread_id))
        with t.lock:
            self._new_run(t, start, ex.execution_id)

    def _abandon(self, t: _Thread, eid: str) -> None:
        try:
            self.recorder.abandon(eid, "LangGraph continued its thread in a new run")
        except (ExecutionClosedError, ExecutionNotFoundError):
            pass
        with t.lock:
            t.runs[eid].status = "incomplete"
            t.stale.discard(eid)

    def _finish_run(self, t: _Thread, run: _Run, response: dict) -> None:
        with t.lock:
            run.closing = True
            while run.inflight:
                t.cond.wait()
            if t.open is run:
                t.open = None
        try:
            self.recorder.finish(run.execution_id, response)
            status = "completed"
        except ExecutionClosedError as e:
            status = e.status
        with t.lock:
            run.status = status
            run.call = None

    def _record(self, t: _Thread, run: _Run, type_: str, payload: dict) -> int:
        try:
            return self.recorder.event(run.execution_id, type_, payload)
        finally:
            self._leave(t, run)

    @staticmethod
    def _leave(t: _Thread, run: _Run) -> None:
        """A record counted in `run.inflight` is recorded, or will not be."""
        with t.lock:
            run.inflight -= 1
            if run.inflight == 0:
                t.cond.notify_all()

    def _closed_meanwhile(self, t: _Thread, run: _Run, e: ExecutionClosedError) -> None:
        """The store closed a run under us (idle timeout, an operator): the record goes to a new one."""
        log.warning("LangGraph run %s was closed by the store (%s); continuing in a new run",
                    run.execution_id, e.status)
        with t.lock:
            run.status = e.status
            if t.open is run:
                t.open = None

    def _record_built(self, t: _Thread, run: _Run, type_: str, build, *args) -> Optional[tuple[tuple, int]]:
        """Record in `run` (joined: counted in `run.inflight`) what `build(t, run, *args)` makes
        (its parts, the payload last): the parts and the seq, or None when the store closed the run
        meanwhile (the caller joins another). A record that cannot be built leaves the run."""
        try:
            parts = build(t, run, *args)
        except BaseException:
            self._leave(t, run)
            raise
        try:
            return parts, self._record(t, run, type_, parts[-1])
        except ExecutionClosedError as e:
            self._closed_meanwhile(t, run, e)
            return None

    # -- the BaseCheckpointSaver API (sync) --------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        """The checkpoint `config` names (its `checkpoint_id`, else the thread's latest)."""
        if self._async:
            return self._on_loop(lambda: self.aget_tuple(config))
        t = self._thread(config["configurable"]["thread_id"])
        return self._tuple_of(t, config)

    def list(self, config: Optional[RunnableConfig], *, filter: Optional[dict[str, Any]] = None,
             before: Optional[RunnableConfig] = None, limit: Optional[int] = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of `config`'s thread (and namespace, and checkpoint id, if it
        names them), or of every LangGraph thread in the store when `config` is None."""
        if self._async:
            return iter(self._on_loop(lambda: self._alist_all(config, filter, before, limit)))
        if config is None:
            ids = self._all_thread_ids()
            threads = [self._thread(tid) for tid in ids]
        else:
            threads = [self._thread(config["configurable"]["thread_id"])]
        return iter(self._listed(threads, config, filter, before, limit))

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Record a checkpoint; returns once it is durable in the WAL."""
        if self._async:
            return self._on_loop(lambda: self.aput(config, checkpoint, metadata, new_versions))
        conf = config["configurable"]
        t = self._thread(conf["thread_id"])
        ns, parent = conf.get("checkpoint_ns", ""), conf.get("checkpoint_id")
        md, route = _put_route(config, metadata)
        for _ in range(2):
            run = self._join(t, **route)
            built = self._record_built(t, run, CHECKPOINT, self._put_record, ns, parent, checkpoint, md, new_versions)
            if built is None:
                continue
            (ck, blobs, done, _payload), seq = built
            self._after_put(t, run, ck, blobs, seq)
            if done:
                self._finish_run(t, run, _response(t, self._codec, run, "success"))
            return self._config_of(conf["thread_id"], ns, checkpoint["id"])
        raise ExecutionClosedError(run.execution_id, run.status)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Record the writes a task made on a checkpoint; returns once they are durable."""
        if self._async:
            return self._on_loop(lambda: self.aput_writes(config, writes, task_id, task_path))
        conf = config["configurable"]
        t = self._thread(conf["thread_id"])
        ns, cid = conf.get("checkpoint_ns", ""), conf["checkpoint_id"]
        for _ in range(2):
            with t.lock:
                items = t.new_writes(ns, cid, task_id, writes)
            if not items:
                return
            run = self._join(t, kind="writes", ns=ns, call=_call_of(config), base=cid)
            built = self._record_built(t, run, WRITES, self._writes_record, ns, cid, task_id, task_path, items)
            if built is None:
                continue
            (stored, _payload), seq = built
            self._after_writes(t, run, ns, cid, task_id, task_path, stored, seq)
            return
        raise ExecutionClosedError(run.execution_id, run.status)

    def delete_thread(self, thread_id: str) -> None:
        """Hide every checkpoint and write of a thread from LangGraph (recorded: see module doc)."""
        self._delete(thread_id, {"scope": "thread"}, "delete")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Hide the checkpoints (and their writes) whose metadata `run_id` is one of `run_ids`."""
        if not run_ids:
            return
        if self._async:
            return self._on_loop(lambda: self.adelete_for_runs(run_ids))
        wanted = set(run_ids)
        for tid in self._all_thread_ids():
            t = self._thread(tid)
            with t.lock:
                gone = [[c.ns, c.id] for cps in t.ckpts.values() for c in cps.values() if c.md.get("run_id") in wanted]
            if gone:
                self._delete(tid, {"checkpoints": gone}, "delete")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread into another, in one execution of the target."""
        if self._async:
            return self._on_loop(lambda: self.acopy_thread(source_thread_id, target_thread_id))
        src = self._thread(source_thread_id)
        dst = self._thread(target_thread_id)
        plan = self._copy_plan(src, dst)
        if plan is None:
            return
        start, events = plan
        with dst.lock:
            got = self._route(dst, kind="copy", ns="", call=object(), base=None)
        if got.close is not None:
            self._finish_run(dst, got.close, got.close_response)
        ex = self.recorder.start(intent_of(target_thread_id), start.envelope, run_execution_id(target_thread_id),
                                 parent_execution_id=start.parent, forked_at_seq=start.fork_seq)
        seqs = [self.recorder.event(ex.execution_id, type_, p) for type_, p in events]
        self._after_copy(dst, ex.execution_id, events, seqs)
        self.recorder.finish(ex.execution_id, {"status": "success", "payload": {"copied_from": source_thread_id}})
        with dst.lock:
            dst.runs[ex.execution_id] = _Run(ex.execution_id, ours=True, status="completed")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`keep_latest`: hide all but each namespace's latest checkpoint; `delete`: everything."""
        if self._async:
            return self._on_loop(lambda: self.aprune(thread_ids, strategy=strategy))
        for tid in thread_ids:
            payload = self._prune_payload(self._thread(tid), strategy)
            if payload is not None:
                self._delete(tid, payload, "prune")

    def _delete(self, thread_id: str, payload: dict, reason: str) -> None:
        if self._async:
            return self._on_loop(lambda: self._adelete(thread_id, payload, reason))
        t = self._thread(thread_id)
        with t.lock:
            if not t.ckpts and not t.writes:
                return
            run = t.open
        if run is not None and run.open:
            with t.lock:
                response = _response(t, self._codec, run)
            self._finish_run(t, run, response)
        envelope = {"intent": intent_of(thread_id), "thread_id": thread_id, "reason": reason}
        ex = self.recorder.start(intent_of(thread_id), envelope, run_execution_id(thread_id))
        self.recorder.event(ex.execution_id, DELETED, payload)
        with t.lock:
            t.delete(payload)
        self.recorder.finish(ex.execution_id, {"status": "success", "payload": payload})
        with t.lock:
            t.runs[ex.execution_id] = _Run(ex.execution_id, ours=True, status="completed")

    def _all_thread_ids(self) -> list[str]:
        with self._lock:
            known = list(self._threads)
        return list(dict.fromkeys(known + self._thread_ids_in_store()))

    def close(self) -> None:
        """Finish the runs still open (a graph waiting on an interrupt: `interrupted`)."""
        if self._async:
            return self._on_loop(self.aclose)
        if self._closed:
            return
        self._closed = True
        for t in list(self._threads.values()):
            with t.lock:
                run = t.open
                if run is None or not run.open:
                    continue
                response = _response(t, self._codec, run)
            try:
                self._finish_run(t, run, response)
            except Exception as e:  # noqa: BLE001 - close every thread it can
                log.error("cannot finish LangGraph run %s: %s", run.execution_id, e)
        if self._owns_reader and self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> "TraceDBSaver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- records, shared by both paths -------------------------------------------------------------

    def _put_record(self, t: _Thread, run: _Run, ns: str, parent: Optional[str], checkpoint: Checkpoint,
                    md: dict, new_versions: ChannelVersions):
        """A checkpoint's record: the checkpoint as held, its stored values, whether it ends the
        run, and the payload recorded (last, for `_record_built`)."""
        codec = self._codec
        doc = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values = checkpoint["channel_values"]
        versions = checkpoint.get("channel_versions", {})
        # The first checkpoint of a run in a namespace carries every value: a run reads back
        # whole even once `tracedb prune` removed the runs before it.
        whole = ns not in run.full_ns
        chosen = {ch: versions[ch] for ch in versions} if whole else {}
        chosen.update(new_versions)
        updated = checkpoint.get("updated_channels")
        next_nodes = _next_nodes(updated)
        intent = intent_of(t.thread_id)
        # The checkpoint's own bookkeeping (channel versions, the versions each node saw) in the
        # serializer's form: not for reading, and the bulk of a checkpoint's keys, which the
        # store's checks walk otherwise.
        stored_doc = codec.serde.dumps_typed(doc)
        for opaque in (False, True):
            stored: dict = {}
            blobs = []
            for ch, v in chosen.items():
                if ch in values:
                    st, plain, item = codec.encode(values[ch], opaque)
                else:
                    st, plain, item = None, None, None
                stored[(ns, ch, v)] = st
                blobs.append((ch, v, plain, item))
            md_stored, *md_item = codec.encode(md, opaque)
            ck = _Ckpt(ns, checkpoint["id"], parent, stored_doc, md_stored, md, run.execution_id, 0)
            payload = _checkpoint_payload(ck, md_item, versions, blobs, next_nodes, opaque)
            if self._check_redaction(intent, payload):
                break
        else:
            raise InvalidInputError(
                f"the store's [redaction] rules would rewrite checkpoint {checkpoint['id']} of thread "
                f"{t.thread_id!r}: it could not be read back as LangGraph saved it",
                hint="give the intent `langgraph:<thread>` no redaction patterns that match it, or "
                "encrypt the graph's state with LangGraph's EncryptedSerializer",
            )
        run.full_ns.add(ns)
        done = ns == "" and (md.get("source") == "update" or _ends_run(updated))
        return ck, stored, done, payload

    def _after_put(self, t: _Thread, run: _Run, ck: _Ckpt, blobs: dict, seq: int) -> None:
        ck.seq = seq
        with t.lock:
            t.add_checkpoint(ck, blobs)
            if ck.ns == "":
                run.last_root = ck.id

    def _writes_record(self, t: _Thread, run: _Run, ns: str, cid: str, task_id: str, task_path: str, items):
        """A task's writes' record: the writes as stored, and the payload recorded (last, for
        `_record_built`)."""
        codec = self._codec
        intent = intent_of(t.thread_id)
        for opaque in (False, True):
            encoded = [(idx, ch, *codec.encode(v, opaque)) for idx, ch, v in items]
            payload = _writes_payload(ns, cid, task_id, task_path, [(i, ch, p, it) for i, ch, _, p, it in encoded])
            if self._check_redaction(intent, payload):
                return [(i, ch, st) for i, ch, st, _, _ in encoded], payload
        raise InvalidInputError(
            f"the store's [redaction] rules would rewrite the writes of task {task_id} in thread "
            f"{t.thread_id!r}: they could not be read back as LangGraph saved them",
            hint="give the intent `langgraph:<thread>` no redaction patterns that match them, or "
            "encrypt the graph's state with LangGraph's EncryptedSerializer",
        )

    def _after_writes(self, t: _Thread, run: _Run, ns: str, cid: str, task_id: str, task_path: str,
                      stored: list, seq: int) -> None:
        with t.lock:
            t.add_writes(ns, cid, [((task_id, idx), _Write(task_id, ch, s, task_path, run.execution_id, seq))
                                   for idx, ch, s in stored])

    @staticmethod
    def _config_of(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}

    def _tuple_of(self, t: _Thread, config: RunnableConfig) -> Optional[CheckpointTuple]:
        conf = config["configurable"]
        with t.lock:
            ck = t.find(conf.get("checkpoint_ns", ""), get_checkpoint_id(config))
            if ck is None:
                return None
            return self._tuple(t, ck)

    def _tuple(self, t: _Thread, ck: _Ckpt) -> CheckpointTuple:
        codec = self._codec
        checkpoint = codec.load(ck.doc)
        values = {}
        for ch, version in checkpoint.get("channel_versions", {}).items():
            stored = t.blobs.get((ck.ns, ch, version))
            if stored is not None:
                values[ch] = codec.load(stored)
        checkpoint["channel_values"] = values
        writes = t.writes.get((ck.ns, ck.id), {})
        pending = [
            (w.task_id, w.channel, codec.load(w.value) if w.value is not None else None)
            for key, w in sorted(writes.items(), key=lambda kv: writes_sort_key(kv[1].task_path, kv[0][0], kv[0][1]))
        ]
        return CheckpointTuple(
            config=self._config_of(t.thread_id, ck.ns, ck.id),
            checkpoint=checkpoint,
            metadata=codec.load(ck.metadata),
            parent_config=self._config_of(t.thread_id, ck.ns, ck.parent) if ck.parent else None,
            pending_writes=pending,
        )

    def _listed(self, threads: list, config, filter, before, limit) -> list:
        conf = (config or {}).get("configurable", {})
        want_ns = conf.get("checkpoint_ns") if config else None
        want_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        out = []
        for t in threads:
            with t.lock:
                for ns, cps in t.ckpts.items():
                    if want_ns is not None and ns != want_ns:
                        continue
                    for cid in sorted(cps, reverse=True):
                        if want_id and cid != want_id:
                            continue
                        if before_id and cid >= before_id:
                            continue
                        ck = cps[cid]
                        if filter and not all(ck.md.get(k) == v for k, v in filter.items()):
                            continue
                        if limit is not None and len(out) >= limit:
                            return out
                        out.append(self._tuple(t, ck))
        return out

    def _copy_plan(self, src: _Thread, dst: _Thread):
        with src.lock:
            latest = src.latest("")
            if latest is None and not src.ckpts:
                return None
            events = []
            for ns in sorted(src.ckpts):
                for cid in sorted(src.ckpts[ns]):
                    ck = src.ckpts[ns][cid]
                    versions = self._codec.load(ck.doc).get("channel_versions", {})
                    blobs = []
                    for ch, v in versions.items():
                        if (ns, ch, v) in src.blobs:
                            st = src.blobs[(ns, ch, v)]
                            blobs.append((ch, v, *(_Codec.recorded(st) if st is not None else (None, None))))
                    md_item = _Codec.recorded(ck.metadata)
                    events.append((CHECKPOINT, _checkpoint_payload(ck, md_item, versions, blobs, None, False)))
                    by_task: dict = {}
                    for (task_id, idx), w in src.writes.get((ns, cid), {}).items():
                        by_task.setdefault((task_id, w.task_path), []).append((idx, w.channel, *_Codec.recorded(w.value)))
                    for (task_id, path), items in by_task.items():
                        events.append((WRITES, _writes_payload(ns, cid, task_id, path, items)))
            anchor = latest or next(iter(next(iter(src.ckpts.values())).values()))
            start = _Start(reason="copy", envelope={
                "intent": intent_of(dst.thread_id), "thread_id": dst.thread_id, "reason": "copy",
                "from_thread": src.thread_id,
            }, parent=anchor.execution_id, fork_seq=src.fork_point(anchor))
        return start, events

    def _after_copy(self, dst: _Thread, eid: str, events: list, seqs: list) -> None:
        class _Copied:
            execution_id = eid
            status = "completed"

            def __init__(self):
                self.events = [ExecutionEvent(s, ty, p) for s, (ty, p) in zip(seqs, events)]

            def redacted_paths(self):
                return {}

        with dst.lock:
            _replay(dst, self._codec, _Copied())

    @staticmethod
    def _prune_payload(t: _Thread, strategy: str) -> Optional[dict]:
        if strategy == "delete":
            return {"scope": "thread"} if t.ckpts else None
        if strategy != "keep_latest":
            raise InvalidInputError(f"unknown prune strategy {strategy!r}", hint="keep_latest or delete")
        with t.lock:
            gone = [[ns, cid] for ns, cps in t.ckpts.items() for cid in sorted(cps)[:-1]]
        return {"checkpoints": gone} if gone else None

    # -- the BaseCheckpointSaver API (async) -------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        """`get_tuple`, awaited."""
        t = await self._athread(config["configurable"]["thread_id"])
        return self._tuple_of(t, config)

    async def alist(self, config: Optional[RunnableConfig], *, filter: Optional[dict[str, Any]] = None,
                    before: Optional[RunnableConfig] = None, limit: Optional[int] = None) -> AsyncIterator[CheckpointTuple]:
        """`list`, as an async iterator."""
        for item in await self._alist_all(config, filter, before, limit):
            yield item

    async def _alist_all(self, config, filter, before, limit) -> list:
        if config is None:
            self._note_loop()
            ids = await self._aall_thread_ids()
            threads = [await self._athread(tid) for tid in ids]
        else:
            threads = [await self._athread(config["configurable"]["thread_id"])]
        return self._listed(threads, config, filter, before, limit)

    async def _aall_thread_ids(self) -> list[str]:
        with self._lock:
            known = list(self._threads)
        if self._async:
            await self._acompact_recorder()
        else:
            await asyncio.to_thread(self._compact_recorder)
        return list(dict.fromkeys(known + await asyncio.to_thread(self._thread_ids_in_store)))

    async def _ajoin(self, t: _Thread, **route) -> _Run:
        while True:
            got = self._route(t, **route)
            if isinstance(got, _Run):
                got.inflight += 1
                return got
            if t.gate is not None:
                await asyncio.shield(t.gate)
                continue
            gate = t.gate = asyncio.get_running_loop().create_future()
            if got.close is not None:
                got.close.closing = True
            try:
                await self._astart_run(t, got)
            finally:
                t.gate = None
                gate.set_result(None)

    async def _astart_run(self, t: _Thread, start: _Start) -> None:
        if start.close is not None:
            await self._afinish_run(t, start.close, start.close_response)
        for eid in start.abandon:
            try:
                await self.recorder.abandon(eid, "LangGraph continued its thread in a new run")
            except (ExecutionClosedError, ExecutionNotFoundError):
                pass
            t.runs[eid].status = "incomplete"
            t.stale.discard(eid)
        try:
            ex = await self.recorder.start(intent_of(t.thread_id), start.envelope, run_execution_id(t.thread_id),
                                           parent_execution_id=start.parent, forked_at_seq=start.fork_seq)
        except (ExecutionNotFoundError, InvalidInputError):
            if start.parent is None:
                raise
            ex = await self.recorder.start(intent_of(t.thread_id), start.envelope, run_execution_id(t.thread_id))
        self._new_run(t, start, ex.execution_id)

    async def _afinish_run(self, t: _Thread, run: _Run, response: dict) -> None:
        run.closing = True
        while run.inflight:
            run.drained = asyncio.get_running_loop().create_future()
            await run.drained
        if t.open is run:
            t.open = None
        try:
            await self.recorder.finish(run.execution_id, response)
            run.status = "completed"
        except ExecutionClosedError as e:
            run.status = e.status
        run.call = None

    async def _arecord_built(self, t: _Thread, run: _Run, type_: str, build, *args) -> Optional[tuple[tuple, int]]:
        """`_record_built` on the recorder's event loop."""
        try:
            parts = build(t, run, *args)
        except BaseException:
            self._aleave(run)
            raise
        try:
            return parts, await self._arecord(run, type_, parts[-1])
        except ExecutionClosedError as e:
            self._closed_meanwhile(t, run, e)
            return None

    async def _arecord(self, run: _Run, type_: str, payload: dict) -> int:
        try:
            return await self.recorder.event(run.execution_id, type_, payload)
        finally:
            self._aleave(run)

    @staticmethod
    def _aleave(run: _Run) -> None:
        run.inflight -= 1
        if run.inflight == 0 and run.drained is not None and not run.drained.done():
            run.drained.set_result(None)

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        """`put`, awaited: returns once the checkpoint is durable."""
        if not self._async:
            self._note_loop()
            return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)
        conf = config["configurable"]
        t = await self._athread(conf["thread_id"])
        ns, parent = conf.get("checkpoint_ns", ""), conf.get("checkpoint_id")
        md, route = _put_route(config, metadata)
        for _ in range(2):
            run = await self._ajoin(t, **route)
            built = await self._arecord_built(t, run, CHECKPOINT, self._put_record, ns, parent, checkpoint, md,
                                              new_versions)
            if built is None:
                continue
            (ck, blobs, done, _payload), seq = built
            self._after_put(t, run, ck, blobs, seq)
            if done:
                await self._afinish_run(t, run, _response(t, self._codec, run, "success"))
            return self._config_of(conf["thread_id"], ns, checkpoint["id"])
        raise ExecutionClosedError(run.execution_id, run.status)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        """`put_writes`, awaited: returns once the writes are durable."""
        if not self._async:
            self._note_loop()
            return await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)
        conf = config["configurable"]
        t = await self._athread(conf["thread_id"])
        ns, cid = conf.get("checkpoint_ns", ""), conf["checkpoint_id"]
        for _ in range(2):
            items = t.new_writes(ns, cid, task_id, writes)
            if not items:
                return
            run = await self._ajoin(t, kind="writes", ns=ns, call=_call_of(config), base=cid)
            built = await self._arecord_built(t, run, WRITES, self._writes_record, ns, cid, task_id, task_path, items)
            if built is None:
                continue
            (stored, _payload), seq = built
            self._after_writes(t, run, ns, cid, task_id, task_path, stored, seq)
            return
        raise ExecutionClosedError(run.execution_id, run.status)

    async def adelete_thread(self, thread_id: str) -> None:
        """`delete_thread`, awaited."""
        await self._adelete(thread_id, {"scope": "thread"}, "delete")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`delete_for_runs`, awaited."""
        if not run_ids:
            return
        self._note_loop()
        if not self._async:
            return await asyncio.to_thread(self.delete_for_runs, run_ids)
        wanted = set(run_ids)
        for tid in await self._aall_thread_ids():
            t = await self._athread(tid)
            gone = [[c.ns, c.id] for cps in t.ckpts.values() for c in cps.values() if c.md.get("run_id") in wanted]
            if gone:
                await self._adelete(tid, {"checkpoints": gone}, "delete")

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`copy_thread`, awaited."""
        self._note_loop()
        if not self._async:
            return await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)
        src = await self._athread(source_thread_id)
        dst = await self._athread(target_thread_id)
        plan = self._copy_plan(src, dst)
        if plan is None:
            return
        start, events = plan
        got = self._route(dst, kind="copy", ns="", call=object(), base=None)
        if got.close is not None:
            await self._afinish_run(dst, got.close, got.close_response)
        ex = await self.recorder.start(intent_of(target_thread_id), start.envelope, run_execution_id(target_thread_id),
                                       parent_execution_id=start.parent, forked_at_seq=start.fork_seq)
        seqs = [await self.recorder.event(ex.execution_id, type_, p) for type_, p in events]
        self._after_copy(dst, ex.execution_id, events, seqs)
        await self.recorder.finish(ex.execution_id, {"status": "success", "payload": {"copied_from": source_thread_id}})
        dst.runs[ex.execution_id] = _Run(ex.execution_id, ours=True, status="completed")

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`prune`, awaited."""
        self._note_loop()
        if not self._async:
            return await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)
        for tid in thread_ids:
            payload = self._prune_payload(await self._athread(tid), strategy)
            if payload is not None:
                await self._adelete(tid, payload, "prune")

    async def _adelete(self, thread_id: str, payload: dict, reason: str) -> None:
        self._note_loop()
        if not self._async:
            return await asyncio.to_thread(self._delete, thread_id, payload, reason)
        t = await self._athread(thread_id)
        if not t.ckpts and not t.writes:
            return
        run = t.open
        if run is not None and run.open:
            await self._afinish_run(t, run, _response(t, self._codec, run))
        envelope = {"intent": intent_of(thread_id), "thread_id": thread_id, "reason": reason}
        ex = await self.recorder.start(intent_of(thread_id), envelope, run_execution_id(thread_id))
        await self.recorder.event(ex.execution_id, DELETED, payload)
        t.delete(payload)
        await self.recorder.finish(ex.execution_id, {"status": "success", "payload": payload})
        t.runs[ex.execution_id] = _Run(ex.execution_id, ours=True, status="completed")

    async def aclose(self) -> None:
        """`close`, awaited."""
        if not self._async:
            return await asyncio.to_thread(self.close)
        if self._closed:
            return
        self._closed = True
        for t in list(self._threads.values()):
            run = t.open
            if run is None or not run.open:
                continue
            try:
                await self._afinish_run(t, run, _response(t, self._codec, run))
            except Exception as e:  # noqa: BLE001 - close every thread it can
                log.error("cannot finish LangGraph run %s: %s", run.execution_id, e)
        if self._owns_reader and self._reader is not None:
            self._reader.close()
            self._reader = None

    async def __aenter__(self) -> "TraceDBSaver":
        self._note_loop()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def get_next_version(self, current: Optional[str], channel: None) -> str:
        """Versions as LangGraph's own savers make them: a counter, then a random tiebreak."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"
