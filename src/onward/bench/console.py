"""``onward bench console``: the console's run list and a 1,000-transition run page with a
million runs in the database.

A scratch database gets ``runs`` runs (1,000,000; 20,000 with ``--quick``) of one
organisation, written set-based with ``generate_series`` (:func:`fill`): three automations of
two versions each, created 2.5 s apart (about a month), mostly completed, 1 % waiting on a
timer, 1 % failed, 0.1 % parked on a budget, one in seven with a contact. Then one run of a
looping automation with 333 steps and 1,001 history rows (:func:`fill_long_run`). ANALYZE.

The console is served as ``onward api`` serves it (``create_app`` under uvicorn, in this
process), logged in with a key. Each page is requested ``repeat`` times after a warm-up; the
figures are medians of the server's own time (its ``Server-Timing`` header: reads and
rendering) and of the round trip. Pages: the list's first page, unfiltered and under each
filter; a page deep in the list (its keyset cursor 90 % of the way back); the long run's page.

Ceilings from the same sitting: the round trip of ``/healthz`` (one ``SELECT 1`` through the
same server: the least any page costs) and PostgreSQL's own execution time of the first page's
query (``EXPLAIN ANALYZE``), whose plan is printed to show the index it reads.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlencode

import httpx
import psycopg
from psycopg.rows import dict_row

from onward import Automation
from onward.bench import median
from onward.bench.db import scratch_database
from onward.config import Settings
from onward.console.reads import Q as READS_Q
from onward.engine import Engine

ORG = "bench"
AUTOMATIONS = ("bench-a", "bench-b", "bench-c")
LONG = "bench-loop"
LONG_STEPS = 333
GOAL_MS = 200.0


def fill(conn: psycopg.Connection[Any], count: int) -> None:
    """``count`` runs of ``ORG``, the newest created now, one every 2.5 s before it; unfinished
    ones with their step (and a waiting one's timer), so each has its way forward."""
    args = {"org": ORG, "n": count, "autos": list(AUTOMATIONS)}
    conn.execute(
        """
        INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind,
                          status, status_reason, input, ctx, visits, current_seq,
                          steps_executed, max_steps, deadline_at, contact_id, created_at,
                          updated_at, finished_at)
        SELECT %(org)s, 'run_' || lpad(g::text, 9, '0'),
               (%(autos)s::text[])[1 + g %% 3], 1 + (g / 3) %% 2, 'bench:' || g, 'event',
               s.status,
               CASE WHEN s.status = 'parked' THEN 'budget * (tokens): 300 of 300 used' END,
               jsonb_build_object('n', g), '{}', '{}', 2, 2, 1000, t.at + interval '30 days',
               CASE WHEN g %% 7 = 0 THEN 'c_' || (g %% 5000) END, t.at, t.at,
               CASE WHEN s.status IN ('completed', 'failed') THEN t.at + interval '2 s' END
        FROM generate_series(1, %(n)s::int) AS g
        CROSS JOIN LATERAL (
            SELECT now() - (%(n)s::int - g) * interval '2.5 seconds' AS at
        ) AS t
        CROSS JOIN LATERAL (
            SELECT CASE WHEN g %% 1000 = 0 THEN 'parked' WHEN g %% 100 = 1 THEN 'waiting'
                        WHEN g %% 100 = 2 THEN 'failed' ELSE 'completed' END AS status
        ) AS s
        """,
        args,
    )
    conn.execute(
        """
        INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, status, attempt,
                           wait_kind, created_at, updated_at)
        SELECT org_id, run_id, 1, 'first', 'wait', 'wait', status, 1,
               CASE status WHEN 'waiting' THEN 'timer' ELSE 'budget' END, created_at, created_at
        FROM runs WHERE org_id = %(org)s AND status IN ('waiting', 'parked')
        """,
        args,
    )
    conn.execute(
        """
        INSERT INTO timers (org_id, run_id, seq, purpose, intent, due_at)
        SELECT org_id, run_id, 1, 'wait', '{"seconds": 86400}', created_at + interval '1 day'
        FROM runs WHERE org_id = %(org)s AND status = 'waiting'
        """,
        args,
    )


def fill_long_run(conn: psycopg.Connection[Any]) -> str:
    """One completed run of ``LONG`` with ``LONG_STEPS`` steps (count/check, looping, then
    done) and three history rows per step plus its start and end: 1,001 transitions."""
    run_id = "run_long_000000001"
    args = {"org": ORG, "run": run_id, "a": LONG, "n": LONG_STEPS}
    conn.execute(
        """
        INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind,
                          status, input, ctx, visits, current_seq, steps_executed, max_steps,
                          deadline_at, created_at, updated_at, finished_at)
        VALUES (%(org)s, %(run)s, %(a)s, 1, 'bench:long', 'event', 'completed', '{}', '{}',
                '{}', %(n)s, %(n)s, 1000, now() + interval '30 days',
                now() - interval '1 hour', now(), now())
        """,
        args,
    )
    conn.execute(
        """
        INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, status, attempt, owner,
                           output, created_at, updated_at, finished_at)
        SELECT %(org)s, %(run)s, g,
               CASE WHEN g = %(n)s THEN 'done' WHEN g %% 2 = 1 THEN 'count' ELSE 'check' END,
               CASE WHEN g %% 2 = 0 AND g < %(n)s THEN 'branch' ELSE 'set' END, 'fast', 'done',
               1, 'bench-worker', jsonb_build_object('round', g / 2),
               now() - interval '1 hour' + g * interval '10 ms',
               now() - interval '1 hour' + g * interval '10 ms',
               now() - interval '1 hour' + g * interval '10 ms'
        FROM generate_series(1, %(n)s::int) AS g
        """,
        args,
    )
    conn.execute(
        """
        INSERT INTO history_log (org_id, run_id, at, event, seq, step_id, attempt, worker, detail)
        SELECT %(org)s, %(run)s, now() - interval '1 hour' + (g * 3 + e.n) * interval '3 ms',
               e.event, g, s.step_id, CASE WHEN e.n > 0 THEN 1 END, 'bench-worker',
               CASE WHEN e.n = 2 THEN jsonb_build_object('output', s.output) END
        FROM generate_series(1, %(n)s::int) AS g
        JOIN steps s ON s.org_id = %(org)s AND s.run_id = %(run)s AND s.seq = g
        CROSS JOIN (VALUES (0, 'step_ready'), (1, 'step_claimed'), (2, 'step_done')) AS e(n, event)
        UNION ALL
        SELECT %(org)s, %(run)s, now() - interval '1 hour' - interval '1 ms', 'run_started',
               NULL, NULL, NULL, NULL, '{"start_key": "bench:long"}'
        UNION ALL
        SELECT %(org)s, %(run)s, now(), 'run_completed', NULL, NULL, NULL, NULL, NULL
        ORDER BY 3
        """,
        args,
    )
    return run_id


def _documents() -> list[dict[str, Any]]:
    docs = []
    for name in AUTOMATIONS:
        for version in (1, 2):
            flow = Automation(name).step("first", "set", values={"v": str(version)})
            docs.append(flow.step("second", "set", values={"w": "1"}).build())
    loop = {
        "id": LONG,
        "steps": [
            {"id": "count", "kind": "set", "with": {"values": {"round": "1"}}, "next": "check"},
            {
                "id": "check",
                "kind": "branch",
                "with": {"cases": [{"when": "true", "next": "count"}], "default": "done"},
            },
            {"id": "done", "kind": "set", "with": {"values": {"finished": "true"}}},
        ],
    }
    return [*docs, loop]


async def _serve(url: str, paths: dict[str, str], repeat: int) -> dict[str, Any]:
    from onward.api import ApiServer, create_app

    settings = Settings(database_url=url, org_id=ORG, queue="postgres")
    async with Engine.open(settings, migrate=False, start_queue=False) as engine:
        _, key = await engine.create_key("bench", ["runs:read"])
        api = ApiServer(create_app(engine), port=0, log_level="warning", access_log=False)
        async with api, httpx.AsyncClient(base_url=api.url, timeout=60.0) as http:
            login = await http.post("/login", data={"key": key, "next": "/"})
            assert login.status_code == 303, login.text
            out: dict[str, Any] = {}
            for name, path in {"healthz": "/healthz", **paths}.items():
                server, trip = [], []
                for i in range(repeat + 2):  # two warm-ups
                    began = time.perf_counter()
                    reply = await http.get(path)
                    elapsed = (time.perf_counter() - began) * 1000
                    assert reply.status_code == 200, (path, reply.status_code, reply.text[:300])
                    if i >= 2:
                        trip.append(elapsed)
                        timing = reply.headers.get("server-timing", "")
                        if "dur=" in timing:
                            server.append(float(timing.split("dur=")[1]))
                out[name] = {
                    "path": path,
                    "server_ms": median(server) if server else None,
                    "round_trip_ms": median(trip),
                    "bytes": len(reply.content),
                }
            return out


def _explain(conn: psycopg.Connection[Any], args: dict[str, Any]) -> tuple[list[str], float]:
    rows = conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + READS_Q.page_older, args).fetchall()
    lines = [r["QUERY PLAN"] for r in rows]
    took = next(
        (float(x.split(":")[1].split()[0]) for x in lines if x.startswith("Execution Time")), 0.0
    )
    return lines, took


def run(database_url: str, *, quick: bool = False, runs: int | None = None) -> dict[str, Any]:
    count = runs or (20_000 if quick else 1_000_000)
    repeat = 5 if quick else 15
    with scratch_database(database_url, "console") as url:

        async def publish() -> None:
            settings = Settings(database_url=url, org_id=ORG, queue="postgres")
            async with Engine.open(settings, migrate=False, start_queue=False) as engine:
                for doc in _documents():
                    await engine.publish(doc)

        asyncio.run(publish())
        began = time.perf_counter()
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            fill(conn, count)
            long_run = fill_long_run(conn)
            conn.execute("VACUUM ANALYZE runs, steps, history_log, timers")
            seeded_s = time.perf_counter() - began
            total = conn.execute("SELECT count(*) AS n FROM runs").fetchone()
            deep = conn.execute(
                "SELECT created_at, run_id FROM runs WHERE org_id = %s "
                "ORDER BY created_at DESC, run_id DESC OFFSET %s LIMIT 1",
                (ORG, int(count * 0.9)),
            ).fetchone()
            assert total is not None and deep is not None
            none = dict.fromkeys(
                ("status", "automation_id", "version", "contact_id", "parked", "since", "until")
            )
            plan, sql_ms = _explain(
                conn, {**none, "org_id": ORG, "limit": 51, "cursor_at": None, "cursor_id": None}
            )
        cursor = f"{deep['created_at'].isoformat()}~{deep['run_id']}"
        paths = {
            "list first page": "/",
            "list status=failed": "/?status=failed",
            "list status=completed": "/?status=completed",
            "list automation=bench-b": "/?automation=bench-b",
            "list automation+version": "/?automation=bench-b&version=2",
            "list parked=budget": "/?parked=budget",
            "list contact": "/?contact=c_77",
            "list range=24h": "/?range=24h",
            "list 90% back (keyset)": "/?" + urlencode({"before": cursor}),
            "run, 1,001 transitions": f"/runs/{long_run}",
        }
        served = asyncio.run(_serve(url, paths, repeat))
    return {
        "runs": total["n"],
        "seeded_s": seeded_s,
        "repeat": repeat,
        "pages": served,
        "sql_first_page_ms": sql_ms,
        "plan_first_page": plan,
        "goal_ms": GOAL_MS,
    }


def render(res: dict[str, Any]) -> str:
    pages = res["pages"]
    lines = [
        f"console: {res['runs']:,} runs seeded in {res['seeded_s']:.1f}s; medians of "
        f"{res['repeat']} requests after 2 warm-ups (goal < {res['goal_ms']:.0f} ms server time)",
        "",
        f"{'page':<28} {'server ms':>10} {'round trip ms':>14} {'KiB':>7}",
    ]
    for name, p in pages.items():
        server = "—" if p["server_ms"] is None else f"{p['server_ms']:.1f}"
        mark = ""
        if p["server_ms"] is not None:
            mark = "  ok" if p["server_ms"] < res["goal_ms"] else "  OVER GOAL"
        lines.append(
            f"{name:<28} {server:>10} {p['round_trip_ms']:>14.1f} {p['bytes'] / 1024:>7.1f}{mark}"
        )
    lines += [
        "",
        f"ceiling: /healthz round trip {pages['healthz']['round_trip_ms']:.1f} ms (one SELECT 1 "
        f"through the same server); PostgreSQL executes the first page's query in "
        f"{res['sql_first_page_ms']:.2f} ms:",
        *("  " + line for line in res["plan_first_page"]),
    ]
    return "\n".join(lines)
