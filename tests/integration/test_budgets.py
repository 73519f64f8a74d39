"""Runaway runs (R13): every run has a budget of steps executed and of total age, enforced by
the engine -- by the worker when it claims a step, and by the sweep for runs that wait."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from onward import Automation, StepContext, step_kind
from onward.engine import Engine
from onward.testing import eventually, history, run_row, steps


@step_kind("budgets.nap", lane="io", replace=True)
async def _nap(step: StepContext) -> dict[str, Any]:
    await asyncio.sleep(float(step.params["seconds"]))
    return {"slept": step.params["seconds"]}


def loop_flow(max_steps: int) -> dict[str, Any]:
    """count -> again -> count -> ... forever, with no wait in between."""
    return (
        Automation("loop", max_steps=max_steps)
        .step("init", "set", values={"n": "0"})
        .step("count", "set", values={"n": "vars.n + 1"})
        .goto("again", "count")
        .build()
    )


async def test_a_goto_loop_without_a_wait_is_stopped_by_the_step_budget(
    engine: Engine, sql: psycopg.Connection
) -> None:
    max_steps = 11
    await engine.publish(loop_flow(max_steps))
    started = await engine.start("loop", {}, event_id="loop-1")
    async with engine.running():
        assert await engine.wait(started.run_id, timeout=20) == "exceeded"

    run = run_row(sql, started.run_id)
    assert run["steps_executed"] == max_steps == run["max_steps"]
    assert "step budget" in run["status_reason"] and str(max_steps) in run["status_reason"]
    assert run["finished_at"] is not None
    # init + 5 x (count, again): 11 steps done, the 12th was stopped before it ran
    assert run["ctx"]["vars"]["n"] == 5

    events = history(sql, started.run_id)
    assert events[-1]["event"] == "run_exceeded"
    assert "step budget" in events[-1]["detail"]["reason"]
    done = [e for e in events if e["event"] == "step_done"]
    assert len(done) == max_steps
    stopped = [
        (s["seq"], s["step_id"], s["status"])
        for s in steps(sql, started.run_id)
        if s["status"] != "done"
    ]
    assert stopped == [(max_steps + 1, "count", "cancelled")]
    # the iteration number kept counting through the loop (effect keys differ per pass)
    assert max(s["iteration"] for s in steps(sql, started.run_id, "count")) == 6


async def test_steps_executed_never_exceeds_max_steps(
    engine: Engine, sql: psycopg.Connection
) -> None:
    for max_steps in (1, 2, 3):
        await engine.publish(loop_flow(max_steps))  # a new version each time
    runs = {
        version: await engine.start("loop", {}, version=version, event_id=f"v{version}")
        for version in (1, 2, 3)
    }
    async with engine.running():
        for started in runs.values():
            assert await engine.wait(started.run_id, timeout=20) == "exceeded"
    for max_steps, started in runs.items():
        run = run_row(sql, started.run_id)
        assert run["steps_executed"] == max_steps, (max_steps, run)
        dones = len(history(sql, started.run_id, "step_done"))
        assert dones == max_steps


async def test_a_short_run_within_its_budget_completes(engine: Engine) -> None:
    flow = Automation("tiny", max_steps=2).step("a", "set", values={"x": "1"})
    await engine.publish(flow.step("b", "set", values={"y": "2"}).build())
    started = await engine.start("tiny", {}, event_id="tiny")
    async with engine.running():
        assert await engine.wait(started.run_id, timeout=20) == "completed"


async def test_a_waiting_run_past_its_max_age_is_ended_by_the_sweep(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(
        Automation("patient", max_age="1s")
        .step("pause", "wait_for", duration="1h")
        .step("never", "set", values={"x": "1"})
        .build()
    )
    started = await engine.start("patient", {}, event_id="patient-1")
    async with engine.running():

        async def waiting() -> bool:
            return await engine.status(started.run_id) == "waiting"

        await eventually(waiting, what="run waiting on its 1h timer")
        assert await engine.wait(started.run_id, timeout=20) == "exceeded"

    run = run_row(sql, started.run_id)
    assert "maximum age" in run["status_reason"]
    assert run["finished_at"] is not None
    events = history(sql, started.run_id)
    assert events[-1]["event"] == "run_exceeded"
    assert "maximum age" in events[-1]["detail"]["reason"]
    step = [(s["status"], s["finished_at"] is not None) for s in steps(sql, started.run_id)]
    assert step == [("cancelled", True)]
    timer = sql.execute(
        "SELECT fired_by FROM timers WHERE run_id = %s", (started.run_id,)
    ).fetchall()
    assert timer == [{"fired_by": "cancelled"}]  # the 1h timer will never wake it
    expired_at = sql.execute(
        "SELECT r.deadline_at <= h.at AS after_deadline FROM runs r JOIN history h"
        " USING (org_id, run_id) WHERE r.run_id = %s AND h.event = 'run_exceeded'",
        (started.run_id,),
    ).fetchone()
    assert expired_at == {"after_deadline": True}


async def test_an_active_run_past_its_max_age_is_stopped_at_its_next_step(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(
        Automation("slowpoke", max_age="1s")
        .step("slow", "budgets.nap", seconds=1.3)
        .step("next", "set", values={"x": "1"})
        .build()
    )
    started = await engine.start("slowpoke", {}, event_id="slowpoke-1")
    async with engine.running():
        assert await engine.wait(started.run_id, timeout=20) == "exceeded"
    run = run_row(sql, started.run_id)
    assert "maximum" in run["status_reason"] and "age" in run["status_reason"]
    assert run["steps_executed"] == 1
    assert "x" not in run["ctx"]["vars"]  # the step after the deadline never ran
    assert history(sql, started.run_id)[-1]["event"] == "run_exceeded"
