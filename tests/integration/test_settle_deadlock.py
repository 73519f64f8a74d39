"""A grouped settle the database chose as a deadlock's victim is sent again at once
(``settle.SettleBatcher``), instead of leaving its steps to their leases. Another transaction
holds the second step while the batch (which locks its steps in key order) holds the first and
waits for it; then it asks for the first: a real deadlock, of which the batch is the victim (it
waited first). Its statement rolled back whole; sent again, it settles both steps at their
first attempt."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from onward import leases
from onward.automations.builder import Automation
from onward.engine import Engine
from onward.leases import AdvanceSettle, Token
from onward.settle import SettleBatcher
from onward.testing import eventually, lock_awaited


def _deadlocks(sql: psycopg.Connection[Any]) -> int:
    row = sql.execute(
        "SELECT deadlocks AS n FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row["n"])


async def test_a_settle_chosen_as_a_deadlocks_victim_is_sent_again(
    engine: Engine, sql: psycopg.Connection[Any], db_url: str
) -> None:
    await engine.publish(Automation("pair").step("a", "set", values={"x": "1"}).build())
    started = [await engine.start("pair", {}, event_id=f"pair-{i}") for i in range(2)]
    first, second = sorted(s.run_id for s in started)
    org = engine.settings.org_id
    async with engine.pool.connection() as conn:
        claimed = await leases.claim(conn, "fast", 10, "w", 30.0)
    tokens = {r["run_id"]: Token(org, r["run_id"], r["seq"], r["attempt"]) for r in claimed}
    assert set(tokens) == {first, second}
    items = [
        AdvanceSettle(token=tokens[r], output=None, vars=None, next_step=None, eager=False)
        for r in (second, first)  # handed over out of order: the batch sorts them
    ]
    batcher = SettleBatcher(engine.pool, "w", 30.0)
    before = _deadlocks(sql)
    lock = "SELECT 1 FROM steps WHERE org_id = %s AND run_id = %s AND seq = 1 FOR UPDATE"
    with psycopg.connect(db_url) as other:
        other.execute(lock, (org, second))
        settles = asyncio.gather(*(batcher.settle(item) for item in items))
        await lock_awaited(
            sql, besides=other.info.backend_pid, what="the batch waits on the second step"
        )
        other.execute(lock, (org, first))  # returns once the victim's statement is gone
        other.commit()
    rows = await settles
    await batcher.close()
    assert all(r is not None and r["status"] == "completed" for r in rows), rows

    async def counted() -> bool:
        return _deadlocks(sql) == before + 1

    await eventually(counted, what="the deadlock counted: the batch was its victim")
    done = sql.execute(
        "SELECT run_id, status, attempt FROM steps WHERE org_id = %s ORDER BY run_id", (org,)
    ).fetchall()
    assert [(d["run_id"], d["status"], d["attempt"]) for d in done] == [
        (first, "done", 1),
        (second, "done", 1),
    ]
