"""A page of runs by status when completed runs are not in ``runs_page_by_status`` (migration
0033, issue 16): a run's completion adds no entry to that index, and a page of completed runs
-- most of an organisation's runs -- is read from ``runs_page`` in the page's order, keeping
the completed ones; a page of the rarer statuses is still a range of its own in
``runs_page_by_status``. Neither sorts the organisation's runs. Each plan is read off the
console's own page query, with the organisation's statistics as they are."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from onward import Automation
from onward.console.reads import Q as reads_q
from onward.engine import Engine

ORG = "test"  # the engine fixture's organisation
FILTERS = ("status", "automation_id", "version", "contact_id", "parked", "since", "until")


def _seed(sql: psycopg.Connection) -> None:
    """20,000 completed runs, 300 failed and 300 waiting among them, one a second, analysed."""
    sql.execute(
        "INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind, "
        "status, max_steps, deadline_at, created_at, finished_at) "
        "SELECT 'acme', 'run_' || lpad(g::text, 12, '0'), 'a', 1, 'k' || g, 'event', "
        "       CASE WHEN g % 70 = 1 THEN 'failed' WHEN g % 70 = 2 THEN 'waiting' "
        "            ELSE 'completed' END, "
        "       100, now() + interval '1 day', now() - (21000 - g) * interval '1 second', "
        "       CASE WHEN g % 70 <> 2 THEN now() END "
        "FROM generate_series(1, 21000) g"
    )
    sql.execute("ANALYZE runs")


def _page(status: str, cursor: tuple[Any, str] | None = None) -> dict[str, Any]:
    return {
        **dict.fromkeys(FILTERS),
        "status": status,
        "org_id": "acme",
        "cursor_at": cursor[0] if cursor else None,
        "cursor_id": cursor[1] if cursor else None,
        "limit": 51,
    }


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


def _runs_scans(sql: psycopg.Connection, params: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(the indexes or tables the page reads `runs` by, every node type of the plan)."""
    row = sql.execute(f"EXPLAIN (FORMAT JSON) {reads_q.page_older}", params).fetchone()
    assert row is not None
    plan = next(iter(row.values()))
    nodes = _nodes((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])
    runs = [
        n.get("Index Name") or n["Node Type"]
        for n in nodes
        if n.get("Relation Name") == "runs" or str(n.get("Index Name", "")).startswith("runs")
    ]
    return runs, [n["Node Type"] for n in nodes]


async def test_a_completed_run_has_no_entry_in_the_status_page(
    engine: Engine, sql: psycopg.Connection
) -> None:
    # runs completed by the engine's own settle (the run's completion rides on its last step),
    # two that fail: once the dead versions are vacuumed, the index holds the failed ones only
    await engine.publish(Automation("page").step("a", "set", values={"v": "1 / input.d"}).build())
    ids = [
        (await engine.start("page", {"d": d}, event_id=f"page-{i}")).run_id
        for i, d in enumerate([1, 1, 1, 1, 1, 0, 0])
    ]
    async with engine.running():
        ends = [await engine.wait(run_id, timeout=30) for run_id in ids]
    assert sorted(ends) == ["completed"] * 5 + ["failed"] * 2
    sql.execute("VACUUM runs")
    sql.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    row = sql.execute("SELECT tuple_count FROM pgstattuple('runs_page_by_status')").fetchone()
    assert row is not None and row["tuple_count"] == 2, row
    # and the failed ones are a page of their own, by that index
    rows = sql.execute(reads_q.page_older, {**_page("failed"), "org_id": ORG}).fetchall()
    assert sorted(r["run_id"] for r in rows) == sorted(ids[5:])


def test_a_page_of_completed_runs_reads_runs_page_in_its_order(sql: psycopg.Connection) -> None:
    _seed(sql)
    runs, nodes = _runs_scans(sql, _page("completed"))
    assert runs == ["runs_page"], runs
    assert "Sort" not in nodes, nodes
    # and the page is what it says: the newest 51 completed runs, newest first
    rows = sql.execute(reads_q.page_older, _page("completed")).fetchall()
    assert [r["status"] for r in rows] == ["completed"] * 51
    newest = sql.execute(
        "SELECT run_id FROM runs WHERE org_id = 'acme' AND status = 'completed' "
        "ORDER BY created_at DESC, run_id DESC LIMIT 51"
    ).fetchall()
    assert [r["run_id"] for r in rows] == [r["run_id"] for r in newest]
    # a page deep in the list keeps its place by the cursor on the same index
    deep = sql.execute(
        "SELECT created_at, run_id FROM runs WHERE org_id = 'acme' "
        "ORDER BY created_at DESC, run_id DESC OFFSET 18000 LIMIT 1"
    ).fetchone()
    assert deep is not None
    cursor = (deep["created_at"], deep["run_id"])
    runs, nodes = _runs_scans(sql, _page("completed", cursor))
    assert runs == ["runs_page"], runs
    assert "Sort" not in nodes, nodes
    rows = sql.execute(reads_q.page_older, _page("completed", cursor)).fetchall()
    assert len(rows) == 51 and all(r["status"] == "completed" for r in rows)
    assert all((r["created_at"], r["run_id"]) < cursor for r in rows)


def test_a_page_of_a_rarer_status_is_a_range_of_its_own(sql: psycopg.Connection) -> None:
    _seed(sql)
    for status in ("failed", "waiting"):
        runs, nodes = _runs_scans(sql, _page(status))
        assert runs == ["runs_page_by_status"], (status, runs)
        assert "Sort" not in nodes, (status, nodes)
        rows = sql.execute(reads_q.page_older, _page(status)).fetchall()
        assert len(rows) == 51 and all(r["status"] == status for r in rows), status
