"""A worker killed just after its fire of timer wakes committed (``timer.after_fire``) loses
nothing and fires nothing twice, whether its fire claimed the woken step for itself (eager: it had
a free slot in the step's lane) or made it ready for anyone.

The worker processes are ``python -m onward.testing.worker`` (tests/acceptance/procs.py), with
their relay and the Redis queue (a prefix of this test's own): the relay hands the timer's
delayed wake to Redis at once, and at its instant a worker's consumer takes it and fires the
timer. (With the PostgreSQL queue the relay fires it itself, in its own transaction:
``relay.after_publish``.) The first process runs no sweeper, so only its wake fires the timer;
the second one does, and finishes the run.
"""

from __future__ import annotations

import secrets
import signal
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.testing import Process, Processes, eventually, history, run_row, step_row
from tests.acceptance.procs import KINDS, worker_settings

pytestmark = pytest.mark.acceptance

KILLED = -signal.SIGKILL
Sql = psycopg.Connection[dict[str, Any]]


def nap_flow() -> dict[str, Any]:
    return (
        Automation("nap")
        .step("wait", "wait_for", duration="3s")
        .step("after", "set", values={"woke": "true"})
        .build()
    )


def hog_flow() -> dict[str, Any]:
    """A long step in the ``wait`` lane: it holds that lane's one slot of the first worker."""
    return Automation("hog").step("hog", "test.sleep", lane="wait", seconds=60).build()


def died_at(proc: Process, point: str) -> None:
    assert proc.printed(f"onward: crash point {point} reached, SIGKILL"), proc.log_text()


def timers_of(sql: Sql, run_id: str) -> list[dict[str, Any]]:
    return sql.execute(
        "SELECT timer_id, fired_at, fired_by FROM timers WHERE run_id = %s", (run_id,)
    ).fetchall()


async def completed(sql: Sql, run_id: str) -> bool:
    return run_row(sql, run_id)["status"] == "completed"


async def waiting(sql: Sql, run_id: str) -> bool:
    return step_row(sql, run_id, 1)["status"] == "waiting"


async def running(sql: Sql, run_id: str) -> bool:
    return step_row(sql, run_id, 1)["status"] == "running"


@pytest.mark.parametrize("eager", [True, False], ids=["claimed-by-the-fire", "made-ready"])
async def test_a_worker_killed_after_its_timer_fire_loses_nothing(
    engine: Engine, sql: Sql, db_url: str, processes: Processes, eager: bool
) -> None:
    """The first worker serves the ``wait`` lane with one slot. Eager: the slot is free when
    the wake arrives, so the fire claims the woken step for the dying worker (running, attempt
    2, its lease) and the sweeper's rescue hands it on when the lease lapses. Not eager: another
    run's long step holds the slot, so the fire makes the step ready with its outbox wake and
    the next worker runs it. Either way the timer fired once, by its wake, with one
    ``timer_fired`` row, and the run completes."""
    await engine.publish(nap_flow())
    await engine.publish(hog_flow())
    run_id = (await engine.start("nap", {}, event_id=f"nap-{eager}")).run_id

    settings = replace(
        worker_settings(db_url, lease=2.0, queue="redis"), queue_prefix=f"t{secrets.token_hex(4)}"
    )

    def spawn(name: str, **options: Any) -> Process:
        return processes.worker(settings, name, kinds=KINDS, **options)

    a = spawn("proc-a", crash_at="timer.after_fire", lanes="wait=1,fast=4")
    await eventually(lambda: waiting(sql, run_id), timeout=20, what="the run waiting")
    if not eager:
        hog = (await engine.start("hog", {}, event_id="hog")).run_id
        await eventually(lambda: running(sql, hog), timeout=20, what="the hog running")
        assert step_row(sql, run_id, 1)["status"] == "waiting"  # before its timer is due
    assert await a.exited(timeout=30) == KILLED, a.log_text()
    died_at(a, "timer.after_fire")

    [timer] = timers_of(sql, run_id)
    assert timer["fired_by"] == "wake" and timer["fired_at"] is not None
    step = step_row(sql, run_id, 1)
    assert step["wake"]["by"] == "timer", step
    if eager:
        assert (step["status"], step["attempt"], step["owner"]) == ("running", 2, "proc-a")
    else:
        assert (step["status"], step["attempt"], step["owner"]) == ("ready", 1, None)

    b = spawn("proc-b", lanes="wait=4,fast=4", sweeper=True)
    await eventually(lambda: completed(sql, run_id), timeout=30, what="the run completed")

    assert timers_of(sql, run_id) == [timer]  # fired once, never again
    assert len(history(sql, run_id, "timer_fired")) == 1
    ended = [(h["event"], h["attempt"]) for h in history(sql, run_id, seq=1)]
    if eager:  # the dead worker's claim lapsed and was rescued; the next attempt ran it
        assert ended[-3:] == [("timer_fired", 1), ("lease_expired", 2), ("step_done", 3)], ended
    else:
        assert ended[-2:] == [("timer_fired", 1), ("step_done", 2)], ended
    assert [h["event"] for h in history(sql, run_id, seq=2)] == ["step_done"]
    b.terminate()
