"""Tool-call dedup (seed 001): the decision table row by row, the example turn step by step, the
call key, and the skip recorded in the execution's trace."""

from __future__ import annotations

import hashlib
import json

import pytest

from tracedb.replay.dedup import TOOL_DENIED, ReplayControl, ToolDenied, ToolSpec, call_key

SEARCH = ToolSpec(name="web_search", idempotent=True)
EMAIL = ToolSpec(name="send_email", idempotent=False)
Q = {"q": "capital of France"}


# -- the decision table, one test per row ----------------------------------------------------------


@pytest.mark.parametrize("prior", [None, "success", "failure", "timeout", "denied"])
def test_non_idempotent_tool_is_always_allowed(prior):
    rc = ReplayControl()
    if prior is not None:
        getattr(rc, f"record_{prior}")(EMAIL.name, {"to": "a@b.c"}, EMAIL)
    assert rc.should_skip(EMAIL.name, {"to": "a@b.c"}, EMAIL) == (False, None)


def test_idempotent_first_call_is_allowed():
    assert ReplayControl().should_skip(SEARCH.name, Q, SEARCH) == (False, None)


def test_idempotent_after_prior_success_is_skipped_as_duplicate():
    rc = ReplayControl()
    rc.record_success(SEARCH.name, Q, SEARCH)
    skip, reason = rc.should_skip(SEARCH.name, Q, SEARCH)
    assert skip is True
    assert "web_search" in reason


@pytest.mark.parametrize("prior", ["failure", "timeout"])
def test_idempotent_after_prior_failure_or_timeout_is_retried(prior):
    rc = ReplayControl()
    getattr(rc, f"record_{prior}")(SEARCH.name, Q, SEARCH)
    assert rc.should_skip(SEARCH.name, Q, SEARCH) == (False, None)


def test_idempotent_after_prior_denial_is_allowed():
    rc = ReplayControl()
    rc.record_denied(SEARCH.name, Q, SEARCH)
    assert rc.should_skip(SEARCH.name, Q, SEARCH) == (False, None)


def test_registry_miss_is_treated_as_idempotent():
    rc = ReplayControl()
    rc.record_success("unknown_tool", {"x": 1})
    assert rc.should_skip("unknown_tool", {"x": 1})[0] is True


def test_registry_says_which_tools_are_not_idempotent():
    for registry in ({EMAIL.name: EMAIL}, [EMAIL]):
        rc = ReplayControl(registry)
        rc.record_success(EMAIL.name, {"to": "a@b.c"})
        assert rc.should_skip(EMAIL.name, {"to": "a@b.c"})[0] is False


# -- the example turn, exactly ------------------------------------------------------------------


def test_seed_example_turn():
    rc = ReplayControl()
    executed = []

    def call(args, outcome):
        skip, _ = rc.should_skip("web_search", args, SEARCH)
        if skip:
            return "skipped"
        executed.append((args["q"], outcome))
        getattr(rc, f"record_{outcome}")("web_search", args, SEARCH)
        return outcome

    # Step 1: first call -> not skipped -> execute -> error (timeout) -> record_failure
    assert rc.should_skip("web_search", {"q": "capital of France"}, SEARCH) == (False, None)
    rc.record_failure("web_search", {"q": "capital of France"}, SEARCH)
    # Step 2: retry -> not skipped (prior call failed) -> success -> record_success
    assert call({"q": "capital of France"}, "success") == "success"
    # Step 3: same call again -> skipped, duplicate
    denied = rc.gate("web_search", {"q": "capital of France"}, SEARCH, call_id="call-3")
    assert denied == ToolDenied(call_id="call-3", tool_name="web_search", reason="duplicate", details=denied.details)
    assert denied.details
    # Step 4: different arguments -> different key -> execute -> success
    assert call({"q": "population of France"}, "success") == "success"
    assert executed == [("capital of France", "success"), ("population of France", "success")]
    assert rc.history_size() == 2


# -- call key, history -------------------------------------------------------------------------------


def test_call_key_is_md5_of_name_and_sorted_json_arguments():
    args = {"b": 2, "a": 1}
    raw = f"web_search:{json.dumps(args, sort_keys=True)}"
    assert call_key("web_search", args) == hashlib.md5(raw.encode()).hexdigest()
    assert call_key("web_search", {"b": 2, "a": 1}) == call_key("web_search", {"a": 1, "b": 2})
    assert call_key("web_search", {"a": 1}) != call_key("local_search", {"a": 1})


def test_argument_order_does_not_defeat_dedup():
    rc = ReplayControl()
    rc.record_success("web_search", {"q": "x", "n": 3})
    assert rc.should_skip("web_search", {"n": 3, "q": "x"})[0] is True


def test_history_size_counts_distinct_calls():
    rc = ReplayControl()
    assert rc.history_size() == 0
    rc.record_failure("web_search", Q)
    rc.record_success("web_search", Q)
    rc.record_success("web_search", {"q": "other"})
    rc.record_success(EMAIL.name, {"to": "a"}, EMAIL)
    assert rc.history_size() == 3


def test_success_is_not_reopened_by_a_later_failure():
    rc = ReplayControl()
    rc.record_success("web_search", Q)
    rc.record_failure("web_search", Q)
    rc.record_denied("web_search", Q)
    assert rc.should_skip("web_search", Q)[0] is True
    assert rc.outcome("web_search", Q) == "success"


def test_gate_allows_by_returning_none():
    assert ReplayControl().gate("web_search", Q) is None


# -- the skip lands in the trace ---------------------------------------------------------------------


def test_skip_is_recorded_as_an_event_in_the_execution(store):
    ex = store.start("lookup", {"intent": "lookup"})
    rc = ReplayControl(execution=ex)
    rc.record_success("web_search", Q, SEARCH)
    assert rc.gate("web_search", Q, SEARCH) is not None
    assert rc.should_skip("web_search", {"q": "new"}, SEARCH) == (False, None)
    record = store.get(ex.execution_id)
    denied = [e for e in record.events if e.type == TOOL_DENIED]
    assert len(denied) == 1
    payload = denied[0].payload
    assert payload["tool"] == "web_search"
    assert payload["arguments"] == Q
    assert payload["reason"] == "duplicate"
    assert payload["call_key"] == call_key("web_search", Q)
