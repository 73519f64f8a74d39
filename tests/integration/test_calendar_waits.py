"""Calendar waits end to end (R6, R8): ``wait_until`` stores its intent beside the UTC instant,
reads the zone from the run's data (parking the run on a zone that is not one), spreads the
Monday 09:00 deterministically, refuses bad literals at publish time, and recomputing a pending
timer moves its run to the new instant while the old wake does nothing."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import psycopg
import pytest

from onward import Automation, InvalidAutomation, timers
from onward.api import ApiServer, create_app
from onward.calendar import next_occurrence, parse_rule, spread_offset, zone
from onward.engine import Engine
from onward.testing import api_key, auth, eventually, history

BERLIN = zone("Europe/Berlin")


def db_now(sql: psycopg.Connection) -> datetime:
    row = sql.execute("SELECT now() AS t").fetchone()
    assert row is not None
    now: datetime = row["t"]
    return now


def at_rule(instant: datetime, tz: str) -> str:
    """A one-off rule for the wall time ``instant`` has in zone ``tz``."""
    wall = instant.astimezone(zone(tz)).replace(tzinfo=None, microsecond=0)
    return f"at {wall.isoformat()}"


def flow(automation_id: str, **wait: Any) -> dict[str, Any]:
    timezone = wait.pop("timezone", None)
    doc = (
        Automation(automation_id)
        .step("wait", "wait_until", **wait)
        .step("after", "set", values={"done": "true"})
        .build()
    )
    if timezone is not None:
        doc["timezone"] = timezone
    return doc


def timer_of(sql: psycopg.Connection, run_id: str) -> dict[str, Any]:
    (row,) = sql.execute(
        "SELECT timer_id, due_at, wake_n, intent, fired_at, fired_by FROM timers WHERE run_id = %s",
        (run_id,),
    ).fetchall()
    return row


async def test_a_calendar_wait_stores_its_intent_with_the_instant_and_wakes_then(
    engine: Engine, sql: psycopg.Connection
) -> None:
    when = db_now(sql) + timedelta(seconds=2)
    rule = at_rule(when, "Europe/Berlin")
    await engine.publish(flow("cal", rule=rule, zone="Europe/Berlin", spread="off"))
    run_id = (await engine.start("cal", {}, event_id="c1")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    timer = timer_of(sql, run_id)
    expected = when.replace(microsecond=0)
    assert timer["due_at"] == expected
    intent = timer["intent"]
    assert (intent["rule"], intent["zone"], intent["zone_source"]) == (
        rule,
        "Europe/Berlin",
        "step",
    )
    assert intent["utc"] == expected.isoformat() and intent["substitution"] is None
    assert timer["fired_at"] >= timer["due_at"]
    (waiting,) = history(sql, run_id, "step_waiting")
    assert waiting["detail"]["intent"]["rule"] == rule
    assert datetime.fromisoformat(waiting["detail"]["due_at"]) == expected


async def test_the_zone_comes_from_the_run_data_with_fallbacks(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(
        flow(
            "tz",
            rule="09:00 on weekdays",
            zone_from="input.contact.tz",
            fallback_zone="America/New_York",
            timezone="Europe/Berlin",
        )
    )
    kathmandu = (await engine.start("tz", {"contact": {"tz": "Asia/Kathmandu"}})).run_id
    missing = (await engine.start("tz", {"contact": {}})).run_id
    bad = (await engine.start("tz", {"contact": {"tz": "Mars/Olympus_Mons"}})).run_id
    async with engine.running():
        assert await engine.wait(bad, timeout=30) == "parked"

        async def both_waiting() -> bool:
            return [await engine.status(r) for r in (kathmandu, missing)] == ["waiting"] * 2

        await eventually(both_waiting, what="both runs waiting")
    k, m = timer_of(sql, kathmandu)["intent"], timer_of(sql, missing)["intent"]
    assert (k["zone"], k["zone_source"], k["zone_from"]) == (
        "Asia/Kathmandu",
        "data",
        "input.contact.tz",
    )
    assert (m["zone"], m["zone_source"]) == ("America/New_York", "fallback")
    assert datetime.fromisoformat(k["local"]).strftime("%H:%M") == "09:00"
    run = sql.execute("SELECT status_reason FROM runs WHERE run_id = %s", (bad,)).fetchone()
    assert (
        run is not None
        and "'Mars/Olympus_Mons' from input.contact.tz is not a time zone" in (run["status_reason"])
    )


async def test_the_monday_spread_is_the_run_ids_offset(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(flow("spread", rule="09:00 on weekdays", zone="Europe/Berlin"))
    run_ids = [(await engine.start("spread", {"i": i})).run_id for i in range(5)]
    async with engine.running():

        async def all_waiting() -> bool:
            return [await engine.status(r) for r in run_ids] == ["waiting"] * len(run_ids)

        await eventually(all_waiting, what="every run waiting")
    for run_id in run_ids:
        timer = timer_of(sql, run_id)
        intent = timer["intent"]
        occ = next_occurrence(
            parse_rule("09:00 on weekdays"), BERLIN, datetime.fromisoformat(intent["after"])
        )
        assert occ is not None and intent["utc"] == occ.utc.isoformat()
        offset = spread_offset(run_id, 600)
        assert intent["offset_s"] == offset and intent["spread_s"] == 600
        assert timer["due_at"] == occ.utc + timedelta(seconds=offset)
        assert timer["due_at"].astimezone(BERLIN).weekday() < 5


@pytest.mark.parametrize(
    ("wait", "needle"),
    [
        ({"rule": "09:00 on weekdays", "zone": "Mars/Olympus_Mons"}, "unknown time zone"),
        ({"rule": "whenever", "zone": "Europe/Berlin"}, "is not a rule"),
        ({"rule": "09:00 on weekdays"}, "no time zone"),
        ({"rule": "09:00 on weekdays", "timezone": "Atlantis/Capital"}, "timezone: unknown"),
        ({"rule": "09:00 on weekdays", "zone_from": "input.(", "zone": None}, "zone_from"),
        ({"rule": "09:00 on weekdays", "zone": "UTC", "spread": "soon"}, "spread"),
    ],
)
async def test_bad_literals_are_refused_at_publish(
    engine: Engine, sql: psycopg.Connection, wait: dict[str, Any], needle: str
) -> None:
    wait = {k: v for k, v in wait.items() if v is not None}
    with pytest.raises(InvalidAutomation, match=needle):
        await engine.publish(flow("bad", **wait))
    assert sql.execute("SELECT count(*) AS n FROM automation_versions").fetchone() == {"n": 0}


async def test_recompute_moves_a_pending_timer_and_the_old_wake_does_nothing(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """The contact moves from Berlin to Kathmandu while the run waits: its timer moves to the
    same wall time in the new zone (here a few seconds away), the run wakes then, the wake of
    the old instant fires nothing, and the history shows the move."""
    soon_in_kathmandu = db_now(sql) + timedelta(seconds=3)
    rule = at_rule(soon_in_kathmandu, "Asia/Kathmandu")
    await engine.publish(flow("moving", rule=rule, zone_from="input.tz", spread="off"))
    run_id = (await engine.start("moving", {"tz": "Europe/Berlin"}, contact_id="maya")).run_id
    async with engine.running():

        async def waiting() -> bool:
            return await engine.status(run_id) == "waiting"

        await eventually(waiting, what="the run waiting in Berlin")
        before = timer_of(sql, run_id)
        assert before["due_at"] - soon_in_kathmandu > timedelta(hours=4)  # Berlin is 4h45 behind
        done = await engine.recompute_timers(contact_id="maya", zone="Asia/Kathmandu")
        assert (done.examined, done.moved) == (1, 1)
        after = timer_of(sql, run_id)
        assert after["wake_n"] == before["wake_n"] + 1
        assert after["due_at"] == soon_in_kathmandu.replace(microsecond=0)
        assert after["intent"]["zone"] == "Asia/Kathmandu"
        assert after["intent"]["zone_source"] == "recompute"
        # the wake for the old instant (its wake number) fires nothing
        async with engine.pool.connection() as conn:
            stale = await timers.fire(
                conn, [("test", before["timer_id"], before["wake_n"])], by="wake"
            )
        assert stale == []
        assert await engine.wait(run_id, timeout=30) == "completed"
    (moved,) = history(sql, run_id, "timer_moved")
    assert datetime.fromisoformat(moved["detail"]["from"]) == before["due_at"]
    assert datetime.fromisoformat(moved["detail"]["to"]) == after["due_at"]
    assert moved["detail"]["wake_n"] == after["wake_n"]
    assert "zone Asia/Kathmandu changed" in moved["detail"]["reason"]
    (fired,) = history(sql, run_id, "timer_fired")
    assert datetime.fromisoformat(fired["detail"]["due_at"]) == after["due_at"]
    # recomputing again with the same inputs moves nothing (stable)
    again = await engine.recompute_timers(run_id=run_id, zone="Asia/Kathmandu")
    assert (again.examined, again.moved) == (0, 0)  # it fired: no longer pending


async def test_recompute_with_unchanged_inputs_is_stable(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(flow("stable", rule="09:00 on weekdays", zone="Europe/Berlin"))
    run_ids = [(await engine.start("stable", {"i": i})).run_id for i in range(3)]
    async with engine.running():

        async def all_waiting() -> bool:
            return [await engine.status(r) for r in run_ids] == ["waiting"] * len(run_ids)

        await eventually(all_waiting, what="every run waiting")
    before = {r: timer_of(sql, r) for r in run_ids}
    done = await engine.recompute_timers(every_organisation=True)
    assert (done.examined, done.moved, done.unchanged) == (3, 0, 3)
    assert {r: timer_of(sql, r) for r in run_ids} == before
    rule_change = await engine.recompute_timers(automation_id="stable", rule="10:00 on weekdays")
    assert rule_change.moved == 3
    berlin = ZoneInfo("Europe/Berlin")
    for r in run_ids:
        # the next 10:00 on a weekday with the same spread offset as its 09:00 had: an hour
        # later on the same day, unless the test runs between 09:00 and 10:00 in Berlin (then
        # the 09:00 was tomorrow's and the 10:00 is today's)
        was = before[r]["due_at"].astimezone(berlin)
        now = timer_of(sql, r)["due_at"].astimezone(berlin)
        nine = was.replace(hour=9, minute=0, second=0, microsecond=0)
        ten = now.replace(hour=10, minute=0, second=0, microsecond=0)
        assert now.weekday() < 5 and now - ten == was - nine, (was, now)


async def test_preview_and_recompute_over_http(engine: Engine, sql: psycopg.Connection) -> None:
    await engine.publish(flow("web", rule="09:00 on weekdays", zone="Europe/Berlin"))
    run_id = (await engine.start("web", {}, contact_id="sam")).run_id
    async with engine.running():

        async def waiting() -> bool:
            return await engine.status(run_id) == "waiting"

        await eventually(waiting, what="the run waiting")
    headers = auth(await api_key(engine))
    async with (
        ApiServer(create_app(engine)) as api,
        httpx.AsyncClient(base_url=api.url, headers=headers) as http,
    ):
        answer = await http.get(
            "/v1/timers/preview",
            params={
                "rule": "02:30 every day",
                "zone": "Europe/Berlin",
                "after": "2026-03-28T12:00:00Z",
                "count": 2,
            },
        )
        assert answer.status_code == 200, answer.text
        first = answer.json()[0]
        assert (first["utc"], first["substitution"]) == ("2026-03-29T01:30:00+00:00", "gap")
        bad = await http.get("/v1/timers/preview", params={"rule": "09:00 daily", "zone": "Mars/X"})
        assert bad.status_code == 422 and "unknown time zone" in bad.json()["detail"]
        moved = await http.post(
            "/v1/timers/recompute", json={"contact_id": "sam", "zone": "America/New_York"}
        )
        assert moved.status_code == 200, moved.text
        assert moved.json()["moved"] == 1 and moved.json()["sample"][0]["run_id"] == run_id
        vague = await http.post("/v1/timers/recompute", json={"zone": "UTC"})
        assert vague.status_code == 422 and "say which timers" in vague.json()["detail"]
    assert timer_of(sql, run_id)["intent"]["zone"] == "America/New_York"
