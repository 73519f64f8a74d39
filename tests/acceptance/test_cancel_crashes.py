"""A cancel arrives while an outside effect is in flight, and the worker making the call is
SIGKILLed at each effect crash point (R12 with R4).

* ``effect.after_claim``: the effect is claimed, the provider never called; the worker dies,
  then the cancel arrives (the step is still ``running`` under the dead worker's lease).
* ``effect.after_call``: the cancel arrives while the call is at the provider (the sandbox
  answers after 1.5 s); the call returns and the worker dies before recording it.

A second worker rescues the step; its claim reads the cancel and, because the effect's outcome
is not recorded, runs the kind once more only to reconcile it: the effect claim refuses a new
attempt for a cancelled run, so the provider is searched, never called again. The run ends
``cancelled``; the sandbox's ledger shows no call that started after the cancel committed
except the one in flight (its effect was claimed before the cancel); the effect is settled
from the provider's record when the work happened (email, which can be searched), stays
``outcome_unknown`` when it did not, and goes to a person (``review``) for a provider that can
neither be searched nor deduplicate (payment) -- never claimed undone.
"""

from __future__ import annotations

import signal
from datetime import datetime
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import (
    attempts,
    effect_row,
    eventually,
    history,
    run_row,
    step_row,
    steps,
)
from tests.acceptance.conftest import Spawn

pytestmark = pytest.mark.acceptance

ORG = "test"

CASES = {
    # name: (provider, crash point, calls at the provider, the effect's status at the end)
    "email-after_claim": ("email", "effect.after_claim", 0, "outcome_unknown"),
    "email-after_call": ("email", "effect.after_call", 1, "settled"),
    "payment-after_call": ("payment", "effect.after_call", 1, "review"),
}


async def start_one(engine: Engine, sandbox: SandboxServer, provider: str, key: str) -> str:
    connection = {"email": "mailbox", "payment": "billing"}[provider]
    await engine.integrations.add_connection(
        ORG, connection, provider=provider, base_url=sandbox.url, account="acct_1", secret="acct_1"
    )
    if provider == "email":
        flow = Automation("cancel-send").step(
            "send",
            "email.send",
            connection="mailbox",
            to="maya@example.test",
            subject="s",
            body="b",
        )
    else:
        flow = Automation("cancel-charge").step(
            "send", "payment.charge", connection="billing", amount=4200, customer="cus_maya"
        )
    flow = flow.step("after", "set", values={"done": "true"})
    published = await engine.publish(flow.build())
    return (await engine.start(published.automation_id, {}, event_id=key)).run_id


def db_now(sql: psycopg.Connection[Any]) -> datetime:
    row = sql.execute("SELECT clock_timestamp() AS t").fetchone()
    assert row is not None
    t: datetime = row["t"]
    return t


@pytest.mark.parametrize("case", list(CASES))
async def test_a_cancel_during_an_effect_with_the_worker_killed_at_each_crash_point(
    case: str,
    engine: Engine,
    sql: psycopg.Connection[Any],
    admin: SandboxAdmin,
    sandbox: SandboxServer,
    spawn: Spawn,
) -> None:
    provider, crash_at, calls, effect_status = CASES[case]
    run_id = await start_one(engine, sandbox, provider, f"evt-{case}")
    key = f"{run_id}/send/1"
    if crash_at == "effect.after_call":
        admin.faults(provider, latency_ms=1500)  # the call stays open while the cancel comes

    a = spawn("proc-a", crash_at=crash_at, sweeper=False, lease=2.0, sweep=0.3)

    async def claimed() -> Any:
        return effect_row(sql, key)

    await eventually(claimed, interval=0.02, what="the effect claimed")
    if crash_at == "effect.after_claim":
        assert await a.exited() == -signal.SIGKILL, a.log_text()
    answer = await engine.cancel(run_id, by="ops", reason="withdrawn")
    committed = db_now(sql)  # the cancel's commit happened before this instant
    assert answer["outcome"] == "cancel_requested", answer
    if crash_at == "effect.after_call":
        assert await a.exited() == -signal.SIGKILL, a.log_text()
        admin.faults(provider)
    assert f"crash point {crash_at} reached" in a.log_text()
    requested_at = run_row(sql, run_id)["cancel_requested_at"]
    left = effect_row(sql, key)
    assert left is not None and (left["status"], left["attempts"]) == ("in_flight", 1), left
    assert left["last_attempt_at"] < requested_at  # the one call in flight was claimed before

    b = spawn("proc-b", sweeper=True, lease=2.0, sweep=0.3)
    assert await engine.wait(run_id, timeout=40) == "cancelled", b.log_text()

    # no provider call started after the cancel committed, except the one in flight
    entries = admin.ledger(provider)
    assert len(entries) == calls, entries
    effect = effect_row(sql, key)
    assert effect is not None
    assert (effect["status"], effect["attempts"]) == (effect_status, 1), effect
    assert effect["last_attempt_at"] < requested_at  # no attempt began after the cancel
    for entry in entries:
        assert entry["idempotency_key"] == key
        if entry["ts"] > committed.timestamp():  # done after the cancel committed: it must be
            assert effect["first_attempt_at"] < requested_at  # the call already in flight
    if effect_status == "settled":  # reconciled: found at the provider, recorded, not repeated
        assert effect["result"]["id"] == entries[0]["response_id"]
    elif effect_status == "outcome_unknown":  # reconciled: nothing found; never claimed undone
        assert effect["last_error"]["lapsed"] is True and effect["result"] is None

    # the run ended at the rescued step, by the second worker, without a successor
    assert [(s["step_id"], s["status"]) for s in steps(sql, run_id)] == [("send", "cancelled")]
    send = step_row(sql, run_id, 1)
    assert send["attempt"] == 2
    claims = [(e["attempt"], e["worker"]) for e in attempts(sql, run_id)]
    assert claims == [(1, "proc-a"), (2, "proc-b")]
    (ended,) = history(sql, run_id, "step_cancelled")
    assert ended["worker"] == "proc-b"
    (run_cancelled,) = history(sql, run_id, "run_cancelled")
    assert run_cancelled["worker"] == "proc-b"
    assert run_row(sql, run_id)["status"] == "cancelled"

    b.terminate()
    assert await b.exited() == 0, b.log_text()
    assert len(admin.ledger(provider)) == calls  # nothing was still on its way
