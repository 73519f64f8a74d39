"""A process SIGKILLed at ``start.after_commit`` right after a statement that started many runs
(concurrent ``Engine.start`` calls written together by ``onward.start.StartBatcher``): none of
its callers got an answer, yet every run it committed is whole -- run, first step, wake,
history -- and the senders' second deliveries are answered as duplicates of those runs (the
unique start key), whose steps any worker then runs to completion (the outbox rows)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.testing import Processes, process_env

pytestmark = pytest.mark.acceptance

FLOW = Automation("greet").step("hello", "set", values={"greeting": "'hi ' + input.name"}).build()
N = 30

# The sender: N webhook-like deliveries at once through one engine (ONWARD_START_BATCHES=4),
# so the first statement carries all of them; the crash point kills it after that commit.
SENDER = f"""
import asyncio, os
from onward.config import Settings
from onward.engine import Engine

async def main():
    settings = Settings(database_url=os.environ["DB_URL"], org_id="test", queue="postgres")
    async with Engine.open(settings, migrate=False, start_queue=False) as engine:
        answers = await asyncio.gather(
            *(engine.start("greet", {{"name": f"n{{i}}"}}, event_id=f"e{{i}}") for i in range({N}))
        )
        print("answered", len(answers), flush=True)  # never reached: killed after the commit

asyncio.run(main())
"""


def _count(sql: psycopg.Connection[Any], query: str) -> int:
    row = sql.execute(query).fetchone()
    assert row is not None
    return int(row["n"])


async def test_a_kill_after_a_batched_start_commits_leaves_whole_runs_that_redeliveries_find(
    db_url: str, engine: Engine, sql: psycopg.Connection[Any], processes: Processes
) -> None:
    await engine.publish(FLOW)
    env = process_env(crash_at="start.after_commit@1", extra={"DB_URL": db_url})
    sender = processes.start([sys.executable, "-c", SENDER], "sender", env=env)
    assert await sender.exited(timeout=60) == -9
    assert sender.printed("onward: crash point start.after_commit reached, SIGKILL")
    assert not sender.printed("answered")

    # one statement committed every run, each whole, with nothing published yet
    assert _count(sql, "SELECT count(*) AS n FROM runs") == N
    assert _count(sql, "SELECT count(DISTINCT xmin::text) AS n FROM runs") == 1
    assert _count(sql, "SELECT count(*) AS n FROM steps WHERE status = 'ready'") == N
    assert _count(sql, "SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL") == N
    assert _count(sql, "SELECT count(*) AS n FROM history WHERE event = 'run_started'") == N

    # the senders got no answer and deliver again: each finds its run
    again = await asyncio.gather(
        *(engine.start("greet", {"name": f"n{i}"}, event_id=f"e{i}") for i in range(N))
    )
    assert not any(a.created for a in again)
    rows = sql.execute("SELECT start_key, run_id FROM runs").fetchall()
    assert {a.start_key: a.run_id for a in again} == {r["start_key"]: r["run_id"] for r in rows}
    assert _count(sql, "SELECT count(*) AS n FROM history WHERE event = 'start_duplicate'") == N

    async with engine.running():  # the relay publishes the wakes; the workers run the steps
        deadline = asyncio.get_running_loop().time() + 60
        while _count(sql, "SELECT count(*) AS n FROM runs WHERE status = 'completed'") < N:
            assert asyncio.get_running_loop().time() < deadline, "the runs did not complete"
            await asyncio.sleep(0.1)
    greetings = sql.execute("SELECT ctx->'vars'->>'greeting' AS g FROM runs").fetchall()
    assert sorted(r["g"] for r in greetings) == sorted(f"hi n{i}" for i in range(N))
