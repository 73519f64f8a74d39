"""``onward bench recompute``: ``onward timers recompute --all`` over M pending calendar timers.

What a tz database update costs (R6): every pending calendar timer is read, its instant planned
again from the intent stored beside it, and moved where the instant or intent changed.

One sitting, on a scratch database:

1. **fill**: M waiting runs, their waiting ``wait_until`` step and its pending timer, made by
   SQL (``INSERT ... SELECT generate_series``) in the shape ``wait_until`` writes: the intent is
   what :func:`onward.calendar.plan` returns (rule, zone, reference instant, wall, local and UTC
   times, the spread and this run's offset, the due instant) plus ``zone_source``. A mix of five
   rules in five zones (``COMBOS``) and eight reference instants, the default 600 s spread; each
   row's spread offset is computed in SQL from ``sha256(run_id)`` exactly as
   :func:`onward.calendar.spread_offset` computes it.
2. **ceilings**: the SQL read of every pending calendar timer alone (``timers.sql
   pending_calendar_all``, the same pages of 2,000 through the same pool, nothing planned) and
   :func:`onward.calendar.plan` alone in a loop over a sample of the same intents: the two
   halves of the work, each at its own best speed (medians of ``reps``).
3. **unchanged**: ``timers.recompute(pool, None)``, what ``onward timers recompute --all``
   runs, with the tz data the timers were planned with: every timer is examined, none moves.
4. **every timer moves**: a tz database change is simulated by filling the timers again as an
   older tz database would have planned them -- each zone's offset one hour greater, so each
   stored instant (``due_at``, the intent's ``utc``, ``local`` and ``due_at``) an hour early --
   then the same ``timers.recompute(pool, None)``: each timer is moved back with its wake
   number bumped, a delayed wake (outbox row) and a ``timer_moved`` history row.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg

from onward import calendar, timers
from onward.bench import median
from onward.bench.ceiling import cpu_delta, cpu_snapshot
from onward.bench.db import scratch_database
from onward.db import make_pool

ORG = "bench"
SPREAD_S = calendar.DEFAULT_SPREAD_S
#: The rules and zones of the pending timers, an equal share each.
COMBOS: tuple[tuple[str, str], ...] = (
    ("09:00 on weekdays", "Europe/Berlin"),
    ("08:30 on day 1", "America/New_York"),
    ("cron 30 8 * * 1-5", "Asia/Kolkata"),
    ("RRULE:FREQ=MONTHLY;BYMONTHDAY=-1;BYHOUR=17;BYMINUTE=0", "Australia/Adelaide"),
    ("07:15 on mon,wed,fri", "Asia/Kathmandu"),
)
#: Reference instants (when each wait began): this many, a minute apart, before the fill.
AFTERS = 8
PAGE = 2_000  # timers.recompute's default page
FILL_CHUNK = 100_000

# The instant as Python's datetime.isoformat() writes a UTC instant: microseconds only when
# there are some.
_ISO = (
    "to_char({t} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') || "
    "CASE WHEN to_char({t} AT TIME ZONE 'UTC', 'US') = '000000' THEN '' "
    "ELSE '.' || to_char({t} AT TIME ZONE 'UTC', 'US') END || '+00:00'"
)

# One statement per chunk: runs, their waiting step and its pending timer. The plans (one per
# rule, zone and reference instant) come from Python; the spread offset of each run is
# sha256(run_id)'s first 8 bytes (unsigned, big-endian) mod the spread in ms, as
# calendar.spread_offset computes it.
FILL = f"""
WITH p AS (
    SELECT * FROM unnest(%(rules)s::text[], %(zones)s::text[], %(afters)s::text[],
                         %(walls)s::text[], %(locals)s::text[], %(utc_texts)s::text[],
                         %(utcs)s::timestamptz[], %(subs)s::text[])
        WITH ORDINALITY AS p(rule, zone, after, wall, local, utc_text, utc, sub, k)
),
g AS (
    SELECT 'run_' || lpad(to_hex(%(ms)s::bigint), 12, '0') || lpad(to_hex(g), 12, '0')
               AS run_id, g, p.*
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
    JOIN p ON p.k = g %% %(plans)s + 1
),
o AS (
    SELECT g.*, round((((('x' || encode(substring(sha256(convert_to(run_id, 'UTF8'))
                                               FROM 1 FOR 8), 'hex'))::bit(64)::bigint::numeric
                         + 18446744073709551616) %% 18446744073709551616)
                       %% %(spread_ms)s) / 1000.0, 3) AS offset_s
    FROM g
),
d AS (
    SELECT o.*, o.utc + o.offset_s * interval '1 second' AS due FROM o
),
r AS (
    INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind,
                      status, input, visits, current_seq, steps_executed, max_steps,
                      deadline_at, contact_id)
    SELECT %(org)s, run_id, 'bench-recompute', 1, 'bench-recompute:' || g, 'caller',
           'waiting', jsonb_build_object('i', g), '{{"wait": 1}}', 1, 0, 1000,
           now() + interval '30 days', 'contact_' || g
    FROM d
),
s AS (
    INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, status, attempt, wait_kind)
    SELECT %(org)s, run_id, 1, 'wait', 'wait_until', 'wait', 'waiting', 1, 'timer' FROM d
)
INSERT INTO timers (org_id, run_id, seq, purpose, intent, due_at)
SELECT %(org)s, run_id, 1, 'wait',
       jsonb_build_object('rule', rule, 'zone', zone, 'after', after, 'wall', wall,
                          'local', local, 'utc', utc_text, 'substitution', sub,
                          'spread_s', %(spread_s)s::numeric, 'offset_s', offset_s,
                          'due_at', {_ISO.format(t="due")}, 'zone_source', 'step'),
       due
FROM d
"""


def _plans(now: datetime, stale_hours: float) -> dict[str, list[Any]]:
    """One plan per rule, zone and reference instant, as arrays for FILL. ``stale_hours``:
    planned as a tz database whose offsets were that much greater would have planned it."""
    cols: dict[str, list[Any]] = {
        k: [] for k in ("rules", "zones", "afters", "walls", "locals", "utc_texts", "utcs", "subs")
    }
    shift = timedelta(hours=stale_hours)
    for rule, zone_name in COMBOS:
        for i in range(AFTERS):
            after = now - timedelta(minutes=i)
            planned = calendar.plan(rule, zone_name, after, spread_s=0.0, key="")
            if planned is None:
                raise RuntimeError(f"{rule!r} in {zone_name} has no occurrence after {after}")
            _due, intent = planned
            occ_utc = datetime.fromisoformat(intent["utc"]) - shift
            local = datetime.fromisoformat(intent["local"])
            offset = local.utcoffset()
            assert offset is not None
            stale_local = local.replace(tzinfo=timezone(offset + shift))
            cols["rules"].append(rule)
            cols["zones"].append(zone_name)
            cols["afters"].append(intent["after"])
            cols["walls"].append(intent["wall"])
            cols["locals"].append(stale_local.isoformat())
            cols["utc_texts"].append(occ_utc.isoformat())
            cols["utcs"].append(occ_utc)
            cols["subs"].append(intent["substitution"])
    return cols


def fill(url: str, n: int, *, stale_hours: float = 0.0, org: str = ORG) -> float:
    """M pending calendar timers (runs, steps, timers) by SQL; returns the seconds it took."""
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        now: datetime = row[0]
        plans = _plans(now.astimezone(UTC), stale_hours)
        conn.execute(
            "INSERT INTO organisations (org_id) VALUES (%s) ON CONFLICT DO NOTHING", (org,)
        )
        ms = int(now.timestamp() * 1000)
        for first in range(1, n + 1, FILL_CHUNK):
            conn.execute(
                FILL,
                {
                    **plans,
                    "org": org,
                    "ms": ms,
                    "first": first,
                    "last": min(n, first + FILL_CHUNK - 1),
                    "plans": len(plans["rules"]),
                    "spread_ms": int(SPREAD_S * 1000),
                    "spread_s": SPREAD_S,
                },
            )
        for table in ("runs", "steps", "timers"):
            conn.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - t0


def _empty(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE runs, steps, timers, history_log, outbox")


# -- the ceilings and the recomputations --------------------------------------------------------


async def _read_all(url: str, sample: int) -> tuple[int, float, list[dict[str, Any]]]:
    """Every pending calendar timer, page by page, as recompute reads them; nothing planned."""
    pool = make_pool(url, max_size=2)
    await pool.open(wait=True)
    rows_kept: list[dict[str, Any]] = []
    n = 0
    try:
        t0 = time.perf_counter()
        after_org, after = "", 0
        while True:
            async with pool.connection() as conn:
                cur = await conn.execute(
                    timers.Q.pending_calendar_all,
                    {"after_org": after_org, "after": after, "limit": PAGE},
                )
                rows = await cur.fetchall()
            if not rows:
                break
            n += len(rows)
            if len(rows_kept) < sample:
                rows_kept.extend(rows[: sample - len(rows_kept)])
            after_org, after = rows[-1]["org_id"], rows[-1]["timer_id"]
            if len(rows) < PAGE:
                break
        elapsed = time.perf_counter() - t0
    finally:
        await pool.close()
    return n, elapsed, rows_kept


def _plan_all(rows: list[dict[str, Any]]) -> float:
    """``calendar.plan`` alone over these timers' intents, as recompute calls it; seconds."""
    for r in rows[:200]:  # warm: the rules parsed, the zones loaded, as in a long recompute
        _plan_one(r)
    t0 = time.perf_counter()
    for r in rows:
        _plan_one(r)
    return time.perf_counter() - t0


def _plan_one(r: dict[str, Any]) -> None:
    intent = r["intent"]
    calendar.plan(
        intent["rule"],
        intent["zone"],
        datetime.fromisoformat(intent["after"]),
        spread_s=float(intent.get("spread_s", 0.0)),
        key=r["run_id"],
    )


async def _recompute(url: str) -> dict[str, Any]:
    """``timers.recompute(pool, None)``: what ``onward timers recompute --all`` runs."""
    pool = make_pool(url, max_size=2)
    await pool.open(wait=True)
    try:
        cpu0 = cpu_snapshot()
        done = await timers.recompute(pool, None, worker="bench-recompute")
        cpu = cpu_delta(cpu0, cpu_snapshot())
    finally:
        await pool.close()
    out = done.as_dict()
    out.pop("sample")
    out["timers_per_s"] = round(done.examined / done.seconds, 1) if done.seconds else 0.0
    out["moved_per_s"] = round(done.moved / done.seconds, 1) if done.seconds else 0.0
    out["pg_cpu_s"] = cpu["pg_cpu_s"]
    out["machine_busy"] = cpu["machine_busy"]
    return out


def _check_moved(url: str) -> dict[str, int]:
    """After the moves: every timer at its planned instant again, at wake number 2, with one
    ``timer_moved`` row and one delayed wake of that number."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT count(*) FILTER (WHERE wake_n = 2
                                      AND due_at = (intent->>'due_at')::timestamptz),
                   (SELECT count(*) FROM history WHERE event = 'timer_moved'),
                   (SELECT count(*) FROM outbox WHERE topic = 'timer' AND job_id LIKE '%:2')
            FROM timers WHERE fired_at IS NULL
            """
        ).fetchone()
    assert row is not None
    return {"at_new_instant": row[0], "history_rows": row[1], "wakes": row[2]}


def run(
    admin_url: str, *, quick: bool = False, runs: int | None = None, reps: int | None = None
) -> dict[str, Any]:
    m = runs or (2_000 if quick else 1_000_000)
    reps = reps or (1 if quick else 3)
    sample = min(m, 2_000 if quick else 100_000)
    res: dict[str, Any] = {
        "bench": "recompute",
        "timers": m,
        "page": PAGE,
        "spread_s": SPREAD_S,
        "combos": [{"rule": r, "zone": z} for r, z in COMBOS],
        "reference_instants": AFTERS,
        "reps": reps,
    }
    with scratch_database(admin_url, f"recompute_{secrets.token_hex(3)}") as url:
        res["fill_s"] = round(fill(url, m), 1)
        reads, plans = [], []
        kept: list[dict[str, Any]] = []
        for _ in range(reps):
            n, elapsed, kept = asyncio.run(_read_all(url, sample))
            assert n == m, (n, m)
            reads.append(n / elapsed)
            plans.append(len(kept) / _plan_all(kept))
        read_ps, plan_ps = median(reads), median(plans)
        res["ceiling"] = {
            "read_per_s": round(read_ps, 1),
            "read_per_s_all": [round(x) for x in reads],
            "plan_per_s": round(plan_ps, 1),
            "plan_per_s_all": [round(x) for x in plans],
            "plan_sample": len(kept),
            # both halves one after the other, each at its own best speed
            "read_then_plan_per_s": round(1 / (1 / read_ps + 1 / plan_ps), 1),
        }
        res["unchanged"] = asyncio.run(_recompute(url))
        _empty(url)
        res["stale_fill_s"] = round(fill(url, m, stale_hours=1.0), 1)
        res["moves"] = asyncio.run(_recompute(url))
        res["moves"]["check"] = _check_moved(url)
    ceiling = res["ceiling"]["read_then_plan_per_s"]
    for key in ("unchanged", "moves"):
        r = res[key]
        r["ratio_to_ceiling"] = round(r["timers_per_s"] / ceiling, 3) if ceiling else None
        r["seconds_per_million"] = round(1e6 / r["timers_per_s"], 1) if r["timers_per_s"] else None
    return res


def render(res: dict[str, Any]) -> str:
    c, u, mv = res["ceiling"], res["unchanged"], res["moves"]
    lines = [
        f"recompute --all: {res['timers']:,} pending calendar timers ({len(res['combos'])} "
        f"rules in {len(res['combos'])} zones x {res['reference_instants']} reference instants, "
        f"spread {res['spread_s']:.0f} s), made by SQL in {res['fill_s']:.0f} s; pages of "
        f"{res['page']}, one process (timers.recompute(pool, None))",
        "",
        f"{'':<48} {'examined':>9} {'moved':>9} {'seconds':>8} {'timers/s':>9} {'ratio':>6} "
        f"{'busy':>5}",
    ]

    def row(name: str, r: dict[str, Any]) -> str:
        busy = r.get("machine_busy")
        return (
            f"{name:<48} {r['examined']:>9,} {r['moved']:>9,} {r['seconds']:>8.1f} "
            f"{r['timers_per_s']:>9,.0f} {r['ratio_to_ceiling']:>6.2f} {(busy or 0) * 100:>4.0f}%"
        )

    lines.append(row("recompute, tz data unchanged (nothing moves)", u))
    lines.append(row("recompute, every instant an hour off (all move)", mv))
    lines.append("")
    lines.append(
        f"ceiling (medians of {res['reps']}): SQL read of every pending timer alone "
        f"{c['read_per_s']:,.0f}/s {c['read_per_s_all']}; calendar.plan alone "
        f"{c['plan_per_s']:,.0f}/s {c['plan_per_s_all']} (on {c['plan_sample']:,} intents); "
        f"one after the other {c['read_then_plan_per_s']:,.0f}/s (ratio = recompute / this)"
    )
    lines.append(
        f"per million timers: {u['seconds_per_million']:.0f} s unchanged, "
        f"{mv['seconds_per_million']:.0f} s when every timer moves"
    )
    ck = mv["check"]
    lines.append(
        f"after the moves: {ck['at_new_instant']:,} timers at their planned instant with wake "
        f"number 2, {ck['history_rows']:,} timer_moved rows, {ck['wakes']:,} new delayed wakes"
    )
    return "\n".join(lines)


__all__ = ["fill", "render", "run"]
