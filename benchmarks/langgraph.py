"""LangGraph checkpointers side by side: the same graph, the same machine, durable commits for all.

A graph of plain Python nodes (no model): `step` runs STEPS times in a loop, each superstep
writing a counter and a ~600-byte string, so each checkpoint LangGraph saves holds a 641-byte
state. `producers` asyncio tasks each run the graph again and again on a thread of their own
(`ainvoke`, `durability="sync"`: every superstep's checkpoint is saved before the next one
starts). Measured: checkpoints saved per second (each `aput` that returned) and the latency of
`aput`, for

- tracedb: `TraceDBSaver` over `tracedb.open_async` (the WAL's group commit; acknowledged after
  fdatasync),
- `AsyncSqliteSaver` (langgraph-checkpoint-sqlite) on aiosqlite, `journal_mode=WAL` (its own
  setup) and `synchronous=FULL`: each commit fsyncs SQLite's WAL,
- `AsyncPostgresSaver` (langgraph-checkpoint-postgres) on the local server, a pool of
  connections, `synchronous_commit=on`: each commit waits for the server's WAL flush.

The same rows again without the graph: the producers call `aput` then `aput_writes` directly with
the checkpoints and writes such a superstep makes, the cost of the checkpointer alone.

    python -c "from benchmarks import langgraph as b; print(b.report_lines(b.run('/tmp', seconds=3)))"
"""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import tempfile
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable, Optional, TypedDict

from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END, START, StateGraph

import tracedb
from tracedb.integrations.langgraph import TraceDBSaver

from .common import pct

STEPS = 8
# The state a checkpoint holds: {"n": int, "data": str}, 641 bytes as JSON.
DATA = "x" * (641 - len('{"n":1,"data":""}'))


class BenchState(TypedDict):
    n: int
    data: str


def graph():
    """The graph every saver runs: `step` STEPS times, then the end."""

    def step(s: BenchState) -> dict:
        return {"n": s["n"] + 1, "data": DATA}

    g = StateGraph(BenchState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < STEPS else END)
    return g


def timed_saver(cls: type) -> type:
    """`cls` with its `aput` timed: every checkpoint that returned, and how long it took."""

    class Timed(cls):  # type: ignore[misc, valid-type]
        lat: list

        async def aput(self, config, checkpoint, metadata, new_versions):
            t = time.perf_counter()
            out = await super().aput(config, checkpoint, metadata, new_versions)
            self.lat.append((t, time.perf_counter() - t))
            return out

    Timed.__name__ = cls.__name__
    return Timed


# -- the savers ---------------------------------------------------------------------------------


class _Tracedb:
    name = "tracedb TraceDBSaver (open_async, group commit)"

    def __init__(self, workdir: str):
        self.workdir = workdir

    async def __aenter__(self):
        self.dir = tempfile.mkdtemp(dir=self.workdir)
        self.store = await tracedb.open_async(self.dir)
        self.saver = timed_saver(TraceDBSaver)(self.store)
        return self.saver

    async def __aexit__(self, *exc):
        await self.saver.aclose()
        await self.store.close()
        shutil.rmtree(self.dir)


class _Sqlite:
    name = "AsyncSqliteSaver (WAL, synchronous=FULL)"

    def __init__(self, workdir: str):
        self.workdir = workdir

    async def __aenter__(self):
        import aiosqlite

        self.dir = tempfile.mkdtemp(dir=self.workdir)
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        self.conn = await aiosqlite.connect(os.path.join(self.dir, "checkpoints.sqlite"))
        saver = timed_saver(AsyncSqliteSaver)(self.conn)
        await saver.setup()  # journal_mode=WAL
        await self.conn.execute("PRAGMA synchronous=FULL")
        async with self.conn.execute("PRAGMA synchronous") as cur:
            assert (await cur.fetchone())[0] == 2  # FULL
        return saver

    async def __aexit__(self, *exc):
        await self.conn.close()
        shutil.rmtree(self.dir)


class _Memory:
    name = "InMemorySaver (nothing durable: LangGraph's own cost)"

    async def __aenter__(self):
        from langgraph.checkpoint.memory import InMemorySaver

        return timed_saver(InMemorySaver)()

    async def __aexit__(self, *exc):
        pass


class _Postgres:
    name = "AsyncPostgresSaver (pool of 16, synchronous_commit=on)"

    def __init__(self, pg_url: str, pool_size: int = 16):
        self.url = pg_url.replace("postgresql+psycopg://", "postgresql://")
        self.schema = f"lg_bench_{uuid.uuid4().hex[:12]}"
        self.pool_size = pool_size

    async def __aenter__(self):
        import psycopg
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as c:
            await c.execute(f'CREATE SCHEMA "{self.schema}"')
        options = f"-c search_path={self.schema} -c synchronous_commit=on"
        self.pool = AsyncConnectionPool(
            self.url, min_size=self.pool_size, max_size=self.pool_size, open=False,
            kwargs={"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0, "options": options},
        )
        await self.pool.open(wait=True)
        async with self.pool.connection() as c:
            assert (await (await c.execute("SHOW synchronous_commit")).fetchone())["synchronous_commit"] == "on"
        saver = timed_saver(AsyncPostgresSaver)(self.pool)
        await saver.setup()
        return saver

    async def __aexit__(self, *exc):
        import psycopg

        await self.pool.close()
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as c:
            await c.execute(f'DROP SCHEMA "{self.schema}" CASCADE')


# -- the workloads ------------------------------------------------------------------------------


async def _graph_load(saver, producers: int, seconds: float, warmup: float) -> dict:
    app = graph().compile(checkpointer=saver)
    stop = time.perf_counter() + warmup + seconds
    runs = [0]

    async def producer(k: int) -> None:
        config = {"configurable": {"thread_id": f"bench-{k}"}}
        while time.perf_counter() < stop:
            out = await app.ainvoke({"n": 0, "data": ""}, config, durability="sync")
            assert out["n"] == STEPS
            runs[0] += 1

    await asyncio.gather(*(producer(k) for k in range(producers)))
    return {"runs": runs[0]}


def captured_calls() -> list:
    """The saver calls one run of the graph makes on a new thread, in order: ("put", checkpoint,
    metadata, new_versions) and ("writes", checkpoint index, writes, task_id, task_path)."""
    from langgraph.checkpoint.memory import InMemorySaver

    calls: list = []
    ids: dict = {}

    class Capture(InMemorySaver):
        def put(self, config, checkpoint, metadata, new_versions):
            ids[checkpoint["id"]] = len(ids)
            calls.append(("put", copy.deepcopy(checkpoint), dict(metadata), dict(new_versions)))
            return super().put(config, checkpoint, metadata, new_versions)

        def put_writes(self, config, writes, task_id, task_path=""):
            calls.append(("writes", ids[config["configurable"]["checkpoint_id"]], list(writes), task_id, task_path))
            return super().put_writes(config, writes, task_id, task_path)

    app = graph().compile(checkpointer=Capture())
    app.invoke({"n": 0, "data": ""}, {"configurable": {"thread_id": "capture"}}, durability="sync")
    return calls


def _versions_after(versions: dict, offset: int) -> dict:
    """Channel versions of a later run: the captured ones moved up by `offset`, as the same
    channels written again would be."""
    return {ch: f"{int(str(v).split('.')[0]) + offset:032}.0" for ch, v in versions.items()}


async def _saver_load(saver, producers: int, seconds: float, warmup: float) -> dict:
    """The graph's calls without the graph: each producer replays, run after run on its thread,
    the `aput`s and `aput_writes` one run of the graph makes (new checkpoint ids, versions moved
    on), each awaited before the next as the graph with durability="sync" does."""
    calls = captured_calls()
    top = max(int(str(v).split(".")[0]) for c in calls if c[0] == "put" for v in c[1]["channel_versions"].values())
    stop = time.perf_counter() + warmup + seconds
    runs = [0]

    async def producer(k: int) -> None:
        thread = f"bench-{k}"
        last: Optional[str] = None
        n = 0
        while time.perf_counter() < stop:
            offset = n * top
            stored: list = []
            for call in calls:
                if call[0] == "put":
                    _, cp, md, nv = call
                    cp = dict(cp, id=str(uuid6(clock_seq=md["step"])), ts=datetime.now(timezone.utc).isoformat(),
                              channel_versions=_versions_after(cp["channel_versions"], offset),
                              versions_seen={node: _versions_after(seen, offset) for node, seen in cp["versions_seen"].items()})
                    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
                    if last is not None:
                        conf["checkpoint_id"] = last
                    stored.append(await saver.aput({"configurable": conf}, cp, dict(md), _versions_after(nv, offset)))
                    last = cp["id"]
                else:
                    _, index, writes, task_id, task_path = call
                    await saver.aput_writes(stored[index], writes, str(uuid.uuid4()), task_path)
            n += 1
            runs[0] += 1

    await asyncio.gather(*(producer(k) for k in range(producers)))
    return {"runs": runs[0]}


def _measure(make: Callable[[], Any], load, producers: int, seconds: float, warmup: float) -> dict:
    async def main():
        async with make() as saver:
            saver.lat = []
            t0 = time.perf_counter() + warmup
            got = await load(saver, producers, seconds, warmup)
            t1 = time.perf_counter()
            lat = sorted(d for t, d in saver.lat if t >= t0)
            return got, lat, t1 - t0

    got, lat, elapsed = asyncio.run(main())
    return {
        "checkpoints_per_s": len(lat) / elapsed, "checkpoints": len(lat),
        "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "runs": got["runs"],
    }


def run(workdir: str, *, seconds: float = 3.0, warmup: float = 1.0, producers: int = 64,
        pg_url: Optional[str] = None, loads: tuple = ("graph", "saver")) -> dict:
    """Every saver under every load: {load: {saver name: figures}}, and tracedb's ratios."""
    pg_url = pg_url if pg_url is not None else os.environ.get("TRACEDB_TEST_PG_URL")
    makers: list = [lambda: _Tracedb(workdir), lambda: _Sqlite(workdir)]
    skipped = None
    if pg_url:
        makers.append(lambda: _Postgres(pg_url))
    else:
        skipped = "AsyncPostgresSaver: no TRACEDB_TEST_PG_URL"
    makers.append(_Memory)
    out: dict = {"producers": producers, "steps": STEPS, "state_bytes": len('{"n":1,"data":""}') + len(DATA),
                 "seconds": seconds, "skipped": skipped}
    for name in loads:
        load = {"graph": _graph_load, "saver": _saver_load}[name]
        rows = {}
        for make in makers:
            saver = make()
            try:
                fig = _measure(lambda: saver, load, producers, seconds, warmup)
            except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
                if make is makers[0]:
                    raise
                out["skipped"] = f"{saver.name}: {e}"
                continue
            rows[saver.name] = fig
        out[name] = rows
    return out


def report_lines(result: dict) -> list[str]:
    lines = []
    titles = {"graph": "the graph (ainvoke, durability=sync)", "saver": "the saver alone (aput + aput_writes)"}
    for load in ("graph", "saver"):
        rows = result.get(load)
        if not rows:
            continue
        lines.append(f"  {titles[load]}, {result['producers']} producers, {result['state_bytes']}-byte state:")
        for name, fig in rows.items():
            lines.append(f"    {name:<56} {fig['checkpoints_per_s']:>9,.0f} checkpoints/s"
                         f"   p50 {fig['p50_ms']:7.2f} ms   p99 {fig['p99_ms']:7.2f} ms")
        names = list(rows)
        ours = rows[names[0]]
        for other in names[1:]:
            if other.startswith("InMemorySaver"):
                r = ours["checkpoints_per_s"] / rows[other]["checkpoints_per_s"]
                lines.append(f"    tracedb / InMemorySaver: {r:.2f}x checkpoints/s (the share of LangGraph's own ceiling)")
                continue
            r = ours["checkpoints_per_s"] / rows[other]["checkpoints_per_s"]
            p = rows[other]["p99_ms"] / ours["p99_ms"]
            lines.append(f"    tracedb / {other.split(' ')[0]}: {r:.1f}x checkpoints/s, p99 {p:.1f}x lower")
    if result.get("skipped"):
        lines.append(f"  (not run: {result['skipped']})")
    return lines
