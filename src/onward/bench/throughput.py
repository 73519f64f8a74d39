"""``onward bench throughput``: steps per second of W worker processes, beside the ceiling.

One sitting, on a scratch database, in this order:

1. **starts**: N runs (10,000 unless ``--runs``) of a 3-step automation of no-op ``set`` steps
   are started through the library (``Engine.start``, ``starters`` at once) while W worker
   processes wait, idle.
2. **drain**: the workers (lane ``fast`` only, a big claim batch, eager continuation, relay and
   sweeper on, as ``onward worker`` runs them) are told to go and drain the N runs. Measured:
   steps/s, runs/s, each run's latency from its first claim to its completion, commits per
   step (``pg_stat_database.xact_commit`` of the scratch database: every transaction, read-only
   ones too), write transactions per step (``txid_current()`` deltas, cluster-wide), WAL bytes
   per step (and, where ``pg_walinspect`` can be installed, by relation: which rows and which
   index entries the bytes are), CPU milliseconds per step of the workers and of the server,
   and each worker's peak RSS (``VmHWM``).
3. **ceiling**: the same number of claim/settle transactions issued by a plain psycopg loop
   (W processes x C connections, the connections the workers hold): minimal statements on a
   steps-shaped scratch table (median of ``reps``), then onward's own claim and settle SQL
   replayed on real runs without the worker around it (the database's share of the engine).
   pgbench runs the same two statements at 1, W and W x C clients.
4. **live**: W fresh workers run while N more runs are started: start-to-completion latency.
5. **alternations** (``--pairs``, 3 unless quick): drain, grouped ceiling and live run twice
   more, each drain and live run on organisations of their own; the goals of the hot path
   (``GOAL_*``: drain over grouped ceiling, live over drain, WAL bytes, history rows and
   commits a step, worker RSS) are judged on the medians, each ratio taken within its own
   alternation -- a shared machine drifts by tens of percent between minutes, and one drain
   beside one ceiling said more about the minute than about the engine. Each drain (the
   sitting's own too) runs between two grouped ceilings, and its ratio is taken against their
   mean (``_around``).

Before each drain the started runs' tables are vacuumed and analysed, as the ceiling's table
is (statistics and a visibility map, as autovacuum keeps them in production). Each drain and
each ceiling tier begins with a ``CHECKPOINT`` (``ceiling.checkpoint``), so no checkpoint
(timed, or for the WAL's volume) falls into its few seconds and makes the pages it touches
whole-page WAL records: the WAL a step is the engine's rows, not the minute's (each drain's
full-page images are printed still).

The ratio printed is engine steps/s over the minimal loop's steps/s.

**A scaling curve** (``--workers 1,2,4,8``, ``run(..., curve=[1, 2, 4, 8])``): instead of the
sitting above, the drain (2.) at each worker count in turn, each beside the grouped ceiling
(the plain loop settling a claimed batch's steps in one statement each) with as many
processes and connections, printing per point steps/s, commits per step and PostgreSQL's CPU
share: the server's CPU seconds over wall seconds over the machine's cores (the share of the
machine the server used; every PostgreSQL process on the machine is counted, so other load on
a shared server shows in it). Where more workers stop adding steps/s while the server's share
stops growing, PostgreSQL (or the machine) is saturated. Connections per worker shrink as
workers grow (at most 10, ``CURVE_CONNECTIONS`` over all workers), so 8 workers stay within
the server's ``max_connections``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from onward import ids
from onward.automations.builder import Automation
from onward.bench import median, percentile
from onward.bench.ceiling import (
    CpuSnap,
    DbCounters,
    checkpoint,
    cpu_delta,
    cpu_snapshot,
    db_counters,
    db_delta,
    find_pgbench,
    pgbench,
    polling,
    prepare_minimal,
    prepare_pgbench,
    settle_stats,
    table_delta,
    vm_kb,
    wal_by_relation,
    wal_full_pages,
)
from onward.bench.db import scratch_database, server
from onward.bench.proc import Child, warm_pool
from onward.config import Settings, env_start_batches
from onward.engine import Engine
from onward.start import Q as START_Q

AUTOMATION = "bench-throughput"
STEPS = 3
FLOW = (
    Automation(AUTOMATION)
    .step("s1", "set", values={"v1": "1"})
    .step("s2", "set", values={"v2": "2"})
    .step("s3", "set", values={"v3": "3"})
    .build()
)
TARGET_STEPS_PER_S = 1500.0
TARGET_RSS_MB = 150.0
# The goals of the hot path (README, "Performance"), judged on the medians of the alternations:
# the drain beside the grouped ceiling and the live run beside the drain, each ratio taken
# within one alternation (a shared machine drifts between them), and the bytes and commits a
# step of the drains.
GOAL_DRAIN_OVER_GROUPED = 0.6
GOAL_LIVE_OVER_DRAIN = 0.6
GOAL_WAL_BYTES_PER_STEP = 1200.0
GOAL_HISTORY_ROWS_PER_STEP = 1.1
GOAL_COMMITS_PER_STEP = 0.1
GOAL_WORKER_RSS_MB = 100.0
CURVE_CONNECTIONS = 32  # pool connections of all the workers of a curve point together


def _settings(url: str, org: str) -> Settings:
    return Settings(
        database_url=url, org_id=org, queue="postgres", start_batches=env_start_batches()
    )


# -- starting runs through the library ---------------------------------------------------------


async def _start_many(
    engine: Engine, n: int, concurrency: int, prefix: str, latencies: list[float]
) -> None:
    counter = iter(range(n))

    async def one_client() -> None:
        for i in counter:
            t0 = time.perf_counter()
            await engine.start(AUTOMATION, {"i": i}, event_id=f"{prefix}{i}")
            latencies.append((time.perf_counter() - t0) * 1000.0)

    await asyncio.gather(*(one_client() for _ in range(concurrency)))


async def _publish(url: str, orgs: list[str]) -> None:
    for org in orgs:
        async with Engine.open(_settings(url, org), migrate=False, start_queue=False) as engine:
            await engine.publish(FLOW)


async def _starts(url: str, org: str, n: int, concurrency: int, pool: int) -> dict[str, Any]:
    async with Engine.open(
        _settings(url, org), migrate=False, pool_size=pool, start_queue=False
    ) as engine:
        await warm_pool(engine.pool, pool)
        await engine.start(AUTOMATION, {"i": -1}, event_id="e-1")  # the first of the N: warm-up
        lat: list[float] = []
        t0 = time.perf_counter()
        await _start_many(engine, n - 1, concurrency, "e", lat)
        elapsed = time.perf_counter() - t0
    return {
        "starts": n - 1,
        "concurrency": concurrency,
        "elapsed_s": round(elapsed, 3),
        "starts_per_s": round((n - 1) / elapsed, 1),
        "latency_ms_p50": round(median(lat), 2),
        "latency_ms_p99": round(percentile(lat, 99), 2),
    }


# -- worker processes ----------------------------------------------------------------------------


def _spawn_workers(url: str, org: str, o: dict[str, Any]) -> list[Child]:
    args = [
        "worker",
        "--url",
        url,
        "--org",
        org,
        "--lanes",
        f"fast={o['capacity']}",
        "--batch",
        str(o["batch"]),
        "--pool",
        str(o["conns"]),
        "--automation",
        AUTOMATION,
        "--count-sql",
    ]
    if o.get("metrics"):  # onward bench metrics: counting on or off, scraped or not
        args += ["--metrics", o["metrics"]]
    if o.get("metrics_port") is not None:
        args += ["--metrics-port", str(o["metrics_port"])]
    for what in o.get("what_if") or []:
        for part in what.split("+"):  # "a+b": both changes at once
            args += ["--what-if", part]
    children = [Child(*args) for _ in range(o["workers"])]
    for c in children:
        c.wait_ready()
    return children


def _wait_finished(poll: Any, org: str, timeout: float) -> None:
    # EXISTS, not count(*): a count read every unfinished run (10,000 at the start) a hundred
    # times a second, the bench's own load on the two cores the engine is measured on; EXISTS
    # stops at the first one it finds.
    deadline = time.monotonic() + timeout
    while True:
        left = poll.scalar(
            "SELECT EXISTS (SELECT 1 FROM runs WHERE org_id = %s AND finished_at IS NULL)", (org,)
        )
        if not left:
            return
        if time.monotonic() > deadline:
            unfinished = poll.scalar(
                "SELECT count(*) FROM runs WHERE org_id = %s AND finished_at IS NULL", (org,)
            )
            raise TimeoutError(f"{unfinished} runs of {org!r} unfinished after {timeout:.0f}s")
        time.sleep(0.01)


# the tables a drain reads and writes (history_log: the start's rows)
DRAIN_TABLES = ("runs", "steps", "outbox", "history_log")


def _vacuum_analyze(url: str) -> None:
    """The drain's tables as the grouped ceiling's is (prepare_minimal) and as autovacuum keeps
    them in production: with statistics and a visibility map. Without, the first drain of a
    sitting ran on tables the planner had never seen 10,000 runs in (2026-12-07: 7,245 steps/s
    where the next two drained 10,966 and 11,751), and every ratio to it was skewed.

    The live run begins from the same state (``_live``): it followed the drain and the grouped
    ceiling, whose dead rows autovacuum would have removed in production -- but the server
    these benches run on may have autovacuum off (this workplace's has), and then the live run
    read and pruned the drain's dead versions on its own clock: 7,464-7,761 steps/s without
    this, 8,129-8,549 with it, in one sitting of 2026-12-07 (three alternations each)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {', '.join(DRAIN_TABLES)}")


def _drain(url: str, o: dict[str, Any], org: str = "bench") -> dict[str, Any]:
    n = o["runs"]
    checkpointed = checkpoint(url)  # none falls into the drain (ceiling.checkpoint)
    children = _spawn_workers(url, org, o)
    try:
        starts = asyncio.run(_starts(url, org, n, o["starters"], o["conns"]))
        _vacuum_analyze(url)
        settle_stats()
        db0 = db_counters(url)
        with psycopg.connect(url, autocommit=True) as conn:  # events from here on are the drain's
            ev0 = conn.execute("SELECT last_value FROM history_event_id_seq").fetchone()
        with polling(url) as poll:
            cpu0 = cpu_snapshot()
            for c in children:
                c.send("go")
            _wait_finished(poll, org, timeout=120 + n * 0.05)
            cpu1 = cpu_snapshot()
            hwm = [round(_hwm_mb(c.pid), 1) for c in children]
        for c in children:
            c.send("stop")
        done = [c.finish() for c in children]
    finally:
        for c in children:
            c.kill()
    settle_stats()
    db1 = db_counters(url)
    commits = db_delta(db0, db1, own=poll.count)
    tables0 = db0.tables
    cpu = cpu_delta(cpu0, cpu1)
    with psycopg.connect(url, autocommit=True) as conn:
        steps = conn.execute(
            "SELECT count(*) FROM steps WHERE org_id = %s AND status = 'done'", (org,)
        ).fetchone()
        lat_rows = conn.execute(
            """
            SELECT extract(epoch FROM r.finished_at - c.at)::float8 * 1000,
                   c.at, r.finished_at
            FROM runs r
            JOIN LATERAL (
                SELECT min(h.claimed_at) AS at FROM history h
                WHERE h.org_id = r.org_id AND h.run_id = r.run_id AND h.seq = 1
            ) c ON true
            WHERE r.org_id = %s
            """,
            (org,),
        ).fetchall()
        # a step's settle event is its step row's since migration 0029 (the view `history`);
        # history_log's rows are the events transitions still write apart
        events = conn.execute(
            "SELECT count(*) FROM history WHERE org_id = %s AND event_id > %s",
            (org, ev0[0] if ev0 else 0),
        ).fetchone()
    executed = int(steps[0]) if steps else 0
    lat = [r[0] for r in lat_rows]
    tables = table_delta(tables0, db1.tables, executed)
    db_window = (
        (max(r[2] for r in lat_rows) - min(r[1] for r in lat_rows)).total_seconds()
        if lat_rows
        else 0.0
    )
    elapsed = cpu["wall_s"]
    worker_cpu = sum(d["cpu_s"] for d in done)
    stats = [d["stats"] for d in done]
    return {
        "starts": starts,
        "engine": {
            "runs": n,
            "steps": executed,
            "elapsed_s": round(elapsed, 3),
            "db_window_s": round(db_window, 3),
            "steps_per_s": round(executed / elapsed, 1),
            "runs_per_s": round(n / elapsed, 1),
            "tx_per_s": round(commits["commits"] / elapsed, 1),
            "run_latency_ms_p50": round(median(lat), 1),
            "run_latency_ms_p99": round(percentile(lat, 99), 1),
            **_per_step(commits, cpu, worker_cpu, executed),
            "claimed": sum(s["claimed"] for s in stats),
            "eager": sum(s["eager"] for s in stats),
            "lost": sum(s["lost"] for s in stats),
            "relayed": sum(d["relayed"] for d in done),
            "worker_rss_mb": [round(d["vm_hwm_kb"] / 1024, 1) for d in done] or hwm,
            "statements": _merge_statements([d.get("statements") or {} for d in done], executed),
            "tables": tables,
            "history_events_per_step": round(int(events[0]) / max(executed, 1), 3) if events else 0,
            "history_rows_per_step": (  # the table was `history` before migration 0029
                tables.get("history_log") or tables.get("history") or {}
            ).get("ins_per_step", 0.0),
            **_wal_records(url, db0, db1, executed),
            "checkpoint_before": checkpointed,
        },
    }


def _wal_records(url: str, db0: DbCounters, db1: DbCounters, steps: int) -> dict[str, Any]:
    """The drain's WAL by relation and its full-page images (pg_walinspect), and why not when
    they could not be read (printed, so a missing breakdown names its cause)."""
    by_rel = wal_by_relation(url, db0, db1, steps)
    fpi = wal_full_pages(url, db0, db1, steps)
    return {
        "wal_by_relation": by_rel if isinstance(by_rel, dict) else {},
        "wal_full_page_bytes_per_step": fpi if isinstance(fpi, float) else None,
        "wal_inspect_error": next((x for x in (by_rel, fpi) if isinstance(x, str)), None),
    }


def _merge_statements(reports: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Statements the workers sent while the clock ran, per step, and the mean time awaited."""
    total: dict[str, list[float]] = {}
    for rep in reports:
        for label, v in rep.items():
            t = total.setdefault(label, [0, 0.0])
            t[0] += v["n"]
            t[1] += v["ms"]
    s = max(steps, 1)
    return {
        label: {"n": int(n), "per_step": round(n / s, 3), "ms_avg": round(ms / max(n, 1), 3)}
        for label, (n, ms) in sorted(total.items(), key=lambda kv: -kv[1][0])
    }


def _hwm_mb(pid: int) -> float:
    return vm_kb(pid, "VmHWM") / 1024


def _per_step(
    commits: dict[str, int], cpu: dict[str, Any], client_cpu: float, steps: int
) -> dict[str, Any]:
    s = max(steps, 1)
    return {
        "commits": commits["commits"],
        "commits_per_step": round(commits["commits"] / s, 3),
        "xids_per_step": round(commits["xids"] / s, 3),
        "wal_bytes_per_step": round(commits["wal_bytes"] / s),
        "client_cpu_ms_per_step": round(client_cpu * 1000 / s, 3),
        "pg_cpu_ms_per_step": round(cpu["pg_cpu_s"] * 1000 / s, 3),
        "machine_busy": cpu["machine_busy"],
    }


# -- the ceiling loops ---------------------------------------------------------------------------


def _prepare_replay(url: str, n: int, rep: int) -> None:
    """N real runs (lane ``io``, org ``replay``) for onward's own SQL to drain, made in one
    transaction with the start statement itself; their wakes are marked sent (no relay runs)."""
    args = [
        {
            "org_id": "replay",
            "run_id": ids.new_run_id(),
            "automation_id": "bench-replay",
            "version": 1,
            "start_key": f"replay:{rep}:{i}",
            "start_key_kind": "caller",
            "input": Jsonb({"i": i}),
            "step_id": "s1",
            "kind": "set",
            "lane": "io",
            "max_steps": 1000,
            "max_age": 86400.0,
            "contact_id": None,
            "traceparent": None,
        }
        for i in range(n)
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        # the start statement reads the version's first step (s1, lane io) from its row
        conn.execute(
            """INSERT INTO automations (org_id, automation_id, latest_version)
               VALUES ('replay', 'bench-replay', 1) ON CONFLICT DO NOTHING"""
        )
        conn.execute(
            """INSERT INTO automation_versions (org_id, automation_id, version, digest, document,
                   start_step_id, start_kind, start_lane, max_steps, max_age_s)
               VALUES ('replay', 'bench-replay', 1, 'replay', '{}', 's1', 'set', 'io', 1000,
                       86400) ON CONFLICT DO NOTHING"""
        )
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(START_Q.start_run, args)
        conn.execute(
            "UPDATE outbox SET sent_at = now() WHERE org_id = 'replay' AND sent_at IS NULL"
        )
        conn.execute("ANALYZE steps")


def _loop_tier(url: str, kind: str, o: dict[str, Any], rep: int) -> dict[str, Any]:
    n = o["runs"]
    checkpoint(url)  # as before a drain: its WAL beside the drain's, no checkpoint in either
    if kind in ("minimal", "grouped"):
        prepare_minimal(url, n)
    else:
        _prepare_replay(url, n, rep)
    args = [
        "loop",
        "--url",
        url,
        "--kind",
        kind,
        "--conns",
        str(o["conns"]),
        "--batch",
        str(o["loop_batch"]),
        "--steps",
        str(STEPS),
    ]
    children = [Child(*args) for _ in range(o["workers"])]
    try:
        for c in children:
            c.wait_ready()
        settle_stats()
        db0 = db_counters(url)
        cpu0 = cpu_snapshot()
        for c in children:
            c.send("go")
        drained = [c.expect("drained", timeout=120 + n * 0.05) for c in children]
        cpu1 = cpu_snapshot()
        for c in children:
            c.send("stop")
        done = [c.finish() for c in children]
    finally:
        for c in children:
            c.kill()
    settle_stats()
    db1 = db_counters(url)
    commits = db_delta(db0, db1)
    cpu = cpu_delta(cpu0, cpu1)
    steps = sum(d["steps"] for d in done)
    tables = table_delta(db0.tables, db1.tables, steps)
    elapsed = max(d["elapsed_s"] for d in drained)
    return {
        "kind": kind,
        "conns": o["workers"] * o["conns"],
        "steps": steps,
        "claims": sum(d["claims"] for d in done),
        "elapsed_s": round(elapsed, 3),
        "steps_per_s": round(steps / elapsed, 1),
        "tx_per_s": round(commits["commits"] / elapsed, 1),
        **_per_step(commits, cpu, sum(d["cpu_s"] for d in done), steps),
        "tables": tables,
    }


# -- live: starts and drain at once ----------------------------------------------------------


async def _live_starts(
    url: str, org: str, n: int, concurrency: int, pool: int, go: Callable[[], None]
) -> tuple[float, float, CpuSnap]:
    """The starter's engine opened and its pool warm, as the workers' are, before the clock:
    then ``go()`` (the workers begin) and the starts. Returns the clock's start, the starts'
    seconds and the machine's CPU reading at the clock's start."""
    async with Engine.open(
        _settings(url, org), migrate=False, pool_size=pool, start_queue=False
    ) as engine:
        await warm_pool(engine.pool, pool)
        lat: list[float] = []
        cpu0 = cpu_snapshot()
        t0 = time.perf_counter()
        go()
        await _start_many(engine, n, concurrency, "l", lat)
        return t0, time.perf_counter() - t0, cpu0


def _live(url: str, o: dict[str, Any], org: str = "live") -> dict[str, Any]:
    n = o["runs"]
    _vacuum_analyze(url)  # as before the drain: no dead rows of the phases before on its clock
    children = _spawn_workers(url, org, o)

    def go() -> None:
        for c in children:
            c.send("go")

    try:
        t0, start_s, cpu0 = asyncio.run(_live_starts(url, org, n, o["starters"], o["conns"], go))
        with polling(url) as poll:
            _wait_finished(poll, org, timeout=120 + n * 0.05)
        elapsed = time.perf_counter() - t0
        busy = cpu_delta(cpu0, cpu_snapshot())["machine_busy"]
        for c in children:
            c.send("stop")
        for c in children:
            c.finish()
    finally:
        for c in children:
            c.kill()
    with psycopg.connect(url, autocommit=True) as conn:
        lat = [
            r[0]
            for r in conn.execute(
                "SELECT extract(epoch FROM finished_at - created_at)::float8 * 1000 FROM runs "
                "WHERE org_id = %s",
                (org,),
            )
        ]
    return {
        "runs": n,
        "elapsed_s": round(elapsed, 3),
        "starts_per_s": round(n / start_s, 1),
        "runs_per_s": round(n / elapsed, 1),
        "steps_per_s": round(n * STEPS / elapsed, 1),
        "latency_ms_p50": round(median(lat), 1),
        "latency_ms_p99": round(percentile(lat, 99), 1),
        "machine_busy": busy,
    }


def _around(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The grouped ceiling of one alternation: the mean of the tiers measured just before and
    just after its drain. A shared machine drifts by tens of percent between minutes; one tier
    taken half a minute after the drain (as until 2026-12-07) read 18,363 to 28,191 steps/s in
    one sitting, and that spread alone moved a drain's ratio from 0.39 to 0.63."""
    b, a = before["steps_per_s"], after["steps_per_s"]
    return {"steps_per_s": round((b + a) / 2, 1), "before_steps_per_s": b, "after_steps_per_s": a}


def _goals(
    alternations: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]],
) -> dict[str, Any]:
    """Each alternation's figures, their medians, and whether each goal is met by them."""
    rows = [
        {
            "drain_steps_per_s": d["steps_per_s"],
            "grouped_steps_per_s": g["steps_per_s"],
            "grouped_before_steps_per_s": g.get("before_steps_per_s"),
            "grouped_after_steps_per_s": g.get("after_steps_per_s"),
            "live_steps_per_s": lv["steps_per_s"] if lv else None,
            "drain_over_grouped": round(d["steps_per_s"] / max(g["steps_per_s"], 1e-9), 3),
            "live_over_drain": (
                round(lv["steps_per_s"] / max(d["steps_per_s"], 1e-9), 3) if lv else None
            ),
            "wal_bytes_per_step": d["wal_bytes_per_step"],
            # of them, full-page images: a drain a checkpoint fell into (README, "seventh")
            "wal_full_page_bytes_per_step": d.get("wal_full_page_bytes_per_step"),
            "checkpoint_before": d.get("checkpoint_before"),
            "commits_per_step": d["commits_per_step"],
            "history_rows_per_step": d["history_rows_per_step"],
            "history_events_per_step": d["history_events_per_step"],
            "worker_rss_mb": max(d["worker_rss_mb"], default=0.0),
        }
        for d, g, lv in alternations
    ]

    def med(key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return round(median(values), 3) if values else None

    m: dict[str, float | None] = {key: med(key) for key in rows[0] if key != "worker_rss_mb"}
    m["worker_rss_mb"] = max(r["worker_rss_mb"] for r in rows)

    def at_most(key: str, goal: float, *, strictly: bool = False) -> bool:
        v = m[key]
        return v is not None and (v < goal if strictly else v <= goal)

    def at_least(key: str, goal: float) -> bool:
        v = m[key]
        return v is not None and v >= goal

    return {
        "alternations": rows,
        "median": m,
        "met": {
            "drain_over_grouped": at_least("drain_over_grouped", GOAL_DRAIN_OVER_GROUPED),
            "live_over_drain": at_least("live_over_drain", GOAL_LIVE_OVER_DRAIN),
            "wal_bytes_per_step": at_most("wal_bytes_per_step", GOAL_WAL_BYTES_PER_STEP),
            "history_rows_per_step": at_most("history_rows_per_step", GOAL_HISTORY_ROWS_PER_STEP),
            "commits_per_step": at_most("commits_per_step", GOAL_COMMITS_PER_STEP, strictly=True),
            "worker_rss_mb": at_most("worker_rss_mb", GOAL_WORKER_RSS_MB, strictly=True),
        },
    }


def _render_goals(goals: dict[str, Any]) -> list[str]:
    rows, m, met = goals["alternations"], goals["median"], goals["met"]
    lines = [
        "",
        f"goals, on the medians of {len(rows)} alternation(s) of drain, grouped ceiling and "
        "live run (each ratio within its own):",
    ]

    def each(key: str, fmt: str) -> str:
        return ", ".join("-" if r[key] is None else format(r[key], fmt) for r in rows)

    spec = [
        ("drain / grouped ceiling", "drain_over_grouped", ".2f", f">= {GOAL_DRAIN_OVER_GROUPED}"),
        ("live / drain", "live_over_drain", ".2f", f">= {GOAL_LIVE_OVER_DRAIN}"),
        ("WAL bytes a step", "wal_bytes_per_step", ".0f", f"<= {GOAL_WAL_BYTES_PER_STEP:.0f}"),
        (
            "history rows written a step",
            "history_rows_per_step",
            ".2f",
            f"<= {GOAL_HISTORY_ROWS_PER_STEP}",
        ),
        ("commits a step", "commits_per_step", ".3f", f"< {GOAL_COMMITS_PER_STEP}"),
        ("worker peak RSS MB (max)", "worker_rss_mb", ".1f", f"< {GOAL_WORKER_RSS_MB:.0f}"),
    ]
    for label, key, fmt, goal in spec:
        value = "-" if m[key] is None else format(m[key], fmt)
        lines.append(
            f"  {label:<28} {value:>7}  [{each(key, fmt)}]  goal {goal}: "
            + ("met" if met[key] else "NOT met")
        )
    lines.append(
        f"  (drain {each('drain_steps_per_s', '.0f')} steps/s; grouped, the mean of before "
        f"and after each drain, {each('grouped_steps_per_s', '.0f')} (before "
        f"{each('grouped_before_steps_per_s', '.0f')}, after "
        f"{each('grouped_after_steps_per_s', '.0f')}); live {each('live_steps_per_s', '.0f')}; "
        f"history events a step {each('history_events_per_step', '.2f')}; of the WAL a step, "
        f"full-page images {each('wal_full_page_bytes_per_step', '.0f')}"
        + (
            ", each drain begun after a CHECKPOINT)"
            if all(r.get("checkpoint_before") for r in rows)
            else ", a drain without a CHECKPOINT before it: a checkpoint may fall into it)"
        )
    )
    return lines


# -- the scaling curve ---------------------------------------------------------------------------


def _pg_share(tier: dict[str, Any], cores: int) -> float:
    """PostgreSQL's CPU seconds over the tier's wall seconds over the machine's cores."""
    pg_s = tier["pg_cpu_ms_per_step"] * tier["steps"] / 1000
    return round(pg_s / max(tier["elapsed_s"], 1e-9) / cores, 3)


def _curve_point(url: str, o: dict[str, Any], workers: int, cores: int) -> dict[str, Any]:
    p = {**o, "workers": workers, "conns": max(2, min(o["conns"], CURVE_CONNECTIONS // workers))}
    org = f"curve{workers}"
    asyncio.run(_publish(url, [org]))
    eng = _drain(url, p, org=org)["engine"]
    grouped = _loop_tier(url, "grouped", p, 0)
    return {
        "workers": workers,
        "conns_per_worker": p["conns"],
        "steps": eng["steps"],
        "steps_per_s": eng["steps_per_s"],
        "commits_per_step": eng["commits_per_step"],
        "pg_cpu_share": _pg_share(eng, cores),
        "machine_busy": eng["machine_busy"],
        "lost": eng["lost"],
        "grouped": {
            "steps": grouped["steps"],
            "steps_per_s": grouped["steps_per_s"],
            "commits_per_step": grouped["commits_per_step"],
            "pg_cpu_share": _pg_share(grouped, cores),
            "machine_busy": grouped["machine_busy"],
        },
        "ratio": round(eng["steps_per_s"] / max(grouped["steps_per_s"], 1e-9), 3),
    }


def _run_curve(admin_url: str, o: dict[str, Any], counts: list[int]) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    with scratch_database(admin_url, "throughput") as url:
        points = [_curve_point(url, o, w, cores) for w in counts]
    return {
        "bench": "throughput",
        "steps_per_run": STEPS,
        "options": {**o, "workers": counts},
        "cores": cores,
        "curve": points,
    }


def _render_curve(res: dict[str, Any]) -> str:
    o = res["options"]
    lines = [
        f"throughput scaling curve: {o['runs']} runs x {res['steps_per_run']} no-op set steps "
        f"per point (lane fast={o['capacity']}, claim batch {o['batch']}, eager, relay + "
        f"sweeper on); beside each, the grouped ceiling ({o['loop_batch']} settles a "
        f"statement) with as many processes and connections; pg CPU share = PostgreSQL's CPU "
        f"seconds / wall seconds / {res['cores']} cores",
        "",
        f"{'workers':>7} {'conns':>5} | {'steps/s':>8} {'commits':>8} {'pg CPU':>7} {'busy':>5} "
        f"| {'grouped':>8} {'commits':>8} {'pg CPU':>7} {'busy':>5} | {'engine /':>8}",
        f"{'':>7} {'each':>5} | {'':>8} {'/step':>8} {'share':>7} {'':>5} "
        f"| {'steps/s':>8} {'/step':>8} {'share':>7} {'':>5} | {'grouped':>8}",
    ]
    prev: dict[str, Any] | None = None
    notes = []
    for p in res["curve"]:
        g = p["grouped"]
        lines.append(
            f"{p['workers']:>7} {p['conns_per_worker']:>5} | {p['steps_per_s']:>8.0f} "
            f"{p['commits_per_step']:>8.3f} {p['pg_cpu_share'] * 100:>6.0f}% "
            f"{(p['machine_busy'] or 0) * 100:>4.0f}% | {g['steps_per_s']:>8.0f} "
            f"{g['commits_per_step']:>8.3f} {g['pg_cpu_share'] * 100:>6.0f}% "
            f"{(g['machine_busy'] or 0) * 100:>4.0f}% | {p['ratio']:>8.2f}"
        )
        if prev is not None:
            gain = p["steps_per_s"] / max(prev["steps_per_s"], 1e-9)
            notes.append(
                f"{prev['workers']} -> {p['workers']} workers: steps/s x{gain:.2f}, pg CPU share "
                f"{prev['pg_cpu_share'] * 100:.0f}% -> {p['pg_cpu_share'] * 100:.0f}%"
            )
        prev = p
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


# -- the bench -----------------------------------------------------------------------------------


def run(
    admin_url: str,
    *,
    quick: bool = False,
    runs: int | None = None,
    workers: int | None = None,
    conns: int | None = None,
    batch: int | None = None,
    capacity: int | None = None,
    starters: int | None = None,
    reps: int | None = None,
    live: bool = True,
    what_if: list[str] | None = None,
    curve: list[int] | None = None,
    pairs: int | None = None,
) -> dict[str, Any]:
    """``what_if`` (diagnosis, from Python only): extra drains, each with one change patched
    into the worker processes (see ``onward.bench.proc.WHAT_IF``), printed as extra rows.
    ``curve``: worker counts; the drain and the grouped ceiling at each instead (a scaling
    curve, see the module's docstring). ``pairs``: alternations of drain, grouped ceiling and
    live run (3 unless quick: the sitting's own, then two more, each on fresh organisations);
    the goals are judged on their medians."""
    o: dict[str, Any] = {
        # 10,000 runs: a drain of 2-3 s and a grouped ceiling of about a second. With 2,000 the
        # grouped ceiling lasted a fifth of a second and the drain under one, so a process's
        # first claims and its connections' first statements were a visible share of both
        # (issue 16's closing note, 2026-12-05: 0.29 of the ceiling at 2,000 runs, 0.41 at
        # 10,000 in the same sitting). ``--runs 2000`` still measures the short drain.
        "runs": runs or (30 if quick else 10_000),
        "workers": workers or (1 if quick else 2),
        "conns": conns or (2 if quick else 10),
        # each worker's lane capacity and claim batch. 128: the same sitting's drains (10,000
        # runs, 2026-12-07, README "tenth") at 320 -- the steps a process of the grouped
        # ceiling holds at once -- kept the machine busier (0.96-0.97 against 0.88-0.91) but
        # spent more CPU a step, and drained no faster
        "batch": batch or capacity or (32 if quick else 128),
        "capacity": capacity or (32 if quick else 128),
        "loop_batch": 32,
        "starters": starters or (4 if quick else 16),
        "reps": reps or (1 if quick else 3),
        "pairs": pairs or (1 if quick else 3),
    }
    if curve:
        return _run_curve(admin_url, o, list(curve))
    n, w, c = o["runs"], o["workers"], o["conns"]
    res: dict[str, Any] = {"bench": "throughput", "steps_per_run": STEPS, "options": o}
    extra = list(what_if or [])
    more = range(1, o["pairs"] if live else 1)  # the alternations after the sitting's own
    with scratch_database(admin_url, "throughput") as url:
        res["server"] = server(url)
        asyncio.run(
            _publish(
                url,
                ["bench", "live"]
                + [f"whatif{i}" for i in range(len(extra))]
                + [f"{kind}{i}" for i in more for kind in ("pair", "live")],
            )
        )
        # each drain between two grouped ceilings: its ratio is taken against their mean
        before0 = _loop_tier(url, "grouped", o, 0)
        res.update(_drain(url, o))
        after0 = _loop_tier(url, "grouped", o, 0)
        res["what_if"] = [
            {"what_if": w_if, **_drain(url, {**o, "what_if": [w_if]}, org=f"whatif{i}")["engine"]}
            for i, w_if in enumerate(extra)
        ]
        loops = [_loop_tier(url, "minimal", o, rep) for rep in range(o["reps"])]
        loops.sort(key=lambda r: r["steps_per_s"])
        ceiling = loops[len(loops) // 2]
        res["ceiling"] = {
            "loop": ceiling,
            "loop_steps_per_s_all": [r["steps_per_s"] for r in loops],
            "engine_sql": _loop_tier(url, "engine", o, 0),
            "grouped": after0,
        }
        pg: list[dict[str, Any]] = []
        if find_pgbench() is not None:
            prepare_pgbench(url)
            clients = sorted({1, w} if quick else {1, w, w * c})
            for script in ("update_returning", "settle_insert_cte"):
                for k in clients:
                    pg.append(pgbench(url, script, k, min(n * STEPS, 60) if quick else n * STEPS))
        res["ceiling"]["pgbench"] = pg
        if live:
            res["live"] = _live(url, o)
        alternations = [(res["engine"], _around(before0, after0), res.get("live"))]
        for i in more:
            before = _loop_tier(url, "grouped", o, 0)
            drained = _drain(url, o, org=f"pair{i}")["engine"]
            after = _loop_tier(url, "grouped", o, 0)
            alternations.append((drained, _around(before, after), _live(url, o, org=f"live{i}")))
        res["goals"] = _goals(alternations)
    eng = res["engine"]
    ceil_sps = ceiling["steps_per_s"]
    rss = max(eng["worker_rss_mb"], default=0.0)
    res["ratio"] = round(eng["steps_per_s"] / ceil_sps, 3) if ceil_sps else None
    res["ratio_to_engine_sql"] = round(
        eng["steps_per_s"] / max(res["ceiling"]["engine_sql"]["steps_per_s"], 1e-9), 3
    )
    sps = eng["steps_per_s"]
    res["targets"] = {
        "steps_per_s_at_least": TARGET_STEPS_PER_S,
        "min_steps_ok": sps >= TARGET_STEPS_PER_S,
        "half_ceiling": round(ceil_sps / 2, 1),
        "half_ceiling_ok": sps >= ceil_sps / 2,
        "steps_per_s_ok": sps >= max(TARGET_STEPS_PER_S, ceil_sps / 2),
        "rss_mb_below": TARGET_RSS_MB,
        "rss_ok": rss < TARGET_RSS_MB,
    }
    return res


def render(res: dict[str, Any]) -> str:
    if "curve" in res:
        return _render_curve(res)
    o, st, eng, ceil = res["options"], res["starts"], res["engine"], res["ceiling"]
    w, c = o["workers"], o["conns"]
    lines = [
        f"throughput: {o['runs']} runs x {res['steps_per_run']} no-op set steps; {w} worker "
        f"processes x {c} connections (lane fast={o['capacity']}, claim batch {o['batch']}, "
        "eager, relay + sweeper on)" + (f"; server {res['server']}" if res.get("server") else ""),
        f"starts (library, {st['concurrency']} at once): {st['starts_per_s']:.0f} starts/s, "
        f"p50 {st['latency_ms_p50']:.1f} ms, p99 {st['latency_ms_p99']:.1f} ms",
        "",
        f"{'tier':<34} {'conns':>5} {'steps/s':>8} {'tx/s':>7} {'commits':>8} {'xids':>6} "
        f"{'WAL B':>6} {'pg CPU':>7} {'py CPU':>7} {'busy':>5}",
        f"{'':<34} {'':>5} {'':>8} {'':>7} {'/step':>8} {'/step':>6} {'/step':>6} "
        f"{'ms/st':>7} {'ms/st':>7} {'':>5}",
    ]

    def row(name: str, conns: int, r: dict[str, Any]) -> str:
        busy = r.get("machine_busy")
        return (
            f"{name:<34} {conns:>5} {r['steps_per_s']:>8.0f} {r['tx_per_s']:>7.0f} "
            f"{r['commits_per_step']:>8.3f} {r['xids_per_step']:>6.3f} "
            f"{r['wal_bytes_per_step']:>6} {r['pg_cpu_ms_per_step']:>7.3f} "
            f"{r['client_cpu_ms_per_step']:>7.3f} {(busy or 0) * 100:>4.0f}%"
        )

    lines.append(row("onward workers (drain)", w * c, eng))
    for wi in res.get("what_if") or []:
        lines.append(row(f"  what-if: {wi['what_if']}", w * c, wi))
    lines.append(row("ceiling: psycopg loop, minimal SQL", ceil["loop"]["conns"], ceil["loop"]))
    es = ceil["engine_sql"]
    lines.append(row("psycopg loop, onward's SQL", es["conns"], es))
    gr = ceil.get("grouped")
    if gr:
        lines.append(row(f"  beyond: {o['loop_batch']} settles/statement", gr["conns"], gr))
    lines.append(
        f"  minimal loop steps/s over {len(ceil['loop_steps_per_s_all'])} reps: "
        f"{ceil['loop_steps_per_s_all']} (median used)"
    )
    lines.append("")
    lines.append(
        f"engine / ceiling: {res['ratio']:.2f}   engine / onward's SQL alone: "
        f"{res['ratio_to_engine_sql']:.2f}   onward's SQL / ceiling: "
        f"{es['steps_per_s'] / max(ceil['loop']['steps_per_s'], 1e-9):.2f}"
    )
    lines.append(
        f"engine: {eng['steps']} steps in {eng['elapsed_s']:.2f} s (database clock: "
        f"{eng['db_window_s']:.2f} s): {eng['steps_per_s']:.0f} steps/s, "
        f"{eng['runs_per_s']:.0f} runs/s; run latency first claim -> completed "
        f"p50 {eng['run_latency_ms_p50']:.1f} ms, p99 {eng['run_latency_ms_p99']:.1f} ms"
    )
    lines.append(
        f"        claimed {eng['claimed']}, eager {eng['eager']}, lost {eng['lost']}, "
        f"relayed {eng['relayed']}; worker peak RSS {eng['worker_rss_mb']} MB"
    )
    if eng.get("statements"):
        lines.append(
            "        statements the workers sent while the clock ran (per step, mean ms awaited):"
        )
        for label, v in eng["statements"].items():
            lines.append(f"          {v['per_step']:>7.3f}  {v['ms_avg']:>7.2f} ms  {label}")
    lines.append(
        "        rows written per step (inserted / updated, share of updates that were HOT):"
    )
    for tier, r in (("onward workers", eng), ("onward's SQL", es), ("minimal", ceil["loop"])):
        cells = [
            f"{name} {v['ins_per_step']:.2f}/{v['upd_per_step']:.2f}"
            + (f" HOT {v['hot_share'] * 100:.0f}%" if v["upd_per_step"] else "")
            for name, v in r.get("tables", {}).items()
        ]
        lines.append(f"          {tier:<15} " + "; ".join(cells))
    lines.append(
        f"        history: {eng['history_events_per_step']:.2f} events a step (the view), "
        f"{eng['history_rows_per_step']:.2f} rows written to history_log a step (a settle's "
        "event is its step row's)"
    )
    if eng.get("wal_inspect_error"):
        lines.append(f"        WAL by relation not read: {eng['wal_inspect_error']}")
    if eng.get("wal_by_relation"):
        rels = list(eng["wal_by_relation"].items())
        lines.append("        WAL bytes per step by relation (pg_walinspect), largest first:")
        for i in range(0, min(len(rels), 18), 6):
            lines.append("          " + "; ".join(f"{name} {b:.0f}" for name, b in rels[i : i + 6]))
    if "live" in res:
        lv = res["live"]
        lines.append(
            f"live (starts and workers at once): {lv['runs']} runs in {lv['elapsed_s']:.2f} s, "
            f"{lv['runs_per_s']:.0f} runs/s, {lv['steps_per_s']:.0f} steps/s, starts "
            f"{lv['starts_per_s']:.0f}/s; start -> completed p50 {lv['latency_ms_p50']:.1f} ms, "
            f"p99 {lv['latency_ms_p99']:.1f} ms; machine busy {lv.get('machine_busy')}"
        )
    if ceil["pgbench"]:
        lines.append("")
        lines.append(
            f"pgbench (same sitting): {'script':<20} {'clients':>7} {'tps':>8} {'lat ms':>7}"
        )
        for p in ceil["pgbench"]:
            if "error" in p:
                lines.append(f"{'':<24}{p['script']:<20} {p['clients']:>7} error: {p['error']}")
            else:
                lines.append(
                    f"{'':<24}{p['script']:<20} {p['clients']:>7} {p['tps']:>8.0f} "
                    f"{p['latency_ms']:>7.2f}"
                )
    t = res["targets"]

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines.append("")
    lines.append(
        f"targets: steps/s >= half the ceiling ({t['half_ceiling']:.0f}): "
        f"{met(t['half_ceiling_ok'])}; steps/s >= {t['steps_per_s_at_least']:.0f}: "
        f"{met(t['min_steps_ok'])}; worker RSS < {t['rss_mb_below']:.0f} MB: {met(t['rss_ok'])}"
    )
    if res.get("goals"):
        lines.extend(_render_goals(res["goals"]))
    return "\n".join(lines)


__all__ = ["render", "run"]
