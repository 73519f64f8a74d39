"""The PostgreSQL LISTEN/NOTIFY wake queue against a real server (R2, R16).

Every test uses its own channel prefix, so tests running side by side on the same database do
not hear each other. NOTIFY reaches only sessions that are already listening, so the tests
wait (bounded) until the listener's LISTEN is visible in pg_stat_activity before publishing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from onward.queue.base import Queue, Wake
from onward.queue.postgres import PostgresQueue, channel

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
    try:
        conn = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {PG_URL}: {exc}")
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


async def test_publish_then_consume_delivers(
    admin: Admin, queue: PostgresQueue, consume: Consume
) -> None:
    got = Collector()
    consume(queue, ["fast"], got)
    await listener_pid(admin, queue, "fast")
    await queue.publish([wake("w1"), wake("w2")])
    assert (await got.until("w1")).payload == {"n": 1}
    await got.until("w2")
    assert not got.reconnected.is_set()


async def test_publish_tx_is_delivered_only_on_commit(
    admin: Admin, queue: PostgresQueue, consume: Consume
) -> None:
    got = Collector()
    consume(queue, ["fast"], got)
    await listener_pid(admin, queue, "fast")
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
    got = Collector()
    consume(queue, ["fast", "io"], got)
    pid = await listener_pid(admin, queue, "io")  # LISTENs run in lane order: io is last
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
    got = Collector()
    consume(queue, ["fast"], got)
    await listener_pid(admin, queue, "fast")
    await queue.publish([wake("first")])
    await got.until("first")
    assert queue._pub is not None
    await admin.execute("SELECT pg_terminate_backend(%s)", (queue._pub.info.backend_pid,))
    # The relay sees the failure (and leaves its rows unsent); the next publish reconnects.
    with pytest.raises(psycopg.OperationalError):
        await queue.publish([wake("lost")])
    await queue.publish([wake("second")])
    await got.until("second")
