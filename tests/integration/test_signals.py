"""Signals end to end (R9): stored once by their identity, kept when they come before their
step waits, routed by the correlation key the email step records, refused (and recorded) for a
finished run, and racing a deadline with exactly one winner."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from onward import Automation, InvalidInput, SignalRefused, UnknownRun
from onward.engine import Engine
from onward.testing import eventually, history


def flow(automation_id: str = "reply", *, deadline: str = "30s", before: str = "0s") -> dict:
    return (
        Automation(automation_id)
        .step("before", "wait_for", duration=before)
        .step("wait", "wait_signal", signals=["reply", "unsubscribe"], deadline=deadline)
        .step("after", "set", values={"got": "steps.wait.signal"})
        .build()
    )


async def waits_on_signals(sql: psycopg.Connection[Any], run_id: str) -> None:
    async def check() -> Any:
        return sql.execute(
            "SELECT 1 FROM steps WHERE run_id = %s AND status = 'waiting' AND wait_kind = 'signal'",
            (run_id,),
        ).fetchone()

    await eventually(check, what="the step waits on signals")


def signal_row(sql: psycopg.Connection[Any], signal_id: str) -> dict[str, Any]:
    row = sql.execute("SELECT * FROM signals WHERE signal_id = %s", (signal_id,)).fetchone()
    assert row is not None
    return row


def step_output(sql: psycopg.Connection[Any], run_id: str, step_id: str) -> Any:
    row = sql.execute(
        "SELECT output FROM steps WHERE run_id = %s AND step_id = %s", (run_id, step_id)
    ).fetchone()
    assert row is not None
    return row["output"]


async def test_a_signal_that_comes_before_its_step_waits_is_kept_and_consumed_then(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(flow(before="1s"))
    run_id = (await engine.start("reply", {}, event_id="e1")).run_id
    got = await engine.signal("evt-early", "reply", run_id=run_id, payload={"text": "yes"})
    assert (got.status, got.duplicate) == ("pending", False)
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    out = step_output(sql, run_id, "wait")
    assert out["signal"] == "reply" and out["payload"] == {"text": "yes"} and not out["timed_out"]
    row = signal_row(sql, "evt-early")
    assert (row["status"], row["seq"]) == ("consumed", 2)
    (consumed,) = history(sql, run_id, "signal_consumed")
    assert consumed["detail"]["signal_id"] == "evt-early"
    assert consumed["detail"]["deadline"] == "lost"
    timer = sql.execute(
        "SELECT fired_by FROM timers WHERE run_id = %s AND purpose = 'deadline'", (run_id,)
    ).fetchone()
    assert timer is not None and timer["fired_by"] == "signal"


async def test_a_signal_delivered_three_times_and_out_of_order_is_consumed_once(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(flow())
    run_id = (await engine.start("reply", {}, event_id="e2")).run_id
    async with engine.running():
        await waits_on_signals(sql, run_id)
    # no worker while the signals arrive: the run cannot finish before the second one (it would
    # then be refused, not kept), however slow this process is beside the workers
    answers = [
        await engine.signal("evt-b", "reply", run_id=run_id, payload={"n": 1}),
        await engine.signal("evt-a", "unsubscribe", run_id=run_id),
        await engine.signal("evt-b", "reply", run_id=run_id, payload={"n": 1}),
        await engine.signal("evt-b", "reply", run_id=run_id, payload={"n": 1}),
    ]
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    assert answers[0].status == "consumed"
    assert [a.duplicate for a in answers] == [False, False, True, True]
    assert signal_row(sql, "evt-b")["deliveries"] == 3
    assert step_output(sql, run_id, "wait")["signal"] == "reply"
    assert len(history(sql, run_id, "signal_consumed")) == 1
    # the second signal found no step waiting on it: kept, never consumed twice
    assert signal_row(sql, "evt-a")["status"] == "pending"


async def test_a_signal_for_a_finished_run_is_refused_and_recorded(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(flow(deadline="0.2s"))
    run_id = (await engine.start("reply", {}, event_id="e3")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    assert step_output(sql, run_id, "wait")["timed_out"] is True
    with pytest.raises(SignalRefused, match="completed"):
        await engine.signal("evt-late", "reply", run_id=run_id)
    row = signal_row(sql, "evt-late")
    assert row["status"] == "refused" and "completed" in row["reason"]
    (refused,) = history(sql, run_id, "signal_refused")
    assert refused["detail"]["signal_id"] == "evt-late"
    # a repeat reads back the same refusal, and stores nothing new
    with pytest.raises(SignalRefused):
        await engine.signal("evt-late", "reply", run_id=run_id)
    assert signal_row(sql, "evt-late")["deliveries"] == 2
    assert len(history(sql, run_id, "signal_refused")) == 1


async def test_bad_signals_are_refused_before_anything_is_stored(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    with pytest.raises(UnknownRun):
        await engine.signal("evt-x", "reply", run_id="run_nope")
    with pytest.raises(InvalidInput, match="one of them"):
        await engine.signal("evt-x", "reply")
    with pytest.raises(InvalidInput, match="name"):
        await engine.signal("evt-x", "", correlation_key="email:m1")
    with pytest.raises(InvalidInput):
        await engine.signal("evt-x", "reply", correlation_key="email:m1", payload={"a": "\x00"})
    assert sql.execute("SELECT count(*) AS n FROM signals").fetchone() == {"n": 0}


async def test_an_unrouted_signal_is_kept_and_adopted_when_its_key_is_recorded(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    from onward import signals

    got = await engine.signal("evt-u", "reply", correlation_key="email:msg_later")
    assert (got.status, got.run_id) == ("unrouted", None)
    assert [s["signal_id"] for s in await engine.signals(unrouted=True)] == ["evt-u"]
    await engine.publish(flow(before="0.5s"))
    run_id = (await engine.start("reply", {}, event_id="e4")).run_id
    async with engine.pool.connection() as conn:
        adopted = await signals.correlate(
            conn, engine.org_id, "email:msg_later", run_id=run_id, seq=1, step_id="before"
        )
    assert adopted == ["evt-u"]
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    assert step_output(sql, run_id, "wait")["signal"] == "reply"
    assert signal_row(sql, "evt-u")["run_id"] == run_id
