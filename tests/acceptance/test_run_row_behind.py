"""A settle that enters the next step eagerly leaves the run's row behind (migration 0030): the
run's variables, visits, count and position are carried by the steps since. A worker killed in
such a chain (``worker.after_settle``, after its second settle committed) leaves the row behind
with a step running under a dead lease; what reads the run shows it as it is, and the rescue
that hands the step on catches the row up in its own statement, before any worker claims it.

The processes are ``python -m onward.testing.worker`` (tests/acceptance/procs.py). The third
step runs in a lane the second process does not serve, so the rescued step stays ready and the
caught-up row can be read before a third process finishes the run.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.testing import Processes, eventually, run_row, step_row
from tests.acceptance.procs import KINDS, worker_settings

pytestmark = pytest.mark.acceptance

KILLED = -signal.SIGKILL
Sql = psycopg.Connection[dict[str, Any]]


def flow() -> dict[str, Any]:
    return (
        Automation("behind")
        .step("a", "set", values={"v1": "1"})
        .step("b", "set", values={"v2": "2", "v1": "11"})
        .step("c", "set", lane="slow", values={"v3": "3"})
        .build()
    )


async def test_a_chain_killed_with_its_run_row_behind_is_caught_up_by_the_rescue(
    engine: Engine, sql: Sql, db_url: str, processes: Processes
) -> None:
    await engine.publish(flow())
    run_id = (await engine.start("behind", {}, event_id="behind-1")).run_id
    settings = worker_settings(db_url, lease=2.0)

    # a and b settle in one chain (c is eager too: proc-a serves both lanes); the second
    # settle's commit is the last thing proc-a does
    a = processes.worker(
        settings,
        "proc-a",
        kinds=KINDS,
        crash_at="worker.after_settle@2",
        lanes="fast=4,slow=4",
        sweeper=False,
    )
    assert await a.exited(timeout=30) == KILLED, a.log_text()
    assert a.printed("onward: crash point worker.after_settle reached, SIGKILL"), a.log_text()

    step = step_row(sql, run_id, 3)
    assert (step["status"], step["attempt"], step["owner"]) == ("running", 1, "proc-a"), step
    row = run_row(sql, run_id)
    # the row as the start wrote it: both settles left it alone
    assert (row["status"], row["current_seq"], row["steps_executed"]) == ("active", 1, 0), row
    assert row["ctx"]["vars"] == {} and row["visits"] == {"a": 1}, row
    # what a reader is shown: the run as it is
    shown = (await engine.show(run_id))["run"]
    assert (shown["current_seq"], shown["steps_executed"]) == (3, 2), shown
    assert shown["ctx"]["vars"] == {"v1": 11, "v2": 2}, shown  # b's v1 wins over a's

    # the rescue (proc-b's sweeper) makes step 3 ready, and catches the row up with it
    b = processes.worker(settings, "proc-b", kinds=KINDS, lanes="fast=4", sweeper=True)

    async def rescued() -> bool:
        return step_row(sql, run_id, 3)["status"] == "ready"

    await eventually(rescued, timeout=30, what="step 3 rescued")
    row = run_row(sql, run_id)
    assert (row["current_seq"], row["steps_executed"]) == (3, 2), row
    assert row["ctx"]["vars"] == {"v1": 11, "v2": 2}, row
    assert row["visits"] == {"a": 1, "b": 1, "c": 1}, row

    c = processes.worker(settings, "proc-c", kinds=KINDS, lanes="slow=4", sweeper=False)

    async def completed() -> bool:
        return run_row(sql, run_id)["status"] == "completed"

    await eventually(completed, timeout=30, what="the run completed")
    row = run_row(sql, run_id)
    assert (row["current_seq"], row["steps_executed"]) == (3, 3), row
    assert row["ctx"]["vars"] == {"v1": 11, "v2": 2, "v3": 3}, row
    assert step_row(sql, run_id, 3)["attempt"] == 2
    b.terminate()
    c.terminate()
