"""A step whose output is its variables stores them once (migration 0032, issue 16).

A ``set`` step returns one dict as its output and as its variables. Its settle
(``leases.sql settle_advance``) stores it once, as the step row's ``vars``, and leaves
``output`` NULL; every reader of a step's output reads it through ``onward_step_output``
(``coalesce(output, vars)``): the run's screen (``history.sql steps_of_run``), a fork
(``actions.sql fork_steps``), a migration's outputs (``run_migrations.sql outputs``). A step
whose output is not its variables keeps both columns as before.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.run_migrations import Q as migrations_q
from onward.testing import steps

ORG = "test"
Sql = psycopg.Connection[dict[str, Any]]

pytestmark = pytest.mark.usefixtures("admin")


def flow() -> dict[str, Any]:
    # b reads a's output (kept in the run's context); c divides by zero: the run fails at c,
    # so it can be forked from there
    return (
        Automation("once")
        .step("a", "set", values={"v": "1", "w": "'two'"})
        .step("b", "set", values={"x": "steps.a.v + 1"})
        .step("c", "set", values={"y": "vars.x / 0"})
        .build()
    )


async def test_a_set_step_stores_its_variables_once_and_every_reader_shows_its_output(
    engine: Engine, sql: Sql
) -> None:
    await engine.publish(flow())
    run_id = (await engine.start("once", {}, event_id="once-1")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "failed"

    (a,) = steps(sql, run_id, "a")
    (b,) = steps(sql, run_id, "b")
    # stored once: the variables, and no second copy as the output
    assert (a["status"], a["output"], a["vars"]) == ("done", None, {"v": 1, "w": "two"}), a
    assert (b["output"], b["vars"]) == (None, {"x": 2}), b
    # the rule, in the database: a settled step's output is coalesce(output, vars)
    row = sql.execute(
        "SELECT onward_step_output(s) AS output FROM steps s WHERE s.run_id = %s AND s.seq = 1",
        (run_id,),
    ).fetchone()
    assert row is not None and row["output"] == {"v": 1, "w": "two"}

    # the run's screen (and the API's run, which is the same read)
    shown = await engine.show(run_id)
    outputs = {s["step_id"]: s["output"] for s in shown["steps"]}
    assert outputs["a"] == {"v": 1, "w": "two"} and outputs["b"] == {"x": 2}, outputs
    # b read a's output: the settle kept it in the run's context from the variables
    assert shown["run"]["ctx"]["steps"]["a"] == {"v": 1, "w": "two"}, shown["run"]

    # a migration's outputs of the run's settled steps
    got = sql.execute(migrations_q.outputs, {"org_id": ORG, "run_id": run_id}).fetchall()
    assert {r["step_id"]: r["output"] for r in got} == {
        "a": {"v": 1, "w": "two"},
        "b": {"x": 2},
    }

    # a fork from c knows a's and b's outputs as the run did (its run row, before it runs)
    forked = await engine.fork(run_id, by="ops@example.com", from_step="c")
    fork_row = sql.execute("SELECT ctx FROM runs WHERE run_id = %s", (forked.run_id,)).fetchone()
    assert fork_row is not None
    assert fork_row["ctx"]["vars"] == {"v": 1, "w": "two", "x": 2}, fork_row
    assert fork_row["ctx"]["steps"].get("a") == {"v": 1, "w": "two"}, fork_row
    # the fork's copies of a and b keep the stored form, and read as the outputs
    copies = {s["step_id"]: s for s in (await engine.show(forked.run_id))["steps"]}
    assert copies["a"]["output"] == {"v": 1, "w": "two"}, copies
