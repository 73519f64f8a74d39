"""``onward bench retention``: pruning 100,000 finished runs without slowing the workers.

A scratch database gets ``backlog`` finished runs (100,000; 5,000 with ``--quick``), finished 40
days ago, each with the rows a real two-step run leaves (a run, two ``set`` steps, eight history
rows), written set-based with ``generate_series`` (:func:`fill`). The engine's worker and relay
run in this process, fed by a driver that keeps ``in_flight`` three-step runs going. One sitting,
two phases of the same load:

1. **Without pruning**: the organisation keeps finished runs forever; the workers' steps per
   second over ``window`` seconds (steps done in the window, by the database's clock).
2. **During pruning**: a real elected ``Sweeper`` whose pruner has the default limits (500 runs
   a batch, a tick time-boxed to 0.5 s) and the organisation's retention set to 30 days; the
   same steps per second, while the backlog is deleted, and the prune rate (runs per second
   from the first batch to the last).

It prints both steps/s side by side with their ratio, the prune rate and the rows deleted, and
the EXPLAIN of one prune batch on the full backlog (taken before phase 2, rolled back).
"""

from __future__ import annotations

import asyncio
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
    the rows a real run of two ``set`` steps leaves: the run, its two steps, eight history rows
    (``run_started``, per step ``step_ready``, ``step_claimed``, ``step_done``,
    ``run_completed``). Set-based: one statement per table."""
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
        INSERT INTO history (org_id, run_id, at, event, seq, step_id, attempt, worker, detail)
        SELECT r.org_id, r.run_id, r.created_at + h.n * interval '200 milliseconds', h.event,
               h.seq, h.step_id, h.attempt, 'bench',
               CASE WHEN h.event = 'run_started'
                    THEN jsonb_build_object('start_key', r.start_key, 'kind', 'event') END
        FROM runs r
        CROSS JOIN (VALUES
            (0, 'run_started', NULL, NULL, NULL), (1, 'step_ready', 1, 'greet', NULL),
            (2, 'step_claimed', 1, 'greet', 1), (3, 'step_done', 1, 'greet', 1),
            (4, 'step_ready', 2, 'tag', NULL), (5, 'step_claimed', 2, 'tag', 1),
            (6, 'step_done', 2, 'tag', 1), (7, 'run_completed', NULL, NULL, NULL)
        ) AS h(n, event, seq, step_id, attempt)
        WHERE r.org_id = %(org)s AND r.automation_id = %(a)s
          AND r.run_id BETWEEN 'run_' || %(org)s || '_' || lpad(%(s)s::text, 9, '0')
                           AND 'run_' || %(org)s || '_' || lpad(%(e)s::text, 9, '0')
        """,
        args,
    )
    conn.execute("ANALYZE runs, steps, history")


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


async def _run(url: str, *, backlog: int, window: float, in_flight: int) -> dict[str, Any]:
    settings = Settings(
        database_url=url, org_id="bench", queue="postgres", poll_seconds=0.5, sweep_seconds=1.0
    )
    t_fill = time.monotonic()
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        fill(conn, "bench", backlog, age_days=40)
        explain = explain_batch(conn, "bench")
    fill_s = time.monotonic() - t_fill
    async with Engine.open(settings, migrate=False) as engine:
        await engine.publish(_flow())
        await engine.set_retention(keep_forever=True)
        stop = asyncio.Event()
        async with engine.running(sweeper=False):
            driver = asyncio.create_task(_drive(engine, stop, in_flight))
            try:
                await asyncio.sleep(2.0)  # warm-up: the workers reach their pace first
                t0 = await _db_now(engine)
                await asyncio.sleep(window)  # phase 1: the same load, nothing pruned
                t1 = await _db_now(engine)
                alone = await _steps_done_between(engine, t0, t1)
                alone_s = (t1 - t0).total_seconds()

                await engine.set_retention(30)
                sweeper = Sweeper(
                    engine.pool,
                    worker_id="bench-sweeper",
                    interval=settings.sweep_seconds,
                    retention_days=settings.retention_days,
                    prune_limits=PruneLimits(idle_seconds=0.5),
                )
                sweep_stop = asyncio.Event()
                sweep_task = asyncio.create_task(sweeper.run(sweep_stop))
                p0 = await _db_now(engine)

                async def all_pruned() -> bool:
                    return sweeper.pruner.stats.runs >= backlog

                await eventually(all_pruned, timeout=600, interval=0.1, what="backlog pruned")
                p1 = await _db_now(engine)
                sweep_stop.set()
                await sweep_task
                during = await _steps_done_between(engine, p0, p1)
                during_s = (p1 - p0).total_seconds()
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
    alone_rate = alone / alone_s if alone_s else 0.0
    during_rate = during / during_s if during_s else 0.0
    return {
        "backlog": backlog,
        "fill_seconds": round(fill_s, 1),
        "live_runs_started": started,
        "without_pruning": {
            "steps": alone,
            "seconds": round(alone_s, 1),
            "steps_per_s": round(alone_rate, 1),
        },
        "during_pruning": {
            "steps": during,
            "seconds": round(during_s, 1),
            "steps_per_s": round(during_rate, 1),
        },
        "ratio": round(during_rate / alone_rate, 3) if alone_rate else None,
        "pruned": stats.runs,
        "batches": stats.batches,
        "prune_runs_per_s": round(stats.runs / during_s, 1) if during_s else None,
        "pruner_busy_seconds": round(stats.seconds, 1),
        "rows_deleted": dict(stats.rows),
        "left": left,
        "explain": explain,
    }


def run(database_url: str, *, quick: bool = False, **options: Any) -> dict[str, Any]:
    backlog = int(options.get("runs") or (5_000 if quick else 100_000))
    with scratch_database(database_url, "retention") as url:
        return asyncio.run(_run(url, backlog=backlog, window=3.0 if quick else 10.0, in_flight=50))


def render(res: dict[str, Any]) -> str:
    a, d = res["without_pruning"], res["during_pruning"]
    plan = [line for line in res["explain"] if "Scan" in line or "Execution" in line]
    return "\n".join(
        [
            f"backlog: {res['backlog']:,} finished runs (2 steps, 8 history rows each), written "
            f"in {res['fill_seconds']}s",
            f"{'workers (3-step runs)':<26} {'steps':>8} {'seconds':>8} {'steps/s':>9}",
            f"{'without pruning':<26} {a['steps']:>8} {a['seconds']:>8} {a['steps_per_s']:>9}",
            f"{'during pruning':<26} {d['steps']:>8} {d['seconds']:>8} {d['steps_per_s']:>9}",
            f"during / without: {res['ratio']}",
            f"pruned {res['pruned']:,} runs in {res['batches']} batches: "
            f"{res['prune_runs_per_s']} runs/s (the pruner busy {res['pruner_busy_seconds']}s); "
            f"rows {res['rows_deleted']}; left {res['left']}",
            "one batch's plan (the scans):",
            *("  " + line.strip() for line in plan),
        ]
    )
