"""Schedules that start runs (issue 10): what Temporal Schedules, DBOS scheduled workflows and
Hatchet crons do, on onward's rows.

An automation document may carry ``schedules``: each a calendar rule (:mod:`onward.calendar`)
read on the wall clock of an IANA zone, optionally bounded by ``start``/``end``, with a
deterministic ``jitter``, an ``overlap`` policy, a ``catch_up`` policy and an ``input``.
Publishing a version syncs the automation's rows in table ``schedules`` in the version's own
transaction (:func:`sync`: new ones inserted, changed ones updated -- their next instant
recomputed when the rule, zone, bounds or jitter changed -- removed ones deleted).

**Firing.** The elected sweeper (``Sweeper.tick``) calls :func:`fire_due`: a fair batch of due
schedules (a rotated page of organisations, a bounded ``FOR UPDATE SKIP LOCKED`` scan per
organisation), and for each firing :func:`onward.start.start_run` with the start key
``<automation_id>:schedule:<schedule_id>:<instant UTC ISO>`` -- so two sweepers, or a sweeper
that dies after the start and before it advances the row (crash point
``schedule.after_start``), never start a firing twice: the repeat is a duplicate. The run's
input is the schedule's ``input`` plus ``{"schedule": {"id", "instant"}}``. The jitter
(``spread_offset(f"{schedule_id}:{instant}", jitter)``) moves when a firing happens, never its
identity.

**Overlap** (a run this schedule started is still unfinished): ``skip`` (the default) skips the
firing and records it; ``allow`` starts it anyway; ``buffer_one`` keeps one pending firing,
started once the unfinished run finishes (further firings meanwhile are skipped).

**Catch-up.** A firing is *on time* when the sweep reaches it within :data:`ON_TIME_S` of its
fire time and before the next one is due; otherwise the sweeper was down or behind and it
was *missed*: ``skip`` drops every missed firing (the next is the next future one),
``latest`` (the default) runs only the most recent, ``all`` runs each, oldest first, at most
:data:`MAX_CATCH_UP` (the most recent ones).

**Pause, resume, trigger.** A paused schedule fires nothing. Resuming does not replay the
paused period: the next firing is the first instant after the resume -- unless the resume asks
for catch-up, in which case the firings of the paused period count as missed and the
schedule's catch-up policy decides. A trigger fires now, once, under the overlap policy (it
never waits in a buffer: it starts, or it is skipped), with its own start key
``<automation_id>:schedule:<schedule_id>:trigger:<key or instant>``.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import psycopg
from psycopg.types.json import Jsonb

from onward import ids
from onward.automations.document import MAX_DOCUMENT_BYTES, AutomationDoc, ScheduleDef
from onward.calendar import (
    Rule,
    RuleError,
    next_occurrence,
    parse_rule,
    resolve,
    spread_offset,
    zone,
)
from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.durations import parse_duration
from onward.errors import InvalidAutomation, InvalidInput, OnwardError, UnknownSchedule

if TYPE_CHECKING:
    from onward.start import Started

Q = Queries(__package__, "schedules.sql")
log = logging.getLogger("onward.schedules")

#: A firing reached later than this after its fire time was missed (the sweeper was down).
ON_TIME_S = 60.0
#: Catch-up ``all`` runs at most this many missed firings (the most recent), oldest first.
MAX_CATCH_UP = 100
#: The largest jitter a schedule may ask for.
MAX_JITTER_S = 7 * 86400.0
#: The longest key a trigger takes (its start key must stay under ``start.MAX_KEY``).
MAX_TRIGGER_KEY = 200
#: Instants walked one by one before the walk jumps close to now (a long downtime).
WALK_LIMIT = 300
#: While a buffered firing waits for the unfinished run, the sweep looks again this often.
BUFFER_RECHECK_S = 1.0
#: An unexpected error in one schedule: it is tried again after this long.
ERROR_RETRY_S = 60.0
OUTCOMES = ("started", "duplicate", "skipped", "buffered", "missed", "triggered", "failed")


# -- the timing of one schedule ----------------------------------------------------------------


def iso(instant: datetime) -> str:
    """An instant as the start key and the run input carry it: UTC ISO 8601, ``Z``."""
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Timing:
    """When a schedule fires: its rule in its zone, bounds and jitter. Every instant is
    computed by :mod:`onward.calendar` (its one DST policy); nothing here does calendar
    arithmetic."""

    schedule_id: str
    rule: Rule
    zone_name: str
    tz: ZoneInfo
    start_at: datetime | None
    end_at: datetime | None
    jitter_s: float

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Timing:
        return cls(
            schedule_id=row["schedule_id"],
            rule=parse_rule(row["rule"]),
            zone_name=row["zone"],
            tz=zone(row["zone"]),
            start_at=row["start_at"],
            end_at=row["end_at"],
            jitter_s=float(row["jitter_s"]),
        )

    def after(self, instant: datetime) -> datetime | None:
        """The first instant of the rule strictly after ``instant``, within the bounds."""
        if self.start_at is not None and instant < self.start_at:
            instant = self.start_at - timedelta(microseconds=1)  # the start itself may be one
        occ = next_occurrence(self.rule, self.tz, instant)
        if occ is None or (self.end_at is not None and occ.utc > self.end_at):
            return None
        return occ.utc

    def fire_at(self, instant: datetime) -> datetime:
        """When the firing of ``instant`` happens: the instant plus its deterministic jitter."""
        offset = spread_offset(f"{self.schedule_id}:{iso(instant)}", self.jitter_s)
        return instant + timedelta(seconds=offset)

    def fire_at_or_none(self, instant: datetime | None) -> datetime | None:
        return None if instant is None else self.fire_at(instant)


def _instant(value: datetime | None, tz: ZoneInfo) -> datetime | None:
    """A document's ``start``/``end``: with an offset as given, without one local to ``tz``
    (through the calendar's DST policy)."""
    if value is None:
        return None
    if value.tzinfo is not None:
        return value.astimezone(UTC)
    return resolve(value, tz).utc


def timing(doc: AutomationDoc, sd: ScheduleDef) -> Timing:
    """The timing of one schedule of a document; ``ValueError`` (``RuleError`` included) names
    the field that is wrong."""
    name = sd.zone or doc.timezone
    if name is None:
        raise ValueError("zone: none given, and the automation has no timezone")
    try:
        tz = zone(name)
    except RuleError as exc:
        raise ValueError(f"zone: {exc}") from None
    try:
        rule = parse_rule(sd.rule)
    except RuleError as exc:
        raise ValueError(f"rule: {exc}") from None
    try:
        jitter_s = parse_duration(sd.jitter)
    except ValueError as exc:
        raise ValueError(f"jitter: {exc}") from None
    if jitter_s > MAX_JITTER_S:
        raise ValueError(f"jitter: at most {MAX_JITTER_S / 86400:g} days")
    try:
        start_at, end_at = _instant(sd.start, tz), _instant(sd.end, tz)
    except (OverflowError, ValueError):
        raise ValueError("start/end: out of range") from None
    if start_at is not None and end_at is not None and start_at >= end_at:
        raise ValueError("end: must come after start")
    return Timing(sd.id, rule, name, tz, start_at, end_at, jitter_s)


def check(doc: AutomationDoc) -> list[str]:
    """Every problem of the document's schedules (``automations.validate`` reports them)."""
    problems: list[str] = []
    seen: set[str] = set()
    for sd in doc.schedules or []:
        if sd.id in seen:
            problems.append(f"duplicate schedule id {sd.id!r}")
        seen.add(sd.id)
        try:
            timing(doc, sd)
        except ValueError as exc:
            problems.append(f"schedule {sd.id}: {exc}")
        if sd.input is not None and "schedule" in sd.input:
            problems.append(
                f"schedule {sd.id}: input.schedule is what each firing sets ({{id, instant}}); "
                "use another key"
            )
    return problems


# -- what the sweep does with a due schedule -----------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The instants a visit fires (oldest first), how many past instants the catch-up policy
    dropped (a jump over a long downtime drops more, uncounted), the newest past instant, and
    where the schedule goes next."""

    fire: tuple[datetime, ...]
    missed: int
    newest: datetime | None
    next_instant: datetime | None
    next_fire_at: datetime | None


def plan(t: Timing, next_instant: datetime | None, catch_up: str, now: datetime) -> Plan:
    """What the sweep fires at ``now`` (the database clock) for a schedule whose next instant is
    ``next_instant``: the on-time firing, or, after a downtime, what ``catch_up`` keeps."""
    if next_instant is None or t.fire_at(next_instant) > now:
        return Plan((), 0, None, next_instant, t.fire_at_or_none(next_instant))
    successor = t.after(next_instant)
    late = (now - t.fire_at(next_instant)).total_seconds()
    if (successor is None or t.fire_at(successor) > now) and late <= ON_TIME_S:
        return Plan((next_instant,), 0, next_instant, successor, t.fire_at_or_none(successor))
    keep = {"skip": 0, "latest": 1}.get(catch_up, MAX_CATCH_UP)
    past, count, newest, upcoming = _walk(t, next_instant, successor, now, keep)
    fire = tuple(past)
    return Plan(fire, count - len(fire), newest, upcoming, t.fire_at_or_none(upcoming))


def _walk(
    t: Timing, first: datetime, second: datetime | None, now: datetime, keep: int
) -> tuple[deque[datetime], int, datetime, datetime | None]:
    """The past instants from ``first`` on: the newest ``keep`` of them, how many were walked,
    the newest, and the first instant still to come. After :data:`WALK_LIMIT` instants in a row
    the walk jumps close to now (estimating the interval from the instants walked), so a week
    of per-minute firings costs a few hundred calendar steps, not ten thousand."""
    past: deque[datetime] = deque([first], maxlen=keep)
    count, newest, run_first, run_len, jumps = 1, first, first, 1, 0
    current = second
    while current is not None and t.fire_at(current) <= now:
        past.append(current)
        count, newest, run_len = count + 1, current, run_len + 1
        if run_len >= WALK_LIMIT:
            step = (current - run_first) / (run_len - 1)
            anchor = now - timedelta(seconds=t.jitter_s) - step * (keep + 2)
            # the last resort (an interval badly estimated twice): straight to the future
            current = t.after(anchor if jumps < 2 and anchor > current else now)
            jumps += 1
            run_first, run_len = current or now, 0
            continue
        current = t.after(current)
    return past, count, newest, current


# -- publish: the rows follow the document -------------------------------------------------------


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


async def sync(conn: Conn, org_id: str, doc: AutomationDoc, version: int) -> None:
    """Make the automation's schedule rows what ``doc`` (its version ``version``) says, inside
    the caller's (the publish's) transaction. A schedule whose rule, zone, bounds and jitter are
    unchanged keeps its next instant; a new or changed one starts at the first instant after
    now. Paused schedules stay paused, and every firing record is kept. ``InvalidAutomation``
    if a rule cannot compute its next instant (the publish then stores nothing)."""
    cur = await conn.execute(Q.clock)
    now: datetime = (await cur.fetchone())["now"]  # type: ignore[index]
    cur = await conn.execute(
        Q.lock_automation_schedules, {"org_id": org_id, "automation_id": doc.id}
    )
    existing = {r["schedule_id"]: r for r in await cur.fetchall()}
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for sd in doc.schedules or []:
        t = timing(doc, sd)  # validated before: cannot fail here
        old = existing.get(sd.id)
        same = (
            old is not None
            and old["error"] is None
            and (old["rule"], old["zone"], old["start_at"], old["end_at"], old["jitter_s"])
            == (t.rule.source, t.zone_name, t.start_at, t.end_at, t.jitter_s)
        )
        if old is not None and same:
            next_instant, next_fire_at = old["next_instant"], old["next_fire_at"]
        else:
            try:
                next_instant = await asyncio.to_thread(t.after, now)
            except (ValueError, OverflowError) as exc:
                problems.append(f"schedule {sd.id}: rule: {exc}")
                continue
            next_fire_at = t.fire_at_or_none(next_instant)
            if old is not None and old["buffered_instant"] is not None:
                next_fire_at = now  # its buffered firing still waits: look at it soon
        rows.append(
            {
                "schedule_id": sd.id,
                "rule": t.rule.source,
                "zone": t.zone_name,
                "start_at": _when(t.start_at),
                "end_at": _when(t.end_at),
                "jitter_s": t.jitter_s,
                "overlap": sd.overlap,
                "catch_up": sd.catch_up,
                "input": sd.input or {},
                "next_instant": _when(next_instant),
                "next_fire_at": _when(next_fire_at),
            }
        )
    if problems:
        raise InvalidAutomation(problems)
    await conn.execute(
        Q.sync,
        {"org_id": org_id, "automation_id": doc.id, "version": version, "rows": Jsonb(rows)},
    )


# -- firing ------------------------------------------------------------------------------------


@dataclass
class ScheduleLimits:
    orgs: int = 100  # organisations per batch (one page of the rotation)
    per_org: int = 20  # schedules per organisation per batch
    batch: int = 200  # schedules per batch
    max_batches: int = 10  # per tick, so a tick stays short


#: Where each pool's rotation over the organisations stands (the org id it continues after).
_ROTATION: weakref.WeakKeyDictionary[Pool, str] = weakref.WeakKeyDictionary()


async def _start(
    pool: Pool, row: dict[str, Any], instant: datetime, key: str, *, trigger: bool = False
) -> Started:
    """Start the run of one firing: ``start_run`` with the firing's start key, the schedule's
    input plus ``{"schedule": {"id", "instant"}}``."""
    # Imported here: onward.start imports the versions module, which imports this one.
    from onward.start import start_run

    about: dict[str, Any] = {"id": row["schedule_id"], "instant": iso(instant)}
    if trigger:
        about["trigger"] = True
    payload = {**(row["input"] or {}), "schedule": about}
    started = await start_run(
        pool,
        row["org_id"],
        row["automation_id"],
        payload,
        key=key,
        # the input is part of a published document, which that limit already bounds
        max_payload_bytes=MAX_DOCUMENT_BYTES,
    )
    # The run is committed (or was already); the schedule row is not advanced yet. Killed
    # here, the next sweep fires this instant again: the start key makes it a duplicate.
    crash_point("schedule.after_start")
    return started


@dataclass
class _Visit:
    """What one visit of the sweep did to a schedule: the columns ``advance`` writes."""

    row: dict[str, Any]
    busy: bool
    buffered: datetime | None
    next_instant: datetime | None
    next_fire_at: datetime | None
    fired: int = 0
    skipped: int = 0
    outcome: str | None = None
    last_instant: datetime | None = None
    last_run_id: str | None = None
    error: str | None = None

    async def fire(self, pool: Pool, instant: datetime) -> None:
        row = self.row
        key = ids.schedule_start_key(row["automation_id"], row["schedule_id"], iso(instant))
        self.last_instant = instant
        try:
            started = await _start(pool, row, instant, key)
        except OnwardError as exc:  # nothing refuses a published document's input today
            self.outcome, self.error = "failed", str(exc)
            log.error("schedule %s: firing %s failed: %s", _name(row), iso(instant), exc)
            return
        self.busy, self.last_run_id, self.error = True, started.run_id, None
        self.fired += 1
        self.outcome = "started" if started.created else "duplicate"
        log.info(
            "schedule %s fired %s: %s %s", _name(row), iso(instant), self.outcome, started.run_id
        )

    def hold(self, instant: datetime) -> None:
        """Overlap: a run of this schedule is unfinished."""
        self.last_instant = instant
        if self.row["overlap"] == "buffer_one" and self.buffered is None:
            self.buffered, self.outcome = instant, "buffered"
        else:
            self.skipped, self.outcome = self.skipped + 1, "skipped"

    def stop(self, why: str) -> None:
        """The schedule cannot compute its instants: it fires nothing until republished."""
        self.outcome, self.error = "failed", f"stopped: {why}; publish a corrected schedule"
        self.next_instant = self.next_fire_at = self.buffered = None
        log.error("schedule %s stopped: %s", _name(self.row), why)

    def args(self) -> dict[str, Any]:
        next_fire_at = self.next_fire_at
        if self.buffered is not None:  # look again soon: the unfinished run may end any time
            again = self.row["now"] + timedelta(seconds=BUFFER_RECHECK_S)
            next_fire_at = again if next_fire_at is None else min(next_fire_at, again)
        return {
            "org_id": self.row["org_id"],
            "automation_id": self.row["automation_id"],
            "schedule_id": self.row["schedule_id"],
            "next_instant": self.next_instant,
            "next_fire_at": next_fire_at,
            "buffered_instant": self.buffered,
            "last_instant": self.last_instant,
            "last_outcome": self.outcome,
            "last_run_id": self.last_run_id,
            "fired": self.fired,
            "skipped": self.skipped,
            "error": self.error,
        }


def _name(row: dict[str, Any]) -> str:
    return f"{row['automation_id']}/{row['schedule_id']}"


async def _visit(pool: Pool, row: dict[str, Any]) -> _Visit:
    """Fire what is due for one claimed schedule (locked by the caller's transaction)."""
    visit = _Visit(
        row,
        busy=bool(row["busy"]),
        buffered=row["buffered_instant"],
        next_instant=row["next_instant"],
        next_fire_at=row["next_fire_at"],
    )
    if visit.buffered is not None and not visit.busy:  # the unfinished run has finished
        instant, visit.buffered = visit.buffered, None
        await visit.fire(pool, instant)
    try:
        t = Timing.from_row(row)
        p = await asyncio.to_thread(plan, t, row["next_instant"], row["catch_up"], row["now"])
    except (ValueError, OverflowError) as exc:  # RuleError: e.g. a zone the tz data lost
        visit.stop(str(exc))
        return visit
    visit.next_instant, visit.next_fire_at = p.next_instant, p.next_fire_at
    if p.missed:
        visit.skipped += p.missed
        visit.outcome, visit.last_instant = "missed", p.newest
    for instant in p.fire:
        if visit.busy and row["overlap"] != "allow":
            visit.hold(instant)
        else:
            await visit.fire(pool, instant)
    return visit


async def _fire_batch(pool: Pool, after: str, lim: ScheduleLimits) -> tuple[int, int, str, bool]:
    """One fair batch: (schedules visited, runs started, the rotation cursor, wrapped)."""
    started = 0
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(Q.due_orgs, {"after": after, "limit": lim.orgs})
        orgs = [r["org_id"] for r in await cur.fetchall()]
        wrapped = len(orgs) < lim.orgs
        if not orgs:
            return 0, 0, "", True
        cur = await conn.execute(
            Q.claim_due, {"org_ids": orgs, "per_org": lim.per_org, "batch": lim.batch}
        )
        rows = await cur.fetchall()
        for row in rows:
            try:
                visit = await _visit(pool, row)
            except (psycopg.OperationalError, OSError):
                raise  # the database is gone: the sweeper says so and tries again
            except Exception as exc:  # a bug must not stop the sweeper (nor the timers)
                log.exception("schedule %s: unexpected error", _name(row))
                visit = _Visit(
                    row,
                    bool(row["busy"]),
                    row["buffered_instant"],
                    row["next_instant"],
                    row["now"] + timedelta(seconds=ERROR_RETRY_S),
                )
                visit.outcome, visit.error = "failed", f"{type(exc).__name__}: {exc}"
            await conn.execute(Q.advance, visit.args())
            started += visit.fired
    return len(rows), started, "" if wrapped else orgs[-1], wrapped


async def fire_due(pool: Pool, *, limits: ScheduleLimits | None = None) -> int:
    """The sweeper's part (``Sweeper.tick``): fire the due schedules, fairly between
    organisations, in bounded batches; returns how many runs were started. Each batch is one
    transaction that holds its schedules (``FOR UPDATE SKIP LOCKED``) while their runs start
    (each ``start_run`` commits on its own) and advances them before it commits. The rotation
    continues where the last tick stopped; a tick ends after a whole rotation found nothing, or
    after ``max_batches``."""
    lim = limits or ScheduleLimits()
    after = _ROTATION.get(pool, "")
    started = visited_since_wrap = 0
    try:
        for _ in range(lim.max_batches):
            visited, n, after, wrapped = await _fire_batch(pool, after, lim)
            started += n
            visited_since_wrap += visited
            if wrapped:
                if visited_since_wrap == 0:
                    break
                visited_since_wrap = 0
    except (psycopg.OperationalError, OSError):
        raise  # the sweeper logs it and tries again
    except Exception:  # never the end of the sweeper, whose timers must keep firing
        log.exception("schedules: the sweep's batch failed; trying again next tick")
    _ROTATION[pool] = after
    return started


# -- for people: list, pause, resume, trigger ----------------------------------------------------


async def list_schedules(
    pool: Pool,
    org_id: str,
    automation_id: str | None = None,
    schedule_id: str | None = None,
    *,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """The schedules of an organisation (of one automation), by automation and id, with the
    status of each one's last run (``last_run_status``)."""
    args = {
        "org_id": org_id,
        "automation_id": automation_id,
        "schedule_id": schedule_id,
        "limit": limit,
    }
    async with pool.connection() as conn:
        cur = await conn.execute(Q.list, args)
        return list(await cur.fetchall())


async def get(pool: Pool, org_id: str, automation_id: str, schedule_id: str) -> dict[str, Any]:
    """One schedule as :func:`list_schedules` shows it; ``UnknownSchedule`` if there is none."""
    rows = await list_schedules(pool, org_id, automation_id, schedule_id, limit=1)
    if not rows:
        raise UnknownSchedule(org_id, automation_id, schedule_id)
    return rows[0]


async def _lock_one(
    conn: Conn, org_id: str, automation_id: str, schedule_id: str
) -> dict[str, Any]:
    keys = {"org_id": org_id, "automation_id": automation_id, "schedule_id": schedule_id}
    cur = await conn.execute(Q.lock_one, keys)
    row = await cur.fetchone()
    if row is None:
        raise UnknownSchedule(org_id, automation_id, schedule_id)
    return row


async def pause(pool: Pool, org_id: str, automation_id: str, schedule_id: str) -> dict[str, Any]:
    """Pause a schedule: it fires nothing until resumed (a buffered firing waits too). Pausing
    a paused schedule changes nothing. Returns the schedule."""
    keys = {"org_id": org_id, "automation_id": automation_id, "schedule_id": schedule_id}
    async with pool.connection() as conn:
        cur = await conn.execute(Q.pause, keys)
        if await cur.fetchone() is None:
            raise UnknownSchedule(org_id, automation_id, schedule_id)
    return await get(pool, org_id, automation_id, schedule_id)


async def resume(
    pool: Pool, org_id: str, automation_id: str, schedule_id: str, *, catch_up: bool = False
) -> dict[str, Any]:
    """Resume a paused schedule. The paused period is not replayed: the next firing is the
    first instant after now. With ``catch_up`` it is: the firings of the paused period count
    as missed, and the schedule's catch-up policy decides which run (at the next sweep).
    Resuming a schedule that is not paused changes nothing. Returns the schedule."""
    async with pool.connection() as conn, conn.transaction():
        row = await _lock_one(conn, org_id, automation_id, schedule_id)
        if row["paused"]:
            next_instant, next_fire_at, error = row["next_instant"], row["next_fire_at"], None
            if not catch_up:
                try:
                    t = Timing.from_row(row)
                    next_instant = await asyncio.to_thread(t.after, row["now"])
                    next_fire_at = t.fire_at_or_none(next_instant)
                except (ValueError, OverflowError) as exc:
                    next_instant = next_fire_at = None
                    error = f"stopped: {exc}; publish a corrected schedule"
                if row["buffered_instant"] is not None:
                    next_fire_at = row["now"]
            await conn.execute(
                Q.resume,
                {
                    "org_id": org_id,
                    "automation_id": automation_id,
                    "schedule_id": schedule_id,
                    "next_instant": next_instant,
                    "next_fire_at": next_fire_at,
                    "error": error,
                },
            )
    return await get(pool, org_id, automation_id, schedule_id)


@dataclass(frozen=True)
class Triggered:
    """What a trigger did: ``started`` (a new run), ``duplicate`` (this trigger's key already
    started ``run_id``) or ``skipped`` (overlap: ``run_id`` is the unfinished run)."""

    automation_id: str
    schedule_id: str
    outcome: str
    instant: datetime
    run_id: str | None
    start_key: str | None
    reason: str | None = None


async def trigger(
    pool: Pool, org_id: str, automation_id: str, schedule_id: str, *, key: str | None = None
) -> Triggered:
    """Fire the schedule now, once, paused or not, under its overlap policy: with ``skip`` or
    ``buffer_one`` and a run of this schedule unfinished, nothing starts (``skipped``). The
    start key is ``<automation_id>:schedule:<schedule_id>:trigger:<key>`` -- the caller's
    ``key`` (a retry with the same key is a duplicate), else the instant."""
    if key is not None and (not key or len(key) > MAX_TRIGGER_KEY):
        raise InvalidInput(f"trigger key: 1 to {MAX_TRIGGER_KEY} characters")
    async with pool.connection() as conn, conn.transaction():
        row = await _lock_one(conn, org_id, automation_id, schedule_id)
        instant: datetime = row["now"]
        start_key = ids.schedule_start_key(
            automation_id, schedule_id, f"trigger:{key if key is not None else iso(instant)}"
        )
        record = {"org_id": org_id, "automation_id": automation_id, "schedule_id": schedule_id}
        if row["busy"] and row["overlap"] != "allow" and row["last_run_key"] != start_key:
            reason = (
                f"run {row['last_run_id']} of this schedule is unfinished "
                f"(overlap {row['overlap']})"
            )
            await conn.execute(
                Q.record_trigger,
                {**record, "outcome": "skipped", "run_id": None, "fired": 0, "skipped": 1},
            )
            return Triggered(
                automation_id, schedule_id, "skipped", instant, row["last_run_id"], None, reason
            )
        started = await _start(pool, row, instant, start_key, trigger=True)
        outcome = "started" if started.created else "duplicate"
        await conn.execute(
            Q.record_trigger,
            {
                **record,
                "outcome": "triggered" if started.created else "duplicate",
                "run_id": started.run_id,
                "fired": int(started.created),
                "skipped": 0,
            },
        )
    log.debug(
        "schedule %s/%s triggered: %s %s", automation_id, schedule_id, outcome, started.run_id
    )
    return Triggered(automation_id, schedule_id, outcome, instant, started.run_id, start_key)
