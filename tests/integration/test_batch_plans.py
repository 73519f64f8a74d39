"""The plans of statements that write a batch of rows by key, when the statistics are stale
(issue 16).

``leases.sql settle_advance`` fences each row of its batch on ``status = 'running'``. Written
as a constant, that fence let the planner read a whole partial index whose predicate it
implies -- ``steps_leased`` (every running step, and every entry of one not yet vacuumed) in
the drain's plans, ``steps_one_unfinished`` in this test's -- and hash it against the batch
whenever its statistics called that index nearly empty, as they do after an ``ANALYZE`` on a
quiet moment; under load the index holds thousands of entries, and each settle scanned them
all. The fence is now a column of the materialised batch (``holding``), which no index
predicate can match, so each row is one lookup by ``steps_pkey`` whatever the statistics say.
The heartbeat
fences its leases the same way, and the shared ``make_ready`` fragment (``db/fragments.sql``)
keeps its ``to_ready`` batch a subquery of its own for the same reason and returns each step's
``from_status``, on which a resumed run is fenced (a constant ``'waiting'`` or ``'parked'``
there read the whole of ``runs_waiting_deadline``); a timer's fire fences its eager claims on a
column; a recompute's ``timers.sql move`` fences on ``fired_at`` as a column (the predicate of
``timers_due``); a concurrency cap's ``limits.sql take_slot`` and a run's own pending timers
(``timers.sql pending_of_run`` and its kin) compare with a value the planner does not see,
``(SELECT ...)``. Each test gives the planner exactly those statistics and reads the
plan.

The last tests hold every statement to it: the generic plan of each named statement that names
its run, timer, effect, signal or request reaches the quiet tables by a key (an audit of
2026-12-06 found 25 such reads in effects, approvals, signals, actions, sweep and retention),
and a page of runs (a migration's, the console's) looks each run's step up by the run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.types.json import Jsonb

import onward
from onward.console.reads import Q as reads_q
from onward.db.sql import load
from onward.leases import Q
from onward.limits import Q as limits_q
from onward.run_migrations import Q as migrations_q
from onward.signals import Q as signals_q
from onward.timers import Q as timers_q

BATCH = 200


def _plan(sql: psycopg.Connection, statement: str, params: dict[str, Any]) -> dict:
    row = sql.execute(f"EXPLAIN (FORMAT JSON) {statement}", params).fetchone()
    assert row is not None
    plan = next(iter(row.values()))
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def _scans(plan: dict) -> list[tuple[str, str, str]]:
    """(node type, relation or index, its condition) of every scan under ``plan``."""
    found = []
    if "Scan" in plan["Node Type"]:
        found.append(
            (
                plan["Node Type"],
                plan.get("Index Name") or plan.get("Relation Name", ""),
                plan.get("Index Cond", ""),
            )
        )
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


def _quiet_statistics(sql: psycopg.Connection) -> None:
    """50,000 finished steps and none running, analysed: steps_leased looks empty."""
    sql.execute(
        "INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, status, attempt) "
        "SELECT 'acme', 'r' || g, 1, 'a', 'set', 'fast', 'done', 1 "
        "FROM generate_series(1, 50000) g"
    )
    sql.execute("ANALYZE steps")


def _quiet_timers(sql: psycopg.Connection) -> None:
    """50,000 fired timers and none pending, analysed: timers_due looks empty."""
    sql.execute(
        "INSERT INTO timers (org_id, run_id, seq, purpose, intent, due_at, fired_at) "
        "SELECT 'acme', 'r' || g, 1, 'wait', '{}', now(), now() "
        "FROM generate_series(1, 50000) g"
    )
    sql.execute("ANALYZE timers")


def _assert_by_key(scans: list[tuple[str, str, str]], table: str, index: str, key: str) -> None:
    """Every scan of ``table`` is a lookup by ``index`` on ``key``: no partial index
    (steps_leased, steps_one_unfinished, timers_due) read whole because its predicate is
    implied by the fence."""
    mine = [s for s in scans if s[1].startswith(table)]
    assert mine, scans
    assert all(name == index and key in cond for _, name, cond in mine), mine


def _lease_batch(**more: Any) -> dict[str, Any]:
    return {
        "org_ids": ["acme"] * BATCH,
        "run_ids": [f"r{i}" for i in range(1, BATCH + 1)],
        "seqs": [1] * BATCH,
        "attempts": [1] * BATCH,
        **more,
    }


def test_a_grouped_settle_looks_each_step_up_by_its_key(sql: psycopg.Connection) -> None:
    _quiet_statistics(sql)
    items = [
        {
            "org_id": "acme",
            "run_id": f"r{i}",
            "seq": 1,
            "attempt": 1,
            "output": None,
            "vars": {},
            "next_step_id": "b",
            "next_kind": "set",
            "next_lane": "fast",
            "next_iteration": 1,
            "eager": True,
            "done_status": "done",
            "lease": 30.0,
            "keep": False,
        }
        for i in range(1, BATCH + 1)
    ]
    scans = _scans(_plan(sql, Q.settle_advance, {"worker": "w", "items": Jsonb(items)}))
    _assert_by_key(scans, "steps", "steps_pkey", "run_id")


def test_a_grouped_settle_looks_each_run_up_by_its_key(sql: psycopg.Connection) -> None:
    # a live run's statistics: the runs analysed when every one had completed, then 20,000
    # started since (active; the statistics call active runs rare). The settle reads each
    # settled step's run, and writes the ones it does not leave behind (migration 0030), by
    # the run's key. A condition on the run's status as a constant in the join (2026-12-07, a
    # version not kept) let the planner read the organisation's active runs by
    # runs_page_by_status instead: the live bench fell from 7,000-9,000 to 2,500-4,000 steps/s.
    _quiet_statistics(sql)
    _quiet_runs(sql)
    sql.execute(
        "INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind, "
        "status, max_steps, deadline_at) "
        "SELECT 'acme', 'n' || g, 'a', 1, 'n' || g, 'event', 'active', 100, now() "
        "FROM generate_series(1, 20000) g"
    )
    for last in (False, True):  # runs left behind (eager, mid-chain); runs completed
        items = [
            {
                "org_id": "acme",
                "run_id": f"n{i}",
                "seq": 1,
                "attempt": 1,
                "output": None,
                "vars": {"v": i},
                "eager": not last,
                "done_status": "done",
                "lease": 30.0,
                "keep": False,
                **(
                    {}
                    if last
                    else {
                        "next_step_id": "b",
                        "next_kind": "set",
                        "next_lane": "fast",
                        "next_iteration": 1,
                    }
                ),
            }
            for i in range(1, BATCH + 1)
        ]
        scans = _scans(_plan(sql, Q.settle_advance, {"worker": "w", "items": Jsonb(items)}))
        _assert_by_key(scans, "runs", "runs_pkey", "run_id")


def test_a_heartbeat_looks_each_lease_up_by_its_key(sql: psycopg.Connection) -> None:
    _quiet_statistics(sql)
    scans = _scans(_plan(sql, Q.heartbeat, _lease_batch(leases=[30.0] * BATCH)))
    _assert_by_key(scans, "steps", "steps_pkey", "run_id")


def test_a_release_looks_each_step_up_by_its_key(sql: psycopg.Connection) -> None:
    # release makes its steps ready through the shared make_ready fragment, as every
    # transition that makes a step ready does: its to_ready carries a constant from_status
    _quiet_statistics(sql)
    scans = _scans(_plan(sql, Q.release, _lease_batch(worker="w")))
    _assert_by_key(scans, "steps", "steps_pkey", "run_id")


def test_a_timer_move_looks_each_timer_up_by_its_key(sql: psycopg.Connection) -> None:
    # a recompute moves pending timers in batches; its fence (fired_at IS NULL) is the
    # predicate of the partial index timers_due, which holds every pending timer
    _quiet_timers(sql)
    params = {
        "org_ids": ["acme"] * BATCH,
        "timer_ids": list(range(1, BATCH + 1)),
        "wake_ns": [1] * BATCH,
        "old_dues": ["2026-12-07T09:00:00Z"] * BATCH,
        "new_dues": ["2026-12-07T10:00:00Z"] * BATCH,
        "intents": [Jsonb({})] * BATCH,
        "worker": "w",
        "reason": "zone",
    }
    scans = _scans(_plan(sql, timers_q.move, params))
    _assert_by_key(scans, "timers", "timers_pkey", "timer_id")


def _quiet_runs(sql: psycopg.Connection) -> None:
    """50,000 completed runs, analysed: runs_waiting_deadline looks empty."""
    sql.execute(
        "INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind, "
        "status, max_steps, deadline_at) "
        "SELECT 'acme', 'r' || g, 'a', 1, 'k' || g, 'event', 'completed', 100, now() "
        "FROM generate_series(1, 50000) g"
    )
    sql.execute("ANALYZE runs")


def test_a_timer_fire_looks_each_step_and_run_up_by_its_key(sql: psycopg.Connection) -> None:
    # a Monday's burst: the fire claims waiting steps (fence: status 'waiting') and makes the
    # rest ready (make_ready), and resumes their waiting runs (fence: the run's status)
    _quiet_statistics(sql)
    _quiet_runs(sql)
    params = {
        "org_ids": ["acme"] * BATCH,
        "timer_ids": list(range(1, BATCH + 1)),
        "wake_ns": [1] * BATCH,
        "by": "wake",
        "worker": "w",
        "lanes": ["fast"],
        "free": [BATCH // 2],
        "leases": [30.0],
    }
    scans = _scans(_plan(sql, timers_q.fire, params))
    _assert_by_key(scans, "steps", "steps_pkey", "run_id")
    _assert_by_key(scans, "runs", "runs_pkey", "run_id")
    _assert_by_key(scans, "timers", "timers_pkey", "timer_id")


def test_a_consumed_signal_resumes_its_run_by_its_key(sql: psycopg.Connection) -> None:
    # every transition that makes a step ready and resumes its run fences the run on the
    # step's from_status (make_ready returns it): signals.consume stands for them all
    _quiet_statistics(sql)
    _quiet_runs(sql)
    params = {"org_id": "acme", "run_id": "r1", "worker": "w"}
    scans = _scans(_plan(sql, signals_q.consume, params))
    _assert_by_key(scans, "runs", "runs_pkey", "run_id")


def test_a_concurrency_slot_checks_each_holder_by_its_key(sql: psycopg.Connection) -> None:
    # a capped call checks the key's few slots against their steps (running, at that attempt,
    # lease not lapsed): never the organisation's every unfinished step
    _quiet_statistics(sql)
    sql.execute(
        "INSERT INTO limit_slots (org_id, key, run_id, seq, attempt) "
        "SELECT 'acme', 'crm', 'r' || g, 1, 1 FROM generate_series(1, 10) g"
    )
    sql.execute("ANALYZE limit_slots")
    params = {"org_id": "acme", "key": "crm", "run_id": "r1", "seq": 1, "attempt": 1, "max": 10}
    _assert_by_key(_scans(_plan(sql, limits_q.take_slot, params)), "steps", "steps_pkey", "run_id")
    listed = _scans(_plan(sql, limits_q.list, {"org_id": "acme"}))
    _assert_by_key(listed, "steps", "steps_pkey", "run_id")


def test_a_runs_pending_timers_are_read_by_the_run(sql: psycopg.Connection) -> None:
    # a cancel, a migration and a skip read, lock or close one run's unfired timers: by the
    # run (timers_by_step), never the organisation's every pending timer (timers_due)
    _quiet_statistics(sql)
    _quiet_timers(sql)
    params = {"org_id": "acme", "run_id": "r5", "fired_by": "cancel"}
    for q in (timers_q.pending_of_run, timers_q.lock_pending_of_run, timers_q.close_for_run):
        _assert_by_key(_scans(_plan(sql, q, params)), "timers", "timers_by_step", "run_id")


# -- every statement that names one run, timer, effect, signal or request ----------------------

SRC = Path(onward.__file__).parent
_PARAM = re.compile(r"%\((\w+)\)s")
#: A statement with one of these parameters names its rows by key: it must reach them by key.
KEY_PARAMS = {"run_id", "run_ids", "items", "timer_ids", "effect_key", "signal_id", "approval_id"}
#: An index condition on one of these columns is a lookup by key.
KEY_COLUMNS = ("run_id", "timer_id", "effect_key", "signal_id", "approval_id", "correlation_key")
#: Tables the quiet statistics fill (a whole scan of any other is a scan of nothing).
QUIET_TABLES = ("steps", "runs", "timers", "signals", "approvals", "effects")
#: Statements that name a key and yet read by organisation, on purpose.
ORG_WIDE = {
    # the probe (run_id, seq) closed its circuit: every step of the organisation parked on it
    # resumes (steps_parked by organisation and kind)
    "circuits.close",
    # listings: a run's filter is optional ("x IS NULL OR"), sent unprepared (a custom plan)
    "signals.list",
    "approvals.list",
    # a test helper's read
    "testing.rows.run_effects",
}


def _quiet_everything(sql: psycopg.Connection) -> None:
    """50,000 finished rows in each table whose partial indexes hold only live ones, analysed:
    every such index looks empty to the planner."""
    _quiet_statistics(sql)
    _quiet_runs(sql)
    _quiet_timers(sql)
    sql.execute(
        "INSERT INTO signals (org_id, signal_id, name, status, run_id) "
        "SELECT 'acme', 's' || g, 'reply', 'consumed', 'r' || g FROM generate_series(1, 50000) g"
    )
    sql.execute(
        "INSERT INTO approvals (org_id, approval_id, run_id, seq, step_id, request, digest, "
        "content, approvers, nonce, status, deadline_at) "
        "SELECT 'acme', 'a' || g, 'r' || g, 1, 'a', 1, 'd', 'c', '{}', 'n' || g, 'approved', "
        "now() FROM generate_series(1, 50000) g"
    )
    sql.execute(
        "INSERT INTO effects (org_id, effect_key, run_id, seq, provider, status) "
        "SELECT 'acme', 'e' || g, 'r' || g, 1, 'crm', 'settled' FROM generate_series(1, 50000) g"
    )
    sql.execute("ANALYZE")


def _statements() -> list[tuple[str, str]]:
    """(module.name, text) of every named statement beside a module (as test_code finds them)."""
    found = []
    for path in sorted(SRC.rglob("*.sql")):
        if path.parent.name == "migrations" or path.name in ("fragments.sql", "schema.sql"):
            continue
        package = ".".join(("onward", *path.parent.relative_to(SRC).parts))
        prefix = ".".join((*path.parent.relative_to(SRC).parts, path.stem))
        found += [(f"{prefix}.{name}", text) for name, text in load(package, path.name).items()]
    return found


def _keyed_statements(sql: psycopg.Connection, prefix: str) -> Iterator[tuple[str, str, list[str]]]:
    """Each named statement that names a key (and is not ORG_WIDE), prepared with positional
    parameters: (its name, the prepared statement's name, its parameters in order)."""
    for i, (name, text) in enumerate(_statements()):
        if not KEY_PARAMS & set(_PARAM.findall(text)) or name in ORG_WIDE:
            continue
        params: list[str] = []

        def positional(m: re.Match[str], params: list[str] = params) -> str:
            if m.group(1) not in params:
                params.append(m.group(1))
            return f"${params.index(m.group(1)) + 1}"

        prepared = _PARAM.sub(positional, text).replace("%%", "%")
        sql.execute(f"PREPARE {prefix}{i} AS {prepared}", prepare=False)
        yield name, f"{prefix}{i}", params


def test_no_statement_that_names_a_key_reads_a_whole_partial_index(
    sql: psycopg.Connection,
) -> None:
    # The generic plan of every statement (the plan a prepared statement may settle on),
    # under statistics that call every partial index nearly empty: a statement that names its
    # run, timer, effect, signal or request reaches every row of the quiet tables by a key --
    # never through a partial index read by organisation (or whole) and filtered, as 20
    # statements did before 2026-12-06's audit (eleven of effects.sql, approvals' settle, lock
    # and expire, signals' consume, lock_deadline and settle_unconsumed, actions.make_ready,
    # sweep.expire_waiting_run, retention.delete_runs).
    _quiet_everything(sql)
    partial = {
        r["indexrelid"]
        for r in sql.execute(
            "SELECT indexrelid::regclass::text AS indexrelid FROM pg_index "
            "WHERE indpred IS NOT NULL"
        )
    }
    sql.execute("SET plan_cache_mode = force_generic_plan")
    problems, checked = [], 0
    for name, statement, params in _keyed_statements(sql, "audit"):
        nulls = ", ".join(["NULL"] * len(params))
        row = sql.execute(
            f"EXPLAIN (FORMAT JSON) EXECUTE {statement}({nulls})", prepare=False
        ).fetchone()
        assert row is not None
        plan = next(iter(row.values()))[0]["Plan"]
        checked += 1
        for node, relation, cond in _scans(plan):
            whole = node == "Seq Scan" and relation in QUIET_TABLES
            by_org = relation in partial and not any(k in cond for k in KEY_COLUMNS)
            if whole or by_org:
                problems.append(f"{name}: {node} on {relation} [{cond}]")
    assert checked > 60, checked
    assert problems == [], "\n".join(problems)


def test_a_page_of_runs_looks_each_runs_step_up_by_the_run(sql: psycopg.Connection) -> None:
    # a migration's page and the console's pages annotate each run with its unfinished step,
    # its latest (migration 0034): by the run (a lateral with a LIMIT), never the
    # organisation's every step hashed against the page
    _quiet_statistics(sql)
    _quiet_runs(sql)
    page = {"org_id": "acme", "automation_id": "a", "version": 1, "after": "", "limit": 100}
    _assert_by_key(_scans(_plan(sql, migrations_q.page, page)), "steps", "steps_pkey", "run_id")
    filters = dict.fromkeys(
        ("status", "automation_id", "version", "contact_id", "parked", "since", "until"), None
    )
    console = {"org_id": "acme", **filters, "cursor_at": None, "cursor_id": None, "limit": 50}
    scans = [s for s in _scans(_plan(sql, reads_q.page_older, console)) if s[1].startswith("steps")]
    # the unfinished step, and the run's latest step (onward_run_now, its count as it is now:
    # migration 0030), by steps_pkey -- each by the run
    assert {name for _, name, _ in scans} == {"steps_pkey"}, scans
    assert all("run_id" in cond for _, _, cond in scans), scans


def _new_organisation(sql: psycopg.Connection) -> None:
    """One organisation's 50,000 runs analysed, then 20,000 of a second one the statistics do
    not know yet: to the planner, `org_id = 'newco'` matches about one row. Run ids are
    time-ordered, as `ids.new_run_id` makes them; start keys are long (a caller's own key, a
    payload's hash), which makes their index a level deeper than the others that lead with
    the organisation: read as one row, the organisation's runs are cheaper to reach by those."""
    sql.execute(
        "INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind, "
        "status, max_steps, deadline_at) "
        "SELECT 'acme', 'run_' || lpad(g::text, 12, '0'), 'a', 1, 'a:' || repeat(md5(g::text), 6), "
        "'event', 'completed', 100, now() FROM generate_series(1, 50000) g"
    )
    sql.execute("ANALYZE runs")
    sql.execute(
        "INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind, "
        "status, max_steps, deadline_at) "
        "SELECT 'newco', 'run_' || lpad(g::text, 12, '0'), 'a', 1, 'a:' || repeat(md5(g::text), 6), "
        "'event', 'completed', 100, now() FROM generate_series(1, 20000) g"
    )


def test_a_start_finds_earlier_runs_by_start_key_in_an_organisation_the_statistics_miss(
    sql: psycopg.Connection,
) -> None:
    # 2026-12-07: the start's probe for earlier runs of its keys, `org_id = <constant>`, was
    # read by runs_pkey and filtered on the key for an organisation the statistics had not seen
    # (the bench's live run, a new tenant): every start read all of the organisation's runs,
    # 5-7 ms a key in a batch of 16 (auto_explain). Which index of the organisation's wins
    # there is a tie the planner breaks by its costs' last digits (runs_pkey in the bench,
    # runs_page_by_automation here, the key's own when its keys are short). Compared with a
    # value the planner does not see, the organisation is an average one and only the key's
    # own index reads one row.
    from onward.start import Q as start_q

    _new_organisation(sql)
    items = [
        {
            "idx": i,
            "run_id": f"x{i}",
            "automation_id": "a",
            "version": None,
            "start_key": f"a:e{i}",
            "start_key_kind": "event",
            "input": {},
            "contact_id": None,
            "traceparent": None,
        }
        for i in range(16)
    ]
    start = {
        "org_id": "newco",
        "run_id": "x",
        "automation_id": "a",
        "version": 1,
        "start_key": "a:e1",
        "start_key_kind": "event",
        "input": Jsonb({}),
        "contact_id": None,
        "traceparent": None,
        "start_step_id": "s",
        "start_kind": "set",
        "start_lane": "fast",
        "max_steps": 100,
        "max_age_s": 60,
    }
    statements = {
        "start_many": (start_q.start_many, {**start, "items": Jsonb(items)}),
        "start_run": (start_q.start_run, start),
        "find_duplicate": (start_q.find_duplicate, start),
        "find_duplicates": (
            start_q.find_duplicates,
            {"org_id": "newco", "start_keys": [f"a:e{i}" for i in range(16)]},
        ),
    }
    for name, (statement, params) in statements.items():
        probes = [s for s in _scans(_plan(sql, statement, params)) if s[1].startswith("runs")]
        assert probes, name
        assert all(index == "runs_org_id_start_key_key" for _, index, _ in probes), (name, probes)


def test_a_run_is_read_by_its_key_in_an_organisation_the_statistics_miss(
    sql: psycopg.Connection,
) -> None:
    # the same tie for a run's own key: compared with the constant, `org_id = 'newco' AND
    # run_id = ...` read runs_page_by_automation -- run_id its fourth column -- from the
    # organisation's first entry to its last (EXPLAIN on this state, 2026-12-07)
    from onward.cancel import Q as cancel_q

    _new_organisation(sql)
    scans = _scans(_plan(sql, cancel_q.lock_run, {"org_id": "newco", "run_id": "run_17"}))
    assert scans == [("Index Scan", "runs_pkey", scans[0][2])], scans


def test_a_runs_timers_are_read_by_the_run_in_an_organisation_the_statistics_miss(
    sql: psycopg.Connection,
) -> None:
    # every table: a cancel locks the run's pending timers by the run (timers_by_step); compared
    # with the constant, a new organisation's read timers_pkey and filtered all of its timers
    sql.execute(
        "INSERT INTO timers (org_id, run_id, seq, purpose, intent, due_at) "
        "SELECT 'acme', 'run_' || lpad(g::text, 12, '0'), 1, 'wait', '{}', now() "
        "FROM generate_series(1, 50000) g"
    )
    sql.execute("ANALYZE timers")
    sql.execute(
        "INSERT INTO timers (org_id, run_id, seq, purpose, intent, due_at) "
        "SELECT 'newco', 'run_' || lpad(g::text, 12, '0'), 1, 'wait', '{}', now() "
        "FROM generate_series(1, 20000) g"
    )
    params = {"org_id": "newco", "run_id": "run_000000000017"}
    scans = _scans(_plan(sql, timers_q.lock_pending_of_run, params))
    assert [(s[1], "run_id" in s[2]) for s in scans] == [("timers_by_step", True)], scans


#: A value of each type a statement's parameters take, for its custom plan (the organisation
#: parameters take the new organisation's id).
_VALUES: dict[str, Any] = {
    "text": "k1",
    "text[]": ["k1"],
    "integer": 1,
    "integer[]": [1],
    "bigint": 1,
    "bigint[]": [1],
    "boolean": False,
    "double precision": 1.0,
    "double precision[]": [1.0],
    "numeric": 1,
    "jsonb": Jsonb([]),
    "jsonb[]": [Jsonb({})],
    "timestamp with time zone": datetime.now(UTC),
    "timestamp with time zone[]": [datetime.now(UTC)],
}


def test_no_statement_reads_a_new_organisation_whole_to_find_a_key(
    sql: psycopg.Connection,
) -> None:
    # The custom plan of every statement that names a key (the plan the first five executions
    # of a prepared statement take, and every one whose generic plan costs more), for an
    # organisation the statistics have not seen: every quiet table's rows belong to 'acme',
    # analysed, and the statement asks for 'newco'. No scan of those tables may be bounded by
    # the organisation alone. Before every statement compared org_id with (SELECT ...), 42 of
    # the engine's did (51 scans, 2026-12-07): fifteen of effects.sql (claim, settle, ... read
    # effects_recent by organisation and filtered on the effect key), seven of retention's, a
    # run by its id (runs_org_id_start_key_key), a run's timers (timers_pkey).
    _quiet_everything(sql)
    sql.execute("SET plan_cache_mode = force_custom_plan")
    problems, checked = [], 0
    for name, statement, params in _keyed_statements(sql, "custom"):
        checked += 1
        row = sql.execute(
            "SELECT parameter_types::text[] AS types FROM pg_prepared_statements WHERE name = %s",
            (statement,),
        ).fetchone()
        assert row is not None
        values = [
            ("newco" if kind == "text" else ["newco"])
            if param.startswith("org") and kind in ("text", "text[]")
            else _VALUES[kind]
            for param, kind in zip(params, row["types"], strict=True)
        ]
        literals = pgsql.SQL(", ").join(pgsql.Literal(v) for v in values).as_string(sql)
        explained = sql.execute(
            f"EXPLAIN (FORMAT JSON) EXECUTE {statement}({literals})", prepare=False
        ).fetchone()
        assert explained is not None
        for node, relation, cond in _scans(next(iter(explained.values()))[0]["Plan"]):
            by_key = any(k in cond for k in (*KEY_COLUMNS, "start_key", "contact_id"))
            if relation.startswith(QUIET_TABLES) and "org_id" in cond and not by_key:
                problems.append(f"{name}: {node} on {relation} [{cond}]")
    assert checked > 100, checked
    assert problems == [], "\n".join(problems)
