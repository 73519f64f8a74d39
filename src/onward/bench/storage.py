"""``onward bench storage``: bytes on disk and WAL per completed run, and runs per 100 GB.

On a scratch database, N runs of the throughput bench's automation (3 no-op ``set`` steps) are
started through the library and completed by W worker processes, exactly as ``onward bench
throughput`` drains them (:func:`onward.bench.throughput._drain`). Around that:

* **on disk**: every table of the schema is vacuumed (``VACUUM``: dead rows become free space,
  the files keep their size -- what a live server holds between vacuums) and measured before
  and after: heap (``pg_relation_size`` of the main fork, its free space map and visibility
  map), indexes (``pg_indexes_size``) and TOAST (``pg_total_relation_size`` of the TOAST table,
  its index included). Each table that grew is printed per completed run, with the rows it
  gained per run. Beside it the same after ``VACUUM FULL`` (the tables rewritten with only
  their live rows): what a run costs once the space its updates left is reused.
* **WAL**: ``pg_current_wal_lsn()`` before the first start and after the last run completed,
  per run. WAL is the cluster's: other sessions writing to the same server are counted too.

Runs per 100 GB = 100e9 / bytes on disk per run: how many completed runs the database holds
before retention (``ONWARD_RETENTION_DAYS``) deletes them. Sent outbox rows are part of the
figure although the elected sweeper prunes them an hour after they were sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from onward.bench.db import scratch_database
from onward.bench.throughput import AUTOMATION, STEPS, _drain, _publish

GIGABYTES_100 = 100e9

SIZES = """
SELECT c.relname,
       pg_relation_size(c.oid, 'main') + pg_relation_size(c.oid, 'fsm')
         + pg_relation_size(c.oid, 'vm') AS heap,
       pg_indexes_size(c.oid) AS indexes,
       coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0) AS toast,
       c.oid::regclass::text AS qualified
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = 'r'
ORDER BY c.relname
"""

LIVE_ROWS = "SELECT count(*) FROM {}"

Sizes = dict[str, dict[str, int]]


def _sizes(conn: psycopg.Connection[Any]) -> Sizes:
    out: Sizes = {}
    for name, heap, indexes, toast, qualified in conn.execute(SIZES).fetchall():
        row = conn.execute(LIVE_ROWS.format(qualified)).fetchone()
        out[name] = {
            "heap": int(heap),
            "indexes": int(indexes),
            "toast": int(toast),
            "rows": int(row[0]) if row else 0,
        }
    return out


def _vacuum(conn: psycopg.Connection[Any], full: bool = False) -> None:
    conn.execute("VACUUM FULL" if full else "VACUUM")


def _lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _per_run(before: Sizes, after: Sizes, runs: int) -> dict[str, dict[str, float]]:
    """Tables that grew (bytes or rows), per completed run."""
    out: dict[str, dict[str, float]] = {}
    for name, b in after.items():
        a = before.get(name, {"heap": 0, "indexes": 0, "toast": 0, "rows": 0})
        d = {k: b[k] - a[k] for k in ("heap", "indexes", "toast", "rows")}
        total = d["heap"] + d["indexes"] + d["toast"]
        if total <= 0 and d["rows"] <= 0:
            continue
        out[name] = {
            "heap": round(d["heap"] / runs, 1),
            "indexes": round(d["indexes"] / runs, 1),
            "toast": round(d["toast"] / runs, 1),
            "total": round(total / runs, 1),
            "rows": round(d["rows"] / runs, 3),
        }
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["total"]))


def run(
    admin_url: str,
    *,
    quick: bool = False,
    runs: int | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """``runs`` completed 3-step runs (5,000; 30 quick) by ``workers`` worker processes (2)."""
    n = runs or (30 if quick else 5_000)
    o: dict[str, Any] = {
        "runs": n,
        "workers": workers or (1 if quick else 2),
        "conns": 2 if quick else 10,
        "batch": 32 if quick else 128,
        "capacity": 32 if quick else 128,
        "starters": 4 if quick else 16,
    }
    org = "storage"
    with scratch_database(admin_url, "storage") as url:
        asyncio.run(_publish(url, [org]))
        with psycopg.connect(url, autocommit=True) as conn:
            _vacuum(conn)
            before = _sizes(conn)
            wal0 = _lsn(conn)
        drained = _drain(url, o, org=org)["engine"]
        with psycopg.connect(url, autocommit=True) as conn:
            wal1 = _lsn(conn)
            completed_row = conn.execute(
                "SELECT count(*) FROM runs WHERE org_id = %s AND status = 'completed'", (org,)
            ).fetchone()
            completed = int(completed_row[0]) if completed_row else 0
            _vacuum(conn)
            after = _sizes(conn)
            _vacuum(conn, full=True)
            compact = _sizes(conn)
    done = max(completed, 1)
    tables = _per_run(before, after, done)
    compact_tables = _per_run(before, compact, done)
    per_run = round(sum(t["total"] for t in tables.values()), 1)
    compact_per_run = round(sum(t["total"] for t in compact_tables.values()), 1)
    return {
        "bench": "storage",
        "options": o,
        "automation": AUTOMATION,
        "steps_per_run": STEPS,
        "runs_completed": completed,
        "steps": drained["steps"],
        "steps_per_s": drained["steps_per_s"],
        "bytes_per_run": per_run,
        "bytes_per_run_compact": compact_per_run,
        "wal_bytes_per_run": round((wal1 - wal0) / done, 1),
        "runs_per_100gb": int(GIGABYTES_100 / per_run) if per_run > 0 else None,
        "runs_per_100gb_compact": (
            int(GIGABYTES_100 / compact_per_run) if compact_per_run > 0 else None
        ),
        "tables": tables,
        "tables_compact": compact_tables,
    }


def render(res: dict[str, Any]) -> str:
    o = res["options"]
    lines = [
        f"storage: {res['runs_completed']:,} completed runs of {res['automation']} "
        f"({res['steps_per_run']} no-op set steps) by {o['workers']} worker processes "
        f"({res['steps_per_s']:,.0f} steps/s); bytes on disk per completed run after VACUUM "
        "(and after VACUUM FULL: live rows only)",
        "",
        f"{'table':<24} {'rows/run':>8} {'heap B':>9} {'index B':>9} {'TOAST B':>9} "
        f"{'total B':>9} {'compact B':>10}",
    ]
    for name, t in res["tables"].items():
        c = res["tables_compact"].get(name, {}).get("total", 0.0)
        lines.append(
            f"{name:<24} {t['rows']:>8.2f} {t['heap']:>9,.0f} {t['indexes']:>9,.0f} "
            f"{t['toast']:>9,.0f} {t['total']:>9,.0f} {c:>10,.0f}"
        )
    lines.append(
        f"{'all tables':<24} {'':>8} {'':>9} {'':>9} {'':>9} {res['bytes_per_run']:>9,.0f} "
        f"{res['bytes_per_run_compact']:>10,.0f}"
    )
    per_100 = res["runs_per_100gb"]
    per_100c = res["runs_per_100gb_compact"]
    lines += [
        "",
        f"WAL: {res['wal_bytes_per_run']:,.0f} bytes per run (the cluster's WAL: other sessions' "
        "writes count too)",
        f"100 GB holds {per_100:,} completed runs before retention ({per_100c:,} once the space "
        "of updated rows is reused)"
        if per_100 and per_100c
        else "100 GB: no bytes measured",
    ]
    return "\n".join(lines)


__all__ = ["render", "run"]
