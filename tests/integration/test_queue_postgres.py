"""The PostgreSQL LISTEN/NOTIFY wake queue against a real server (R2, R16).

Every test uses its own channel prefix, so tests running side by side on the same database do
not hear each other. NOTIFY reaches only sessions that are already listening, so the tests
wait (bounded) until the listener's LISTEN is visible in pg_stat_activity before publishing.

Health (what ``onward doctor`` reports as ``queue_postgres``) is proven both ways: healthy
through a live listener and through a round trip of its own, and unhealthy for real -- a
listener whose session was terminated while its role may not log in again (so it cannot
reconnect until the test allows it), a server nobody listens on, and a NOTIFY queue held by a
session that LISTENs inside an open transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

import psycopg
import pytest

from onward.doctor import run_checks
from onward.engine import Engine
from onward.queue.base import Queue, Wake
from onward.queue.postgres import PostgresQueue, channel
from onward.testing import eventually

PG_URL = os.environ.get("ONWARD_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
WAIT_S = 10.0

Admin = psycopg.AsyncConnection[Any]
Consume = Callable[[Queue, list[str], "Collector"], "asyncio.Task[None]"]


class Collector:
    def __init__(self) -> None:
        self.wakes: list[Wake] = []
        self.arrived: asyncio.Queue[Wake] = asyncio.Queue()
        self.reconnected = asyncio.Event()

    def on_wake(self, wake: Wake) -> None:
        self.wakes.append(wake)
        self.arrived.put_nowait(wake)

    def on_reconnect(self) -> None:
        self.reconnected.set()

    async def until(self, job_id: str) -> Wake:
        async with asyncio.timeout(WAIT_S):
            while job_id not in [w.job_id for w in self.wakes]:
                await self.arrived.get()
        return next(w for w in self.wakes if w.job_id == job_id)


def wake(job_id: str, lane: str = "fast") -> Wake:
    return Wake(job_id=job_id, topic="step", lane=lane, org_id="org_1", payload={"n": 1})


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    conn = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
    yield conn
    await conn.close()


@pytest.fixture
async def queue() -> AsyncIterator[PostgresQueue]:
    q = PostgresQueue(PG_URL, prefix=f"t{uuid4().hex[:8]}")
    yield q
    await q.close()


@pytest.fixture
async def consume() -> AsyncIterator[Consume]:
    tasks: list[asyncio.Task[None]] = []

    def start(q: Queue, lanes: list[str], into: Collector) -> asyncio.Task[None]:
        task = asyncio.create_task(q.consume(lanes, into.on_wake, into.on_reconnect))
        tasks.append(task)
        return task

    yield start
    for task in tasks:
        assert not task.done(), task
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def listener_pid(admin: Admin, q: PostgresQueue, lane: str) -> int:
    """Wait until the consumer's session has finished LISTENing on the lane; its pid."""
    sql = "SELECT pid FROM pg_stat_activity WHERE query = %s AND state = 'idle'"
    async with asyncio.timeout(WAIT_S):
        while True:
            cur = await admin.execute(sql, (f'LISTEN "{channel(q.prefix, lane)}"',))
            row = await cur.fetchone()
            if row is not None:
                return int(row[0])
            await asyncio.sleep(0.02)  # polling a condition, bounded by the timeout above


async def listening(
    consume: Consume, admin: Admin, q: PostgresQueue, *lanes: str
) -> tuple[Collector, int]:
    """Consume ``lanes`` (default ``fast``) into a new Collector; wait until its LISTENs are
    done (they run in lane order: the last lane is last). The collector and the pid."""
    lanes = lanes or ("fast",)
    got = Collector()
    consume(q, list(lanes), got)
    return got, await listener_pid(admin, q, lanes[-1])


async def test_publish_then_consume_delivers(
    admin: Admin, queue: PostgresQueue, consume: Consume
) -> None:
    got, _ = await listening(consume, admin, queue, "fast", "io")
    await queue.publish([wake("w1"), wake("w2", lane="io")])
    assert (await got.until("w1")).payload == {"n": 1}
    assert (await got.until("w2")).lane == "io"
    assert not got.reconnected.is_set()


async def test_the_step_wakes_of_a_lane_in_one_publish_are_one_notification(
    admin: Admin, queue: PostgresQueue, consume: Consume
) -> None:
    """A step wake says only that its lane has ready work: 150 of them in one relay round woke
    each worker 150 times. Timer wakes name their timer: each stays one. The first of a lane
    is the one sent; the next publish wakes the lane again."""
    got, _ = await listening(consume, admin, queue, "fast", "io")
    timers = [
        Wake(job_id=f"t{i}", topic="timer", lane="fast", org_id="org_1", payload={"timer_id": i})
        for i in range(3)
    ]
    await queue.publish(
        [wake("a1"), wake("a2"), timers[0], wake("b1", lane="io"), timers[1], wake("a3")]
    )
    async with await psycopg.AsyncConnection.connect(PG_URL) as conn:
        await queue.publish_tx(conn, [wake("c1"), wake("c2"), timers[2], wake("c3")])
        await conn.commit()
    await queue.publish([wake("last")])  # sent after the others: its arrival means theirs did
    await got.until("last")
    assert [w.job_id for w in got.wakes] == ["a1", "t0", "b1", "t1", "c1", "t2", "last"]


async def test_publish_tx_is_delivered_only_on_commit(
    admin: Admin, queue: PostgresQueue, consume: Consume
) -> None:
    got, _ = await listening(consume, admin, queue)
    async with await psycopg.AsyncConnection.connect(PG_URL) as conn:
        await queue.publish_tx(conn, [wake("rolled-back")])
        await conn.rollback()
        await queue.publish_tx(conn, [wake("committed")])
        await conn.commit()
    await got.until("committed")
    assert "rolled-back" not in [w.job_id for w in got.wakes]


async def test_listener_reconnects_relistens_and_delivers_after_termination(
    admin: Admin, queue: PostgresQueue, consume: Consume
) -> None:
    got, pid = await listening(consume, admin, queue, "fast", "io")
    await queue.publish([wake("before")])
    await got.until("before")

    await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    async with asyncio.timeout(WAIT_S):
        await got.reconnected.wait()
    new_pid = await listener_pid(admin, queue, "io")
    assert new_pid != pid
    # Both channels are listened to again, not only the last one.
    await queue.publish([wake("after-fast", "fast"), wake("after-io", "io")])
    await got.until("after-fast")
    await got.until("after-io")


async def test_publisher_reconnects_after_its_connection_is_terminated(
    admin: Admin, queue: PostgresQueue, consume: Consume
) -> None:
    got, _ = await listening(consume, admin, queue)
    await queue.publish([wake("first")])
    await got.until("first")
    assert queue._pub is not None
    await admin.execute("SELECT pg_terminate_backend(%s)", (queue._pub.info.backend_pid,))
    # The relay sees the failure (and leaves its rows unsent); the next publish reconnects.
    with pytest.raises(psycopg.OperationalError):
        await queue.publish([wake("lost")])
    await queue.publish([wake("second")])
    await got.until("second")


# -- health ---------------------------------------------------------------------------------------


def as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rsplit('@', 1)[-1]}"))


@contextlib.asynccontextmanager
async def own_role(admin: Admin) -> AsyncIterator[str]:
    """A login role of the test's own, so its sessions can be barred from reconnecting."""
    role = f"onward_q_{uuid4().hex[:8]}"
    await admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        yield role
    finally:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')


async def cut_off(admin: Admin, q: PostgresQueue, role: str) -> None:
    """Terminate the listener's session and keep its role from logging in again."""
    pid = await listener_pid(admin, q, "fast")
    await admin.execute(f'ALTER ROLE "{role}" NOLOGIN')
    await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def not_connected(q: PostgresQueue) -> list[str]:
    async def seen() -> list[str]:
        problems = await q.health()
        return problems if any("not connected" in p for p in problems) else []

    return await eventually(seen, timeout=WAIT_S, what="the lost listener to be reported")


async def test_health_through_a_live_listener_is_healthy(
    admin: Admin, queue: PostgresQueue, consume: Consume
) -> None:
    got, _ = await listening(consume, admin, queue)
    assert await queue.health() == []
    assert await queue.health() == []  # each probe has its own token
    assert got.wakes == []  # health echoes are not wakes


async def test_health_without_a_listener_here_makes_a_round_trip_of_its_own(
    queue: PostgresQueue,
) -> None:
    """What ``onward doctor`` does: its process consumes nothing, so it listens itself."""
    assert await queue.health() == []


async def test_health_reports_a_listener_cut_off_until_it_is_back(
    admin: Admin, consume: Consume
) -> None:
    async with own_role(admin) as role:
        q = PostgresQueue(as_role(PG_URL, role), prefix=f"t{uuid4().hex[:8]}", health_timeout=2)
        try:
            got, _ = await listening(consume, admin, q)
            assert await q.health() == []

            await cut_off(admin, q, role)
            [problem] = await not_connected(q)
            assert "1 of 1 wake listeners" in problem and "lost" in problem

            await admin.execute(f'ALTER ROLE "{role}" LOGIN')
            async with asyncio.timeout(WAIT_S):
                await got.reconnected.wait()
            await listener_pid(admin, q, "fast")
            assert await q.health() == []
            await q.publish([wake("after")])
            await got.until("after")
        finally:
            await q.close()


async def test_health_reports_a_listener_whose_echo_never_comes(
    admin: Admin, queue: PostgresQueue, consume: Consume
) -> None:
    """A listener that still looks connected but hears nothing (its server session stalls,
    as behind a partition): the round trip times out."""
    queue.health_timeout = 1.0
    _, pid = await listening(consume, admin, queue)
    os.kill(pid, signal.SIGSTOP)  # the listener's own backend process, nobody else's
    try:
        [problem] = await queue.health()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert "did not come back within 1s" in problem
    assert await queue.health() == []  # the echo that was held up arrives; the next one too


async def test_health_reports_a_server_it_cannot_reach() -> None:
    with socket.socket() as s:  # a port that is bound but never listens: connections refused
        s.bind(("127.0.0.1", 0))
        q = PostgresQueue(f"postgresql://postgres@127.0.0.1:{s.getsockname()[1]}/test")
        [problem] = await q.health()
    assert problem.startswith("PostgreSQL wake channel unusable"), problem


async def test_health_reports_a_notify_queue_held_by_a_listener_in_a_transaction(
    admin: Admin, queue: PostgresQueue
) -> None:
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as holder:
        await holder.execute(f'LISTEN "{queue.prefix}_held"')
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1")  # idle in transaction: it reads no notification
        await admin.execute(
            "SELECT pg_notify(%s, repeat('x', 7000)) FROM generate_series(1, 50)",
            (f"{queue.prefix}_held",),
        )
        queue.notify_queue_limit = 0.0
        # the server accounts its queue by pages, asynchronously: poll until it shows
        [problem] = await eventually(queue.health, timeout=15, what="the held queue reported")
        assert "NOTIFY queue is" in problem and "stuck inside a transaction" in problem
        await holder.execute("COMMIT")
    queue.notify_queue_limit = 0.5
    assert await queue.health() == []


async def test_doctor_reports_the_queue_unhealthy_while_its_listener_is_cut_off(
    engine: Engine, db_url: str, admin: Admin, consume: Consume
) -> None:
    async with own_role(admin) as role:
        q = PostgresQueue(as_role(db_url, role), prefix=f"t{uuid4().hex[:8]}", health_timeout=2)
        engine.queue = q
        try:
            await listening(consume, admin, q)
            checks = {c.name: c for c in await run_checks(engine)}
            assert checks["queue_postgres"].ok, checks["queue_postgres"]

            await cut_off(admin, q, role)
            await not_connected(q)
            checks = {c.name: c for c in await run_checks(engine)}
            bad = checks["queue_postgres"]
            assert not bad.ok and bad.value == 1 and "not connected" in bad.detail
        finally:
            await q.close()
