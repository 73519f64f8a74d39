"""A process erasing a contact dies between two of the erasure's transactions (R14), and the
erasure still completes: nothing is left holding the contact's identifiers without a record
that erasure was asked for.

* ``erasure.after_record`` -- ``onward contacts erase`` (a real process) dies after the record
  committed: the ``erasures`` row is ``pending``, the contact's waiting runs are cancelled and
  every run carries the pseudonym, but no run is erased yet (its input still holds the
  address). The same command again completes it: every run erased, ``done``, and a scan of
  every text/jsonb/text[] column finds nothing.
* ``erasure.after_run`` -- the process dies after the first run was erased: that run is
  erased, the others not, the row ``pending``. Nobody asks again: the elected sweeper of a
  worker process finishes it.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.testing import eventually, run_onward, run_row
from tests.acceptance.conftest import Spawn
from tests.integration.test_erasure import scan

pytestmark = pytest.mark.acceptance

MAYA_ID = "contact-maya-7f3a"
MAYA = "maya@example.test"
NEEDLES = [MAYA_ID, MAYA]


async def three_runs(engine: Engine, sql: psycopg.Connection[Any]) -> list[str]:
    """Two of Maya's runs waiting an hour, one completed; one run of someone else's."""
    await engine.publish(
        Automation("hello")
        .step("greet", "set", values={"to": "input.email"})
        .step("wait", "wait_for", duration="1h")
        .build()
    )
    await engine.publish(
        Automation("quick").step("greet", "set", values={"to": "input.email"}).build()
    )
    ids = []
    for n, automation in enumerate(("hello", "hello", "quick")):
        run = await engine.start(automation, {"email": MAYA}, event_id=f"m{n}", contact_id=MAYA_ID)
        ids.append(run.run_id)
    await engine.start("hello", {"email": "ravi@example.test"}, event_id="r", contact_id="ravi")
    async with engine.running():

        async def settled() -> bool:
            states = [run_row(sql, r)["status"] for r in ids]
            return states == ["waiting", "waiting", "completed"]

        await eventually(settled, what="two runs waiting, one completed", timeout=30)
    return ids


def erase(db_url: str, crash_at: str | None = None) -> Any:
    env = {"ONWARD_CRASH_AT": crash_at} if crash_at else None
    return run_onward(db_url, "--org", "test", "contacts", "erase", MAYA_ID, "--json", env=env)


def erasure_row(sql: psycopg.Connection[Any]) -> dict[str, Any]:
    (row,) = sql.execute("SELECT * FROM erasures").fetchall()
    return dict(row)


async def test_killed_after_the_record_the_same_request_completes_it(
    engine: Engine, db_url: str, sql: psycopg.Connection[Any]
) -> None:
    runs = await three_runs(engine, sql)

    died = erase(db_url, crash_at="erasure.after_record")
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert "crash point erasure.after_record reached" in died.stderr
    # the record is durable: pending, runs cancelled and pseudonymised, none erased yet
    row = erasure_row(sql)
    assert row["status"] == "pending"
    states = [run_row(sql, r) for r in runs]
    assert [s["status"] for s in states] == ["cancelled", "cancelled", "completed"]
    assert all(s["contact_id"] == row["subject"] and s["erased_at"] is None for s in states)
    assert "runs.input: maya@example.test" in scan(sql, NEEDLES)  # still there, but tracked
    assert sql.execute(
        "SELECT count(*) AS n FROM suppressions WHERE contact = %s", (MAYA,)
    ).fetchone() == {"n": 0}

    again = erase(db_url)
    assert again.returncode == 0, again.stderr
    assert erasure_row(sql)["status"] == "done"
    assert scan(sql, NEEDLES) == {}
    assert all(run_row(sql, r)["erased_at"] is not None for r in runs)
    assert run_row(sql, runs[0])["status"] == "cancelled"  # cancelled once, by the first
    assert sql.execute(
        "SELECT count(*) AS n FROM history WHERE event = 'run_cancelled'"
    ).fetchone() == {"n": 2}


async def test_killed_between_runs_the_elected_sweeper_completes_it(
    engine: Engine, db_url: str, sql: psycopg.Connection[Any], spawn: Spawn
) -> None:
    runs = await three_runs(engine, sql)

    died = erase(db_url, crash_at="erasure.after_run@1")
    assert died.returncode == -signal.SIGKILL, died.stderr
    erased = [run_row(sql, r)["erased_at"] is not None for r in runs]
    assert erased == [True, False, False]
    assert erasure_row(sql)["status"] == "pending"
    assert scan(sql, NEEDLES)  # the two other runs still hold her address

    spawn("sweeper0", sweeper=True)

    async def completed() -> bool:
        return erasure_row(sql)["status"] == "done"

    await eventually(completed, what="the sweeper completing the erasure", timeout=30)
    assert scan(sql, NEEDLES) == {}
    assert erasure_row(sql)["runs_erased"] == 3
    assert sql.execute(
        "SELECT count(*) AS n FROM history WHERE event = 'run_erased'"
    ).fetchone() == {"n": 3}
    assert run_row(sql, runs[2])["status"] == "completed"
