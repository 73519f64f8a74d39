"""``onward bench intake``: webhook starts per second over HTTP, driven by a compiled client.

``onward bench start`` drives the API from a Python client on the same cores, so its figure
measures both. Here the load comes from ``wrk`` (C, Debian's package ``wrk``), which costs the
machine a small share of what the server does, against ``onward api --workers N`` -- the
command users run, in its own processes. One sitting, on a scratch database, no worker running:

1. **open throttle**: ``connections`` keep-alive connections post ``POST /v1/hooks/{automation}``
   with an API key for ``seconds``; every event id is sent twice (the second a duplicate
   delivery, often racing its original on another connection): each must be answered 2xx and
   one run made per event id. Requests/s, latency p50/p99 (wrk's own histogram), commits per
   request, CPU milliseconds per request of the API processes, of PostgreSQL and of wrk.
2. **paced**: the same requests at a fixed ``rate`` (500/s), open loop: request i is due at
   ``t0 + i / rate`` whatever the answers before it, and its latency counts from that instant
   (so a slow answer delays the requests queued behind it in the figure, as it does for a
   caller). wrk's own pacing (``delay()``) sends nothing with a request built per call, so this
   phase's client is a minimal HTTP/1.1 client on raw asyncio streams, in this process, at a
   rate that costs it little; its CPU is reported.
3. **ceiling**: pgbench's minimal start (run, first step and wake in one statement) with 16
   clients, on the same database in the same sitting.

The printed ratio is requests/s over the pgbench start ceiling.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import psycopg

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
from onward.bench.throughput import AUTOMATION, FLOW
from onward.config import Settings
from onward.testing.processes import child_pids, cpu_seconds, free_port, peak_rss_mb

ORG = "bench"
CEILING_CLIENTS = 16

# Each wrk thread numbers its requests: odd ones carry a new event id, even ones repeat the id
# of the new request LAG new ids before (a provider's retry: its original has answered, unless
# the server is far behind; the first LAG repeat the id just sent, racing it), so half the
# requests are duplicates. done() prints one JSON line: wrk's
# totals, its latency percentiles (microseconds) and how many distinct ids were sent.
LAG = 8  # a duplicate repeats the event id of the request this many new ids before

LUA = r"""
local LAG = LAG_VALUE
local threads = {}
local counter = 0

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  tag = args[1]
  key = args[2]
  path = args[3]
  n = 0
end

function request()
  n = n + 1
  local k = math.floor((n + 1) / 2)
  if n % 2 == 0 and k > LAG then k = k - LAG end
  local ev = tag .. "-" .. id .. "-" .. k
  local body = '{"i":' .. k .. ',"email":"u' .. id .. "-" .. k .. '@example.com"}'
  return wrk.format("POST", path, {
    ["Authorization"] = "Bearer " .. key,
    ["Content-Type"] = "application/json",
    ["X-Event-Id"] = ev,
  }, body)
end

function done(summary, latency, requests)
  local sent = 0
  for _, t in ipairs(threads) do
    sent = sent + math.floor((t:get("n") + 1) / 2)
  end
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "ids_sent": %d, "connect_errors": %d, ' ..
    '"read_errors": %d, "write_errors": %d, "non_2xx": %d, "timeouts": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, sent, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max))
end
"""


async def _paced_load(
    port: int, key: str, tag: str, rate: int, seconds: float, conns: int
) -> tuple[list[float], list[int]]:
    from onward.bench.start import _read_response

    n = max(1, round(rate * seconds))
    pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(conns):
        pool.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    path = f"/v1/hooks/{AUTOMATION}"
    requests = []
    for i in range(n):
        k = i // 2 + 1  # odd requests (1-based) a new id, even ones a duplicate, as in LUA
        if i % 2 == 1 and k > LAG:
            k -= LAG
        body = json.dumps({"i": k, "email": f"p{k}@example.com"}).encode()
        requests.append(
            (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                f"X-Event-Id: {tag}-{k}\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
    latencies: list[float] = []
    statuses: list[int] = []
    loop = asyncio.get_running_loop()

    async def one(i: int, due: float) -> None:
        reader, writer = await pool.get()
        writer.write(requests[i])
        await writer.drain()
        status, _ = await _read_response(reader)
        latencies.append((loop.time() - due) * 1000)
        statuses.append(status)
        pool.put_nowait((reader, writer))

    # one dispatcher starts each request at its instant: thousands of tasks made up front
    # would each take their first turn of the loop at the start, and the first requests
    # would be late by the client's own set-up
    tasks = []
    t0 = loop.time()
    for i in range(n):
        due = t0 + i / rate
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    while not pool.empty():
        _, writer = pool.get_nowait()
        writer.close()
    return latencies, statuses


def _paced(
    url: str, port: int, key: str, api_pids: list[int], *, tag: str, rate: int, seconds: float
) -> dict[str, Any]:
    cpu0, api0 = cpu_snapshot(), cpu_seconds(api_pids)
    me0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    lat, statuses = asyncio.run(_paced_load(port, key, tag, rate, seconds, conns=64))
    elapsed = time.perf_counter() - t0
    me1 = resource.getrusage(resource.RUSAGE_SELF)
    api1, cpu1 = cpu_seconds(api_pids), cpu_snapshot()
    n = len(lat)
    ids = (n + 1) // 2
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE org_id = %s AND start_key LIKE %s",
            (ORG, f"{AUTOMATION}:{tag}-%"),
        ).fetchone()
    runs = int(row[0]) if row else 0
    non_2xx = sum(1 for s in statuses if not 200 <= s < 300)
    pg = cpu_delta(cpu0, cpu1)
    client = (me1.ru_utime + me1.ru_stime) - (me0.ru_utime + me0.ru_stime)
    return {
        "requests": n,
        "target_per_s": rate,
        "elapsed_s": round(elapsed, 3),
        "per_s": round(n / elapsed, 1) if elapsed > 0 else 0.0,
        "latency_ms_p50": round(median(lat), 2),
        "latency_ms_p90": round(percentile(lat, 90), 2),
        "latency_ms_p99": round(percentile(lat, 99), 2),
        "latency_ms_max": round(max(lat, default=0.0), 2),
        "non_2xx": non_2xx,
        "socket_errors": 0,
        "ids_sent": ids,
        "runs_in_database": runs,
        "consistent": non_2xx == 0 and runs == ids,
        "api_cpu_ms_per_request": round((api1 - api0) * 1000 / max(n, 1), 3),
        "pg_cpu_ms_per_request": round(pg["pg_cpu_s"] * 1000 / max(n, 1), 3),
        "client_cpu_ms_per_request": round(client * 1000 / max(n, 1), 3),
        "machine_busy": pg["machine_busy"],
    }


def find_wrk() -> str | None:
    return shutil.which("wrk")


async def _prepare(url: str) -> str:
    from onward import api_keys
    from onward.engine import Engine

    settings = Settings(database_url=url, org_id=ORG, queue="postgres")
    async with Engine.open(settings, migrate=False, start_queue=False, pool_size=2) as engine:
        await engine.publish(FLOW)
        _, key = await api_keys.create(
            engine.engine_pool, ORG, name="bench-intake", scopes=["runs:write"], by="bench"
        )
    return key


def _start_api(url: str, port: int, workers: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "ONWARD_DATABASE_URL": url,
        "ONWARD_ORG": ORG,
        "ONWARD_QUEUE": "postgres",
        "ONWARD_INTAKE_LIMIT": "0",  # the bench measures the server, not the intake limit
        "ONWARD_LOG_LEVEL": "warning",
    }
    argv = [sys.executable, "-m", "onward.cli", "api", "--port", str(port)]
    argv += ["--workers", str(workers)]
    # its log to a file: a pipe nobody reads would fill and stop the server mid-write
    log = tempfile.TemporaryFile()  # noqa: SIM115  (open as long as the server runs)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    up = 0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            err = log.read().decode(errors="replace")
            raise RuntimeError(f"onward api exited {proc.returncode}: {err[-800:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                up += 1
                if up >= 3 * workers:  # a few answers: every process has had its chance
                    return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("onward api did not answer /healthz within 60 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wrk(
    url: str,
    port: int,
    key: str,
    api_pids: list[int],
    *,
    tag: str,
    seconds: float,
    connections: int,
    threads: int,
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(LUA.replace("LAG_VALUE", str(LAG)))
        script = f.name
    path = f"/v1/hooks/{AUTOMATION}"
    argv = [
        find_wrk() or "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        script,
        f"http://127.0.0.1:{port}",
        "--",
        tag,
        key,
        path,
    ]
    cpu0, api0 = cpu_snapshot(), cpu_seconds(api_pids)
    wrk0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wrk1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    api1, cpu1 = cpu_seconds(api_pids), cpu_snapshot()
    os.unlink(script)
    line = next((x for x in done.stdout.splitlines() if x.startswith("{")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr[-500:]}")
    w = json.loads(line)
    n = max(int(w["requests"]), 1)
    elapsed = w["duration_us"] / 1e6
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE org_id = %s AND start_key LIKE %s",
            (ORG, f"{AUTOMATION}:{tag}-%"),
        ).fetchone()
    runs = int(row[0]) if row else 0
    errors = sum(int(w[k]) for k in ("connect_errors", "read_errors", "write_errors", "timeouts"))
    wrk_cpu = (wrk1.ru_utime + wrk1.ru_stime) - (wrk0.ru_utime + wrk0.ru_stime)
    pg = cpu_delta(cpu0, cpu1)
    return {
        "requests": n,
        "elapsed_s": round(elapsed, 3),
        "per_s": round(n / elapsed, 1) if elapsed > 0 else 0.0,
        "latency_ms_p50": round(w["p50_us"] / 1000, 2),
        "latency_ms_p90": round(w["p90_us"] / 1000, 2),
        "latency_ms_p99": round(w["p99_us"] / 1000, 2),
        "latency_ms_max": round(w["max_us"] / 1000, 2),
        "connections": connections,
        "non_2xx": int(w["non_2xx"]),
        "socket_errors": errors,
        "ids_sent": int(w["ids_sent"]),
        "runs_in_database": runs,
        # every id answered made at most one run; ids whose requests were still in flight when
        # wrk stopped may or may not have one
        "consistent": int(w["non_2xx"]) == 0 and errors == 0 and runs <= int(w["ids_sent"]),
        "api_cpu_ms_per_request": round((api1 - api0) * 1000 / n, 3),
        "pg_cpu_ms_per_request": round(pg["pg_cpu_s"] * 1000 / n, 3),
        "wrk_cpu_ms_per_request": round(wrk_cpu * 1000 / n, 3),
        "machine_busy": pg["machine_busy"],
    }


#: how long a PostgreSQL 15 backend may hold its statistics after going idle
#: (PGSTAT_IDLE_INTERVAL): the API's start-up must be counted before the clock starts
STATS_IDLE_S = 10.5


def run(
    admin_url: str,
    *,
    quick: bool = False,
    workers: int | None = None,
    seconds: float | None = None,
    connections: int | None = None,
    rate: int | None = None,
) -> dict[str, Any]:
    """``workers``: API processes (``onward api --workers``); ``rate``: the paced phase's
    requests/s."""
    if find_wrk() is None:
        raise RuntimeError("wrk not found: install Debian's package wrk (apt-get install wrk)")
    w = workers or 2
    secs = seconds or (2.0 if quick else 10.0)
    conns = connections or (8 if quick else 32)
    paced_rate = rate or (100 if quick else 500)
    res: dict[str, Any] = {"bench": "intake", "api_processes": w, "seconds": secs}
    with scratch_database(admin_url, "intake") as url:
        key = asyncio.run(_prepare(url))
        port = free_port()
        api = _start_api(url, port, w)
        try:
            pids = [api.pid, *child_pids(api.pid)]
            time.sleep(STATS_IDLE_S)  # the API's start-up statements counted before db0
            db0 = db_counters(url)
            res["open"] = _wrk(
                url, port, key, pids, tag="open", seconds=secs, connections=conns,
                threads=2,
            )  # fmt: skip
            res["paced"] = _paced(url, port, key, pids, tag="paced", rate=paced_rate, seconds=secs)
            res["api_rss_mb"] = peak_rss_mb(pids)
        finally:
            _stop(api)  # its backends exit and report every statistic they held
        settle_stats()
        db1 = db_counters(url)
        n = res["open"]["requests"] + res["paced"]["requests"]
        # both phases together: a backend reports its counts up to 10 s late while connected
        res["commits_per_request"] = round(db_delta(db0, db1)["commits"] / max(n, 1), 3)
        pg: list[dict[str, Any]] = []
        if find_pgbench() is not None:
            prepare_pgbench(url)
            pg.append(pgbench(url, "start_cte", CEILING_CLIENTS, 2_000 if quick else 20_000))
        res["pgbench"] = pg
    ceiling = max((p.get("tps", 0.0) for p in pg), default=0.0)
    res["ceiling_per_s"] = ceiling
    res["ratio"] = round(res["open"]["per_s"] / ceiling, 3) if ceiling else None
    return res


def render(res: dict[str, Any]) -> str:
    lines = [
        f"webhook starts over HTTP, half duplicates, {res['api_processes']} API processes "
        f"(onward api --workers), load from wrk, {res['seconds']:g} s a phase",
        f"{'phase':<8} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
        f"{'api ms':>7} {'pg ms':>6} {'load ms':>7} {'busy':>5}  consistent",
    ]
    for name in ("open", "paced"):
        r = res[name]
        lines.append(
            f"{name:<8} {r['per_s']:>8.1f} {r['latency_ms_p50']:>7.2f} {r['latency_ms_p99']:>7.2f} "
            f"{r['latency_ms_max']:>7.1f} "
            f"{r['api_cpu_ms_per_request']:>7.3f} {r['pg_cpu_ms_per_request']:>6.3f} "
            f"{r.get('wrk_cpu_ms_per_request', r.get('client_cpu_ms_per_request', 0)):>7.3f} "
            f"{r['machine_busy'] or 0:>5.2f}  "
            f"{r['consistent']} ({r['runs_in_database']} runs for {r['ids_sent']} ids, "
            f"{r['non_2xx']} non-2xx, {r['socket_errors']} socket errors)"
        )
    lines.append(
        f"ceiling: pgbench minimal start, {CEILING_CLIENTS} clients: {res['ceiling_per_s']:.0f}/s"
        f"; open throttle = {res['ratio']} of it; paced target {res['paced']['target_per_s']}/s"
        f"; API processes' peak RSS {res['api_rss_mb']} MB; commits per request, both phases: "
        f"{res['commits_per_request']}"
    )
    lines.append(
        "(ms columns: CPU milliseconds per request of the API processes, PostgreSQL and the "
        "load generator: wrk for open, this process's paced client for paced)"
    )
    return "\n".join(lines)
