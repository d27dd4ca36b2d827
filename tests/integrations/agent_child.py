"""A process that records one Agents SDK run into a data directory, for the crash test:
`python -m tests.integrations.agent_child DATA_DIR BASE_URL`. The test SIGKILLs it mid-run."""

from __future__ import annotations

import asyncio
import sys

from agents import Runner, set_trace_processors

import tracedb
from tests.integrations.weather_agent import QUESTION, live_config, triage
from tracedb.integrations.agents import TraceDBProcessor


def main(data_dir: str, base_url: str) -> None:
    store = tracedb.open(data_dir)
    set_trace_processors([TraceDBProcessor(store)])
    result = asyncio.run(Runner.run(triage, QUESTION, run_config=live_config(base_url)))
    print(result.final_output, flush=True)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
