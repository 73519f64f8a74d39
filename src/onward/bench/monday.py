"""``onward bench monday``: N runs waiting for the same Monday 09:00 in one zone (R8).

Time cannot be made to be Monday, so the cluster is built the way the product builds it, a
minute or a few ahead: one automation whose only step is ``wait_until`` with the rule
``HH:MM:SS on <day>`` (a weekly RRULE, the shape of ``09:00 on weekdays``) in ``Europe/Berlin``,
its wall time read from the DATABASE's clock, so every run's timer comes due at the same
instant T -- or, with spread, at T plus its own offset in ``[0, spread)``.

Each mode (fast path or sweep-only, with or without spread) gets a fresh scratch database and W
worker processes (``python -m onward.bench.proc worker``: worker, relay and sweeper as ``onward
worker`` runs them, lane ``wait=64``, claim batch 32, 2 s poll and sweep interval):

1. **calibration**: C runs of a second automation (a one-off wait a week ahead) are started
   through the library, then the workers go and write their timers: starts per second and
   timers written per second on this machine, now.
2. **the cluster**: T is set to the database's now plus 1.3 x the time those rates give for N
   runs, plus a margin; the automation is published with that rule, N runs are started through
   the library (``Engine.start``, 16 at once) while the workers write their timers. Every timer
   must be written, at T (+ its offset), before T comes: otherwise the mode stops with an error.
   Then ``VACUUM ANALYZE`` of the tables: on a live server a Monday's timers are written over
   days and autovacuum has long since caught up; this test server runs with autovacuum off, so
   without it the instant would meet the setup's dead rows and the planner statistics of the
   empty template (``vacuum=False``, from Python, measures exactly that).
3. **the instant**: from T - 1 s until every run has completed, the bench samples the worker
   queue depth (ready ``wait`` steps no worker has claimed yet), the timers due and not fired,
   and the due wakes still in the outbox. Afterwards, from the rows themselves: each timer's
   lateness past its OWN instant (``fired_at - due_at``, the database's clock, the offset
   included), who fired it (``wake``: the fast path, ``sweep``), timers fired per second of
   the database's clock (the peak second), and how long after its instant each run completed.

Fast path: ``ONWARD_QUEUE=postgres``, the delayed wake of each timer leaves the outbox when due
(NOTIFY) and the worker fires it; the sweep is the backstop. Sweep-only: ``ONWARD_QUEUE=none``.

The ceiling, same sitting: onward's own fire statement (``timers.sql fire``) alone, from one
connection in batches of 500 (the worker's batch), on N pending calendar timers made by SQL --
what the database allows for turning timers into ready steps. The sweep-only rows are bounded
by design too: ``SweepLimits`` fire at most per_org x max_batches timers of one organisation
per tick.

The issue's goal: with spread, lateness p99 < 1 s. The bench's spread is short (60 s, not the
default 10 minutes) so that a run takes minutes; what carries over is the load per second of
window: 100,000 timers over 60 s is 1,667 timers/s, as a million runs over the default 600 s.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import psycopg

from onward import timers
from onward.automations.builder import Automation
from onward.bench import median, percentile
from onward.bench.ceiling import cpu_delta, cpu_snapshot
from onward.bench.proc import Child, warm_pool
from onward.bench.recompute import fill
from onward.calendar import zone
from onward.config import Settings
from onward.engine import Engine
from onward.sweep import SweepLimits
from onward.testing import TemporaryDatabases
from onward.timers import Q as TIMER_Q

ORG, CAL_ORG = "bench", "calibration"
AUTOMATION, CAL_AUTOMATION = "bench-monday", "bench-monday-calibration"
ZONE = "Europe/Berlin"
LANES, CLAIM_BATCH, POOL = "wait=64", 32, 10
POLL_S = SWEEP_S = 2.0
STARTERS = 16
SAFETY = 1.3  # T is this many times the estimated setup ahead, plus a margin
FIRE_BATCH = 500
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
#: (queue, spread?): the fast path and sweep-only, each with and without spread.
MODES: tuple[tuple[str, bool], ...] = (
    ("postgres", True),
    ("postgres", False),
    ("none", True),
    ("none", False),
)

SAMPLE = """
SELECT extract(epoch FROM now() - %(t)s::timestamptz)::float8,
       (SELECT count(*) FROM steps WHERE status = 'ready' AND lane = 'wait'),
       (SELECT count(*) FROM timers WHERE org_id = %(org)s AND fired_at IS NULL
                                      AND due_at <= now()),
       (SELECT count(*) FROM outbox WHERE sent_at IS NULL AND deliver_at <= now()),
       (SELECT count(*) FROM runs WHERE org_id = %(org)s AND finished_at IS NULL)
"""


def _settings(url: str, org: str) -> Settings:
    return Settings(database_url=url, org_id=org, queue="postgres")


def _flow(automation_id: str, rule: str, spread_s: float) -> dict[str, Any]:
    spread: str | float = spread_s if spread_s > 0 else "off"
    return (
        Automation(automation_id)
        .step("wait", "wait_until", rule=rule, zone=ZONE, spread=spread)
        .build()
    )


def _db_now(url: str) -> datetime:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


def _weekly_rule(instant: datetime) -> str:
    """``HH:MM:SS on <day>``: the weekly rule whose next occurrence is ``instant`` (whole
    seconds) on the zone's wall clock."""
    local = instant.astimezone(zone(ZONE))
    return f"{local:%H:%M:%S} on {DAYS[local.weekday()]}"


async def _publish(url: str, org: str, doc: dict[str, Any]) -> None:
    async with Engine.open(_settings(url, org), migrate=False, start_queue=False) as engine:
        await engine.publish(doc)


async def _starts(url: str, org: str, automation_id: str, n: int, prefix: str) -> float:
    """N runs started through the library, STARTERS at once; the seconds it took."""
    async with Engine.open(
        _settings(url, org), migrate=False, pool_size=POOL, start_queue=False
    ) as engine:
        await warm_pool(engine.pool, POOL)
        counter = iter(range(n))

        async def one_client() -> None:
            for i in counter:
                await engine.start(automation_id, {"i": i}, event_id=f"{prefix}{i}")

        t0 = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(STARTERS)))
        return time.perf_counter() - t0


def _spawn(url: str, queue: str, workers: int) -> list[Child]:
    args = [
        "worker",
        "--url",
        url,
        "--org",
        ORG,
        "--queue",
        queue,
        "--lanes",
        LANES,
        "--batch",
        str(CLAIM_BATCH),
        "--pool",
        str(POOL),
        "--poll",
        str(POLL_S),
        "--sweep",
        str(SWEEP_S),
    ]
    children = [Child(*args) for _ in range(workers)]
    for c in children:
        c.wait_ready()
    return children


def _wait_timers(
    conn: psycopg.Connection[Any], org: str, n: int, deadline: datetime | None, timeout: float
) -> datetime:
    """Poll until ``n`` timers of ``org`` are written; the database's clock then. Fails when
    ``deadline`` (the database's clock) or ``timeout`` passes first."""
    limit = time.monotonic() + timeout
    while True:
        row = conn.execute(
            "SELECT count(*), now() FROM timers WHERE org_id = %s", (org,)
        ).fetchone()
        assert row is not None
        if row[0] >= n:
            now: datetime = row[1]
            return now
        if (deadline is not None and row[1] >= deadline) or time.monotonic() > limit:
            raise RuntimeError(
                f"only {row[0]} of {n} timers of {org!r} written before the instant: the setup "
                "was slower than planned (a loaded machine?); try fewer --runs"
            )
        time.sleep(0.05)


def _calibrate(url: str, children: list[Child], c: int) -> dict[str, Any]:
    """Starts/s and timers written/s on this machine, now, on C runs of a wait a week ahead."""
    later = _db_now(url) + timedelta(days=7)
    wall = later.astimezone(zone(ZONE)).replace(tzinfo=None, microsecond=0)
    asyncio.run(_publish(url, CAL_ORG, _flow(CAL_AUTOMATION, f"at {wall.isoformat()}", 0.0)))
    start_s = asyncio.run(_starts(url, CAL_ORG, CAL_AUTOMATION, c, "cal"))
    for ch in children:
        ch.send("go")
    with psycopg.connect(url, autocommit=True) as conn:
        _wait_timers(conn, CAL_ORG, c, None, timeout=120 + c * 0.05)
        row = conn.execute(
            "SELECT extract(epoch FROM max(created_at) - min(created_at))::float8 FROM timers "
            "WHERE org_id = %s",
            (CAL_ORG,),
        ).fetchone()
    assert row is not None
    write_s = max(float(row[0] or 0.0), 1e-3)
    return {
        "runs": c,
        "starts_per_s": round(c / start_s, 1),
        "timers_written_per_s": round(c / write_s, 1),
    }


def _vacuum(url: str) -> None:
    """The tables as autovacuum keeps them on a live server, where a Monday's timers are
    written over days: vacuumed (the outbox and steps rows the setup updated) and analyzed
    (fresh planner statistics). On a server with autovacuum off (this test server) the
    instant would otherwise meet the setup's dead rows and the planner statistics of the
    empty template."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE runs, steps, timers, outbox, history_log, organisations")


def _sample(
    url: str, t: datetime, n: int, every: float, timeout: float
) -> tuple[list[list[float]], dict[str, Any]]:
    """From T - 1 s until every run of the cluster has completed: the samples
    (seconds after T, ready wait steps, due unfired timers, due unsent wakes, unfinished runs)."""
    samples: list[list[float]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        now = _db_now(url)
        time.sleep(max(0.0, (t - now).total_seconds() - 1.0))
        cpu0 = cpu_snapshot()
        limit = time.monotonic() + timeout
        while True:
            row = conn.execute(SAMPLE, {"t": t, "org": ORG}).fetchone()
            assert row is not None
            samples.append([round(float(row[0]), 3), *(int(v) for v in row[1:])])
            if row[4] == 0:
                break
            if time.monotonic() > limit:
                raise RuntimeError(f"{row[4]} of {n} runs unfinished {timeout:.0f} s after T")
            time.sleep(every)
        cpu = cpu_delta(cpu0, cpu_snapshot())
    return samples, cpu


def _figures(url: str, t: datetime, samples: list[list[float]]) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT extract(epoch FROM tm.fired_at - tm.due_at)::float8 * 1000,
                   extract(epoch FROM r.finished_at - tm.due_at)::float8 * 1000,
                   tm.fired_by,
                   floor(extract(epoch FROM tm.fired_at - %(t)s::timestamptz))::int,
                   floor(extract(epoch FROM r.finished_at - %(t)s::timestamptz))::int,
                   extract(epoch FROM tm.due_at - %(t)s::timestamptz)::float8
            FROM timers tm JOIN runs r ON r.org_id = tm.org_id AND r.run_id = tm.run_id
            WHERE tm.org_id = %(org)s
            """,
            {"t": t, "org": ORG},
        ).fetchall()
    late = [r[0] for r in rows]
    done = [r[1] for r in rows]
    fired_per_s = Counter(r[3] for r in rows)
    done_per_s = Counter(r[4] for r in rows)
    last = max(fired_per_s, default=0)
    # after T: until the last run completed; the window: until the last timer fired
    after = [s for s in samples if s[0] >= 0.0]
    window = [s for s in after if s[0] <= last + 1]
    ready = [s[1] for s in window] or [0]
    return {
        "timers": len(rows),
        "due_window_s": round(max((r[5] for r in rows), default=0.0), 3),
        "lateness_ms_p50": round(median(late), 1),
        "lateness_ms_p99": round(percentile(late, 99), 1),
        "lateness_ms_max": round(max(late, default=0.0), 1),
        "completed_ms_p50": round(median(done), 1),
        "completed_ms_p99": round(percentile(done, 99), 1),
        "fired_by": dict(Counter(r[2] for r in rows)),
        "peak_fired_per_s": max(fired_per_s.values(), default=0),
        "peak_completed_per_s": max(done_per_s.values(), default=0),
        "last_fired_after_t_s": last + 1,
        "all_completed_after_t_s": round(samples[-1][0], 1) if samples else None,
        "queue_depth_max": max((s[1] for s in after), default=0),
        "queue_depth_p50": median(ready),
        "due_unfired_max": max((s[2] for s in after), default=0),
        "wakes_unsent_max": max((s[3] for s in after), default=0),
        "samples": len(samples),
        "fired_per_second": [fired_per_s.get(i, 0) for i in range(last + 1)],
    }


def _mode(
    dbs: TemporaryDatabases, queue: str, spread_s: float, o: dict[str, Any]
) -> dict[str, Any]:
    n = o["runs"]
    url = dbs.create()
    try:
        children = _spawn(url, queue, o["workers"])
        try:
            cal = _calibrate(url, children, o["calibration"])
            setup = n / cal["starts_per_s"] + n / cal["timers_written_per_s"]
            now = _db_now(url)
            ahead = timedelta(seconds=SAFETY * setup + o["margin_s"] + 1.0)
            t = (now + ahead).replace(microsecond=0)  # whole seconds: the rule's precision
            rule = _weekly_rule(t)
            asyncio.run(_publish(url, ORG, _flow(AUTOMATION, rule, spread_s)))
            start_s = asyncio.run(_starts(url, ORG, AUTOMATION, n, "m"))
            with psycopg.connect(url, autocommit=True) as conn:
                written = _wait_timers(conn, ORG, n, t, timeout=setup * 10 + 120)
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE due_at >= %s AND due_at <= %s), min(due_at), "
                    "max(due_at) FROM timers WHERE org_id = %s",
                    (t, t + timedelta(seconds=spread_s), ORG),
                ).fetchone()
            assert row is not None
            if row[0] != n:
                raise RuntimeError(
                    f"{n - row[0]} of {n} timers are not at the instant {t} ({rule!r}): due "
                    f"from {row[1]} to {row[2]}; the setup was slower than planned (a loaded "
                    "machine?), try fewer --runs"
                )
            if o["vacuum"]:
                _vacuum(url)
            samples, cpu = _sample(url, t, n, o["sample_s"], timeout=spread_s + 120 + n * 0.02)
            for c in children:
                c.send("stop")
            done = [c.finish() for c in children]
        finally:
            for c in children:
                c.kill()
        figures = _figures(url, t, samples)
    finally:
        dbs.drop(url)
    stats = [d["stats"] for d in done]
    return {
        "queue": queue,
        "spread_s": spread_s,
        "rule": rule,
        "zone": ZONE,
        "instant": t.isoformat(),
        "calibration": cal,
        "starts_per_s": round(n / start_s, 1),
        "slack_s": round((t - written).total_seconds(), 1),
        **figures,
        "machine_busy": cpu["machine_busy"],
        "pg_cpu_s": cpu["pg_cpu_s"],
        "window_wall_s": cpu["wall_s"],
        "workers": {
            "claimed": sum(s["claimed"] for s in stats),
            "lost": sum(s["lost"] for s in stats),
            "relayed": sum(d["relayed"] for d in done),
            "cpu_s": round(sum(d["cpu_s"] for d in done), 1),
            "rss_mb": [round(d["vm_hwm_kb"] / 1024, 1) for d in done],
        },
    }


def _fire_ceiling(dbs: TemporaryDatabases, n: int) -> dict[str, Any]:
    """onward's fire statement alone on N pending timers, from one connection, batches of 500."""
    url = dbs.create()
    try:
        fill(url, n, org="ceiling")
        with psycopg.connect(url, autocommit=True) as conn:
            ids = [r[0] for r in conn.execute("SELECT timer_id FROM timers ORDER BY timer_id")]
            t0 = time.perf_counter()
            fired = 0
            for i in range(0, len(ids), FIRE_BATCH):
                chunk = ids[i : i + FIRE_BATCH]
                cur = conn.execute(
                    TIMER_Q.fire,
                    {
                        "org_ids": ["ceiling"] * len(chunk),
                        "timer_ids": chunk,
                        "wake_ns": [None] * len(chunk),
                        "by": "ceiling",
                        **timers.NO_EAGER,
                    },
                )
                fired += len(cur.fetchall())
            elapsed = time.perf_counter() - t0
    finally:
        dbs.drop(url)
    return {
        "timers": fired,
        "batch": FIRE_BATCH,
        "elapsed_s": round(elapsed, 3),
        "fired_per_s": round(fired / elapsed, 1),
    }


def run(
    admin_url: str,
    *,
    quick: bool = False,
    runs: int | None = None,
    workers: int | None = None,
    spread_s: float | None = None,
    modes: list[tuple[str, bool]] | None = None,
    vacuum: bool = True,
) -> dict[str, Any]:
    """``spread_s``, ``modes`` and ``vacuum`` (from Python only): the spread window of the
    spread rows, which (queue, spread?) pairs to run, and whether the tables are vacuumed and
    analyzed once the timers are written (False: as the setup left them; with autovacuum off,
    dead rows and the planner statistics of the empty template)."""
    n = runs or (100 if quick else 100_000)
    o: dict[str, Any] = {
        "runs": n,
        "workers": workers or 2,
        "spread_s": spread_s or (2.0 if quick else 60.0),
        "calibration": max(20, min(2_000, n // 50)),
        "margin_s": POLL_S + (3.0 if quick else 20.0),
        "sample_s": 0.1 if quick else 0.25,
        "lanes": LANES,
        "claim_batch": CLAIM_BATCH,
        "poll_s": POLL_S,
        "sweep_s": SWEEP_S,
        "vacuum": vacuum,
    }
    lim = SweepLimits()
    res: dict[str, Any] = {
        "bench": "monday",
        "options": o,
        "sweep_limits": lim.__dict__,
        # at most this many timers of one organisation per sweep tick
        "sweep_per_tick_one_org": lim.per_org * lim.max_batches,
    }
    dbs = TemporaryDatabases(admin_url, tag=f"bench_monday_{secrets.token_hex(3)}")
    dbs.prepare_template()
    try:
        res["modes"] = [
            _mode(dbs, queue, o["spread_s"] if spread else 0.0, o)
            for queue, spread in (modes or MODES)
        ]
        res["ceiling"] = _fire_ceiling(dbs, n)
    finally:
        dbs.drop_template()
    ceiling = res["ceiling"]["fired_per_s"]
    for m in res["modes"]:
        m["peak_to_ceiling"] = round(m["peak_fired_per_s"] / ceiling, 3) if ceiling else None
        if m["spread_s"] > 0:
            m["timers_per_s_of_window"] = round(n / m["spread_s"], 1)
    spread_fast = [m for m in res["modes"] if m["queue"] == "postgres" and m["spread_s"] > 0]
    res["targets"] = {
        "spread_p99_ms_below": 1000.0,
        "spread_p99_ok": bool(spread_fast)
        and all(m["lateness_ms_p99"] < 1000.0 for m in spread_fast),
    }
    return res


def render(res: dict[str, Any]) -> str:
    o = res["options"]
    lines = [
        f"monday: {o['runs']:,} runs wait for the same instant (a weekly rule, {ZONE}, from the "
        f"database's clock); {o['workers']} worker processes (lane {o['lanes']}, claim batch "
        f"{o['claim_batch']}, poll and sweep every {o['sweep_s']:.0f} s); tables "
        + ("vacuumed and analyzed before T" if o.get("vacuum") else "as the setup left them"),
        "",
        f"{'mode':<22} {'spread':>6} {'late p50':>9} {'late p99':>9} {'late max':>9} "
        f"{'peak':>7} {'queue depth':>12} {'done p99':>9}  fired by",
        f"{'':<22} {'s':>6} {'ms':>9} {'ms':>9} {'ms':>9} {'fired/s':>7} {'max / p50':>12} "
        f"{'ms':>9}",
    ]
    for m in res["modes"]:
        name = "fast path (postgres)" if m["queue"] == "postgres" else "sweep-only (none)"
        spread = f"{m['spread_s']:.0f}" if m["spread_s"] else "off"
        depth = f"{m['queue_depth_max']:,} / {m['queue_depth_p50']:,.0f}"
        lines.append(
            f"{name:<22} {spread:>6} {m['lateness_ms_p50']:>9,.0f} {m['lateness_ms_p99']:>9,.0f} "
            f"{m['lateness_ms_max']:>9,.0f} {m['peak_fired_per_s']:>7,} {depth:>12} "
            f"{m['completed_ms_p99']:>9,.0f}  {m['fired_by']}"
        )
    c = res["ceiling"]
    lines.append("")
    lines.append(
        f"ceiling: onward's fire statement alone, one connection, batches of {c['batch']}: "
        f"{c['fired_per_s']:,.0f} timers/s; the sweep fires at most "
        f"{res['sweep_per_tick_one_org']:,} timers of one organisation per tick "
        f"({o['sweep_s']:.0f} s apart)"
    )
    for m in res["modes"]:
        name = "fast path" if m["queue"] == "postgres" else "sweep-only"
        spread = f"spread {m['spread_s']:.0f} s" if m["spread_s"] else "no spread"
        per_s = (
            f" ({m['timers_per_s_of_window']:,.0f} timers per second of window)"
            if m["spread_s"]
            else ""
        )
        lines.append(
            f"  {name}, {spread}{per_s}: instant {m['instant']} ({m['rule']!r}), timers "
            f"written {m['slack_s']:.0f} s before it ({m['starts_per_s']:.0f} starts/s); last "
            f"fired {m['last_fired_after_t_s']} s after T, all completed "
            f"{m['all_completed_after_t_s']} s after T; peak / ceiling "
            f"{m['peak_to_ceiling']:.2f}; completed p50 {m['completed_ms_p50']:,.0f} ms; "
            f"due unfired max {m['due_unfired_max']:,}, due wakes unsent max "
            f"{m['wakes_unsent_max']:,}; machine busy {(m['machine_busy'] or 0) * 100:.0f}%"
        )
    t = res["targets"]
    lines.append("")
    lines.append(
        f"target: with spread, fast path lateness p99 < {t['spread_p99_ms_below']:.0f} ms: "
        f"{'met' if t['spread_p99_ok'] else 'NOT met'}"
    )
    return "\n".join(lines)


__all__ = ["render", "run"]
