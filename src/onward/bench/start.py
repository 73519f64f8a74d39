"""``onward bench start``: runs started per second, by webhook over HTTP and through the library.

One sitting, on a scratch database, no worker running:

1. **webhook**: the API (``onward api``: uvicorn in its own process, no worker) takes
   ``POST /v1/hooks/{automation_id}`` with an API key (``Authorization: Bearer``) from
   ``clients`` concurrent keep-alive connections. Half of the requests are duplicate
   deliveries (every event id is sent twice, in shuffled order, so some duplicates race their
   original): each must be answered ``200`` with the original's run id, and exactly one run
   must exist per event id. The client is a minimal HTTP/1.1 client on raw asyncio streams,
   so it costs the machine little.
   **What authentication costs**, the same load twice more: without a key, the route as it
   was before API keys (the API process patched, ``--what-if no-key``); and on the signed
   path a provider uses, ``POST /v1/orgs/{org}/hooks/{automation_id}`` with Standard Webhooks
   headers (``standardwebhooks``, signed before the clock starts; the automation given a
   secret after the other rows, since a secret makes ``/v1/hooks`` require the signature too).
2. **library**: ``Engine.start`` from ``clients`` concurrent tasks: new runs, then the same
   event ids again (duplicates), then one at a time (the latency of a single start).
3. **batches**: ``Engine.start_many`` with 1,000 starts a batch from ``batch_clients`` tasks
   (new runs), and ``POST /v1/runs:batch`` with the same batches over HTTP (the API in its own
   process); each charged its commits per run. Their figure is runs per second.
4. **ceiling**: onward's own start statement (``start.sql``) from a plain psycopg loop with
   the same connections (no version lookup, no pool), and pgbench's minimal start -- run,
   first step and wake in one statement -- at 1 and ``clients`` clients.

Every phase is charged its commits (``pg_stat_database.xact_commit``) per start.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from standardwebhooks import Webhook

from onward import ids
from onward.bench import median, percentile
from onward.bench.ceiling import (
    db_counters,
    db_delta,
    find_pgbench,
    pgbench,
    prepare_pgbench,
    settle_stats,
)
from onward.bench.db import scratch_database
from onward.bench.proc import Child, warm_pool
from onward.bench.throughput import AUTOMATION, FLOW
from onward.config import Settings, env_start_batches
from onward.engine import Engine
from onward.start import Q as START_Q
from onward.start import Start

ORG = "bench"


def _settings(url: str) -> Settings:
    return Settings(
        database_url=url, org_id=ORG, queue="postgres", start_batches=env_start_batches()
    )


def _figures(
    n: int, elapsed: float, lat: list[float], commits: int | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "requests": n,
        "elapsed_s": round(elapsed, 3),
        "per_s": round(n / elapsed, 1) if elapsed > 0 else 0.0,
        "latency_ms_p50": round(median(lat), 2),
        "latency_ms_p99": round(percentile(lat, 99), 2),
    }
    if commits is not None:
        out["commits_per_request"] = round(commits / max(n, 1), 3)
    return out


# -- the HTTP client -----------------------------------------------------------------------------


class _Answer:
    __slots__ = ("duplicate", "event_id", "ms", "run_id", "status")

    def __init__(self, event_id: str, status: int, body: bytes, ms: float) -> None:
        self.event_id, self.status, self.ms = event_id, status, ms
        try:
            doc = json.loads(body)
        except ValueError:
            doc = {}
        self.run_id = doc.get("run_id") if isinstance(doc, dict) else None
        self.duplicate = bool(doc.get("duplicate")) if isinstance(doc, dict) else False


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection")
    status = int(status_line.split()[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return status, await reader.readexactly(length) if length else b""


#: The header lines that authenticate one request, by its event id (made before the clock).
Credentials = Callable[[str], str]


def _bearer(key: str) -> Credentials:
    line = f"Authorization: Bearer {key}\r\n"
    return lambda _event_id: line


def _signed(secret: str, work: list[tuple[str, bytes]]) -> Credentials:
    """Standard Webhooks headers for each event of ``work`` (its id the message id), signed
    now: the signing is the sender's cost, not the server's, and stays out of the clock."""
    hook, now = Webhook(secret), datetime.now(UTC)
    lines = {
        event_id: (
            f"webhook-id: {event_id}\r\nwebhook-timestamp: {int(now.timestamp())}\r\n"
            f"webhook-signature: {hook.sign(event_id, now, body.decode())}\r\n"
        )
        for event_id, body in work
    }
    return lines.__getitem__


def _no_credentials(_event_id: str) -> str:
    return ""


async def _http_client(
    host: str,
    port: int,
    path: str,
    credentials: Credentials,
    work: list[tuple[str, bytes]],
    answers: list[_Answer],
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while work:
            event_id, body = work.pop()
            head = (
                f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{credentials(event_id)}"
                f"Content-Type: application/json\r\nX-Event-Id: {event_id}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            t0 = time.perf_counter()
            writer.write(head + body)
            await writer.drain()
            status, answer = await _read_response(reader)
            answers.append(_Answer(event_id, status, answer, (time.perf_counter() - t0) * 1e3))
    finally:
        writer.close()
        await writer.wait_closed()


#: How a row's requests authenticate: an API key (Bearer), none (with ``--what-if no-key``),
#: or a Standard Webhooks signature on the signed path (the secret is the row's ``secret``).
AUTHS = ("key", "none", "signed")


async def _webhook_load(
    url: str,
    n: int,
    clients: int,
    prefix: str = "evt",
    *,
    auth: str = "key",
    key: str = "",
    secret: str = "",
) -> tuple[float, list[_Answer]]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    unique = n // 2
    work = [
        (f"{prefix}-{i}", json.dumps({"i": i, "email": f"u{i}@example.com"}).encode())
        for i in range(unique)
    ] * 2
    random.Random(7).shuffle(work)
    path, credentials = {
        "key": lambda: (f"/v1/hooks/{AUTOMATION}", _bearer(key)),
        "none": lambda: (f"/v1/hooks/{AUTOMATION}", _no_credentials),
        "signed": lambda: (f"/v1/orgs/{ORG}/hooks/{AUTOMATION}", _signed(secret, work)),
    }[auth]()
    answers: list[_Answer] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(_http_client(host, port, path, credentials, work, answers) for _ in range(clients))
    )
    return time.perf_counter() - t0, answers


def _webhook(
    url: str,
    n: int,
    clients: int,
    pool: int,
    what_if: str = "",
    prefix: str = "evt",
    *,
    auth: str = "key",
    secret: str = "",
) -> dict[str, Any]:
    args = ["api", "--url", url, "--org", ORG, "--pool", str(pool)]
    for part in filter(None, what_if.split("+")):
        args += ["--what-if", part]
    api = Child(*args)
    try:
        ready = api.wait_ready()
        settle_stats()
        db0 = db_counters(url)
        api.send("go")
        elapsed, answers = asyncio.run(
            _webhook_load(
                ready["url"], n, clients, prefix, auth=auth, key=ready["key"], secret=secret
            )
        )
        api.send("stop")
        done = api.finish()
    finally:
        api.kill()
    settle_stats()
    db1 = db_counters(url)
    commits = db_delta(db0, db1)["commits"]
    statuses: dict[str, int] = {}
    first: dict[str, str | None] = {}
    mismatched = 0
    for a in answers:
        statuses[str(a.status)] = statuses.get(str(a.status), 0) + 1
        if a.event_id in first and first[a.event_id] != a.run_id:
            mismatched += 1
        first.setdefault(a.event_id, a.run_id)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE org_id = %s AND start_key LIKE %s",
            (ORG, f"{AUTOMATION}:{prefix}-%"),
        ).fetchone()
    runs = int(row[0]) if row else 0
    out = _figures(len(answers), elapsed, [a.ms for a in answers], commits)
    out.update(
        auth=auth,
        clients=clients,
        statuses=statuses,
        created=sum(1 for a in answers if a.status == 202),
        duplicates=sum(1 for a in answers if a.status == 200 and a.duplicate),
        runs_in_database=runs,
        duplicate_run_id_mismatches=mismatched,
        consistent=runs == n // 2 and mismatched == 0 and statuses.get("202", 0) == n // 2,
        server_cpu_ms_per_request=round(done["cpu_s"] * 1000 / max(len(answers), 1), 3),
        server_rss_mb=round(done["vm_hwm_kb"] / 1024, 1),
    )
    return out


async def _hook_secret(url: str) -> str:
    """Give the automation a Standard Webhooks secret (what the signed path requires)."""
    async with Engine.open(_settings(url), migrate=False, start_queue=False, pool_size=1) as e:
        added = await e.add_hook_secret(AUTOMATION)
    secret: str = added["secret"]
    return secret


# -- the library ---------------------------------------------------------------------------------


async def _library_pass(
    engine: Engine, event_ids: list[str], clients: int
) -> tuple[float, list[float], int]:
    work = list(reversed(event_ids))
    lat: list[float] = []
    created = 0

    async def one() -> None:
        nonlocal created
        while work:
            eid = work.pop()
            t0 = time.perf_counter()
            started = await engine.start(AUTOMATION, {"e": eid}, event_id=eid)
            lat.append((time.perf_counter() - t0) * 1e3)
            created += int(started.created)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return time.perf_counter() - t0, lat, created


async def _library_engine(url: str, ids_: list[str], clients: int, pool: int) -> dict[str, Any]:
    async with Engine.open(_settings(url), migrate=False, pool_size=pool, start_queue=False) as e:
        await warm_pool(e.pool, pool)
        el, lat, created = await _library_pass(e, ids_, clients)
    return {**_figures(max(len(ids_), 1), el, lat), "created": created}


def _library(url: str, n: int, clients: int, pool: int) -> dict[str, Any]:
    """New runs, the same event ids again, then one at a time; each pass in its own engine so
    its commits can be read once its connections are gone, less those of opening and closing
    an engine that starts nothing (measured first)."""
    out: dict[str, Any] = {"clients": clients}
    settle_stats()
    db0 = db_counters(url)
    asyncio.run(_library_engine(url, [], 1, pool))
    settle_stats()
    baseline = db_delta(db0, db_counters(url))["commits"]
    ids_new = [f"lib-{i}" for i in range(n)]
    passes = {
        "new": (ids_new, clients),
        "duplicate": (ids_new, clients),
        "sequential": ([f"lib1-{i}" for i in range(max(n // 10, 10))], 1),
    }
    for name, (ids_, k) in passes.items():
        settle_stats()
        db0 = db_counters(url)
        fig = asyncio.run(_library_engine(url, ids_, k, pool))
        settle_stats()
        commits = db_delta(db0, db_counters(url))["commits"] - baseline
        out[name] = {**fig, "commits_per_request": round(commits / len(ids_), 3)}
    return out


# -- batches -------------------------------------------------------------------------------------

#: Starts in one batch (the most ``start_many`` takes).
BATCH = 1000


def _batches(prefix: str, n: int) -> list[list[Start]]:
    starts = [
        Start(AUTOMATION, {"i": i, "email": f"u{i}@example.com"}, event_id=f"{prefix}-{i}")
        for i in range(n)
    ]
    return [starts[i : i + BATCH] for i in range(0, n, BATCH)]


def _batch_figures(
    runs: int, elapsed: float, lat: list[float], commits: int, clients: int
) -> dict[str, Any]:
    return {
        "runs": runs,
        "batch": BATCH,
        "clients": clients,
        "elapsed_s": round(elapsed, 3),
        "per_s": round(runs / elapsed, 1) if elapsed > 0 else 0.0,
        "latency_ms_p50": round(median(lat), 2),  # of one batch
        "latency_ms_p99": round(percentile(lat, 99), 2),
        "commits_per_request": round(commits / max(len(lat), 1), 3),  # per batch
    }


async def _library_batches(url: str, n: int, clients: int) -> tuple[float, list[float], int]:
    work = _batches("batch", n)
    lat: list[float] = []
    created = 0
    async with Engine.open(
        _settings(url), migrate=False, pool_size=clients, start_queue=False
    ) as e:
        await warm_pool(e.pool, clients)

        async def one() -> None:
            nonlocal created
            while work:
                batch = work.pop()
                t0 = time.perf_counter()
                answers = await e.start_many(batch)
                lat.append((time.perf_counter() - t0) * 1e3)
                created += sum(a.created for a in answers)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    return elapsed, lat, created


def _library_batch(url: str, n: int, clients: int) -> dict[str, Any]:
    """New runs in batches from ``clients`` tasks. Commits are read once the engine's
    connections are gone (a connected backend may hold its statistics for seconds), less those
    of opening and closing an engine that starts nothing (measured first)."""

    def commits(n: int) -> tuple[int, tuple[float, list[float], int]]:
        settle_stats()
        db0 = db_counters(url)
        out = asyncio.run(_library_batches(url, n, clients))
        settle_stats()
        return db_delta(db0, db_counters(url))["commits"], out

    baseline, _ = commits(0)
    total, (elapsed, lat, created) = commits(n)
    figures = _batch_figures(n, elapsed, lat, total - baseline, clients)
    return {**figures, "created": created}


async def _http_batches(
    base: str, key: str, bodies: list[bytes], clients: int
) -> tuple[float, list[float], list[int], int]:
    parts = urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    lat: list[float] = []
    statuses: list[int] = []
    created = 0

    async def one() -> None:
        nonlocal created
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while bodies:
                body = bodies.pop()
                head = (
                    f"POST /v1/runs:batch HTTP/1.1\r\nHost: {host}:{port}\r\n"
                    f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                t0 = time.perf_counter()
                writer.write(head + body)
                await writer.drain()
                status, answer = await _read_response(reader)
                lat.append((time.perf_counter() - t0) * 1e3)
                statuses.append(status)
                if status == 200:
                    created += int(json.loads(answer)["created"])
        finally:
            writer.close()
            await writer.wait_closed()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return time.perf_counter() - t0, lat, statuses, created


def _http_batch_pass(
    url: str, bodies: list[bytes], clients: int, pool: int
) -> tuple[int, float, list[float], list[int], int, dict[str, Any]]:
    api = Child("api", "--url", url, "--org", ORG, "--pool", str(pool))
    try:
        ready = api.wait_ready()
        settle_stats()
        db0 = db_counters(url)
        api.send("go")
        elapsed, lat, statuses, created = asyncio.run(
            _http_batches(ready["url"], ready["key"], bodies, clients)
        )
        api.send("stop")
        done = api.finish()
    finally:
        api.kill()
    settle_stats()
    commits = db_delta(db0, db_counters(url))["commits"]
    return commits, elapsed, lat, statuses, created, done


def _http_batch(url: str, n: int, clients: int, pool: int) -> dict[str, Any]:
    """The same batches over HTTP, to an API process of their own; its commits less those of
    an API process that serves nothing (its statistics are flushed as it exits)."""
    bodies = [
        json.dumps(
            {
                "starts": [
                    {"automation_id": s.automation_id, "input": s.payload, "event_id": s.event_id}
                    for s in batch
                ]
            }
        ).encode()
        for batch in _batches("hbatch", n)
    ]
    baseline = _http_batch_pass(url, [], clients, pool)[0]
    commits, elapsed, lat, statuses, created, done = _http_batch_pass(url, bodies, clients, pool)
    return {
        **_batch_figures(n, elapsed, lat, commits - baseline, clients),
        "created": created,
        "statuses": {str(k): statuses.count(k) for k in sorted(set(statuses))},
        "server_cpu_ms_per_request": round(done["cpu_s"] * 1000 / max(len(lat), 1), 3),
    }


# -- the ceilings ----------------------------------------------------------------------------


async def _sql_loop(url: str, n: int, clients: int) -> dict[str, Any]:
    """onward's start statement alone, from ``clients`` plain connections."""
    conns = [
        await psycopg.AsyncConnection.connect(
            url, autocommit=True, row_factory=dict_row, prepare_threshold=0
        )
        for _ in range(clients)
    ]
    work = [
        {
            "org_id": "ceiling",
            "run_id": ids.new_run_id(),
            "automation_id": AUTOMATION,
            "version": 1,
            "start_key": f"{AUTOMATION}:sql-{i}",
            "start_key_kind": "event",
            "input": Jsonb({"i": i}),
            "step_id": "s1",
            "kind": "set",
            "lane": "fast",
            "max_steps": 1000,
            "max_age": 86400.0,
            "contact_id": None,
            "traceparent": None,
        }
        for i in range(n)
    ]
    lat: list[float] = []

    async def one(conn: psycopg.AsyncConnection[dict[str, Any]]) -> None:
        while work:
            args = work.pop()
            t0 = time.perf_counter()
            await conn.execute(START_Q.start_run, args)
            lat.append((time.perf_counter() - t0) * 1e3)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(c) for c in conns))
        elapsed = time.perf_counter() - t0
    finally:
        for c in conns:
            await c.close()
    return {**_figures(n, elapsed, lat), "clients": clients}


# -- the bench -------------------------------------------------------------------------------


def run(
    admin_url: str,
    *,
    quick: bool = False,
    runs: int | None = None,
    clients: int | None = None,
    pool: int | None = None,
    what_if: list[str] | None = None,
    batch_runs: int | None = None,
    batch_clients: int = 2,
) -> dict[str, Any]:
    """``what_if`` (diagnosis, from Python only): extra webhook rows, each with one change
    patched into the API process (``onward.bench.proc.API_WHAT_IF``; "a+b" for both).
    ``batch_runs``: runs started in batches of 1,000 (default 20,000; 2,000 with ``quick``),
    from ``batch_clients`` tasks (or HTTP connections)."""
    n = runs or (40 if quick else 2_000)
    n += n % 2  # half duplicates
    k = clients or (4 if quick else 16)
    pool = pool or (4 if quick else 10)
    res: dict[str, Any] = {"bench": "start", "requests": n, "clients": k, "pool": pool}
    with scratch_database(admin_url, "start") as url:

        async def publish() -> None:
            async with Engine.open(_settings(url), migrate=False, start_queue=False) as engine:
                await engine.publish(FLOW)

        asyncio.run(publish())
        res["webhook"] = _webhook(url, n, k, pool)
        res["webhook_no_key"] = _webhook(
            url, n, k, pool, what_if="no-key", prefix="nokey", auth="none"
        )
        res["what_if"] = [
            {"what_if": w, **_webhook(url, n, k, pool, what_if=w, prefix=f"wi{i}")}
            for i, w in enumerate(what_if or [])
        ]
        # last: with a secret, /v1/hooks requires the signature as well as the key
        secret = asyncio.run(_hook_secret(url))
        res["webhook_signed"] = _webhook(
            url, n, k, pool, prefix="sig", auth="signed", secret=secret
        )
        lib_n = n // 2
        res["library"] = _library(url, lib_n, k, pool)
        b_n = batch_runs or (2 * BATCH if quick else 20 * BATCH)
        res["library_batch"] = _library_batch(url, b_n, batch_clients)
        res["http_batch"] = _http_batch(url, b_n, batch_clients, pool)
        settle_stats()
        db0 = db_counters(url)
        res["sql_loop"] = asyncio.run(_sql_loop(url, lib_n, k))
        settle_stats()
        db1 = db_counters(url)
        res["sql_loop"]["commits_per_request"] = round(db_delta(db0, db1)["commits"] / lib_n, 3)
        pg: list[dict[str, Any]] = []
        if find_pgbench() is not None:
            prepare_pgbench(url)
            for c in sorted({1, k}):
                pg.append(pgbench(url, "start_cte", c, lib_n))
        res["pgbench"] = pg
    ceiling = max((p.get("tps", 0.0) for p in pg if p.get("clients") == k), default=0.0)
    res["ceiling_per_s"] = ceiling
    res["webhook_ratio"] = round(res["webhook"]["per_s"] / ceiling, 3) if ceiling else None
    base = res["webhook_no_key"]["per_s"]
    res["auth_cost"] = {  # requests/s against the same load without a key, in this sitting
        "key_vs_no_key": round(res["webhook"]["per_s"] / base, 3) if base else None,
        "signed_vs_no_key": round(res["webhook_signed"]["per_s"] / base, 3) if base else None,
    }
    res["library_ratio"] = round(res["library"]["new"]["per_s"] / ceiling, 3) if ceiling else None
    res["batch_ratio"] = round(res["library_batch"]["per_s"] / ceiling, 3) if ceiling else None
    return res


def render(res: dict[str, Any]) -> str:
    wh, lib, sq = res["webhook"], res["library"], res["sql_loop"]
    lines = [
        f"starts: {res['requests']} webhook requests (half duplicates) from {res['clients']} "
        f"concurrent clients; library starts from {lib['clients']} tasks; pool {res['pool']}",
        "",
        f"{'path':<42} {'per s':>8} {'p50 ms':>8} {'p99 ms':>8} {'commits/req':>12} "
        f"{'server CPU ms/req':>18}",
    ]

    def row(name: str, r: dict[str, Any], commits: Any = None) -> str:
        c = r.get("commits_per_request", commits)
        cs = f"{c:>12.2f}" if isinstance(c, (int, float)) else f"{'':>12}"
        srv = r.get("server_cpu_ms_per_request")
        ss = f"{srv:>18.2f}" if isinstance(srv, (int, float)) else ""
        return (
            f"{name:<42} {r['per_s']:>8.0f} {r['latency_ms_p50']:>8.2f} "
            f"{r['latency_ms_p99']:>8.2f} {cs} {ss}".rstrip()
        )

    lines.append(row("webhook POST /v1/hooks (50% duplicates)", wh))
    if "webhook_no_key" in res:
        lines.append(row("  the same without a key (before keys)", res["webhook_no_key"]))
        lines.append(row("  signed POST /v1/orgs/{org}/hooks", res["webhook_signed"]))
    for wi in res.get("what_if") or []:
        lines.append(row(f"  what-if: {wi['what_if']}", wi))
    lines.append(row("library Engine.start, new runs", lib["new"]))
    lines.append(row("library Engine.start, duplicates", lib["duplicate"]))
    lines.append(row("library Engine.start, one at a time", lib["sequential"]))
    lb, hb = res.get("library_batch"), res.get("http_batch")
    if lb is not None:
        lines.append(row("library Engine.start_many, 1,000 a batch", lb))
    if hb is not None:
        lines.append(row("POST /v1/runs:batch, 1,000 a batch", hb))
    lines.append(row("psycopg loop, onward's start SQL alone", sq))
    for p in res["pgbench"]:
        if "error" in p:
            lines.append(f"pgbench start_cte, {p['clients']} clients: error: {p['error']}")
        else:
            lines.append(
                f"{'pgbench minimal start CTE, ' + str(p['clients']) + ' clients':<42} "
                f"{p['tps']:>8.0f} {p['latency_ms']:>8.2f} {'':>8} {1.0:>12.2f}"
            )
    lines.append("")
    lines.append(
        f"webhook answers {wh['statuses']}: created {wh['created']}, duplicates "
        f"{wh['duplicates']}, runs in the database {wh['runs_in_database']}, duplicate answers "
        f"naming another run {wh['duplicate_run_id_mismatches']} -> "
        f"{'consistent' if wh['consistent'] else 'INCONSISTENT'}"
    )
    for name, r in (
        ("without a key", res.get("webhook_no_key")),
        ("signed", res.get("webhook_signed")),
    ):
        if r is not None:
            lines.append(
                f"webhook {name} answers {r['statuses']}: runs in the database "
                f"{r['runs_in_database']} -> {'consistent' if r['consistent'] else 'INCONSISTENT'}"
            )
    cost = res.get("auth_cost") or {}
    if cost.get("key_vs_no_key") is not None:
        lines.append(
            f"authentication: requests/s with an API key (Bearer) {cost['key_vs_no_key']:.2f}x, "
            f"signed (Standard Webhooks) {cost['signed_vs_no_key']:.2f}x those without a key"
        )
    lines.append(f"API server peak RSS {wh['server_rss_mb']} MB")
    if lb is not None:
        lines.append(
            f"batch rows: runs/s from {lb['clients']} tasks (HTTP: connections); p50/p99, commits"
            " and server CPU are one batch's (1,000 runs)"
        )
        for name, r in (("library", lb), ("HTTP", hb)):
            if r is not None:
                ok = r["created"] == r["runs"]
                lines.append(
                    f"{name} batches: created {r['created']} of {r['runs']} new runs"
                    + (f", answers {r['statuses']}" if "statuses" in r else "")
                    + f" -> {'consistent' if ok else 'INCONSISTENT'}"
                )
    if res.get("ceiling_per_s"):
        lines.append(
            f"webhook / ceiling (pgbench at {res['clients']} clients): {res['webhook_ratio']:.2f}; "
            f"library / ceiling: {res['library_ratio']:.2f}"
            + (
                f"; batch runs/s / ceiling: {res['batch_ratio']:.2f}"
                if res.get("batch_ratio") is not None
                else ""
            )
        )
    return "\n".join(lines)


__all__ = ["render", "run"]
