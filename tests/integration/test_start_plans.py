"""The plan a new database gives a duplicate start (issue 16, migration 0028).

Each connection caches a generic plan of ``start.sql start_run`` after its first few starts. While
``runs`` has no pages, the planner costs every index that leads with ``org_id`` the same and keeps
the newest on a tie; the duplicate lookup (its ``earlier`` CTE) must then still probe the start
key's unique index, not read the organisation's every run through another index. A migration
that adds an index on ``runs`` makes that index the newest: this test says so.
"""

from __future__ import annotations

import json

import psycopg


def _generic_plan(sql: psycopg.Connection, role: str | None) -> dict:
    sql.execute("BEGIN")
    try:
        if role is not None:
            sql.execute(f"SET LOCAL ROLE {role}")
            sql.execute("SELECT set_config('onward.org_id', 'acme', true)")
        sql.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        # the predicate of start_run's `earlier` (and find_duplicate's `r`)
        sql.execute(
            "PREPARE earlier(text, text) AS SELECT r.org_id, r.run_id FROM runs r "
            "WHERE r.org_id = $1 AND r.start_key = $2"
        )
        row = sql.execute("EXPLAIN (FORMAT JSON) EXECUTE earlier('acme', 'k')").fetchone()
        assert row is not None
        plan = next(iter(row.values()))
        return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    finally:
        sql.execute("ROLLBACK")
        sql.execute("DEALLOCATE ALL")


def _index_scans(plan: dict) -> list[tuple[str, str]]:
    found = (
        [(plan.get("Index Name", ""), plan.get("Index Cond", ""))] if "Index Name" in plan else []
    )
    for child in plan.get("Plans", []):
        found += _index_scans(child)
    return found


def test_an_empty_runs_table_plans_a_duplicate_lookup_by_its_start_key(
    sql: psycopg.Connection,
) -> None:
    assert sql.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] == 0
    for role in (None, "onward_api", "onward_engine"):
        scans = _index_scans(_generic_plan(sql, role))
        assert scans, f"no index scan for {role}"
        name, cond = scans[0]
        assert name == "runs_org_id_start_key_key", (role, scans)
        assert "start_key" in cond, (role, scans)  # probed, not filtered
