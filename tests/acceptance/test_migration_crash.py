"""A migration's driver is SIGKILLed inside a batch (crash point ``migrate.in_batch``: the
batch's runs moved, their ``run_migrated`` rows written, the operation's progress not yet
committed). The batch and its progress are one transaction, so the kill aborts both; the
operation, resumed from its cursor, moves every remaining run once. Afterwards every run is on
exactly one version with exactly one ``run_migrated`` row, and the runs complete on the new
version.

The driver is a real ``onward runs migrate`` process (batches of 10), killed in its second
batch; the runs wait on a signal or a timer (an in-process worker brought them there)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from onward import operations
from onward.engine import Engine
from onward.testing import Processes, eventually, history, onward_argv, process_env
from tests.integration.test_run_migrations import ID, at, doc, finished, publish_v3, start

pytestmark = pytest.mark.acceptance


def on_version(sql: psycopg.Connection[Any], version: int) -> list[str]:
    rows = sql.execute(
        "SELECT run_id FROM runs WHERE automation_id = %s AND version = %s ORDER BY run_id",
        (ID, version),
    ).fetchall()
    return [r["run_id"] for r in rows]


def migrated_rows(sql: psycopg.Connection[Any]) -> dict[str, int]:
    rows = sql.execute(
        "SELECT run_id, count(*) AS n FROM history WHERE event = 'run_migrated' GROUP BY run_id"
    ).fetchall()
    return {r["run_id"]: r["n"] for r in rows}


async def test_a_migration_killed_inside_a_batch_resumes_and_moves_every_run_exactly_once(
    db_url: str, engine: Engine, sql: psycopg.Connection[Any], processes: Processes
) -> None:
    await publish_v3(engine)
    async with engine.running():
        waiting = await start(engine, "signal", 15, "a")
        timed = await start(engine, "wait", 10, "a")
        await at(sql, waiting, "waiting", "reply")
        await at(sql, timed, "waiting", "pause")
    await engine.publish(doc("v4", reply="await_reply", pause="1s"))
    everyone = sorted(waiting + timed)

    argv = onward_argv(
        db_url, "--org", "test", "runs", "migrate", "--automation", ID, "--from", "3", "--to",
        "4", "--map", "reply:await_reply", "--batch", "10",
    )  # fmt: skip
    driver = processes.start(argv, "migrator", env=process_env(crash_at="migrate.in_batch@2"))
    assert await driver.exited(timeout=60) == -9
    assert driver.printed("onward: crash point migrate.in_batch reached, SIGKILL")

    # the first batch committed with its progress; the second vanished with the process
    moved = on_version(sql, 4)
    assert moved == everyone[:10]
    assert on_version(sql, 3) == everyone[10:]
    assert migrated_rows(sql) == dict.fromkeys(moved, 1)
    (op,) = sql.execute("SELECT * FROM operations").fetchall()
    assert (op["status"], op["done"], op["after_run_id"]) == ("running", 10, everyone[9])

    resumed = await operations.resume(engine.pool, "test", op["operation_id"], batch=10)
    assert resumed["status"] == "done"
    assert resumed["done"] == 25 and resumed["outcomes"] == {"moved": 15, "reentered": 10}
    assert on_version(sql, 4) == everyone and on_version(sql, 3) == []
    assert migrated_rows(sql) == dict.fromkeys(everyone, 1)  # none twice, none missing
    # each run has one unfinished step, on the new version
    steps = sql.execute(
        "SELECT run_id, step_id, version FROM steps WHERE status IN "
        "('ready', 'running', 'waiting', 'parked') ORDER BY run_id"
    ).fetchall()
    assert [s["run_id"] for s in steps] == everyone
    assert all(s["version"] == 4 for s in steps)

    async with engine.running():
        for i, r in enumerate(waiting):
            await engine.signal(f"reply-{i}", "reply", run_id=r)
        assert await finished(engine, everyone) == ["completed"] * 25

    async def tags() -> bool:
        rows = sql.execute(
            "SELECT ctx->'vars'->>'tag' AS tag FROM runs WHERE automation_id = %s", (ID,)
        ).fetchall()
        return {r["tag"] for r in rows} == {"v4"}

    await eventually(tags, what="every run to finish on v4")
    assert all(len(history(sql, r, "run_migrated")) == 1 for r in everyone)
