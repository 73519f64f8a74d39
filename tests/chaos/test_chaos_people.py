"""The people of ``onward chaos`` and the checks that count their answers applied twice.

The chaos run itself is ``test_chaos_quick.py``; here, fast: what the scenario's approvers and
Maya do (``scenario.decision``, ``scenario.reply``), and that the shared checks of
``onward.testing.rows`` name a decision or a signal applied twice -- and nothing else -- on
history rows written by hand (the engine never writes such rows; that is the point). And what
the runner erases and migrates: the contacts it erases are not those it cancels, its version 2
is a migration onward accepts (with its map, and only with it), the checks leave erased runs
out (their details redacted alike would look like one), and the column scan of the erasure
figures finds an identifier as a whole word, in any case."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from onward.chaos import scenario
from onward.chaos.runner import columns_holding
from onward.engine import Engine
from onward.errors import MigrationRefused
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
            "INSERT INTO history_log (org_id, run_id, event, seq, attempt, detail)"
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
    sql.execute("DELETE FROM history_log WHERE run_id LIKE 'bad-%'")

    _history(sql, "bad-2", ASKED, WAIT, decided("a7"), WAIT, decided("a8"))  # no new request
    assert double_transitions(sql) == {"step_decided_twice": 1}
    sql.execute("DELETE FROM history_log WHERE run_id LIKE 'bad-%'")

    _history(sql, "bad-3", ASKED, WAIT, decided("a6"), fired(2))  # and by the deadline
    assert double_transitions(sql) == {"woken_twice_per_wait": 1}
    sql.execute("DELETE FROM history_log WHERE run_id LIKE 'bad-%'")

    _history(sql, "bad-4", WAIT, consumed("s2"), WAIT, consumed("s3"))  # one entry, two signals
    assert double_transitions(sql) == {"step_took_two_signals": 1}
    sql.execute("DELETE FROM history_log WHERE run_id LIKE 'bad-%'")

    _history(sql, "bad-5", WAIT, consumed("s4"))
    _history(sql, "bad-6", WAIT, consumed("s4"))  # one signal, consumed by two runs
    assert double_transitions(sql) == {"signal_consumed_twice": 1}


def test_the_runner_erases_and_migrates_what_it_does_not_cancel() -> None:
    erased = {i: scenario.erase_plan(i) for i in range(40) if scenario.erase_plan(i)}
    assert set(erased.values()) == {"early", "finished"}
    assert not any(scenario.cancel_plan(i) for i in erased)  # its own figures stay its own
    assert scenario.identifiers(11) == ["contact-11", "maya+11@example.test"]
    # version 2: the same steps but the renamed one, which the map names; its outcome is
    # counted under version 1's name
    v1 = [s["id"] for s in scenario.document()["steps"]]
    v2 = [s["id"] for s in scenario.document(version=2)["steps"]]
    renamed = [scenario.MIGRATION_MAP.get(step, step) for step in v1]
    assert v2 == renamed and v2 != v1
    assert scenario.outcome_step("no_answer") == "no_reply" == scenario.outcome_step("no_reply")


async def test_version_2_is_a_migration_onward_accepts(engine: Engine) -> None:
    await engine.publish(scenario.document())
    await engine.start(scenario.AUTOMATION, scenario.payload(0), event_id="e0")  # at its wait
    await engine.publish(scenario.document(version=2))
    plan = await engine.migrate_runs(
        scenario.AUTOMATION, 1, 2, scenario.MIGRATION_MAP, dry_run=True, by="test"
    )
    assert (plan["map"], plan["runs"], plan["outcomes"]) == (
        scenario.MIGRATION_MAP,
        1,
        {"moved": 1},
    )
    # the run can still reach the renamed step: without the map, refused
    with pytest.raises(MigrationRefused, match="no_reply"):
        await engine.migrate_runs(scenario.AUTOMATION, 1, 2, {}, dry_run=True)


def test_erased_runs_are_left_out_of_the_checks_that_read_details(sql: Sql) -> None:
    redacted = {"redacted": "erased"}  # what erasure leaves of every detail
    _history(sql, "erased-1", ("timer_fired", redacted))
    _history(sql, "erased-2", ("timer_fired", redacted))
    assert double_transitions(sql) == {"timer_fired_twice": 1}  # two timers look like one
    assert double_transitions(sql, skip=["erased-1", "erased-2"]) == {}


def test_the_column_scan_finds_an_identifier_as_a_whole_word_in_any_case(sql: Sql) -> None:
    _history(sql, "r-1", ("step_done", {"to": "Maya+12@Example.test", "id": "contact-12"}))
    assert columns_holding(sql, ["contact-1", "maya+1@example.test"]) == {}
    _history(sql, "r-2", ("step_done", {"note": "MAYA+1@example.test wrote"}))
    assert columns_holding(sql, ["contact-1", "maya+1@example.test"]) == {"history_log.detail": 1}
    _history(sql, "r-3", ("step_done", {"contact": "contact-1"}))
    assert columns_holding(sql, ["contact-1"]) == {"history_log.detail": 1}
