"""The wake-up path (R2, R7, R16): the queue only wakes; the sweep is the backstop; duplicate
wakes change nothing; the sweep is fair and its claims are disjoint."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import psycopg
import pytest

from onward import Automation, StepContext, step_kind
from onward.config import Settings
from onward.engine import Engine
from onward.queue.base import OnReconnect, OnWake, Wake
from onward.queue.postgres import PostgresQueue
from onward.sweep import Q as SWEEP_Q
from onward.sweep import Sweeper, SweepLimits
from onward.testing import assert_nothing_applied_twice, eventually

WAIT_FLOW = (
    Automation("pause")
    .step("before", "set", values={"n": "1"})
    .step("wait", "wait_for", duration="0.3s")
    .step("after", "set", values={"n": "vars.n + 1"})
    .build()
)


@step_kind("wakeups.nap", lane="fast", replace=True)
async def _nap(step: StepContext) -> None:
    await asyncio.sleep(float(step.input["ms"]) / 1000)


NAP_FLOW = Automation("nap").step("nap", "wakeups.nap").build()


async def _start_many(engine: Engine, n: int) -> list[str]:
    await engine.publish(WAIT_FLOW)
    return [(await engine.start("pause", {"i": i}, event_id=f"e{i}")).run_id for i in range(n)]


async def _all_completed(engine: Engine, run_ids: list[str], timeout: float = 30) -> None:
    for run_id in run_ids:
        assert await engine.wait(run_id, timeout=timeout) == "completed"


async def test_with_the_queue_off_runs_finish_through_the_sweep(
    settings: Settings, sql: psycopg.Connection
) -> None:
    settings = dataclasses.replace(settings, queue="none")
    async with Engine.open(settings, migrate=False) as engine:
        run_ids = await _start_many(engine, 10)
        async with engine.running():
            await _all_completed(engine, run_ids)
    fired_by = sql.execute("SELECT DISTINCT fired_by FROM timers").fetchall()
    assert [r["fired_by"] for r in fired_by] == ["sweep"]
    assert sql.execute("SELECT count(*) AS n FROM timers").fetchone()["n"] == 10
    assert_nothing_applied_twice(sql)


class TriplingQueue(PostgresQueue):
    """A real LISTEN/NOTIFY queue whose consumer hands every wake over three times."""

    async def consume(
        self, lanes: Sequence[str], on_wake: OnWake, on_reconnect: OnReconnect | None = None
    ) -> None:
        def thrice(w: Wake) -> None:
            for _ in range(3):
                on_wake(w)

        await super().consume(lanes, thrice, on_reconnect)


async def test_every_wake_delivered_three_times_changes_nothing_twice(
    settings: Settings, sql: psycopg.Connection
) -> None:
    async with Engine.open(settings, migrate=False) as engine:
        engine.queue = TriplingQueue(engine.url)
        run_ids = await _start_many(engine, 20)
        async with engine.running():
            await _all_completed(engine, run_ids)
    assert_nothing_applied_twice(sql)
    # three steps per run (before, wait, after), each done exactly once
    per_run = sql.execute(
        "SELECT run_id, count(*) AS n FROM history WHERE event = 'step_done' GROUP BY run_id"
    ).fetchall()
    assert len(per_run) == 20 and {r["n"] for r in per_run} == {3}
    fired = sql.execute("SELECT count(*) AS n FROM history WHERE event = 'timer_fired'").fetchone()
    assert fired["n"] == 20


def _insert_due(sql: psycopg.Connection, org: str, count: int) -> None:
    sql.execute(
        "INSERT INTO organisations (org_id, has_due_work) VALUES (%s, true) ON CONFLICT DO NOTHING",
        (org,),
    )
    sql.execute(
        """INSERT INTO timers (org_id, run_id, seq, purpose, intent, due_at)
           SELECT %s, 'r' || g, 1, 'wait', '{}', now() - interval '1 minute' - g * interval '1 ms'
           FROM generate_series(1, %s::int) AS g""",
        (org, count),
    )


async def test_small_organisations_are_served_within_two_batches(
    engine: Engine, sql: psycopg.Connection
) -> None:
    _insert_due(sql, "aaa-big", 200_000)  # sorts first by id: it leads every tie
    small = [f"small{i:02d}" for i in range(20)]
    for org in small:
        _insert_due(sql, org, 10)
    sql.execute("ANALYZE timers")
    sweeper = Sweeper(engine.pool, worker_id="t", limits=SweepLimits())
    served: set[str] = set()
    for _ in range(2):
        _fired, orgs = await sweeper.fire_batch()
        served.update(orgs)
    assert set(small) <= served
    unfired_small = sql.execute(
        "SELECT count(*) AS n FROM timers WHERE org_id <> 'aaa-big' AND fired_at IS NULL"
    ).fetchone()
    assert unfired_small["n"] == 0
    big_fired = sql.execute(
        "SELECT count(*) AS n FROM timers WHERE org_id = 'aaa-big' AND fired_at IS NOT NULL"
    ).fetchone()
    assert 0 < big_fired["n"] <= 2 * SweepLimits().per_org


def test_two_sweepers_never_claim_the_same_timer(db_url: str, sql: psycopg.Connection) -> None:
    for i in range(5):
        _insert_due(sql, f"org{i}", 100)
    args = {"org_ids": [f"org{i}" for i in range(5)], "per_org": 50, "batch": 500}
    with psycopg.connect(db_url) as a, psycopg.connect(db_url) as b:
        first = {tuple(r) for r in a.execute(SWEEP_Q.claim_due, args).fetchall()}
        second = {tuple(r) for r in b.execute(SWEEP_Q.claim_due, args).fetchall()}
        assert len(first) == 250 and len(second) == 250
        assert first.isdisjoint(second)
        a.rollback()
        b.rollback()


async def test_concurrent_sweeps_fire_each_timer_once(
    engine: Engine, sql: psycopg.Connection
) -> None:
    for i in range(10):
        _insert_due(sql, f"org{i}", 200)
    sweepers = [Sweeper(engine.pool, worker_id=f"s{i}") for i in range(3)]

    async def drain(s: Sweeper) -> int:
        total = 0
        while True:
            fired, _ = await s.fire_batch()
            if not fired:
                return total
            total += fired

    counts = await asyncio.gather(*(drain(s) for s in sweepers))
    assert sum(counts) == 2000
    assert (
        sql.execute("SELECT count(*) AS n FROM timers WHERE fired_at IS NULL").fetchone()["n"] == 0
    )


@pytest.mark.parametrize("n", [1])
async def test_doctor_finds_a_waiting_run_without_a_timer(
    engine: Engine, sql: psycopg.Connection, n: int
) -> None:
    from onward.doctor import run_checks

    run_ids = await _start_many(engine, n)
    async with engine.running():

        async def waiting() -> bool:
            return await engine.status(run_ids[0]) == "waiting"

        await eventually(waiting)
    healthy = {c.name: c.ok for c in await run_checks(engine)}
    assert healthy["runs_without_way_forward"]
    # lose the timer: the run now has no durable way forward, and doctor must say so
    sql.execute("DELETE FROM timers")
    sql.execute("UPDATE runs SET updated_at = now() - interval '1 minute'")
    checks = {c.name: c for c in await run_checks(engine)}
    assert not checks["runs_without_way_forward"].ok
    assert run_ids[0] in checks["runs_without_way_forward"].detail


@pytest.mark.parametrize(
    ("slots", "poll", "claims"),
    [(32, 60.0, range(1, 4)), (32, 0.0, range(9, 20)), (2, 60.0, range(4, 20))],
)
async def test_a_chain_that_ends_claims_again_when_ready_steps_may_be_waiting(
    settings: Settings, slots: int, poll: float, claims: range
) -> None:
    """Eight one-step runs, ready before the worker starts, whose steps end 40 ms apart; no
    poll and no sweep in the test's time. With 32 slots the first claim takes all eight and
    asks for more than there were: no chain's end claims again unless the lane's own claim
    poll (``claim_poll_seconds``) is due -- set out of the test's time, then to every time.
    With 2 slots every claim is full, so each chain's end claims the next ready step: the
    eight finish with no poll and no further wake."""
    settings = dataclasses.replace(settings, poll_seconds=60.0, sweep_seconds=60.0)
    async with Engine.open(settings, migrate=False) as engine:
        await engine.publish(NAP_FLOW)
        run_ids = [
            (await engine.start("nap", {"ms": 40 * (i + 1)}, event_id=f"nap{i}")).run_id
            for i in range(8)
        ]
        async with engine.running(lanes={"fast": slots}) as svc:
            assert svc.worker is not None
            svc.worker.claim_poll_seconds = poll  # before the worker's first turn
            await _all_completed(engine, run_ids, timeout=20)
            assert svc.worker.stats.claims in claims, svc.worker.stats.claims
