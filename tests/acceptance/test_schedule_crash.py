"""The elected sweeper dies between a schedule's run start and the schedule row's advance
(crash point ``schedule.after_start``): a real process, SIGKILLed there. The next sweeper fires
the same instant again; its start key makes the repeat a duplicate, so no firing starts two
runs, and the schedule goes on from where it stood.

The processes are sweepers only (``python -m onward.testing.worker --sweeper --no-worker``),
leadership lease 2 s, sweep 0.2 s; the rule fires every 2 s (an RRULE from a DTSTART a moment
ago), overlap ``allow`` and catch-up ``all``, so every instant must start exactly one run."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.testing import Processes, eventually, history
from tests.acceptance.procs import worker_settings

pytestmark = pytest.mark.acceptance

TTL = 2.0


def every_2s(lead: float = 1.0, count: int = 60) -> str:
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=lead)
    return f"DTSTART:{start:%Y%m%dT%H%M%S}\nRRULE:FREQ=SECONDLY;INTERVAL=2;COUNT={count}"


def runs(sql: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return list(
        sql.execute(
            "SELECT run_id, start_key, input FROM runs WHERE automation_id = 'ticker' "
            "ORDER BY input->'schedule'->>'instant'"
        ).fetchall()
    )


def schedule(sql: psycopg.Connection[Any]) -> dict[str, Any]:
    row = sql.execute("SELECT * FROM schedules WHERE schedule_id = 'every'").fetchone()
    assert row is not None
    return row


async def test_a_sweeper_killed_after_a_firing_started_its_run_never_starts_it_twice(
    db_url: str, engine: Engine, sql: psycopg.Connection[Any], processes: Processes
) -> None:
    flow = (
        Automation("ticker")
        .step("tick", "set", values={"at": "input.schedule.instant"})
        .schedule("every", every_2s(), zone="UTC", overlap="allow", catch_up="all")
    )
    await engine.publish(flow.build())
    settings = worker_settings(db_url, sweep=0.2)
    options = {"worker": False, "relay": False, "sweeper": True, "leader_ttl": TTL}

    a = processes.worker(settings, "sweeper-a", crash_at="schedule.after_start", **options)
    assert await a.exited(timeout=30) == -9
    assert a.printed("onward: crash point schedule.after_start reached, SIGKILL")
    started = runs(sql)
    assert len(started) == 1  # the run of the first firing is committed ...
    first = started[0]["input"]["schedule"]["instant"]
    row = schedule(sql)  # ... and the schedule still stands at that firing
    assert (row["fired_count"], row["last_run_id"]) == (0, None)
    assert row["next_instant"] == datetime.fromisoformat(first)

    b = processes.worker(settings, "sweeper-b", **options)

    async def three_more() -> dict[str, Any] | None:
        current = schedule(sql)
        return current if current["fired_count"] >= 4 else None

    await eventually(three_more, timeout=40, what="the next sweeper to fire four times")
    assert b.stop() == 0

    after = runs(sql)
    keys = [r["start_key"] for r in after]
    assert len(keys) == len(set(keys))  # one run per firing
    instants = [datetime.fromisoformat(r["input"]["schedule"]["instant"]) for r in after]
    assert instants[0] == datetime.fromisoformat(first)
    assert all(y - x == timedelta(seconds=2) for x, y in itertools.pairwise(instants))  # no gap
    # the first firing was repeated by sweeper-b and acknowledged as the duplicate it is
    assert after[0]["run_id"] == started[0]["run_id"]
    assert len(history(sql, after[0]["run_id"], "start_duplicate")) == 1
    assert all(history(sql, r["run_id"], "start_duplicate") == [] for r in after[1:])
