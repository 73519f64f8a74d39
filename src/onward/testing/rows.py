"""Readers of runs, steps, effects and history, and the checks every test of a durable engine
makes: nothing applied twice, nothing lost. Synchronous, on any psycopg connection (rows come
back as dicts). ``org=None`` reads every organisation: a test's own database.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from onward.db.sql import Queries
from onward.engine import TERMINAL

Q = Queries(__package__, "rows.sql")

Row = dict[str, Any]

# Runs in these states need nobody but a person (parked) or nothing at all.
SETTLED = (*sorted(TERMINAL), "parked")

#: People's answers applied twice (R9, R10): a request's decision waking its step twice, two
#: decisions waking one step entry with no new request between them; a signal consumed twice,
#: one step entry taking two signals.
DECISION_CHECKS = ("approval_decided_twice", "step_decided_twice")
SIGNAL_CHECKS = ("signal_consumed_twice", "step_took_two_signals")

#: The "applied twice" checks: name -> query. Every count must be 0.
DOUBLE_CHECKS = (
    "claim_or_wait_twice",
    "step_done_twice",
    "timer_fired_twice",
    "run_completed_twice",
    "settled_by_a_stale_attempt",
    "steps_done_per_seq",
    "woken_twice_per_wait",
    *DECISION_CHECKS,
    *SIGNAL_CHECKS,
)

# The queries of the checks added with signals and approvals (the others are in rows.sql).
_PEOPLE_QUERIES = {
    # a waiting step woken twice: by two of its timer (not a retry's), a signal, a decision,
    # with no new wait between them -- e.g. by a person and by the deadline both
    "woken_twice_per_wait": """
        SELECT count(*) AS n FROM (
            SELECT h.event, lag(h.event) OVER (
                       PARTITION BY h.org_id, h.run_id, h.seq ORDER BY h.event_id) AS before
            FROM history h
            LEFT JOIN timers t ON h.event = 'timer_fired' AND t.org_id = h.org_id
                              AND t.timer_id = (h.detail->>'timer_id')::bigint
            WHERE (%(org)s::text IS NULL OR h.org_id = %(org)s) AND h.seq IS NOT NULL
              AND h.run_id <> ALL(%(skip)s::text[])
              AND (h.event IN ('step_waiting', 'signal_consumed', 'approval_decided')
                   OR (h.event = 'timer_fired' AND t.purpose IS DISTINCT FROM 'retry'))
        ) x
        WHERE event <> 'step_waiting' AND before IS NOT NULL AND before <> 'step_waiting'""",
    # one request's decision woke a step twice
    "approval_decided_twice": """
        SELECT count(*) AS n FROM (
            SELECT org_id, detail->>'approval_id' FROM history
            WHERE (%(org)s::text IS NULL OR org_id = %(org)s) AND event = 'approval_decided'
              AND run_id <> ALL(%(skip)s::text[])
            GROUP BY 1, 2 HAVING count(*) > 1) x""",
    # two decisions woke one step entry with no new request (escalation, changed content)
    # asked between them
    "step_decided_twice": """
        SELECT count(*) AS n FROM history d
        WHERE (%(org)s::text IS NULL OR d.org_id = %(org)s) AND d.event = 'approval_decided'
          AND d.run_id <> ALL(%(skip)s::text[])
          AND EXISTS (
              SELECT 1 FROM history e
              WHERE e.org_id = d.org_id AND e.run_id = d.run_id AND e.seq = d.seq
                AND e.event = 'approval_decided' AND e.event_id < d.event_id
                AND NOT EXISTS (
                    SELECT 1 FROM history r
                    WHERE r.org_id = d.org_id AND r.run_id = d.run_id AND r.seq = d.seq
                      AND r.event = 'approval_requested'
                      AND r.event_id > e.event_id AND r.event_id < d.event_id))""",
    # one signal consumed twice
    "signal_consumed_twice": """
        SELECT count(*) AS n FROM (
            SELECT org_id, detail->>'signal_id' FROM history
            WHERE (%(org)s::text IS NULL OR org_id = %(org)s) AND event = 'signal_consumed'
              AND run_id <> ALL(%(skip)s::text[])
            GROUP BY 1, 2 HAVING count(*) > 1) x""",
    # one step entry woken by two signals
    "step_took_two_signals": """
        SELECT count(*) AS n FROM (
            SELECT org_id, run_id, seq FROM history
            WHERE (%(org)s::text IS NULL OR org_id = %(org)s) AND event = 'signal_consumed'
              AND run_id <> ALL(%(skip)s::text[])
            GROUP BY 1, 2, 3 HAVING count(*) > 1) x""",
}


def _all(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(query, params).fetchall())


def _one(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> Row | None:
    rows = _all(conn, query, params)
    return rows[0] if rows else None


def history(
    conn: psycopg.Connection[Any],
    run_id: str,
    *events: str,
    seq: int | None = None,
    org: str | None = None,
) -> list[Row]:
    """A run's history rows (event_id, at, event, seq, step_id, attempt, worker, claimed_at,
    detail),
    oldest first: only ``events`` when named, only ``seq`` when given."""
    params = {"run_id": run_id, "events": list(events), "seq": seq, "org": org}
    return _all(conn, Q.history, params)


def attempts(
    conn: psycopg.Connection[Any], run_id: str, *, seq: int | None = None, org: str | None = None
) -> list[Row]:
    """Every claim of a run's steps (seq, step_id, attempt, worker, claimed_at, ended), oldest
    first: the attempts that ended (``ended``: the history event that ended each) and those
    running now (``ended`` None). A claim writes no history row of its own: the step row holds
    it until the row that ends the attempt records it."""
    return _all(conn, Q.attempts, {"run_id": run_id, "seq": seq, "org": org})


def step_row(
    conn: psycopg.Connection[Any], run_id: str, seq: int, *, org: str | None = None
) -> Row:
    """Every column of one step, and ``lapsed``: its lease ended by the database's clock."""
    row = _one(conn, Q.step_row, {"run_id": run_id, "seq": seq, "org": org})
    assert row is not None, f"no step {run_id}#{seq}"
    return row


def steps(
    conn: psycopg.Connection[Any],
    run_id: str,
    step_id: str | None = None,
    *,
    org: str | None = None,
) -> list[Row]:
    """Every column of a run's step rows, by position: only ``step_id``'s when given (a step
    visited again by a loop, or ``(row,) = steps(conn, run_id, "send")`` to say it has one).
    The columns as stored: a step whose output is its variables (a ``set`` step) has
    ``output`` None and its output in ``vars`` (migration 0032, ``onward_step_output``)."""
    return _all(conn, Q.steps, {"run_id": run_id, "step_id": step_id, "org": org})


def run_row(conn: psycopg.Connection[Any], run_id: str, *, org: str | None = None) -> Row:
    """Every column of one run."""
    row = _one(conn, Q.run_row, {"run_id": run_id, "org": org})
    assert row is not None, f"no run {run_id}"
    return row


def effect_row(conn: psycopg.Connection[Any], key: str, *, org: str | None = None) -> Row | None:
    """Every column of the effect with this key, or None."""
    return _one(conn, Q.effect_row, {"key": key, "org": org})


def run_effects(conn: psycopg.Connection[Any], run_id: str, *, org: str | None = None) -> list[Row]:
    """Every column of a run's effects, by key."""
    return _all(conn, Q.run_effects, {"run_id": run_id, "org": org})


def double_transitions(
    conn: psycopg.Connection[Any], *, org: str | None = None, skip: Iterable[str] = ()
) -> dict[str, int]:
    """The "applied twice" checks that found something: ``{check: count}`` (empty: none),
    leaving out the runs in ``skip`` (erased runs: their history details are redacted, so a
    check that groups by a detail would take them for one).

    A claim, done, wait or timer firing twice for one attempt; a step done twice; a timer
    fired twice; a run completed twice; a step settled by a stale attempt (the fence failed);
    two step rows at one position; a waiting step woken twice for one wait (say by a person
    and by its deadline); a decision or a signal applied twice (:data:`DECISION_CHECKS`,
    :data:`SIGNAL_CHECKS`)."""
    found: dict[str, int] = {}
    for name in DOUBLE_CHECKS:
        params = {"org": org, "skip": list(skip)}
        row = _one(conn, _PEOPLE_QUERIES.get(name) or getattr(Q, name), params)
        n = int(row["n"]) if row else 0
        if n:
            found[name] = n
    return found


def assert_nothing_applied_twice(conn: psycopg.Connection[Any], *, org: str | None = None) -> None:
    """``AssertionError`` naming every check of :func:`double_transitions` that found something."""
    found = double_transitions(conn, org=org)
    assert found == {}, f"transitions applied twice: {found}"


def unfinished_runs(conn: psycopg.Connection[Any], *, org: str | None = None) -> set[str]:
    """Runs neither finished nor parked for a person."""
    rows = _all(conn, Q.unfinished_runs, {"org": org, "settled": list(SETTLED)})
    return {r["run_id"] for r in rows}


def runs_without_way_forward(conn: psycopg.Connection[Any]) -> set[str]:
    """Unfinished runs with no durable way forward right now (the doctor's check, with no
    settling time)."""
    from onward.doctor import runs_without_way_forward as doctor_check

    return {r["run_id"] for r in doctor_check(conn, settle=0.0, limit=1_000_000)}


def lost_runs(conn: psycopg.Connection[Any], *, org: str | None = None) -> set[str]:
    """Runs that are lost once everything should have finished: unfinished, or with no
    durable way forward."""
    return unfinished_runs(conn, org=org) | runs_without_way_forward(conn)
