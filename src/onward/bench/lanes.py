"""``onward bench lanes``: one lane's burst does not delay another lane (R5).

The engine (worker, relay, sweeper) runs in this process against a scratch database, the
sandbox's providers in a child process. Two phases, one sitting:

1. **Alone**: ``io`` runs (one ``crm.upsert`` each; the CRM answers at once) are started one
   every ``pace`` seconds; each one's *queueing delay* is the time from its step becoming
   ready to its claim (history ``step_ready`` -> the attempt's ``claimed_at``, by the database's
   clock).
2. **Under a burst**: ``burst`` runs of the ``slow`` lane (``model.generate``, the sandbox's
   model answering after ``latency_ms``) are started at once, then the same ``io`` runs as in
   phase 1. The slow lane holds its 8 slots for the whole burst (500 calls of 500 ms at 8 at a
   time: ~31 s); the io lane has its own slots, so its queueing delay should not move.

It prints both phases' io queueing delay (p50, p99, max) side by side, the ratio of the p99s,
and how many slow steps were running while the io runs were measured (the burst was real).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from onward import Automation
from onward.bench import percentile
from onward.bench.db import scratch_database
from onward.config import Settings
from onward.engine import Engine


def _io_flow() -> dict[str, Any]:
    return (
        Automation("bench-io")
        .step("crm", "crm.upsert", connection="crm", external_id="{input.id}")
        .build()
    )


def _slow_flow() -> dict[str, Any]:
    return (
        Automation("bench-slow")
        .step(
            "draft", "model.generate", connection="model", prompt="Write {input.id}", max_tokens=8
        )
        .build()
    )


async def _delays(engine: Engine, run_ids: list[str]) -> list[float]:
    async with engine.pool.connection() as conn:
        rows = await (
            await conn.execute(
                """
                SELECT r.run_id,
                       extract(epoch FROM min(c.claimed_at) - min(s.at))::float8 * 1000
                           AS delay_ms
                FROM unnest(%s::text[]) AS r(run_id)
                JOIN history s ON s.run_id = r.run_id AND s.event = 'step_ready'
                JOIN history c ON c.run_id = r.run_id AND c.claimed_at IS NOT NULL
                GROUP BY r.run_id
                """,
                (run_ids,),
            )
        ).fetchall()
    return [float(r["delay_ms"]) for r in rows]


async def _io_phase(engine: Engine, tag: str, count: int, pace: float) -> list[str]:
    run_ids = []
    for i in range(count):
        started = await engine.start("bench-io", {"id": f"{tag}-{i}"}, event_id=f"{tag}-{i}")
        run_ids.append(started.run_id)
        await asyncio.sleep(pace)  # load shaping: one io run every `pace` seconds
    for run_id in run_ids:
        await engine.wait(run_id, timeout=120)
    return run_ids


async def _running_slow(engine: Engine) -> int:
    async with engine.pool.connection() as conn:
        row = await (
            await conn.execute(
                "SELECT count(*) AS n FROM steps WHERE lane = 'slow' AND status = 'running'"
            )
        ).fetchone()
    return int(row["n"]) if row else 0


async def _run(
    url: str, *, io_runs: int, burst: int, latency_ms: int, pace: float
) -> dict[str, Any]:
    import httpx

    from onward.sandbox import SandboxServer

    settings = Settings(database_url=url, queue="postgres", poll_seconds=0.5, sweep_seconds=1.0)
    async with SandboxServer(mode="process") as sandbox, Engine.open(settings) as engine:
        await engine.allow_outbound([sandbox.allow_entry])  # it serves on loopback
        for connection, provider in (("crm", "crm"), ("model", "model")):
            await engine.integrations.add_connection(
                engine.org_id,
                connection,
                provider=provider,
                base_url=sandbox.url,
                account=f"acct_{provider}",
                secret=f"acct_{provider}",
            )
        async with httpx.AsyncClient(base_url=sandbox.url) as admin:
            reply = await admin.post("/_admin/faults/model", json={"latency_ms": latency_ms})
            reply.raise_for_status()
        await engine.publish(_io_flow())
        await engine.publish(_slow_flow())
        async with engine.running():
            alone = await _delays(engine, await _io_phase(engine, "alone", io_runs, pace))
            t0 = time.monotonic()
            for i in range(burst):
                await engine.start("bench-slow", {"id": f"b{i}"}, event_id=f"burst-{i}")
            samples: list[int] = []

            async def sample() -> None:
                while True:
                    samples.append(await _running_slow(engine))
                    await asyncio.sleep(0.1)

            sampler = asyncio.create_task(sample())
            try:
                under = await _delays(engine, await _io_phase(engine, "burst", io_runs, pace))
            finally:
                sampler.cancel()
            measured_s = time.monotonic() - t0
            slow_left = await _running_slow(engine)
    return {
        "io_runs": io_runs,
        "burst": burst,
        "latency_ms": latency_ms,
        "alone": _summary(alone),
        "under_burst": _summary(under),
        "p99_ratio": round(percentile(under, 99) / max(percentile(alone, 99), 0.001), 2),
        "slow_running_while_measured": {
            "min": min(samples, default=0),
            "max": max(samples, default=0),
        },
        "slow_still_running_at_the_end": slow_left,
        "seconds": round(measured_s, 1),
    }


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 50), 1),
        "p99_ms": round(percentile(values, 99), 1),
        "max_ms": round(max(values, default=0.0), 1),
    }


def run(database_url: str, *, quick: bool = False, **options: Any) -> dict[str, Any]:
    io_runs = 20 if quick else 200
    burst = 40 if quick else 500
    latency = 100 if quick else 500
    with scratch_database(database_url, "lanes") as url:
        return asyncio.run(
            _run(
                url, io_runs=io_runs, burst=burst, latency_ms=latency, pace=0.02 if quick else 0.05
            )
        )


def render(res: dict[str, Any]) -> str:
    a, u = res["alone"], res["under_burst"]
    busy = res["slow_running_while_measured"]
    return "\n".join(
        [
            f"io-lane queueing delay (ready -> claimed), {res['io_runs']} runs each phase; burst: "
            f"{res['burst']} slow-lane model calls of {res['latency_ms']} ms",
            f"{'phase':<22} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}",
            f"{'io alone':<22} {a['p50_ms']:>8.1f} {a['p99_ms']:>8.1f} {a['max_ms']:>8.1f}",
            f"{'io under the burst':<22} {u['p50_ms']:>8.1f} {u['p99_ms']:>8.1f} {u['max_ms']:>8.1f}",
            f"p99 under the burst / alone: {res['p99_ratio']}; slow lane running while measured: "
            f"{busy['min']}..{busy['max']} (its capacity: 8); still running at the end: "
            f"{res['slow_still_running_at_the_end']}",
        ]
    )
