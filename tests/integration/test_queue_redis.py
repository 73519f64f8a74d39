"""The Redis wake queue against a real Redis (R2, R7, R16): ``ONWARD_TEST_REDIS_URL``, by
default redis://127.0.0.1:6379/0.

Db 0 may be shared with other test runs: every test uses its own key prefix and deletes its
keys afterwards; connections are killed by id (never ``CLIENT KILL TYPE normal``, which would
cut every other client too); the eviction-policy test restores the original policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit
from uuid import uuid4

import psycopg
import pytest
import redis.asyncio as aioredis

from onward.engine import Engine
from onward.errors import QueueMisconfigured
from onward.ids import step_wake_id, timer_wake_id
from onward.outbox import Relay
from onward.queue.base import Queue, Wake
from onward.queue.redis import RedisQueue
from onward.testing import eventually

REDIS_URL = os.environ.get("ONWARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
Admin = aioredis.Redis
MakeQueue = Callable[..., RedisQueue]
Consume = Callable[[Queue, list[str], "Collector"], "asyncio.Task[None]"]
Caplog = pytest.LogCaptureFixture
WAIT_S = 10.0  # upper bound for anything we wait on; a pass takes milliseconds


class Collector:
    """What a worker would do with wakes: record them, and wake up whoever waits."""

    def __init__(self) -> None:
        self.wakes: list[Wake] = []
        self.arrived: asyncio.Queue[Wake] = asyncio.Queue()
        self.arrived_at: dict[str, float] = {}
        self.reconnected = asyncio.Event()
        self.after: Callable[[], None] | None = None

    def on_wake(self, wake: Wake) -> None:
        self.arrived_at.setdefault(wake.job_id, time.monotonic())
        self.wakes.append(wake)
        self.arrived.put_nowait(wake)
        if self.after is not None:
            self.after()

    def on_reconnect(self) -> None:
        self.reconnected.set()

    async def until(self, job_id: str) -> Wake:
        """Wait until the wake with this job id has arrived (or had arrived already)."""
        async with asyncio.timeout(WAIT_S):
            while job_id not in self.ids():
                await self.arrived.get()
        return next(w for w in self.wakes if w.job_id == job_id)

    def ids(self) -> list[str]:
        return [w.job_id for w in self.wakes]


def wake(job_id: str, lane: str = "fast", delay_s: float = 0.0, **payload: object) -> Wake:
    return Wake(
        job_id=job_id, topic="step", lane=lane, org_id="org_1", payload=payload, delay_s=delay_s
    )


@pytest.fixture
async def admin() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    await client.ping()  # no Redis is a failure, not a skip
    yield client
    await client.aclose()


@pytest.fixture
async def prefix(admin: aioredis.Redis) -> AsyncIterator[str]:
    value = f"t{uuid4().hex[:8]}"
    yield value
    keys = [k async for k in admin.scan_iter(match=f"{value}:*", count=1000)]
    if keys:
        await admin.delete(*keys)


@pytest.fixture
async def make_queue(prefix: str) -> AsyncIterator[Callable[..., RedisQueue]]:
    made: list[RedisQueue] = []

    def make(url: str = REDIS_URL, **kwargs: Any) -> RedisQueue:
        q = RedisQueue(url, prefix=prefix, **kwargs)
        made.append(q)
        return q

    yield make
    for q in made:
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
        # A consumer that stopped on its own (rather than by cancel) is a bug: surface it.
        assert not task.done(), task
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_publish_then_consume_delivers(make_queue: MakeQueue, consume: Consume) -> None:
    q = make_queue()
    got = Collector()
    consume(q, ["fast", "io"], got)
    first = Wake(
        job_id=step_wake_id("run_1", 3, 1),
        topic="step",
        lane="fast",
        org_id="org_1",
        payload={"run_id": "run_1", "seq": 3},
    )
    second = Wake(
        job_id=timer_wake_id("org_1", 7, 1), topic="timer", lane="io", org_id="org_1", payload={}
    )
    await q.publish([first, second])
    assert await got.until(first.job_id) == first
    assert await got.until(second.job_id) == second


async def test_same_job_id_twice_is_delivered_once(make_queue: MakeQueue, consume: Consume) -> None:
    q = make_queue()
    got = Collector()
    dup = wake(step_wake_id("run_1", 1, 1))
    await q.publish([dup, dup])  # twice in one batch
    await q.publish([dup])  # and again, as a relay that crashed before marking it sent
    consume(q, ["fast"], got)
    # The ready list is FIFO: once a later wake arrives, every earlier one has been delivered.
    await q.publish([wake("sentinel")])
    await got.until("sentinel")
    assert got.ids().count(dup.job_id) == 1


async def test_dedup_marker_is_retained_for_retention_s(
    admin: Admin, make_queue: MakeQueue, consume: Consume
) -> None:
    q = make_queue(retention_s=120.0)
    got = Collector()
    w = wake(step_wake_id("run_1", 1, 1))
    await q.publish([w])
    ttl_ms = await admin.pttl(q.job_key(w.job_id))
    assert 0 < ttl_ms <= 120_000
    # Once the marker expires (simulated by deleting it) the same id is a new job again.
    await admin.delete(q.job_key(w.job_id))
    await q.publish([w])
    consume(q, ["fast"], got)
    await q.publish([wake("sentinel")])
    await got.until("sentinel")
    assert got.ids().count(w.job_id) == 2


async def test_delayed_wake_marker_outlives_the_delay(admin: Admin, make_queue: MakeQueue) -> None:
    q = make_queue(retention_s=120.0)
    await q.publish([wake("later", delay_s=60.0)])
    ttl_ms = await admin.pttl(q.job_key("later"))
    assert 120_000 < ttl_ms <= 180_000


async def test_refused_publish_raises_connection_error_and_leaves_no_marker(
    admin: Admin, make_queue: MakeQueue, consume: Consume
) -> None:
    # The relay leaves rows unsent on ConnectionError/OSError. A refusal (here WRONGTYPE; in
    # production typically OOM under noeviction) must surface as one, and must not leave a
    # dedup marker behind that would swallow the relay's retry.
    q = make_queue()
    await admin.set(q.ready_key("fast"), "not a list")
    with pytest.raises(ConnectionError, match="refused the wakes"):
        await q.publish([wake("w1")])
    assert await admin.exists(q.job_key("w1")) == 0
    await admin.delete(q.ready_key("fast"))
    got = Collector()
    consume(q, ["fast"], got)
    await q.publish([wake("w1")])  # the relay's retry
    await got.until("w1")


async def test_publish_to_unreachable_redis_raises_connection_error(make_queue: MakeQueue) -> None:
    q = make_queue("redis://127.0.0.1:1/0")
    with pytest.raises(ConnectionError):
        await q.publish([wake("w1")])


async def test_a_new_attempt_is_a_new_wake(make_queue: MakeQueue, consume: Consume) -> None:
    q = make_queue()
    got = Collector()
    consume(q, ["fast"], got)
    await q.publish([wake(step_wake_id("run_1", 4, 1))])
    await got.until(step_wake_id("run_1", 4, 1))
    # The step was retried: the wake for attempt 2 must not be swallowed by attempt 1's id.
    await q.publish([wake(step_wake_id("run_1", 4, 2))])
    await got.until(step_wake_id("run_1", 4, 2))


async def test_delay_is_scored_by_redis_server_time(admin: Admin, make_queue: MakeQueue) -> None:
    q = make_queue()
    sec, usec = await admin.time()
    before_ms = sec * 1000 + usec / 1000
    await q.publish([wake("later", delay_s=0.3)])
    sec, usec = await admin.time()
    after_ms = sec * 1000 + usec / 1000
    assert await admin.llen(q.ready_key("fast")) == 0
    delayed: list[Any] = await admin.zrange(q.delayed_key("fast"), 0, -1, withscores=True)
    [(member, score)] = delayed
    assert Wake.from_json(str(member)).job_id == "later"
    assert before_ms + 300 <= float(score) <= after_ms + 300


class SlowWake(Wake):
    """A wake whose JSON takes a millisecond to write: a publish that is slow to build."""

    def to_json(self) -> str:
        time.sleep(0.001)
        return super().to_json()


async def test_a_batch_slow_to_build_is_scored_from_when_its_delays_were_measured(
    admin: Admin, make_queue: MakeQueue
) -> None:
    # 600 delayed wakes, three scripts; building each takes ~0.26 s. Scored from each script's
    # own Redis TIME, the last wakes would be due ~0.5 s after their instant; the time the
    # publish spent is taken off, so every wake is due at its instant (and never before it).
    q = make_queue()
    sec, usec = await admin.time()
    measured_ms = sec * 1000 + usec / 1000  # before the delays below are measured
    await q.publish(
        [
            SlowWake(job_id=f"w{i}", topic="timer", lane="fast", org_id="org_1", delay_s=5.0)
            for i in range(600)
        ]
    )
    delayed: list[Any] = await admin.zrange(q.delayed_key("fast"), 0, -1, withscores=True)
    scores = [float(score) for _, score in delayed]
    assert len(scores) == 600
    assert min(scores) >= measured_ms + 5000  # never early
    assert max(scores) - (measured_ms + 5000) < 200  # the 0.5 s of building taken off


async def test_delayed_wake_is_not_delivered_early(make_queue: MakeQueue, consume: Consume) -> None:
    q = make_queue()
    got = Collector()
    consume(q, ["fast"], got)
    published_at = time.monotonic()
    await q.publish([wake("later", delay_s=0.3), wake("now")])
    await got.until("later")
    # Lower bound only (an upper bound would be a timing flake on a loaded machine). The
    # small allowance covers the Redis clock (TIME) and the monotonic clock being slewed
    # differently by NTP; rounding sub-second delays up to 1 s, as bullmq does, is far off.
    assert got.arrived_at["later"] - published_at >= 0.3 - 0.002
    assert got.ids() == ["now", "later"]


async def test_two_consumers_never_get_the_same_job(
    make_queue: MakeQueue, consume: Consume
) -> None:
    q1, q2 = make_queue(), make_queue()
    a, b = Collector(), Collector()
    ids = [f"job-{i}" for i in range(300)]
    all_in = asyncio.Event()

    def count() -> None:
        if len(a.wakes) + len(b.wakes) >= len(ids):
            all_in.set()

    a.after = b.after = count
    consume(q1, ["io"], a)
    consume(q2, ["io"], b)
    # Ready jobs, and delayed ones that both consumers race to promote.
    await q1.publish([wake(i, lane="io") for i in ids[:150]])
    await q2.publish([wake(i, lane="io", delay_s=0.05) for i in ids[150:]])
    async with asyncio.timeout(WAIT_S):
        await all_in.wait()
    assert not set(a.ids()) & set(b.ids())
    assert sorted(a.ids() + b.ids()) == sorted(ids)


async def test_malformed_payload_is_skipped_with_a_warning(
    admin: Admin, make_queue: MakeQueue, consume: Consume, caplog: Caplog
) -> None:
    q = make_queue()
    got = Collector()
    await admin.lpush(q.ready_key("fast"), "not json", '{"job_id": "x"}', "[]")
    with caplog.at_level(logging.WARNING, logger="onward.queue.redis"):
        consume(q, ["fast"], got)
        await q.publish([wake("good")])
        await got.until("good")
    assert got.ids() == ["good"]
    assert sum("malformed wake" in r.getMessage() for r in caplog.records) == 3


async def test_a_raising_on_wake_does_not_stop_the_consumer(
    make_queue: MakeQueue, consume: Consume, caplog: Caplog
) -> None:
    q = make_queue()

    class Raising(Collector):
        def on_wake(self, wake: Wake) -> None:
            super().on_wake(wake)
            if wake.job_id == "boom":
                raise RuntimeError("handler bug")

    got = Raising()
    with caplog.at_level(logging.ERROR, logger="onward.queue.redis"):
        consume(q, ["fast"], got)
        await q.publish([wake("boom")])
        await got.until("boom")
        await q.publish([wake("after")])
        await got.until("after")
    assert any("on_wake failed" in r.getMessage() for r in caplog.records)


async def test_consumer_survives_its_connection_being_killed(
    admin: Admin, make_queue: MakeQueue, consume: Consume, prefix: str
) -> None:
    q = make_queue()
    got = Collector()
    consume(q, ["fast"], got)
    await q.publish([wake("before")])
    await got.until("before")  # the consumer is connected now
    mine = [c for c in await admin.client_list() if c.get("name") == f"{prefix}:consumer"]
    assert len(mine) == 1
    await admin.client_kill_filter(_id=mine[0]["id"])
    async with asyncio.timeout(WAIT_S):
        await got.reconnected.wait()
    await q.publish([wake("after")])
    await got.until("after")


async def test_cancel_stops_the_consumer_promptly(make_queue: MakeQueue) -> None:
    # Regression: on Python 3.11 redis-py's socket writes (asyncio.wait_for) could swallow a
    # cancel() that landed just as a write completed; the consumer then kept looping. With a
    # long block_s a swallowed cancel shows as a stop that takes seconds instead of at once.
    q = make_queue(block_s=5.0)
    for i in range(150):
        got = Collector()
        # a lane per round: a take the previous consumer sent just before its cancel can still
        # reach Redis after this round's publish and pop its wake -- lost, as a wake popped by
        # a stopping consumer is (wakes are hints) -- which this test is not about
        lane = f"fast{i}"
        task = asyncio.create_task(q.consume([lane], got.on_wake))
        await q.publish([wake(f"c{i}", lane=lane)])
        await got.until(f"c{i}")
        for _ in range(i % 4):  # vary where in its loop the consumer is when cancelled
            await asyncio.sleep(0)
        task.cancel()
        async with asyncio.timeout(2.0):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert task.cancelled()


async def test_eviction_policy_other_than_noeviction(
    admin: Admin, make_queue: MakeQueue, caplog: Caplog
) -> None:
    original = str((await admin.config_get("maxmemory-policy"))["maxmemory-policy"])
    strict, lenient = make_queue(), make_queue(allow_eviction=True)
    if original == "noeviction":
        await strict.start()
        assert await strict.health() == []
    try:
        await admin.config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(QueueMisconfigured, match="maxmemory-policy noeviction"):
            await strict.start()
        with caplog.at_level(logging.WARNING, logger="onward.queue.redis"):
            await lenient.start()
        assert any("allkeys-lru" in r.getMessage() for r in caplog.records)
        for q in (strict, lenient):
            [problem] = await q.health()
            assert "allkeys-lru" in problem
            assert "noeviction" in problem
        await lenient.publish([wake("still-works")])  # it proceeds
    finally:
        await admin.config_set("maxmemory-policy", original)


async def test_config_not_permitted_falls_back_to_info_then_warns(
    admin: Admin, make_queue: MakeQueue, caplog: Caplog
) -> None:
    users: list[str] = []
    host_port = urlsplit(REDIS_URL).netloc.rpartition("@")[2]

    async def user(*rules: str) -> str:
        name = f"onward-test-{uuid4().hex[:8]}"
        users.append(name)
        await admin.execute_command("ACL", "SETUSER", name, "on", ">pw", "~*", "&*", *rules)
        return urlsplit(REDIS_URL)._replace(netloc=f"{name}:pw@{host_port}").geturl()

    try:
        # A managed Redis that refuses CONFIG but answers INFO: the policy is still checked.
        no_config = make_queue(await user("+@all", "-config"))
        with caplog.at_level(logging.WARNING, logger="onward.queue.redis"):
            await no_config.start()
        assert any("CONFIG GET is not permitted" in r.getMessage() for r in caplog.records)
        policy = (await admin.config_get("maxmemory-policy"))["maxmemory-policy"]
        assert (await no_config.health() == []) == (policy == "noeviction")

        # One that refuses both: say so, and carry on.
        caplog.clear()
        blind = make_queue(await user("+@all", "-config", "-info"))
        with caplog.at_level(logging.WARNING, logger="onward.queue.redis"):
            await blind.start()
        assert any("cannot read maxmemory-policy" in r.getMessage() for r in caplog.records)
        [problem] = await blind.health()
        assert "cannot verify" in problem
    finally:
        for name in users:
            await admin.execute_command("ACL", "DELUSER", name)


async def test_health_reports_unreachable_redis(make_queue: MakeQueue) -> None:
    q = make_queue("redis://127.0.0.1:1/0")
    [problem] = await q.health()
    assert "unreachable" in problem
    assert "127.0.0.1:1" in problem


async def test_noop_cases(make_queue: MakeQueue) -> None:
    q = make_queue()
    await q.publish([])  # nothing to do, no error
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await q.consume([], lambda w: None)  # no lanes: waits until cancelled
    await q.close()
    await q.close()  # closing twice is harmless


async def test_a_relay_round_held_up_after_its_take_publishes_the_delay_that_remains(
    admin: Admin, make_queue: MakeQueue, engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    """A delayed wake's delay counts from its round's now() (the transaction's start): a round
    held up after it (here by a lock on the outbox; in life by a busy process) publishes what
    remains of the delay, so the wake is due at its instant -- not that much later, and never
    before it."""
    q = make_queue()
    row = sql.execute(
        "INSERT INTO outbox (org_id, topic, job_id, lane, payload, deliver_at)"
        " VALUES (%s, 'step', 'held-up', 'fast', '{}', now() + interval '3 s')"
        " RETURNING deliver_at",
        (engine.org_id,),
    ).fetchone()
    assert row is not None
    due_ms = row["deliver_at"].timestamp() * 1000
    relay = Relay(engine.pool, q)

    async def held_up() -> bool:
        waiting = sql.execute(
            "SELECT extract(epoch FROM clock_timestamp() - xact_start)::float8 AS s"
            " FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ).fetchone()
        return waiting is not None and waiting["s"] >= 0.8

    with psycopg.connect(sql.info.dsn) as blocker:
        blocker.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        round_ = asyncio.create_task(relay.run_once())
        await eventually(held_up, timeout=10)
        blocker.rollback()
        assert await round_ == 1

    delayed: list[Any] = await admin.zrange(q.delayed_key("fast"), 0, -1, withscores=True)
    [(member, score)] = delayed
    assert Wake.from_json(str(member)).job_id == "held-up"
    # held up 0.8 s or more: published with the whole delay, it would be due that much late
    assert due_ms - 2 <= float(score) < due_ms + 400
