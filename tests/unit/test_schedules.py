"""What the sweep fires for a due schedule (``onward.schedules.plan``), without a database:
the on-time firing, the catch-up policies after a downtime (a week of per-minute firings
included, in bounded work), jitter that moves the fire time but never the identity, the
bounds, and a schedule's timing read from a document (zone fallback, local bounds through the
calendar's DST policy)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from onward.automations.document import AutomationDoc
from onward.schedules import MAX_CATCH_UP, ON_TIME_S, Timing, check, iso, plan, timing

H = timedelta(hours=1)
T0 = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)  # a Monday, 10:00 UTC


def doc(**schedule: Any) -> AutomationDoc:
    return AutomationDoc.model_validate(
        {
            "id": "a",
            "timezone": schedule.pop("timezone", None),
            "steps": [{"id": "s", "kind": "set"}],
            "schedules": [{"id": "every", **schedule}],
        }
    )


def hourly(**extra: Any) -> Timing:
    d = doc(rule="cron 0 * * * *", zone="UTC", **extra)
    assert d.schedules is not None
    return timing(d, d.schedules[0])


def test_a_schedule_not_yet_due_fires_nothing() -> None:
    t = hourly()
    p = plan(t, T0 + H, "latest", T0)
    assert (p.fire, p.missed, p.next_instant, p.next_fire_at) == ((), 0, T0 + H, T0 + H)
    assert plan(t, None, "all", T0).fire == ()


@pytest.mark.parametrize("policy", ["skip", "latest", "all"])
def test_the_on_time_firing_fires_under_every_policy(policy: str) -> None:
    p = plan(hourly(), T0, policy, T0 + timedelta(seconds=ON_TIME_S))
    assert (p.fire, p.missed, p.next_instant) == ((T0,), 0, T0 + H)


@pytest.mark.parametrize(
    ("policy", "fired", "missed"),
    [("skip", [], 3), ("latest", [T0 + 2 * H], 2), ("all", [T0, T0 + H, T0 + 2 * H], 0)],
)
def test_catch_up_after_three_missed_firings(
    policy: str, fired: list[datetime], missed: int
) -> None:
    now = T0 + 2 * H + timedelta(minutes=30)
    p = plan(hourly(), T0, policy, now)
    assert (list(p.fire), p.missed, p.newest, p.next_instant) == (
        fired,
        missed,
        T0 + 2 * H,
        T0 + 3 * H,
    )


def test_one_firing_reached_too_late_is_missed() -> None:
    late = T0 + timedelta(seconds=ON_TIME_S + 1)
    assert plan(hourly(), T0, "skip", late).fire == ()
    assert plan(hourly(), T0, "latest", late).fire == (T0,)


def test_a_week_down_costs_a_bounded_walk_and_keeps_the_newest() -> None:
    d = doc(rule="cron * * * * *", zone="UTC")
    assert d.schedules is not None
    t = timing(d, d.schedules[0])
    now = T0 + timedelta(days=7, seconds=30)
    began = time.perf_counter()
    every = plan(t, T0, "all", now)
    latest = plan(t, T0, "latest", now)
    skip = plan(t, T0, "skip", now)
    assert time.perf_counter() - began < 10  # ~10,000 firings were due; a few hundred walked
    newest = T0 + timedelta(days=7)
    assert len(every.fire) == MAX_CATCH_UP
    assert every.fire[-1] == newest and every.fire[0] == newest - timedelta(minutes=99)
    assert latest.fire == (newest,)
    assert skip.fire == () and skip.missed > 0
    assert (
        every.next_instant
        == latest.next_instant
        == skip.next_instant
        == newest + timedelta(minutes=1)
    )


def test_jitter_moves_the_fire_time_never_the_identity() -> None:
    t = hourly(jitter="10m")
    offsets = [(t.fire_at(T0 + n * H) - (T0 + n * H)).total_seconds() for n in range(24)]
    assert all(0 <= o < 600 for o in offsets) and len(set(offsets)) > 1
    assert t.fire_at(T0) == hourly(jitter="10m").fire_at(T0)  # deterministic
    before = plan(t, T0, "latest", T0 + timedelta(seconds=offsets[0] / 2))
    if offsets[0] > 0:
        assert before.fire == () and before.next_fire_at == t.fire_at(T0)
    at = plan(t, T0, "latest", t.fire_at(T0))
    assert at.fire == (T0,)  # the instant, not the fire time: the start key's identity
    assert iso(T0) == "2026-12-07T10:00:00Z"


def test_bounds_start_and_end() -> None:
    t = hourly(start="2026-12-07T12:00:00Z", end="2026-12-07T14:00:00Z")
    assert t.after(T0) == T0 + 2 * H  # the start itself is an instant
    assert t.after(T0 + 3 * H) == T0 + 4 * H
    assert t.after(T0 + 4 * H) is None
    p = plan(t, T0 + 4 * H, "latest", T0 + 4 * H)
    assert p.fire == (T0 + 4 * H,) and p.next_instant is None and p.next_fire_at is None


def test_timing_reads_the_zone_fallback_and_local_bounds() -> None:
    d = doc(rule="09:00 every day", timezone="Europe/Berlin", start="2026-03-29T02:30")
    assert d.schedules is not None
    t = timing(d, d.schedules[0])
    assert t.zone_name == "Europe/Berlin"
    # 02:30 does not exist that night: the calendar's DST policy moves it to 03:30 CEST
    assert t.start_at == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    assert t.after(datetime(2026, 3, 1, tzinfo=UTC)) == datetime(2026, 3, 29, 7, 0, tzinfo=UTC)


def test_check_names_every_problem() -> None:
    d = doc(rule="whenever", zone="UTC", jitter="8d", input={"schedule": 1})
    problems = check(d)
    assert "schedule every: rule:" in problems[0]
    assert any("input.schedule" in p for p in problems)
    assert check(doc(rule="09:00 every day", zone="UTC", jitter="8d")) == [
        "schedule every: jitter: at most 7 days"
    ]
    assert check(doc(rule="09:00 every day")) == [
        "schedule every: zone: none given, and the automation has no timezone"
    ]
    huge = doc(rule="09:00 every day", zone="Asia/Tokyo", start="0001-01-01T00:00")
    assert check(huge) == ["schedule every: start/end: out of range"]
