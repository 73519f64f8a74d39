"""Human time (R6, R8), as properties (hypothesis): for any instant, zone and rule, the next
occurrence is after the reference instant, lands on the rule's wall time or the documented DST
substitute, skips no occurrence, and is stable under recomputation; spread offsets are
deterministic and in bounds.

The oracle is independent of :mod:`onward.calendar`: candidate wall times are enumerated day by
day from the rule's fields, and each is turned into an instant by looking at the zone's UTC
offsets only (which instants show that wall time; where none does, the offsets just before and
just after the transition give the gap). No calendar library, no ``fold``.

Deterministic in CI: every test runs with ``derandomize=True`` and no example database, so a
run draws the same examples each time (for one hypothesis version and one tzdata).
"""

from __future__ import annotations

import calendar as stdlib_calendar
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from functools import cache
from zoneinfo import ZoneInfo, available_timezones

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from onward.calendar import (
    MAX_SHIFT,
    Occurrence,
    next_occurrence,
    occurrences,
    parse_rule,
    plan,
    spread_offset,
    zone,
)
from onward.durations import MAX_SECONDS

# The calendar cases load a zone from tzdata and scan its transitions the first time it is
# drawn (a few ms, once per zone), and the oracle enumerates up to two months of days: the
# time of one example depends on what was drawn before it, so a deadline would only measure
# the cache. Examples are bounded by max_examples instead; the whole file runs in seconds.
CALENDAR = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
SPREAD = settings(max_examples=1000, derandomize=True, database=None)

#: Zones with odd cases: half-hour and quarter-hour offsets, a 30-minute DST shift (Lord Howe),
#: a 02:45 shift (Chatham), Newfoundland, Samoa (DST until 2021), Morocco (DST suspended each
#: Ramadan), Casey (3-hour jumps, as long as MAX_SHIFT), Troll (a 2-hour shift), Dublin
#: (negative DST in winter), Santiago and Nuuk (rules changed in the 2020s), Tehran (DST
#: abolished in 2022).
ODD_ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Adelaide",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "Pacific/Chatham",
    "America/St_Johns",
    "Pacific/Apia",
    "Africa/Casablanca",
    "UTC",
    "Antarctica/Casey",
    "Antarctica/Troll",
    "Europe/Dublin",
    "America/Santiago",
    "America/Nuuk",
    "Asia/Tehran",
]
ALL_ZONES = sorted(available_timezones())

START = datetime(2020, 1, 1, tzinfo=UTC)
END = datetime(2036, 1, 1, tzinfo=UTC)
DAY_NAMES = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


# -- the zone, seen through its UTC offsets only ------------------------------------------------


def offset_at(tz: ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(tz).utcoffset()
    assert offset is not None
    return offset


def wall_at(tz: ZoneInfo, instant: datetime) -> datetime:
    """The naive local wall time that ``instant`` shows in ``tz``."""
    return instant.astimezone(tz).replace(tzinfo=None)


def transition_in(tz: ZoneInfo, lo: datetime, hi: datetime) -> tuple[datetime, timedelta]:
    """The one offset change between ``lo`` and ``hi`` (the offsets there differ), by bisection
    on whole seconds (tzdata's transitions are): its instant, the first second of the new
    offset, and its size, the offset just after minus the offset just before."""
    second = timedelta(seconds=1)
    lo = lo.replace(microsecond=0)
    hi = hi.replace(microsecond=0) + (second if hi.microsecond else timedelta(0))
    before = offset_at(tz, lo)
    assert before != offset_at(tz, hi), f"no transition in {tz.key} between {lo} and {hi}"
    while hi - lo > second:
        mid = lo + (hi - lo) // 2
        mid = mid.replace(microsecond=0)
        if offset_at(tz, mid) == before:
            lo = mid
        else:
            hi = mid
    return hi, offset_at(tz, hi) - offset_at(tz, lo)


def instants_showing(tz: ZoneInfo, wall: datetime) -> list[datetime]:
    """Every instant whose local wall time in ``tz`` is ``wall``, ascending: one normally, two
    in a fold, none in a gap. Candidates are ``wall`` minus each offset the zone uses within a
    day and a bit of it (no zone changes offset twice within that, 2020-2035)."""
    near = wall.replace(tzinfo=UTC)  # within 14 h of the real instants
    offsets = {offset_at(tz, near + timedelta(hours=h)) for h in range(-30, 31, 3)}
    showing = {(wall - o).replace(tzinfo=UTC) for o in offsets}
    return sorted(u for u in showing if wall_at(tz, u) == wall)


@dataclass(frozen=True)
class Expected:
    """What the documented DST policy makes of one wall time."""

    utc: datetime
    substitution: str | None


def policy(tz: ZoneInfo, wall: datetime) -> Expected:
    """The documented policy, from offsets alone: a wall time that happens twice is the first;
    one that does not exist is moved forward by the length of the gap it falls in."""
    showing = instants_showing(tz, wall)
    if showing:
        return Expected(showing[0], "fold" if len(showing) > 1 else None)
    near = wall.replace(tzinfo=UTC)
    _, gap = transition_in(tz, near - timedelta(hours=30), near + timedelta(hours=30))
    assert gap > timedelta(0), f"{wall} does not exist in {tz.key} yet no clock jumps forward"
    moved = wall + gap  # the wall time moved forward by the gap: it exists, after the jump
    (utc,) = instants_showing(tz, moved)
    return Expected(utc, "gap")


@cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    """The instants in 2020-2035 at which ``zone_name`` changes its UTC offset."""
    tz = ZoneInfo(zone_name)
    found = []
    day = START - timedelta(days=1)
    previous = offset_at(tz, day)
    while day < END:
        following = day + timedelta(days=1)
        offset = offset_at(tz, following)
        if offset != previous:
            found.append(transition_in(tz, day, following)[0])
        previous, day = offset, following
    return tuple(found)


# -- rules and cases --------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A rule (``source``), what it asks for (any of ``hours`` at any of ``minutes``, at
    ``second``, on the days ``days`` of kind ``kind``; or the one local date-time ``at``), a
    zone and a reference instant."""

    zone: str
    after: datetime
    source: str
    kind: str  # daily, weekdays, weekends, monthdays, last, weekly, at
    hours: tuple[int, ...] = (0,)
    minutes: tuple[int, ...] = (0,)
    second: int = 0
    days: tuple[int, ...] = ()  # days of the month (monthdays) or weekdays, Monday 0 (weekly)
    at: datetime | None = field(default=None)

    def day_ok(self, day: date) -> bool:
        if self.kind == "daily":
            return True
        if self.kind == "weekdays":
            return day.weekday() < 5
        if self.kind == "weekends":
            return day.weekday() >= 5
        if self.kind == "monthdays":
            return day.day in self.days
        if self.kind == "last":
            return day.day == stdlib_calendar.monthrange(day.year, day.month)[1]
        if self.kind == "weekly":
            return day.weekday() in self.days
        raise AssertionError(self.kind)

    def is_rule_wall(self, wall: datetime) -> bool:
        """``wall`` is a wall time the rule yields: its time fields and its day match."""
        if self.at is not None:
            return wall == self.at
        return (
            wall.hour in self.hours
            and wall.minute in self.minutes
            and (wall.second, wall.microsecond) == (self.second, 0)
            and self.day_ok(wall.date())
        )

    def walls(self, first: date, last: date) -> list[datetime]:
        """The rule's wall times on the local days ``first`` to ``last``, by brute force."""
        if self.at is not None:
            return [self.at]
        out: list[datetime] = []
        day = first
        while day <= last:
            if self.day_ok(day):
                out.extend(
                    datetime(day.year, day.month, day.day, h, m, self.second)
                    for h in sorted(self.hours)
                    for m in sorted(self.minutes)
                )
            day += timedelta(days=1)
        return out


# Times of day that hit the DST windows often: hours 0-3 half the time, the quarter hours
# (Chatham 02:45, Lord Howe 02:00-02:30, Kathmandu) half the time.
hours = st.one_of(st.integers(0, 3), st.integers(0, 23))
minutes = st.one_of(st.sampled_from([0, 15, 30, 45]), st.integers(0, 59))
zones = st.one_of(st.sampled_from(ODD_ZONES), st.sampled_from(ALL_ZONES))


@st.composite
def instants(draw: st.DrawFn, zone_name: str) -> datetime:
    """An aware instant in 2020-2035: half the time within hours (or days) of one of the zone's
    transitions; written in UTC, in the zone itself or at some fixed offset."""
    found = transitions(zone_name)
    if len(found) > 0 and draw(st.booleans()):
        at = draw(st.sampled_from(found))
        shift = draw(
            st.one_of(st.integers(-6 * 3600, 6 * 3600), st.integers(-3 * 86400, 3 * 86400))
        )
        instant = at + timedelta(seconds=shift)
    else:
        span = int((END - START).total_seconds())
        instant = START + timedelta(seconds=draw(st.integers(0, span)))
    instant += timedelta(microseconds=draw(st.one_of(st.just(0), st.integers(0, 999_999))))
    written_in: tzinfo = draw(
        st.sampled_from(
            [UTC, ZoneInfo(zone_name), timezone(timedelta(hours=-7)), timezone(timedelta(hours=13))]
        )
    )
    return instant.astimezone(written_in)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A zone, a reference instant and a rule of one of the supported forms. Three times in
    four the case aims at one of the zone's transitions (if it has any in 2020-2035): the
    rule's time of day is inside the gap or the fold, or a little either side, and the
    reference is mostly the day before the jump (else up to three days before, or just after).
    Otherwise the reference is any instant (see :func:`instants`) and the time of day is
    mostly between 00:00 and 03:59."""
    zone_name = draw(zones)
    tz = ZoneInfo(zone_name)
    found = transitions(zone_name)
    aim: datetime | None = None
    if len(found) > 0 and (draw(st.booleans()) or draw(st.booleans())):
        jump = draw(st.sampled_from(found))
        size = offset_at(tz, jump) - offset_at(tz, jump - timedelta(seconds=1))
        span = max(abs(size) // timedelta(minutes=1), 1)
        # from the wall clock just before the jump: into the gap (forward) or the fold (back)
        # half the time, else anywhere from 75 minutes earlier to 135 minutes later
        if draw(st.booleans()):
            shift = draw(
                st.integers(0, span - 1) if size > timedelta(0) else st.integers(-span, -1)
            )
        else:
            shift = draw(st.integers(-75, 135))
        aim = wall_at(tz, jump - timedelta(seconds=1)) + timedelta(seconds=1)
        aim += timedelta(minutes=shift)
        # the reference: mostly the day before the jump, else up to 3 days before or inside it
        if draw(st.booleans()):
            before = draw(st.integers(3 * 3600, 86400))
        else:
            before = draw(st.one_of(st.integers(0, 3 * 86400), st.integers(-3 * 3600, 0)))
        after = (jump - timedelta(seconds=before)).astimezone(
            draw(st.sampled_from([UTC, tz, timezone(timedelta(hours=-7))]))
        )
        h, m = aim.hour, aim.minute
    else:
        after = draw(instants(zone_name))
        h, m = draw(hours), draw(minutes)
    form = draw(
        st.sampled_from(
            [
                "every day",
                "every day with seconds",
                "weekdays",
                "weekends",
                "day N",
                "last day",
                "named days",
                "cron daily",
                "cron weekdays",
                "cron sundays",
                "cron lists",
                "cron steps",
                "rrule daily",
                "rrule sundays",
                "at",
            ]
        )
    )
    hm = f"{h:02d}:{m:02d}"
    case = Case(zone_name, after, f"{hm} every day", "daily", (h,), (m,))
    if form == "every day":
        return case
    if form == "every day with seconds":
        s = draw(st.integers(0, 59))
        return replace(case, source=f"{hm}:{s:02d} every day", second=s)
    if form == "weekdays":
        return replace(case, source=f"{hm} on weekdays", kind="weekdays")
    if form == "weekends":
        return replace(case, source=f"{hm} on weekends", kind="weekends")
    if form == "day N":
        days = draw(st.lists(st.integers(1, 31), min_size=1, max_size=3, unique=True))
        source = f"{hm} on day {','.join(map(str, days))}"
        return replace(case, source=source, kind="monthdays", days=tuple(days))
    if form == "last day":
        return replace(case, source=f"{hm} on the last day", kind="last")
    if form == "named days":
        named = draw(st.lists(st.integers(0, 6), min_size=1, max_size=7, unique=True))
        source = f"{hm} on {','.join(DAY_NAMES[d] for d in named)}"
        return replace(case, source=source, kind="weekly", days=tuple(named))
    if form == "cron daily":
        return replace(case, source=f"cron {m} {h} * * *")
    if form == "cron weekdays":
        return replace(case, source=f"cron {m} {h} * * 1-5", kind="weekdays")
    if form == "cron sundays":
        return replace(case, source=f"cron {m} {h} * * 0", kind="weekly", days=(6,))
    if form == "cron lists":
        hs = sorted({h, *draw(st.lists(hours, max_size=2))})
        ms = sorted({m, *draw(st.lists(minutes, max_size=2))})
        source = f"cron {','.join(map(str, ms))} {','.join(map(str, hs))} * * *"
        return replace(case, source=source, hours=tuple(hs), minutes=tuple(ms))
    if form == "cron steps":
        step = draw(st.sampled_from([15, 20, 30]))
        source = f"cron */{step} * * * *"
        return replace(
            case, source=source, hours=tuple(range(24)), minutes=tuple(range(0, 60, step))
        )
    if form == "rrule daily":
        prefix = draw(st.sampled_from(["RRULE:", ""]))
        return replace(case, source=f"{prefix}FREQ=DAILY;BYHOUR={h};BYMINUTE={m};BYSECOND=0")
    if form == "rrule sundays":
        source = f"RRULE:FREQ=WEEKLY;BYDAY=SU;BYHOUR={h};BYMINUTE={m};BYSECOND=0"
        return replace(case, source=source, kind="weekly", days=(6,))
    # at: the aimed wall time, or a local date-time a few days either side of the reference
    move = 0 if aim is not None and draw(st.booleans()) else draw(st.integers(-2, 3))
    local_day = (aim or wall_at(tz, after)).date() + timedelta(days=move)
    at = datetime(local_day.year, local_day.month, local_day.day, h, m)
    return replace(case, source=f"at {at.isoformat()}", kind="at", at=at)


def _known(zone_name: str, after: datetime, source: str, h: int, m: int) -> Case:
    return Case(zone_name, after, source, "daily", (h,), (m,))


# The documented examples and the longest jumps, so a gap and a fold are always tried.
KNOWN = [
    _known("Europe/Berlin", datetime(2026, 3, 28, 12, tzinfo=UTC), "02:30 every day", 2, 30),
    _known("Europe/Berlin", datetime(2026, 10, 24, 12, tzinfo=UTC), "02:30 every day", 2, 30),
    _known("Australia/Lord_Howe", datetime(2026, 10, 3, 12, tzinfo=UTC), "02:15 every day", 2, 15),
    _known("Australia/Lord_Howe", datetime(2026, 4, 4, 6, tzinfo=UTC), "cron 45 1 * * *", 1, 45),
    _known("Pacific/Chatham", datetime(2026, 9, 26, 0, tzinfo=UTC), "03:00 every day", 3, 0),
    _known("Antarctica/Casey", datetime(2020, 10, 3, 18, 30, tzinfo=UTC), "02:59 every day", 2, 59),
    # Casey jumps 00:01 -> 03:01 (+08 -> +11) at 16:01 UTC: a reference just after the jump,
    # a wall time just inside the gap, exactly MAX_SHIFT before the reference's wall clock
    Case(
        "Antarctica/Casey",
        datetime(2020, 10, 3, 16, 1, 30, tzinfo=UTC),
        "00:01:45 every day",
        "daily",
        (0,),
        (1,),
        45,
    ),
    Case(
        "Europe/Berlin",
        datetime(2026, 3, 29, 0, 10, tzinfo=UTC),
        "cron */30 * * * *",
        "daily",
        tuple(range(24)),
        (0, 30),
    ),
]


def with_known_examples(**more: object) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Each case of ``KNOWN`` as an explicit example (with ``more`` arguments), always run."""

    def add(test: Callable[..., None]) -> Callable[..., None]:
        for known in KNOWN:
            test = example(case=known, **more)(test)
        return test

    return add


def _next(case: Case) -> Occurrence | None:
    return next_occurrence(parse_rule(case.source), zone(case.zone), case.after)


def _oracle(case: Case, until: datetime) -> Expected | None:
    """The earliest instant after ``case.after`` that the rule's wall times become under the
    policy, among the local days from the day before the reference to the day after ``until``."""
    tz = ZoneInfo(case.zone)
    first = wall_at(tz, case.after).date() - timedelta(days=1)
    last = wall_at(tz, until).date() + timedelta(days=1)
    later = [
        e for e in (policy(tz, wall) for wall in case.walls(first, last)) if e.utc > case.after
    ]
    return min(later, key=lambda e: e.utc) if later else None


# -- (1) after the reference --------------------------------------------------------------------


@CALENDAR
@given(case=cases())
@with_known_examples()
def test_the_next_occurrence_is_after_the_reference(case: Case) -> None:
    """(1) Strictly after ``after``, in UTC; None only for an ``at`` that the policy puts at or
    before the reference."""
    occ = _next(case)
    if occ is None:
        assert case.at is not None, f"{case.source!r} has no occurrence after {case.after}"
        assert policy(ZoneInfo(case.zone), case.at).utc <= case.after
        event("an 'at' in the past")
        return
    assert occ.utc.utcoffset() == timedelta(0)
    assert occ.utc > case.after
    if case.at is None:  # a monthly rule is at most two months (and a gap) away
        assert occ.utc - case.after <= timedelta(days=62) + MAX_SHIFT


# -- (2) on the rule's wall time, or the documented substitute ----------------------------------


@CALENDAR
@given(case=cases())
@with_known_examples()
def test_the_next_occurrence_lands_on_the_rules_wall_time_or_the_dst_substitute(
    case: Case,
) -> None:
    """(2) ``wall`` is a wall time of the rule; ``local`` is what ``utc`` shows in the zone and
    equals ``wall`` unless the wall time does not exist (``gap``), where it is ``wall`` moved
    forward by exactly the gap (the offset just after minus the offset just before the
    transition, which lies less than one gap before ``utc``); ``fold``: the wall time happens
    twice and ``utc`` is the first; no substitution: it happens once, at ``utc``."""
    occ = _next(case)
    if occ is None:
        return
    tz = ZoneInfo(case.zone)
    assert case.is_rule_wall(occ.wall), f"{occ.wall} is not a wall time of {case.source!r}"
    assert occ.local.utcoffset() == offset_at(tz, occ.utc)
    assert occ.local.replace(tzinfo=None) == wall_at(tz, occ.utc)
    showing = instants_showing(tz, occ.wall)
    event(f"substitution: {occ.substitution}")
    if occ.substitution is None:
        assert showing == [occ.utc]
        assert occ.local.replace(tzinfo=None) == occ.wall
    elif occ.substitution == "fold":
        assert len(showing) == 2 and occ.utc == showing[0] < showing[1]
        assert occ.local.replace(tzinfo=None) == occ.wall
    else:
        assert occ.substitution == "gap", occ.substitution
        assert showing == [], f"{occ.wall} exists in {case.zone}, yet 'gap'"
        transition, gap = transition_in(tz, occ.utc - timedelta(hours=30), occ.utc)
        assert gap > timedelta(0)
        assert occ.local.replace(tzinfo=None) == occ.wall + gap
        assert transition <= occ.utc < transition + gap
    expected = policy(tz, occ.wall)
    assert (occ.utc, occ.substitution) == (expected.utc, expected.substitution)


# -- (3) no occurrence skipped ------------------------------------------------------------------


@CALENDAR
@given(case=cases(), fraction=st.floats(0, 1, exclude_max=True))
@with_known_examples(fraction=0.5)
def test_no_occurrence_lies_between_the_reference_and_the_next(case: Case, fraction: float) -> None:
    """(3) The brute-force oracle (every wall time of the rule, day by day, through the policy)
    finds nothing earlier; asking again from points between the reference and the result (a
    microsecond, a second, a minute, an hour, MAX_SHIFT before it; some fraction of the way)
    gives the same result."""
    occ = _next(case)
    expected = _oracle(case, occ.utc if occ is not None else case.after)
    if occ is None:
        assert expected is None, f"{case.source!r}: missed {expected}"
        return
    assert expected is not None
    assert occ.utc == expected.utc, f"{case.source!r}: {occ} but the policy gives {expected}"
    points = [
        occ.utc - timedelta(microseconds=1),
        occ.utc - timedelta(seconds=1),
        occ.utc - timedelta(minutes=1),
        occ.utc - timedelta(hours=1),
        occ.utc - MAX_SHIFT,
        # in UTC: wall-clock arithmetic on an aware datetime drops its fold, and the second
        # 02:00 of a fall-back night would become the first (an hour earlier than `after`)
        case.after.astimezone(UTC) + (occ.utc - case.after) * fraction,
    ]
    for point in points:
        if case.after <= point < occ.utc:
            again = next_occurrence(parse_rule(case.source), zone(case.zone), point)
            assert again == occ, f"from {point}: {again}; from {case.after}: {occ}"


@CALENDAR
@given(case=cases())
@with_known_examples()
def test_occurrences_are_strictly_increasing_without_duplicates(case: Case) -> None:
    """(3) ``occurrences``: the first is the next occurrence, each following one the next after
    the one before; instants strictly increasing, no instant and no wall time twice; each on a
    wall time of the rule."""
    rule, tz = parse_rule(case.source), zone(case.zone)
    got = occurrences(rule, tz, case.after, 6)
    first = next_occurrence(rule, tz, case.after)
    assert got[:1] == ([first] if first is not None else [])
    assert len(got) == (6 if case.at is None else len(got[:1]))
    utcs = [o.utc for o in got]
    assert all(a < b for a, b in itertools.pairwise(utcs))
    assert len({o.wall for o in got}) == len(got)
    assert all(case.is_rule_wall(o.wall) for o in got)
    for before, following in itertools.pairwise(got):
        assert next_occurrence(rule, tz, before.utc) == following


# -- (4) stable under recomputation -------------------------------------------------------------


@CALENDAR
@given(
    case=cases(),
    spread_s=st.one_of(st.just(0.0), st.just(600.0), st.floats(0.001, 7 * 86400)),
    key=st.text(max_size=40),
)
@with_known_examples(spread_s=600.0, key="run_0001")
def test_plan_is_stable_under_recomputation(case: Case, spread_s: float, key: str) -> None:
    """(4) ``plan`` twice with the same inputs gives the same instant and intent, and so does
    recomputing from the stored intent read back from JSON (as ``timers recompute`` does); the
    instant is the next occurrence plus the key's offset, within the spread."""
    first = plan(case.source, case.zone, case.after, spread_s=spread_s, key=key)
    assert plan(case.source, case.zone, case.after, spread_s=spread_s, key=key) == first
    occ = _next(case)
    if first is None:
        assert occ is None
        return
    assert occ is not None
    due, intent = first
    offset = (due - occ.utc).total_seconds()
    assert offset == spread_offset(key, spread_s) == intent["offset_s"]
    assert (offset == 0) if spread_s == 0 else (0 <= offset < spread_s)
    stored = json.loads(json.dumps(intent))
    assert stored == intent
    assert datetime.fromisoformat(stored["due_at"]) == due
    assert datetime.fromisoformat(stored["utc"]) == occ.utc
    again = plan(
        stored["rule"],
        stored["zone"],
        datetime.fromisoformat(stored["after"]),
        spread_s=float(stored["spread_s"]),
        key=key,
    )
    assert again == (due, stored)


# -- (5) spread offsets -------------------------------------------------------------------------


@SPREAD
@given(
    key=st.text(),
    spread_s=st.floats(min_value=0, max_value=MAX_SECONDS, exclude_min=True),
)
@example(key="run_0001", spread_s=600.0)
@example(key="run_0001", spread_s=0.0005)  # shorter than the offset's millisecond resolution
def test_spread_offset_is_deterministic_and_in_bounds(key: str, spread_s: float) -> None:
    """(5) For any key and any spread ``s > 0``: the same offset every time, in ``[0, s)``."""
    offset = spread_offset(key, spread_s)
    assert offset == spread_offset(key, spread_s)
    assert 0 <= offset < spread_s


@SPREAD
@given(key=st.text())
def test_no_spread_is_no_offset(key: str) -> None:
    """(5) ``s == 0``: the offset is 0 for every key."""
    assert spread_offset(key, 0) == 0.0
    assert spread_offset(key, 0.0) == 0.0


def test_spread_offsets_and_plans_are_the_same_in_another_process() -> None:
    """(5, 4) Deterministic across processes, not only within one: a timer is recomputed by
    another process (``onward timers recompute``), whose string hashing is seeded differently."""
    keys = [f"run_{i:04d}" for i in range(200)] + ["", "ü", "日本", "run id with spaces"]
    spreads = [0.0, 0.001, 1.0, 600.0, 86400.5]
    script = (
        "import json, sys\n"
        "from datetime import datetime\n"
        "from onward.calendar import plan, spread_offset\n"
        "keys, spreads, cases = json.load(sys.stdin)\n"
        "offsets = [[spread_offset(k, s) for s in spreads] for k in keys]\n"
        "plans = [plan(r, z, datetime.fromisoformat(a), spread_s=600.0, key=k)"
        " for r, z, a, k in cases]\n"
        "print(json.dumps([offsets, [[d.isoformat(), i] for d, i in plans]]))\n"
    )
    cases = [(c.source, c.zone, c.after.isoformat(), f"run_{i}") for i, c in enumerate(KNOWN)]
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps([keys, spreads, cases]),
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )
    offsets, plans = json.loads(done.stdout)
    assert offsets == [[spread_offset(k, s) for s in spreads] for k in keys]
    here = []
    for source, zone_name, after, key in cases:
        planned = plan(source, zone_name, datetime.fromisoformat(after), spread_s=600.0, key=key)
        assert planned is not None
        here.append([planned[0].isoformat(), json.loads(json.dumps(planned[1]))])
    assert plans == here


def test_asking_again_from_the_second_of_two_equal_wall_times_gives_the_same_next() -> None:
    """The example hypothesis found (a fall-back night in Berlin): from the *second* 02:00
    (01:00 UTC) a daily 02:59 has already fired its once (00:59 UTC), so the next is the next
    day's; the same instant written in UTC must give the same answer."""
    berlin = zone("Europe/Berlin")
    second = datetime(2020, 10, 25, 2, 0, fold=1, tzinfo=berlin)
    rule = parse_rule("02:59 every day")
    occ = next_occurrence(rule, berlin, second)
    assert occ is not None and occ.wall == datetime(2020, 10, 26, 2, 59)
    assert next_occurrence(rule, berlin, second.astimezone(UTC)) == occ
