"""The other faults, each with real processes and real services, each bounded in time.

* a worker paused (SIGSTOP) mid-step past its lease: another takes the step over (attempt 2);
  woken (SIGCONT), the stale worker writes nothing;
* the Redis queue killed mid-load (a Redis of the test's own): runs finish through the sweep;
* PostgreSQL restarted mid-load (a cluster of the test's own): workers reconnect and carry on;
* a provider that hangs past the lease: the live call keeps its leases, nobody calls again;
* random database connections terminated while 50 runs flow: all finish, none twice;
* every wake delivered twice and out of order: nothing applied twice;
* two engine bugs the chaos runner found (fixed in 287a168), kept as regression tests.

Worker processes are ``python -m onward.testing.worker worker`` with a 2 s lease; every one
a test starts is reaped at teardown, and its log printed when the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from onward import Automation
from onward.automations.document import StepDef
from onward.chaos import scenario
from onward.chaos.faults import BackendKiller, RedisServer, ThrowawayPostgres
from onward.config import Settings
from onward.connectors.base import Connection, Connector
from onward.db import make_pool
from onward.db.migrate import apply as apply_migrations
from onward.effects import Effects
from onward.engine import Engine
from onward.kinds import StepContext
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import (
    Process,
    Processes,
    assert_nothing_applied_twice,
    attempts,
    eventually,
    history,
    run_effects,
    step_row,
)
from onward.testing.worker import worker_stats

# many processes a test: print the last 6,000 characters of each log (tests/conftest.py)
pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.timeout(120),
    pytest.mark.processes(log_chars=6000),
]

Sql = psycopg.Connection[dict[str, Any]]
LEASE = 2.0


def fast(settings: Settings) -> Settings:
    """The worker processes' timings: a 2 s lease, quick polls and sweeps."""
    return dataclasses.replace(
        settings,
        lease_seconds=LEASE,
        heartbeat_seconds=0.5,
        poll_seconds=0.3,
        sweep_seconds=0.3,
        shutdown_grace_seconds=1.0,
    )


# wait -> CRM -> email -> done: effects only at idempotent providers (they never park)
# With backends killed every 0.1 s a step can lose several attempts to onward's own database
# (each lost attempt counts, as a lapsed lease does); what these tests hold is that nothing is
# lost or done twice, so the effect steps get attempts enough for the faults, with short waits.
FAULT_RETRY = {"max_attempts": 30, "base": 0.2, "cap": 1.0}
EFFECTS_FLOW = (
    Automation("faulty-follow-up")
    .step("wait", "wait_for", duration="0.5s")
    .step("crm", "crm.upsert", connection="crm", external_id="{input.contact}", retry=FAULT_RETRY)
    .step(
        "send",
        "email.send",
        connection="mailbox",
        to="{input.email}",
        subject="Hi",
        body="x",
        retry=FAULT_RETRY,
    )
    .step("done", "set", values={"finished": "true"})
    .build()
)
WAIT_FLOW = (
    Automation("faulty-wait")
    .step("wait", "wait_for", duration="0.5s")
    .step("mark", "set", values={"marked": "true"})
    .step("done", "set", values={"finished": "true"})
    .build()
)


def payload(i: int) -> dict[str, Any]:
    return {"email": f"maya+{i}@example.test", "contact": f"contact-{i}"}


# -- processes ---------------------------------------------------------------------------------
Spawn = Callable[..., Process]


@pytest.fixture
def spawn(processes: Processes) -> Spawn:
    """``spawn(settings, name, sweeper=, twice=, app_prefix=)``: a worker process with the
    fast timings above, reaped at teardown."""

    def _spawn(settings: Settings, name: str, **options: Any) -> Process:
        return processes.worker(fast(settings), name, **options)

    return _spawn


async def ready(*procs: Process) -> None:
    for proc in procs:
        await proc.ready()


async def stop(proc: Process, timeout: float = 20.0) -> int:
    """SIGTERM (graceful) and wait; returns the exit code."""
    proc.terminate()
    return await proc.exited(timeout=timeout)


def stats_of(proc: Process) -> dict[str, int]:
    stats = worker_stats(proc.log_text())
    assert stats is not None, f"{proc.name} printed no stats:\n{proc.tail(2000)}"
    return stats


async def deliver(engine: Engine, automation: str, data: dict[str, Any], event: str) -> str:
    """A webhook delivery: a database error is a 5xx, and the sender delivers again."""
    for _ in range(50):
        try:
            return str((await engine.start(automation, data, event_id=event)).run_id)
        except psycopg.OperationalError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"{event} could not be delivered")


async def all_finished(engine: Engine, run_ids: list[str], timeout: float = 60.0) -> None:
    async def check() -> bool:
        try:
            async with engine.pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) AS n FROM runs WHERE org_id = %s AND run_id = ANY(%s)"
                    " AND status = 'completed'",
                    (engine.org_id, run_ids),
                )
                row = await cur.fetchone()
        except psycopg.OperationalError:  # e.g. the first use of a pooled connection after
            return False  # a restart: the pool drops it, the next check gets a fresh one
        return bool(row and row["n"] == len(run_ids))

    try:
        await eventually(check, timeout=timeout, interval=0.2, what=f"{len(run_ids)} runs done")
    except AssertionError:
        async with engine.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT r.status, s.step_id, s.status AS step, s.attempt, s.lease_until < now()"
                " AS lapsed, s.available_at > now() AS later, e.status AS effect, count(*) AS n"
                " FROM runs r LEFT JOIN steps s ON s.run_id = r.run_id AND s.seq = r.current_seq"
                " LEFT JOIN effects e ON e.run_id = s.run_id AND e.seq = s.seq"
                " WHERE r.run_id = ANY(%s) AND r.status <> 'completed'"
                " GROUP BY 1, 2, 3, 4, 5, 6, 7",
                (run_ids,),
            )
            print("not completed:", *await cur.fetchall(), sep="\n  ")
        raise


def exactly_one_effect_per_key(admin: SandboxAdmin, run_ids: list[str]) -> None:
    entries = admin.ledger()
    for run_id in run_ids:
        for step_id, provider in (("crm", "crm"), ("send", "email")):
            key = f"{run_id}/{step_id}/1"
            made = [
                e
                for e in entries
                if e["provider"] == provider
                and e["idempotency_key"] == key
                and e["op"] in ("contact.create", "message.send")
            ]
            assert len(made) == 1, (key, made)


# -- the provider (the ``sandbox`` and ``admin`` fixtures: tests/conftest.py) --------------------
async def connect(engine: Engine, sandbox: SandboxServer) -> None:
    await scenario.add_connections(engine.integrations, engine.org_id, sandbox.url)


# -- SIGSTOP past the lease, SIGCONT -----------------------------------------------------------
async def test_a_worker_paused_past_its_lease_is_fenced_when_it_wakes(
    settings: Settings,
    engine: Engine,
    sql: Sql,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    spawn: Spawn,
) -> None:
    await connect(engine, sandbox)
    flow = Automation("paused").step(
        "crm", "crm.upsert", connection="crm", external_id="contact-paused"
    )
    await engine.publish(flow.step("done", "set", values={"finished": "true"}).build())
    admin.faults("crm", latency_ms=1500)  # the call is open while the worker is paused
    a = spawn(settings, "proc-a")
    await ready(a)
    run_id = (await engine.start("paused", {}, event_id="evt-paused")).run_id

    def claimed_by_a() -> bool:
        assert a.alive(), a.log_text()
        claims = attempts(sql, run_id, seq=1)
        return bool(claims) and claims[0]["worker"] == "proc-a"

    await eventually(lambda: asyncio.sleep(0, claimed_by_a()), interval=0.02, what="A claims")
    a.signal(signal.SIGSTOP)  # mid-call, its heartbeats stop with it
    paused_at = sql.execute("SELECT now() AS t").fetchone()["t"]  # type: ignore[index]
    b = spawn(settings, "proc-b", sweeper=True)

    async def done_by_b() -> Any:
        assert b.alive(), b.log_text()
        done = history(sql, run_id, "step_done", seq=1)
        return done[0] if done else None

    settled = await eventually(done_by_b, timeout=30, interval=0.05, what="B settles the step")
    assert (settled["worker"], settled["attempt"]) == ("proc-b", 2)
    assert await engine.wait(run_id, timeout=20) == "completed"
    expired = history(sql, run_id, "lease_expired", seq=1)
    assert len(expired) == 1 and expired[0]["at"] > paused_at  # rescued only after it lapsed

    a.signal(signal.SIGCONT)  # the stale worker wakes up with the provider's answer in hand

    async def a_noticed() -> bool:
        # its next heartbeat finds the lease gone (or its settle matches 0 rows)
        return "lease lost" in a.log_text() or not a.alive()

    with contextlib.suppress(AssertionError):
        await eventually(a_noticed, timeout=LEASE * 2, what="A noticing the lost lease")
    assert await stop(a) == 0, a.log_text()
    assert stats_of(a)["lost"] >= 1  # its settle was refused: the fence held
    # nothing of A's after its claim: its attempt ended by the sweeper, one step_done, by B
    rows = attempts(sql, run_id, seq=1)
    assert [(r["ended"], r["attempt"], r["worker"]) for r in rows] == [
        ("lease_expired", 1, "proc-a"),
        ("step_done", 2, "proc-b"),
    ]
    assert history(sql, run_id, "step_retry", "step_failed", seq=1) == []
    step = step_row(sql, run_id, 1)
    assert (step["status"], step["attempt"]) == ("done", 2)
    creates = [e for e in admin.ledger("crm") if e["op"] == "contact.create"]
    assert len(creates) == 1
    assert_nothing_applied_twice(sql)


# -- Redis killed --------------------------------------------------------------------------------
async def test_with_its_redis_killed_mid_load_every_run_finishes_through_the_sweep(
    settings: Settings, engine: Engine, sql: Sql, spawn: Spawn
) -> None:
    await engine.publish(WAIT_FLOW)
    with RedisServer() as redis_server:
        # a slower sweep than fast()'s 0.3 s, so that the wakes Redis delivers on time come
        # before the sweep would fire their timers (else none may be fired by a wake at all)
        on_redis = dataclasses.replace(
            settings,
            queue="redis",
            redis_url=redis_server.url,
            queue_prefix="chaos",
            sweep_seconds=2.0,
        )
        a, b = spawn(on_redis, "proc-a", sweeper=True), spawn(on_redis, "proc-b")
        await ready(a, b)
        run_ids = [
            (await engine.start("faulty-wait", {"i": i}, event_id=f"evt-{i}")).run_id
            for i in range(30)
        ]

        async def some_through_redis() -> bool:
            n = sql.execute("SELECT count(*) AS n FROM timers WHERE fired_by = 'wake'").fetchone()[
                "n"
            ]  # type: ignore[index]
            return bool(n >= 3)

        await eventually(some_through_redis, timeout=30, what="wakes delivered through Redis")
        redis_server.kill()  # every delayed wake and dedup marker is gone, and so is the server
        late = [
            (await engine.start("faulty-wait", {"i": i}, event_id=f"evt-{i}")).run_id
            for i in range(30, 40)
        ]
        await all_finished(engine, run_ids + late, timeout=60)
        assert a.alive() and b.alive()
    fired = sql.execute("SELECT fired_by, count(*) AS n FROM timers GROUP BY fired_by").fetchall()
    by = {r["fired_by"]: r["n"] for r in fired}
    assert by.get("sweep", 0) >= 10  # the late runs had no queue at all
    assert_nothing_applied_twice(sql)


# -- PostgreSQL restarted ------------------------------------------------------------------------
async def test_postgres_restarted_mid_load_workers_reconnect_and_carry_on(
    settings: Settings, sandbox: SandboxServer, admin: SandboxAdmin, spawn: Spawn
) -> None:
    with ThrowawayPostgres() as pg:
        await asyncio.to_thread(apply_migrations, pg.url)
        own = dataclasses.replace(settings, database_url=pg.url)
        a, b = spawn(own, "proc-a", sweeper=True), spawn(own, "proc-b")
        async with Engine.open(own, migrate=False, start_queue=False, pool_size=2) as engine:
            await connect(engine, sandbox)
            await engine.publish(EFFECTS_FLOW)
            await ready(a, b)
            run_ids = [
                (await engine.start("faulty-follow-up", payload(i), event_id=f"evt-{i}")).run_id
                for i in range(20)
            ]

            async def some_done() -> bool:
                async with engine.pool.connection() as conn:
                    cur = await conn.execute(
                        "SELECT count(*) AS n FROM runs WHERE status = 'completed'"
                    )
                    row = await cur.fetchone()
                return bool(row and row["n"] >= 3)

            await eventually(some_done, timeout=30, interval=0.05, what="some runs done")
            # the first runs may all be done by now (they finish together): start more, so the
            # restart always cuts runs in flight (these sit in their 0.5 s wait)
            run_ids += [
                (await engine.start("faulty-follow-up", payload(i), event_id=f"evt-{i}")).run_id
                for i in range(20, 30)
            ]
            # this throwaway server runs with synchronous_commit off: make the starts the test
            # counts on durable before the crash (the workers' own commits may still be lost)
            # (as the URL's superuser: the engine's own role may not checkpoint)
            async with await psycopg.AsyncConnection.connect(pg.url, autocommit=True) as conn:
                await conn.execute("CHECKPOINT")
            await asyncio.to_thread(pg.restart)  # every session cut, crash recovery
            late = [
                await deliver(engine, "faulty-follow-up", payload(i), f"evt-{i}")
                for i in range(30, 40)
            ]
            await all_finished(engine, run_ids + late, timeout=60)
            assert a.alive() and b.alive()
        with psycopg.connect(pg.url, autocommit=True, row_factory=dict_row) as sql:
            assert_nothing_applied_twice(sql)
        exactly_one_effect_per_key(admin, run_ids + late)
        for proc in (a, b):
            assert await stop(proc) == 0, proc.log_text()[-3000:]


# -- a provider that hangs past the lease --------------------------------------------------------
async def test_a_provider_hanging_past_the_lease_is_never_called_twice(
    settings: Settings,
    engine: Engine,
    sql: Sql,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    spawn: Spawn,
) -> None:
    """The email and the payment provider do the work and then hold the answer for 3 leases.
    The worker stays alive, so its heartbeats keep the step lease and the effect lease: no
    other process claims the step or calls the provider meanwhile. When the connection finally
    drops, the email is reconciled (found, not resent) and the charge parks for a person."""
    await connect(engine, sandbox)
    email = Automation("hang-email").step(
        "send", "email.send", connection="mailbox", to="maya@example.test", subject="s", body="b"
    )
    charge = Automation("hang-charge").step(
        "send", "payment.charge", connection="payments", amount=500, customer="cus_maya"
    )
    for flow in (email, charge):
        await engine.publish(flow.step("done", "set", values={"finished": "true"}).build())
    hang = 3 * LEASE
    for provider in ("email", "payment"):
        admin.faults(provider, script=["hang_after_work"], hang_s=hang)
    a, b = spawn(settings, "proc-a", sweeper=True), spawn(settings, "proc-b", sweeper=True)
    await ready(a, b)
    mail_run = (await engine.start("hang-email", {}, event_id="evt-mail")).run_id
    pay_run = (await engine.start("hang-charge", {}, event_id="evt-pay")).run_id

    def hanging() -> bool:
        return len(admin.ledger("email")) == 1 and len(admin.ledger("payment")) == 1

    await eventually(lambda: asyncio.sleep(0, hanging()), timeout=20, what="the work done")
    work_at = time.monotonic()
    # past two whole leases into the hang: still one claim each, no lease lapsed
    while time.monotonic() < work_at + 2 * LEASE:
        for run_id in (mail_run, pay_run):
            assert len(attempts(sql, run_id, seq=1)) == 1
            assert history(sql, run_id, "lease_expired") == []
        await asyncio.sleep(0.2)
    assert await engine.wait(mail_run, timeout=30) == "completed"
    assert await engine.wait(pay_run, timeout=30) == "parked"
    assert len(admin.ledger("email")) == 1  # reconciled, not resent
    assert len(admin.ledger("payment")) == 1  # parked, not charged again
    for run_id in (mail_run, pay_run):
        assert history(sql, run_id, "lease_expired") == []
    (review,) = run_effects(sql, pay_run)
    assert (review["status"], review["attempts"]) == ("review", 1)
    assert_nothing_applied_twice(sql)


# -- database connections terminated at random ---------------------------------------------------
async def test_random_database_connection_failures_while_50_runs_flow(
    settings: Settings,
    db_url: str,
    engine: Engine,
    sql: Sql,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    spawn: Spawn,
) -> None:
    await connect(engine, sandbox)
    await engine.publish(EFFECTS_FLOW)
    prefix = f"faulty-{os.getpid()}-"
    procs = [
        spawn(settings, "proc-a", sweeper=True, app_prefix=prefix),
        spawn(settings, "proc-b", app_prefix=prefix),
        spawn(settings, "proc-c", app_prefix=prefix),
    ]
    await ready(*procs)
    # every 0.1 s: the 50 runs finish in about 1.5 s, and at 0.15 s the killer's tenth kill
    # sometimes came after the last of them (9 kills, 2026-12-07)
    with BackendKiller(db_url, prefix, interval=0.1, seed=7) as killer:
        run_ids = [
            (await engine.start("faulty-follow-up", payload(i), event_id=f"evt-{i}")).run_id
            for i in range(50)
        ]
        await all_finished(engine, run_ids, timeout=75)
    assert killer.killed >= 10, killer.killed
    assert all(p.alive() for p in procs)
    assert_nothing_applied_twice(sql)
    exactly_one_effect_per_key(admin, run_ids)


# -- every wake twice, out of order --------------------------------------------------------------
async def test_every_wake_delivered_twice_and_out_of_order_changes_nothing_twice(
    settings: Settings, engine: Engine, sql: Sql, spawn: Spawn
) -> None:
    await engine.publish(WAIT_FLOW)
    procs = [spawn(settings, f"proc-{n}", sweeper=n == "a", twice=True) for n in "abc"]
    await ready(*procs)
    run_ids = [
        (await engine.start("faulty-wait", {"i": i}, event_id=f"evt-{i}")).run_id for i in range(40)
    ]
    await all_finished(engine, run_ids, timeout=45)
    wakes = sql.execute("SELECT count(*) AS n FROM timers WHERE fired_by = 'wake'").fetchone()
    assert wakes is not None and wakes["n"] > 0  # the doubled, shuffled wakes did the work
    assert_nothing_applied_twice(sql)


# -- bugs the chaos runner found (fixed in 287a168), as regression tests -------------------------
async def test_a_generation_whose_answer_was_lost_is_generated_again_not_parked(
    settings: Settings,
    engine: Engine,
    sql: Sql,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
) -> None:
    """Found by the chaos runner: ``ModelConnector`` says "an uncertain generation is simply
    generated again (a duplicate costs money but harms nobody)", and the design parks only where
    "a duplicate would do real harm"; but ``Effects.run`` parked every outcome_unknown effect of a
    provider without idempotency for review, so a model step whose answer was lost (or whose
    worker died mid-call, or whose database connection dropped around the claim) waited for a
    person: in a 1,000-run chaos run 102 of 106 runs parked for review were parked at the model.
    Fixed by ``Connector.repeat_is_harmless`` (True for the model)."""
    await connect(engine, sandbox)
    flow = Automation("draft-once").step("draft", "model.generate", connection="model", prompt="p")
    await engine.publish(flow.step("done", "set", values={"finished": "true"}).build())
    admin.faults("model", script=["drop_after_work"])
    run_id = (await engine.start("draft-once", {}, event_id="evt-draft")).run_id
    async with engine.running():
        status = await engine.wait(run_id, timeout=30)
    assert len(admin.ledger("model")) >= 1
    assert status == "completed", [(e["status"], e["last_error"]) for e in run_effects(sql, run_id)]
    assert len(admin.ledger("model")) == 2  # generated again, at the cost of one generation


class _HeldProvider(Connector):
    """A provider whose call lasts exactly as long as the test says (no HTTP needed)."""

    provider = "email"
    supports_idempotency = True

    def __init__(self) -> None:
        super().__init__(Connection("held", "email", "http://held.invalid", "a", "t"))
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        self.started.set()
        await self.release.wait()
        return {"id": idempotency_key}


async def test_an_effect_whose_heartbeat_swallowed_its_cancel_still_settles(
    db_url: str,
) -> None:
    """Found by the chaos runner as a stall in the 50-run test above (two runs 'running', step
    and effect leases live for ever, every invariant query healthy): ``Effects._perform`` ended
    its effect heartbeat with ``beat.cancel()`` and then awaited it without bound, and
    ``_heartbeat`` was a ``while True`` loop. On Python 3.11 a cancel that lands while the
    heartbeat waits for a pooled connection is swallowed (psycopg_pool's ``WaitingClient.wait``
    uses ``asyncio.wait_for``, bpo-42130): the heartbeat carried on, ``await beat`` never
    returned, and the step's own heartbeat kept its lease alive: the run stopped without
    anything looking wrong.

    Here: a pool of one connection, a provider call held open, the test holding the connection
    so the effect heartbeat waits for it, then the call returning while the connection is
    handed over. Fixed by a stop flag the heartbeat loop checks, and a bounded wait for it."""
    pool = make_pool(db_url, max_size=1, min_size=1)
    await pool.open(wait=True)
    effects = Effects(pool, lease_seconds=0.06)  # its heartbeat runs every 20 ms
    rng = random.Random(5)
    try:
        for i in range(60):  # before the fix, one of the first ~15 hung
            provider = _HeldProvider()
            step = StepContext(
                org_id="test",
                run_id=f"run_{i}",
                seq=1,
                step_id="send",
                kind="email.send",
                lane="io",
                iteration=1,
                attempt=1,
                worker="w",
                params={},
                input={},
                vars={},
                steps={},
                wake=None,
                definition=StepDef(id="send", kind="email.send"),
            )
            call = asyncio.create_task(effects.run(step, provider, {}))
            await provider.started.wait()
            conn = await pool.getconn()  # the effect heartbeat now waits for the connection
            await asyncio.sleep(rng.uniform(0.02, 0.04))
            provider.release.set()  # the call returns: _perform cancels its heartbeat ...
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)
            await pool.putconn(conn)  # ... while the pool hands it the connection
            done, _ = await asyncio.wait({call}, timeout=3)
            if not done:
                call.cancel()
                await asyncio.wait({call}, timeout=3)
            assert done, f"effect {i} never settled: its cancelled heartbeat runs on"
            assert call.result() == {"id": f"run_{i}/send/1"}
    finally:
        await pool.close()
