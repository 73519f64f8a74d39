"""Schedules that start runs (issue 10), on a real PostgreSQL: publish syncs the rows (and
refuses bad schedules, storing nothing); the sweep fires them with one run per firing (two
sweepers included); overlap skip under a slow run; buffer_one; catch-up after the sweeper was
down for three intervals, each policy once; pause, resume, trigger.

A fast rule is an RRULE every 2 s counted from a DTSTART a moment ago (``every_2s``): without a
DTSTART the calendar counts sub-hourly intervals from midnight, which is slow. Downtime is
simulated by moving the schedule's next instant back by SQL."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from onward import Automation, InvalidAutomation, UnknownSchedule
from onward import schedules as sched
from onward.config import Settings
from onward.db import make_pool
from onward.engine import Engine
from onward.sweep import Sweeper
from onward.testing import eventually, history


def every_2s(count: int = 60, *, lead: float = 1.0) -> str:
    """An RRULE firing every 2 s (UTC wall clock), the first ``lead`` s from now."""
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=lead)
    return f"DTSTART:{start:%Y%m%dT%H%M%S}\nRRULE:FREQ=SECONDLY;INTERVAL=2;COUNT={count}"


def hourly() -> str:
    """A cron rule once an hour, half an hour away from now (so 'the current hour' is never
    on the edge while a test runs)."""
    minute = (datetime.now(UTC).minute + 30) % 60
    return f"cron {minute} * * * *"


def flow(automation_id: str = "ticker", *, wait: str | None = None, **schedule: Any) -> dict:
    a = Automation(automation_id)
    if wait is not None:
        a.step("slow", "wait_for", duration=wait)
    a.step("tick", "set", values={"at": "input.schedule.instant"})
    if schedule:
        a.schedule(schedule.pop("id", "every"), schedule.pop("rule"), **schedule)
    return a.build()


def schedule_row(sql: psycopg.Connection, schedule_id: str = "every") -> dict[str, Any]:
    row = sql.execute("SELECT * FROM schedules WHERE schedule_id = %s", (schedule_id,)).fetchone()
    assert row is not None
    return dict(row)


def scheduled_runs(sql: psycopg.Connection, automation_id: str = "ticker") -> list[dict]:
    return list(
        sql.execute(
            "SELECT run_id, start_key, status, input, created_at, finished_at FROM runs "
            "WHERE automation_id = %s ORDER BY run_id",
            (automation_id,),
        ).fetchall()
    )


def instants(runs: list[dict]) -> list[str]:
    return [r["input"]["schedule"]["instant"] for r in runs]


async def test_publish_syncs_the_schedule_rows(engine: Engine, sql: psycopg.Connection) -> None:
    doc = flow(id="daily", rule="09:00 on weekdays", zone="Europe/Berlin", input={"team": "a"})
    doc["schedules"].append({"id": "monthly", "rule": "08:30 on day 1", "zone": "Asia/Kathmandu"})
    await engine.publish(doc)
    daily, monthly = schedule_row(sql, "daily"), schedule_row(sql, "monthly")
    now = sql.execute("SELECT now() AS now").fetchone()["now"]
    assert daily["next_instant"] > now and daily["version"] == 1
    local = daily["next_instant"].astimezone(sched.zone("Europe/Berlin"))
    assert (local.hour, local.minute, local.weekday() < 5) == (9, 0, True)
    assert daily["next_fire_at"] == daily["next_instant"]  # no jitter
    assert daily["input"] == {"team": "a"} and (daily["overlap"], daily["catch_up"]) == (
        "skip",
        "latest",
    )
    assert monthly["next_instant"].astimezone(sched.zone("Asia/Kathmandu")).day == 1

    await engine.pause_schedule("ticker", "daily")
    # v2: daily's input changes (its next instant stays), monthly goes, weekly comes
    doc2 = flow(id="daily", rule="09:00 on weekdays", zone="Europe/Berlin", input={"team": "b"})
    doc2["schedules"].append(
        {"id": "weekly", "rule": "cron 0 7 * * 1", "zone": "UTC", "jitter": "10m"}
    )
    published = await engine.publish(doc2)
    assert published.version == 2
    ids = [r["schedule_id"] for r in sql.execute("SELECT schedule_id FROM schedules ORDER BY 1")]
    assert ids == ["daily", "weekly"]
    daily2 = schedule_row(sql, "daily")
    assert daily2["input"] == {"team": "b"} and daily2["paused"] and daily2["version"] == 2
    assert daily2["next_instant"] == daily["next_instant"]
    weekly = schedule_row(sql, "weekly")
    offset = (weekly["next_fire_at"] - weekly["next_instant"]).total_seconds()
    assert 0 <= offset < 600
    assert offset == pytest.approx(
        sched.spread_offset(f"weekly:{sched.iso(weekly['next_instant'])}", 600)
    )
    # a changed rule recomputes the next instant
    doc3 = flow(id="daily", rule="18:00 on weekends", zone="Europe/Berlin")
    await engine.publish(doc3)
    local = schedule_row(sql, "daily")["next_instant"].astimezone(sched.zone("Europe/Berlin"))
    assert (local.hour, local.weekday() >= 5) == (18, True)
    # a document without schedules removes them all
    await engine.publish(flow())
    assert sql.execute("SELECT count(*) AS n FROM schedules").fetchone()["n"] == 0


async def test_invalid_schedules_are_refused_and_nothing_is_stored(
    engine: Engine, sql: psycopg.Connection
) -> None:
    doc = flow(id="a", rule="09:00 on weekdays", zone="Mars/Olympus_Mons")
    doc["schedules"] += [
        {"id": "a", "rule": "09:00 on weekdays", "zone": "UTC"},
        {"id": "b", "rule": "at teatime", "zone": "UTC"},
        {"id": "c", "rule": "cron 61 * * * *", "zone": "UTC"},
        {"id": "d", "rule": "09:00 every day"},
        {
            "id": "e",
            "rule": "09:00 every day",
            "zone": "UTC",
            "start": "2027-01-02T00:00",
            "end": "2027-01-01T00:00",
        },
        {"id": "f", "rule": "09:00 every day", "zone": "UTC", "input": {"schedule": 1}},
        {"id": "g", "rule": "09:00 every day", "zone": "UTC", "jitter": "soon"},
    ]
    with pytest.raises(InvalidAutomation) as refused:
        await engine.publish(doc)
    problems = "\n".join(refused.value.problems)
    for expected in (
        "schedule a: zone: unknown time zone 'Mars/Olympus_Mons'",
        "duplicate schedule id 'a'",
        "schedule b: rule:",
        "schedule c: rule: cron",
        "schedule d: zone: none given",
        "schedule e: end: must come after start",
        "schedule f: input.schedule",
        "schedule g: jitter:",
    ):
        assert expected in problems
    bad_policy = flow(id="x", rule="09:00 every day", zone="UTC", overlap="sometimes")
    with pytest.raises(InvalidAutomation, match="overlap"):
        await engine.publish(bad_policy)
    counts = sql.execute(
        "SELECT (SELECT count(*) FROM automations) AS a, (SELECT count(*) FROM schedules) AS s"
    ).fetchone()
    assert counts == {"a": 0, "s": 0}


async def test_the_automation_timezone_is_the_default_zone(
    engine: Engine, sql: psycopg.Connection
) -> None:
    doc = flow(id="daily", rule="07:00 every day")
    doc["timezone"] = "Australia/Adelaide"
    await engine.publish(doc)
    row = schedule_row(sql, "daily")
    assert row["zone"] == "Australia/Adelaide"
    assert row["next_instant"].astimezone(sched.zone("Australia/Adelaide")).hour == 7


async def test_overlap_skip_under_a_slow_run(engine: Engine, sql: psycopg.Connection) -> None:
    """Every 2 s, each run waits 5 s: while one runs, the firings are skipped (and counted);
    the next run starts only after the first finished."""
    await engine.publish(flow(wait="5s", rule=every_2s(), zone="UTC", overlap="skip"))
    async with engine.running():

        async def two_runs() -> list[dict] | None:
            runs = scheduled_runs(sql)
            return runs if len(runs) >= 2 else None

        runs = await eventually(two_runs, timeout=30, what="a second scheduled run")
    first, second = runs[0], runs[1]
    assert first["status"] == "completed"
    assert second["created_at"] >= first["finished_at"]
    row = schedule_row(sql)
    assert row["skipped_count"] >= 1
    assert first["input"]["schedule"]["id"] == "every"
    assert first["start_key"] == f"ticker:schedule:every:{instants(runs)[0]}"


async def _fire(pool: Any) -> int:
    return await sched.fire_due(pool)


@pytest.mark.parametrize(
    ("policy", "expected_runs", "skipped"),
    [("skip", 0, 3), ("latest", 1, 2), ("all", 3, 0)],
)
async def test_catch_up_after_three_intervals_down(
    engine: Engine, sql: psycopg.Connection, policy: str, expected_runs: int, skipped: int
) -> None:
    await engine.publish(flow(rule=hourly(), zone="UTC", catch_up=policy, overlap="allow"))
    future = schedule_row(sql)["next_instant"]
    # the sweeper was down for three hourly firings
    sql.execute(
        "UPDATE schedules SET next_instant = next_instant - interval '3 hours', "
        "next_fire_at = next_instant - interval '3 hours'"
    )
    missed = [future - timedelta(hours=h) for h in (3, 2, 1)]
    started = await _fire(engine.pool)
    assert started == expected_runs
    runs = scheduled_runs(sql)
    expected = {"skip": [], "latest": missed[-1:], "all": missed}[policy]
    assert instants(runs) == [sched.iso(i) for i in expected]  # oldest first (run ids ordered)
    row = schedule_row(sql)
    assert row["next_instant"] == future  # the next is the next future one
    assert row["skipped_count"] == skipped and row["fired_count"] == expected_runs
    assert row["last_instant"] == missed[-1]
    assert await _fire(engine.pool) == 0  # nothing more is due


async def test_catch_up_all_under_overlap_skip_starts_one(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """Catch-up and overlap compose: the first missed firing starts a run, which is still
    unfinished (no worker here), so the other two are skipped."""
    await engine.publish(flow(rule=hourly(), zone="UTC", catch_up="all", overlap="skip"))
    sql.execute(
        "UPDATE schedules SET next_instant = next_instant - interval '3 hours', "
        "next_fire_at = next_instant - interval '3 hours'"
    )
    assert await _fire(engine.pool) == 1
    row = schedule_row(sql)
    assert (row["fired_count"], row["skipped_count"], row["last_outcome"]) == (1, 2, "skipped")


async def test_buffer_one_keeps_one_firing_until_the_run_finishes(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(flow(rule=hourly(), zone="UTC", overlap="buffer_one", catch_up="all"))
    sql.execute(
        "UPDATE schedules SET next_instant = next_instant - interval '3 hours', "
        "next_fire_at = next_instant - interval '3 hours'"
    )
    assert await _fire(engine.pool) == 1  # the first starts; the second waits; the third: skipped
    row = schedule_row(sql)
    assert (row["fired_count"], row["skipped_count"]) == (1, 1)
    buffered = row["buffered_instant"]
    assert buffered is not None and row["next_fire_at"] <= row["next_instant"]
    first = scheduled_runs(sql)[0]
    assert await _fire(engine.pool) == 0  # still unfinished (no worker yet)
    async with engine.running():
        await engine.wait(first["run_id"])

        async def second() -> list[dict] | None:
            runs = scheduled_runs(sql)
            return runs if len(runs) == 2 else None

        runs = await eventually(second, timeout=20, what="the buffered firing's run")
    assert instants(runs)[1] == sched.iso(buffered)
    assert schedule_row(sql)["buffered_instant"] is None


async def test_two_sweepers_start_each_firing_once(
    settings: Settings, engine: Engine, sql: psycopg.Connection
) -> None:
    """Two Sweeper objects on two pools tick at the same time (no election between them):
    every firing starts exactly one run, and none is even attempted twice."""
    await engine.publish(flow(rule=every_2s(), zone="UTC", overlap="allow", catch_up="all"))
    pools = [make_pool(settings.database_url or "", max_size=4) for _ in range(2)]
    stop = asyncio.Event()

    async def tick(sweeper: Sweeper) -> None:
        while not stop.is_set():
            await sweeper.tick()
            await asyncio.sleep(0.05)

    for pool in pools:
        await pool.open(wait=True)
    try:
        sweepers = [Sweeper(pool, worker_id=f"sweeper-{i}") for i, pool in enumerate(pools)]
        tasks = [asyncio.create_task(tick(s)) for s in sweepers]

        async def four() -> list[dict] | None:
            runs = scheduled_runs(sql)
            return runs if len(runs) >= 4 else None

        await eventually(four, timeout=30, what="four firings")
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        for pool in pools:
            await pool.close()
    runs = scheduled_runs(sql)
    keys = [r["start_key"] for r in runs]
    assert len(keys) == len(set(keys))
    firing_times = [datetime.fromisoformat(i) for i in instants(runs)]
    assert all(b - a == timedelta(seconds=2) for a, b in itertools.pairwise(firing_times))
    assert all(history(sql, r["run_id"], "start_duplicate") == [] for r in runs)
    assert sum(s.stats.scheduled for s in sweepers) == len(runs)


async def test_pause_resume_and_trigger_from_the_library(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(flow(rule=hourly(), zone="UTC", input={"k": 1}))
    listed = await engine.schedules()
    assert [(s["automation_id"], s["schedule_id"]) for s in listed] == [("ticker", "every")]
    future = listed[0]["next_instant"]

    paused = await engine.pause_schedule("ticker", "every")
    assert paused["paused"] and paused["paused_at"] is not None
    sql.execute(
        "UPDATE schedules SET next_instant = next_instant - interval '2 hours', "
        "next_fire_at = next_instant - interval '2 hours'"
    )
    assert await _fire(engine.pool) == 0  # paused: nothing fires although it is due

    # resume replays nothing: the next firing is the next future instant
    resumed = await engine.resume_schedule("ticker", "every")
    assert not resumed["paused"] and resumed["next_instant"] == future
    assert await _fire(engine.pool) == 0

    # resume with catch-up: the paused period's firings are missed; catch-up latest runs one
    await engine.pause_schedule("ticker", "every")
    sql.execute(
        "UPDATE schedules SET next_instant = next_instant - interval '2 hours', "
        "next_fire_at = next_instant - interval '2 hours'"
    )
    await engine.resume_schedule("ticker", "every", catch_up=True)
    assert await _fire(engine.pool) == 1
    assert instants(scheduled_runs(sql)) == [sched.iso(future - timedelta(hours=1))]

    # trigger: overlap skip, and that run is unfinished -> skipped
    skipped = await engine.trigger_schedule("ticker", "every")
    assert skipped.outcome == "skipped" and skipped.run_id == scheduled_runs(sql)[0]["run_id"]
    async with engine.running():
        await engine.wait(skipped.run_id or "")
    triggered = await engine.trigger_schedule("ticker", "every", key="press-1")
    assert triggered.outcome == "started"
    assert triggered.start_key == "ticker:schedule:every:trigger:press-1"
    again = await engine.trigger_schedule("ticker", "every", key="press-1")
    assert (again.outcome, again.run_id) == ("duplicate", triggered.run_id)
    run = sql.execute("SELECT input FROM runs WHERE run_id = %s", (triggered.run_id,)).fetchone()
    assert run["input"]["k"] == 1 and run["input"]["schedule"]["trigger"] is True

    with pytest.raises(UnknownSchedule):
        await engine.pause_schedule("ticker", "nope")
    with pytest.raises(UnknownSchedule):
        await engine.trigger_schedule("nope", "every")
