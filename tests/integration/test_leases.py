"""Leases, heartbeats and fencing (R3) on a real PostgreSQL.

* a step slower than its lease keeps it by heartbeat: one claim, attempt 1;
* a worker whose lease was taken over writes nothing: every statement it can still issue with
  its old token (heartbeat, settle of every kind, release) touches 0 rows;
* inside a real Worker, a lease stolen mid-step is noticed by the heartbeat: the handler is
  cancelled and its result is dropped;
* clocks do not matter: every lease time is the database's ``now()`` -- a worker process whose
  clock runs ten minutes fast (libfaketime) neither steals a live lease nor shortens its own;
* concurrent claimers never take the same step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from pydantic import BaseModel

from onward import Automation, StepContext, leases, step_kind
from onward.config import Settings
from onward.engine import Engine
from onward.leases import NextStep, Token
from onward.sweep import Sweeper
from onward.testing import Processes, attempts, eventually, history, run_row, step_row, steps
from onward.testing.kinds import SLEEP_KIND  # registers test.sleep, which the process runs too


@step_kind("leases.slow", lane="io", replace=True)
async def _slow(step: StepContext) -> dict[str, Any]:
    await asyncio.sleep(float(step.params["seconds"]))
    return {"attempt": step.attempt}


GATES: dict[str, asyncio.Event] = {}  # run_id -> opened by the test to let leases.gate finish


@step_kind("leases.gate", lane="io", replace=True)
async def _gate(step: StepContext) -> dict[str, Any]:
    await GATES.setdefault(step.run_id, asyncio.Event()).wait()
    return {"attempt": step.attempt}


@step_kind("leases.quick", lane="fast", replace=True)
async def _quick(step: StepContext) -> dict[str, Any]:
    await asyncio.sleep(float(step.params.get("seconds", 0)))
    return {"worker": step.worker}


def snapshot(sql: psycopg.Connection, run_id: str) -> dict[str, Any]:
    """Everything a stale worker could have written about a run."""
    return {
        "steps": steps(sql, run_id),
        "run": run_row(sql, run_id),
        "history": sql.execute(
            "SELECT count(*) AS n FROM history WHERE run_id = %s", (run_id,)
        ).fetchone(),
        "outbox": sql.execute(
            "SELECT count(*) AS n FROM outbox WHERE payload ->> 'run_id' = %s", (run_id,)
        ).fetchone(),
        "timers": sql.execute(
            "SELECT count(*) AS n FROM timers WHERE run_id = %s", (run_id,)
        ).fetchone(),
    }


def seconds_left(sql: psycopg.Connection, run_id: str, seq: int = 1) -> float:
    """The lease left on a step, measured by the database clock alone."""
    row = sql.execute(
        "SELECT extract(epoch FROM lease_until - now())::float8 AS left FROM steps"
        " WHERE run_id = %s AND seq = %s",
        (run_id, seq),
    ).fetchone()
    assert row is not None and row["left"] is not None
    return float(row["left"])


# -- (a) a slow step keeps its lease by heartbeat ----------------------------------------------
async def test_a_step_three_times_slower_than_its_lease_keeps_it_by_heartbeat(
    settings: Settings, sql: psycopg.Connection
) -> None:
    fast = dataclasses.replace(settings, lease_seconds=1.0, heartbeat_seconds=0.25)
    async with Engine.open(fast, migrate=False) as engine:
        await engine.publish(Automation("slow").step("think", "leases.slow", seconds=3.0).build())
        started = await engine.start("slow", {}, event_id="slow-1")
        async with engine.running():  # with the sweeper, which would rescue a lapsed lease
            assert await engine.wait(started.run_id, timeout=20) == "completed"
    claims = attempts(sql, started.run_id)
    assert [(c["seq"], c["attempt"], c["ended"]) for c in claims] == [(1, 1, "step_done")]
    assert history(sql, started.run_id, "lease_expired") == []
    (done,) = history(sql, started.run_id, "step_done")
    assert done["attempt"] == 1
    assert (done["at"] - done["claimed_at"]).total_seconds() >= 3.0  # it outlived 3 leases
    step = step_row(sql, started.run_id, 1)
    assert (step["attempt"], step["output"]) == (1, {"attempt": 1})


# -- (b) a stale token writes nothing ------------------------------------------------------------
async def test_a_worker_whose_lease_was_taken_over_cannot_write(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(
        Automation("fenced").step("one", "leases.quick").step("two", "leases.quick").build()
    )
    started = await engine.start("fenced", {}, event_id="fenced-1")
    run_id = started.run_id
    sweeper = Sweeper(engine.pool, worker_id="sweeper")

    async with engine.pool.connection() as conn:
        (row_a,) = await leases.claim(conn, "fast", 10, "worker-a", 30.0)
    old = Token(row_a["org_id"], row_a["run_id"], row_a["seq"], row_a["attempt"])
    assert (old.run_id, old.seq, old.attempt) == (run_id, 1, 1)

    # a live lease is never rescued and never claimed again
    assert await sweeper.rescue() == 0
    async with engine.pool.connection() as conn:
        assert await leases.claim(conn, "fast", 10, "worker-b", 30.0) == []

    # worker A stalls past its lease; the sweep hands the step to worker B (attempt 2)
    sql.execute(
        "UPDATE steps SET lease_until = now() - interval '1 s' WHERE run_id = %s AND seq = 1",
        (run_id,),
    )
    assert await sweeper.rescue() == 1
    async with engine.pool.connection() as conn:
        (row_b,) = await leases.claim(conn, "fast", 10, "worker-b", 30.0)
    new = Token(row_b["org_id"], row_b["run_id"], row_b["seq"], row_b["attempt"])
    assert (new.seq, new.attempt) == (1, 2)
    (expired,) = history(sql, run_id, "lease_expired")
    assert expired["attempt"] == 1

    before = snapshot(sql, run_id)
    assert before["steps"][0]["owner"] == "worker-b"
    async with engine.pool.connection() as conn:
        assert await leases.heartbeat(conn, [old], [30.0]) == set()
        assert (
            await leases.settle_advance(
                conn,
                old,
                worker="worker-a",
                output={"from": "a"},
                vars={"a": 1},
                next_step=NextStep("two", "leases.quick", "fast", 1),
                eager=True,
                lease=30.0,
            )
            is None
        )
        assert (
            await leases.settle_advance(
                conn,
                old,
                worker="worker-a",
                output=1,
                vars=None,
                next_step=None,
                eager=False,
                lease=30.0,
            )
            is None
        )
        assert (
            await leases.settle_retry(
                conn, old, worker="worker-a", delay=0.0, error={"message": "stale"}
            )
            is False
        )
        for step_status, run_status in [("failed", "failed"), ("parked", "parked")]:
            assert (
                await leases.settle_stop(
                    conn,
                    old,
                    worker="worker-a",
                    step_status=step_status,
                    run_status=run_status,
                    reason="stale",
                )
                is False
            )
        assert (
            await leases.settle_wait_timer(
                conn, old, worker="worker-a", due_in=60.0, intent={"duration": "1m"}
            )
            is None
        )
        assert await leases.release(conn, [old], "worker-a") == 0
    assert snapshot(sql, run_id) == before

    # the newest attempt still holds the step and can write
    async with engine.pool.connection() as conn:
        assert await leases.heartbeat(conn, [new], [30.0]) == {new.key}
        res = await leases.settle_advance(
            conn,
            new,
            worker="worker-b",
            output={"from": "b"},
            vars=None,
            next_step=None,
            eager=False,
            lease=30.0,
        )
    assert res is not None and res["status"] == "completed"
    step = step_row(sql, run_id, 1)
    assert (step["status"], step["attempt"], step["output"]) == ("done", 2, {"from": "b"})


async def test_a_heartbeat_waits_for_no_row_lock_and_reports_the_locked_step_held(
    engine: Engine, sql: psycopg.Connection, db_url: str
) -> None:
    """Another transaction holds a step's row (a settle committing it, a budget's hold, a
    migration's batch): the heartbeat does not wait for it -- waiting is how a heartbeat, a
    settle and a migration deadlocked -- and reports the step held, its lease unchanged until
    the next beat, which extends it once the lock is gone."""
    await engine.publish(Automation("hb").step("one", "leases.quick").build())
    await engine.start("hb", {}, event_id="hb-1")
    async with engine.pool.connection() as conn:
        (row,) = await leases.claim(conn, "fast", 1, "worker-a", 30.0)
    token = Token(row["org_id"], row["run_id"], row["seq"], row["attempt"])
    before = step_row(sql, token.run_id, token.seq)["lease_until"]
    with psycopg.connect(db_url) as locker:  # a transaction holding the step's row
        locker.execute(
            "SELECT 1 FROM steps WHERE org_id = %s AND run_id = %s AND seq = %s FOR UPDATE",
            (token.org_id, token.run_id, token.seq),
        )
        async with engine.pool.connection() as conn:
            held = await asyncio.wait_for(leases.heartbeat(conn, [token], [600.0]), timeout=10)
        assert held == {token.key}
        assert step_row(sql, token.run_id, token.seq)["lease_until"] == before
        locker.rollback()
    async with engine.pool.connection() as conn:
        assert await leases.heartbeat(conn, [token], [600.0]) == {token.key}
    assert step_row(sql, token.run_id, token.seq)["lease_until"] > before


async def test_a_released_step_fences_its_old_token_too(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(Automation("rel").step("one", "leases.quick").build())
    started = await engine.start("rel", {}, event_id="rel-1")
    async with engine.pool.connection() as conn:
        (row,) = await leases.claim(conn, "fast", 1, "worker-a", 30.0)
        token = Token(row["org_id"], row["run_id"], row["seq"], row["attempt"])
        assert await leases.release(conn, [token], "worker-a") == 1
        # released: ready now, lease ended now; the old token can neither extend nor settle
        assert await leases.heartbeat(conn, [token], [30.0]) == set()
        assert (
            await leases.settle_advance(
                conn,
                token,
                worker="worker-a",
                output=1,
                vars=None,
                next_step=None,
                eager=False,
                lease=30.0,
            )
            is None
        )
        (again,) = await leases.claim(conn, "fast", 1, "worker-b", 30.0)
    assert again["attempt"] == 2
    assert [(a["attempt"], a["ended"]) for a in attempts(sql, started.run_id)] == [
        (1, "step_released"),
        (2, None),  # running, claimed by worker-b
    ]


# -- (c) a lease stolen mid-step inside a real Worker -------------------------------------------
async def test_a_worker_whose_lease_is_stolen_mid_step_cancels_the_handler_and_writes_nothing(
    engine: Engine, sql: psycopg.Connection
) -> None:
    entered = asyncio.Event()
    seen: dict[str, Any] = {}

    @step_kind("leases.block", lane="io", replace=True)
    async def block(step: StepContext) -> str:
        entered.set()
        try:
            await asyncio.Event().wait()  # never set: only cancellation ends this
        except asyncio.CancelledError:
            seen["cancelled"] = True
            seen["lease_lost"] = step.lease_lost.is_set()
            raise
        return "unreachable"

    await engine.publish(Automation("stolen").step("hold", "leases.block").build())
    started = await engine.start("stolen", {}, event_id="stolen-1")
    run_id = started.run_id
    async with engine.running(sweeper=False) as svc:
        assert svc.worker is not None
        await asyncio.wait_for(entered.wait(), timeout=20)
        # another worker takes the step over, as its claim would: a newer attempt, its lease
        sql.execute(
            "UPDATE steps SET attempt = attempt + 1, owner = 'thief',"
            " lease_until = now() + interval '60 s' WHERE run_id = %s AND seq = 1",
            (run_id,),
        )
        after_steal = snapshot(sql, run_id)

        async def dropped() -> bool:
            return (
                bool(seen.get("cancelled"))
                and svc.worker is not None
                and (svc.worker.stats.lost >= 1)
            )

        await eventually(dropped, timeout=10, what="the handler cancelled, its result dropped")
        assert seen == {"cancelled": True, "lease_lost": True}
        assert not svc.worker.held, "the worker must stop heartbeating a lost step"
        assert snapshot(sql, run_id) == after_steal
    # nothing written after the shutdown either (no release of a step it no longer holds)
    assert snapshot(sql, run_id) == after_steal
    row = after_steal["steps"][0]
    assert (row["status"], row["attempt"], row["owner"]) == ("running", 2, "thief")


# -- (d) clock skew ----------------------------------------------------------------------------
async def test_lease_times_come_from_the_database_not_the_worker_clock(
    engine: Engine, sql: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600.0)  # an hour fast
    await engine.publish(Automation("skew").step("hold", "leases.gate").build())
    started = await engine.start("skew", {}, event_id="skew-1")
    lease, beat = engine.settings.lease_seconds, engine.settings.heartbeat_seconds
    async with engine.running(sweeper=False):

        async def claimed() -> bool:
            return bool(attempts(sql, started.run_id))

        await eventually(claimed, what="claim")
        for _ in range(3):  # right after the claim and after heartbeats
            left = seconds_left(sql, started.run_id)
            assert lease - beat - 0.5 <= left <= lease + 0.01, left
            await asyncio.sleep(beat)
        GATES.setdefault(started.run_id, asyncio.Event()).set()
        assert await engine.wait(started.run_id, timeout=10) == "completed"
    assert [c["attempt"] for c in attempts(sql, started.run_id)] == [1]


async def test_a_worker_with_a_clock_ten_minutes_fast_neither_steals_nor_shortens_leases(
    engine: Engine, settings: Settings, sql: psycopg.Connection, processes: Processes
) -> None:
    await engine.publish(Automation("held").step("hold", SLEEP_KIND, seconds=60).build())
    await engine.publish(Automation("probe").step("probe", SLEEP_KIND, seconds=2).build())
    held = await engine.start("held", {}, event_id="held-1")
    # worker A (this test) holds a live lease of 20 s by the database clock
    async with engine.pool.connection() as conn:
        (row,) = await leases.claim(conn, "io", 1, "worker-a", 20.0)
    assert row["run_id"] == held.run_id
    held_before = snapshot(sql, held.run_id)

    lease, beat = 3.0, 0.5
    own = dataclasses.replace(
        settings, lease_seconds=lease, heartbeat_seconds=beat, shutdown_grace_seconds=1.0
    )
    wp = processes.worker(
        own, "skewed", clock_offset="+600", sweeper=True, kinds=("onward.testing.kinds",)
    )
    probe = await engine.start("probe", {}, event_id="probe-1")

    async def probe_running() -> bool:
        assert wp.alive(), wp.log_text()
        return bool(attempts(sql, probe.run_id))

    await eventually(probe_running, timeout=20, what="the skewed worker claiming")
    # its own lease is as long as configured, by the database clock
    for _ in range(3):
        left = seconds_left(sql, probe.run_id)
        assert lease - beat - 0.5 <= left <= lease + 0.01, left
        await asyncio.sleep(beat)

    async def probe_done() -> bool:
        return await engine.status(probe.run_id) == "completed"

    await eventually(probe_done, timeout=20, what="the probe run completing")
    leader = sql.execute(
        "SELECT holder, extract(epoch FROM lease_until - now())::float8 AS left"
        " FROM leader_leases WHERE name = 'sweeper'"
    ).fetchone()
    assert leader is not None and leader["holder"] == "skewed", leader
    assert leader["left"] > 1.0, leader  # its leadership lease is not cut short either

    out = sql.execute(
        "SELECT output, extract(epoch FROM now())::float8 AS db_now FROM steps WHERE run_id = %s",
        (probe.run_id,),
    ).fetchone()
    assert out is not None
    assert out["output"]["worker"] == "skewed"
    skew = out["output"]["clock"] - out["db_now"]
    assert 590 < skew < 610, f"the worker's clock was not skewed ({skew:.0f}s)"
    wp.terminate()
    await wp.exited(timeout=10)
    assert wp.returncode == 0, wp.log_text()

    # worker A's live lease was neither rescued, nor claimed, nor shortened
    assert snapshot(sql, held.run_id) == held_before
    assert history(sql, held.run_id, "lease_expired") == []
    claims = attempts(sql, held.run_id)
    assert [(c["attempt"], c["worker"]) for c in claims] == [(1, "worker-a")]


# -- (e) concurrent claimers -----------------------------------------------------------------
async def test_concurrent_claims_never_take_the_same_step(
    engine: Engine, sql: psycopg.Connection, db_url: str
) -> None:
    await engine.publish(Automation("many").step("one", "leases.quick").build())
    n_runs, n_claimers = 150, 12
    await asyncio.gather(*(engine.start("many", {}, event_id=f"m{i}") for i in range(n_runs)))

    async def claimer(i: int) -> list[tuple[str, int, int]]:
        got: list[tuple[str, int, int]] = []
        async with await psycopg.AsyncConnection.connect(
            db_url, autocommit=True, row_factory=dict_row
        ) as conn:
            while rows := await leases.claim(conn, "fast", 7, f"claimer-{i}", 30.0):
                got += [(r["run_id"], r["seq"], r["attempt"]) for r in rows]
        return got

    results = await asyncio.gather(*(claimer(i) for i in range(n_claimers)))
    everything = list(itertools.chain.from_iterable(results))
    assert len(everything) == n_runs
    assert len(set(everything)) == n_runs, "a step was claimed twice"
    assert {a for _, _, a in everything} == {1}
    assert sum(1 for r in results if r) >= 2, "the claimers did not actually compete"
    # each claim is on its step row, once: attempt 1, owned by the claimer that returned it
    owners = {
        (r["run_id"], r["seq"], r["attempt"]): r["owner"]
        for r in sql.execute(
            "SELECT run_id, seq, attempt, owner FROM steps WHERE status = 'running'"
        ).fetchall()
    }
    assert {k: v for k, v in owners.items() if k in set(everything)} == {
        (run_id, seq, attempt): f"claimer-{i}"
        for i, got in enumerate(results)
        for run_id, seq, attempt in got
    }


async def test_two_workers_on_one_lane_never_claim_the_same_step(
    engine: Engine, settings: Settings, sql: psycopg.Connection
) -> None:
    await engine.publish(
        Automation("pair")
        .step("one", "leases.quick", seconds=0.01)
        .step("two", "leases.quick", seconds=0.01)
        .build()
    )
    n_runs = 80
    runs = await asyncio.gather(
        *(engine.start("pair", {}, event_id=f"p{i}") for i in range(n_runs))
    )
    async with Engine.open(settings, migrate=False) as other:
        assert other.id != engine.id
        async with (
            engine.running(lanes={"fast": 4}),
            other.running(lanes={"fast": 4}, sweeper=False),
        ):

            async def all_done() -> bool:
                row = sql.execute(
                    "SELECT count(*) AS n FROM runs WHERE status = 'completed'"
                ).fetchone()
                return bool(row and row["n"] == n_runs)

            await eventually(all_done, timeout=30, what="every run completed")

    claims = sql.execute(
        "SELECT run_id, seq, attempt, worker FROM history WHERE claimed_at IS NOT NULL"
    ).fetchall()
    per_attempt = Counter((c["run_id"], c["seq"], c["attempt"]) for c in claims)
    assert len(per_attempt) == 2 * n_runs
    assert set(per_attempt.values()) == {1}, "a (run, seq, attempt) was claimed twice"
    assert {a for _, _, a in per_attempt} == {1}, "no step needed a second attempt"
    by_worker = Counter(c["worker"] for c in claims)
    assert set(by_worker) == {engine.id, other.id}, by_worker
    done = sql.execute(
        "SELECT run_id, seq, count(*) AS n FROM history WHERE event = 'step_done'"
        " GROUP BY run_id, seq"
    ).fetchall()
    assert len(done) == 2 * n_runs and all(d["n"] == 1 for d in done)
    assert {r.run_id for r in runs} == {d["run_id"] for d in done}


# -- a step that breaks its worker outside the handler ------------------------------------------
class _OldParams(BaseModel):
    to: str


class _NewParams(BaseModel):
    to: str
    template: str  # a deploy made this required; version 1 was published without it


async def test_a_step_whose_params_no_longer_parse_fails_instead_of_being_reclaimed_forever(
    settings: Settings, sql: psycopg.Connection
) -> None:
    """Deploy skew: the kind's parameter model changed after the version was published. The
    worker cannot even build the step's context. That must end in one durable transition (the
    step fails, or parks, with a reason naming the parameter), not in an exception that escapes the
    worker's task, leaves the step 'running' until its lease lapses, and repeats on every
    rescue with the attempt growing without bound (max_attempts is never consulted)."""

    async def send(step: StepContext) -> str:
        return "sent"

    step_kind("leases.mail", lane="io", params=_OldParams, replace=True)(send)
    fast = dataclasses.replace(settings, lease_seconds=0.6, heartbeat_seconds=0.15)
    async with Engine.open(fast, migrate=False) as engine:
        await engine.publish(Automation("mail").step("send", "leases.mail", to="maya").build())
        step_kind("leases.mail", lane="io", params=_NewParams, replace=True)(send)
        started = await engine.start("mail", {}, event_id="mail-1")
        async with engine.running():

            async def ended() -> str | None:
                status = await engine.status(started.run_id)
                return status if status in ("failed", "parked") else None

            try:
                status = await eventually(ended, timeout=6, what="the run failing or parking")
            except AssertionError:
                row = step_row(sql, started.run_id, 1)
                raise AssertionError(
                    f"after 6 s the step is still {row['status']!r}, claimed "
                    f"{row['attempt']} times: an exception escaped the worker, and the "
                    "step goes round lease lapse -> rescue -> claim forever"
                ) from None
    assert step_row(sql, started.run_id, 1)["attempt"] == 1
    reason = run_row(sql, started.run_id)["status_reason"]
    # failed or parked for a person are both one durable, explained answer
    assert status in ("failed", "parked")
    assert "template" in reason, reason
    assert history(sql, started.run_id, "lease_expired") == []
