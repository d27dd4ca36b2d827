"""Logs for people on a terminal, JSON lines for machines, the same fields in both."""

from __future__ import annotations

import io
import logging

import orjson

from tracedb.sidecar.metrics import configure_logging


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _log_listening(stream, **kw):
    configure_logging("info", stream=stream, **kw)
    logging.getLogger("tracedb.sidecar").info(
        "listening", extra={"socket": "/run/tracedb.sock", "tcp": "127.0.0.1:7411", "note": "two words"}
    )
    return stream.getvalue().strip()


def test_on_a_terminal_the_log_is_text_with_every_field():
    line = _log_listening(FakeTerminal())
    assert not line.startswith("{")
    assert " info " in line and "listening" in line
    assert "socket=/run/tracedb.sock" in line and "tcp=127.0.0.1:7411" in line
    assert 'note="two words"' in line


def test_elsewhere_the_log_is_one_json_object_per_line():
    doc = orjson.loads(_log_listening(io.StringIO()))
    assert doc["msg"] == "listening" and doc["socket"] == "/run/tracedb.sock" and doc["tcp"] == "127.0.0.1:7411"


def test_the_format_can_be_chosen_whatever_the_stream():
    assert _log_listening(FakeTerminal(), json_format=True).startswith("{")
    assert "socket=/run/tracedb.sock" in _log_listening(io.StringIO(), json_format=False)
