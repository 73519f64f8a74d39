"""``onward bench retention``: pruning 100,000 finished runs without slowing the workers.

A scratch database gets ``backlog`` finished runs (100,000; 5,000 with ``--quick``), finished 40
days ago, each with the rows a real two-step run leaves (a run, two ``set`` steps, four history
rows), written set-based with ``generate_series`` (:func:`fill`). The engine's worker and relay
run in this process, fed by a driver that keeps ``in_flight`` three-step runs going. One sitting,
windows of the same load, adjacent in time so the machine's drift cancels:

1. **before**: the organisation keeps finished runs forever; the workers' steps per second over
   ``window`` seconds (steps done in the window, by the database's clock).
2. then, the retention set to 30 days, alternately a window with a real elected ``Sweeper``
   running (its pruner with the default limits: 500 runs a batch, at most 8 batches and 0.5 s a
   tick, a tick every 2 s) and a window without it, until the backlog is gone: steps per
   second **pruning** versus **between**, and the prune rate (runs per second of pruning window);
3. **after**: the same load again, nothing left to prune (autovacuum of the deleted rows may run).

It prints the four steps/s side by side, the ratio pruning / between, the prune rate, the rows
deleted, and the EXPLAIN of one prune batch on the full backlog (taken first, rolled back).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import psycopg
from psycopg.rows import dict_row

from onward import Automation
from onward.bench.db import scratch_database
from onward.config import Settings
from onward.engine import Engine
from onward.retention import PruneLimits
from onward.retention import Q as RETENTION_Q
from onward.sweep import Sweeper
from onward.testing import eventually

AUTOMATION = "bench-finished"


def fill(
    conn: psycopg.Connection[Any], org_id: str, count: int, *, age_days: float, start: int = 0
) -> None:
    """``count`` runs of ``org_id`` that finished ``age_days`` ago (one second apart), each with
    the rows a real run of two ``set`` steps leaves: the run, its two steps, four history rows
    (``run_started``, the first step's ``step_ready``, each step's ``step_done`` -- the second
    claimed eagerly, the last one's with the run's completion). Set-based: one statement per
    table."""
    args = {"org": org_id, "a": AUTOMATION, "s": start, "e": start + count - 1, "age": age_days}
    conn.execute("INSERT INTO organisations (org_id) VALUES (%(org)s) ON CONFLICT DO NOTHING", args)
    conn.execute(
        """
        INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind,
                          status, input, ctx, visits, current_seq, steps_executed, max_steps,
                          deadline_at, created_at, updated_at, finished_at)
        SELECT %(org)s, 'run_' || %(org)s || '_' || lpad(g::text, 9, '0'), %(a)s, 1,
               %(a)s || ':evt-' || %(org)s || '-' || g, 'event', 'completed',
               jsonb_build_object('email', 'person' || g || '@example.com',
                                  'name', 'Person ' || g),
               jsonb_build_object('greeting', 'hello person ' || g, 'tag', 'customer'),
               '{"greet": 1, "tag": 1}', 2, 2, 1000, f.at + interval '30 days',
               f.at - interval '2 seconds', f.at, f.at
        FROM generate_series(%(s)s::int, %(e)s::int) AS g
        CROSS JOIN LATERAL (
            SELECT now() - %(age)s * interval '1 day' - g * interval '1 second' AS at
        ) AS f
        """,
        args,
    )
    conn.execute(
        """
        INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, status, attempt, owner,
                           available_at, output, created_at, updated_at, finished_at)
        SELECT r.org_id, r.run_id, s.seq, s.step_id, 'set', 'fast', 'done', 1, 'bench',
               r.created_at, jsonb_build_object(s.step_id, 'value of ' || r.run_id),
               r.created_at, r.finished_at, r.finished_at - (2 - s.seq) * interval '1 second'
        FROM runs r
        CROSS JOIN (VALUES (1, 'greet'), (2, 'tag')) AS s(seq, step_id)
        WHERE r.org_id = %(org)s AND r.automation_id = %(a)s
          AND r.run_id BETWEEN 'run_' || %(org)s || '_' || lpad(%(s)s::text, 9, '0')
                           AND 'run_' || %(org)s || '_' || lpad(%(e)s::text, 9, '0')
        """,
        args,
    )
    conn.execute(
        """
        INSERT INTO history_log (org_id, run_id, at, event, seq, step_id, attempt, worker,
                             claimed_at, detail)
        SELECT r.org_id, r.run_id, r.created_at + h.n * interval '200 milliseconds', h.event,
               h.seq, h.step_id, h.attempt, 'bench',
               CASE WHEN h.attempt IS NOT NULL
                    THEN r.created_at + (h.n - 1) * interval '200 milliseconds' END,
               CASE WHEN h.event = 'run_started'
                    THEN jsonb_build_object('start_key', r.start_key, 'kind', 'event')
                    WHEN h.n = 3 THEN '{"run": "completed"}'::jsonb END
        FROM runs r
        CROSS JOIN (VALUES
            (0, 'run_started', NULL, NULL, NULL), (1, 'step_ready', 1, 'greet', NULL),
            (2, 'step_done', 1, 'greet', 1), (3, 'step_done', 2, 'tag', 1)
        ) AS h(n, event, seq, step_id, attempt)
        WHERE r.org_id = %(org)s AND r.automation_id = %(a)s
          AND r.run_id BETWEEN 'run_' || %(org)s || '_' || lpad(%(s)s::text, 9, '0')
                           AND 'run_' || %(org)s || '_' || lpad(%(e)s::text, 9, '0')
        """,
        args,
    )
    conn.execute("ANALYZE runs, steps, history_log")


def explain_batch(conn: psycopg.Connection[Any], org_id: str, batch: int = 500) -> list[str]:
    """EXPLAIN (ANALYZE) of one prune batch -- the pick and the delete -- rolled back."""
    lines: list[str] = []
    with conn.transaction(force_rollback=True):
        cutoff = conn.execute("SELECT now() - interval '30 days' AS c").fetchone()
        assert cutoff is not None
        args = {"org_id": org_id, "cutoff": cutoff["c"], "limit": batch}
        for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + RETENTION_Q.pick, args):
            lines.append(r["QUERY PLAN"])
        ids = [r["run_id"] for r in conn.execute(RETENTION_Q.pick, args)]
        for r in conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) " + RETENTION_Q.delete_runs,
            {"org_id": org_id, "run_ids": ids},
        ):
            lines.append(r["QUERY PLAN"])
    return lines


def _flow() -> dict[str, Any]:
    return (
        Automation("bench-live")
        .step("s1", "set", values={"v1": "1"})
        .step("s2", "set", values={"v2": "2"})
        .step("s3", "set", values={"v3": "3"})
        .build()
    )


async def _count(engine: Engine, query: str, *args: Any) -> int:
    async with engine.pool.connection() as conn:
        row = await (await conn.execute(query, args)).fetchone()
    return int(next(iter(row.values()))) if row else 0


async def _drive(engine: Engine, stop: asyncio.Event, in_flight: int) -> int:
    """Keep about ``in_flight`` runs unfinished until ``stop``; returns how many it started."""
    started = 0
    while not stop.is_set():
        unfinished = await _count(
            engine,
            "SELECT count(*) FROM runs WHERE finished_at IS NULL AND org_id = %s",
            engine.org_id,
        )
        for _ in range(max(0, in_flight - unfinished)):
            await engine.start("bench-live", {"n": started}, event_id=f"live-{started}")
            started += 1
        await asyncio.sleep(0.05)  # load shaping: top the runs up twenty times a second
    return started


async def _steps_done_between(engine: Engine, t0: Any, t1: Any) -> int:
    return await _count(
        engine,
        "SELECT count(*) FROM steps WHERE org_id = %s AND status = 'done' "
        "AND finished_at >= %s AND finished_at < %s",
        engine.org_id,
        t0,
        t1,
    )


async def _db_now(engine: Engine) -> Any:
    async with engine.pool.connection() as conn:
        row = await (await conn.execute("SELECT clock_timestamp() AS t")).fetchone()
    assert row is not None
    return row["t"]


async def _measure(engine: Engine, seconds: float, busy: Any = None) -> tuple[int, float]:
    """Steps done by the workers over ``seconds`` (database clock), while ``busy`` (a coroutine
    that runs until the window ends) runs beside them."""
    t0 = await _db_now(engine)
    if busy is None:
        await asyncio.sleep(seconds)  # a measuring window of the same load
    else:
        await busy
    t1 = await _db_now(engine)
    return await _steps_done_between(engine, t0, t1), (t1 - t0).total_seconds()


async def _run(url: str, *, backlog: int, window: float, in_flight: int) -> dict[str, Any]:
    settings = Settings(
        database_url=url, org_id="bench", queue="postgres", poll_seconds=0.5
    )  # the sweep every 2 s, as by default
    t_fill = time.monotonic()
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        fill(conn, "bench", backlog, age_days=40)
        explain = explain_batch(conn, "bench")
    fill_s = time.monotonic() - t_fill
    on = [0, 0.0]  # steps, seconds with the pruning sweeper running
    off = [0, 0.0]  # the windows between them, nothing pruned
    async with Engine.open(settings, migrate=False) as engine:
        await engine.publish(_flow())
        await engine.set_retention(keep_forever=True)
        stop = asyncio.Event()
        sweeper = Sweeper(
            engine.pool,
            worker_id="bench-sweeper",
            interval=settings.sweep_seconds,
            retention_days=settings.retention_days,
            prune_limits=PruneLimits(idle_seconds=0.5),
        )

        async def sweeping(seconds: float) -> None:
            """The elected sweeper, pruning, for ``seconds`` (or until the backlog is gone)."""
            sweep_stop = asyncio.Event()
            task = asyncio.create_task(sweeper.run(sweep_stop))

            async def done() -> bool:
                return sweeper.pruner.stats.runs >= backlog

            with contextlib.suppress(AssertionError):  # the window ended first
                await eventually(done, timeout=seconds, interval=0.1, what="backlog pruned")
            sweep_stop.set()
            await task

        async with engine.running(sweeper=False):
            driver = asyncio.create_task(_drive(engine, stop, in_flight))
            try:
                await asyncio.sleep(2.0)  # warm-up: the workers reach their pace first
                before = await _measure(engine, window)
                await engine.set_retention(30)
                while sweeper.pruner.stats.runs < backlog:
                    steps, secs = await _measure(engine, window, sweeping(window))
                    on[0], on[1] = on[0] + steps, on[1] + secs
                    steps, secs = await _measure(engine, window)
                    off[0], off[1] = off[0] + steps, off[1] + secs
                after = await _measure(engine, window)
            finally:
                stop.set()
                started = await driver
        left = await _count(
            engine,
            "SELECT count(*) FROM runs WHERE org_id = %s AND automation_id = %s",
            engine.org_id,
            AUTOMATION,
        )
    stats = sweeper.pruner.stats

    def phase(steps: float, secs: float) -> dict[str, Any]:
        return {
            "steps": int(steps),
            "seconds": round(secs, 1),
            "steps_per_s": round(steps / secs, 1) if secs else 0.0,
        }

    on_rate = on[0] / on[1] if on[1] else 0.0
    off_rate = off[0] / off[1] if off[1] else 0.0
    return {
        "backlog": backlog,
        "fill_seconds": round(fill_s, 1),
        "window_seconds": window,
        "live_runs_started": started,
        "before": phase(*before),
        "pruning": phase(*on),
        "between": phase(*off),
        "after": phase(*after),
        "ratio": round(on_rate / off_rate, 3) if off_rate else None,
        "pruned": stats.runs,
        "batches": stats.batches,
        "prune_runs_per_s": round(stats.runs / on[1], 1) if on[1] else None,
        "pruner_busy_seconds": round(stats.seconds, 1),
        "rows_deleted": dict(stats.rows),
        "left": left,
        "explain": explain,
    }


def run(database_url: str, *, quick: bool = False, **options: Any) -> dict[str, Any]:
    backlog = int(options.get("runs") or (5_000 if quick else 100_000))
    with scratch_database(database_url, "retention") as url:
        return asyncio.run(_run(url, backlog=backlog, window=2.0 if quick else 6.0, in_flight=50))


def render(res: dict[str, Any]) -> str:
    plan = [line for line in res["explain"] if "Scan" in line or "Execution" in line]
    rows = [
        f"{'workers (3-step runs)':<34} {'steps':>7} {'seconds':>8} {'steps/s':>8}",
        *(
            f"{label:<34} {res[key]['steps']:>7} {res[key]['seconds']:>8} "
            f"{res[key]['steps_per_s']:>8}"
            for key, label in (
                ("before", "before (nothing pruned)"),
                ("pruning", f"pruning ({res['window_seconds']:g} s windows)"),
                ("between", "between them (nothing pruned)"),
                ("after", "after (nothing left)"),
            )
        ),
    ]
    return "\n".join(
        [
            f"backlog: {res['backlog']:,} finished runs (2 steps, 4 history rows each), written "
            f"in {res['fill_seconds']}s",
            *rows,
            f"steps/s pruning / between: {res['ratio']}",
            f"pruned {res['pruned']:,} runs in {res['batches']} batches: "
            f"{res['prune_runs_per_s']} runs/s while the sweeper ran (its pruner busy "
            f"{res['pruner_busy_seconds']}s); rows {res['rows_deleted']}; left {res['left']}",
            "one batch's plan (the scans):",
            *("  " + line.strip() for line in plan),
        ]
    )
