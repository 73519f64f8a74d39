"""``onward bench sweep``: the due sweep's cost as the backlog grows (R7).

One organisation gets a growing backlog of due timers (1k, 10k, 100k, 1M) while 20 small
organisations keep 10 due timers each. At each size the bench times one fair sweep batch --
candidate organisations, the per-organisation LATERAL claim with SKIP LOCKED, and the fire --
inside a transaction that is rolled back, so the backlog stays the same between repetitions.
The ceiling is the same connection's round trip for ``SELECT 1``: the cost of any query at all.
A flat batch time across backlogs is the goal; the EXPLAIN of the largest size shows why.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg.rows import dict_row

from onward import timers
from onward.bench import median, percentile
from onward.bench.db import scratch_database
from onward.sweep import Q as SWEEP_Q
from onward.sweep import SweepLimits
from onward.timers import Q as TIMER_Q

SMALL_ORGS = 20


def _fill(conn: psycopg.Connection[dict[str, Any]], org: str, start: int, count: int) -> None:
    conn.execute(
        """
        INSERT INTO timers (org_id, run_id, seq, purpose, intent, due_at)
        SELECT %s, 'run_bench_' || g, 1, 'wait', '{}',
               now() - interval '1 hour' + (g %% 3600) * interval '1 second'
        FROM generate_series(%s::int, %s::int) AS g
        """,
        (org, start, start + count - 1),
    )


def _batch(conn: psycopg.Connection[dict[str, Any]], lim: SweepLimits) -> int:
    with conn.transaction(force_rollback=True):
        orgs = [r["org_id"] for r in conn.execute(SWEEP_Q.due_candidates, {"orgs": lim.orgs})]
        due = conn.execute(
            SWEEP_Q.claim_due, {"org_ids": orgs, "per_org": lim.per_org, "batch": lim.batch}
        ).fetchall()
        fired = conn.execute(
            TIMER_Q.fire,
            {
                "org_ids": [d["org_id"] for d in due],
                "timer_ids": [d["timer_id"] for d in due],
                "wake_ns": [None] * len(due),
                "by": "sweep",
                **timers.NO_EAGER,
            },
        ).fetchall()
        return len(fired)


def _time(fn: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def run(admin_url: str, *, quick: bool = False, reps: int = 25) -> dict[str, Any]:
    sizes = [1_000, 10_000] if quick else [1_000, 10_000, 100_000, 1_000_000]
    reps = 5 if quick else reps
    lim = SweepLimits()
    results: dict[str, Any] = {"bench": "sweep", "sizes": [], "limits": lim.__dict__}
    with (
        scratch_database(admin_url, "sweep") as url,
        psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn,
    ):
        conn.execute("INSERT INTO organisations (org_id, has_due_work) VALUES ('big', true)")
        for i in range(SMALL_ORGS):
            org = f"small{i:02d}"
            conn.execute(
                "INSERT INTO organisations (org_id, has_due_work) VALUES (%s, true)", (org,)
            )
            _fill(conn, org, 1, 10)
        have = 0
        for size in sizes:
            _fill(conn, "big", have + 1, size - have)
            have = size
            conn.execute("ANALYZE timers")
            conn.execute("ANALYZE organisations")
            _batch(conn, lim)  # warm the cache and the plan
            batch_ms = _time(lambda: _batch(conn, lim), reps)
            floor_ms = _time(lambda: conn.execute("SELECT 1").fetchone(), reps * 4)
            fired = _batch(conn, lim)
            results["sizes"].append(
                {
                    "backlog": size,
                    "fired_per_batch": fired,
                    "batch_ms_p50": round(median(batch_ms), 3),
                    "batch_ms_p90": round(percentile(batch_ms, 90), 3),
                    "select1_ms_p50": round(median(floor_ms), 3),
                    "ratio_to_select1": round(median(batch_ms) / max(median(floor_ms), 1e-6), 1),
                }
            )
        orgs = [r["org_id"] for r in conn.execute(SWEEP_Q.due_candidates, {"orgs": lim.orgs})]
        plan_sql = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + SWEEP_Q.claim_due
        with conn.transaction(force_rollback=True):
            plan = conn.execute(
                plan_sql, {"org_ids": orgs, "per_org": lim.per_org, "batch": lim.batch}
            ).fetchall()
        results["explain"] = [next(iter(r.values())) for r in plan]
    first, last = results["sizes"][0], results["sizes"][-1]
    results["growth_p50"] = round(last["batch_ms_p50"] / max(first["batch_ms_p50"], 1e-6), 2)
    return results


def render(res: dict[str, Any]) -> str:
    lines = [
        "sweep batch (candidates + fair LATERAL claim + fire, rolled back); "
        f"limits {res['limits']}",
        f"{'backlog':>10} {'fired':>6} {'p50 ms':>8} {'p90 ms':>8} {'SELECT 1 ms':>12} {'ratio':>7}",
    ]
    for s in res["sizes"]:
        lines.append(
            f"{s['backlog']:>10} {s['fired_per_batch']:>6} {s['batch_ms_p50']:>8.2f} "
            f"{s['batch_ms_p90']:>8.2f} {s['select1_ms_p50']:>12.3f} {s['ratio_to_select1']:>7.1f}"
        )
    lines.append(
        f"batch time at the largest backlog / at the smallest: {res['growth_p50']}x (flat is ~1)"
    )
    lines.append("EXPLAIN ANALYZE of the claim at the largest backlog:")
    lines.extend("  " + line for line in res["explain"])
    return "\n".join(lines)
