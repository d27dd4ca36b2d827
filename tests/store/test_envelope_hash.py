"""The envelope hash is IntentusNet's: sha256 of `json.dumps(sort_keys=True, separators=(",", ":"),
ensure_ascii=True, default=str)` of the envelope without routingMetadata. The store takes a faster
path through orjson when the text would be the same; these tests hold it to the same bytes."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from tracedb.records.record import _canonical_fast, compute_envelope_hash


def intentusnet_hash(envelope: dict) -> str:
    stable = {k: v for k, v in envelope.items() if k not in ["routingMetadata"]}
    canonical = json.dumps(stable, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return f"sha256:{hashlib.sha256(canonical.encode()).hexdigest()}"


leaves = (
    st.none() | st.booleans() | st.text()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["\x7f", "\x00\x1f", "é", "\u2028", "a/b", "\\\"", 1e16, 1e-7, -0.0, 2**63, -(2**63) - 1])
)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(st.text(max_size=8), values, max_size=6))
def test_the_hash_is_intentusnets_for_any_json_value(envelope):
    assert compute_envelope_hash(envelope) == intentusnet_hash(envelope)


def test_the_fast_path_is_taken_for_plain_envelopes_and_left_for_what_it_would_write_differently():
    plain = {"intent": "ProcessIntent", "payload": {"n": [1, -2, True, None, "a\nb\x1f\"\\/"]}, "id": 2**63 - 1}
    assert _canonical_fast(plain) == json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()
    for odd in ({"x": 1.5}, {"x": "caf\u00e9"}, {"x": "\x7f"}, {"x": 2**63}, {"x": (1, 2)}, {1: "a"},
                {"x": datetime(2026, 1, 1, tzinfo=timezone.utc)}):
        assert _canonical_fast(odd) is None, odd
        assert compute_envelope_hash(odd) == intentusnet_hash(odd)


def test_routing_metadata_is_left_out_on_both_paths():
    a = {"intent": "X", "routingMetadata": {"decision": "a"}}
    b = {"intent": "X", "routingMetadata": {"decision": "b", "f": 1.5}}
    assert compute_envelope_hash(a) == compute_envelope_hash(b) == intentusnet_hash({"intent": "X"})


def test_an_envelope_that_holds_itself_is_refused_as_before_not_a_recursion_error(tmp_path):
    import pytest

    import tracedb

    env = {"intent": "I"}
    env["self"] = env
    with pytest.raises(ValueError, match="Circular reference"):
        compute_envelope_hash(env)
    with tracedb.open(str(tmp_path / "d"), config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        with pytest.raises(tracedb.InvalidInputError, match="cannot be hashed"):
            store.start("I", env)
