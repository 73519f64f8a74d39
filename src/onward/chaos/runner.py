"""``onward chaos``: kill real processes at every crash point while the reference scenario runs,
then count what survived.

Set-up: a scratch database on the configured server (or the embedded one), the sandbox
providers in a child process with a little of every provider fault, one connection per
provider (Slack with its signing secret), the approvers granted, the scenario published
(:mod:`onward.chaos.scenario`: approval in Slack, email, the wait for Maya's reply), and beside
it, in an organisation of its own, an automation whose schedule starts a run every 3 s
(``scenario.clock_document``), so the leader is killed while it fires schedules too.

Processes (each with its own ``application_name``):

* ``workers`` worker slots (worker + outbox relay), every wake delivered twice and out of order;
* one leader slot (worker + relay + the only sweeper candidate), its clock skewed by five
  minutes with libfaketime when installed: it rescues leases, so an early theft would show;
* one starter, fed batches of start events (each delivered twice, like a webhook; 20 at once,
  so concurrent starts are written together);
* one engine API (``onward api`` on a port chosen at the start, kept by every restart), where
  the sandbox sends the Slack clicks (``/v1/slack/slack/interactivity``, signed) and Maya's
  replies (``/v1/inbound/email``, the API key as the URL's Basic user info). It is the process
  killed at ``approval.after_decide`` and ``signal.after_claim``: a click or a delivery whose
  answer is lost is simply sent again. The runner's own calls (cancels, erasures, a restore,
  resumes) present the admin API key it makes at the start (``Engine.create_key``).

Flow control (R5, ``scenario.configure_flow_control``): every connection has a circuit breaker
with a low threshold and a short cool-down, and the automation a budget in tokens that fits a
few drafts. The runner makes the CRM answer 503 in bursts (``scenario.burst_knobs``) -- some at
random moments, and every few seconds while a process is armed at a circuit's crash point --
so its circuit opens (``circuit.after_open``, in the worker whose failure opened it), the
elected sweeper half-opens it (``circuit.after_half_open``), a probe fails (it opens again)
and the next succeeds (``circuit.before_close``, in the probe's worker); and it raises the
budget whenever drafts are parked on it (every draft reserves its maximum cost first:
``budget.after_reserve``). The workers' reservations have a short lease
(``scenario.BUDGET_LEASE_S``), so a kill's reservation stops counting soon. A run parked on a
circuit or a budget is in flight, not finished.

A run's whole life (R11, R12, R14, R15), through the same processes:

* cancels: some runs are cancelled through the API while they wait and with a step in flight
  (``scenario.cancel_plan``; one planned in flight while the API is down, killed at a crash
  point, goes through the library's ``cancel.cancel_run`` instead: the step would settle
  before the API is back);
* migration: once ``MIGRATE_AT`` of the schedule is done, version 2 is published and version
  1's unfinished runs migrated by ``onward runs migrate --batch 3`` (a process of its own,
  killed at ``migrate.in_batch``), continued by ``onward operations resume`` after each kill;
* erasures: one contact in ten (``scenario.erase_plan``) is erased through the API (``POST
  /v1/contacts/{id}/erase``) in its run's first steps or once it finished -- while kills at
  ``erasure.after_record`` / ``erasure.after_run`` are still to come, mostly when the API is
  armed at one -- and asked again when the answer is lost; a pending erasure (a step was in
  flight) is finished by the elected sweeper;
* an outage: every relay process is armed at ``notify.after_send`` (a line on its stdin), the
  mailbox's provider refuses (401) until a send marks the connection broken (the notification
  written; runs park on it) and a moment more, then the runner restores it (``POST
  /v1/connections/mailbox/restore``); the receiver fails the first attempts, the relay that gets
  its 2xx dies, the others are disarmed, and another sends it again with the same id.

The people (a thread of the runner, :class:`_People`) act through the sandbox as the scenario
says (``scenario.decision``, ``scenario.reply``): they click in every approval message once it is
posted (two approvers at once on some runs, Slack retries and byte-for-byte replays on others),
and answer the emails (twice delivered by the provider; early on some runs, never on others).
A click or a delivery that got no answer is tried again while the request is pending or the
step still waits.

The workers, the leader and the starter are ``python -m onward.testing.worker`` processes;
the engine API is ``python -m onward.chaos.api_standby`` (``onward api`` once told to go).

Every slot is respawned when its process dies, from a warm spare that has already imported
everything (``--standby``), armed (``point@n``, exactly what ``ONWARD_CRASH_AT`` does) with the
next kill of a schedule that takes every crash point a process can reach ``kills_per_point``
times (the first round at ``@1``, later ones at a random ``@2..4``), then random points at a
random ``@n``. Once the schedule is empty, the kills still armed are armed in every worker
slot, so the last runs cannot slip past them; a kill at a circuit's point in a worker is armed
in every worker slot from the start (whichever worker makes the call is the one). Besides, the runner SIGKILLs random processes at
random moments, pauses a worker with SIGSTOP past its leases and wakes it with SIGCONT, and a
thread terminates random engine database connections (``pg_terminate_backend``) until the
schedule is done. ``shutdown.before_release`` is reached by a graceful shutdown, so that
process gets a SIGTERM once it works; ``worker.before_settle_error`` needs a failing handler,
so the sandbox refuses the next few calls when it is armed. Starts are fed in step with the
kill schedule (and some held back for its tail), so runs are in flight at every kill, but
never more than ``12 * (workers + 1)`` unfinished at once: the people answer within the
deadlines of a busy day, not of a thousand runs started in one minute. The run
ends when every run is finished or parked and the schedule is done (a kill whose point can no
longer come is counted as missed), or at the time limit.

Figures: runs started (exactly one per event), completed, parked for review by provider,
lost (no durable way forward, or unfinished at the end), transitions applied twice (history),
provider duplicates (sandbox ledger), decisions (by a person, by the deadline's default; any
decision applied twice; any step whose decision is not its request's), replies (consumed,
late, applied twice; any consumed signal its step did not take), scheduled firings (one run
per instant, none missing between the first and the last, repeats acknowledged as
duplicates), flow control (circuits opened, probed and closed, steps parked on circuits and
on the budget and resumed, the budget's raises and charges), kills per point, unexpected exits,
the migration (runs per version, migrated, twice, on two versions), the erasures (runs
erased, identifiers left in any text/jsonb/text[] column), the notifications (written,
delivered, received once per id, repeats), the doctor (R16). ``ok`` iff nothing was lost, every run finished or parked for review (none
left parked on a circuit or a budget), nothing applied twice (transitions, decisions,
signals), no decision or signal went astray, no idempotent provider did work twice, no
scheduled firing went without its run, no completed draft went uncharged, the migration
finished with every run on one version, moved at most once, the erasures finished leaving no
identifier behind, and every notification was received and marked delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from onward import budgets
from onward import cancel as cancel_ops
from onward.automations.versions import publish
from onward.bench.db import scratch_database
from onward.chaos import scenario
from onward.chaos.faults import BackendKiller
from onward.config import Settings
from onward.crashpoints import POINTS
from onward.db import make_pool, resolve_url
from onward.engine import TERMINAL, Engine
from onward.notify import new_secret, webhook_id
from onward.sandbox import SandboxServer
from onward.sandbox.admin import SandboxAdmin
from onward.testing.databases import with_query
from onward.testing.processes import Process, libfaketime, process_env
from onward.testing.rows import (
    DECISION_CHECKS,
    SIGNAL_CHECKS,
    double_transitions,
    runs_without_way_forward,
    unfinished_runs,
)
from onward.testing.worker import settings_to_json, worker_argv, worker_stats

Out = Callable[[str], None]

# Which process can reach each crash point. Points no process of the scenario reaches are
# listed with the reason; any other (new) point is armed in worker processes.
STARTER_POINTS = ("start.after_commit",)
LEADER_POINTS = (
    "sweep.after_claim",
    "sweep.after_fire",
    "schedule.after_start",
    "circuit.after_half_open",
)
# Reached in the API process: a decision's transaction, a delivered reply consumed at once.
# (``signal.after_claim`` is also reached by a worker's settle when a reply came before the
# wait: the early replies; those kills come from the API's turn at it.)
# The erasures go through the API too (``POST /v1/contacts/{id}/erase``).
ERASURE_POINTS = ("erasure.after_record", "erasure.after_run")
DECIDE_POINT, SIGNAL_POINT = "approval.after_decide", "signal.after_claim"
API_POINTS = (DECIDE_POINT, SIGNAL_POINT, *ERASURE_POINTS)
# Reached by the processes driving the migration: ``onward runs migrate`` (batches of
# MIGRATE_BATCH runs), then ``onward operations resume`` after each kill (role "migrator").
MIGRATE_POINT = "migrate.in_batch"
MIGRATOR_POINTS = (MIGRATE_POINT,)
# Reached by whichever relay process (a worker or the leader) delivers the notification of the
# broken connection: armed in all of them at once, through their stdin, before the break.
NOTIFY_POINT = "notify.after_send"
# Points the scenario reaches a few times per run, when the runner makes them happen: always
# armed at their first hit, never chosen as random points.
RARE_POINTS = (*ERASURE_POINTS, MIGRATE_POINT, NOTIFY_POINT)
# Points reached only while drafts are still being written (each draft reserves its cost once,
# early in its run, and again when it resumes from the budget): armed first in each round, so
# a short run does not end its drafts before their turn comes.
EARLY_POINTS = ("budget.after_reserve",)
# A process armed with a kill whose point did not come in its window is stopped gracefully and
# the kill is armed again, RETRY_GAP kills later (not behind the whole queue: by then the runs
# that could reach it may have finished), up to NO_SHOW_TRIES windows in all; a worker's kill
# armed again is armed in every running worker too (_Chaos._share_retry).
NO_SHOW_TRIES, RETRY_GAP = 5, 3
UNREACHABLE: dict[str, str] = {
    "vault.between_batches": "an operator's onward keys rotate-secrets, not part of the "
    "scenario (tests/acceptance/test_vault_crash.py kills it there)",
}
SHUTDOWN_POINT = "shutdown.before_release"
# Reached only while a circuit opens, half-opens or closes: the CRM fails in bursts while a
# process is armed at one of them.
CIRCUIT_POINTS = ("circuit.after_open", "circuit.after_half_open", "circuit.before_close")
# ... in a worker: whichever makes the failing call or runs the probe (armed in every slot)
SHARED_POINTS = ("circuit.after_open", "circuit.before_close")
BURST_EVERY_S = 4.0  # at most one burst this often while a process is armed at one
BUDGET_RAISE_EVERY_S = 1.0  # at most one raise of the budget this often
ERROR_POINT = "worker.before_settle_error"
# The migration: version 2 published once this much of the kill schedule is done, if at least
# MIGRATE_MIN runs of version 1 are unfinished; moved in batches of MIGRATE_BATCH.
MIGRATE_AT, MIGRATE_MIN, MIGRATE_BATCH = 0.25, 4, 3
# The broken connection: one outage per notify kill, at these fractions of the schedule; the
# provider refuses for BREAK_HOLD_S once the connection is marked broken (runs park on it), or
# the runner probes the connection if no send meets the refusal within BREAK_PROBE_S.
BREAK_AT = (0.4, 0.6, 0.75, 0.85, 0.9)
BREAK_HOLD_S, BREAK_PROBE_S = 1.5, 15.0
CLOCK_SKEW = "+300"  # the leader's clock runs five minutes fast

CHAOS_TIMINGS = {
    "lease_seconds": 2.0,
    "heartbeat_seconds": 0.5,
    "poll_seconds": 0.3,
    "sweep_seconds": 0.3,
    "shutdown_grace_seconds": 1.0,
}


@dataclass
class Spec:
    """One planned kill: die at the nth time ``point`` is reached."""

    point: str
    n: int
    origin: str  # "scheduled" | "random"
    tries: int = 0
    done: bool = False  # killed there, or given up (missed)

    @property
    def arm(self) -> str:
        return f"{self.point}@{self.n}"


@dataclass
class Proc(Process):
    """A process in a slot of the run, with what the runner planned for it."""

    role: str = "worker"  # "worker" | "leader" | "starter" | "api"
    slot: int = -1
    specs: list[Spec] = field(default_factory=list)
    spawned_at: float = 0.0
    ready_at: float | None = None
    term_at: float | None = None
    resume_at: float | None = None
    external: bool = False
    erase_calls: int = 0  # the API: erasures asked of it (an erasure's kill needs one)
    people_at: tuple[int, int] = (0, 0)  # the API: clicks and reply posts when it was armed


@dataclass
class Report:
    runs: int
    queue: str
    workers: int
    started: int = 0
    deliveries: int = 0
    duplicates_acknowledged: int = 0
    completed: int = 0
    failed: int = 0
    parked_for_review: int = 0
    parked_by_provider: dict[str, int] = field(default_factory=dict)
    parked_other: int = 0
    charged_runs: int = 0
    unfinished: int = 0
    no_way_forward: int = 0
    # runs whose row is behind its steps with no step running (migration 0030: only a running
    # step's run may be behind; every transition out of 'running' catches the row up)
    rows_behind: int = 0
    # steps entered before the step they follow ended: a run with two unfinished steps at once
    # (migration 0034 leaves a running step out of steps_one_unfinished: its successor is
    # written only by the statement that ends it, at the same instant)
    steps_entered_early: int = 0
    lost: int = 0
    lost_runs: list[str] = field(default_factory=list)
    lost_detail: list[dict[str, Any]] = field(default_factory=list)
    stalled: bool = False
    double_transitions: int = 0
    doubles: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)  # idempotent providers
    payment_duplicates: int = 0
    model_repeats: int = 0
    # drafts the model did for a run then cancelled (by the runner or an erasure) whose step
    # never settled: a process killed after the call, the run cancelled before a retry; the
    # model can neither reconcile nor repeat, so the cost stays unknown and is not charged
    model_uncharged_cancelled: int = 0
    crm_repeat_upserts: int = 0
    missing_effects: int = 0
    ledger: dict[str, int] = field(default_factory=dict)
    kills: dict[str, int] = field(default_factory=dict)
    expected_kills: dict[str, int] = field(default_factory=dict)
    random_point_kills: int = 0
    missed: dict[str, int] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)
    external_kills: int = 0
    pauses: int = 0
    graceful_stops: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    processes: int = 0
    db_connections_terminated: int = 0
    leases_taken_early: int = 0
    stale_settles_refused: int = 0
    clock_skew: str | None = None
    scheduled_firings: int = 0  # runs the clock's schedule started (scenario.CLOCK_ORG)
    scheduled_gaps: int = 0  # instants between its first and last firing with no run
    scheduled_repeats: int = 0  # firings repeated after a kill, acknowledged as duplicates
    # approvals (R10)
    approval_requests: int = 0
    decisions: int = 0  # by a person (a click): the request approved or rejected
    approved: int = 0
    rejected: int = 0
    decided_by_default: int = 0  # the deadline came first: the step's default applied
    double_decisions: int = 0  # DECISION_CHECKS, + races where both clickers were told "yes"
    decisions_astray: int = 0  # a done approval step whose decision is not its request's
    races: int = 0  # requests two approvers clicked at the same moment
    race_answers_both_yes: int = 0
    clicks: int = 0
    clicks_decided: int = 0  # answered: this click decided
    clicks_read_back: int = 0  # answered: decided before (first wins), expired...
    clicks_lost: int = 0  # no answer (API killed) or 5xx: clicked again while pending
    clicks_refused_otherwise: int = 0  # 401/4xx: must be 0
    replays: int = 0  # Slack retries and byte-for-byte replays after the answer
    replays_decided: int = 0  # a replay of a click whose answer was lost: the first decision
    slack_posts: int = 0
    slack_reposts: int = 0  # approval messages posted again after an unknown outcome
    # signals (R9)
    replies_sent: dict[str, int] = field(default_factory=dict)  # reply/unsubscribe/early
    silent_runs: int = 0  # Maya never answers: the deadline decides
    reply_answers: dict[str, int] = field(default_factory=dict)  # what the intake answered
    deliveries_lost: int = 0  # no answer (API killed) or 5xx: delivered again while waiting
    deliveries_refused_otherwise: int = 0  # 4xx other than 409: must be 0
    replies_undelivered: int = 0  # every delivery lost until the step stopped waiting
    signals: dict[str, int] = field(default_factory=dict)  # by status at the end
    replies_consumed: int = 0
    replies_late: int = 0  # the deadline came first: recorded late, or refused (run finished)
    replies_refused: int = 0  # late, after the run (that went on without it) had finished
    double_consumed: int = 0  # SIGNAL_CHECKS
    signals_astray: int = 0  # consumed but not what its step took, or taken but not consumed
    outcomes: dict[str, int] = field(default_factory=dict)  # thank, unsubscribed, no_reply...
    people_errors: list[str] = field(default_factory=list)
    # flow control (R5)
    bursts: int = 0  # bursts of 503s the runner asked of the burst provider
    circuits_opened: int = 0  # a closed circuit opened (history circuit_opened, was closed)
    circuits_reopened: int = 0  # a half-open circuit's probe failed: open again
    circuit_probes: int = 0  # circuits half-opened with a probe step (circuit_half_open)
    circuits_closed: int = 0  # openings from closed whose circuit is closed again at the end
    circuits_not_closed: dict[str, str] = field(default_factory=dict)  # key -> state at the end
    circuit_parks: int = 0  # steps parked on a circuit (step_parked: CircuitOpen)
    circuit_resumed: int = 0  # parked steps resumed by a close (circuit_closed)
    budget_parks: int = 0  # drafts parked on the budget (step_parked: BudgetExhausted)
    budget_resumed: int = 0  # ... resumed (step_resumed by budget)
    budget_raises: int = 0  # by the runner
    budget_per_day: float = 0.0  # the budget at the end
    budget_charged: float = 0.0  # today's charges under it
    budget_charges: int = 0  # effect keys charged
    budget_reservations_left: int = 0  # reservation rows at the end (live, or not cancelled)
    # lapsed reservations of cancelled runs: a draft killed after reserving, its run then
    # cancelled (the retry that would charge or release it never runs); they no longer count
    # and go with their run (retention)
    budget_reservations_cancelled: int = 0
    budget_missing_charges: int = 0  # completed runs' drafts with no charge: must be 0
    # cancellation (R12): the runner cancels some runs through the API
    cancels: dict[str, int] = field(default_factory=dict)  # the API's outcome -> runs
    cancelled: int = 0  # runs cancelled at the end
    cancels_not_honoured: int = 0  # a cancel answered, the run not cancelled at the end
    cancels_without_api: int = 0  # in-flight cancels sent through the library, the API down
    calls_after_cancel: int = 0  # provider work begun after the cancel committed: must be 0
    calls_in_flight_at_cancel: int = 0  # done after the answer, claimed before the cancel
    cancel_violations: list[str] = field(default_factory=list)
    # migration (R11): version 2 published mid-run, the runs of version 1 moved to it
    migration_published_at: int = 0  # runs started when version 2 was published
    migration_v1_unfinished: int = 0  # version 1's unfinished runs then
    migration_status: str = "not started"  # the operation's status at the end
    migration_passes: int = 0
    migration_outcomes: dict[str, int] = field(default_factory=dict)  # the operation's, by kind
    migration_drivers: int = 0  # processes that drove it (migrate, then resume after kills)
    runs_by_version: dict[int, int] = field(default_factory=dict)
    runs_migrated: int = 0  # runs with a run_migrated row
    migrated_twice: int = 0  # runs with more than one run_migrated row: must be 0
    runs_on_two_versions: int = 0  # a step not on its run's version (by migration): must be 0
    migration_errors: list[str] = field(default_factory=list)
    # erasure (R14): some contacts erased through the API while their runs flow
    erasures: dict[str, str] = field(default_factory=dict)  # contact -> the answer's status
    erasure_requests: int = 0  # erase calls the runner made (again after a lost answer)
    erasures_lost: int = 0  # calls with no answer (the API killed): asked again
    erased_runs: int = 0  # runs with erased_at
    erased_cancelled: int = 0  # ... cancelled by their erasure
    erased_after_finishing: int = 0  # ... finished before their erasure
    erasures_pending: int = 0  # erasures rows not done at the end: must be 0
    erased_runs_not_erased: int = 0  # runs of an erased contact without erased_at: must be 0
    erasure_leaks: dict[str, int] = field(default_factory=dict)  # "table.column" -> rows
    erasure_errors: list[str] = field(default_factory=list)
    starts_refused_erased: int = 0  # redeliveries refused: the contact was erased meanwhile
    # notifications (R15): a connection broken and restored; its notification delivered
    outages: int = 0  # times the runner broke the connection (and restored it)
    outages_probed: int = 0  # ... marked broken by the runner's probe (no send met the 401)
    reconnect_parks: int = 0  # steps parked on the broken connection
    reconnect_resumed: int = 0  # ... resumed by the restore
    # steps seen parked on it while it was usable (after the restore): nothing would resume
    # them (the engine goes on instead of parking, connections.usable_for_park): must be 0
    reconnect_parked_after_restore: int = 0
    notifications: int = 0
    notifications_undelivered: int = 0  # delivered_at not written: must be 0
    hook_attempts: int = 0  # requests the receiver got (503s and repeats included)
    hook_failed: int = 0  # ... answered 503
    hook_repeats: int = 0  # ... answered as a duplicate (a relay killed after the 2xx)
    hook_distinct: int = 0  # notifications the receiver holds (once per id)
    hook_missing: int = 0  # notifications the receiver never got: must be 0
    hook_unknown: int = 0  # received but no such notification: must be 0
    hook_bad_signatures: int = 0  # must be 0
    doctor: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0
    time_limit_s: float = 0.0
    timed_out: bool = False
    log_dir: str | None = None

    @property
    def idempotent_duplicates(self) -> int:
        return sum(self.duplicates.values())

    @property
    def early_before_wait(self) -> int:
        """Replies stored before their step waited (kept pending, or unrouted until the send
        recorded its key), then consumed by the settle that made it wait."""
        return self.reply_answers.get("pending", 0) + self.reply_answers.get("unrouted", 0)

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())

    @property
    def ok(self) -> bool:
        return not self._problems()

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(
            ok=self.ok,
            idempotent_duplicates=self.idempotent_duplicates,
            early_before_wait=self.early_before_wait,
            total_kills=self.total_kills,
        )
        return data

    def render(self) -> str:
        parked = ", ".join(f"{p} {n}" for p, n in sorted(self.parked_by_provider.items()))
        lines = [
            f"onward chaos: {self.runs} runs of {scenario.AUTOMATION} (queue {self.queue}), "
            f"{self.workers} worker processes + 1 leader + 1 starter + 1 API, "
            f"{self.elapsed_s:.0f} s"
            + (" (STALLED: no run moved for 90 s)" if self.stalled else "")
            + (" (TIME LIMIT REACHED)" if self.timed_out and not self.stalled else ""),
            "",
            f"runs started                 {self.started} / {self.runs}"
            f"   ({self.deliveries} webhook deliveries, {self.duplicates_acknowledged} "
            "duplicates acknowledged)",
            f"runs completed               {self.completed}",
            f"runs parked for review       {self.parked_for_review}"
            + (f"   ({parked})" if parked else "")
            + f"   [{self.charged_runs} runs reached the payment provider]",
            f"runs failed                  {self.failed}",
            f"runs cancelled               {self.cancelled}   (the API answered "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.cancels.items())) or "nothing")
            + f"; {self.cancels_without_api} of them in flight through the library, the API "
            f"down; not ended cancelled {self.cancels_not_honoured}; provider calls after the "
            f"cancel {self.calls_after_cancel}, in flight at it {self.calls_in_flight_at_cancel})",
            f"runs parked otherwise        {self.parked_other}",
            f"runs lost (no way forward)   {self.lost}"
            f"   (unfinished at the end {self.unfinished}, no durable way forward "
            f"{self.no_way_forward})",
            f"run rows behind their steps  {self.rows_behind}   (with no step running)",
            f"steps entered early          {self.steps_entered_early}   (before the step they "
            "follow ended: two unfinished steps in one run)",
            f"transitions applied twice    {self.double_transitions}"
            + (f"   {self.doubles}" if self.double_transitions else ""),
            "provider duplicates          "
            + ", ".join(f"{p} {n}" for p, n in sorted(self.duplicates.items()))
            + " (idempotent providers: must be 0)",
            f"                             payment {self.payment_duplicates} "
            "(no idempotency: uncertain charges park instead)",
            f"repeated calls (harmless)    model generations {self.model_repeats} (uncharged, "
            f"of cancelled runs {self.model_uncharged_cancelled}), "
            f"CRM upserts {self.crm_repeat_upserts}",
            f"completed runs missing work  {self.missing_effects}",
            f"approvals                    {self.approval_requests} requests; decisions: "
            f"{self.decisions} (approved {self.approved}, rejected {self.rejected}), double: "
            f"{self.double_decisions}; by the deadline's default: {self.decided_by_default}",
            f"                             {self.races} clicked by two approvers at once "
            f"({self.race_answers_both_yes} told both yes); steps not following their "
            f"decision {self.decisions_astray}",
            f"clicks                       {self.clicks} sent: {self.clicks_decided} decided, "
            f"{self.clicks_read_back} read the first decision back, {self.clicks_lost} lost "
            f"(clicked again), {self.clicks_refused_otherwise} refused otherwise; "
            f"{self.replays} Slack retries/replays ({self.replays_decided} decided)",
            f"slack messages               {self.slack_posts} posted ({self.slack_reposts} again "
            "after an unknown outcome: harmless, its buttons decide once)",
            f"replies                      consumed: {self.replies_consumed}, late: "
            f"{self.replies_late} ({self.replies_refused} refused: their run had finished), "
            f"double: {self.double_consumed}; astray {self.signals_astray}",
            "                             sent "
            + ", ".join(f"{k} {n}" for k, n in sorted(self.replies_sent.items()) if k != "early")
            + f" ({self.replies_sent.get('early', 0)} early: {self.early_before_wait} stored "
            f"before the wait), silent runs {self.silent_runs}; {self.replies_undelivered} "
            "never answered before the deadline",
            "                             intake answered "
            + ", ".join(f"{k} {n}" for k, n in sorted(self.reply_answers.items()))
            + f"; {self.deliveries_lost} lost (delivered again), "
            f"{self.deliveries_refused_otherwise} refused otherwise; signals "
            + ", ".join(f"{k} {n}" for k, n in sorted(self.signals.items())),
            "outcomes                     "
            + ", ".join(f"{k} {n}" for k, n in sorted(self.outcomes.items())),
            f"circuits                     opened {self.circuits_opened} (again after a failed "
            f"probe {self.circuits_reopened}), {self.circuit_probes} probes, closed "
            f"{self.circuits_closed}; {self.bursts} bursts of 503s at "
            f"{scenario.BURST_PROVIDER}; not closed at the end: "
            + (
                ", ".join(f"{k} {v}" for k, v in sorted(self.circuits_not_closed.items())) or "none"
            ),
            f"                             steps parked on a circuit {self.circuit_parks}, "
            f"resumed by a close {self.circuit_resumed} (and as probes {self.circuit_probes})",
            f"budget ({scenario.BUDGET_UNIT}/day)          drafts parked {self.budget_parks}, "
            f"resumed {self.budget_resumed}; raised {self.budget_raises} times to "
            f"{self.budget_per_day:.0f}; charged {self.budget_charged:.0f} for "
            f"{self.budget_charges} calls; reservations left {self.budget_reservations_left} "
            f"(lapsed, of cancelled runs {self.budget_reservations_cancelled}); "
            f"completed drafts not charged {self.budget_missing_charges}",
            f"scheduled firings            {self.scheduled_firings}   (every "
            f"{scenario.CLOCK_EVERY_S} s: {self.scheduled_gaps} missing, "
            f"{self.scheduled_repeats} repeated after a kill as duplicates)",
            f"migration v1 -> v2          {self.migration_status}: published after "
            f"{self.migration_published_at} runs started, {self.migration_v1_unfinished} of "
            f"v1 unfinished; {self.migration_passes} passes, "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.migration_outcomes.items())) or "-")
            + f"; {self.migration_drivers} driver processes (migrate, then resume after each "
            "kill)",
            "                             runs on "
            + (", ".join(f"v{v} {n}" for v, n in sorted(self.runs_by_version.items())) or "-")
            + f"; {self.runs_migrated} migrated, twice {self.migrated_twice}, on two versions "
            f"{self.runs_on_two_versions}",
            f"erasures                     {len(self.erasures)} contacts ("
            + (", ".join(f"{k} {v}" for k, v in sorted(Counter(self.erasures.values()).items())))
            + f"), {self.erasure_requests} requests ({self.erasures_lost} lost, asked again); "
            f"{self.erased_runs} runs erased (cancelled by it {self.erased_cancelled}, finished "
            f"before {self.erased_after_finishing}); pending at the end {self.erasures_pending}; "
            f"runs left unerased {self.erased_runs_not_erased}; identifiers left in "
            f"{sum(self.erasure_leaks.values())} rows"
            + (f" {self.erasure_leaks}" if self.erasure_leaks else "")
            + f"; starts refused as erased {self.starts_refused_erased}",
            f"notifications                {self.notifications} written ({self.outages} "
            f"outages of {scenario.BREAK_CONNECTION}, {self.outages_probed} found by a probe; "
            f"{self.reconnect_parks} steps parked on it, resumed by the restore "
            f"{self.reconnect_resumed}; parked after it {self.reconnect_parked_after_restore}); "
            f"undelivered {self.notifications_undelivered}",
            f"                             receiver: {self.hook_attempts} attempts "
            f"({self.hook_failed} failed, {self.hook_repeats} repeats), {self.hook_distinct} "
            f"distinct; missing {self.hook_missing}, unknown {self.hook_unknown}, bad "
            f"signatures {self.hook_bad_signatures}",
            "ledger                       "
            + ", ".join(f"{p} {n}" for p, n in sorted(self.ledger.items())),
            f"leases taken before lapsing  {self.leases_taken_early}"
            + (f"   (the sweeper's clock skewed {self.clock_skew} s)" if self.clock_skew else ""),
            f"workers paused past lease    {self.pauses}   (SIGSTOP for 2.5 leases, then SIGCONT;"
            " a write by a stale attempt counts as a double transition)",
            "",
            f"kills: {self.total_kills} at crash points ({self.random_point_kills} at random "
            f"points/@n), {self.external_kills} SIGKILLs at random moments, "
            f"{self.graceful_stops} graceful stops, {self.processes} processes started, "
            f"{self.db_connections_terminated} database connections terminated",
            f"  {'crash point':<28} {'kills':>5} {'planned':>7} {'missed':>6}",
        ]
        for point in sorted(set(self.expected_kills) | set(self.kills)):
            lines.append(
                f"  {point:<28} {self.kills.get(point, 0):>5} "
                f"{self.expected_kills.get(point, 0):>7} {self.missed.get(point, 0):>6}"
            )
        for point, why in sorted(self.unreachable.items()):
            lines.append(f"  {point:<28} {'-':>5} {'-':>7} {'-':>6}  not armed: {why}")
        if self.unexpected_exits:
            lines.append(f"unexpected exits: {len(self.unexpected_exits)}")
            lines.extend(f"  {u}" for u in self.unexpected_exits[:10])
        if self.people_errors:
            lines.append(
                f"the people's own errors (sandbox admin calls): {len(self.people_errors)}"
            )
            lines.extend(f"  {e}" for e in self.people_errors[:5])
        if self.doctor:
            lines.append("")
            lines.append("R16 invariants (onward doctor, before the workers stopped):")
            for c in self.doctor:
                mark = "ok " if c["ok"] else "WRN" if c.get("warning") else "BAD"
                lines.append(f"  [{mark}] {c['name']:<26} {c['value']!s:<6} {c['detail']}")
        if self.lost_runs:
            lines.append("lost runs: " + ", ".join(self.lost_runs[:10]))
            for d in self.lost_detail[:10]:
                lines.append("  " + ", ".join(f"{k}={v}" for k, v in d.items()))
        if self.log_dir:
            lines.append(f"process logs kept in {self.log_dir}")
        lines.append("")
        lines.append(
            "OK: nothing lost, nothing applied twice (no double decision, no signal consumed "
            "twice), no duplicate effect at an idempotent provider"
            if self.ok
            else "FAILED: " + ", ".join(self._problems())
        )
        return "\n".join(lines)

    def _problems(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{self.lost} runs lost")
        if self.failed or self.parked_other:
            out.append(
                f"{self.failed + self.parked_other} runs neither finished nor parked for review"
            )
        if self.double_transitions:
            out.append(f"{self.double_transitions} transitions applied twice")
        if self.rows_behind:
            out.append(f"{self.rows_behind} run rows behind their steps with no step running")
        if self.steps_entered_early:
            out.append(f"{self.steps_entered_early} steps entered before their predecessor ended")
        out.extend(
            f"doctor: {c['name']} {c['value']}"
            for c in self.doctor
            if c["name"] == "two_unfinished_steps" and not c["ok"]
        )
        if self.double_decisions:
            out.append(f"{self.double_decisions} decisions applied twice")
        if self.decisions_astray:
            out.append(f"{self.decisions_astray} approval steps not following their decision")
        if self.double_consumed:
            out.append(f"{self.double_consumed} signals consumed twice")
        if self.signals_astray:
            out.append(f"{self.signals_astray} signals consumed but not taken (or the reverse)")
        if self.clicks_refused_otherwise or self.deliveries_refused_otherwise:
            out.append(
                f"{self.clicks_refused_otherwise} clicks and {self.deliveries_refused_otherwise}"
                " email deliveries refused unexpectedly"
            )
        if self.idempotent_duplicates:
            out.append(f"{self.idempotent_duplicates} duplicate effects at idempotent providers")
        if self.scheduled_gaps:
            out.append(f"{self.scheduled_gaps} scheduled firings without a run")
        if self.budget_missing_charges:
            out.append(f"{self.budget_missing_charges} completed drafts never charged")
        if self.cancels_not_honoured:
            out.append(f"{self.cancels_not_honoured} cancelled runs not ended cancelled")
        if self.migration_status not in ("done", "not started"):
            out.append(f"the migration is {self.migration_status}")
        if self.migrated_twice or self.runs_on_two_versions or self.migration_errors:
            out.append(
                f"{self.migrated_twice} runs migrated twice, {self.runs_on_two_versions} on two "
                f"versions" + "".join(f"; {e}" for e in self.migration_errors[:3])
            )
        if self.erasures_pending or self.erased_runs_not_erased or self.erasure_errors:
            out.append(
                f"{self.erasures_pending} erasures pending, {self.erased_runs_not_erased} runs of"
                " an erased contact not erased" + "".join(f"; {e}" for e in self.erasure_errors[:3])
            )
        if self.erasure_leaks:
            out.append(f"an erased contact's identifiers left in {self.erasure_leaks}")
        if self.notifications_undelivered or self.hook_missing or self.hook_unknown:
            out.append(
                f"{self.notifications_undelivered} notifications undelivered, "
                f"{self.hook_missing} never received, {self.hook_unknown} received unknown"
            )
        if self.reconnect_parked_after_restore:
            out.append(
                f"{self.reconnect_parked_after_restore} steps parked on a connection already "
                "restored"
            )
        if self.hook_bad_signatures:
            out.append(f"{self.hook_bad_signatures} notification signatures did not hold")
        if self.calls_after_cancel:
            out.append(
                f"{self.calls_after_cancel} provider calls begun after a cancel: "
                + "; ".join(self.cancel_violations[:3])
            )
        return out


# -- the figures, from the rows and the ledger ----------------------------------------------------


def _db_figures(
    url: str, org: str, report: Report, before_erasure: Counter[str]
) -> tuple[set[str], list[tuple[str, str]]]:
    """Fill the run figures; returns the run ids that count as lost and the provider work the
    completed runs say they did (provider, idempotency key)."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        by_status = {
            r["status"]: r["n"]
            for r in conn.execute(
                "SELECT status, count(*) AS n FROM runs WHERE org_id = %s GROUP BY status", (org,)
            ).fetchall()
        }
        report.started = sum(by_status.values())
        report.completed = by_status.get("completed", 0)
        report.failed = by_status.get("failed", 0)
        parked = conn.execute(
            """SELECT r.run_id, s.wait_kind, e.provider
               FROM runs r
               JOIN steps s ON s.org_id = r.org_id AND s.run_id = r.run_id AND s.status = 'parked'
               LEFT JOIN effects e ON e.org_id = s.org_id AND e.run_id = s.run_id
                                  AND e.seq = s.seq AND e.status = 'review'
               WHERE r.org_id = %s AND r.status = 'parked'""",
            (org,),
        ).fetchall()
        review = [p for p in parked if p["wait_kind"] == "review"]
        report.parked_for_review = len(review)
        report.parked_by_provider = dict(Counter(p["provider"] or "?" for p in review))
        report.parked_other = by_status.get("parked", 0) - len(review)
        unfinished = unfinished_runs(conn, org=org)
        report.unfinished = len(unfinished)
        stuck = runs_without_way_forward(conn)
        report.no_way_forward = len(stuck)
        behind = conn.execute(_ROWS_BEHIND, (org,)).fetchone()
        report.rows_behind = int(behind["n"]) if behind else 0
        early = conn.execute(_ENTERED_EARLY, (org,)).fetchone()
        report.steps_entered_early = int(early["n"]) if early else 0
        lost = sorted(unfinished | stuck)
        if lost:
            rows = conn.execute(
                """SELECT r.run_id, r.status AS run, s.seq, s.step_id, s.status AS step,
                          s.attempt, s.owner, s.lease_until > now() AS lease_live,
                          e.status AS effect, e.owner_token, e.lease_until > now() AS effect_live
                   FROM runs r
                   LEFT JOIN steps s ON s.org_id = r.org_id AND s.run_id = r.run_id
                                    AND s.seq = (SELECT max(m.seq) FROM steps m
                                                 WHERE m.org_id = r.org_id
                                                   AND m.run_id = r.run_id)
                   LEFT JOIN effects e ON e.org_id = s.org_id AND e.run_id = s.run_id
                                      AND e.seq = s.seq
                   WHERE r.org_id = %s AND r.run_id = ANY(%s) ORDER BY r.run_id LIMIT 10""",
                (org, lost),
            ).fetchall()
            report.lost_detail = [dict(r) for r in rows]
        report.charged_runs = conn.execute(
            "SELECT count(DISTINCT run_id) AS n FROM effects WHERE org_id = %s"
            " AND provider = 'payment'",
            (org,),
        ).fetchone()["n"]  # type: ignore[index]
        # erased runs (R14) keep a skeleton of their history, every detail redacted: the checks
        # that read details leave them out (their erasure is checked by _erasure_figures)
        erased = [
            r["run_id"]
            for r in conn.execute(
                "SELECT run_id FROM runs WHERE org_id = %s AND erased_at IS NOT NULL", (org,)
            ).fetchall()
        ]
        report.doubles = double_transitions(conn, org=org, skip=erased)
        if "settled_by_a_stale_attempt" in report.doubles:
            # the shared check counts a park (circuit, budget) followed by its resume's claim;
            # only a settle written after a later attempt's claim is one
            stale = conn.execute(_STALE_SETTLES, {"org": org, "skip": erased}).fetchone()["n"]  # type: ignore[index]
            if stale:
                report.doubles["settled_by_a_stale_attempt"] = stale
            else:
                del report.doubles["settled_by_a_stale_attempt"]
        people = set(DECISION_CHECKS) | set(SIGNAL_CHECKS)
        report.double_transitions = sum(n for k, n in report.doubles.items() if k not in people)
        report.double_decisions = sum(report.doubles.get(k, 0) for k in DECISION_CHECKS)
        report.double_consumed = sum(report.doubles.get(k, 0) for k in SIGNAL_CHECKS)
        _people_figures(conn, org, report, erased)
        _flow_figures(conn, org, report, erased, before_erasure)
        _clock_figures(conn, report)
        report.leases_taken_early = conn.execute(
            "SELECT count(*) AS n FROM history WHERE org_id = %s AND event = 'lease_expired'"
            " AND (detail->>'lease_until')::timestamptz > at",
            (org,),
        ).fetchone()["n"]  # type: ignore[index]
        expected = _expected_work(conn, org, erased)
    return unfinished | stuck, expected


# A step settled (done, failed, parked, cancelled) by an attempt after that attempt was given
# up (lease expired, released) or a later attempt had ended: the fence failed. (A parked step
# resumed and run again is not one: its later rows come after the park.)
_STALE_SETTLES = """
SELECT count(*) AS n FROM history d
WHERE d.org_id = %(org)s AND d.event IN ('step_done', 'step_failed', 'step_parked', 'step_cancelled')
  AND d.run_id <> ALL(%(skip)s::text[])
  AND EXISTS (SELECT 1 FROM history c
              WHERE c.org_id = d.org_id AND c.run_id = d.run_id AND c.seq = d.seq
                AND c.event_id < d.event_id
                AND (c.attempt > d.attempt
                     OR (c.attempt = d.attempt
                         AND c.event IN ('lease_expired', 'step_released'))))
"""


def _expected_work(
    conn: psycopg.Connection[dict[str, Any]], org: str, erased: list[str]
) -> list[tuple[str, str]]:
    """The provider work every completed run's done steps stand for: (provider, key). The
    approval's Slack post is keyed by its approval id; a send skipped for consent did none.
    Not of erased runs: their steps' outputs are redacted."""
    rows = conn.execute(
        """SELECT st.run_id, st.step_id, onward_step_output(st) AS output FROM steps st
           JOIN runs r ON r.org_id = st.org_id AND r.run_id = st.run_id
           WHERE r.org_id = %s AND r.status = 'completed' AND st.status = 'done'
             AND st.step_id = ANY(%s) AND r.run_id <> ALL(%s)""",
        (org, [*scenario.EFFECT_STEPS, "approve"], erased),
    ).fetchall()
    expected: list[tuple[str, str]] = []
    for r in rows:
        output = r["output"] or {}
        if r["step_id"] == "approve":
            if output.get("approval_id"):
                expected.append(("slack", str(output["approval_id"])))
        elif r["step_id"] != "send" or output.get("sent"):
            key = f"{r['run_id']}/{r['step_id']}/1"
            expected.append((scenario.EFFECT_STEPS[r["step_id"]], key))
    return expected


def _cancel_figures(
    url: str,
    org: str,
    cancels: dict[str, tuple[str, float]],
    entries: list[dict[str, Any]],
    report: Report,
) -> None:
    """Every cancel the API answered ended its run cancelled, and no provider work of a
    cancelled run began after its cancel committed: work the ledger shows after the answer
    must belong to an effect attempt claimed before the cancel (the call then in flight)."""
    report.cancels = dict(Counter(outcome for outcome, _ in cancels.values()))
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        uncharged = {
            r["key"]
            for r in conn.execute(
                """SELECT r.run_id || '/draft/1' AS key FROM runs r
                   WHERE r.org_id = %s AND r.status = 'cancelled'
                     AND NOT EXISTS (SELECT 1 FROM budget_charges c
                                     WHERE c.org_id = r.org_id
                                       AND c.effect_key = r.run_id || '/draft/1')""",
                (org,),
            ).fetchall()
        }
        report.model_uncharged_cancelled = len(
            {e.get("idempotency_key") for e in entries if e["provider"] == "model"} & uncharged
        )
        report.cancelled = conn.execute(  # the runner's cancels (erasures cancel too)
            "SELECT count(*) AS n FROM runs WHERE org_id = %s AND status = 'cancelled'"
            " AND erased_at IS NULL",
            (org,),
        ).fetchone()["n"]  # type: ignore[index]
        runs = {
            r["run_id"]: r
            for r in conn.execute(
                "SELECT run_id, status, cancel_requested_at FROM runs"
                " WHERE org_id = %s AND run_id = ANY(%s)",
                (org, list(cancels)),
            ).fetchall()
        }
        effects = {
            e["effect_key"]: e
            for e in conn.execute(
                "SELECT effect_key, run_id, last_attempt_at FROM effects"
                " WHERE org_id = %s AND run_id = ANY(%s)",
                (org, list(cancels)),
            ).fetchall()
        }
    report.cancels_not_honoured = sum(
        1 for run_id in cancels if runs.get(run_id, {}).get("status") != "cancelled"
    )
    for e in entries:
        effect = effects.get(e.get("idempotency_key") or "")
        if effect is None:
            continue
        answered = cancels[effect["run_id"]][1]
        if e["ts"] <= answered:
            continue  # before the answer: the cancel may not have committed yet
        # The answer came after the cancel committed. An attempt claimed after the answer
        # began after the commit; one claimed before it was claimed before the commit (the
        # claim reads the run with a lock the cancel waits for) or was refused.
        if effect["last_attempt_at"].timestamp() <= answered:
            report.calls_in_flight_at_cancel += 1
        else:
            report.calls_after_cancel += 1
            report.cancel_violations.append(
                f"{e['provider']} {effect['effect_key']}: claimed {effect['last_attempt_at']},"
                f" cancel requested {runs[effect['run_id']]['cancel_requested_at']},"
                f" answered {datetime.fromtimestamp(answered).isoformat()}"
            )


def _migration_figures(url: str, org: str, operation_id: str | None, report: Report) -> None:
    """The migration's operation, the runs on each version, and that every run is on one
    version: at most one ``run_migrated`` row, a migrated run on version 2 with its moved step,
    no step on a version other than its run's."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        args = {"org": org, "automation": scenario.AUTOMATION}
        report.runs_by_version = {
            r["version"]: r["n"]
            for r in conn.execute(
                "SELECT version, count(*) AS n FROM runs WHERE org_id = %(org)s"
                " AND automation_id = %(automation)s GROUP BY version",
                args,
            ).fetchall()
        }
        if operation_id is not None:
            op = conn.execute(
                "SELECT status, pass, outcomes, error FROM operations"
                " WHERE org_id = %s AND operation_id = %s",
                (org, operation_id),
            ).fetchone()
            if op is not None:
                report.migration_status = op["status"]
                report.migration_passes = op["pass"]
                report.migration_outcomes = dict(op["outcomes"] or {})
                if op["error"]:
                    report.migration_errors.append(str(op["error"]))
        elif report.migration_drivers:
            report.migration_status = "unfinished"
        moved = conn.execute(_MIGRATED, args).fetchone()
        assert moved is not None
        report.runs_migrated = moved["migrated"]
        report.migrated_twice = moved["twice"]
        report.runs_on_two_versions = conn.execute(_TWO_VERSIONS, args).fetchone()["n"]  # type: ignore[index]


# Runs with a run_migrated row, and with more than one.
_MIGRATED = """
SELECT count(*) AS migrated, count(*) FILTER (WHERE n > 1) AS twice FROM (
    SELECT run_id, count(*) AS n FROM history
    WHERE org_id = %(org)s AND event = 'run_migrated' GROUP BY run_id) m
"""

# Runs not on exactly one version: a step whose own version is not its run's (a move written
# half), or a migrated run not on version 2 or whose moved step is not.
_TWO_VERSIONS = """
WITH m AS (
    SELECT run_id, min(seq) AS seq FROM history
    WHERE org_id = %(org)s AND event = 'run_migrated' GROUP BY run_id
)
SELECT count(*) AS n FROM runs r
LEFT JOIN m ON m.run_id = r.run_id
WHERE r.org_id = %(org)s AND r.automation_id = %(automation)s
  AND (EXISTS (SELECT 1 FROM steps s
               WHERE s.org_id = r.org_id AND s.run_id = r.run_id
                 AND s.version IS NOT NULL AND s.version <> r.version)
       OR (m.run_id IS NOT NULL
           AND (r.version <> 2
                OR NOT EXISTS (SELECT 1 FROM steps s
                               WHERE s.org_id = r.org_id AND s.run_id = r.run_id
                                 AND s.seq = m.seq AND s.version = 2))))
"""


def _erasure_figures(
    url: str, org: str, answers: dict[str, dict[str, Any] | None], report: Report
) -> None:
    """The erased contacts: every erasure done, every run of theirs erased (those unfinished
    when asked ended cancelled), and none of their identifiers left in any text, jsonb or
    text[] column of any table."""
    runs = {r["run_id"]: r for a in answers.values() if a for r in a.get("runs", [])}
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        counts = conn.execute(
            "SELECT count(*) AS erased, count(*) FILTER (WHERE status = 'cancelled') AS cancelled"
            " FROM runs WHERE org_id = %s AND erased_at IS NOT NULL",
            (org,),
        ).fetchone()
        assert counts is not None
        report.erased_runs = counts["erased"]
        report.erased_cancelled = counts["cancelled"]
        report.erased_after_finishing = counts["erased"] - counts["cancelled"]
        report.erasures_pending = conn.execute(_ERASURES_PENDING, {"org": org}).fetchone()["n"]  # type: ignore[index]
        rows = conn.execute(
            "SELECT run_id, status, erased_at IS NOT NULL AS erased FROM runs"
            " WHERE org_id = %s AND run_id = ANY(%s)",
            (org, list(runs)),
        ).fetchall()
        report.erased_runs_not_erased = sum(1 for r in rows if not r["erased"])
        for r in rows:
            if runs[r["run_id"]].get("cancel") in ("cancelled", "cancel_requested") and (
                r["status"] != "cancelled"
            ):
                report.erasure_errors.append(
                    f"{r['run_id']}: cancelled by its erasure, {r['status']}"
                )
        needles = [
            ident
            for contact, answer in answers.items()
            if answer is not None
            for ident in scenario.identifiers(int(contact.rsplit("-", 1)[1]))
        ]
        report.erasure_leaks = columns_holding(conn, needles)


def columns_holding(conn: psycopg.Connection[dict[str, Any]], needles: list[str]) -> dict[str, int]:
    """``{"table.column": rows}`` for every text, varchar, jsonb/json and text[]/varchar[]
    column of every table (from information_schema, not a list) holding one of ``needles`` in
    any case, as a whole word (``contact-1`` is not found in ``contact-12``)."""
    if not needles:
        return {}
    words = "|".join("".join(c if c.isalnum() else "\\" + c for c in n) for n in needles)
    pattern = f"({words})\\M"
    columns = conn.execute(
        """SELECT c.table_name, c.column_name FROM information_schema.columns c
           JOIN information_schema.tables t
             ON t.table_schema = c.table_schema AND t.table_name = c.table_name
           WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'
             AND (c.data_type IN ('text', 'character varying', 'jsonb', 'json')
                  OR (c.data_type = 'ARRAY' AND c.udt_name IN ('_text', '_varchar')))
           ORDER BY 1, 2"""
    ).fetchall()
    found: dict[str, int] = {}
    for col in columns:
        query = pgsql.SQL("SELECT count(*) AS n FROM {t} WHERE {c}::text ~* %s").format(
            t=pgsql.Identifier(col["table_name"]), c=pgsql.Identifier(col["column_name"])
        )
        row = conn.execute(query, (pattern,)).fetchone()
        if row and row["n"]:
            found[f"{col['table_name']}.{col['column_name']}"] = row["n"]
    return found


def _notify_figures(url: str, org: str, hooks: dict[str, Any], report: Report) -> None:
    """Each notification written reached the receiver (once distinct, repeats allowed) with
    a signature that holds, and has ``delivered_at``; the steps parked on the outage."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        notes = conn.execute(
            "SELECT notification_id, delivered_at FROM notifications WHERE org_id = %s", (org,)
        ).fetchall()
        parks = conn.execute(
            """SELECT count(*) FILTER (WHERE event = 'step_parked') AS parked,
                      count(*) FILTER (WHERE event = 'step_resumed') AS resumed
               FROM history WHERE org_id = %(org)s
                 AND ((event = 'step_parked' AND detail ->> 'connection' = %(c)s)
                      OR (event = 'step_resumed' AND detail ->> 'by' = 'reconnect'
                          AND detail ->> 'connection_id' = %(c)s))""",
            {"org": org, "c": scenario.BREAK_CONNECTION},
        ).fetchone()
    assert parks is not None
    report.reconnect_parks, report.reconnect_resumed = parks["parked"], parks["resumed"]
    report.notifications = len(notes)
    report.notifications_undelivered = sum(1 for n in notes if n["delivered_at"] is None)
    written = {webhook_id(n["notification_id"]) for n in notes}
    received = {r["webhook_id"] for r in hooks.get("received", [])}
    report.hook_missing = len(written - received)
    report.hook_unknown = len(received - written)
    report.hook_attempts = int(hooks.get("attempts", 0))
    report.hook_distinct = int(hooks.get("distinct", 0))
    log = hooks.get("log", [])
    report.hook_failed = sum(1 for a in log if a.get("status") == 503)
    report.hook_repeats = sum(1 for a in log if a.get("duplicate"))
    report.hook_bad_signatures = sum(1 for a in log if a.get("signature_ok") is False)


def _people_figures(
    conn: psycopg.Connection[dict[str, Any]], org: str, report: Report, erased: list[str]
) -> None:
    """The decisions and the replies, and whether every step followed what people said (not
    in erased runs: their outputs and inputs are redacted)."""
    requests = conn.execute(
        """SELECT a.approval_id, a.status, (r.input->>'i')::int AS i FROM approvals a
           JOIN runs r ON r.org_id = a.org_id AND r.run_id = a.run_id
           WHERE a.org_id = %s AND r.erased_at IS NULL""",
        (org,),
    ).fetchall()
    report.approval_requests = len(requests)
    report.approved = sum(1 for a in requests if a["status"] == "approved")
    report.rejected = sum(1 for a in requests if a["status"] == "rejected")
    report.decisions = report.approved + report.rejected
    report.races = sum(
        1
        for a in requests
        if a["status"] in ("approved", "rejected") and scenario.decision(a["i"]).race
    )
    steps = conn.execute(
        """SELECT st.output->>'decision' AS took, st.output->>'via' AS via, a.status
           FROM steps st
           LEFT JOIN approvals a ON a.org_id = st.org_id
                                AND a.approval_id = st.output->>'approval_id'
           WHERE st.org_id = %s AND st.step_id = 'approve' AND st.status = 'done'
             AND st.run_id <> ALL(%s)""",
        (org, erased),
    ).fetchall()
    report.decided_by_default = sum(1 for st in steps if st["via"] == "default")
    report.decisions_astray = sum(
        1
        for st in steps
        if (st["status"] != "expired" if st["via"] == "default" else st["status"] != st["took"])
    )
    signals = conn.execute(
        """SELECT signal_id, run_id, seq, status FROM signals WHERE org_id = %s""", (org,)
    ).fetchall()
    report.signals = dict(
        Counter(
            "unrouted" if s["run_id"] is None and s["status"] == "pending" else s["status"]
            for s in signals
        )
    )
    report.replies_consumed = report.signals.get("consumed", 0)
    report.replies_refused = report.signals.get("refused", 0)
    report.replies_late = report.signals.get("late", 0) + report.replies_refused
    consumed = {
        (s["run_id"], s["seq"]): s["signal_id"]
        for s in signals
        if s["status"] == "consumed" and s["run_id"] not in erased
    }
    took = {
        (w["run_id"], w["seq"]): w["took"]
        for w in conn.execute(
            """SELECT run_id, seq, output->>'signal_id' AS took FROM steps
               WHERE org_id = %s AND step_id = 'wait_reply' AND status = 'done'
                 AND run_id <> ALL(%s)""",
            (org, erased),
        ).fetchall()
    }
    report.signals_astray = sum(
        1 for entry in set(consumed) | set(took) if consumed.get(entry) != took.get(entry)
    )
    outcomes: Counter[str] = Counter()
    for r in conn.execute(
        """SELECT step_id, count(*) AS n FROM steps
           WHERE org_id = %s AND status = 'done' AND step_id = ANY(%s) GROUP BY step_id""",
        (org, [*scenario.OUTCOME_STEPS.values(), "not_sent", *scenario.MIGRATION_MAP.values()]),
    ).fetchall():
        outcomes[scenario.outcome_step(r["step_id"])] += r["n"]  # version 2's rename folded
    report.outcomes = dict(outcomes)


# The flow-control events of the history, by kind (of one run, or of every run but some).
_FLOW_EVENTS = """
SELECT CASE WHEN event = 'circuit_opened' THEN event || ':' || (detail->>'was')
            WHEN event = 'step_parked' THEN event || ':' || (detail->>'type')
            WHEN event = 'step_resumed' THEN event || ':' || (detail->>'by')
            ELSE event END AS what, count(*) AS n
FROM history
WHERE org_id = %(org)s AND event IN ('circuit_opened', 'circuit_half_open', 'circuit_closed',
                                     'step_parked', 'step_resumed')
  AND (%(run)s::text IS NULL OR run_id = %(run)s) AND run_id <> ALL(%(skip)s::text[])
GROUP BY 1
"""


def _flow_figures(
    conn: psycopg.Connection[dict[str, Any]],
    org: str,
    report: Report,
    erased: list[str],
    before_erasure: Counter[str],
) -> None:
    """Circuits opened, probed and closed, steps parked on them and on the budget and
    resumed, and the budget's charges: one per completed draft. An erased run's events are
    counted as they were read just before its erasure (``before_erasure``): its history's
    details are redacted since."""
    events = Counter(before_erasure)
    for r in conn.execute(_FLOW_EVENTS, {"org": org, "run": None, "skip": erased}).fetchall():
        events[r["what"]] += r["n"]
    report.circuits_opened = events.get("circuit_opened:closed", 0)
    report.circuits_reopened = events.get("circuit_opened:half_open", 0)
    report.circuit_probes = events.get("circuit_half_open", 0)
    report.circuit_resumed = events.get("circuit_closed", 0)
    report.circuit_parks = events.get("step_parked:CircuitOpen", 0)
    report.budget_parks = events.get("step_parked:BudgetExhausted", 0)
    report.budget_resumed = events.get("step_resumed:budget", 0)
    report.circuits_not_closed = {
        r["key"]: r["state"]
        for r in conn.execute(
            "SELECT key, state FROM circuits WHERE org_id = %s AND state <> 'closed'", (org,)
        ).fetchall()
    }
    # every opening from closed ends in one close, but for the circuits not closed yet
    report.circuits_closed = report.circuits_opened - len(report.circuits_not_closed)
    budget = conn.execute(
        """SELECT b.per_day,
                  (SELECT coalesce(sum(amount), 0) FROM budget_charges c
                   WHERE c.org_id = b.org_id AND c.scope = b.scope AND c.unit = b.unit)
                      AS charged,
                  (SELECT count(*) FROM budget_charges c
                   WHERE c.org_id = b.org_id AND c.scope = b.scope AND c.unit = b.unit)
                      AS charges,
                  (SELECT count(*) FROM budget_reservations r
                   WHERE r.org_id = b.org_id AND r.scope = b.scope AND r.unit = b.unit
                     AND (r.lease_until > now() OR NOT EXISTS (
                         SELECT 1 FROM runs x
                         WHERE x.org_id = r.org_id AND x.status = 'cancelled'
                           AND x.run_id = split_part(r.effect_key, '/', 1)))) AS left,
                  (SELECT count(*) FROM budget_reservations r
                   WHERE r.org_id = b.org_id AND r.scope = b.scope AND r.unit = b.unit)
                      AS rows
           FROM budgets b WHERE b.org_id = %s AND b.scope = %s AND b.unit = %s""",
        (org, scenario.AUTOMATION, scenario.BUDGET_UNIT),
    ).fetchone()
    if budget is not None:
        report.budget_per_day = float(budget["per_day"])
        report.budget_charged = float(budget["charged"])
        report.budget_charges = int(budget["charges"])
        report.budget_reservations_left = int(budget["left"])
        report.budget_reservations_cancelled = int(budget["rows"]) - int(budget["left"])
    report.budget_missing_charges = conn.execute(
        """SELECT count(*) AS n FROM steps st
           JOIN runs r ON r.org_id = st.org_id AND r.run_id = st.run_id
           WHERE r.org_id = %s AND r.status = 'completed' AND st.step_id = 'draft'
             AND st.status = 'done'
             AND NOT EXISTS (SELECT 1 FROM budget_charges c
                             WHERE c.org_id = st.org_id AND c.effect_key = st.run_id || '/draft/1'
                               AND c.scope = %s AND c.unit = %s)""",
        (org, scenario.AUTOMATION, scenario.BUDGET_UNIT),
    ).fetchone()["n"]  # type: ignore[index]


def _clock_figures(conn: psycopg.Connection[dict[str, Any]], report: Report) -> None:
    """The clock's firings: one run per instant, no instant skipped between the first and the
    last, and how many were repeated (a sweeper killed after the start, before the advance)."""
    instants = sorted(
        datetime.fromisoformat(r["instant"])
        for r in conn.execute(
            "SELECT input->'schedule'->>'instant' AS instant FROM runs WHERE org_id = %s",
            (scenario.CLOCK_ORG,),
        ).fetchall()
    )
    report.scheduled_firings = len(instants)
    step = timedelta(seconds=scenario.CLOCK_EVERY_S)
    report.scheduled_gaps = sum(
        round((later - earlier) / step) - 1 for earlier, later in itertools.pairwise(instants)
    )
    report.scheduled_repeats = conn.execute(
        "SELECT count(*) AS n FROM history WHERE org_id = %s AND event = 'start_duplicate'",
        (scenario.CLOCK_ORG,),
    ).fetchone()["n"]  # type: ignore[index]


def _ledger_figures(
    entries: list[dict[str, Any]], report: Report, expected: list[tuple[str, str]]
) -> None:
    per_provider = Counter(e["provider"] for e in entries)
    report.ledger = dict(per_provider)
    providers = ("email", "crm", "model", "payment", "slack")
    calls: dict[str, Counter[str]] = {p: Counter() for p in providers}
    crm_creates: Counter[str] = Counter()
    for e in entries:
        key = e.get("idempotency_key") or ""
        if e["provider"] in calls:
            calls[e["provider"]][key] += 1
        if e["provider"] == "crm" and e["op"] == "contact.create":
            crm_creates[key] += 1

    def extra(c: Counter[str]) -> int:
        return sum(n - 1 for n in c.values() if n > 1)

    report.duplicates = {"email": extra(calls["email"]), "crm": extra(crm_creates)}
    report.payment_duplicates = extra(calls["payment"])
    report.model_repeats = extra(calls["model"])
    report.crm_repeat_upserts = extra(calls["crm"])
    report.slack_posts = per_provider.get("slack", 0)
    report.slack_reposts = extra(calls["slack"])
    report.missing_effects = sum(1 for provider, key in expected if calls[provider][key] == 0)


# -- the people ----------------------------------------------------------------------------------

# Runs whose row is behind its steps (onward_run_now would change it) while no step of theirs
# runs: every transition that takes a step out of 'running' must have caught the row up.
_ROWS_BEHIND = """
SELECT count(*) AS n
FROM runs r CROSS JOIN LATERAL onward_run_now(r) AS now
WHERE r.org_id = %s
  AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.org_id = r.org_id AND s.run_id = r.run_id
                  AND s.status = 'running')
  AND (now.ctx, now.visits, now.steps_executed, now.current_seq)
      IS DISTINCT FROM (r.ctx, r.visits, r.steps_executed, r.current_seq)
"""

# Steps written before the step they follow ended: a successor is inserted by the statement
# that ends its predecessor (leases.sql settle_advance), so its created_at is that step's
# finished_at (one now()); a fork's copied steps keep their own instants, its new step is later.
_ENTERED_EARLY = """
SELECT count(*) AS n
FROM steps s
JOIN steps p ON p.org_id = s.org_id AND p.run_id = s.run_id AND p.seq = s.seq - 1
WHERE s.org_id = %s AND (p.finished_at IS NULL OR p.finished_at > s.created_at)
"""

# Pending requests whose Slack message is posted (the ts is recorded right after the post). Not
# an erased run's: its input no longer says which event it was, and its cancel is on the way
# (an erasure that met its approval step in flight cancels it at the step's settle).
_PENDING_APPROVALS = """
SELECT a.approval_id, a.message_ts, (r.input->>'i')::int AS i
FROM approvals a JOIN runs r ON r.org_id = a.org_id AND r.run_id = a.run_id
WHERE a.org_id = %s AND a.status = 'pending' AND a.message_ts IS NOT NULL
  AND r.erased_at IS NULL
ORDER BY a.created_at
"""

# Unfinished runs whose email went out (its effect settled: the message id is known), and
# where their wait for the reply is.
_SENT_EMAILS = """
SELECT r.run_id, (r.input->>'i')::int AS i, e.result->>'id' AS message_id,
       w.status AS wait_status
FROM effects e
JOIN runs r ON r.org_id = e.org_id AND r.run_id = e.run_id
LEFT JOIN steps w ON w.org_id = r.org_id AND w.run_id = r.run_id AND w.step_id = 'wait_reply'
WHERE e.org_id = %s AND e.provider = 'email' AND e.status = 'settled'
  AND r.finished_at IS NULL AND r.erased_at IS NULL
ORDER BY e.settled_at
"""

# Runs whose email is about to be sent: approved, not sent yet (Maya's early replies watch
# the provider for it).
_ABOUT_TO_SEND = """
SELECT r.run_id, (r.input->>'i')::int AS i
FROM approvals a JOIN runs r ON r.org_id = a.org_id AND r.run_id = a.run_id
WHERE a.org_id = %s AND a.status = 'approved' AND r.finished_at IS NULL
  AND r.erased_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM steps s
                  WHERE s.org_id = a.org_id AND s.run_id = a.run_id AND s.step_id = 'send'
                    AND s.status = 'done')
"""

_NOT_YET_WOKEN = (None, "ready", "running", "waiting")


@dataclass
class _Answer:
    answered: bool  # the engine answered (not lost, not a 5xx)
    yes: bool = False  # this click decided / this delivery was stored


class _People:
    """Sam, Alex and Maya, acting through the sandbox while the runs flow (a thread, with a few
    more for the HTTP calls, each of which can wait seconds for a killed API).

    Every ``poll_s`` it reads the unfinished runs whose email went out and the pending
    approval requests whose message is posted, oldest first, and hands each one it has not
    finished with to a free thread: a reply (``scenario.reply``) once the step waits, or a
    click (``scenario.decision``). An early reply watches the provider's ledger from the
    approval on and answers the moment the message exists -- sometimes before the engine has
    recorded its id as the correlation key (the signal is kept unrouted, then adopted) or
    before the step waits (kept pending, then consumed by the settle that makes it wait).
    Replies, early replies and clicks have threads of their own, and nothing waits for a
    thread: what finds none is picked up by a later poll, so a reply never queues behind a
    burst of clicks past its 4 s deadline. A click or a delivery that got no answer is tried
    again ``retry_s`` later, as long as the request is still pending or the step still
    waits."""

    THREADS = {"reply": 6, "early": 3, "click": 6}

    def __init__(self, url: str, org: str, sandbox_url: str, *, poll_s: float = 0.2) -> None:
        self.url, self.org, self.sandbox_url, self.poll_s = url, org, sandbox_url, poll_s
        self.retry_s = 0.5
        self.counts: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()  # what the inbound-email intake answered
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._finished: set[str] = set()
        self._tried: set[str] = set()
        self._tried_once: set[str] = set()  # replies counted once, however often delivered
        self._retry_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._local = threading.local()
        self._admins: list[SandboxAdmin] = []
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._inflight: Counter[str] = Counter()  # per kind of thread
        self._pools = {
            kind: ThreadPoolExecutor(max_workers=n, thread_name_prefix=f"chaos-people-{kind}")
            for kind, n in {**self.THREADS, "alex": self.THREADS["click"]}.items()
        }
        self._thread = threading.Thread(target=self._loop, name="chaos-people", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        for admin in self._admins:
            admin.close()
        if self._conn is not None:
            self._conn.close()

    def fill(self, report: Report) -> None:
        with self._lock:
            c = Counter(self.counts)
            report.reply_answers = dict(self.answers)
            report.people_errors = list(self.errors)
            undelivered = {k for k in self._tried - self._finished if k.startswith("r:")}
        report.clicks = c["clicks"]
        report.clicks_decided = c["clicks_decided"]
        report.clicks_read_back = c["clicks_read_back"]
        report.clicks_lost = c["clicks_lost"]
        report.clicks_refused_otherwise = c["clicks_refused_otherwise"]
        report.replays = c["replays"]
        report.replays_decided = c["replays_decided"]
        report.race_answers_both_yes = c["race_both_yes"]
        report.replies_sent = {
            k: c[f"sent_{k}"] for k in ("reply", "unsubscribe", "early") if c[f"sent_{k}"]
        }
        report.silent_runs = c["silent"]
        report.deliveries_lost = c["deliveries_lost"]
        report.deliveries_refused_otherwise = c["deliveries_refused_otherwise"]
        report.replies_undelivered = len(undelivered)

    def progress(self) -> str:
        with self._lock:
            return (
                f"clicks {self.counts['clicks']} ({self.counts['clicks_lost']} lost), replies "
                f"{self.counts['replies']} ({self.counts['deliveries_lost']} deliveries lost)"
            )

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._poll()
            except psycopg.Error:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None

    def _poll(self) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
        conn = self._conn
        for row in conn.execute(_ABOUT_TO_SEND, (self.org,)).fetchall():
            if scenario.reply(row["i"]).early:
                self._submit("early", f"r:{row['run_id']}", self._reply_early, row)
        for row in conn.execute(_SENT_EMAILS, (self.org,)).fetchall():
            plan = scenario.reply(row["i"])
            key = f"r:{row['run_id']}"
            if plan.kind is None or not row["message_id"]:
                if plan.kind is None:
                    self._mark_silent(key)
                continue
            waits = row["wait_status"] == "waiting" or (
                plan.early and row["wait_status"] in _NOT_YET_WOKEN
            )
            if waits:
                self._submit("reply", key, self._reply, row)
        for row in conn.execute(_PENDING_APPROVALS, (self.org,)).fetchall():
            self._submit("click", f"a:{row['approval_id']}", self._decide, row)

    def seen(self) -> tuple[int, int]:
        """Clicks sent and replies posted so far: an API armed for a decision's or a signal's
        kill reaches its point only if one came while it served."""
        with self._lock:
            return self.counts["clicks"], self.counts["reply_posts"]

    def busy(self, run_id: str) -> bool:
        """Someone is acting on the run right now (a reply, an early reply under way)."""
        with self._lock:
            return f"r:{run_id}" in self._busy

    def _mark_silent(self, key: str) -> None:
        with self._lock:
            if key not in self._finished:
                self._finished.add(key)
                self.counts["silent"] += 1

    def _submit(
        self, kind: str, key: str, act: Callable[[dict[str, Any]], bool], row: dict[str, Any]
    ) -> None:
        with self._lock:
            if key in self._busy or key in self._finished:
                return
            if self._retry_at.get(key, 0.0) > time.monotonic():
                return
            if self._inflight[kind] >= self.THREADS[kind]:
                return  # no free thread: a later poll picks it up, with fresher rows
            self._busy.add(key)
            self._inflight[kind] += 1
            self._tried.add(key)
        self._pools[kind].submit(self._guarded, kind, key, act, row)

    def _guarded(
        self, kind: str, key: str, act: Callable[[dict[str, Any]], bool], row: dict[str, Any]
    ) -> None:
        done = False
        try:
            done = act(row)
        except Exception as exc:  # an admin call the sandbox refused: ours, not the engine's
            with self._lock:
                self.errors.append(f"{key}: {type(exc).__name__}: {exc}"[:300])
        finally:
            with self._lock:
                self._busy.discard(key)
                self._inflight[kind] -= 1
                if done:
                    self._finished.add(key)
                else:
                    self._retry_at[key] = time.monotonic() + self.retry_s

    def _admin(self) -> SandboxAdmin:
        admin: SandboxAdmin | None = getattr(self._local, "admin", None)
        if admin is None:
            admin = SandboxAdmin(self.sandbox_url, timeout=30.0)
            self._local.admin = admin
            with self._lock:
                self._admins.append(admin)
        return admin

    # -- Sam and Alex --------------------------------------------------------------------------
    def _click(self, ts: str, action: str, user: str, **knobs: Any) -> _Answer:
        try:
            got = self._admin().click(ts, action, user, **knobs)
        except httpx.TransportError:  # the sandbox did not answer us in time: as good as lost
            got = {"status": None}
        status, body = got.get("status"), got.get("body")
        with self._lock:
            self.counts["clicks"] += 1
            if status is None or status >= 500:
                self.counts["clicks_lost"] += 1
                return _Answer(answered=False)
            if status == 200 and isinstance(body, dict):
                yes = bool(body.get("ok"))
                self.counts["clicks_decided" if yes else "clicks_read_back"] += 1
                return _Answer(answered=True, yes=yes)
            self.counts["clicks_refused_otherwise"] += 1
            self.errors.append(f"click {ts} {action} by {user}: {status} {body}"[:300])
            return _Answer(answered=True)

    def _decide(self, row: dict[str, Any]) -> bool:
        """Click in the request's message; True once the engine answered a click."""
        plan = scenario.decision(row["i"])
        ts = row["message_ts"]
        if plan.race:  # both at the same moment: exactly one decision may stand
            alex = self._pools["alex"].submit(self._click, ts, plan.other, scenario.ALEX)
            answers = [self._click(ts, plan.action, scenario.SAM), alex.result()]
            if sum(a.yes for a in answers) > 1:
                with self._lock:
                    self.counts["race_both_yes"] += 1
        else:
            answers = [self._click(ts, plan.action, scenario.SAM)]
        if not any(a.answered for a in answers):
            return False  # the request is clicked again while it is pending
        if plan.replay:  # Slack retries the click, then the last click is resent as it was
            for knobs in ({"retry_num": 1}, {"replay": True}):
                again = self._click(ts, plan.action, scenario.SAM, **knobs)
                with self._lock:
                    self.counts["replays"] += 1
                    self.counts["replays_decided"] += int(again.yes)
        return True

    # -- Maya ----------------------------------------------------------------------------------
    def _reply_early(self, row: dict[str, Any]) -> bool:
        """Answer the email the moment the provider has it (its ledger entry, by the send
        step's idempotency key), racing the engine's own record of it."""
        key = f"{row['run_id']}/send/1"
        sent: list[dict[str, Any]] = []
        until = time.monotonic() + 3.0
        while time.monotonic() < until and not self._stop.is_set():
            with contextlib.suppress(httpx.TransportError):
                sent = self._admin().ledger("email", idempotency_key=key)
            if sent:
                return self._reply({**row, "message_id": sent[0]["response_id"]})
            time.sleep(0.04)
        return False  # not sent yet: tried again while the step runs, or once it is sent

    def _reply(self, row: dict[str, Any]) -> bool:
        """Answer the run's email (delivered twice by the provider); True once the engine
        answered a delivery."""
        plan = scenario.reply(row["i"])
        assert plan.kind is not None
        try:
            got = self._admin().reply(
                row["message_id"],
                plan.text,
                event_id=f"chaos-{plan.kind}-{row['run_id']}",
                deliveries=2,
                kind=plan.kind,
            )
        except httpx.TransportError:  # the sandbox did not answer us in time: as good as lost
            got = {"deliveries": [{"status": None}]}
        answered = False
        with self._lock:
            self.counts["reply_posts"] += 1
            if f"r:{row['run_id']}" not in self._tried_once:
                self._tried_once.add(f"r:{row['run_id']}")
                self.counts["replies"] += 1
                self.counts[f"sent_{plan.kind}"] += 1
                self.counts["sent_early"] += int(plan.early)
            for delivery in got.get("deliveries") or []:
                status, body = delivery.get("status"), delivery.get("body")
                if status is None or status >= 500:
                    self.counts["deliveries_lost"] += 1
                    continue
                answered = True
                if status in (200, 202) and isinstance(body, dict):
                    shown = "duplicate" if body.get("duplicate") else str(body.get("status"))
                    self.answers[shown] += 1
                elif status == 409:
                    self.answers["refused"] += 1
                else:
                    self.counts["deliveries_refused_otherwise"] += 1
                    self.errors.append(f"reply {row['run_id']}: {status} {body}"[:300])
        return answered


# -- the runner ----------------------------------------------------------------------------------


class _Chaos:
    def __init__(
        self,
        settings: Settings,
        url: str,
        admin_url: str,
        sandbox: SandboxServer,
        report: Report,
        *,
        runs: int,
        kills_per_point: int,
        workers: int,
        out: Out,
        rng: random.Random,
        log_dir: Path,
        time_limit: float,
        db_faults: bool,
        skew_clock: bool,
        duplicate_wakes: bool,
        knobs: dict[str, dict[str, Any]],
        api_port: int,
        api_key: str,
    ) -> None:
        self.settings, self.url, self.admin_url = settings, url, admin_url
        self.api_port = api_port
        self.api_auth = {"Authorization": f"Bearer {api_key}"}  # an admin key of the org
        self._http = threading.local()  # each thread's keep-alive client of the API
        self._http_clients: list[httpx.Client] = []
        self.people = _People(url, settings.org_id, sandbox.url)
        self.sandbox, self.report, self.out, self.rng = sandbox, report, out, rng
        self.runs, self.kills_per_point, self.workers = runs, kills_per_point, workers
        self.log_dir, self.time_limit, self.knobs = log_dir, time_limit, knobs
        self.db_faults, self.duplicate_wakes = db_faults, duplicate_wakes
        self.skew_lib = libfaketime() if skew_clock else None
        report.clock_skew = CLOCK_SKEW if self.skew_lib else None
        self.app_prefix = f"onward-chaos-{secrets.token_hex(3)}-"
        self.procs: dict[tuple[str, int], Proc] = {}  # the slots' current processes
        self.warm = False  # spares are kept once the first processes are up
        self.spares: dict[str, Proc] = {}  # one warm standby per role
        self.retired: list[Proc] = []
        self.generation = 0
        self.t0 = time.monotonic()
        self.queues: dict[str, list[Spec]] = {
            "worker": [],
            "leader": [],
            "starter": [],
            "api": [],
            "migrator": [],
        }
        self.specs_total = 0
        self.specs_done = 0
        self.worker_points: set[str] = set()
        self.tail_reserve = 0
        self.sent = 0  # events handed to the starter
        self.batch: tuple[int, int] | None = None  # outstanding (first, last)
        self.min_inflight = max(4, 2 * (workers + 1))
        # at most this many runs unfinished at once: the people (and the API they go through)
        # answer within the deadlines of a busy day, not of a thousand runs at once
        self.max_inflight = max(40, 12 * (workers + 1))
        self.per_spec = 1.5  # runs held back per kill still to come
        self.finished = 0
        self.started_db = 0
        self.external_plan: list[float] = []
        self.pause_plan: list[float] = []
        self.killer: BackendKiller | None = None
        self.monitor: psycopg.Connection[dict[str, Any]] | None = None
        self._last_progress = 0.0
        # flow control: bursts of 503s at the burst provider, the budget the runner raises
        self.burst_plan: list[float] = []
        self.last_burst = -BURST_EVERY_S
        self.parked_on_budget = 0
        self.cancels: dict[str, tuple[str, float]] = {}  # run_id -> (outcome, answered at)
        self.budget = float(scenario.budget_start())
        self.last_raise = 0.0
        # the migration (R11): planned -> driving -> done
        self.migration = "planned"
        self.migrator: Proc | None = None
        self.operation_id: str | None = None
        # the erasures (R14): contact -> the answer (None: asked, no answer yet)
        self.erasing: dict[str, dict[str, Any] | None] = {}
        self.before_erasure: Counter[str] = Counter()  # flow events of runs about to be erased
        self.erase_contacts = {
            scenario.payload(i)["contact"]: i for i in range(runs) if scenario.erase_plan(i)
        }
        # the outages (R15): one per notify kill; the state of the current one
        self.notify_specs: list[Spec] = []
        self.outage: dict[str, Any] | None = None
        self.outages_done = 0
        self.parked_after_restore: set[str] = set()  # run ids

    # -- the schedule ---------------------------------------------------------------------------
    def plan(self) -> None:
        points = [p for p in POINTS if p not in UNREACHABLE]
        unreachable = dict(UNREACHABLE)
        if self.settings.queue in ("none", "postgres") and "timer.after_fire" in points:
            unreachable["timer.after_fire"] = (
                "queue none: no timer wakes (the sweep fires them)"
                if self.settings.queue == "none"
                else "queue postgres: the relay fires each timer at its wake's instant, in its "
                "own transaction (relay.after_publish)"
            )
            points.remove("timer.after_fire")
        self.report.unreachable = unreachable
        self.worker_points = {p for p in points if self._role(p) == "worker"}
        rounds: list[list[Spec]] = []
        for r in range(self.kills_per_point):
            # the first kill of every point at its first hit (@1); later ones at a random
            # @n; a graceful shutdown happens once per process, so always @1
            one = [
                Spec(
                    p,
                    1 if r == 0 or p in (SHUTDOWN_POINT, *RARE_POINTS) else self.rng.randint(2, 4),
                    "scheduled",
                )
                for p in points
            ]
            self.rng.shuffle(one)
            one.sort(key=lambda spec: spec.point not in EARLY_POINTS)  # stable: early first
            rounds.append(one)
        for p in points:
            self.report.expected_kills[p] = self.kills_per_point
        random_points = [
            p for p in points if p not in (*STARTER_POINTS, SHUTDOWN_POINT, *RARE_POINTS)
        ]
        extra = max(2, len(points) * self.kills_per_point // 4)
        randoms = [
            Spec(self.rng.choice(random_points), self.rng.randint(2, 8), "random")
            for _ in range(extra)
        ]
        for spec in [s for r in rounds for s in r]:
            if spec.point == NOTIFY_POINT:
                self.notify_specs.append(spec)  # armed in every relay process, per outage
            else:
                self.queues[self._role(spec.point)].append(spec)
        for spec in randoms:  # after the planned ones: if runs run short, they are what is lost
            self.queues[self._role(spec.point)].append(spec)
        self.specs_total = sum(len(q) for q in self.queues.values()) + len(self.notify_specs)
        self.tail_reserve = min(self.runs // 3, 2 * (self.workers + 1))
        self.per_spec = max(0.5, min(1.5, (self.runs - self.min_inflight) / self.specs_total))
        n_external = max(2, 2 * self.kills_per_point)
        self.external_plan = sorted(self.rng.uniform(0.05, 0.95) for _ in range(n_external))
        n_pauses = max(1, self.kills_per_point)
        self.pause_plan = sorted(self.rng.uniform(0.1, 0.9) for _ in range(n_pauses))
        n_bursts = max(3, 2 * self.kills_per_point)  # circuits open even with nobody armed
        self.burst_plan = sorted(self.rng.uniform(0.05, 0.9) for _ in range(n_bursts))

    @staticmethod
    def _role(point: str) -> str:
        if point in STARTER_POINTS:
            return "starter"
        if point in LEADER_POINTS:
            return "leader"
        if point in API_POINTS:
            return "api"
        if point in MIGRATOR_POINTS:
            return "migrator"
        if point == NOTIFY_POINT:
            return "relay"
        return "worker"

    def _armed_specs(self, exclude: Proc | None = None) -> list[Spec]:
        seen: dict[int, Spec] = {}
        for p in self.procs.values():
            if p is not exclude and p.alive():
                for spec in p.specs:
                    if not spec.done:
                        seen[id(spec)] = spec
        return list(seen.values())

    def specs_left(self) -> int:
        queued = {id(x): x for q in self.queues.values() for x in q if not x.done}
        queued.update((id(x), x) for x in self._armed_specs())
        queued.update((id(x), x) for x in self.notify_specs if not x.done)
        if self.migrator is not None and self.migrator.alive():
            queued.update((id(x), x) for x in self.migrator.specs if not x.done)
        return len(queued)

    def _armed(self, proc: Proc) -> bool:
        return any(not spec.done for spec in proc.specs)

    # -- processes ------------------------------------------------------------------------------
    def _standby(self, role: str) -> Proc:
        """Start a process that imports everything and waits for its ``go`` line."""
        self.generation += 1
        name = f"spare{self.generation}-{role}"
        argv = worker_argv(
            self.settings,
            name,
            role="starter" if role == "starter" else "worker",
            sweeper=role == "leader",
            twice=role != "starter" and self.duplicate_wakes,
            app_prefix=self.app_prefix,
            standby=True,
        )
        # the reservations of a process killed between reserve and charge lapse soon
        argv[argv.index("--config") + 1] = settings_to_json(
            self.settings, budget_lease_seconds=scenario.BUDGET_LEASE_S
        )
        skew = role == "leader" and self.skew_lib is not None
        proc = Proc.start(
            argv,
            name=name,
            log_path=self.log_dir / f"p{self.generation:04d}-{role}.log",
            env=process_env(clock_offset=CLOCK_SKEW if skew else None),
            stdin=True,
            role=role,
            spawned_at=time.monotonic(),
        )
        self.report.processes += 1
        return proc

    def _api_standby(self) -> Proc:
        """A warm spare of the engine API (``onward.chaos.api_standby``): everything imported,
        the port not bound until its ``go`` line."""
        self.generation += 1
        name = f"spare{self.generation}-api"
        env = self._cli_env(name, [], application_name=self.app_prefix + name)
        argv = [sys.executable, "-m", "onward.chaos.api_standby", "--host", "127.0.0.1"]
        proc = Proc.start(
            [*argv, "--port", str(self.api_port)],
            name=name,
            log_path=self.log_dir / f"p{self.generation:04d}-api.log",
            env=env,
            stdin=True,
            role="api",
            spawned_at=time.monotonic(),
        )
        self.report.processes += 1
        return proc

    def _spawn_api(self) -> Proc:
        """The engine API on the run's port (a warm spare told to go, or a new one), armed
        with the next kill of its queue it can reach. No second process serves at once: one
        holds the port, and the sandbox's Slack app and inbound webhook point at it; a spare
        waits for the next restart behind it."""
        queue = self.queues["api"]
        ready = self._api_spec_ready()
        specs = [queue.pop(ready)] if ready is not None else []
        for spec in specs:
            spec.tries += 1
        proc = self.spares.pop("api", None)
        if proc is None or not proc.alive():
            if proc is not None:
                self.retired.append(proc)
            proc = self._api_standby()
        if self.warm:
            self.spares["api"] = self._api_standby()
        self.generation += 1
        proc.name = f"api0-{self.generation}"
        proc.slot, proc.specs, proc.spawned_at = 0, specs, time.monotonic()
        proc.people_at = self.people.seen()
        proc.tell(f"go {proc.name} {','.join(x.arm for x in specs) or '-'}\n")
        self.procs[("api", 0)] = proc
        return proc

    def _cli_env(self, name: str, specs: list[Spec], *, application_name: str) -> dict[str, str]:
        """The environment of an ``onward`` command of this run (the API, a migration's
        driver), armed through ``ONWARD_CRASH_AT`` with ``specs``."""
        return process_env(
            crash_at=",".join(x.arm for x in specs) or None,
            extra={
                "ONWARD_DATABASE_URL": with_query(self.url, application_name=application_name),
                "ONWARD_QUEUE": self.settings.queue,
                "ONWARD_QUEUE_PREFIX": self.settings.queue_prefix,
                "ONWARD_REDIS_URL": self.settings.redis_url,
                "ONWARD_ORG": self.settings.org_id,
                "ONWARD_LOG_LEVEL": "warning",
                "ONWARD_SHUTDOWN_GRACE_SECONDS": "1",
            },
        )

    def _api_spec_ready(self) -> int | None:
        """The position in the API's queue of the next kill it can reach now: an erasure's
        only once a contact can be erased (else it would wait armed for nothing)."""
        for k, spec in enumerate(self.queues["api"]):
            if spec.point not in ERASURE_POINTS or self._erasable(spec.point):
                return k
        return None

    def _api_answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.api_port), timeout=0.2):
                return True
        except OSError:
            return False

    def spawn(self, role: str, slot: int) -> Proc:
        """Put a process to work in a slot: the warm spare if there is one, armed with the
        next kill of the schedule; a new spare is started behind it (once the first processes
        are up: two CPUs importing ten interpreters at once help nobody)."""
        if role == "api":
            return self._spawn_api()
        proc = self.spares.pop(role, None)
        if proc is None or not proc.alive():
            if proc is not None:
                self.retired.append(proc)
            proc = self._standby(role)
        if self.warm:
            self.spares[role] = self._standby(role)
        self.generation += 1
        proc.slot = slot
        proc.name = f"{role}{slot}-{self.generation}"
        queue = self.queues[role]
        proc.specs = [queue.pop(0)] if queue else []
        if not proc.specs and role == "worker":
            # the tail: the last planned kills are armed in every worker slot at once (the
            # first process to reach one dies there), so the last runs cannot slip past them
            proc.specs = [
                x
                for x in self._armed_specs()
                if x.origin == "scheduled"
                and x.point != SHUTDOWN_POINT
                and x.point in self.worker_points
            ]
        elif role == "worker":
            # a circuit's kills in a worker come to whichever worker makes the failing call or
            # runs the probe: armed in every worker slot at once (as in the tail)
            proc.specs += [
                x
                for x in self._armed_specs()
                if x.origin == "scheduled"
                and x.point in SHARED_POINTS
                and not any(x is y for y in proc.specs)
            ]
        if role == "worker" and proc.specs and proc.specs[0].tries > 0:
            self._share_retry(proc.specs[0], proc)
        for spec in proc.specs:
            spec.tries += 1
        proc.spawned_at = time.monotonic()
        arms = [x.arm for x in proc.specs]
        if role in ("worker", "leader") and self._notify_live():
            arms.append(f"{NOTIFY_POINT}@1")  # every relay process, while an outage lasts
        arm = ",".join(arms) or "-"
        proc.tell(f"go {proc.name} {arm}\n")
        self.procs[(role, slot)] = proc
        return proc

    def _share_retry(self, spec: Spec, proc: Proc) -> None:
        """A worker's kill armed again after a window in which its point never came: armed in
        every running worker too (stdin ``arm``), for a point that one kind of step reaches
        (``approval.after_request``) comes to whichever worker takes that step."""
        for other in self.procs.values():
            if (
                other is not proc
                and other.role == "worker"
                and other.alive()
                and other.term_at is None
                and not any(spec is x for x in other.specs)
            ):
                other.specs.append(spec)
                other.tell(f"arm {spec.arm}\n")

    def _provoke_errors(self) -> None:
        """A handler must fail for ``worker.before_settle_error``: the next two calls to each
        provider get a 429 (rate limited: the handler fails, and no circuit counts it -- the
        bursts of 503s are what open circuits). Only two: while a circuit is half-open its
        probe is the only call, and it would take every 429 in turn."""
        with contextlib.suppress(Exception):
            for provider in ("model", "crm", "email"):
                knobs = dict(self.knobs.get(provider, {}))
                self.sandbox.admin.faults(provider, **knobs, script=["429"] * 2)

    def _armed_at_circuit(self) -> bool:
        return any(
            x.point in CIRCUIT_POINTS and not x.done
            for p in self.procs.values()
            if p.alive() and p.term_at is None
            for x in p.specs
        )

    def _burst(self, now: float) -> None:
        """The burst provider answers the next ``scenario.BURST`` requests with a 503: its
        circuit opens, a probe fails, the next one closes it. Only while its circuit is closed
        and the last burst is used up, so that it closes between bursts."""
        provider = scenario.BURST_PROVIDER
        try:
            if self.monitor is None or self.monitor.closed:
                self.monitor = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
            row = self.monitor.execute(
                "SELECT state FROM circuits WHERE org_id = %s AND key = %s",
                (self.settings.org_id, f"connection:{scenario.BURST_CONNECTION}"),
            ).fetchone()
            if row is not None and row["state"] != "closed":
                return
            state = self.sandbox.admin.fault_state()["providers"][provider]
            if state.get("script_remaining"):
                return
            self.sandbox.admin.faults(
                provider, **scenario.burst_knobs(self.knobs.get(provider, {}))
            )
        except Exception:  # the sandbox is ours: try again on the next step
            return
        self.last_burst = now
        self.report.bursts += 1

    def _flow_control(self, now: float) -> None:
        """Bursts of 503s (planned, and while a process is armed at a circuit's crash point),
        and a raise of the budget while drafts are parked on it."""
        if self.burst_plan and self.progress() >= self.burst_plan[0]:
            self.burst_plan.pop(0)
            self._burst(now)
        elif now - self.last_burst >= BURST_EVERY_S and self._armed_at_circuit():
            self._burst(now)
        if self.parked_on_budget and now - self.last_raise >= BUDGET_RAISE_EVERY_S:
            self.last_raise = now
            per_day = self.budget + scenario.budget_raise()
            try:
                asyncio.run(_set_budget(self.url, self.settings.org_id, per_day))
            except (psycopg.Error, OSError) as exc:
                self.out(f"[chaos] raising the budget failed ({type(exc).__name__}); again soon")
                return
            self.budget = per_day
            self.report.budget_raises += 1

    def _cancel(self) -> None:
        """Cancel the runs ``scenario.cancel_plan`` names when they reach their moment, through
        the API process (it may be down: then again on the next step; a cancel is idempotent).
        The answer's instant bounds the cancel's commit from above, for the ledger check."""
        if self.monitor is None or self.monitor.closed:
            return
        try:
            rows = self.monitor.execute(_CANCEL_CANDIDATES, {"org": self.settings.org_id})
            candidates = rows.fetchall()
        except psycopg.Error:
            return
        for r in candidates:
            plan = scenario.cancel_plan(r["i"])
            if plan is None:
                continue
            # on its first wait, its approval or the reply: a run passes at least one of them
            # while the API is up (its approval needs a click through the API)
            waiting_on = r["status"] == "waiting" and r["step_id"] in (
                "wait",
                "approve",
                "wait_reply",
            )
            if plan == "waiting" and not waiting_on:
                continue
            if plan == "in_flight" and not (
                r["status"] == "running" or (waiting_on and r["step_id"] == "wait_reply")
            ):
                continue
            self._send_cancel(r["run_id"], plan)

    def _send_cancel(self, run_id: str, plan: str) -> None:
        try:
            reply = self._api().post(
                f"/v1/runs/{run_id}/cancel",
                json={"by": "chaos", "reason": f"cancelled {plan}"},
                timeout=5.0,
            )
        except httpx.ConnectError:
            # the API is down (killed at a crash point, restarting): a cancel planned for a
            # step in flight cannot wait for it -- the step settles in a model call's time, and
            # a run of 100 lost three of its ten that way (2026-12-07) -- so it goes through
            # the library, the same transition the API runs (cancel.cancel_run)
            if plan == "in_flight":
                self._cancel_without_api(run_id, plan)
            return
        except httpx.HTTPError:
            return
        if reply.status_code == 200:
            self.cancels.setdefault(run_id, (reply.json()["outcome"], time.time()))

    def _cancel_without_api(self, run_id: str, plan: str) -> None:
        try:
            got = asyncio.run(
                _cancel_run(self.url, self.settings.org_id, run_id, f"cancelled {plan}")
            )
        except (psycopg.Error, OSError):
            return
        self.report.cancels_without_api += 1
        self.cancels.setdefault(run_id, (got["outcome"], time.time()))

    def _api(self) -> httpx.Client:
        """This thread's client of the engine API: kept alive between calls (a new client and
        connection per call cost more than the step a cancel must catch in flight), with the
        admin key on every request."""
        client: httpx.Client | None = getattr(self._http, "client", None)
        if client is None:
            client = httpx.Client(
                base_url=f"http://127.0.0.1:{self.api_port}", headers=self.api_auth, timeout=5.0
            )
            self._http.client = client
            self._http_clients.append(client)
        return client

    def _cancel_in_flight(self, stop: threading.Event) -> None:
        """A thread of its own (its own connection, every 10 ms): the main loop's 0.1 s tick
        seldom sees a step running, so the ``in_flight`` cancels are sent from here the moment
        one is; a run never caught running is cancelled on its reply wait by ``_cancel``."""
        conn: psycopg.Connection[dict[str, Any]] | None = None
        while not stop.wait(0.01):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
                rows = conn.execute(_IN_FLIGHT, {"org": self.settings.org_id}).fetchall()
            except psycopg.Error:
                conn = None
                continue
            for r in rows:
                if r["run_id"] not in self.cancels:
                    self._send_cancel(r["run_id"], "in_flight")
        if conn is not None:
            conn.close()

    # -- the migration (R11) ------------------------------------------------------------------
    def _migrate(self) -> None:
        """Once ``MIGRATE_AT`` of the schedule is done and enough runs of version 1 are
        unfinished: publish version 2 and migrate them, through ``onward runs migrate`` armed
        at ``migrate.in_batch``; after each kill, ``onward operations resume`` (armed with the
        next kill, if any) continues the operation from its cursor, until it is done."""
        if self.migration == "planned":
            if self.progress() < MIGRATE_AT or self.monitor is None or self.monitor.closed:
                return
            try:
                row = self.monitor.execute(
                    _V1_UNFINISHED, {"org": self.settings.org_id, "automation": scenario.AUTOMATION}
                ).fetchone()
            except psycopg.Error:
                return
            unfinished = int(row["n"]) if row else 0
            if unfinished < MIGRATE_MIN:
                return
            try:
                asyncio.run(_publish(self.settings, scenario.document(version=2)))
            except (psycopg.Error, OSError) as exc:
                self.out(f"[chaos] publishing version 2 failed ({type(exc).__name__}); again")
                return
            self.report.migration_published_at = self.started_db
            self.report.migration_v1_unfinished = unfinished
            self.migration = "driving"
            self.migrator = self._spawn_migrator(None)
            return
        proc = self.migrator
        if self.migration != "driving" or proc is None or proc.alive():
            return
        rc = proc.popen.returncode
        if not proc.log.closed:
            proc.log.close()
        tail = proc.tail(4000)
        crashed_at = _crashed_at(tail)
        live = [x for x in proc.specs if not x.done]
        if rc == -signal.SIGKILL and crashed_at == MIGRATE_POINT:
            self.report.kills[MIGRATE_POINT] = self.report.kills.get(MIGRATE_POINT, 0) + 1
            for spec in live:
                spec.done = True
                self.specs_done += 1
        elif rc != 0:
            arm = ",".join(x.arm for x in proc.specs) or "-"
            self.report.unexpected_exits.append(
                f"{proc.name} exit {rc} (armed {arm}): " + tail[-600:].replace("\n", " | ")
            )
            self.queues["migrator"][:0] = live
        else:
            for spec in live:  # the operation ended before its batch came: it cannot come now
                self._missed(spec)
        try:
            op = self.monitor.execute(  # type: ignore[union-attr]
                _MIGRATION, {"org": self.settings.org_id}
            ).fetchone()
        except (psycopg.Error, AttributeError):
            self.monitor = None
            op = None
        if op is None and rc == 0:
            self.report.migration_errors.append(f"{proc.name} left no operation")
            self.migration = "done"
        elif op is None or op["status"] == "running":
            self.migrator = self._spawn_migrator(op["operation_id"] if op else None)
        else:
            self.operation_id = op["operation_id"]
            self.migration = "done"

    def _spawn_migrator(self, operation_id: str | None) -> Proc:
        """``onward runs migrate`` (or ``onward operations resume OP``), armed with the next
        kill of its queue. Its connections are named outside the run's prefix: the connection
        killer leaves them alone (a terminated batch would only be resumed the same way)."""
        self.generation += 1
        name = f"migrator-{self.generation}"
        queue = self.queues["migrator"]
        specs = [queue.pop(0)] if queue else []
        for spec in specs:
            spec.tries += 1
        if operation_id is None:
            mapping = ",".join(f"{a}:{b}" for a, b in scenario.MIGRATION_MAP.items())
            args = ["runs", "migrate", "--automation", scenario.AUTOMATION, "--from", "1"]
            args += ["--to", "2", "--map", mapping, "--batch", str(MIGRATE_BATCH), "--by", "chaos"]
        else:
            args = ["operations", "resume", operation_id]
        proc = Proc.start(
            [sys.executable, "-m", "onward.cli", *args],
            name=name,
            log_path=self.log_dir / f"p{self.generation:04d}-migrator.log",
            env=self._cli_env(name, specs, application_name=f"onward-chaos-op-{name}"),
            role="migrator",
            specs=specs,
            spawned_at=time.monotonic(),
        )
        self.report.processes += 1
        self.report.migration_drivers += 1
        return proc

    # -- the erasures (R14) --------------------------------------------------------------------
    def _erase_moment(self, row: dict[str, Any]) -> str | None:
        """Whether the contact of a candidate run can be erased now, and how: ``early`` (its
        run in its first steps), ``early_in_flight`` (... one running: the erasure stays
        pending until the run stops), ``finished`` (and nobody acts on it any more)."""
        if row["finished"]:
            quiet = not self.people.busy(row["run_id"])
            return "finished" if quiet and row["finished_s"] >= 1.0 else None
        if row["step_id"] in scenario.EARLY_STEPS and row["step_status"] != "parked":
            # (not while parked on the budget or a circuit: that story ends in its resume)
            return "early_in_flight" if row["step_status"] == "running" else "early"
        return None

    @staticmethod
    def _holds_still(row: dict[str, Any], moment: str) -> bool:
        """Whether the erasure of this run reaches ``erasure.after_run`` in the API for sure:
        its run finished, or waiting on its first timer (cancelled at once, then erased). A
        run whose step is ready may be claimed before the erasure locks it: the erasure then
        stays pending and the elected sweeper erases the run -- the kill goes by, and with it
        one of the few contacts to erase."""
        return moment == "finished" or (
            row["step_id"] == "wait" and row["step_status"] == "waiting"
        )

    def _erasable(self, point: str) -> bool:
        rows = getattr(self, "erase_rows", [])
        return any(
            (m := self._erase_moment(r)) is not None
            and (point != "erasure.after_run" or self._holds_still(r, m))
            for r in rows
        )

    def _erase(self) -> None:
        """Erase the contacts ``scenario.erase_plan`` names, through the API: while kills at
        an erasure's crash points are still to come, only when the API is armed at one (with
        a contact whose erasure reaches it); then each at its planned moment. A request whose
        answer was lost (the API killed) is made again (erasure is idempotent)."""
        api = self.procs.get(("api", 0))
        if api is None or not api.alive() or api.ready_at is None or api.term_at is not None:
            return
        if self.monitor is None or self.monitor.closed:
            return
        for contact, answer in self.erasing.items():
            if answer is None:
                self._erase_call(contact)
                return
        todo = [c for c in self.erase_contacts if c not in self.erasing]
        if not todo:
            self.erase_rows = []
            return
        try:
            rows = self.monitor.execute(
                _ERASE_CANDIDATES, {"org": self.settings.org_id, "contacts": todo}
            ).fetchall()
        except psycopg.Error:
            return
        self.erase_rows = rows
        armed = next((x.point for x in api.specs if not x.done and x.point in ERASURE_POINTS), None)
        kills_left = len(
            {
                id(x): x
                for x in [*self.queues["api"], *api.specs]
                if x.point in ERASURE_POINTS and not x.done
            }
        )
        for r in rows:
            moment = self._erase_moment(r)
            if moment is None:
                continue
            if armed == "erasure.after_run" and not self._holds_still(r, moment):
                continue  # its erasure might stop at the record: the run is erased later
            if armed is None and len(todo) <= kills_left:
                return  # kept for the kills still to come (one contact for each at least)
            planned = scenario.erase_plan(self.erase_contacts[r["contact_id"]])
            if armed is None and moment != "finished" and planned != "early":
                continue  # its contact is erased once its run has finished
            self._erase_call(r["contact_id"], r["run_id"])
            return

    def _erase_call(self, contact: str, run_id: str | None = None) -> None:
        if run_id is not None and contact not in self.erasing:
            # its flow-control events, before erasure redacts their details
            with contextlib.suppress(psycopg.Error, AttributeError):
                for e in self.monitor.execute(  # type: ignore[union-attr]
                    _FLOW_EVENTS, {"org": self.settings.org_id, "run": run_id, "skip": []}
                ).fetchall():
                    self.before_erasure[e["what"]] += e["n"]
        self.erasing.setdefault(contact, None)
        self.report.erasure_requests += 1
        api = self.procs.get(("api", 0))
        if api is not None:
            api.erase_calls += 1
        armed = ",".join(x.arm for x in api.specs if not x.done) if api is not None else "-"
        try:
            reply = self._api().post(
                f"/v1/contacts/{contact}/erase",
                json={"by": "chaos"},
                timeout=20.0,
            )
        except httpx.HTTPError:
            self.report.erasures_lost += 1  # asked again once the API is back
            self.out(f"[chaos {self.elapsed():6.1f}s] erase {contact}: no answer (armed {armed})")
            return
        if reply.status_code in (200, 202):
            self.erasing[contact] = reply.json()
            self.out(
                f"[chaos {self.elapsed():6.1f}s] erase {contact}: {reply.json()['status']} "
                f"(armed {armed or '-'})"
            )
            self.report.erasures[contact] = self.erasing[contact]["status"]  # type: ignore[index]
            return
        if reply.status_code == 503:  # the database could not be reached (a terminated
            self.report.erasures_lost += 1  # connection): asked again
            return
        self.report.erasure_errors.append(
            f"erase {contact}: {reply.status_code} {reply.text}"[:300]
        )
        if len(self.report.erasure_errors) > 5:
            self.erasing[contact] = {"status": f"refused {reply.status_code}"}

    def _erasures_done(self) -> bool:
        if any(c not in self.erasing or self.erasing[c] is None for c in self.erase_contacts):
            return False
        if self.monitor is None or self.monitor.closed:
            return False
        try:
            row = self.monitor.execute(_ERASURES_PENDING, {"org": self.settings.org_id}).fetchone()
        except psycopg.Error:
            return False
        return row is not None and int(row["n"]) == 0  # the sweeper finished the pending ones

    # -- the broken connection and its notification (R15) ---------------------------------------
    def _relays(self) -> list[Proc]:
        return [p for p in self.procs.values() if p.role in ("worker", "leader") and p.alive()]

    def _notify_live(self) -> bool:
        return self.outage is not None and not self.outage["spec"].done

    def _notify_killed(self) -> None:
        """A relay died at ``notify.after_send``: that outage's kill is done; the others are
        disarmed before the notification's claim lapses and another relay sends it again."""
        if self.outage is None or self.outage["spec"].done:
            return
        self.outage["spec"].done = True
        self.specs_done += 1
        for p in self._relays():
            p.tell(f"disarm {NOTIFY_POINT}\n")

    def _notify(self, now: float) -> None:
        """One outage per planned ``notify.after_send`` kill: every relay process is armed
        there (stdin ``arm``, acknowledged), the mailbox's provider refuses (401) until a send
        marked the connection broken -- which writes the notification -- and a moment more,
        then the runner restores it (the sandbox, then ``POST
        /v1/connections/mailbox/restore`` through the API). The receiver fails the first
        attempts; the relay that gets its 2xx dies before writing it, and another sends it
        again with the same id."""
        o = self.outage
        if o is None:
            spec = next((x for x in self.notify_specs if not x.done), None)
            if spec is None:
                return
            if self.outages_done >= len(self.notify_specs) + 3:
                self._missed(spec)  # delivered each time by a process that was not armed
                return
            if self.progress() < BREAK_AT[min(self.outages_done, len(BREAK_AT) - 1)]:
                return
            spec.tries += 1
            self.outage = {"state": "arming", "spec": spec, "since": now, "acks": {}, "logs": {}}
            for p in self._relays():
                self.outage["acks"][p.name] = p
                p.tell(f"arm {NOTIFY_POINT}@1\n")
            return
        admin = self.sandbox.admin
        if o["state"] == "arming":
            for name, p in list(o["acks"].items()):
                o["logs"][name] = o["logs"].get(name, "") + p.read_new()
                if not p.alive() or f"armed {NOTIFY_POINT}" in o["logs"][name]:
                    del o["acks"][name]
            if o["acks"] and now - o["since"] < 10.0:
                return
            try:
                admin.revoke(scenario.BREAK_PROVIDER, scenario.ACCOUNT)
            except Exception:  # the sandbox is ours: again on the next step
                return
            self.report.outages += 1
            o.update(state="broken", since=now)
        elif o["state"] == "broken":
            status = self._connection_status()
            if status == "broken":
                o.setdefault("broken_at", now)
                if now - o["broken_at"] < BREAK_HOLD_S:
                    return
                try:
                    admin.restore(scenario.BREAK_PROVIDER, scenario.ACCOUNT)
                except Exception:
                    return
                o.update(state="restoring", since=now)
            elif status == "ok" and now - o["since"] > BREAK_PROBE_S:
                # no send met the refusal: the customer's probe finds it (and notifies)
                with contextlib.suppress(psycopg.Error, OSError):
                    asyncio.run(_probe(self.settings))
                    self.report.outages_probed += 1
                    o["since"] = now
        elif o["state"] == "restoring":
            try:
                reply = self._api().post(
                    f"/v1/connections/{scenario.BREAK_CONNECTION}/restore",
                    timeout=5.0,
                )
            except httpx.HTTPError:
                return
            if reply.status_code == 200:
                o.update(state="delivering", since=now)
        elif o["state"] == "delivering":
            if now - o["since"] > 1.0:
                self._parked_after_restore()
            undelivered = self._undelivered()
            if undelivered is None or undelivered > 0:
                return
            self.outage = None  # if no armed relay sent it, the next outage tries again
            self.outages_done += 1

    def _connection_status(self) -> str | None:
        try:
            row = self.monitor.execute(  # type: ignore[union-attr]
                "SELECT status FROM connections WHERE org_id = %s AND connection_id = %s",
                (self.settings.org_id, scenario.BREAK_CONNECTION),
            ).fetchone()
        except (psycopg.Error, AttributeError):
            return None
        return str(row["status"]) if row else None

    def _undelivered(self) -> int | None:
        try:
            row = self.monitor.execute(  # type: ignore[union-attr]
                "SELECT count(*) FILTER (WHERE delivered_at IS NULL) AS n,"
                " count(*) AS written FROM notifications WHERE org_id = %s",
                (self.settings.org_id,),
            ).fetchone()
        except (psycopg.Error, AttributeError):
            return None
        if row is None or int(row["written"]) == 0:
            return None  # not written yet
        return int(row["n"])

    def _parked_after_restore(self) -> None:
        """Steps parked on the connection while it is usable again: nothing would resume them
        (a step refused around the restore goes on instead of parking). Counted, and left
        parked: the run then fails the check, as it would stay parked for a customer."""
        try:
            rows = self.monitor.execute(  # type: ignore[union-attr]
                _PARKED_AFTER_RESTORE,
                {"org": self.settings.org_id, "connection": scenario.BREAK_CONNECTION},
            ).fetchall()
        except (psycopg.Error, AttributeError):
            return
        self.parked_after_restore.update(r["run_id"] for r in rows)
        self.report.reconnect_parked_after_restore = len(self.parked_after_restore)

    def _extras_done(self) -> bool:
        """The migration, the erasures and the outages are over, and every SIGKILL planned at
        a random moment was sent: its moment is a share of the crash points' progress, which
        reaches 1 at the end, so the last of them come due as the runs finish -- one a poll --
        and a run that finished within a poll of the last crash point used to stop before
        them (a quick run once ended with 1 of its 2)."""
        return (
            not self.external_plan
            and self.migration != "driving"
            and self.outage is None
            and all(x.done for x in self.notify_specs)
            and self._erasures_done()
        )

    def _still_reachable(self, spec: Spec) -> bool:
        """Once every run has finished: can this kill still come? An erasure's while a contact
        is left to erase (a finished run's erasure reaches both points), a migration's while it
        is driven."""
        if spec.point in ERASURE_POINTS:
            return any(self.erasing.get(c) is None for c in self.erase_contacts)
        if spec.point == MIGRATE_POINT:
            return self.migration == "driving"
        return False

    def _reap(self, proc: Proc, *, stopping: bool = False) -> None:
        rc = proc.popen.returncode
        if not proc.log.closed:
            proc.log.close()
        tail = proc.tail(4000)
        crashed_at = _crashed_at(tail)
        stats = worker_stats(tail)
        if stats is not None:
            self.report.stale_settles_refused += int(stats.get("lost", 0))
        live = [x for x in proc.specs if not x.done]
        if rc == -signal.SIGKILL and crashed_at is not None and not proc.external:
            self.report.kills[crashed_at] = self.report.kills.get(crashed_at, 0) + 1
            if crashed_at == NOTIFY_POINT:
                self._notify_killed()
            for spec in live:
                if spec.point == crashed_at:
                    spec.done = True
                    self.specs_done += 1
                    self.report.random_point_kills += int(spec.origin == "random")
                else:
                    self._release(proc, spec)
        elif rc == -signal.SIGKILL and proc.external:
            self.report.external_kills += 1
            for spec in live:  # not its fault: try these kills again
                self._release(proc, spec)
        elif rc in (0, -signal.SIGTERM) and (proc.term_at is not None or stopping):
            self.report.graceful_stops += 1
            for spec in live:
                if stopping:
                    continue  # the schedule is over
                if spec.tries < NO_SHOW_TRIES:  # armed, but the point never came in time
                    # back soon, while the runs that can reach it still flow (an early point
                    # next: later in the run it can no longer come)
                    self._release(proc, spec, at=0 if spec.point in EARLY_POINTS else RETRY_GAP)
                elif not any(spec is x for x in self._armed_specs(exclude=proc)):
                    self._missed(spec)
        else:
            arm = ",".join(x.arm for x in proc.specs) or "-"
            self.report.unexpected_exits.append(
                f"{proc.name} exit {rc} (armed {arm}): " + tail[-600:].replace("\n", " | ")
            )
            for spec in live:
                self._release(proc, spec)

    def _release(self, proc: Proc, spec: Spec, *, at: int = 0) -> None:
        """Put a kill back in the queue at position ``at`` (0: next), unless another process
        still holds it armed."""
        if spec.done or any(spec is x for x in self._armed_specs(exclude=proc)):
            return
        queue = self.queues[proc.role]
        if any(spec is x for x in queue):
            return
        queue.insert(min(at, len(queue)), spec)

    def _missed(self, spec: Spec) -> None:
        """A planned kill whose point never came (random extras are simply dropped)."""
        if spec.done:
            return
        spec.done = True
        self.specs_done += 1
        if spec.origin == "scheduled":
            self.report.missed[spec.point] = self.report.missed.get(spec.point, 0) + 1

    def _parse_starter(self, proc: Proc) -> None:
        for line in proc.read_new().splitlines():
            if line.startswith("started "):
                self.report.deliveries += 2
                self.report.duplicates_acknowledged += 1 + int(line.endswith(" dup"))
            elif line.startswith("erased "):  # a redelivery after its contact was erased
                self.report.deliveries += 2
                self.report.starts_refused_erased += 1
            elif line.startswith("batch ") and self.batch is not None:
                if int(line.split()[1]) == self.batch[1]:
                    self.batch = None
            elif line.startswith("ready "):
                proc.ready_at = proc.ready_at or time.monotonic()

    def _check_ready(self, proc: Proc) -> None:
        if proc.role == "api":
            if proc.ready_at is None and self._api_answers():
                proc.ready_at = time.monotonic()
            return
        if proc.ready_at is None:
            proc.read_new()
            if "\nready " in "\n" + proc.text:
                proc.ready_at = time.monotonic()
                if any(x.point == ERROR_POINT and not x.done for x in proc.specs):
                    self._provoke_errors()
                if any(x.point in CIRCUIT_POINTS and not x.done for x in proc.specs):
                    self._burst(time.monotonic())

    # -- the loop -------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def schedule_done(self) -> bool:
        return self.specs_left() == 0

    def progress(self) -> float:
        return (self.specs_done + 1) / (self.specs_total + 1)

    def poll_db(self) -> None:
        if self.monitor is None or self.monitor.closed:
            self.monitor = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
        row = self.monitor.execute(_PROGRESS, ([*TERMINAL], self.settings.org_id)).fetchone()
        assert row is not None
        self.started_db, self.finished = int(row["started"]), int(row["finished"])
        self.parked_on_budget = int(row["on_budget"])

    def target(self) -> int:
        """How many events may have been delivered by now: in step with the kill schedule,
        never fewer than keep ``min_inflight`` runs in flight nor more than ``max_inflight``,
        and holding back enough runs for the kills still to come."""
        return min(self._paced(), self.finished + self.max_inflight)

    def _paced(self) -> int:
        left = self.specs_left()
        if left == 0:
            return self.runs
        reserve = max(int(left * self.per_spec + 0.999), self.tail_reserve)
        paced = max(int(self.runs * self.progress()), self.finished + self.min_inflight)
        target = min(paced, self.runs - reserve)
        # an armed process without work can never reach its point: keep some in flight
        armed = any(self._armed(p) and p.alive() for p in self.procs.values())
        target = max(target, self.finished + (2 if armed else 0))
        return min(target, self.runs)

    def feed(self, starter: Proc) -> None:
        if starter.ready_at is None or self.batch is not None or self.sent >= self.runs:
            return
        target = self.target()
        if target > self.sent:
            last = min(target, self.sent + 200)
            if starter.tell(f"{self.sent} {last}\n"):
                self.batch = (self.sent, last)
                self.sent = last

    def step(self) -> None:
        now = time.monotonic()
        for key, proc in list(self.procs.items()):
            if proc.role == "starter":
                self._parse_starter(proc)
            if proc.alive():
                if proc.role != "starter":
                    self._check_ready(proc)
                continue
            self._reap(proc)
            self.retired.append(proc)
            if proc.role == "starter":
                if self.batch is not None:  # died mid-batch: the sender redelivers it all
                    pending, self.batch = self.batch, None
                    self.sent = pending[0]
                if self.sent >= self.runs and self.batch is None and proc.term_at is not None:
                    del self.procs[key]
                    continue
            self.spawn(proc.role, proc.slot)
        if not self.warm and (
            all(p.ready_at is not None for p in self.procs.values()) or self.elapsed() > 10
        ):
            self.warm = True
            for role in ("worker", "leader", "starter"):
                if role not in self.spares:
                    self.spares[role] = self._standby(role)
            if "api" not in self.spares:
                self.spares["api"] = self._api_standby()
        starter = self.procs.get(("starter", 0))
        if starter is not None and starter.alive() and starter.term_at is None:
            self.feed(starter)
            if self.sent >= self.runs and self.batch is None:
                for spec in self.queues["starter"]:  # start kills that can no longer come
                    self._missed(spec)
                self.queues["starter"].clear()
                starter.specs = []
                starter.close_stdin()  # EOF: the starter is done
                starter.term_at = now
        for proc in self.procs.values():
            if proc.role == "starter" or not proc.alive() or proc.term_at is not None:
                continue
            if any(x.point == SHUTDOWN_POINT and not x.done for x in proc.specs):
                if proc.ready_at is not None and now - proc.ready_at > 1.0:
                    proc.popen.send_signal(signal.SIGTERM)
                    proc.term_at = now
            elif self._armed(proc) and proc.ready_at is not None:
                # a circuit's points come with its bursts, a few seconds apart
                slow = proc.role in ("leader", "api") or any(
                    x.point in CIRCUIT_POINTS and not x.done for x in proc.specs
                )
                limit = 20.0 if slow else 12.0
                if now - proc.ready_at > limit:
                    if proc.role == "api":
                        # a kill whose request never came (no contact could be erased, nobody
                        # clicked, no reply was posted): not a try, it comes again
                        clicks, posts = self.people.seen()
                        for x in proc.specs:
                            if (
                                (x.point in ERASURE_POINTS and not proc.erase_calls)
                                or (x.point == DECIDE_POINT and clicks == proc.people_at[0])
                                or (x.point == SIGNAL_POINT and posts == proc.people_at[1])
                            ):
                                x.tries -= 1
                    proc.popen.send_signal(signal.SIGTERM)  # give up on this kill for now
                    proc.term_at = now
        self._flow_control(now)
        self._cancel()
        self._migrate()
        self._erase()
        self._notify(now)
        self._rearm_api(now)
        if self.all_finished() and not self.schedule_done():
            self.give_up(now)
        for proc in self.procs.values():
            if proc.resume_at is not None and now >= proc.resume_at:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.send_signal(signal.SIGCONT)  # wakes up fenced: its writes fail
                proc.resume_at = None
        if self.pause_plan and self.progress() >= self.pause_plan[0]:
            victims = [
                p
                for p in self.procs.values()
                if p.role == "worker"
                and p.alive()
                and p.ready_at
                and p.term_at is None
                and p.resume_at is None
            ]
            if victims:
                self.pause_plan.pop(0)
                victim = self.rng.choice(victims)
                victim.popen.send_signal(signal.SIGSTOP)  # past its leases, then SIGCONT
                victim.resume_at = now + 2.5 * self.settings.lease_seconds
                self.report.pauses += 1
        if self.external_plan and self.progress() >= self.external_plan[0]:
            victims = [
                p
                for p in self.procs.values()
                if p.role != "starter" and p.alive() and p.ready_at and p.term_at is None
            ]
            if victims:
                self.external_plan.pop(0)
                victim = self.rng.choice(victims)
                victim.external = True
                victim.popen.send_signal(signal.SIGKILL)

    def all_finished(self) -> bool:
        return (
            self.sent >= self.runs
            and self.batch is None
            and self.started_db >= self.runs
            and self.finished >= self.started_db
        )

    def give_up(self, now: float) -> None:
        """Every run is finished: no process can reach a point any more. What is left of the
        schedule is missed."""
        for queue in self.queues.values():
            for spec in queue:
                if not self._still_reachable(spec):
                    self._missed(spec)
            queue[:] = [x for x in queue if not x.done]
        for proc in self.procs.values():
            if self._armed(proc) and proc.alive() and proc.term_at is None:
                if any(self._still_reachable(x) for x in proc.specs if not x.done):
                    continue
                for spec in proc.specs:
                    self._missed(spec)
                proc.popen.send_signal(signal.SIGTERM)
                proc.term_at = now

    def done(self) -> bool:
        return self.all_finished() and self.schedule_done() and self._extras_done()

    def _rearm_api(self, now: float) -> None:
        """An API process armed with nothing while its queue holds a kill it can reach now
        (an erasure's, once a contact can be erased): restarted gracefully, to be armed."""
        api = self.procs.get(("api", 0))
        if api is None or not api.alive() or api.ready_at is None or api.term_at is not None:
            return
        if not self._armed(api) and self._api_spec_ready() is not None:
            api.popen.send_signal(signal.SIGTERM)
            api.term_at = now

    def say_progress(self, force: bool = False) -> None:
        now = self.elapsed()
        if not force and now - self._last_progress < 5.0:
            return
        self._last_progress = now
        alive = sum(1 for p in self.procs.values() if p.role in ("worker", "leader") and p.alive())
        self.out(
            f"[chaos {now:6.1f}s] runs started {self.started_db}/{self.runs}, finished or parked "
            f"{self.finished}; kills {self.report.total_kills} + "
            f"{self.report.external_kills} at random moments; schedule "
            f"{self.specs_total - self.specs_left()}/{self.specs_total}; workers alive {alive}; "
            + self.people.progress()
        )

    def run(self) -> None:
        self.plan()
        if self.db_faults:
            self.killer = BackendKiller(
                self.admin_url, self.app_prefix, interval=1.0, seed=self.rng.randint(0, 1 << 30)
            ).start()
        self.spawn("api", 0)
        self.spawn("leader", 0)
        for slot in range(self.workers):
            self.spawn("worker", slot)
        self.spawn("starter", 0)
        self.people.start()
        stop_in_flight = threading.Event()
        in_flight = threading.Thread(
            target=self._cancel_in_flight, args=(stop_in_flight,), name="in-flight", daemon=True
        )
        in_flight.start()
        deadline = self.t0 + self.time_limit
        moved_at, last_finished = time.monotonic(), -1
        try:
            while True:
                self.step()
                self.poll_db()
                self.say_progress()
                if self.done():
                    break
                if self.finished != last_finished:
                    moved_at, last_finished = time.monotonic(), self.finished
                elif (
                    self.schedule_done()
                    and self.sent >= self.runs
                    and time.monotonic() - moved_at > 90
                ):
                    self.out("[chaos] no run moved for 90 s with nothing left to do: stalled")
                    self.report.stalled = self.report.timed_out = True
                    break
                if self.schedule_done() and self.killer is not None:
                    self._stop_killer()  # the tail runs without database faults
                if time.monotonic() > deadline:
                    self.report.timed_out = True
                    break
                if len(self.report.unexpected_exits) >= 10:
                    self.out("[chaos] 10 processes died unplanned: stopping (see their logs)")
                    self.report.timed_out = True
                    break
                time.sleep(0.1)
        finally:
            stop_in_flight.set()
            in_flight.join(timeout=10)
            self._stop_killer()
            self.people.stop()
        self.say_progress(force=True)
        if self.report.timed_out:  # where is every worker waiting? (printed into its log)
            asked = [p for p in self.procs.values() if p.role in ("worker", "leader") and p.alive()]
            for p in asked:
                with contextlib.suppress(ProcessLookupError):
                    p.popen.send_signal(signal.SIGUSR1)
            until = time.monotonic() + 5.0
            while time.monotonic() < until and not all(" tasks ---" in p.tail() for p in asked):
                time.sleep(0.05)

    def wait_for_leader(self, timeout: float) -> bool:
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            with contextlib.suppress(psycopg.Error):
                if self.monitor is None or self.monitor.closed:
                    self.monitor = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
                row = self.monitor.execute(
                    "SELECT lease_until > now() AS live FROM leader_leases WHERE name = 'sweeper'"
                ).fetchone()
                if row is not None and row["live"]:
                    return True
            time.sleep(0.1)
        return False

    def _stop_killer(self) -> None:
        if self.killer is not None:
            self.killer.stop()
            self.report.db_connections_terminated += self.killer.killed
            self.killer = None

    def stop_all(self) -> None:
        for client in self._http_clients:
            client.close()
        working = [p for p in self.procs.values() if p.alive()]
        if self.migrator is not None and self.migrator.alive():
            working.append(self.migrator)
        spares = [p for p in [*self.spares.values(), *self.retired] if p.alive()]
        for p in [*working, *spares]:
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGCONT)  # a paused process cannot stop otherwise
            p.close_stdin()  # EOF: a spare or the starter exits
            if p in working:
                with contextlib.suppress(ProcessLookupError):
                    p.popen.send_signal(signal.SIGTERM)
                p.term_at = p.term_at or time.monotonic()
        deadline = time.monotonic() + 15
        for p in [*working, *spares]:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
        for p in working:
            if p is not self.migrator:
                self._reap(p, stopping=True)
        migrator = [self.migrator] if self.migrator is not None else []
        for p in [*self.procs.values(), *self.spares.values(), *self.retired, *migrator]:
            if not p.log.closed:
                p.log.close()
            p.close_stdin()
        if self.monitor is not None:
            self.monitor.close()


# Runs started; finished (terminal, or parked for a person -- a run parked on a circuit or on
# the budget is in flight: it resumes by itself or when the budget is raised); parked on it.
# The unfinished runs the runner will cancel, not yet asked, with their unfinished step.
_CANCEL_CANDIDATES = """
SELECT r.run_id, (r.input->>'i')::int AS i, s.step_id, s.status
FROM runs r
JOIN steps s ON s.org_id = r.org_id AND s.run_id = r.run_id
            AND s.status IN ('ready', 'running', 'waiting', 'parked')
WHERE r.org_id = %(org)s AND r.finished_at IS NULL AND r.cancel_requested_at IS NULL
  AND mod((r.input->>'i')::int, 10) IN (4, 8)
"""

# the runs planned to be cancelled with a step in flight (i % 10 == 8) whose draft is running:
# the model's call takes scenario.MODEL_LATENCY_MS, time enough for the cancel to land in it
# (a `set` step runs for a millisecond: a cancel aimed at one lands after it)
_IN_FLIGHT = """
SELECT r.run_id
FROM runs r
JOIN steps s ON s.org_id = r.org_id AND s.run_id = r.run_id AND s.status = 'running'
            AND s.step_id = 'draft'
WHERE r.org_id = %(org)s AND r.finished_at IS NULL AND r.cancel_requested_at IS NULL
  AND mod((r.input->>'i')::int, 10) = 8
"""

_PROGRESS = """
SELECT count(*) AS started,
       count(*) FILTER (WHERE r.status = ANY(%s) OR (r.status = 'parked' AND f.wait_kind IS NULL))
           AS finished,
       count(*) FILTER (WHERE r.status = 'parked' AND f.wait_kind = 'budget') AS on_budget
FROM runs r
LEFT JOIN LATERAL (
    SELECT s.wait_kind FROM steps s
    WHERE s.org_id = r.org_id AND s.run_id = r.run_id AND s.status = 'parked'
      AND s.wait_kind IN ('circuit', 'budget', 'reconnect')
    LIMIT 1) f ON true
WHERE r.org_id = %s
"""


# The unfinished runs of version 1 (what a migration would move).
_V1_UNFINISHED = """
SELECT count(*) AS n FROM runs
WHERE org_id = %(org)s AND automation_id = %(automation)s AND version = 1 AND finished_at IS NULL
"""

# The migration's operation (the newest).
_MIGRATION = """
SELECT operation_id, status FROM operations
WHERE org_id = %(org)s AND kind = 'migrate' ORDER BY created_at DESC LIMIT 1
"""

# The runs of the contacts to erase, not erased yet, with their unfinished step.
_ERASE_CANDIDATES = """
SELECT r.run_id, r.contact_id, r.finished_at IS NOT NULL AS finished,
       coalesce(extract(epoch FROM now() - r.finished_at), 0) AS finished_s,
       s.step_id, s.status AS step_status
FROM runs r
LEFT JOIN steps s ON s.org_id = r.org_id AND s.run_id = r.run_id
                 AND s.status IN ('ready', 'running', 'waiting', 'parked')
WHERE r.org_id = %(org)s AND r.contact_id = ANY(%(contacts)s) AND r.erased_at IS NULL
ORDER BY r.run_id
"""

_ERASURES_PENDING = """
SELECT count(*) AS n FROM erasures WHERE org_id = %(org)s AND status <> 'done'
"""

# Steps parked on the connection while it is usable: they parked after the restore committed.
_PARKED_AFTER_RESTORE = """
SELECT st.run_id FROM steps st
JOIN connections c ON c.org_id = st.org_id AND c.connection_id = %(connection)s
WHERE st.org_id = %(org)s AND st.status = 'parked' AND st.wait_kind = 'reconnect'
  AND st.error ->> 'connection' = %(connection)s AND c.status = 'ok'
"""


def _crashed_at(log: str) -> str | None:
    """The crash point a process's log says it died at, if any."""
    crashed_at = None
    for line in log.splitlines():
        if line.startswith("onward: crash point ") and line.endswith(" reached, SIGKILL"):
            crashed_at = line[len("onward: crash point ") : -len(" reached, SIGKILL")]
    return crashed_at


async def _publish(settings: Settings, document: dict[str, Any]) -> None:
    async with Engine.open(settings, migrate=False, start_queue=False, pool_size=1) as engine:
        await engine.publish(document)


async def _probe(settings: Settings) -> None:
    """The customer checks the broken connection (marks it broken: the notification)."""
    async with Engine.open(settings, migrate=False, start_queue=False, pool_size=1) as engine:
        await engine.integrations.probe(settings.org_id, scenario.BREAK_CONNECTION)


async def _cancel_run(url: str, org: str, run_id: str, reason: str) -> dict[str, Any]:
    """Cancel one run through the library (``cancel.cancel_run``), as the API would."""
    pool = make_pool(url, max_size=1, name="chaos-cancel")
    await pool.open(wait=True, timeout=10)
    try:
        return await cancel_ops.cancel_run(pool, org, run_id, by="chaos", reason=reason)
    finally:
        await pool.close()


async def _set_budget(url: str, org: str, per_day: float) -> None:
    """Raise the automation's budget (``budgets.set_budget``: the drafts parked on it resume)."""
    pool = make_pool(url, max_size=1, name="chaos-budget")
    await pool.open(wait=True, timeout=10)
    try:
        await budgets.set_budget(
            pool, org, scenario.AUTOMATION, scenario.BUDGET_UNIT, per_day, worker="chaos-runner"
        )
    finally:
        await pool.close()


async def _setup(
    settings: Settings, sandbox_url: str, signing_secret: str, hook_url: str, hook_secret: str
) -> str:
    """Publish, connect and configure the scenario; an admin API key for the runner's calls
    through the API (and the sandbox's replies)."""
    async with Engine.open(settings, migrate=False, start_queue=False, pool_size=2) as engine:
        await engine.publish(scenario.document())
        await publish(
            engine.pool, scenario.CLOCK_ORG, scenario.clock_document(), registry=engine.registry
        )
        await scenario.add_connections(
            engine.integrations, settings.org_id, sandbox_url, signing_secret=signing_secret
        )
        for approver in scenario.APPROVERS:
            await engine.grant_approver(approver, automation_id=scenario.AUTOMATION)
        await scenario.configure_flow_control(engine)
        await engine.set_notification_destination(
            scenario.DESTINATION, url=hook_url, secret=hook_secret
        )
        _, key = await engine.create_key("chaos", ["admin"], by="chaos")
        return key


def api_port(rng: random.Random) -> int:
    """A free port below the kernel's ephemeral range (32768 and up), so that no outgoing
    connection takes it while the API is down: every restart listens on the same URL."""
    for _ in range(100):
        port = rng.randint(20000, 32000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000 for the engine API")


async def _doctor(settings: Settings) -> list[dict[str, Any]]:
    from onward.doctor import run_checks

    async with Engine.open(settings, migrate=False, pool_size=2) as engine:
        return [c.as_dict() for c in await run_checks(engine, grace=30.0)]


def _clean_redis(settings: Settings) -> None:
    if settings.queue != "redis":
        return
    import redis

    with contextlib.suppress(Exception):
        client = redis.Redis.from_url(settings.redis_url)
        keys = list(client.scan_iter(f"{settings.queue_prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


def run_chaos(
    settings: Settings,
    *,
    runs: int = 60,
    kills_per_point: int = 1,
    out: Out = print,
    workers: int = 3,
    seed: int | None = None,
    time_limit: float | None = None,
    provider_faults: bool = True,
    db_faults: bool = True,
    skew_clock: bool = True,
    duplicate_wakes: bool = True,
    keep_logs: bool = False,
    log_dir: str | Path | None = None,
) -> Report:
    """Drive ``runs`` runs of the reference scenario through real processes killed at every
    crash point ``kills_per_point`` times; see the module docstring. Blocking."""
    if runs < 1 or kills_per_point < 0 or workers < 1:
        raise ValueError("runs >= 1, kills_per_point >= 0 and workers >= 1")
    seed = seed if seed is not None else secrets.randbelow(1 << 30)
    rng = random.Random(seed)
    admin_url = resolve_url(settings)
    n_points = len(POINTS) - len(UNREACHABLE)
    limit = time_limit or 120.0 + 0.8 * runs + 6.0 * n_points * kills_per_point
    report = Report(runs=runs, queue=settings.queue, workers=workers, time_limit_s=limit)
    own_logs = log_dir is None
    logs = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="onward-chaos-"))
    logs.mkdir(parents=True, exist_ok=True)
    out(
        f"onward chaos: {runs} runs, {kills_per_point} kill(s) per crash point, "
        f"{workers} workers, queue {settings.queue}, seed {seed}"
    )
    tag = f"chaos_{os.getpid()}_{secrets.token_hex(2)}"
    with scratch_database(admin_url, tag) as url, SandboxServer() as sandbox:
        chaos_settings = dataclasses.replace(
            settings,
            database_url=url,
            queue_prefix=f"chaos{secrets.token_hex(3)}",
            outbound_allow=(*settings.outbound_allow, sandbox.allow_entry),
            **CHAOS_TIMINGS,  # type: ignore[arg-type]
        )
        knobs = scenario.fault_knobs(seed, light=provider_faults)
        scenario.configure_faults(sandbox.admin, knobs)
        port = api_port(rng)
        signing_secret = secrets.token_hex(16)
        hook_secret = new_secret()
        sandbox.admin.hook_inbox(
            scenario.HOOK_INBOX, fail_next=scenario.HOOK_FAILS, secret=hook_secret
        )
        hook_url = sandbox.admin.hook_url(scenario.HOOK_INBOX)
        key = asyncio.run(
            _setup(chaos_settings, sandbox.url, signing_secret, hook_url, hook_secret)
        )
        scenario.connect_people(sandbox.admin, f"http://127.0.0.1:{port}", signing_secret, key)
        chaos = _Chaos(
            chaos_settings,
            url,
            admin_url,
            sandbox,
            report,
            runs=runs,
            kills_per_point=kills_per_point,
            workers=workers,
            out=out,
            rng=rng,
            log_dir=logs,
            time_limit=limit,
            db_faults=db_faults,
            skew_clock=skew_clock,
            duplicate_wakes=duplicate_wakes,
            knobs=knobs,
            api_port=port,
            api_key=key,
        )
        try:
            chaos.run()
            # the doctor while the workers still run, once a sweeper leads again (a leader
            # killed at the end leaves the election open for one lease)
            chaos.wait_for_leader(timeout=15.0)
            with contextlib.suppress(Exception):
                report.doctor = asyncio.run(_doctor(chaos_settings))
        finally:
            chaos.stop_all()
            _clean_redis(chaos_settings)
        chaos.people.fill(report)
        lost, expected = _db_figures(url, chaos_settings.org_id, report, chaos.before_erasure)
        report.lost = len(lost) + max(0, runs - report.started)
        report.lost_runs = sorted(lost)[:20]
        ledger = sandbox.admin.ledger()
        _ledger_figures(ledger, report, expected)
        _cancel_figures(url, chaos_settings.org_id, chaos.cancels, ledger, report)
        _migration_figures(url, chaos_settings.org_id, chaos.operation_id, report)
        _erasure_figures(url, chaos_settings.org_id, chaos.erasing, report)
        hooks = sandbox.admin.hook_received(scenario.HOOK_INBOX)
        _notify_figures(url, chaos_settings.org_id, hooks, report)
    report.elapsed_s = chaos.elapsed()
    if keep_logs or not own_logs or not report.ok or report.unexpected_exits:
        report.log_dir = str(logs)
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return report
