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


# -- the forms the ecosystem writes secrets in, all under the default keys ----------------------

ECOSYSTEM_SECRETS = {
    "header_attribute": "sk-hdr-attr-0f1e2d3c4b5a",      # http.request.header.authorization (OTel)
    "response_cookie": "sid-resp-cookie-99aa88bb",       # http.response.header.set-cookie
    "grpc": "grpc-meta-token-7766554433",                # rpc.grpc.request.metadata.authorization
    "dotted": "sk-dotted-openai-1122334455",             # openai.api_key
    "camel": "sk-camel-apikey-6677889900",               # apiKey
    "pair": "Bearer pair-list-aabbccddeeff",             # [["Authorization", ...]]
    "json_text": "sk-invocation-json-5566778899",        # llm.invocation_parameters: JSON text
    "nested_json": "hunter-nested-json-3344",            # JSON text inside JSON text
}


def ecosystem_payload() -> dict:
    s = ECOSYSTEM_SECRETS
    return {
        "otel": {"attributes": {
            "http.request.header.authorization": [f"Bearer {s['header_attribute']}"],
            "http.response.header.set-cookie": [f"sid={s['response_cookie']}"],
            "rpc.grpc.request.metadata.authorization": [s["grpc"]],
            "http.request.header.content-type": ["application/json"],
            "openai.api_key": s["dotted"],
            "llm.invocation_parameters": (
                '{"model": "gpt-4o", "temperature": 0.2, "api_key": "%s", '
                '"extra": "{\\"password\\": \\"%s\\"}"}' % (s["json_text"], s["nested_json"])
            ),
            "gen_ai.usage.input_tokens": 12,
        }},
        "client": {"apiKey": s["camel"], "baseURL": "https://api.example"},
        "response": {"headers": [["Authorization", s["pair"]], ["Content-Type", "text/plain"]]},
    }


def check_ecosystem_payload(stored: dict) -> None:
    """Every secret of `ecosystem_payload()` redacted where it was, everything else kept."""
    check_ecosystem_attributes(stored["otel"]["attributes"])
    assert stored["client"] == {"apiKey": "[REDACTED]", "baseURL": "https://api.example"}
    assert stored["response"]["headers"] == [["Authorization", "[REDACTED]"], ["Content-Type", "text/plain"]]


def check_ecosystem_attributes(attrs: dict) -> None:
    import json

    for key in ("http.request.header.authorization", "http.response.header.set-cookie",
                "rpc.grpc.request.metadata.authorization", "openai.api_key"):
        assert attrs[key] == "[REDACTED]", key
    assert attrs["http.request.header.content-type"] == ["application/json"]
    assert attrs["gen_ai.usage.input_tokens"] == 12
    params = json.loads(attrs["llm.invocation_parameters"])
    assert params["api_key"] == "[REDACTED]" and params["model"] == "gpt-4o" and params["temperature"] == 0.2
    assert json.loads(params["extra"]) == {"password": "[REDACTED]"}
