"""The health page (R18): the doctor's measurements for one organisation, each a
:class:`onward.doctor.Check` (healthy, value, detail -- the same names ``onward doctor``
prints), and the last hour minute by minute where rows keep it.

``onward doctor`` reads every organisation (an operator's tool); a console page serves one
organisation, so its queries (``health.sql``) are the doctor's with the organisation named.
What only the whole engine has -- the elected sweeper, the queue's health, migrations -- is the
doctor's alone and stays there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onward.db import Pool
from onward.db.sql import Queries
from onward.doctor import Check

Q = Queries(__package__, "health.sql")

MINUTES = 60


@dataclass(frozen=True)
class Health:
    checks: list[Check]
    lanes: list[dict[str, Any]]
    stuck: list[dict[str, Any]]  # runs with no way forward
    series: dict[str, list[float | None]]  # one value per minute, oldest first


def _per_minute(rows: list[dict[str, Any]], column: str) -> list[float | None]:
    values: list[float | None] = [None] * MINUTES
    for r in rows:
        ago = r["minutes_ago"]
        if 0 <= ago < MINUTES and r[column] is not None:
            values[MINUTES - 1 - ago] = float(r[column])
    return values


async def measure(
    pool: Pool, org_id: str, *, circuits: list[dict[str, Any]], grace: float = 300.0
) -> Health:
    """The organisation's health now and over the last hour. ``circuits``: its circuits
    (``Engine.circuits``), whose open ones are a check."""
    args = {"org_id": org_id, "grace": grace, "settle": 5.0, "limit": 20}
    async with pool.connection() as conn:
        stuck = list(await (await conn.execute(Q.no_way_forward, args)).fetchall())
        overdue = await (await conn.execute(Q.overdue_timers, args)).fetchone()
        lag = await (await conn.execute(Q.outbox_lag, args)).fetchone()
        effects = list(await (await conn.execute(Q.unsettled_effects, args)).fetchall())
        lanes = list(await (await conn.execute(Q.lanes, args)).fetchall())
        lateness = await (await conn.execute(Q.timer_lateness_by_minute, args)).fetchall()
        runs = await (await conn.execute(Q.runs_by_minute, args)).fetchall()
        unsettled = await (await conn.execute(Q.unsettled_by_minute, args)).fetchall()
        sent = await (await conn.execute(Q.outbox_lag_by_minute, args)).fetchall()
    assert overdue is not None and lag is not None
    open_circuits = [c for c in circuits if c["state"] != "closed"]
    # an effect in review waits for a person by design (doctor: effects_in_review, a warning):
    # shown beside the others, never what makes this check fail
    stuck_effects = [e for e in effects if e["status"] != "review"]
    open_effects = sum(e["effects"] for e in stuck_effects)
    oldest_effect = max((e["oldest_age_s"] for e in stuck_effects), default=0.0)
    checks = [
        Check(
            "runs_without_way_forward",
            not stuck,
            len(stuck),
            ", ".join(f"{r['run_id']} ({r['status']})" for r in stuck)
            or "every unfinished run has a durable way forward",
        ),
        Check(
            "overdue_timers",
            overdue["overdue"] == 0,
            overdue["overdue"],
            f"oldest due {overdue['oldest_age_s']:.0f}s ago" if overdue["overdue"] else "none",
        ),
        Check(
            "outbox_lag",
            lag["oldest_age_s"] < grace,
            lag["unsent"],
            f"{lag['unsent']} due wake-up(s) unpublished, oldest {lag['oldest_age_s']:.1f}s"
            if lag["unsent"]
            else "every due wake-up is published",
        ),
        Check(
            "unsettled_effects",
            all(e["oldest_age_s"] < grace for e in stuck_effects),
            open_effects,
            ", ".join(f"{e['effects']} {e['status']}" for e in effects)
            + (f"; oldest first attempt {oldest_effect:.0f}s ago" if stuck_effects else "")
            or "none",
        ),
        Check(
            "lanes",
            all(r["oldest_ready_s"] < grace for r in lanes),
            {r["lane"]: r["ready"] for r in lanes},
            "; ".join(
                f"{r['lane']}: {r['ready']} ready (oldest {r['oldest_ready_s']:.1f}s), "
                f"{r['running']} running, {r['parked']} parked"
                for r in lanes
            )
            or "no work in any lane",
        ),
        Check(
            "open_circuits",
            not open_circuits,
            len(open_circuits),
            ", ".join(f"{c['key']} {c['state']}" for c in open_circuits) or "none",
        ),
    ]
    series = {
        "timer_lateness_s": _per_minute(lateness, "worst_s"),
        "timers_fired": _per_minute(lateness, "fired"),
        "runs_started": _per_minute(runs, "started"),
        "runs_finished": _per_minute(runs, "finished"),
        "effects_unsettled": _per_minute(unsettled, "unsettled"),
        "outbox_lag_s": _per_minute(sent, "worst_s"),
    }
    return Health(checks, lanes, stuck, series)
