"""The README's OpenAI snippets (fenced ```python openai) run as written, in order, against the
fake OpenAI server: `openai.OpenAI()` and the Agents SDK find it through OPENAI_BASE_URL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _openai_snippets() -> list[str]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return re.findall(r"```python openai\n(.*?)```", f.read(), flags=re.S)


def test_the_readme_openai_snippets_record_then_replay_with_no_second_request(tmp_path, fake):
    snippets = _openai_snippets()
    assert len(snippets) == 2
    env = dict(os.environ, PYTHONPATH=ROOT, OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="sk-test")
    for name in ("TRACEDB_SIDECAR", "TRACEDB_DATA_DIR", "OPENAI_AGENTS_DISABLE_TRACING"):
        env.pop(name, None)
    counts = []
    for code in snippets:
        before = fake.request_count
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"snippet failed:\n{code}\n{r.stderr}"
        counts.append(fake.request_count - before)
    assert counts == [1, 1]  # each snippet's model call reached the server once: the replays did not
    assert fake.paths == ["/v1/chat/completions", "/v1/responses"]


def test_the_langgraph_snippet_of_docs_integrations_runs_as_written(tmp_path):
    with open(os.path.join(ROOT, "docs", "integrations.md"), encoding="utf-8") as f:
        [code] = re.findall(r"```python langgraph\n(.*?)```", f.read(), flags=re.S)
    env = dict(os.environ, PYTHONPATH=ROOT)
    for name in ("TRACEDB_SIDECAR", "TRACEDB_DATA_DIR"):
        env.pop(name, None)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"snippet failed:\n{code}\n{r.stderr}"
    assert r.stdout.splitlines() == [
        "{'steps': ['plan', 'act']}",
        "langgraph:chat-42 completed {'steps': ['plan', 'act']}",
    ]
    # The commands the doc gives after it, as written there.
    listed = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", "graph-traces", "inspect", "--list",
                             "--intent", "langgraph:chat-42", "--format", "json"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["execution_id"].startswith("lg-chat-42.")
    by_prefix = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", "graph-traces", "inspect", "lg-chat-42.",
                                "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert by_prefix.returncode == 0, by_prefix.stderr
    assert json.loads(by_prefix.stdout)["execution_id"] == row["execution_id"]
    replayed = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", "graph-traces", "replay", row["execution_id"]],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["payload"]["values"] == {"steps": ["plan", "act"]}
