"""The outcome policy (``onward.policy``), row by row of the settle table in
docs/state-machine.md, without a database: each outcome of a step becomes exactly one
transition (advance, complete, wait, retry with backoff, stop, park, budget exceeded, cancel)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onward import jsoncodec, policy
from onward.automations.document import AutomationDoc, RetryPolicy
from onward.errors import (
    AuthorizationError,
    InvalidInput,
    NeedsReview,
    OutcomeUnknown,
    PermanentError,
    RateLimited,
    RetryableError,
    RunCancelled,
)
from onward.inputs import check_storable
from onward.kinds import Advance, KindSpec, Registry, Wait


async def _noop(step: Any) -> None:
    return None


REGISTRY = Registry()
REGISTRY.add(KindSpec("fast.kind", "fast", _noop))
REGISTRY.add(KindSpec("slow.kind", "slow", _noop))

DOC = AutomationDoc.model_validate(
    {
        "id": "flow",
        "steps": [
            {"id": "a", "kind": "fast.kind", "next": "b"},
            {"id": "b", "kind": "slow.kind", "next": "c"},
            {"id": "c", "kind": "fast.kind", "lane": "io"},
            {"id": "d", "kind": "not.registered"},
            {"id": "e", "kind": "fast.kind", "next": "ghost"},
        ],
    }
)


def result(value: Any, step: str = "a", visits: dict[str, int] | None = None) -> Any:
    return policy.after_result(
        value, step=DOC.step(step), doc=DOC, registry=REGISTRY, visits=visits or {}
    )


def claim(**facts: Any) -> dict[str, Any]:
    row = {"cancel_requested": False, "over_steps": False, "over_age": False, "max_steps": 50}
    return {**row, **facts}


def error(exc: BaseException, attempt: int = 1, **kw: Any) -> Any:
    """The ``attempt``-th failed attempt (``failures`` = attempt - 1 failed before it)."""
    retry = RetryPolicy(max_attempts=3, base=2.0, cap=10.0)
    return policy.after_error(exc, step_id="send", failures=attempt - 1, retry=retry, **kw)


# -- at claim: before the handler runs ---------------------------------------------------


def test_nothing_stops_a_healthy_claim() -> None:
    assert policy.at_claim(claim()) is None


def test_cancel_requested_cancels_step_and_run() -> None:
    assert policy.at_claim(claim(cancel_requested=True, over_steps=True)) == policy.Stop(
        "cancelled", "cancelled", "cancelled on request"
    )


def test_step_budget_exhausted_exceeds_the_run() -> None:
    stop = policy.at_claim(claim(over_steps=True))
    assert stop == policy.Stop("cancelled", "exceeded", "step budget of 50 steps exhausted")


def test_age_budget_exhausted_exceeds_the_run() -> None:
    stop = policy.at_claim(claim(over_age=True))
    assert stop == policy.Stop("cancelled", "exceeded", "maximum run age reached")


# -- after a result ------------------------------------------------------------------------


def test_plain_value_is_done_and_advances_to_the_static_next() -> None:
    t = result({"x": 1})
    assert t == policy.Proceed({"x": 1}, {}, policy.NextStep("b", "slow.kind", "slow", 1))


def test_next_iteration_counts_earlier_visits() -> None:
    t = result(None, visits={"b": 2})
    assert isinstance(t, policy.Proceed)
    assert t.next_step == policy.NextStep("b", "slow.kind", "slow", 3)


def test_advance_chooses_next_and_sets_vars() -> None:
    t = result(Advance(output="o", vars={"k": "v"}, next="c"))
    assert t == policy.Proceed("o", {"k": "v"}, policy.NextStep("c", "fast.kind", "io", 1))


def test_one_dict_as_output_and_variables_is_stored_once_and_checked() -> None:
    computed = {"when": datetime(2026, 1, 2, tzinfo=UTC), "n": 1}  # as a `set` step returns
    t = result(Advance(output=computed, vars=computed, next="c"))
    assert isinstance(t, policy.Proceed)
    assert t.output == t.vars == {"when": "2026-01-02 00:00:00+00:00", "n": 1}  # as stored
    bad = {"text": "a\u0000b"}
    stopped = result(Advance(output=bad, vars=bad, next="c"))
    assert isinstance(stopped, policy.Stop) and "output" in stopped.reason


def test_lane_of_an_unregistered_next_kind_defaults_to_io() -> None:
    t = result(Advance(next="d"))
    assert isinstance(t, policy.Proceed)
    assert t.next_step == policy.NextStep("d", "not.registered", "io", 1)


def test_no_next_completes_the_run() -> None:
    assert result("last", step="c") == policy.Proceed("last", {}, None)


def test_skipped_is_done_on_purpose() -> None:
    t = result(Advance(skipped="suppressed"), step="c")
    assert t == policy.Proceed(None, {}, None, skipped="suppressed")


def test_a_review_resolved_as_skip_is_skipped_without_running_the_kind() -> None:
    wake = {"by": "review", "how": "skip", "operator": "ana", "reference": None}
    skipped = policy.skipped_by_operator(wake)
    assert skipped == Advance(output={"skipped": True, "by": "ana"}, skipped=skipped.skipped)
    assert skipped.skipped == "skipped by ana after review"
    t = result(skipped, step="a")
    assert isinstance(t, policy.Proceed) and t.skipped == "skipped by ana after review"
    assert t.next_step is not None and t.next_step.step_id == DOC.step("a").next
    for other in (None, {}, {"by": "review", "how": "retry"}, {"by": "timer"}):
        assert policy.skipped_by_operator(other) is None


def test_wait_becomes_a_timer() -> None:
    t = result(Wait(due_in=2.5, intent={"duration": "2.5s"}))
    assert t == policy.WaitTimer(2.5, {"duration": "2.5s"})


@pytest.mark.parametrize("bad", [math.nan, math.inf, {"x": -math.inf}])
def test_output_that_jsonb_cannot_store_fails_the_step(bad: Any) -> None:
    t = result(bad)
    assert isinstance(t, policy.Stop)
    assert (t.step_status, t.run_status) == ("failed", "failed")
    assert "output is not JSON" in t.reason


def test_output_is_what_the_database_will_store() -> None:
    when = datetime(2026, 12, 1, tzinfo=UTC)
    t = result({"at": when, "tuple": (1, 2)})
    assert isinstance(t, policy.Proceed)
    assert t.output == {"at": str(when), "tuple": [1, 2]}


def _the_encoders_way(value: Any) -> Any:
    """What ``_as_stored`` answered for every value before its orjson path for plain dicts."""
    text = policy._STORED.encode(value)
    stored = jsoncodec.loads(text)
    if "\\u0000" in text or "\\ud" in text:
        check_storable(stored, "the output")
    return stored


_SCALAR = st.one_of(
    st.text(), st.integers(), st.booleans(), st.floats(), st.none(), st.just("\ud800")
)


@given(st.dictionaries(st.text(), _SCALAR, max_size=6))
def test_a_plain_dict_is_stored_as_the_encoder_stores_it(value: dict[str, Any]) -> None:
    # the orjson path (str keys; str, int, bool, None, finite float values) and the encoder's
    # way agree on every value, refusals included: NaN, NUL, a lone surrogate, a 65-bit int
    try:
        expected: Any = _the_encoders_way(value)
    except (ValueError, TypeError, InvalidInput) as exc:
        with pytest.raises(type(exc)):
            policy._as_stored(value)
        return
    got = policy._as_stored(value)
    assert got == expected
    assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]


@pytest.mark.parametrize(
    "value",
    [
        {"n": 2**64 - 1},  # 20 digits, within what orjson writes
        {"n": 2**64},  # beyond: orjson refuses, the encoder keeps every digit
        {"n": -(2**63)},
        {"f": 1e-320, "g": 1.7976931348623157e308, "h": -0.0},
        {"s": "\U0001f600 caf\u00e9", "nul key \u0000x": 1},
        {"s": "a\u0000b"},
        {"x": None, "nan": math.nan},
        {"inf": -math.inf, "s": "x"},
        {"nested": {"x": 1}, "list": [None]},
        {"e": IntEnum("E", "A B").B, "d": datetime(2026, 12, 1, tzinfo=UTC)},
    ],
)
def test_edge_values_are_stored_as_the_encoder_stores_them(value: dict[str, Any]) -> None:
    try:
        expected: Any = _the_encoders_way(value)
    except (ValueError, InvalidInput) as exc:
        with pytest.raises(type(exc)):
            policy._as_stored(value)
        return
    got = policy._as_stored(value)
    assert got == expected
    assert repr(got) == repr(expected)  # -0.0 stays -0.0, an int stays an int


def test_next_step_missing_from_the_version_fails() -> None:
    t = result(None, step="e")
    assert t == policy.Stop("failed", "failed", "step e: no step 'ghost'")


# -- after an error ------------------------------------------------------------------------


def test_authorization_error_parks_for_reconnect_with_the_connection() -> None:
    t = error(AuthorizationError("reconnect the mailbox", connection="mailbox"), attempt=1)
    assert isinstance(t, policy.Stop)
    assert (t.step_status, t.run_status, t.wait_kind) == ("parked", "parked", "reconnect")
    assert t.reason == "reconnect the mailbox"
    assert t.error is not None and t.error["connection"] == "mailbox"


def test_needs_review_parks_for_a_person() -> None:
    t = error(NeedsReview("payment uncertain", detail={"key": "k"}))
    assert isinstance(t, policy.Stop)
    assert (t.step_status, t.run_status, t.wait_kind) == ("parked", "parked", "review")
    assert t.error is not None and t.error["detail"] == {"key": "k"}


def test_permanent_error_fails_at_once() -> None:
    t = error(PermanentError("400 bad address"), attempt=1)
    assert t == policy.Stop(
        "failed",
        "failed",
        "step send: 400 bad address",
        {"type": "PermanentError", "message": "400 bad address"},
    )


@pytest.mark.parametrize("exc", [RetryableError("503"), ValueError("bug?"), OutcomeUnknown("?")])
def test_exhausted_attempts_fail(exc: Exception) -> None:
    t = error(exc, attempt=3)
    assert isinstance(t, policy.Stop)
    assert t.run_status == "failed" and "gave up after 3 attempts" in t.reason


def test_retry_backs_off_with_full_jitter_under_the_ceiling() -> None:
    seen: list[tuple[float, float]] = []

    def highest(lo: float, hi: float) -> float:
        seen.append((lo, hi))
        return hi

    # attempt 2 of base 2 s: ceiling min(10, 2 * 2**1) = 4 s
    t = error(RetryableError("503"), attempt=2, jitter=highest)
    assert t == policy.Retry(4.0, {"type": "RetryableError", "message": "503"})
    assert seen == [(0, 4.0)]
    # the cap bounds the ceiling
    t = policy.after_error(
        RuntimeError("x"),
        step_id="s",
        failures=8,
        retry=RetryPolicy(max_attempts=20, base=2.0, cap=10.0),
        jitter=highest,
    )
    assert isinstance(t, policy.Retry) and t.delay == 10.0


def test_retry_after_seconds_wins_over_backoff() -> None:
    t = error(RateLimited("429", retry_after=42.0), attempt=1, jitter=lambda lo, hi: hi)
    assert isinstance(t, policy.Retry) and t.delay == 42.0 and t.retry_at is None


def test_retry_after_date_is_left_to_the_database_clock() -> None:
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    t = error(RateLimited("429", retry_at=at), attempt=1)
    assert isinstance(t, policy.Retry)
    assert (t.delay, t.retry_at) == (0.0, at)


def test_missing_kind_is_handed_back_for_another_worker() -> None:
    t = policy.kind_not_registered("crm.tag", "w1")
    assert t.delay == policy.KIND_MISSING_DELAY_S
    assert "crm.tag" in t.error["message"] and "w1" in t.error["message"]


def test_step_gone_from_its_version_or_bad_params_fail() -> None:
    assert policy.step_not_in_version("x").run_status == "failed"
    stop = policy.params_do_not_fit("x", "set", "values: required")
    assert stop.run_status == "failed" and "values: required" in stop.reason


def test_an_engine_error_parks_the_run_for_review() -> None:
    stop = policy.engine_error(KeyError("ctx"))
    assert (stop.step_status, stop.run_status, stop.wait_kind) == ("parked", "parked", "review")
    assert stop.reason == "engine error: KeyError: 'ctx'"


# -- flow control: a limit defers, an open circuit or an exhausted budget parks -----------------


def test_a_limit_defers_the_step_without_spending_an_attempt() -> None:
    from onward.errors import Deferred

    t = error(Deferred(0.75, "connection:crm: 2 call(s) in progress", key="connection:crm"), 3)
    assert t == policy.Defer(
        0.75,
        {
            "reason": "connection:crm: 2 call(s) in progress",
            "limit": "connection:crm",
            "delay_s": 0.75,
        },
    )


def test_an_open_circuit_parks_instead_of_burning_retries() -> None:
    from onward.errors import CircuitOpen

    t = error(CircuitOpen("provider:email", "circuit provider:email is open"), attempt=1)
    assert isinstance(t, policy.Stop)
    assert (t.step_status, t.run_status, t.wait_kind) == ("parked", "parked", "circuit")
    assert t.error is not None and t.error["circuit"] == "provider:email"
    # even on what would have been the last attempt: a circuit is not the step's failure
    assert error(CircuitOpen("provider:email", "open"), attempt=3).wait_kind == "circuit"


def test_an_exhausted_budget_parks_the_step() -> None:
    from onward.errors import BudgetExhausted

    t = error(BudgetExhausted("*", "usd", "budget * (usd): 1.0 of 1.0 used"), attempt=1)
    assert isinstance(t, policy.Stop) and t.wait_kind == "budget"
    assert t.error is not None and t.error["budget"] == "*"


def test_attempts_count_failures_not_claims() -> None:
    # two failures before: this is the third failed attempt of max 3 -> give up
    t = policy.after_error(
        RetryableError("503"), step_id="s", failures=2, retry=RetryPolicy(max_attempts=3)
    )
    assert isinstance(t, policy.Stop) and "gave up after 3 attempts" in t.reason
    # one failure before (however many claims deferrals made): retried
    t = policy.after_error(
        RetryableError("503"), step_id="s", failures=1, retry=RetryPolicy(max_attempts=3)
    )
    assert isinstance(t, policy.Retry)


def test_a_refused_call_of_a_cancelled_run_ends_it_cancelled() -> None:
    exc = RunCancelled("effect k: not called, the run was cancelled", detail={"effect_key": "k"})
    stop = policy.after_error(exc, step_id="send", failures=0, retry=RetryPolicy())
    assert isinstance(stop, policy.Stop)
    assert (stop.step_status, stop.run_status, stop.reason) == (
        "cancelled",
        "cancelled",
        "cancelled on request",
    )
    assert stop.error is not None and stop.error["type"] == "RunCancelled"
    assert stop == policy.cancelled(stop.error)


# -- which outputs a run's context keeps (issue 16) ------------------------------------------


def _doc(*steps: dict[str, Any]) -> AutomationDoc:
    return AutomationDoc.model_validate({"id": "reads", "steps": list(steps)})


def test_outputs_read_names_each_step_an_expression_reads() -> None:
    import onward.builtin_kinds  # noqa: F401  (registers set, branch, wait_until)
    from onward.kinds import registry

    doc = _doc(
        {"id": "a", "kind": "set", "with": {"values": {"x": "1"}}},
        {"id": "b", "kind": "set", "with": {"values": {"y": "steps.a.x + input.n"}}},
        {
            "id": "c",
            "kind": "branch",
            "with": {"cases": [{"when": "has(steps.b.y) && vars.x == 1", "next": "a"}]},
        },
        {"id": "d", "kind": "wait_for", "with": {"duration": "1s"}},
        {"id": "e", "kind": "set", "with": {"values": {"z": "vars.steps"}}},
    )
    assert policy.outputs_read(doc, registry) == frozenset({"a", "b"})


@pytest.mark.parametrize("expr", ["size(steps)", "steps['a'].x", "steps.a.x + steps['b'].y"])
def test_outputs_read_keeps_every_output_when_steps_is_read_as_a_whole(expr: str) -> None:
    import onward.builtin_kinds  # noqa: F401
    from onward.kinds import registry

    doc = _doc({"id": "a", "kind": "set", "with": {"values": {"x": expr}}})
    assert policy.outputs_read(doc, registry) is None


def test_outputs_read_keeps_every_output_for_a_kind_that_does_not_say() -> None:
    reg = Registry()
    reg.add(KindSpec(name="mine", lane="io", handler=_noop))
    assert policy.outputs_read(_doc({"id": "a", "kind": "mine"}), reg) is None
    reg.add(KindSpec(name="quiet", lane="io", handler=_noop, reads=lambda s, p: []))
    assert policy.outputs_read(_doc({"id": "a", "kind": "quiet"}), reg) == frozenset()
    # a ``reads`` that raises or answers something other than expressions keeps everything
    reg.add(KindSpec(name="odd", lane="io", handler=_noop, reads=lambda s, p: [3]))
    reg.add(KindSpec(name="bad", lane="io", handler=_noop, reads=lambda s, p: 1 / 0))
    assert policy.outputs_read(_doc({"id": "a", "kind": "odd"}), reg) is None
    assert policy.outputs_read(_doc({"id": "a", "kind": "bad"}), reg) is None


def test_a_proceed_keeps_its_output_only_when_read() -> None:
    reg = Registry()
    reg.add(KindSpec(name="mine", lane="io", handler=_noop))
    doc = _doc({"id": "a", "kind": "mine", "next": "b"}, {"id": "b", "kind": "mine"})
    kept = policy.after_result(1, step=doc.step("a"), doc=doc, registry=reg, visits={})
    dropped = policy.after_result(
        1, step=doc.step("a"), doc=doc, registry=reg, visits={}, reads=frozenset({"b"})
    )
    assert isinstance(kept, policy.Proceed) and kept.keep_output
    assert isinstance(dropped, policy.Proceed) and not dropped.keep_output
