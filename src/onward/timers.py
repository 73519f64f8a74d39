"""Timers (R6, R7): written by a waiting step (leases.sql ``settle_wait_timer``), fired and
recomputed here.

A timer fires exactly once: ``fired_at IS NULL`` is the claim, whoever comes first -- the
delayed wake job (fast path, ``by='wake'``) or the due sweep (backstop, ``by='sweep'``).
Firing makes the waiting step ready, with ``wake`` saying what woke it, and writes the outbox
row that wakes a worker of its lane, all in one statement.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from onward import calendar
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import InvalidInput

Q = Queries(__package__, "timers.sql")


@dataclass(frozen=True)
class Eager:
    """A firing worker's offer to run what its timers wake (``timers.sql fire``): its id, and
    per lane it serves the slots free now and the lane's lease. Up to that many woken steps of
    each lane are claimed by the worker in the fire's own statement."""

    worker: str
    free: dict[str, int]
    leases: dict[str, float]


#: the parameters of ``timers.sql fire`` for a fire that claims nothing (a sweep's, a bench's)
NO_EAGER: dict[str, Any] = {"worker": None, "lanes": [], "free": [], "leases": []}


# the columns of a fired timer's row that are its step's claim (as ``leases.claim`` returns it)
_CLAIM_KEYS = (
    "org_id", "run_id", "seq", "step_id", "kind", "lane", "iteration", "attempt", "failures",
    "wake", "queue_lag_s", "db_now", "automation_id", "version", "input", "ctx", "visits",
    "traceparent", "steps_executed", "max_steps", "cancel_requested", "over_steps", "over_age",
)  # fmt: skip


async def fire(
    conn: Conn,
    timers: Sequence[tuple[str, int] | tuple[str, int, int | None]],
    *,
    by: str,
    eager: Eager | None = None,
) -> list[dict[str, Any]]:
    """Fire these ``(org_id, timer_id[, wake_n])`` if still unfired; returns the ones this
    call fired (``org_id``, ``timer_id``, ``run_id``, ``lateness_s``, ``lane``, and ``claim``:
    the woken step's claim when ``eager`` claimed it, else None). A wake names the timer's
    wake number: once the timer was recomputed (a new ``wake_n``) the old wake fires nothing.
    The sweep passes no wake number and claims nothing."""
    if not timers:
        return []
    lanes = [lane for lane, n in (eager.free.items() if eager else ()) if n > 0]
    cur = await conn.execute(
        Q.fire,
        {
            "org_ids": [t[0] for t in timers],
            "timer_ids": [t[1] for t in timers],
            "wake_ns": [t[2] if len(t) > 2 else None for t in timers],
            "by": by,
            "worker": eager.worker if eager else None,
            "lanes": lanes,
            "free": [eager.free[lane] for lane in lanes] if eager else [],
            "leases": [eager.leases[lane] for lane in lanes] if eager else [],
        },
    )
    return [
        {
            "org_id": r["org_id"],
            "timer_id": r["timer_id"],
            "run_id": r["run_id"],
            "lateness_s": r["lateness_s"],
            "lane": r["lane"],
            "claim": {k: r[k] for k in _CLAIM_KEYS} if r["claimed"] else None,
        }
        for r in await cur.fetchall()
    ]


@dataclass
class Recomputed:
    """What a recomputation did: timers examined, moved (a new instant or intent, a new wake
    number, a ``timer_moved`` history row), unchanged, and left as they were because the new
    inputs give no occurrence; and how long it took."""

    examined: int = 0
    moved: int = 0
    unchanged: int = 0
    no_occurrence: int = 0
    seconds: float = 0.0
    sample: list[dict[str, Any]] = field(default_factory=list)  # the first moves, for display

    def as_dict(self) -> dict[str, Any]:
        return {
            "examined": self.examined,
            "moved": self.moved,
            "unchanged": self.unchanged,
            "no_occurrence": self.no_occurrence,
            "seconds": round(self.seconds, 3),
            "sample": self.sample,
        }


async def recompute(
    pool: Pool,
    org_id: str | None,
    *,
    run_id: str | None = None,
    contact_id: str | None = None,
    automation_id: str | None = None,
    step_id: str | None = None,
    zone: str | None = None,
    rule: str | None = None,
    reason: str | None = None,
    worker: str = "recompute",
    batch: int = 2000,
) -> Recomputed:
    """Recompute pending calendar timers (R6) from their stored intent, with a new ``zone``
    (a contact moved) or ``rule`` (the automation's schedule changed) when given, or as they
    are (``org_id=None``: every organisation, after a tz database update). Each timer whose
    instant or intent changes is moved with its reference instant and spread kept, so the
    same inputs always give the same instant and offset. Raises ``InvalidInput`` for a zone
    or rule that cannot be used, before anything changes."""
    try:
        if zone is not None:
            calendar.zone(zone)
        if rule is not None:
            calendar.parse_rule(rule)
    except calendar.RuleError as exc:
        raise InvalidInput(str(exc)) from None
    if org_id is None and any(v is not None for v in (run_id, contact_id, automation_id, step_id)):
        raise InvalidInput("recomputing every organisation takes no run, contact or automation")
    why = reason or _reason(zone, rule)
    done = Recomputed()
    started = time.perf_counter()
    after_org, after = "", 0
    while True:
        async with pool.connection() as conn:
            if org_id is None:
                cur = await conn.execute(
                    Q.pending_calendar_all, {"after_org": after_org, "after": after, "limit": batch}
                )
            else:
                cur = await conn.execute(
                    Q.pending_calendar,
                    {
                        "org_id": org_id,
                        "after": after,
                        "run_id": run_id,
                        "contact_id": contact_id,
                        "automation_id": automation_id,
                        "step_id": step_id,
                        "limit": batch,
                    },
                )
            rows = await cur.fetchall()
            if not rows:
                break
            after_org, after = rows[-1]["org_id"], rows[-1]["timer_id"]
            moves = [m for r in rows if (m := _replan(r, zone, rule, done)) is not None]
            if moves:
                cur = await conn.execute(
                    Q.move,
                    {
                        "org_ids": [m["org_id"] for m in moves],
                        "timer_ids": [m["timer_id"] for m in moves],
                        "wake_ns": [m["wake_n"] for m in moves],
                        "old_dues": [m["old_due"] for m in moves],
                        "new_dues": [m["new_due"] for m in moves],
                        "intents": [Jsonb(m["intent"]) for m in moves],
                        "worker": worker,
                        "reason": why,
                    },
                )
                moved = await cur.fetchall()
                done.moved += len(moved)
                for m in moves[: max(0, 20 - len(done.sample))]:
                    done.sample.append(
                        {
                            "org_id": m["org_id"],
                            "timer_id": m["timer_id"],
                            "run_id": m["run_id"],
                            "from": m["old_due"].isoformat(),
                            "to": m["new_due"].isoformat(),
                        }
                    )
        if len(rows) < batch:
            break
    done.seconds = time.perf_counter() - started
    return done


def _reason(zone: str | None, rule: str | None) -> str:
    parts = [f"zone {zone}" if zone else "", f"rule {rule!r}" if rule else ""]
    changed = " and ".join(p for p in parts if p)
    return f"{changed} changed" if changed else "recomputed (tz database)"


def _replan(
    row: dict[str, Any], zone: str | None, rule: str | None, done: Recomputed
) -> dict[str, Any] | None:
    """The move for one timer, or None when nothing changes (counted in ``done``)."""
    done.examined += 1
    intent = row["intent"]
    planned = calendar.plan(
        rule or intent["rule"],
        zone or intent["zone"],
        datetime.fromisoformat(intent["after"]),
        spread_s=float(intent.get("spread_s", 0.0)),
        key=row["run_id"],
    )
    if planned is None:
        done.no_occurrence += 1
        return None
    new_due, fresh = planned
    new_intent = {**intent, **fresh}
    if zone is not None and zone != intent["zone"]:
        new_intent["zone_source"] = "recompute"
    if new_due == row["due_at"] and new_intent == intent:
        done.unchanged += 1
        return None
    return {**row, "old_due": row["due_at"], "new_due": new_due, "intent": new_intent}


async def skip(
    pool: Pool, org_id: str, run_id: str, *, worker: str = "operator"
) -> list[dict[str, Any]]:
    """An operator's "skip the wait": move the run's pending timer (a wait, or a deadline) to
    now -- a recompute to the current instant, with its history row (``timer_moved``, reason
    ``skipped``) and a new wake number, so it fires at once through the usual path. Returns
    the moves (empty: the run waits on no timer)."""
    async with pool.connection() as conn:
        rows = await (
            await conn.execute(Q.pending_of_run, {"org_id": org_id, "run_id": run_id})
        ).fetchall()
        if not rows:
            return []
        cur = await conn.execute(
            Q.move,
            {
                "org_ids": [r["org_id"] for r in rows],
                "timer_ids": [r["timer_id"] for r in rows],
                "wake_ns": [r["wake_n"] for r in rows],
                "old_dues": [r["due_at"] for r in rows],
                "new_dues": [r["db_now"] for r in rows],
                "intents": [Jsonb(r["intent"]) for r in rows],
                "worker": worker,
                "reason": "skipped by an operator",
            },
        )
        moved = await cur.fetchall()
    return [
        {"timer_id": m["timer_id"], "from": r["due_at"], "to": m["due_at"], "purpose": r["purpose"]}
        for m, r in zip(moved, rows, strict=False)
    ]


async def db_now(pool: Pool) -> datetime:
    """The database's clock (the clock every instant is compared with)."""
    async with pool.connection() as conn:
        row = await (await conn.execute(Q.db_now)).fetchone()
    assert row is not None
    now: datetime = row["now"]
    return now


async def lock_pending_of_run(conn: Conn, org_id: str, run_id: str) -> None:
    """Lock the run's unfired timers (before its step: the order a fire takes them)."""
    await conn.execute(Q.lock_pending_of_run, {"org_id": org_id, "run_id": run_id})


async def close_for_run(conn: Conn, org_id: str, run_id: str, *, fired_by: str) -> int:
    """Its run ended: the run's pending timers fire nothing (``fired_by`` says why)."""
    cur = await conn.execute(
        Q.close_for_run, {"org_id": org_id, "run_id": run_id, "fired_by": fired_by}
    )
    return cur.rowcount
