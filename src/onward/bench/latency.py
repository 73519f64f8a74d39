"""``onward bench latency``: timer lateness (fired_at - due_at), fast path against sweep-only.

N runs each wait 1 s on a ``wait_for`` timer. Lateness is read from the timers themselves
(recorded per timer by the database clock) and printed as p50/p99 for two modes run in the same
sitting: the fast path (the delayed wake of the configured queue) and sweep-only
(``ONWARD_QUEUE=none``: only the due sweep fires timers). The ceiling is the sweep interval:
sweep-only lateness is bounded by it; the fast path should sit far below it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from onward.automations.builder import Automation
from onward.bench import median, percentile
from onward.bench.db import scratch_database
from onward.config import Settings
from onward.engine import Engine

FLOW = Automation("bench-latency").step("wait", "wait_for", duration="1s").build()


async def _mode(url: str, queue: str, runs: int, sweep_s: float, redis_url: str) -> dict[str, Any]:
    settings = Settings(
        database_url=url,
        org_id=f"lat-{queue}",
        queue=queue,
        redis_url=redis_url,
        sweep_seconds=sweep_s,
        poll_seconds=0.5,
    )
    async with Engine.open(settings, migrate=False) as engine:
        await engine.publish(FLOW)
        ids = [
            (await engine.start("bench-latency", {"i": i}, key=f"{queue}-{i}")).run_id
            for i in range(runs)
        ]
        async with engine.running():
            for run_id in ids:
                await engine.wait(run_id, timeout=60)
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM fired_at - due_at)::float8 * 1000, fired_by FROM timers "
            "WHERE org_id = %s",
            (settings.org_id,),
        ).fetchall()
    late = [r[0] for r in rows]
    by: dict[str, int] = {}
    for r in rows:
        by[r[1]] = by.get(r[1], 0) + 1
    return {
        "queue": queue,
        "timers": len(late),
        "lateness_ms_p50": round(median(late), 1),
        "lateness_ms_p99": round(percentile(late, 99), 1),
        "lateness_ms_max": round(max(late, default=0.0), 1),
        "fired_by": by,
    }


def run(
    admin_url: str,
    *,
    quick: bool = False,
    queue: str = "postgres",
    redis_url: str = "redis://127.0.0.1:6379/0",
) -> dict[str, Any]:
    runs = 20 if quick else 200
    sweep_s = 2.0
    with scratch_database(admin_url, "latency") as url:
        fast = asyncio.run(_mode(url, queue, runs, sweep_s, redis_url))
        sweep_only = asyncio.run(_mode(url, "none", runs, sweep_s, redis_url))
    return {
        "bench": "latency",
        "runs": runs,
        "sweep_interval_ms": sweep_s * 1000,
        "modes": [fast, sweep_only],
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"timer lateness, {res['runs']} timers per mode; ceiling for sweep-only: the sweep "
        f"interval, {res['sweep_interval_ms']:.0f} ms",
        f"{'mode':<18} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  fired by",
    ]
    for m in res["modes"]:
        name = "sweep-only" if m["queue"] == "none" else f"fast path ({m['queue']})"
        lines.append(
            f"{name:<18} {m['lateness_ms_p50']:>8.1f} {m['lateness_ms_p99']:>8.1f} "
            f"{m['lateness_ms_max']:>8.1f}  {m['fired_by']}"
        )
    return "\n".join(lines)


__all__ = ["render", "run"]
