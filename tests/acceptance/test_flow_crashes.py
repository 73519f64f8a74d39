"""Flow control survives a crash at each of its transitions (R5): a real worker (or the elected
sweeper) is SIGKILLed at the crash points of the circuit breakers and the cost budgets, and the
next process finishes every run without a provider call made twice and without a budget spent
twice.

* ``circuit.after_open`` -- the failure that opened the circuit is committed, the step is not
  parked: the rescue parks it without calling the provider (and without spending an attempt),
  and the cool-down's probe completes it.
* ``circuit.after_half_open`` -- the sweeper half-opened the circuit and made its probe ready,
  then died: the probe (``ready``, with its outbox wake) is taken by the next worker, closes the
  circuit, and every parked run completes.
* ``circuit.before_close`` -- the probe's call succeeded (its effect settled), the circuit is
  still half-open: the rescue runs the probe again without a second provider call, and that
  closes the circuit and resumes every parked step.
* ``budget.after_reserve`` -- a model call's maximum cost is reserved, the call not made: the
  reservation stops counting when its lease lapses (``Settings.budget_lease_seconds``, 120 s by
  default, shortened here through the worker's ``--config``), and the run completes, charged
  once.

The providers are the sandbox over real HTTP (its own process); its ledger records the work it
really did, and the remaining fault script counts the requests that reached it. The workers
are ``python -m onward.testing.worker`` processes (tests/acceptance/procs.py).
"""

from __future__ import annotations

import signal
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import (
    Process,
    Processes,
    attempts,
    effect_row,
    eventually,
    history,
    process_env,
    run_row,
    step_row,
)
from onward.testing.worker import settings_to_json, worker_argv
from tests.acceptance.conftest import Spawn
from tests.acceptance.procs import KINDS, worker_settings

pytestmark = pytest.mark.acceptance

ORG = "test"  # the `settings` fixture's organisation: the test's engine starts runs there
KILLED = -signal.SIGKILL
FAST_RETRY = {"max_attempts": 10, "base": 0.05, "cap": 0.1}

Sql = psycopg.Connection[dict[str, Any]]


# -- set-up ---------------------------------------------------------------------------------------
async def connect(engine: Engine, sandbox: SandboxServer, connection: str, provider: str) -> None:
    await engine.integrations.add_connection(
        ORG, connection, provider=provider, base_url=sandbox.url, account="acct_1", secret="acct_1"
    )


async def breakers(
    engine: Engine, connection: str, provider: str, *, threshold: int, cooldown: float
) -> tuple[str, str]:
    """Configure both circuits a call goes through (the connection's and the provider's: each
    counts every failure); (connection key, provider key)."""
    keys = (f"connection:{connection}", f"provider:{provider}")
    for key in keys:
        await engine.configure_circuit(
            key, threshold=threshold, window_seconds=60, cooldown_seconds=cooldown
        )
    return keys


def circuit(sql: Sql, key: str) -> dict[str, Any]:
    row = sql.execute(
        "SELECT *, retry_at > now() AS cooling FROM circuits WHERE org_id = %s AND key = %s",
        (ORG, key),
    ).fetchone()
    assert row is not None, f"no circuit {key}"
    return row


def statuses(sql: Sql, run_ids: list[str]) -> dict[str, str]:
    rows = sql.execute(
        "SELECT run_id, status FROM runs WHERE run_id = ANY(%s)", (run_ids,)
    ).fetchall()
    return {r["run_id"]: r["status"] for r in rows}


async def park_on_the_circuit(
    engine: Engine, sql: Sql, automation: str, n: int, tag: str, conn_key: str
) -> list[str]:
    """Start ``n`` runs whose calls fail: the first one's failures open both circuits, then the
    others park on the connection's circuit (the first not closed, by key) without a call. One
    run first, so that every step parks on the same circuit: when concurrent failures open the
    two circuits from two different steps, each circuit picks its own probe among its parked
    steps, and the two probes (each through both circuits) refuse each other for ever."""
    [first] = await start_runs(engine, automation, 1, tag)
    await all_parked_on_circuits(sql, [first])
    runs = [first, *await start_runs(engine, automation, n - 1, f"{tag}-more")]
    await all_parked_on_circuits(sql, runs)
    parked_on = sql.execute(
        "SELECT DISTINCT error->>'circuit' AS circuit FROM steps WHERE run_id = ANY(%s)"
        " AND status = 'parked'",
        (runs,),
    ).fetchall()
    assert parked_on == [{"circuit": conn_key}]
    return runs


async def all_parked_on_circuits(sql: Sql, run_ids: list[str]) -> None:
    async def parked() -> bool:
        rows = sql.execute(
            "SELECT s.wait_kind FROM runs r JOIN steps s ON s.org_id = r.org_id"
            " AND s.run_id = r.run_id AND s.seq = r.current_seq"
            " WHERE r.run_id = ANY(%s) AND r.status = 'parked' AND s.status = 'parked'",
            (run_ids,),
        ).fetchall()
        return len(rows) == len(run_ids) and {r["wait_kind"] for r in rows} == {"circuit"}

    await eventually(parked, timeout=30, what="every run parked on the circuit")


def script_left(admin: SandboxAdmin, provider: str) -> list[str]:
    """What is left of the provider's fault script: one entry is taken per request."""
    return list(admin.fault_state()["providers"][provider]["script_remaining"])


def keys_in_ledger(admin: SandboxAdmin, provider: str) -> list[str]:
    return sorted(e["idempotency_key"] for e in admin.ledger(provider))


def died_at(proc: Process, point: str) -> None:
    assert proc.printed(f"onward: crash point {point} reached, SIGKILL"), proc.log_text()


async def start_runs(engine: Engine, automation: str, n: int, tag: str) -> list[str]:
    return [
        (await engine.start(automation, {"id": f"{tag}{i}"}, event_id=f"{tag}-{i}")).run_id
        for i in range(n)
    ]


def email_flow() -> dict[str, Any]:
    return (
        Automation("mail")
        .step(
            "send",
            "email.send",
            connection="mailbox",
            to="{input.id}@example.test",
            subject="Following up",
            body="Hello",
            retry=FAST_RETRY,
        )
        .step("after", "set", values={"done": "true"})
        .build()
    )


def crm_flow() -> dict[str, Any]:
    return (
        Automation("upsert")
        .step(
            "crm",
            "crm.upsert",
            connection="crm",
            external_id="{input.id}",
            fields={"stage": "contacted"},
            retry=FAST_RETRY,
        )
        .step("after", "set", values={"done": "true"})
        .build()
    )


# -- circuit.after_open ---------------------------------------------------------------------------
async def test_a_worker_killed_after_a_failure_opened_the_circuit_loses_nothing(
    engine: Engine, sql: Sql, admin: SandboxAdmin, sandbox: SandboxServer, spawn: Spawn
) -> None:
    """The third 503 opens both circuits (threshold 3) and the worker dies before parking its
    step. The rescue parks it with no request to the provider and no attempt spent; once the
    provider is well, the cool-down's probe completes the run with one message."""
    await connect(engine, sandbox, "mailbox", "email")
    conn_key, provider_key = await breakers(engine, "mailbox", "email", threshold=3, cooldown=8)
    # three 503s open the circuits; two more would show any request after that
    admin.faults("email", script=["503"] * 5)
    await engine.publish(email_flow())
    [run_id] = await start_runs(engine, "mail", 1, "open")
    key = f"{run_id}/send/1"

    a = spawn("proc-a", crash_at="circuit.after_open", sweeper=False, lease=2.0)
    assert await a.exited(timeout=30) == KILLED, a.log_text()
    died_at(a, "circuit.after_open")

    # the circuits are open (the failure that opened them is committed) ...
    for key_ in (conn_key, provider_key):
        row = circuit(sql, key_)
        assert (row["state"], row["failures"], row["cooling"]) == ("open", 3, True), row
    opened = history(sql, run_id, "circuit_opened")
    assert sorted(h["detail"]["circuit"] for h in opened) == [conn_key, provider_key]
    assert all(h["detail"]["failures"] == 3 and h["worker"] == "proc-a" for h in opened)
    # ... and the step is not parked: still running under the dead worker's lease
    step = step_row(sql, run_id, 1)
    assert (step["status"], step["owner"], step["attempt"], step["failures"]) == (
        "running",
        "proc-a",
        3,
        2,
    ), step
    assert script_left(admin, "email") == ["503", "503"]
    assert admin.ledger("email") == []

    b = spawn("proc-b", sweeper=True, lease=2.0, sweep=0.2)

    async def parked() -> bool:
        return bool(step_row(sql, run_id, 1)["status"] == "parked")

    await eventually(parked, timeout=20, what="the rescued step to park")
    step = step_row(sql, run_id, 1)
    assert step["wait_kind"] == "circuit" and step["error"]["circuit"] == conn_key, step
    assert run_row(sql, run_id)["status"] == "parked"
    # no request reached the provider (the script is untouched) and no work was done
    assert script_left(admin, "email") == ["503", "503"]
    assert admin.ledger("email") == []
    # no attempt spent by the park: the one failure added is the dead worker's lapsed lease
    assert step["failures"] == 3, step
    after_death = [
        (h["event"], h["attempt"], h["worker"])
        for h in history(sql, run_id, "lease_expired", "step_retry", "step_parked")
        if h["event"] == "lease_expired" or (h["attempt"] or 0) > 3
    ]
    assert after_death == [
        ("lease_expired", 3, "proc-b"),  # the rescue by proc-b's sweeper
        ("step_parked", 4, "proc-b"),  # attempt 4, claimed by proc-b
    ], after_death
    assert circuit(sql, conn_key)["state"] == "open"  # the cool-down is not over yet

    admin.faults("email")  # the provider is well again
    assert await engine.wait(run_id, timeout=40, or_parked=False) == "completed", b.log_text()
    assert keys_in_ledger(admin, "email") == [key]  # one message, by the probe
    # one probe per circuit the step parked on: the connection's, and under load the
    # provider's too when its cool-down also ended first -- never a second probe of one circuit
    probes = [h["detail"] for h in history(sql, run_id, "circuit_half_open")]
    assert {"circuit": conn_key, "probe": True} in probes, probes
    assert len(probes) == len({p["circuit"] for p in probes}) <= 2, probes
    assert all(p["circuit"] in (conn_key, provider_key) and p["probe"] for p in probes), probes
    assert {circuit(sql, k)["state"] for k in (conn_key, provider_key)} == {"closed"}
    done = step_row(sql, run_id, 1)
    assert (done["status"], done["failures"]) == ("done", 3), done
    settled = effect_row(sql, key)
    assert settled is not None and settled["status"] == "settled"


# -- circuit.after_half_open ---------------------------------------------------------------------
async def test_a_sweeper_killed_after_half_opening_leaves_a_ready_probe_that_closes_it(
    engine: Engine,
    sql: Sql,
    admin: SandboxAdmin,
    sandbox: SandboxServer,
    spawn: Spawn,
) -> None:
    """Three runs park on the circuit; the sweeper half-opens it, makes the longest-parked
    step ready as its probe and dies. The probe is durable (ready, with its outbox wake): the
    next worker runs it, the circuit closes and every parked run completes, each email sent
    once."""
    await connect(engine, sandbox, "mailbox", "email")
    conn_key, provider_key = await breakers(engine, "mailbox", "email", threshold=2, cooldown=2)
    admin.faults("email", error_rate=1.0)
    await engine.publish(email_flow())

    a = spawn("proc-a", sweeper=False)  # no sweeper: nothing half-opens while it works
    runs = await park_on_the_circuit(engine, sql, "mail", 3, "half", conn_key)
    a.terminate()
    assert await a.exited() == 0, a.log_text()
    admin.faults("email")  # the provider is well again
    # the longest parked step is the probe the sweeper will pick
    first = sql.execute(
        "SELECT run_id, seq FROM steps WHERE run_id = ANY(%s) AND status = 'parked'"
        " AND error->>'circuit' = %s ORDER BY updated_at LIMIT 1",
        (runs, conn_key),
    ).fetchone()
    assert first is not None

    async def both_due() -> Any:  # so the sweeper half-opens both in its one statement
        return sql.execute(
            "SELECT count(*) = 2 AS due FROM circuits WHERE key = ANY(%s) AND state = 'open'"
            " AND retry_at <= now()",
            ([conn_key, provider_key],),
        ).fetchone()["due"]

    await eventually(both_due, timeout=30, what="both circuits' cool-downs to pass")
    s = spawn(
        "sweeper-s",
        crash_at="circuit.after_half_open",
        worker=False,
        relay=False,
        sweeper=True,
        leader_ttl=2.0,
    )
    assert await s.exited(timeout=30) == KILLED, s.log_text()
    died_at(s, "circuit.after_half_open")

    probe_run = first["run_id"]
    row = circuit(sql, conn_key)
    assert (row["state"], row["probe_run_id"], row["probe_seq"]) == (
        "half_open",
        probe_run,
        first["seq"],
    ), row
    # the provider's circuit had no step parked on it: half-open, its probe the next call
    other = circuit(sql, provider_key)
    assert (other["state"], other["probe_run_id"]) == ("half_open", None), other
    probe = step_row(sql, probe_run, first["seq"])
    assert (probe["status"], probe["owner"], probe["wait_kind"]) == ("ready", None, None), probe
    assert probe["wake"] == {"by": "circuit_probe", "circuit": conn_key}
    assert run_row(sql, probe_run)["status"] == "active"
    wake = sql.execute(
        "SELECT sent_at FROM outbox WHERE topic = 'step' AND payload->>'run_id' = %s"
        " AND (payload->>'seq')::int = %s AND job_id = onward_step_wake_id(%s, %s, %s)",
        (probe_run, first["seq"], probe_run, first["seq"], probe["attempt"] + 1),
    ).fetchall()
    assert wake == [{"sent_at": None}]  # its wake, not yet published
    [half] = history(sql, probe_run, "circuit_half_open")
    assert half["worker"] == "sweeper-s"
    others = [r for r in runs if r != probe_run]
    assert statuses(sql, others) == dict.fromkeys(others, "parked")
    assert admin.ledger("email") == []

    b = spawn("proc-b", sweeper=True)
    for run_id in runs:
        assert await engine.wait(run_id, timeout=40, or_parked=False) == "completed", b.log_text()
    assert keys_in_ledger(admin, "email") == sorted(f"{r}/send/1" for r in runs)
    assert {circuit(sql, k)["state"] for k in (conn_key, provider_key)} == {"closed"}
    # the probe the dead sweeper made ready was the only one; its success resumed the others
    assert sum(len(history(sql, r, "circuit_half_open")) for r in runs) == 1
    closed = {r: [h["detail"]["circuit"] for h in history(sql, r, "circuit_closed")] for r in runs}
    assert closed == {probe_run: [], **{r: [conn_key] for r in others}}


# -- circuit.before_close ------------------------------------------------------------------------
async def test_a_worker_killed_after_the_probe_succeeded_closes_the_circuit_on_the_rescue(
    engine: Engine,
    sql: Sql,
    admin: SandboxAdmin,
    sandbox: SandboxServer,
    spawn: Spawn,
) -> None:
    """The probe's upsert is done and its effect settled; the worker dies before closing the
    circuit. The rescue runs the probe again: its settled effect answers without a second
    call, its success closes the circuit, and every parked step resumes."""
    await connect(engine, sandbox, "crm", "crm")
    conn_key, provider_key = await breakers(engine, "crm", "crm", threshold=2, cooldown=1)
    admin.faults("crm", error_rate=1.0)
    await engine.publish(crm_flow())

    a = spawn("proc-a", sweeper=False)  # no sweeper: nothing half-opens while it works
    runs = await park_on_the_circuit(engine, sql, "upsert", 3, "close", conn_key)
    a.terminate()
    assert await a.exited() == 0, a.log_text()
    admin.faults("crm")  # the provider is well again

    p = spawn("proc-p", crash_at="circuit.before_close", sweeper=True, lease=2.0, sweep=0.2)
    assert await p.exited(timeout=30) == KILLED, p.log_text()
    died_at(p, "circuit.before_close")

    row = circuit(sql, conn_key)
    assert row["state"] == "half_open" and row["probe_run_id"] in runs, row
    probe_run, probe_seq = row["probe_run_id"], row["probe_seq"]
    # the probe took the provider's circuit too (it had no parked step of its own)
    other = circuit(sql, provider_key)
    assert (other["state"], other["probe_run_id"], other["probe_seq"]) == (
        "half_open",
        probe_run,
        probe_seq,
    ), other
    probe_key = f"{probe_run}/crm/1"
    settled = effect_row(sql, probe_key)
    assert settled is not None and (settled["status"], settled["attempts"]) == ("settled", 1)
    assert keys_in_ledger(admin, "crm") == [probe_key]
    probe = step_row(sql, probe_run, probe_seq)
    assert (probe["status"], probe["owner"]) == ("running", "proc-p"), probe
    others = [r for r in runs if r != probe_run]
    assert statuses(sql, others) == dict.fromkeys(others, "parked")

    b = spawn("proc-b", sweeper=True, lease=2.0, sweep=0.2)
    for run_id in runs:
        assert await engine.wait(run_id, timeout=40, or_parked=False) == "completed", b.log_text()
    # the probe's upsert was not made again; every other run's was made once
    assert keys_in_ledger(admin, "crm") == sorted(f"{r}/crm/1" for r in runs)
    again = effect_row(sql, probe_key)
    assert again is not None and (again["status"], again["attempts"]) == ("settled", 1)
    claims = [h["worker"] for h in attempts(sql, probe_run, seq=probe_seq)]
    assert claims[-2:] == ["proc-p", "proc-b"], claims
    # the rescued probe closed the circuits and resumed the steps parked on them: one probe per
    # circuit that had steps parked on it (under load a step can park on the provider's circuit
    # too, which then half-opens with its own probe), never a second probe of one circuit
    assert {circuit(sql, k)["state"] for k in (conn_key, provider_key)} == {"closed"}
    assert 1 <= sum(len(history(sql, r, "circuit_half_open")) for r in runs) <= 2
    closed = {r: [h["worker"] for h in history(sql, r, "circuit_closed")] for r in runs}
    assert closed == {probe_run: [], **{r: ["proc-b"] for r in others}}


# -- budget.after_reserve ------------------------------------------------------------------------
PROMPT = "Write hello"  # 11 characters: 3 tokens in, as the model connector estimates
MAX_TOKENS = 60
MOST = 3 + MAX_TOKENS  # a call's maximum cost in tokens, reserved before it is made
BUDGET = 100  # one reservation fits, two do not; a charge (at most 3 + 31) and one do
RESERVATION_LEASE = 5.0


def budget_worker(
    processes: Processes, db_url: str, name: str, *, crash_at: str, reservation_lease: float
) -> Process:
    """A worker process whose cost reservations have a short lease: the setting
    ``budget_lease_seconds`` in its ``--config`` (the test worker passes only its timings)."""
    settings = worker_settings(db_url, lease=2.0)
    argv = worker_argv(settings, name, kinds=KINDS, sweeper=False)
    argv[argv.index("--config") + 1] = settings_to_json(
        settings, budget_lease_seconds=reservation_lease
    )
    return processes.start(argv, name, env=process_env(crash_at=crash_at))


def reservations(sql: Sql) -> list[dict[str, Any]]:
    return list(
        sql.execute(
            "SELECT effect_key, scope, unit, amount, lease_until > now() AS live"
            " FROM budget_reservations ORDER BY effect_key"
        ).fetchall()
    )


async def test_a_worker_killed_after_reserving_a_cost_leaks_no_budget_and_charges_once(
    engine: Engine,
    sql: Sql,
    admin: SandboxAdmin,
    sandbox: SandboxServer,
    db_url: str,
    processes: Processes,
    spawn: Spawn,
) -> None:
    """The worker dies between reserving a model call's maximum cost and making the call. The
    reservation counts until its lease lapses, then no longer: a second call, which would not
    fit beside it, goes through. The first run is rescued and completes, charged once."""
    await connect(engine, sandbox, "model", "model")
    await engine.set_budget("*", "tokens", BUDGET)
    flow = Automation("draft").step(
        "draft", "model.generate", connection="model", prompt=PROMPT, max_tokens=MAX_TOKENS
    )
    await engine.publish(flow.build())
    [first] = await start_runs(engine, "draft", 1, "budget")
    first_key = f"{first}/draft/1"

    a = budget_worker(
        processes,
        db_url,
        "proc-a",
        crash_at="budget.after_reserve",
        reservation_lease=RESERVATION_LEASE,
    )
    assert await a.exited(timeout=30) == KILLED, a.log_text()
    died_at(a, "budget.after_reserve")

    # the reservation is committed and counts; the call was not made
    assert reservations(sql) == [
        {"effect_key": first_key, "scope": "*", "unit": "tokens", "amount": MOST, "live": True}
    ]
    [budget] = await engine.budgets()
    assert (budget["charged_today"], budget["reserved"]) == (0, MOST), budget
    assert admin.ledger("model") == []
    assert step_row(sql, first, 1)["status"] == "running"

    async def lapsed() -> bool:
        [row] = await engine.budgets()
        return bool(row["reserved"] == 0)

    await eventually(lapsed, timeout=RESERVATION_LEASE + 10, what="the reservation to lapse")
    assert [r["live"] for r in reservations(sql)] == [False]  # still there, no longer counted

    # a second call fits now (two maximum costs would not): no sweeper yet, so the first run
    # stays with the dead worker while the second one runs
    [second] = await start_runs(engine, "draft", 1, "later")
    b = spawn("proc-b", sweeper=False, lease=2.0)
    assert await engine.wait(second, timeout=30) == "completed", b.log_text()
    assert step_row(sql, first, 1)["status"] == "running"
    assert history(sql, second, "step_parked") == []

    # the rescue: the first run reserves again under its effect key and completes
    s = spawn("sweeper-s", worker=False, relay=False, sweeper=True, leader_ttl=2.0)
    assert await engine.wait(first, timeout=30) == "completed", s.log_text()

    assert keys_in_ledger(admin, "model") == sorted([first_key, f"{second}/draft/1"])
    spent = {}
    for run_id in (first, second):
        out = step_row(sql, run_id, 1)["output"]
        spent[f"{run_id}/draft/1"] = Decimal(out["tokens_in"] + out["tokens_out"])
    charges = sql.execute(
        "SELECT effect_key, scope, unit, amount FROM budget_charges ORDER BY effect_key"
    ).fetchall()
    assert charges == [
        {"effect_key": k, "scope": "*", "unit": "tokens", "amount": v}
        for k, v in sorted(spent.items())
    ]
    [budget] = await engine.budgets()
    assert (budget["charged_today"], budget["reserved"]) == (sum(spent.values()), 0), budget
    assert reservations(sql) == []  # the charge released the first run's reservation
    assert [h["event"] for h in history(sql, first, "lease_expired", "step_done")] == [
        "lease_expired",
        "step_done",
    ]
