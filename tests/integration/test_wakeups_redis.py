"""The wake-up path over the Redis queue: the queue can be flushed or republish, and every run
still finishes once (R2, R7, R16). Uses Redis logical database 14 and a unique key prefix."""

from __future__ import annotations

import dataclasses
import secrets
import signal
from collections.abc import Iterator

import psycopg
import pytest
import redis

from onward.config import Settings
from onward.engine import Engine
from onward.testing import Processes, assert_nothing_applied_twice, eventually
from tests.conftest import REDIS_URL
from tests.integration.test_wakeups import WAIT_FLOW

REDIS_DB14 = REDIS_URL.rsplit("/", 1)[0] + "/14"


@pytest.fixture
def redis_settings(settings: Settings) -> Iterator[Settings]:
    prefix = f"t{secrets.token_hex(4)}"
    yield dataclasses.replace(settings, queue="redis", redis_url=REDIS_DB14, queue_prefix=prefix)
    client = redis.Redis.from_url(REDIS_DB14)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


async def test_redis_flushed_in_the_middle_of_200_runs_all_finish_once(
    redis_settings: Settings, sql: psycopg.Connection
) -> None:
    async with Engine.open(redis_settings, migrate=False) as engine:
        await engine.publish(WAIT_FLOW)
        run_ids = [
            (await engine.start("pause", {"i": i}, event_id=f"e{i}")).run_id for i in range(200)
        ]
        async with engine.running():

            async def some_waiting() -> bool:
                row = sql.execute("SELECT count(*) AS n FROM timers").fetchone()
                return row["n"] >= 50

            await eventually(some_waiting, what="timers written")
            client = redis.Redis.from_url(REDIS_DB14)
            client.flushdb()  # every delayed wake and dedup marker in flight is gone
            client.close()
            for run_id in run_ids:
                assert await engine.wait(run_id, timeout=60) == "completed"
    assert_nothing_applied_twice(sql)
    per_run = sql.execute(
        "SELECT count(*) AS n FROM history WHERE event = 'step_done' GROUP BY run_id"
    ).fetchall()
    assert len(per_run) == 200 and {r["n"] for r in per_run} == {3}


async def test_relay_killed_between_publish_and_mark_sent_is_harmless(
    redis_settings: Settings, sql: psycopg.Connection, processes: Processes
) -> None:
    async with Engine.open(redis_settings, migrate=False) as engine:
        await engine.publish(WAIT_FLOW)
        run_ids = [
            (await engine.start("pause", {"i": i}, event_id=f"e{i}")).run_id for i in range(20)
        ]
        # a process running only the relay, killed at the crash point after its first publish
        relay = processes.worker(
            redis_settings, "relay", worker=False, crash_at="relay.after_publish"
        )
        assert await relay.exited(timeout=60) == -signal.SIGKILL, relay.tail(2000)
        # the wakes were published, but the rows are still unsent: they will be published again
        unsent = sql.execute("SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL").fetchone()
        assert unsent["n"] == 20
        client = redis.Redis.from_url(REDIS_DB14)
        assert client.llen(f"{redis_settings.queue_prefix}:ready:fast") == 20
        client.close()
        async with engine.running():
            for run_id in run_ids:
                assert await engine.wait(run_id, timeout=60) == "completed"

            async def all_sent() -> bool:  # a wake written late is relayed a moment later
                row = sql.execute("SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL")
                return bool(row.fetchone()["n"] == 0)

            await eventually(all_sent, what="every outbox row relayed")
    assert_nothing_applied_twice(sql)
