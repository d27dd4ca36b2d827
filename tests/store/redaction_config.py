"""A `[redaction]` configuration and the secrets the redaction tests send through it, with a
check that reads every byte under a data directory."""

from __future__ import annotations

import os

SECRET_KEY = "sk-live-0123456789abcdefSECRET"        # under a key rule (api_key, authorization)
SECRET_PATTERN = "ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"  # found by a pattern inside free text
SECRET_PASSWORD = "hunter2-correct-horse-battery"        # under "Password", in the envelope
SECRET_INTENT = "4111-1111-1111-1111"                    # a per-intent rule (card numbers, Billing)
SECRETS = (SECRET_KEY, SECRET_PATTERN, SECRET_PASSWORD, SECRET_INTENT)

CONFIG = r'''
[compaction]
interval_ms = 0

[recovery]
idle_timeout_s = 0

[redaction]
keys = ["authorization", "api_key", "password"]
patterns = ['ghp_[A-Za-z0-9]{30,}']

[redaction.intents.Billing]
patterns = ['\b\d{4}-\d{4}-\d{4}-\d{4}\b']
'''


def write_config(directory: str) -> str:
    path = os.path.join(directory, "tracedb.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(CONFIG)
    return path


def envelope(intent: str = "Research") -> dict:
    return {
        "intent": intent,
        "payload": {"question": "capital of France", "card": SECRET_INTENT},
        "auth": {"Password": SECRET_PASSWORD},
        "routingMetadata": {"hop": 1},
    }


def tool_call() -> dict:
    return {
        "name": "web_search",
        "arguments": {"q": "capital of France", "headers": {"Authorization": f"Bearer {SECRET_KEY}"}},
        "api_key": SECRET_KEY,
        "note": f"token {SECRET_PATTERN} pasted by the user",
    }


def response() -> dict:
    return {"status": "success", "payload": {"answer": "Paris", "debug": [{"API-Key": SECRET_KEY}]}}


def files_holding(data_dir: str, *secrets: str) -> dict:
    """{relative path: [secrets found]} for every file under `data_dir` (WAL segments, the spare
    segment, traces.db, its -wal and -shm files, anything else) holding one of `secrets`."""
    found: dict = {}
    seen = 0
    for root, _dirs, names in os.walk(data_dir):
        for name in names:
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            seen += 1
            hits = [s for s in secrets if s.encode() in data]
            if hits:
                found[os.path.relpath(path, data_dir)] = hits
    assert seen > 0, f"no files under {data_dir}"
    return found
