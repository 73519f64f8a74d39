"""Retention: finished runs, and every row of theirs, are deleted after an age per organisation.

The bound is ``organisations.retention_days``: a number of days, ``NULL`` for the engine's
default (``ONWARD_RETENTION_DAYS``, 30 days unless set), or ``Infinity`` to keep finished runs
forever (the default can be ``forever`` too). It is never less than one day, so a day's cost
budget always counts every charge of that day (``budgets``).

The elected sweeper (:class:`Pruner`, called by ``Sweeper.tick``) deletes them in batches:

* a batch is one organisation's oldest finished runs past the cutoff, at most ``batch`` of them,
  picked from ``runs_finished`` and locked ``FOR UPDATE SKIP LOCKED``; then every row naming
  them -- steps, history, timers, effects, approvals, signals, correlations, limit slots and
  bookings, the budget rows of their effect keys, unsent outbox wakes, the runs -- goes in one
  statement. One transaction per batch: a crash rolls the batch back whole (no run is ever half
  deleted) and the next tick, by whichever process leads then, picks the same runs again.
* a tick does a few batches, bounded by ``max_batches`` and ``seconds``, visiting the due
  organisations in turn (``per_org`` batches each, a cursor by ``org_id``), so one tenant's
  backlog neither starves the others nor holds the sweep for long; with nothing due anywhere it
  rests ``idle_seconds`` before looking again.

Workers never wait on the pruner: it touches only finished runs, which no claim or settle
touches, and it never waits on them (``SKIP LOCKED``). Not a run's rows, and so kept:
``circuits.probe_run_id`` (a half-open circuit whose probe is gone picks another one),
``schedules.last_run_id``, ``runs.forked_from`` and ``operations.after_run_id`` (pointers, not
records), sent outbox rows (the relay prunes those within the hour), and ``audit`` rows (a
record of who changed what, not run data: an audit row may name a pruned run).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from onward import audit
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import InvalidInput

Q = Queries(__package__, "retention.sql")
log = logging.getLogger("onward.retention")

MIN_DAYS = 1.0
MAX_DAYS = 36_525.0  # a hundred years; past that, keep forever
BATCH = 500


def check_days(days: float | None, what: str = "days") -> float | None:
    """A bound in days (``None``: keep forever); refuses what is not 1..36525."""
    if days is None:
        return None
    if isinstance(days, bool) or not isinstance(days, int | float) or math.isnan(days):
        raise InvalidInput(f"{what}: a number of days")
    if math.isinf(days) and days > 0:
        return None
    if not MIN_DAYS <= days <= MAX_DAYS:
        raise InvalidInput(
            f"{what}: between {MIN_DAYS:g} and {MAX_DAYS:g} days (or keep forever), not {days:g}"
        )
    return float(days)


def _view(row: dict[str, Any], org_id: str, default_days: float | None) -> dict[str, Any]:
    own, days = row["own"], row["days"]
    forever = days is None or math.isinf(days)
    oldest = row["oldest_finished_at"]
    return {
        "org_id": org_id,
        "days": None if forever else days,
        "keep_forever": forever,
        "source": "organisation" if own is not None else "default",
        "default_days": default_days,
        "cutoff": row["cutoff"],
        "oldest_finished_at": oldest,
        "oldest_finished_age_days": (
            round((row["at"] - oldest).total_seconds() / 86400, 3) if oldest else None
        ),
    }


async def set_days(
    pool: Pool,
    org_id: str,
    days: float | None,
    *,
    keep_forever: bool = False,
    default_days: float | None,
    actor: str | None = None,
) -> dict[str, Any]:
    """Set the organisation's bound: ``days``, ``keep_forever``, or neither for the engine's
    default. Answers :func:`show`."""
    if keep_forever and days is not None:
        raise InvalidInput("give days or keep_forever, not both")
    value = math.inf if keep_forever else check_days(days)
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(Q.set_days, {"org_id": org_id, "days": value})
        await audit.record(
            conn,
            org_id,
            actor=audit.actor(actor),
            action="retention_set",
            target=org_id,
            detail={"days": "forever" if value == math.inf else value},
        )
    return await show(pool, org_id, default_days=default_days)


async def show(
    pool: Pool, org_id: str, *, default_days: float | None, now: datetime | None = None
) -> dict[str, Any]:
    """The organisation's bound, where it comes from, the cutoff and its oldest finished run."""
    async with pool.connection() as conn:
        row = await (
            await conn.execute(
                Q.overview, {"org_id": org_id, "default_days": default_days, "now": now}
            )
        ).fetchone()
    assert row is not None
    return _view(row, org_id, default_days)


async def prune_batch(
    pool: Pool, org_id: str, cutoff: datetime, *, limit: int = BATCH
) -> dict[str, int]:
    """One batch, one transaction: the organisation's oldest finished runs before ``cutoff``
    (at most ``limit``) and every row of theirs. Answers the rows deleted per table."""
    async with pool.connection() as conn, conn.transaction():
        picked = await (
            await conn.execute(Q.pick, {"org_id": org_id, "cutoff": cutoff, "limit": limit})
        ).fetchall()
        if not picked:
            return {"runs": 0}
        row = await (
            await conn.execute(
                Q.delete_runs, {"org_id": org_id, "run_ids": [r["run_id"] for r in picked]}
            )
        ).fetchone()
    assert row is not None
    return {k: int(v) for k, v in row.items()}


async def prune_org(
    pool: Pool,
    org_id: str,
    *,
    default_days: float | None,
    dry_run: bool = False,
    max_runs: int | None = None,
    batch: int = BATCH,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Prune one organisation now (``Engine.prune``), batch after batch until nothing is due
    or ``max_runs`` went. ``dry_run``: only count what would go. ``now``: the database clock
    unless a test gives another instant."""
    if max_runs is not None and max_runs < 1:
        raise InvalidInput("max_runs: at least 1")
    view = await show(pool, org_id, default_days=default_days, now=now)
    cutoff = view["cutoff"]
    answer: dict[str, Any] = {
        "org_id": org_id,
        "dry_run": dry_run,
        "days": view["days"],
        "keep_forever": view["keep_forever"],
        "cutoff": cutoff,
        "pruned": 0,
        "batches": 0,
        "rows": {},
        "seconds": 0.0,
        "due": 0,
    }
    if cutoff is None:
        return answer
    t0 = time.monotonic()
    rows: dict[str, int] = {}
    while not dry_run and (max_runs is None or answer["pruned"] < max_runs):
        size = batch if max_runs is None else min(batch, max_runs - answer["pruned"])
        got = await prune_batch(pool, org_id, cutoff, limit=size)
        answer["batches"] += 1
        answer["pruned"] += got["runs"]
        for table, n in got.items():
            rows[table] = rows.get(table, 0) + n
        if got["runs"] < size:
            break
    answer["rows"] = rows
    answer["seconds"] = round(time.monotonic() - t0, 3)
    async with pool.connection() as conn:
        due = await (
            await conn.execute(Q.count_due, {"org_id": org_id, "cutoff": cutoff})
        ).fetchone()
    answer["due"] = int(due["due"]) if due else 0
    return answer


async def oldest_by_org(
    conn: Conn, *, default_days: float | None, limit: int = 20
) -> list[dict[str, Any]]:
    """For doctor: per organisation with finished runs, its oldest one (age in days) and the
    bound in force (``None``: kept forever), oldest first."""
    rows = await (
        await conn.execute(Q.oldest_by_org, {"default_days": default_days, "limit": limit})
    ).fetchall()
    return [
        {**r, "days": None if r["days"] is None or math.isinf(r["days"]) else r["days"]}
        for r in rows
    ]


@dataclass
class PruneLimits:
    batch: int = BATCH  # runs per batch (per transaction)
    per_org: int = 8  # batches per organisation per tick, then the next organisation's turn
    max_batches: int = 8  # per tick
    seconds: float = 0.5  # per tick: the sweep's other work waits at most this long
    orgs: int = 20  # due organisations looked up per page
    idle_seconds: float = 60.0  # rest after a pass that found nothing due


@dataclass
class PruneStats:
    runs: int = 0
    batches: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


class Pruner:
    """The sweeper's retention step: a few bounded batches per tick (see the module doc)."""

    def __init__(
        self, pool: Pool, *, default_days: float | None, limits: PruneLimits | None = None
    ) -> None:
        self.pool, self.default_days = pool, default_days
        self.limits = limits or PruneLimits()
        self.stats = PruneStats()
        self._after = ""  # org_id cursor: the next page starts after it
        self._idle_until = 0.0

    async def tick(self) -> int:
        """Prune what one tick may; returns the runs deleted."""
        lim = self.limits
        if time.monotonic() < self._idle_until:
            return 0
        t0 = time.monotonic()
        async with self.pool.connection() as conn:
            due = await (
                await conn.execute(
                    Q.due_orgs,
                    {
                        "after": self._after,
                        "default_days": self.default_days,
                        "limit": lim.orgs,
                        "now": None,
                    },
                )
            ).fetchall()
        if not due:
            if self._after == "":  # a whole pass found nothing
                self._idle_until = time.monotonic() + lim.idle_seconds
            self._after = ""
            return 0
        pruned = batches = 0

        def spent() -> bool:
            return batches >= lim.max_batches or time.monotonic() - t0 >= lim.seconds

        for org in due:
            turn_over = True  # its batches for this tick are done, or it has nothing left
            for _ in range(lim.per_org):
                if spent():
                    turn_over = False  # the tick's budget ran out: it goes first next tick
                    break
                got = await prune_batch(self.pool, org["org_id"], org["cutoff"], limit=lim.batch)
                batches += 1
                pruned += got["runs"]
                for table, n in got.items():
                    self.stats.rows[table] = self.stats.rows.get(table, 0) + n
                if got["runs"] < lim.batch:
                    break
            if not turn_over:
                break
            self._after = org["org_id"]
        else:
            if len(due) < lim.orgs:
                self._after = ""  # that was the last page: the next tick starts over
        self.stats.runs += pruned
        self.stats.batches += batches
        self.stats.seconds += time.monotonic() - t0
        if pruned:
            log.info("retention: pruned %d finished runs in %d batches", pruned, batches)
        return pruned
