"""The people of ``onward chaos`` and the checks that count their answers applied twice.

The chaos run itself is ``test_chaos_quick.py``; here, fast: what the scenario's approvers and
Maya do (``scenario.decision``, ``scenario.reply``), and that the shared checks of
``onward.testing.rows`` name a decision or a signal applied twice -- and nothing else -- on
history rows written by hand (the engine never writes such rows; that is the point)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from onward.chaos import scenario
from onward.testing.rows import DECISION_CHECKS, DOUBLE_CHECKS, SIGNAL_CHECKS, double_transitions

Sql = psycopg.Connection[dict[str, Any]]


def test_the_people_do_a_bit_of_everything_on_every_forty_runs() -> None:
    decisions = [scenario.decision(i) for i in range(40)]
    replies = [scenario.reply(i) for i in range(40)]
    assert Counter(d.action for d in decisions) == {"approve": 36, "reject": 4}
    races = [d for d in decisions if d.race]
    assert len(races) == 10
    assert any(d.other != d.action for d in races) and any(d.other == d.action for d in races)
    assert sum(d.replay for d in decisions) == 7
    assert Counter(r.kind for r in replies) == {"reply": 30, "unsubscribe": 5, None: 5}
    assert sum(r.early for r in replies) == 5
    assert all(r.kind == "reply" for r in replies if r.early)
    # the automation names the people and the deadlines the runner relies on
    steps = {s["id"]: s for s in scenario.document()["steps"]}
    approve = steps["approve"]["with"]
    assert approve["approvers"] == list(scenario.APPROVERS)
    assert (approve["on_deadline"], approve["default"]) == ("default", "approve")
    assert steps["wait_reply"]["with"]["signals"] == ["reply", "unsubscribe"]
    assert set(scenario.OUTCOME_STEPS.values()) <= set(steps)


Event = tuple[str, dict[str, Any]]
WAIT: Event = ("step_waiting", {})
ASKED: Event = ("approval_requested", {})


def decided(approval_id: str) -> Event:
    return ("approval_decided", {"approval_id": approval_id})


def fired(timer_id: int) -> Event:
    return ("timer_fired", {"timer_id": timer_id})


def consumed(signal_id: str) -> Event:
    return ("signal_consumed", {"signal_id": signal_id})


def _history(sql: Sql, run_id: str, *events: Event) -> None:
    attempts = itertools.count(1)
    for event, detail in events:
        sql.execute(
            "INSERT INTO history (org_id, run_id, event, seq, attempt, detail)"
            " VALUES ('o', %s, %s, 4, %s, %s)",
            (run_id, event, next(attempts), Jsonb(detail)),
        )


def test_the_people_checks_name_a_decision_or_a_signal_applied_twice(sql: Sql) -> None:
    assert {*DECISION_CHECKS, *SIGNAL_CHECKS, "woken_twice_per_wait"} <= set(DOUBLE_CHECKS)
    # what the engine writes: one decision per wait; a second request (escalation, changed
    # content) decided again; a signal per wait
    _history(sql, "ok-1", ASKED, WAIT, decided("a1"))
    _history(sql, "ok-2", ASKED, WAIT, fired(1), ASKED, WAIT, decided("a2/2"))
    _history(sql, "ok-3", ASKED, WAIT, decided("a3"), ASKED, WAIT, decided("a3/2"))
    _history(sql, "ok-4", WAIT, consumed("s1"))
    assert double_transitions(sql) == {}

    _history(sql, "bad-1", ASKED, WAIT, decided("a9"), decided("a9"))
    assert double_transitions(sql) == {
        "approval_decided_twice": 1,
        "step_decided_twice": 1,
        "woken_twice_per_wait": 1,
    }
    sql.execute("DELETE FROM history WHERE run_id LIKE 'bad-%'")

    _history(sql, "bad-2", ASKED, WAIT, decided("a7"), WAIT, decided("a8"))  # no new request
    assert double_transitions(sql) == {"step_decided_twice": 1}
    sql.execute("DELETE FROM history WHERE run_id LIKE 'bad-%'")

    _history(sql, "bad-3", ASKED, WAIT, decided("a6"), fired(2))  # and by the deadline
    assert double_transitions(sql) == {"woken_twice_per_wait": 1}
    sql.execute("DELETE FROM history WHERE run_id LIKE 'bad-%'")

    _history(sql, "bad-4", WAIT, consumed("s2"), WAIT, consumed("s3"))  # one entry, two signals
    assert double_transitions(sql) == {"step_took_two_signals": 1}
    sql.execute("DELETE FROM history WHERE run_id LIKE 'bad-%'")

    _history(sql, "bad-5", WAIT, consumed("s4"))
    _history(sql, "bad-6", WAIT, consumed("s4"))  # one signal, consumed by two runs
    assert double_transitions(sql) == {"signal_consumed_twice": 1}
