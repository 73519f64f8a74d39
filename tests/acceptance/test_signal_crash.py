"""A process dies at crash point ``signal.after_claim`` -- in ``signals.consume``, after the
statement that consumed a signal and woke its step, before the transaction commits -- and the
signal is consumed exactly once all the same (R9).

* **The worker side.** A signal comes before its step waits (a short ``wait_for`` first), so
  the settle that makes the ``wait_signal`` step wait consumes it in its own transaction. A real
  worker process armed there dies with SIGKILL: the transaction aborts with it, so the signal is
  still ``pending``, the step still ``running`` (its lease lapsing) and it has no deadline timer.
  A second worker rescues the step and consumes the signal: once.
* **The intake side.** The step waits; ``onward signal`` (its own process) armed there dies
  while delivering: the signal was never stored (storing and consuming are one transaction),
  the step still waits with its deadline unfired. The sender delivers again under the same
  identity: consumed once, the deliveries counted from the one that was stored.
"""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.testing import (
    Processes,
    assert_nothing_applied_twice,
    eventually,
    history,
    run_onward,
    step_row,
)
from tests.acceptance.procs import worker_settings

pytestmark = pytest.mark.acceptance

POINT = "signal.after_claim"
ORG = "test"  # the `settings` fixture's organisation, and the worker processes'
LEASE = 2.0


def onward_signal(
    db_url: str, run_id: str, signal_id: str, *, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``onward signal reply --id SIGNAL_ID --run RUN_ID --json``: the intake in its own
    process (the sender's side), with ``crash_at`` armed."""
    env = {"ONWARD_CRASH_AT": crash_at} if crash_at else None
    return run_onward(
        db_url,
        "--org",
        ORG,
        "signal",
        "reply",
        "--id",
        signal_id,
        "--run",
        run_id,
        "--json",
        env=env,
    )


def flow(automation_id: str, *, before: str | None = None) -> dict[str, Any]:
    automation = Automation(automation_id)
    if before is not None:
        automation = automation.step("before", "wait_for", duration=before)
    return (
        automation.step("wait", "wait_signal", signals=["reply"], deadline="30s")
        .step("after", "set", values={"got": "steps.wait.signal"})
        .build()
    )


def signal_row(sql: psycopg.Connection[Any], signal_id: str) -> dict[str, Any] | None:
    return sql.execute("SELECT * FROM signals WHERE signal_id = %s", (signal_id,)).fetchone()


def deadline_timers(sql: psycopg.Connection[Any], run_id: str) -> list[dict[str, Any]]:
    return list(
        sql.execute(
            "SELECT * FROM timers WHERE run_id = %s AND purpose = 'deadline'", (run_id,)
        ).fetchall()
    )


def wait_output(sql: psycopg.Connection[Any], run_id: str) -> dict[str, Any]:
    row = sql.execute(
        "SELECT output FROM steps WHERE run_id = %s AND step_id = 'wait'", (run_id,)
    ).fetchone()
    assert row is not None
    out: dict[str, Any] = row["output"]
    return out


async def test_a_worker_killed_after_consuming_a_signal_in_its_settle_leaves_it_pending(
    db_url: str, engine: Engine, sql: psycopg.Connection[Any], processes: Processes
) -> None:
    await engine.publish(flow("crash-settle", before="0.2s"))
    run_id = (await engine.start("crash-settle", {}, event_id="e-settle")).run_id
    # the signal comes before its step waits: kept, for the settle that makes the step wait
    got = await engine.signal("sig-a", "reply", run_id=run_id, payload={"text": "yes"})
    assert (got.status, got.duplicate) == ("pending", False)

    settings = worker_settings(db_url, sweep=0.2, lease=LEASE)
    a = processes.worker(settings, "w-a", crash_at=POINT, sweeper=False)
    assert await a.exited(timeout=30) == -signal.SIGKILL, a.tail(3000)
    assert f"crash point {POINT} reached" in a.log_text()

    # the settle's transaction aborted with the process: nothing of it is left
    wait = step_row(sql, run_id, 2)
    assert (wait["step_id"], wait["status"], wait["attempt"]) == ("wait", "running", 1)
    assert wait["lease_until"] is not None  # lapsing: the rescue makes it ready again
    row = signal_row(sql, "sig-a")
    assert row is not None
    assert (row["status"], row["seq"], row["consumed_at"]) == ("pending", None, None)
    assert history(sql, run_id, "signal_consumed") == []
    assert history(sql, run_id, "step_waiting", seq=2) == []
    assert deadline_timers(sql, run_id) == []

    b = processes.worker(settings, "w-b", sweeper=True, leader_ttl=LEASE)
    assert await engine.wait(run_id, timeout=30) == "completed"
    assert b.alive(), b.tail(3000)

    row = signal_row(sql, "sig-a")
    assert row is not None
    assert (row["status"], row["seq"], row["deliveries"]) == ("consumed", 2, 1)
    (consumed,) = history(sql, run_id, "signal_consumed")
    assert consumed["detail"]["signal_id"] == "sig-a" and consumed["seq"] == 2
    assert consumed["worker"] == "w-b"
    out = wait_output(sql, run_id)
    assert (out["signal"], out["timed_out"], out["payload"]) == ("reply", False, {"text": "yes"})
    (timer,) = deadline_timers(sql, run_id)  # written once, by the settle that committed
    assert timer["fired_by"] == "signal"
    assert len(history(sql, run_id, "lease_expired", seq=2)) == 1  # rescued, not re-run twice
    assert_nothing_applied_twice(sql)
    assert b.stop() == 0


async def test_an_intake_killed_after_consuming_a_signal_stores_nothing_and_a_redelivery_wins(
    db_url: str, engine: Engine, sql: psycopg.Connection[Any], processes: Processes
) -> None:
    await engine.publish(flow("crash-intake"))
    run_id = (await engine.start("crash-intake", {}, event_id="e-intake")).run_id
    w = processes.worker(worker_settings(db_url, sweep=0.2, lease=LEASE), "w", sweeper=True)

    async def waits() -> Any:
        assert w.alive(), w.tail(3000)
        return sql.execute(
            "SELECT 1 FROM steps WHERE run_id = %s AND status = 'waiting' AND wait_kind = 'signal'",
            (run_id,),
        ).fetchone()

    await eventually(waits, timeout=30, what="the step to wait on signals")
    (timer,) = deadline_timers(sql, run_id)

    died = onward_signal(db_url, run_id, "sig-b", crash_at=POINT)
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert f"crash point {POINT} reached" in died.stderr
    assert died.stdout == ""  # no answer: the sender will deliver again

    # stored and consumed in one transaction, which died with the process
    assert signal_row(sql, "sig-b") is None
    wait = step_row(sql, run_id, 1)
    assert (wait["status"], wait["wait_kind"]) == ("waiting", "signal")
    (still,) = deadline_timers(sql, run_id)
    assert (still["timer_id"], still["fired_at"], still["fired_by"]) == (
        timer["timer_id"],
        None,
        None,
    )
    assert history(sql, run_id, "signal_consumed") == []
    assert sql.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,)).fetchone() == {
        "status": "waiting"
    }

    # the sender got no answer and delivers again, under the same identity
    redelivered = onward_signal(db_url, run_id, "sig-b")
    assert redelivered.returncode == 0, redelivered.stderr
    again = json.loads(redelivered.stdout)
    assert (again["status"], again["duplicate"], again["deliveries"]) == ("consumed", False, 1)
    repeat = await engine.signal("sig-b", "reply", run_id=run_id)
    assert (repeat.status, repeat.duplicate, repeat.deliveries) == ("consumed", True, 2)
    assert await engine.wait(run_id, timeout=30) == "completed"

    row = signal_row(sql, "sig-b")
    assert row is not None
    assert (row["status"], row["seq"], row["deliveries"]) == ("consumed", 1, 2)
    (consumed,) = history(sql, run_id, "signal_consumed")
    assert consumed["detail"] == {
        "signal_id": "sig-b",
        "name": "reply",
        "deadline_timer": timer["timer_id"],
        "deadline": "lost",
    }
    assert wait_output(sql, run_id)["signal"] == "reply"
    (closed,) = deadline_timers(sql, run_id)
    assert closed["fired_by"] == "signal"
    assert history(sql, run_id, "timer_fired") == []
    assert_nothing_applied_twice(sql)
    assert w.stop() == 0
