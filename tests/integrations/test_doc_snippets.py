"""docs/integrations.md's OpenAI snippets (fenced ```python openai) run as written, in order,
against the fake OpenAI server: `openai.OpenAI()` and the Agents SDK find it through
OPENAI_BASE_URL. So do its Anthropic snippet (```python anthropic, against the fake Messages API,
found through ANTHROPIC_BASE_URL) and its OpenInference one (```python openinference)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _snippets(doc: str, tag: str) -> list[str]:
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        return re.findall(rf"```python {tag}\n(.*?)```", f.read(), flags=re.S)


def _openai_snippets() -> list[str]:
    return _snippets(os.path.join("docs", "integrations.md"), "openai")


def _run(code: str, cwd, **env_vars: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, **env_vars)
    for name in ("TRACEDB_SIDECAR", "TRACEDB_DATA_DIR", "OPENAI_AGENTS_DISABLE_TRACING"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_integrations_page_snippets_record_then_replay_with_no_second_request(tmp_path, fake):
    snippets = _openai_snippets()
    assert len(snippets) == 2
    counts = []
    for code in snippets:
        before = fake.request_count
        r = _run(code, tmp_path, OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="sk-test")
        assert r.returncode == 0, f"snippet failed:\n{code}\n{r.stderr}"
        counts.append(fake.request_count - before)
    assert counts == [1, 1]  # each snippet's model call reached the server once: the replays did not
    assert fake.paths == ["/v1/chat/completions", "/v1/responses"]


def test_the_anthropic_snippet_records_then_replays_with_no_second_request(tmp_path, fake_anthropic):
    (code,) = _snippets("docs/integrations.md", "anthropic")
    r = _run(code, tmp_path, ANTHROPIC_BASE_URL=fake_anthropic.base_url, ANTHROPIC_API_KEY="sk-ant-test")
    assert r.returncode == 0, f"snippet failed:\n{code}\n{r.stderr}"
    assert fake_anthropic.request_count == 1  # the replay did not reach the server
    assert "'input_tokens'" in r.stdout and "'output_tokens'" in r.stdout


def test_the_openinference_snippet_records_llm_events(tmp_path, fake):
    (code,) = _snippets("docs/integrations.md", "openinference")
    r = _run(code, tmp_path, OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="sk-test")
    assert r.returncode == 0, f"snippet failed:\n{code}\n{r.stderr}"
    assert fake.request_count == 1
    assert r.stdout.strip() == "['llm.requested', 'llm.responded', 'otel.invoke_agent', 'FINAL_RESPONSE']"


def test_the_langgraph_snippet_of_docs_integrations_runs_as_written(tmp_path):
    (code,) = _snippets(os.path.join("docs", "integrations.md"), "langgraph")
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
    def tracedb(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", "graph-traces", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    listed = tracedb("inspect", "--list", "--intent", "langgraph:chat-42", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["execution_id"].startswith("lg-chat-42.")
    by_prefix = tracedb("inspect", "lg-chat-42.", "--json")
    assert by_prefix.returncode == 0, by_prefix.stderr
    assert json.loads(by_prefix.stdout)["execution_id"] == row["execution_id"]
    replayed = tracedb("replay", row["execution_id"])
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["payload"]["values"] == {"steps": ["plan", "act"]}
