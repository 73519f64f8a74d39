"""``onward bench latency``: timer lateness, a signal's way to the next step, signal intake.

1. **Timer lateness** (fired_at - due_at). N runs each wait 1 s on a ``wait_for`` timer.
   Lateness is read from the timers themselves (recorded per timer by the database clock) and
   printed as p50/p99 for two modes run in the same sitting: the fast path (the delayed wake of
   the configured queue) and sweep-only (``ONWARD_QUEUE=none``: only the due sweep fires
   timers). The ceiling is the sweep interval: sweep-only lateness is bounded by it; the fast
   path should sit far below it.
2. **A burst: N timers due in the same second** (2,000 by default), with W worker processes
   running (``python -m onward.bench.proc worker``: worker, relay and sweeper as ``onward
   worker`` runs them), once per queue: ``postgres`` (the relay keeps each delayed wake in the
   outbox until due, then NOTIFYs it) and ``redis`` (the relay hands each delayed wake to
   Redis's delayed set at once; the consumers promote due ones to the ready list). N runs of a
   ``wait_until`` step (the rule ``at <T>`` in UTC, spread 1 s: each timer at T plus its own
   offset in ``[0, 1 s)``) are started through the library a few seconds ahead of T, their
   timers written and the tables vacuumed and analyzed before T. Lateness is read from the
   timers (``fired_at - due_at``), with who fired each: ``wake`` (the fast path: relay, queue,
   worker) or ``sweep`` (the backstop). Where the time goes, from the database's clocks: with
   PostgreSQL, when the relay published each timer's wake (``outbox.sent_at - due_at``) and
   from there to the fire; with Redis the wake left the outbox long before T, so what follows
   T is Redis's promotion and the worker's pop. Beside it: how long after its instant each run
   completed (its next step, a ``set``, claimed and settled). ``knobs`` (from Python) set
   batching knobs of the workers (``Settings`` fields) for the measurements that tuned them.
3. **Signal -> next step claimed** (the fast path, PostgreSQL queue). N runs wait on a
   ``wait_signal`` step in a worker process (``python -m onward.bench.proc worker``: worker,
   relay, sweeper); this process delivers each run's signal through the library
   (``Engine.signal``), one every ``pace`` seconds. Measured by the database's clock from the
   delivery call's start (this process's clock, moved onto the database's by the offset of a
   ``clock_timestamp()`` round trip) to the history rows: ``signal_consumed`` (the intake
   committed), the woken step's claim and the next step's claim (``history.claimed_at``). Beside
   it: the relay's poll interval, which bounds how long the wake of a consumed signal would
   wait if intake did not publish it itself (it does: ``signals.deliver`` notifies in its
   transaction; the outbox row and the relay are the fallback), and the timer fast path of
   the same sitting.
4. **Signal intake over HTTP**. ``POST /v1/signals`` (with an API key) to the API in its own
   process (``python -m onward.bench.proc api``, no worker) from ``clients`` concurrent
   keep-alive connections; each signal names a run whose step waits on it and is sent twice,
   in shuffled order (so some duplicates race their original): every first delivery must be
   answered 202 ``consumed``, every repeat 200 with the same status, and each signal stored
   once with 2 deliveries.
   Signals/s, p50/p99 per request and commits per request (``pg_stat_database``), beside the
   machine's ceiling: pgbench's minimal one-statement write transaction (``start_cte``) at the
   same number of clients.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import secrets
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import psycopg

from onward.automations.builder import Automation
from onward.bench import median, percentile
from onward.bench.ceiling import (
    cpu_delta,
    cpu_snapshot,
    db_counters,
    db_delta,
    find_pgbench,
    pgbench,
    prepare_pgbench,
    settle_stats,
)
from onward.bench.db import scratch_database
from onward.bench.monday import _db_now, _starts, _vacuum
from onward.bench.proc import Child
from onward.bench.start import _read_response
from onward.config import Settings
from onward.engine import Engine
from onward.outbox import Relay

FLOW = Automation("bench-latency").step("wait", "wait_for", duration="1s").build()
SIGNAL_AUTOMATION = "bench-signal"
SIGNAL_FLOW = (
    Automation(SIGNAL_AUTOMATION)
    .step("wait", "wait_signal", signals=["reply"], deadline="1h")
    .step("after", "set", values={"replied": "true"})
    .build()
)
# the relay's poll interval: the fallback when a wake is not published with its transition
RELAY_POLL_S: float = inspect.signature(Relay).parameters["poll_seconds"].default


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


# -- a burst: N timers due in the same second ----------------------------------------------------

BURST_AUTOMATION = "bench-burst"
BURST_SPREAD_S = 1.0  # every timer at T + its own offset in [0, 1 s): the same second
BURST_LANES, BURST_CLAIM_BATCH, BURST_POOL = "wait=64,fast=64", 32, 10


def _burst_flow(instant: datetime) -> dict[str, Any]:
    wall = instant.replace(tzinfo=None).isoformat()  # UTC wall time, whole seconds
    return (
        Automation(BURST_AUTOMATION)
        .step("wait", "wait_until", rule=f"at {wall}", zone="UTC", spread=f"{BURST_SPREAD_S}s")
        .step("after", "set", values={"woke": "true"})
        .build()
    )


def _burst_workers(
    url: str,
    org: str,
    queue: str,
    workers: int,
    redis_url: str,
    prefix: str,
    knobs: dict[str, Any],
    trace: bool = False,
) -> list[Child]:
    args = [
        "worker",
        "--url",
        url,
        "--org",
        org,
        "--queue",
        queue,
        "--redis-url",
        redis_url,
        "--prefix",
        prefix,
        "--lanes",
        BURST_LANES,
        "--batch",
        str(BURST_CLAIM_BATCH),
        "--pool",
        str(BURST_POOL),
        "--poll",
        "2.0",
        "--sweep",
        "2.0",
    ]
    for name, value in knobs.items():
        args += ["--set", f"{name}={value}"]
    if trace:
        args.append("--trace-timers")
    children = [Child(*args) for _ in range(workers)]
    for c in children:
        c.wait_ready()
    return children


def _poll_until(
    conn: psycopg.Connection[Any], query: str, params: Any, n: int, what: str, timeout: float
) -> None:
    limit = time.monotonic() + timeout
    while True:
        row = conn.execute(query, params).fetchone()
        got = int(row[0]) if row else 0
        if got >= n:
            return
        if time.monotonic() > limit:
            raise RuntimeError(f"{what}: {got} of {n} after {timeout:.0f}s")
        time.sleep(0.05)


BURST_FIGURES = """
SELECT extract(epoch FROM tm.fired_at - tm.due_at)::float8 * 1000,
       tm.fired_by,
       extract(epoch FROM o.sent_at - tm.due_at)::float8 * 1000,
       extract(epoch FROM tm.fired_at - o.sent_at)::float8 * 1000,
       extract(epoch FROM r.finished_at - tm.due_at)::float8 * 1000,
       extract(epoch FROM tm.due_at - %(t)s::timestamptz)::float8,
       tm.timer_id,
       extract(epoch FROM tm.due_at)::float8,
       (SELECT extract(epoch FROM min(h.claimed_at) - tm.due_at)::float8 * 1000 FROM history h
        WHERE h.org_id = tm.org_id AND h.run_id = tm.run_id AND h.seq = tm.seq
          AND h.claimed_at >= tm.fired_at),
       (SELECT extract(epoch FROM min(h.claimed_at) - tm.due_at)::float8 * 1000 FROM history h
        WHERE h.org_id = tm.org_id AND h.run_id = tm.run_id AND h.seq = tm.seq + 1)
FROM timers tm
JOIN runs r ON r.org_id = tm.org_id AND r.run_id = tm.run_id
LEFT JOIN outbox o ON o.org_id = tm.org_id AND o.topic = 'timer'
     AND o.job_id = onward_timer_wake_id(tm.org_id, tm.timer_id, tm.wake_n)
WHERE tm.org_id = %(org)s
"""


def _burst_mode(
    url: str,
    queue: str,
    n: int,
    workers: int,
    lead_s: float,
    redis_url: str,
    knobs: dict[str, Any],
    trace: bool = False,
) -> dict[str, Any]:
    prefix = f"bench-burst-{secrets.token_hex(4)}"  # the shared Redis: keys of this mode only
    org = f"burst-{queue}-{secrets.token_hex(2)}"
    children = _burst_workers(url, org, queue, workers, redis_url, prefix, knobs, trace)
    try:
        for c in children:
            c.send("go")
        t = (_db_now(url) + timedelta(seconds=lead_s)).replace(microsecond=0)
        asyncio.run(_burst_publish(url, org, _burst_flow(t)))
        start_s = asyncio.run(_starts(url, org, BURST_AUTOMATION, n, "b"))
        with psycopg.connect(url, autocommit=True) as conn:
            _poll_until(
                conn,
                "SELECT count(*) FROM timers WHERE org_id = %s",
                (org,),
                n,
                "timers written",
                timeout=lead_s,
            )
            row = conn.execute(
                "SELECT extract(epoch FROM %s::timestamptz - now())::float8, count(*) FILTER "
                "(WHERE due_at >= %s AND due_at < %s) FROM timers WHERE org_id = %s",
                (t, t, t + timedelta(seconds=BURST_SPREAD_S), org),
            ).fetchone()
            assert row is not None
            slack_s, in_second = float(row[0]), int(row[1])
            if slack_s < 0.5 or in_second != n:
                raise RuntimeError(
                    f"the burst's setup was slower than planned: {in_second} of {n} timers in "
                    f"the second after T, written {slack_s:.1f} s before T (a loaded machine? "
                    "try fewer --runs)"
                )
            _vacuum(url)
            time.sleep(max(0.0, (t - _db_now(url)).total_seconds() - 0.2))
            cpu0 = cpu_snapshot()
            _poll_until(
                conn,
                "SELECT count(*) FROM runs WHERE org_id = %s AND finished_at IS NOT NULL",
                (org,),
                n,
                "runs completed after the burst",
                timeout=60 + n * 0.02,
            )
            cpu = cpu_delta(cpu0, cpu_snapshot())
        for c in children:
            c.send("stop")
        done = [c.finish() for c in children]
    finally:
        for c in children:
            c.kill()
        if queue == "redis":
            _drop_redis_keys(redis_url, prefix)
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(BURST_FIGURES, {"t": t, "org": org}).fetchall()
    late = [r[0] for r in rows]
    fired_at_s = Counter(int((r[5] * 1000 + r[0]) // 1000) for r in rows)
    legs: dict[str, list[float]] = {"published": [], "published_to_fired": []}
    if queue == "postgres":  # with Redis the wake left the outbox long before T
        legs["published"] = [r[2] for r in rows if r[2] is not None and r[1] == "wake"]
        legs["published_to_fired"] = [r[3] for r in rows if r[3] is not None and r[1] == "wake"]
    return {
        "queue": queue,
        "timers": len(rows),
        "instant": t.isoformat(),
        "slack_s": round(slack_s, 1),
        "starts_per_s": round(n / start_s, 1),
        "lateness_ms_p50": round(median(late), 1),
        "lateness_ms_p99": round(percentile(late, 99), 1),
        "lateness_ms_max": round(max(late, default=0.0), 1),
        "fired_by": dict(Counter(r[1] for r in rows)),
        "published_ms": _dist(legs["published"]) if legs["published"] else None,
        "published_to_fired_ms": (
            _dist(legs["published_to_fired"]) if legs["published_to_fired"] else None
        ),
        "woken_claimed_ms": _dist([r[8] for r in rows if r[8] is not None]),
        "next_claimed_ms": _dist([r[9] for r in rows if r[9] is not None]),
        "completed_ms": _dist([r[4] for r in rows if r[4] is not None]),
        "trace": _burst_trace(rows, [d.get("timer_trace") or {} for d in done]) if trace else None,
        "fired_per_second_after_t": [fired_at_s.get(i, 0) for i in range(max(fired_at_s) + 1)]
        if fired_at_s
        else [],
        "knobs": knobs,
        "machine_busy": cpu["machine_busy"],
        "pg_cpu_s": cpu["pg_cpu_s"],
        "workers": {
            "n": workers,
            "relayed": sum(d["relayed"] for d in done),
            "lost": sum(d["stats"]["lost"] for d in done),
        },
    }


def _burst_trace(rows: list[Any], traces: list[dict[str, Any]]) -> dict[str, Any]:
    """Where each timer's time went inside the workers (``--trace-timers``), in ms after its
    instant: its wake first received by a worker, and by the worker that fired it; the fire
    call that fired it started and returned; and the fire calls themselves (sizes, durations)."""
    due = {int(r[6]): float(r[7]) for r in rows}
    received: dict[int, float] = {}
    legs: dict[str, list[float]] = {
        "received": [],
        "inbox": [],
        "call_started": [],
        "call_done": [],
    }
    calls: dict[str, list[tuple[float, float, int, int]]] = {}
    for tr in traces:
        for k, v in (tr.get("received") or {}).items():
            received[int(k)] = min(v, received.get(int(k), v))
        own = {int(k): v for k, v in (tr.get("received") or {}).items()}
        tr_calls = tr.get("calls") or []
        for by, t0, t1, asked, fired in tr_calls:
            calls.setdefault(by, []).append((t0, t1, asked, fired))
        for k, i in (tr.get("fired") or {}).items():
            timer_id = int(k)
            by, t0, t1, _, _ = tr_calls[i]
            if timer_id not in due or by != "wake":
                continue
            legs["call_started"].append((t0 - due[timer_id]) * 1000)
            legs["call_done"].append((t1 - due[timer_id]) * 1000)
            if timer_id in own:
                legs["inbox"].append((t0 - own[timer_id]) * 1000)
    legs["received"] = [(v - due[k]) * 1000 for k, v in received.items() if k in due]
    return {
        **{f"{leg}_ms": _dist(v) for leg, v in legs.items() if v},
        "calls": {
            by: {
                "n": len(cs),
                "asked": _dist([float(c[2]) for c in cs]),
                "fired": _dist([float(c[3]) for c in cs]),
                "ms": _dist([(c[1] - c[0]) * 1000 for c in cs]),
            }
            for by, cs in calls.items()
        },
    }


async def _burst_publish(url: str, org: str, doc: dict[str, Any]) -> None:
    settings = Settings(database_url=url, org_id=org, queue="postgres")
    async with Engine.open(settings, migrate=False, start_queue=False) as engine:
        await engine.publish(doc)


def _drop_redis_keys(redis_url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


# -- signals: the runs that wait, the clocks ----------------------------------------------------


def _signal_settings(url: str, org: str) -> Settings:
    return Settings(database_url=url, org_id=org, queue="postgres")


def _signal_worker(url: str, org: str) -> Child:
    """A worker process (worker, relay, sweeper) serving the signal flow's lanes."""
    return Child(
        "worker",
        "--url",
        url,
        "--org",
        org,
        "--lanes",
        "wait=64,fast=64",
        "--poll",
        "2.0",
        "--sweep",
        "2.0",
        "--automation",
        SIGNAL_AUTOMATION,
    )


async def _count(engine: Engine, query: str) -> int:
    async with engine.pool.connection() as conn:
        row = await (await conn.execute(query, {"org_id": engine.org_id})).fetchone()
    return int(row["n"]) if row else 0


async def _until(engine: Engine, query: str, n: int, what: str, timeout: float = 120.0) -> None:
    """Poll ``query`` (a count for the engine's organisation) until it reaches ``n``."""
    deadline = time.monotonic() + timeout
    while (got := await _count(engine, query)) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {got} of {n} after {timeout}s")
        await asyncio.sleep(0.05)


WAITING = (
    "SELECT count(*) AS n FROM steps WHERE org_id = %(org_id)s AND status = 'waiting' "
    "AND wait_kind = 'signal'"
)
COMPLETED = "SELECT count(*) AS n FROM runs WHERE org_id = %(org_id)s AND status = 'completed'"


async def _waiting_runs(url: str, org: str, n: int) -> list[str]:
    """Publish the signal flow, start ``n`` runs and let a worker process make each wait on
    its signal; the worker is stopped before this returns. The run ids."""
    async with Engine.open(_signal_settings(url, org), migrate=False, start_queue=False) as engine:
        await engine.publish(SIGNAL_FLOW)
        run_ids = [
            (await engine.start(SIGNAL_AUTOMATION, {"i": i}, key=f"{org}-{i}")).run_id
            for i in range(n)
        ]
        worker = _signal_worker(url, org)
        try:
            worker.wait_ready()
            worker.send("go")
            await _until(engine, WAITING, n, "runs waiting on their signal")
            worker.send("stop")
            worker.finish()
        finally:
            worker.kill()
    return run_ids


async def _clock_offset(engine: Engine, samples: int = 15) -> float:
    """The database's clock minus this process's (``time.time()``), in seconds: from the
    ``clock_timestamp()`` round trip that took the least time."""
    best: tuple[float, float] | None = None
    async with engine.pool.connection() as conn:
        for _ in range(samples):
            t0 = time.time()
            row = await (await conn.execute("SELECT clock_timestamp() AS t")).fetchone()
            t1 = time.time()
            assert row is not None
            offset = row["t"].timestamp() - (t0 + t1) / 2
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, offset)
    assert best is not None
    return best[1]


# -- signal -> next step claimed ----------------------------------------------------------------

MILESTONES = """
SELECT r.run_id,
       (SELECT min(h.at) FROM history h WHERE h.org_id = r.org_id AND h.run_id = r.run_id
          AND h.event = 'signal_consumed') AS consumed,
       (SELECT min(h.claimed_at) FROM history h WHERE h.org_id = r.org_id
          AND h.run_id = r.run_id AND h.seq = 1 AND h.attempt > 1) AS woken_claimed,
       (SELECT min(h.claimed_at) FROM history h WHERE h.org_id = r.org_id
          AND h.run_id = r.run_id AND h.seq = 2) AS next_claimed
FROM runs r WHERE r.org_id = %(org_id)s
"""


def _dist(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(median(values), 1),
        "p99": round(percentile(values, 99), 1),
        "max": round(max(values, default=0.0), 1),
    }


async def _signal_latency(url: str, n: int, pace: float) -> dict[str, Any]:
    org = "lat-signal"
    run_ids = await _waiting_runs(url, org, n)
    async with Engine.open(_signal_settings(url, org), migrate=False, start_queue=False) as engine:
        worker = _signal_worker(url, org)
        try:
            worker.wait_ready()
            worker.send("go")
            offset = await _clock_offset(engine)
            sent: dict[str, float] = {}  # run_id -> delivery start, by the database's clock
            call_ms: list[float] = []
            statuses: dict[str, int] = {}
            for run_id in run_ids:
                t0 = time.time()
                got = await engine.signal(f"sig-{run_id}", "reply", run_id=run_id)
                call_ms.append((time.time() - t0) * 1000)
                sent[run_id] = t0 + offset
                statuses[got.status] = statuses.get(got.status, 0) + 1
                await asyncio.sleep(pace)  # an even trickle: the latency of one, not a burst
            await _until(engine, COMPLETED, n, "runs completed after their signal")
            worker.send("stop")
            worker.finish()
        finally:
            worker.kill()
        async with engine.pool.connection() as conn:
            rows = await (await conn.execute(MILESTONES, {"org_id": org})).fetchall()
    legs: dict[str, list[float]] = {"consumed": [], "woken_claimed": [], "next_claimed": []}
    for r in rows:
        for leg, values in legs.items():
            if r[leg] is not None:
                values.append((r[leg].timestamp() - sent[r["run_id"]]) * 1000)
    return {
        "signals": n,
        "pace_ms": round(pace * 1000, 1),
        "statuses": statuses,
        "clock_offset_ms": round(offset * 1000, 2),
        "relay_poll_ms": round(RELAY_POLL_S * 1000, 1),
        "intake_call_ms": _dist(call_ms),
        **{f"{leg}_ms": _dist(values) for leg, values in legs.items()},
        "measured": {leg: len(values) for leg, values in legs.items()},
    }


# -- signal intake over HTTP --------------------------------------------------------------------


async def _signal_client(
    host: str,
    port: int,
    key: str,
    work: list[tuple[str, bytes]],
    answers: list[tuple[str, int, dict[str, Any], float]],
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while work:
            signal_id, body = work.pop()
            head = (
                f"POST /v1/signals HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Authorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            t0 = time.perf_counter()
            writer.write(head + body)
            await writer.drain()
            status, raw = await _read_response(reader)
            ms = (time.perf_counter() - t0) * 1e3
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = {}
            answers.append((signal_id, status, doc if isinstance(doc, dict) else {}, ms))
    finally:
        writer.close()
        await writer.wait_closed()


async def _signal_load(
    api_url: str, key: str, run_ids: list[str], clients: int
) -> tuple[float, list[tuple[str, int, dict[str, Any], float]]]:
    parts = urlsplit(api_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    work = [
        (
            f"sig-{run_id}",
            json.dumps({"signal_id": f"sig-{run_id}", "name": "reply", "run_id": run_id}).encode(),
        )
        for run_id in run_ids
    ] * 2
    random.Random(7).shuffle(work)
    answers: list[tuple[str, int, dict[str, Any], float]] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(_signal_client(host, port, key, work, answers) for _ in range(clients)))
    return time.perf_counter() - t0, answers


def _signal_http(url: str, n: int, clients: int, pool: int) -> dict[str, Any]:
    org = "sig-http"
    run_ids = asyncio.run(_waiting_runs(url, org, n // 2))
    api = Child("api", "--url", url, "--org", org, "--pool", str(pool))
    try:
        ready = api.wait_ready()
        settle_stats()
        db0 = db_counters(url)
        api.send("go")
        elapsed, answers = asyncio.run(_signal_load(ready["url"], ready["key"], run_ids, clients))
        api.send("stop")
        done = api.finish()
    finally:
        api.kill()
    settle_stats()
    commits = db_delta(db0, db_counters(url))["commits"]
    statuses: dict[str, int] = {}
    first: dict[str, str] = {}
    mismatched = 0
    for signal_id, status, doc, _ in answers:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        said = str(doc.get("status"))
        if signal_id in first and first[signal_id] != said:
            mismatched += 1
        first.setdefault(signal_id, said)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'consumed'), count(*) FILTER "
            "(WHERE deliveries = 2), count(*) FROM signals WHERE org_id = %s",
            (org,),
        ).fetchone()
    consumed, twice, stored = (int(x) for x in row) if row else (0, 0, 0)
    lat = [a[3] for a in answers]
    unique = n // 2
    return {
        "requests": len(answers),
        "signals": unique,
        "clients": clients,
        "pool": pool,
        "elapsed_s": round(elapsed, 3),
        "requests_per_s": round(len(answers) / elapsed, 1) if elapsed > 0 else 0.0,
        "signals_per_s": round(unique / elapsed, 1) if elapsed > 0 else 0.0,
        "latency_ms_p50": round(median(lat), 2),
        "latency_ms_p99": round(percentile(lat, 99), 2),
        "commits_per_request": round(commits / max(len(answers), 1), 3),
        "statuses": statuses,
        "stored": stored,
        "consumed": consumed,
        "stored_with_two_deliveries": twice,
        "repeat_answers_differing": mismatched,
        "consistent": (
            statuses == {"202": unique, "200": unique}
            and stored == consumed == twice == unique
            and mismatched == 0
        ),
        "server_cpu_ms_per_request": round(done["cpu_s"] * 1000 / max(len(answers), 1), 3),
    }


def _ceiling(url: str, clients: int, transactions: int) -> dict[str, Any] | None:
    """pgbench's minimal one-statement write transaction at ``clients`` clients: what this
    machine's PostgreSQL commits per second, in the same sitting."""
    if find_pgbench() is None:
        return None
    prepare_pgbench(url)
    return pgbench(url, "start_cte", clients, transactions)


def run(
    admin_url: str,
    *,
    quick: bool = False,
    runs: int | None = None,
    queue: str = "postgres",
    redis_url: str = "redis://127.0.0.1:6379/0",
    clients: int | None = None,
    pool: int | None = None,
    burst: int | None = None,
    burst_queues: tuple[str, ...] = ("postgres", "redis"),
    workers: int | None = None,
    knobs: dict[str, Any] | None = None,
    only_burst: bool = False,
    trace: bool = False,
) -> dict[str, Any]:
    """``runs``: timers per mode and signals delivered one by one; the HTTP intake sends
    ten times as many requests (half of them duplicates). ``burst``: timers due in the same
    second, per queue of ``burst_queues``, with ``workers`` worker processes (2). From Python
    only: ``knobs`` (Settings fields of the burst's workers), ``only_burst`` (the burst
    alone, for tuning) and ``trace`` (where each timer's time went in the workers)."""
    burst = burst or (50 if quick else 2_000)
    w = workers or 2
    lead_s = (4.0 if quick else 6.0) + burst * 0.004
    if only_burst:
        with scratch_database(admin_url, "latency") as url:
            return {
                "bench": "latency",
                "burst": [
                    _burst_mode(url, q, burst, w, lead_s, redis_url, knobs or {}, trace)
                    for q in burst_queues
                ],
            }
    runs = runs or (20 if quick else 200)
    requests = runs * 10
    requests += requests % 2
    k = clients or (4 if quick else 16)
    pool = pool or (4 if quick else 10)
    sweep_s = 2.0
    with scratch_database(admin_url, "latency") as url:
        fast = asyncio.run(_mode(url, queue, runs, sweep_s, redis_url))
        sweep_only = asyncio.run(_mode(url, "none", runs, sweep_s, redis_url))
        bursts = [
            _burst_mode(url, q, burst, w, lead_s, redis_url, knobs or {}) for q in burst_queues
        ]
        signal = asyncio.run(_signal_latency(url, runs, pace=0.02))
        intake = _signal_http(url, requests, k, pool)
        intake["ceiling"] = _ceiling(url, k, requests // 2)
    tps = (intake["ceiling"] or {}).get("tps")
    intake["ratio"] = round(intake["requests_per_s"] / tps, 3) if tps else None
    return {
        "bench": "latency",
        "runs": runs,
        "sweep_interval_ms": sweep_s * 1000,
        "modes": [fast, sweep_only],
        "burst": bursts,
        "signal": signal,
        "signal_http": intake,
    }


def _render_burst(bursts: list[dict[str, Any]]) -> list[str]:
    b0 = bursts[0]
    lines = [
        "",
        f"a burst: {b0['timers']} timers due in the same second (T + each its own offset in "
        f"[0, 1 s)), {b0['workers']['n']} worker processes running (worker, relay, sweeper); "
        "fired by wake = the fast path (relay, queue, worker), sweep = the backstop",
        f"{'queue':<10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'done p99':>9}  "
        f"{'fired per second after T':<26} fired by",
    ]
    for b in bursts:
        lines.append(
            f"{b['queue']:<10} {b['lateness_ms_p50']:>8.1f} {b['lateness_ms_p99']:>8.1f} "
            f"{b['lateness_ms_max']:>8.1f} {b['completed_ms']['p99']:>9.1f}  "
            f"{b['fired_per_second_after_t']!s:<26} {b['fired_by']}"
        )
    for b in bursts:
        where = []
        if b.get("published_ms"):
            p, f = b["published_ms"], b["published_to_fired_ms"]
            where.append(
                f"relay published the wake p50 {p['p50']:.1f} / p99 {p['p99']:.1f} ms after "
                f"its instant, fired p50 {f['p50']:.1f} / p99 {f['p99']:.1f} ms after that"
            )
        elif b["queue"] == "redis":
            where.append("wakes were in Redis's delayed set before T")
        knobs = f"; knobs {b['knobs']}" if b.get("knobs") else ""
        lines.append(
            f"  {b['queue']}: {'; '.join(where)}; timers written {b['slack_s']:.1f} s before T "
            f"({b['starts_per_s']:.0f} starts/s); machine busy "
            f"{(b['machine_busy'] or 0) * 100:.0f}%{knobs}"
        )
    return lines


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
    bursts = res.get("burst") or []
    if bursts:
        lines += _render_burst(bursts)
    sig = res.get("signal")
    if sig:
        fast_path = res["modes"][0]
        lines += [
            "",
            f"signal -> next step, {sig['signals']} signals through Engine.signal, one every "
            f"{sig['pace_ms']:.0f} ms, to runs waiting in a worker process (PostgreSQL queue); "
            f"by the database's clock from the delivery call's start",
            f"{'leg':<34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}",
        ]
        for leg, label in (
            ("intake_call_ms", "intake call returned (this process)"),
            ("consumed_ms", "signal_consumed committed"),
            ("woken_claimed_ms", "woken step claimed"),
            ("next_claimed_ms", "next step claimed"),
        ):
            d = sig[leg]
            lines.append(f"{label:<34} {d['p50']:>8.1f} {d['p99']:>8.1f} {d['max']:>8.1f}")
        lines.append(
            f"beside it: the relay's poll interval {sig['relay_poll_ms']:.0f} ms (the fallback: "
            f"intake publishes the woken step's wake itself); timer fast path lateness "
            f"p50 {fast_path['lateness_ms_p50']:.1f} ms; intake answered {sig['statuses']}"
        )
    http = res.get("signal_http")
    if http:
        lines += [
            "",
            f"signal intake over HTTP: POST /v1/signals, {http['signals']} signals each sent "
            f"twice ({http['requests']} requests, shuffled) from {http['clients']} clients; "
            f"API process pool {http['pool']}, no worker",
            f"{'path':<34} {'per s':>8} {'p50 ms':>8} {'p99 ms':>8} {'commits/req':>12}",
            f"{'POST /v1/signals (50% repeats)':<34} {http['requests_per_s']:>8.0f} "
            f"{http['latency_ms_p50']:>8.2f} {http['latency_ms_p99']:>8.2f} "
            f"{http['commits_per_request']:>12.2f}",
        ]
        ceiling = http.get("ceiling")
        if ceiling and "error" not in ceiling:
            lines.append(
                f"{'pgbench minimal write, ' + str(ceiling['clients']) + ' clients':<34} "
                f"{ceiling['tps']:>8.0f} {ceiling['latency_ms']:>8.2f} {'':>8} {1.0:>12.2f}"
            )
        elif ceiling:
            lines.append(f"pgbench: error: {ceiling['error']}")
        lines.append(
            f"{http['signals_per_s']:.0f} signals/s; answers {http['statuses']}: stored "
            f"{http['stored']}, consumed {http['consumed']}, with 2 deliveries "
            f"{http['stored_with_two_deliveries']}, repeats answered differently "
            f"{http['repeat_answers_differing']} -> "
            f"{'consistent' if http['consistent'] else 'INCONSISTENT'}; server CPU "
            f"{http['server_cpu_ms_per_request']:.2f} ms/request"
            + (f"; requests / ceiling {http['ratio']:.2f}" if http.get("ratio") else "")
        )
    return "\n".join(lines)


__all__ = ["render", "run"]
