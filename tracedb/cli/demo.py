"""`tracedb demo`: a small agent recording executions through the sidecar; one crashes midway.

Each execution answers a question with LLM and tool calls (a canned, deterministic "model" and
two local tools, so the demo needs no network and replays exactly). Every call is recorded
through the sidecar as llm.requested/llm.responded and tool.requested/tool.responded events,
around a router's INTENT_RECEIVED, ROUTER_DECISION and FINAL_RESPONSE.

The last execution runs in its own agent process, which is SIGKILLed in the middle of a tool call.
Its events up to the crash are durable in the recorder; the demo, acting as the agent's
supervisor, then tells the recorder that the agent is gone (`abandon`), and the execution shows
as incomplete, not replayable, reason execution_incomplete. Nothing is retried.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

import click
from wal.fs import OsFileSystem, make_dirs

from tracedb.config import DEFAULT_DATA_DIR
from tracedb.errors import TraceDBError
from tracedb.program import program
from tracedb.replay import live_session
from tracedb.sidecar.client import Client, resolve_sidecar
from tracedb.cli.main import config_of, json_option

QUESTIONS = [
    ("What is 17 * 23, in words?", "calculator", {"expression": "17 * 23"}),
    ("What will the weather be in Paris tomorrow?", "weather", {"city": "Paris"}),
    ("How much is 1234 + 4321?", "calculator", {"expression": "1234 + 4321"}),
    ("Is it going to rain in Oslo?", "weather", {"city": "Oslo"}),
]
CRASH_QUESTION = ("Fetch today's exchange rate EUR/USD and convert 250 EUR", "fx_rate", {"pair": "EUR/USD"})
MODEL = "demo-llm-1"


def fake_llm(request: dict) -> dict:
    """A deterministic stand-in for a model: picks a tool, then words the tool's answer. It names
    itself and counts tokens as a provider's answer does (no price is known for it: cost unknown)."""
    last = request["messages"][-1]
    if last["role"] == "user":
        return {"model": MODEL, "tool_call": request.get("tool_choice"),
                "usage": {"prompt_tokens": 42, "completion_tokens": 9}}
    return {"model": MODEL, "content": f"The answer: {last['content']}.",
            "usage": {"prompt_tokens": 61, "completion_tokens": 12}}


def _calculator(args: dict) -> dict:
    a, op, b = args["expression"].split()
    x, y = int(a), int(b)
    return {"value": x * y if op == "*" else x + y if op == "+" else x - y}


def _weather(args: dict) -> dict:
    table = {"Paris": ("sunny", 21), "Oslo": ("rain", 9)}
    sky, temp = table.get(args["city"], ("cloudy", 15))
    return {"city": args["city"], "sky": sky, "temp_c": temp}


TOOLS = {"calculator": _calculator, "weather": _weather}


def envelope_for(question: str) -> dict:
    """The intent envelope of one demo request (routingMetadata is left out of the hash)."""
    return {
        "intent": "AnswerQuestion",
        "payload": {"question": question},
        "metadata": {"source": "tracedb-demo"},
        "routingMetadata": {"host": os.uname().nodename},
    }


def run_agent(client: Client, question: str, tool: str, args: dict, *, on_tool_call=None) -> tuple[str, dict]:
    """One agent execution recorded through `client`; returns (execution_id, final response).

    `on_tool_call(execution_id, seq)` runs right after the tool call is recorded and before the
    tool runs (the crash demo stops there).
    """
    ex = client.start("AnswerQuestion", envelope_for(question))
    ex.event("INTENT_RECEIVED", {"intent": "AnswerQuestion"})
    ex.event("ROUTER_DECISION", {"agent": "demo-agent", "intent": "AnswerQuestion", "reason": "only agent"})

    def call_tool(arguments):
        if on_tool_call is not None:
            on_tool_call(ex.execution_id, ex.last_seq)
        return TOOLS[tool](arguments)

    session = live_session(ex, llm=fake_llm, tools={tool: call_tool})
    messages = [{"role": "user", "content": question}]
    session.llm({"model": MODEL, "messages": messages, "tool_choice": tool})
    result = session.tool(tool, args)
    messages.append({"role": "tool", "content": json.dumps(result, sort_keys=True)})
    answer = session.llm({"model": MODEL, "messages": messages})
    response = {"status": "success", "payload": {"answer": answer["content"]}, "metadata": {"model": MODEL}}
    session.finish(response)
    return ex.execution_id, response


def _crashing_agent(address: str) -> None:
    """Child process: record an execution, announce the pending tool call, then hang in it."""
    TOOLS["fx_rate"] = lambda args: {"rate": 1.08}

    def announce(execution_id: str, seq: int) -> None:
        sys.stdout.write(json.dumps({"execution_id": execution_id, "seq": seq}) + "\n")
        sys.stdout.flush()
        while True:  # the tool call hangs until the demo kills this process
            time.sleep(3600)

    question, tool, args = CRASH_QUESTION
    with Client(address, embedded=False) as client:
        run_agent(client, question, tool, args, on_tool_call=announce)


def _start_server(data_dir: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "serve", "--log-level", "warning"],
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while resolve_sidecar(None, data_dir) is None:
        if proc.poll() is not None:
            raise TraceDBError(f"`tracedb serve` exited with status {proc.returncode}",
                               hint="run it by hand to see why: `tracedb serve`")
        if time.monotonic() > deadline:
            proc.kill()
            raise TraceDBError("`tracedb serve` did not start listening within 60 s")
        time.sleep(0.05)  # waiting for the socket, with a deadline
    return proc


@dataclass(frozen=True)
class DemoResult:
    """Where the demo recorded, and each execution's outcome (the crashed one last)."""

    address: str
    data_dir: str
    executions: tuple[dict, ...]

    def to_dict(self) -> dict:
        return {"data_dir": self.data_dir, "executions": list(self.executions)}


def run_demo(cfg, *, sidecar: Optional[str], start_server: bool, executions: int) -> DemoResult:
    """Record `executions` completed executions and one crashed one through the sidecar."""
    data_dir = cfg.data_dir
    address = resolve_sidecar(sidecar, data_dir)
    server = None
    if address is None:
        if not start_server:
            raise TraceDBError(
                f"no recorder is listening for data directory {data_dir}",
                hint="start one with `tracedb serve` (or scripts/run), or run `tracedb demo --start-server`",
            )
        make_dirs(OsFileSystem(), data_dir)  # private (0700), fsynced into its parent, as serve makes it
        server = _start_server(data_dir)
        address = resolve_sidecar(None, data_dir)
    rows = []
    try:
        with Client(address, data_dir=data_dir) as client:
            for i in range(executions):
                question, tool, args = QUESTIONS[i % len(QUESTIONS)]
                eid, _resp = run_agent(client, question, tool, args)
                rows.append(eid)
            rows.append(_run_crash(address, client, data_dir))
            records = [client.get(eid) for eid in rows]
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    return DemoResult(
        address,
        data_dir,
        tuple(
            {
                "execution_id": r.execution_id,
                "status": r.status,
                "replayable": r.header.replayable,
                "replayable_reason": r.header.replayableReason,
                "events": len(r.events),
                "last_event": r.events[-1].type if r.events else None,
            }
            for r in records
        ),
    )


def _run_crash(address: str, client: Client, data_dir: str) -> str:
    """Run the crashing agent in a child process, SIGKILL it mid tool call, report it abandoned."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tracedb.cli.demo", "crashing-agent", address],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, TRACEDB_DATA_DIR=data_dir),  # where its client finds a TCP listener's token
    )
    try:
        line = child.stdout.readline()
        if not line:
            raise TraceDBError(f"the demo agent exited early with status {child.wait()}")
        pending = json.loads(line)
    finally:
        # The agent dies in the middle of its tool call: no tool.responded, no FINAL_RESPONSE.
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    client.abandon(pending["execution_id"], "agent process killed (SIGKILL) during a tool call")
    return pending["execution_id"]


if __name__ == "__main__":  # the crashing agent's process: python -m tracedb.cli.demo crashing-agent ADDR
    if len(sys.argv) == 3 and sys.argv[1] == "crashing-agent":
        _crashing_agent(sys.argv[2])
    else:
        sys.exit("usage: python -m tracedb.cli.demo crashing-agent ADDRESS")


@click.command()
@click.option("--sidecar", envvar="TRACEDB_SIDECAR",
              help="Recorder address (env TRACEDB_SIDECAR; default: the data directory's socket).")
@click.option("--start-server", is_flag=True,
              help="Start a `tracedb serve` for the demo's duration if none is running.")
@click.option("--executions", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Completed executions to record before the one that crashes.")
@json_option("Print the summary as JSON.")
@click.pass_context
def demo(ctx, sidecar, start_server, executions, as_json):
    """Record demo agent executions through the sidecar; one crashes midway.

    Each execution is a small agent run (tool and LLM calls) in its own process. The last one
    is SIGKILLed in the middle of a tool call; the recorder then shows it incomplete
    (execution_incomplete) with every event up to the crash, while the others are completed
    and replayable.

    \b
    Example:
      tracedb demo --start-server && tracedb inspect --list
    """
    result = run_demo(config_of(ctx), sidecar=sidecar, start_server=start_server, executions=executions)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    rows = result.executions
    click.echo(f"recorded {len(rows)} executions through the sidecar ({result.address}):")
    for e in rows:
        flag = "replayable" if e["replayable"] else f"not replayable ({e['replayable_reason']})"
        click.echo(f"  {e['execution_id']}  {e['status']:<10} {flag:<40} {e['events']} events, last {e['last_event']}")
    crashed = rows[-1]["execution_id"]
    done = next((e["execution_id"] for e in rows if e["replayable"]), None)
    me = program()  # the next commands run as printed: this program, this data directory
    if os.path.normpath(result.data_dir) != DEFAULT_DATA_DIR:
        me += f" --data-dir {shlex.quote(result.data_dir)}"
    click.echo("\nnext:")
    click.echo(f"  {me} inspect --list")
    click.echo(f"  {me} inspect {crashed}        # the crashed one: incomplete, events up to the crash")
    if done:
        click.echo(f"  {me} trace get {done}")
        click.echo(f"  {me} replay {done}         # returns the recorded response, no agent call")
