"""A CI-sized chaos run (``onward chaos --runs 30``) of the full reference scenario: real worker,
leader, starter and engine API processes against a real PostgreSQL and the sandbox providers,
killed with SIGKILL at every crash point a process can reach (plus random points and random
moments), with random database connections terminated, a worker paused (SIGSTOP) past its lease
and woken, every wake delivered twice and out of order, and the sweeper's clock five minutes
fast -- while people click Approve in Slack (two approvers at once, Slack retries and replays)
and answer the emails (every reply delivered twice; early, late, or never) -- and while the CRM
fails in bursts that open, probe and close its circuit, and drafts park on a budget in tokens
until the runner raises it, and while the runner cancels some runs through the API (waiting,
and with a step in flight), publishes version 2 and migrates the runs of version 1 to it (its
driver killed inside a batch, then resumed), erases a few contacts through the API (killed
after the record and after a run's erasure, asked again), and breaks the mailbox's connection
for a moment (its notification delivered to a receiver that fails twice, by a relay killed
after the receiver's 2xx). It fails if any figure is wrong: a run lost or unfinished, a
transition, a decision or a signal applied twice, a step not following its decision or its
signal, a duplicate effect at any provider, a completed run without its provider work or a
draft without its charge, a run left parked on a circuit or a budget, a run on two versions
or migrated twice, an erased contact's identifier left in any column, a notification not
received exactly once (distinct) or without ``delivered_at``, a process dying in a way nobody
planned, a lease taken before it lapsed, or a crash point never reached -- the circuits', the
budget's, the migration's, the erasure's and the notification relay's included."""

from __future__ import annotations

from pathlib import Path

import pytest

from onward.chaos import run_chaos, scenario
from onward.chaos.runner import CIRCUIT_POINTS, LEADER_POINTS, RARE_POINTS, UNREACHABLE
from onward.chaos.scenario import cancel_plan, charges, erase_plan
from onward.config import Settings
from onward.crashpoints import POINTS

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(300)]

RUNS = 30


def test_a_short_chaos_run_loses_nothing_and_repeats_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    progress: list[str] = []
    report = run_chaos(
        settings,
        runs=RUNS,
        kills_per_point=1,
        out=progress.append,
        time_limit=180.0,
        log_dir=tmp_path / "logs",
    )
    print("\n".join(progress))
    print(report.render())  # shown when the test fails

    assert not report.timed_out
    assert report.ok
    # every event started exactly one run, however often it was delivered
    assert report.started == RUNS
    assert report.deliveries >= 2 * RUNS
    assert report.duplicates_acknowledged >= RUNS
    # every run finished or waits for a person; none failed, none is stuck
    assert report.lost == 0 and report.unfinished == 0 and report.no_way_forward == 0
    assert report.failed == 0 and report.parked_other == 0
    erased = {scenario.payload(i)["contact"] for i in range(RUNS) if erase_plan(i)}
    assert (
        report.completed + report.parked_for_review + report.cancelled + report.erased_cancelled
        == RUNS
    )
    # cancelled through the API while waiting and with a step in flight: each run ended
    # cancelled, and no provider call began after its cancel committed (except in flight)
    assert report.cancelled == len([i for i in range(RUNS) if cancel_plan(i)])
    assert report.cancels.get("cancelled", 0) > 0 and report.cancels.get("cancel_requested", 0) > 0
    assert report.cancels_not_honoured == 0 and report.calls_after_cancel == 0
    assert set(report.parked_by_provider) <= {"model", "payment"}  # never email or CRM
    assert report.charged_runs <= charges(RUNS)
    # nothing applied twice, at home or at a provider
    assert report.double_transitions == 0, report.doubles
    assert report.duplicates == {"email": 0, "crm": 0}  # no email sent twice
    assert report.payment_duplicates == 0
    assert report.missing_effects == 0
    # the approvals: one decision per request, whoever clicked and however often
    assert report.decisions > 0 and report.races > 0 and report.clicks_decided > 0
    assert report.double_decisions == 0, report.doubles
    assert report.race_answers_both_yes == 0
    assert report.decisions_astray == 0
    assert report.clicks_refused_otherwise == 0 and report.people_errors == []
    assert report.replays > 0
    # the replies: each consumed once, by the step that waited for it
    assert report.replies_consumed > 0
    assert report.double_consumed == 0, report.doubles
    assert report.signals_astray == 0
    assert report.deliveries_refused_otherwise == 0
    assert report.reply_answers.get("duplicate", 0) > 0  # the provider's second delivery
    assert report.silent_runs > 0 and report.outcomes.get("no_reply", 0) > 0
    assert report.completed <= sum(report.outcomes.values()) <= RUNS
    # the schedule beside the scenario fired throughout: one run per instant, none missing
    assert report.scheduled_firings > 0 and report.scheduled_gaps == 0
    assert report.ledger["crm"] >= report.completed
    assert report.ledger["email"] <= report.ledger["crm"]  # rejected runs send nothing
    # flow control: circuits opened, were probed and closed, and every step parked on one
    # resumed; drafts parked on the budget resumed when it was raised, each charged once
    assert report.bursts > 0 and report.circuits_opened > 0 and report.circuits_closed > 0
    assert report.circuit_probes > 0 and report.circuit_parks > 0 and report.circuit_resumed > 0
    assert report.budget_parks > 0 and report.budget_raises > 0 and report.budget_resumed > 0
    assert report.budget_charges == (
        report.ledger["model"] - report.model_repeats - report.model_uncharged_cancelled
    )
    assert report.budget_missing_charges == 0 and report.budget_reservations_left == 0
    # the fence and the lease held, with the sweeper's clock skewed
    assert report.leases_taken_early == 0
    # the kills really happened, at every point a process can reach
    assert report.unexpected_exits == []
    # with the PostgreSQL queue the relay fires timers itself: timer.after_fire is a Redis
    # point (tests/acceptance/test_timer_crash.py kills it there)
    assert set(report.unreachable) == {*UNREACHABLE, "timer.after_fire"}
    reachable = set(POINTS) - set(report.unreachable)
    assert set(report.expected_kills) == reachable
    never = sorted(p for p in reachable if report.kills.get(p, 0) == 0)
    assert never == [], f"crash points never reached: {never}"
    assert "circuit.after_half_open" in LEADER_POINTS  # the elected sweeper half-opens
    flow_points = {*CIRCUIT_POINTS, "budget.after_reserve"}
    assert {p: report.kills.get(p, 0) > 0 for p in flow_points} == dict.fromkeys(flow_points, True)
    assert report.external_kills >= 2
    assert report.pauses >= 1  # a worker SIGSTOPped past its lease, then woken: fenced
    assert report.db_connections_terminated > 0
    # the migration: version 2 published mid-run, version 1's unfinished runs moved in
    # batches by a driver killed inside one, then resumed; each run on one version, moved once
    assert report.migration_status == "done" and report.migration_drivers >= 2
    assert report.runs_migrated > 0 and report.runs_by_version.get(2, 0) > 0
    assert sum(report.runs_by_version.values()) == RUNS
    assert report.migrated_twice == 0 and report.runs_on_two_versions == 0
    assert report.migration_errors == []
    # the erasures: every planned contact erased (asked again after the API died with it),
    # each of its runs erased, and none of its identifiers left in any column
    assert set(report.erasures) == erased and report.erasures_lost > 0
    assert report.erased_runs == len(erased) and report.erased_runs_not_erased == 0
    assert report.erasures_pending == 0 and report.erasure_errors == []
    assert report.erasure_leaks == {}
    # the outage: its notification received once (distinct) though the receiver failed
    # twice and a relay died after its 2xx (sent again, a repeat), and delivered_at written
    assert report.outages >= 1 and report.notifications == report.outages
    assert report.reconnect_parked_after_restore == 0  # none parked behind a done restore
    assert report.notifications_undelivered == 0 and report.hook_bad_signatures == 0
    assert report.hook_distinct == report.notifications
    assert report.hook_missing == 0 and report.hook_unknown == 0
    assert report.hook_failed == scenario.HOOK_FAILS and report.hook_repeats >= 1
    assert {p: report.kills.get(p, 0) > 0 for p in RARE_POINTS} == dict.fromkeys(RARE_POINTS, True)
    # only the operator's key rotation is outside the scenario (its own acceptance test)
    assert set(UNREACHABLE) == {"vault.between_batches"}
    # the invariant queries agree
    doctor = {c["name"]: c for c in report.doctor}
    assert doctor["runs_without_way_forward"]["value"] == 0
    assert doctor["overdue_timers"]["ok"] and doctor["expired_leases"]["ok"]
