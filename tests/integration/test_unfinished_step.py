"""A run's one unfinished step when a running step is not in ``steps_one_unfinished``
(migration 0034, issue 16): a claim or an eager entry writes no entry in that index, the index
still refuses a second ready, waiting or parked step of a run, the lookups by run find the
unfinished step as its latest, and ``onward doctor`` reports a running step beside another
unfinished step of its run -- the one state the index no longer refuses, which the engine
never writes (a running step's successor is written by the statement that ends it)."""

from __future__ import annotations

import psycopg
import pytest

from onward import Automation
from onward.cancel import Q as cancel_q
from onward.chaos.runner import _ENTERED_EARLY
from onward.doctor import run_checks
from onward.engine import Engine

ORG = "test"  # the engine fixture's organisation


def _entries(sql: psycopg.Connection, index: str) -> int:
    """Every entry of the index, live or dead (no VACUUM between: each one a write's)."""
    sql.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    row = sql.execute(
        f"SELECT tuple_count + dead_tuple_count AS n FROM pgstattuple('{index}')"
    ).fetchone()
    assert row is not None
    return int(row["n"])


async def test_running_steps_write_no_entry_in_steps_one_unfinished(
    engine: Engine, sql: psycopg.Connection
) -> None:
    # three steps a run: the first claimed (ready -> running), the next two entered eagerly by
    # their predecessor's settle (inserted running). Each running version used to add an entry
    # (three a run); now only each run's first step, entered ready by its start, has one
    await engine.publish(
        Automation("three")
        .step("a", "set", values={"x": "1"})
        .step("b", "set", values={"y": "2"})
        .step("c", "set", values={"z": "3"})
        .build()
    )
    ids = [(await engine.start("three", {}, event_id=f"three-{i}")).run_id for i in range(8)]
    async with engine.running():
        ends = [await engine.wait(run_id, timeout=30) for run_id in ids]
    assert ends == ["completed"] * 8
    steps = sql.execute(
        "SELECT count(*) AS n, count(*) FILTER (WHERE attempt = 1) AS once FROM steps"
        " WHERE org_id = %s",
        (ORG,),
    ).fetchone()
    assert steps is not None and steps["n"] == steps["once"] == 24  # every step ran once
    assert _entries(sql, "steps_one_unfinished") <= len(ids)
    assert _entries(sql, "steps_leased") >= 3 * len(ids)  # each step was running, leased


async def test_the_index_refuses_two_waiting_steps_and_the_doctor_reports_a_running_pair(
    engine: Engine, sql: psycopg.Connection
) -> None:
    def step(run: str, seq: int, status: str) -> None:
        sql.execute(
            "INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, status, attempt,"
            " owner, lease_until, created_at, finished_at) VALUES (%s, %s, %s, %s, 'set',"
            " 'default', %s, 1, %s, %s, now() + make_interval(secs => %s),"
            " CASE WHEN %s = 'done' THEN now() + make_interval(secs => %s) END)",
            (
                ORG,
                run,
                seq,
                f"s{seq}",
                status,
                "w" if status == "running" else None,
                "infinity" if status == "running" else None,
                seq,  # a step is entered as the one before ends (settle_advance: one now())
                status,
                seq,
            ),
        )

    # a run waiting at its second step: the lookup by run finds that step, its latest
    step("r-wait", 1, "done")
    step("r-wait", 2, "waiting")
    row = sql.execute(cancel_q.lock_step, {"org_id": ORG, "run_id": "r-wait"}).fetchone()
    assert row is not None and (row["seq"], row["status"]) == (2, "waiting")
    # a second waiting step of the run is refused, as before
    with pytest.raises(psycopg.errors.UniqueViolation):
        step("r-wait", 3, "waiting")
    # a run whose latest step is done has no unfinished step to lock
    step("r-done", 1, "done")
    assert sql.execute(cancel_q.lock_step, {"org_id": ORG, "run_id": "r-done"}).fetchone() is None

    def two_unfinished() -> dict[str, object]:
        return next(c for c in checks if c.name == "two_unfinished_steps").as_dict()

    checks = await run_checks(engine)
    assert two_unfinished()["ok"] and two_unfinished()["value"] == 0
    # a running step with a later step beside it: the state no statement of the engine writes
    step("r-two", 1, "running")
    step("r-two", 2, "ready")
    checks = await run_checks(engine)
    found = two_unfinished()
    assert not found["ok"] and found["value"] == 1, found
    assert f"{ORG}/r-two" in str(found["detail"])
    # and `onward chaos` counts its step entered before the one it follows ended (r-wait's
    # second step was entered as its first ended: not counted)
    row = sql.execute(_ENTERED_EARLY, (ORG,)).fetchone()
    assert row is not None and row["n"] == 1, row
