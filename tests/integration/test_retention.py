"""Retention (issue 13, Build 6): finished runs past their organisation's bound are deleted with
every row of theirs by the elected sweeper, in bounded batches, and nothing else is touched.

The proofs scan the rows themselves: every table of the schema, each row as text, for the ids
of the pruned runs (none left), and the rows naming the younger and the unfinished runs
(unchanged). The Show test prunes 100,000 finished runs while a worker runs plain steps."""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.bench.retention import fill
from onward.config import Settings
from onward.engine import Engine
from onward.errors import InvalidInput
from onward.retention import PruneLimits, set_days
from onward.sweep import Sweeper
from onward.testing import eventually

from .api_client import api_client


def tables(sql: psycopg.Connection[Any]) -> list[str]:
    rows = sql.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
    ).fetchall()
    return [r["tablename"] for r in rows]


def rows_naming(sql: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, int]:
    """Per table, the rows whose text (every column) names one of ``run_ids``."""
    pattern = "|".join(re.escape(r) for r in run_ids)
    out = {}
    for table in tables(sql):
        row = sql.execute(
            f"SELECT count(*) AS n FROM {table} t WHERE t::text ~ %s",
            (pattern,),
        ).fetchone()
        if row and row["n"]:
            out[table] = int(row["n"])
    return out


def run_id_tables(sql: psycopg.Connection[Any]) -> list[str]:
    rows = sql.execute(
        "SELECT c.table_name FROM information_schema.columns c "
        "JOIN information_schema.tables t USING (table_schema, table_name) "
        "WHERE c.table_schema = current_schema() AND c.column_name = 'run_id' "
        "AND t.table_type = 'BASE TABLE' ORDER BY c.table_name"
    ).fetchall()
    return [r["table_name"] for r in rows]


def give_every_table_a_row(sql: psycopg.Connection[Any], org: str, run_id: str) -> None:
    """Rows of a run in each table a run reaches besides runs/steps/history: what its signal,
    approval, effect, budget, limits and a delayed wake would leave."""
    key = f"{run_id}/greet/1"
    args = {"org": org, "run": run_id, "key": key}
    for statement in (
        """INSERT INTO signals (org_id, signal_id, name, correlation_key, run_id, status, seq)
           VALUES (%(org)s, 'email:' || %(run)s, 'reply', 'email:m-' || %(run)s, %(run)s,
                   'consumed', 1)""",
        """INSERT INTO correlations (org_id, key, run_id, seq, step_id)
           VALUES (%(org)s, 'email:m-' || %(run)s, %(run)s, 1, 'greet')""",
        """INSERT INTO approvals (org_id, approval_id, run_id, seq, step_id, request, digest,
                                  content, approvers, nonce, status, deadline_at)
           VALUES (%(org)s, %(key)s || '/1', %(run)s, 1, 'greet', 1, 'd', 'c', '{ana}', 'n',
                   'approved', now())""",
        """INSERT INTO effects (org_id, effect_key, run_id, seq, provider, status, result)
           VALUES (%(org)s, %(key)s, %(run)s, 1, 'email', 'settled', '{"id": "m"}')""",
        """INSERT INTO budget_charges (org_id, effect_key, scope, unit, day, amount)
           VALUES (%(org)s, %(key)s, '*', 'usd', current_date - 40, 0.25)""",
        """INSERT INTO budget_reservations (org_id, effect_key, scope, unit, amount, lease_until)
           VALUES (%(org)s, %(key)s, '*', 'usd', 0.5, now() - interval '40 days')""",
        """INSERT INTO limit_slots (org_id, key, run_id, seq, attempt)
           VALUES (%(org)s, 'connection:crm', %(run)s, 1, 1)""",
        """INSERT INTO limit_bookings (org_id, key, run_id, seq, slot_at)
           VALUES (%(org)s, 'connection:crm', %(run)s, 1, now())""",
        """INSERT INTO timers (org_id, run_id, seq, purpose, intent, due_at, fired_at, fired_by)
           VALUES (%(org)s, %(run)s, 1, 'wait', '{}', now(), now(), 'wake')""",
        """INSERT INTO outbox (org_id, topic, job_id, lane, payload, deliver_at)
           VALUES (%(org)s, 'step', 'wake:' || %(run)s || ':9:1', 'fast',
                   jsonb_build_object('run_id', %(run)s, 'seq', 9), now() + interval '1 day')""",
    ):
        sql.execute(statement, args)


async def test_retention_deletes_exactly_the_old_finished_runs_and_every_row_of_theirs(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(
        Automation("done")
        .step("greet", "set", values={"hi": "input.name"})
        .step("tag", "set", values={"tag": "'customer'"})
        .build()
    )
    await engine.publish(Automation("waits").step("w", "wait_for", duration="30d").build())
    finished = [
        (await engine.start("done", {"name": f"P{i}"}, event_id=f"e{i}")).run_id for i in range(6)
    ]
    waiting = (await engine.start("waits", {}, event_id="w")).run_id
    async with engine.running():
        for run_id in finished:
            assert await engine.wait(run_id, timeout=30) == "completed"

        async def parked() -> bool:
            return await engine.status(waiting) == "waiting"

        await eventually(parked, what="the run waits on its timer")
    old, young = finished[:3], finished[3:]
    for run_id in [*finished, waiting]:
        give_every_table_a_row(sql, "test", run_id)
    # the old ones finished 40 days ago (their sent wakes were sent then too); the waiting run
    # started 40 days ago but never finished
    sql.execute(
        "UPDATE runs SET finished_at = now() - interval '40 days' WHERE run_id = ANY(%s)", (old,)
    )
    sql.execute(
        "UPDATE outbox SET sent_at = now() - interval '40 days' "
        "WHERE sent_at IS NOT NULL AND payload ->> 'run_id' = ANY(%s)",
        (old,),
    )
    sql.execute(
        "UPDATE runs SET created_at = now() - interval '40 days' WHERE run_id = %s", (waiting,)
    )
    before = rows_naming(sql, old)
    assert set(before) >= set(run_id_tables(sql)) | {"budget_charges", "outbox"}
    kept_before = {r: rows_naming(sql, [r]) for r in [*young, waiting]}

    sweeper = Sweeper(engine.pool, worker_id="t", retention_days=30)
    await sweeper.tick()

    assert rows_naming(sql, old) == {}  # no row of any table names a pruned run
    assert sweeper.pruner.stats.runs == 3 and sweeper.pruner.stats.batches == 1
    rows = sweeper.pruner.stats.rows
    assert rows["runs"] == 3 and rows["steps"] == 6 and rows["effects"] == 3
    assert rows["history"] == before["history_log"] and rows["outbox"] == 3  # the unsent wakes
    assert {r: rows_naming(sql, [r]) for r in [*young, waiting]} == kept_before


async def test_each_organisation_keeps_its_own_bound_and_forever_is_forever(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    fill(sql, "own90", 40, age_days=40)  # its own bound: 90 days -> kept
    fill(sql, "dflt", 40, age_days=40)  # the engine's default: 30 days -> pruned
    fill(sql, "forever", 40, age_days=400)  # keep forever -> kept
    fill(sql, "short", 30, age_days=3)  # its own bound: 2 days -> pruned
    fill(sql, "short", 20, age_days=1, start=1000)  # ... but not the runs of yesterday
    await set_days(engine.pool, "own90", 90, default_days=30)
    await set_days(engine.pool, "forever", None, keep_forever=True, default_days=30)
    await set_days(engine.pool, "short", 2, default_days=30)

    sweeper = Sweeper(engine.pool, worker_id="t", retention_days=30)
    for _ in range(4):  # the pruner visits the due organisations in turn
        await sweeper.tick()

    left = {
        r["org_id"]: r["n"]
        for r in sql.execute("SELECT org_id, count(*) AS n FROM runs GROUP BY org_id").fetchall()
    }
    assert left == {"own90": 40, "forever": 40, "short": 20}
    steps = sql.execute("SELECT org_id, count(*) AS n FROM steps GROUP BY org_id").fetchall()
    assert {r["org_id"]: r["n"] for r in steps} == {"own90": 80, "forever": 80, "short": 40}
    # keep forever is stored as Infinity: the default can never reach those runs
    row = sql.execute("SELECT retention_days FROM organisations WHERE org_id = 'forever'")
    assert math.isinf(row.fetchone()["retention_days"])


async def test_a_tick_prunes_in_bounded_batches_and_the_next_tick_continues(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    fill(sql, "test", 500, age_days=40)
    limits = PruneLimits(batch=100, max_batches=2, per_org=8)
    sweeper = Sweeper(engine.pool, worker_id="t", retention_days=30, prune_limits=limits)
    assert await sweeper.pruner.tick() == 200
    assert sql.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] == 300
    # the oldest went first
    newest_gone = sql.execute("SELECT min(finished_at) AS t FROM runs").fetchone()["t"]
    assert (
        sql.execute(
            "SELECT count(*) AS n FROM runs WHERE finished_at < %s", (newest_gone,)
        ).fetchone()["n"]
        == 0
    )
    for _ in range(3):
        await sweeper.pruner.tick()
    assert sql.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] == 0
    assert sweeper.pruner.stats.batches == 2 + 2 + 1 + 1  # the last one finds fewer than 100


async def test_engine_retention_set_show_prune_and_refusals(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    view = await engine.retention()
    assert view["days"] == 30 and view["source"] == "default" and not view["keep_forever"]
    assert view["oldest_finished_at"] is None
    fill(sql, "test", 30, age_days=40)
    fill(sql, "test", 10, age_days=10, start=100)
    view = await engine.set_retention(20)
    assert view["days"] == 20 and view["source"] == "organisation"
    assert 39.9 < view["oldest_finished_age_days"] < 40.1
    dry = await engine.prune(dry_run=True)
    assert dry["due"] == 30 and dry["pruned"] == 0
    assert sql.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] == 40
    done = await engine.prune(max_runs=25)
    assert done["pruned"] == 25 and done["due"] == 5
    done = await engine.prune()
    assert done["pruned"] == 5 and done["due"] == 0 and done["rows"]["history"] == 20
    for bad, kw in ((0.5, {}), (40_000, {}), (math.nan, {}), (5, {"keep_forever": True})):
        with pytest.raises(InvalidInput):
            await engine.set_retention(bad, **kw)
    assert (await engine.retention())["days"] == 20  # nothing stored by a refusal
    view = await engine.set_retention(keep_forever=True)
    assert view["keep_forever"] and view["days"] is None and view["cutoff"] is None
    assert (await engine.prune())["pruned"] == 0
    assert (await engine.set_retention())["source"] == "default"


async def test_retention_over_http(engine: Engine, sql: psycopg.Connection[Any]) -> None:
    fill(sql, "test", 12, age_days=40)
    async with api_client(engine) as client:
        got = (await client.get("/v1/retention")).json()
        assert got["days"] == 30 and got["source"] == "default"
        put = await client.put("/v1/retention", json={"days": 90})
        assert put.status_code == 200 and put.json()["days"] == 90
        dry = await client.post("/v1/retention/prune", json={"dry_run": True})
        assert dry.status_code == 200 and dry.json()["due"] == 0
        await client.put("/v1/retention", json={"days": None})  # back to the default
        done = (await client.post("/v1/retention/prune", json={"max_runs": 5})).json()
        assert done["pruned"] == 5 and done["due"] == 7
        assert (await client.post("/v1/retention/prune")).json()["pruned"] == 7
        forever = await client.put("/v1/retention", json={"days": "forever"})
        assert forever.json()["keep_forever"] is True
        for bad in ({"days": 0.5}, {"days": True}, {"days": "never"}, {}, {"days": 5, "x": 1}):
            refused = await client.put("/v1/retention", json=bad)
            assert refused.status_code == 422, bad
            assert refused.json()["error"] == "invalid_request"
        assert (await client.get("/v1/retention")).json()["keep_forever"] is True
        bad_prune = await client.post("/v1/retention/prune", json={"max_runs": 0})
        assert bad_prune.status_code == 422


async def test_the_sweeper_prunes_100000_finished_runs_while_workers_keep_completing_runs(
    settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    backlog = 100_000
    t0 = time.monotonic()
    fill(sql, "test", backlog, age_days=40)
    fill_s = time.monotonic() - t0
    live_done: list[float] = []
    async with Engine.open(settings, migrate=False) as engine:
        await engine.publish(
            Automation("live")
            .step("s1", "set", values={"v1": "1"})
            .step("s2", "set", values={"v2": "2"})
            .step("s3", "set", values={"v3": "3"})
            .build()
        )

        async def left() -> int:
            async with engine.pool.connection() as conn:
                row = await (
                    await conn.execute(
                        "SELECT count(*) AS n FROM runs WHERE automation_id = 'bench-finished'"
                    )
                ).fetchone()
            return int(row["n"]) if row else -1

        async def drive(stop: asyncio.Event) -> list[str]:
            started: list[str] = []
            while not stop.is_set():
                run_id = (await engine.start("live", {}, event_id=f"l{len(started)}")).run_id
                started.append(run_id)
                assert await engine.wait(run_id, timeout=60) == "completed"
                live_done.append(time.monotonic())
            return started

        async with engine.running() as svc:
            stop = asyncio.Event()
            driver = asyncio.create_task(drive(stop))
            prune_started = time.monotonic()

            async def all_gone() -> bool:
                return await left() == 0

            await eventually(all_gone, timeout=600, interval=0.5, what="the backlog pruned")
            prune_ended = time.monotonic()
            stop.set()
            started = await driver
            assert svc.sweeper is not None
            stats = svc.sweeper.pruner.stats
    took = prune_ended - prune_started
    during = [t for t in live_done if prune_started <= t <= prune_ended]
    gaps = [b - a for a, b in zip([prune_started, *during], [*during, prune_ended], strict=True)]
    print(  # the figures for the closing note (pytest -s)
        f"\nfilled {backlog} finished runs in {fill_s:.1f}s; pruned in {took:.1f}s "
        f"({backlog / took:.0f} runs/s, {stats.batches} batches, pruner busy "
        f"{stats.seconds:.1f}s); live runs completed meanwhile: {len(during)} "
        f"({3 * len(during) / took:.1f} steps/s), longest gap {max(gaps):.2f}s"
    )
    assert stats.runs == backlog and stats.rows["steps"] == 2 * backlog
    assert stats.rows["history"] == 4 * backlog  # run_started, step_ready, two step_done (fill)
    assert stats.batches >= backlog // 500  # never more than 500 runs a transaction
    assert (
        sql.execute("SELECT count(*) AS n FROM history WHERE run_id LIKE 'run_test_%'").fetchone()[
            "n"
        ]
        == 0
    )
    # the workers kept completing runs all through the pruning, and every live run is there
    assert len(during) >= took / 2, (len(during), took)
    assert max(gaps) < 10.0, max(gaps)
    statuses = sql.execute(
        "SELECT status, count(*) AS n FROM runs WHERE run_id = ANY(%s) GROUP BY status",
        (started,),
    ).fetchall()
    assert {r["status"]: r["n"] for r in statuses} == {"completed": len(started)}


async def test_doctor_reports_the_oldest_finished_run_and_the_table_sizes(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    from onward.doctor import run_checks

    checks = {c.name: c for c in await run_checks(engine)}
    assert checks["retention"].ok and checks["retention"].detail == "no finished runs"
    fill(sql, "test", 50, age_days=40)  # ANALYZEs runs, steps, history_log
    checks = {c.name: c for c in await run_checks(engine)}
    behind = checks["retention"]
    assert not behind.ok and "behind their retention: test" in behind.detail
    assert 40 < behind.value["test"]["age_days"] < 40.1 and behind.value["test"]["days"] == 30
    sizes = checks["table_sizes"].value
    assert set(sizes) == set(tables(sql))
    assert sizes["runs"]["rows"] == 50 and sizes["history_log"]["rows"] == 200
    assert all(v["bytes"] > 0 for v in sizes.values())
    await engine.prune()
    assert {c.name: c for c in await run_checks(engine)}["retention"].ok


def test_retention_from_the_command_line(db_url: str, sql: psycopg.Connection[Any]) -> None:
    import json

    from onward.testing import run_onward

    def refused(*args: str) -> str:
        out = run_onward(db_url, "retention", *args)
        lines = out.stderr.splitlines()
        assert out.returncode == 2 and out.stdout == "" and len(lines) == 1, out
        assert lines[0].startswith("onward: ")
        return lines[0]

    assert "between 1 and 36525" in refused("set", "--days", "0.5")
    assert "one of --days N, --keep-forever, --default" in refused("set")
    assert "one of" in refused("set", "--days", "5", "--keep-forever")
    assert sql.execute("SELECT count(*) AS n FROM organisations").fetchone()["n"] == 0
    fill(sql, "default", 20, age_days=40)
    out = run_onward(db_url, "retention", "set", "--days", "90")
    assert out.returncode == 0 and "kept 90 days (its own)" in out.stdout, out
    shown = json.loads(run_onward(db_url, "retention", "show", "--json").stdout)
    assert shown["days"] == 90 and shown["source"] == "organisation"
    assert run_onward(db_url, "retention", "set", "--default").returncode == 0
    dry = json.loads(run_onward(db_url, "retention", "prune", "--dry-run", "--json").stdout)
    assert dry["due"] == 20 and dry["pruned"] == 0
    out = run_onward(db_url, "retention", "prune")
    assert out.returncode == 0 and "deleted 20 finished runs" in out.stdout, out
    assert sql.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] == 0
    out = run_onward(db_url, "retention", "set", "--keep-forever")
    assert "kept forever" in out.stdout


def test_bench_retention_quick_prunes_the_whole_backlog_beside_the_workers(db_url: str) -> None:
    """The command works and its figures hang together; no timing target (a noisy machine)."""
    import json

    from onward.testing import run_onward

    out = run_onward(db_url, "bench", "retention", "--quick", "--json", timeout=600)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["backlog"] == 5_000 and res["pruned"] == 5_000 and res["left"] == 0
    assert res["rows_deleted"]["history"] == 4 * 5_000
    assert res["batches"] >= 10  # 500 runs a batch at most
    for phase in ("before", "pruning", "between", "after"):
        assert res[phase]["steps"] > 0 and res[phase]["steps_per_s"] > 0, phase
    assert res["prune_runs_per_s"] > 0 and res["ratio"] > 0
    plan = "\n".join(res["explain"])
    assert "Index Scan using runs_finished on runs" in plan  # (5,000 runs: the rest may scan)
