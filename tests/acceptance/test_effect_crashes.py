"""A real worker process dies at the worst lines of an outside effect (R4), and another process
finishes the run without repeating the effect where it can be prevented.

The provider is the sandbox over real HTTP (its own process, so killing a worker cannot take it
down); its ledger is the record of the work it really did. The worker is a real onward process
(``python -m onward.testing.worker``, lease 2 s, sweep 0.3 s) with ``ONWARD_CRASH_AT`` in its
environment (SIGKILL at that line), or killed by the test with SIGKILL while the provider call
is open:

* before the call (``effect.after_claim``): effect row in_flight, the provider never called;
* during the call, before the provider acted (sandbox latency; killed once the effect's own
  heartbeat proves the request is out), and during the call after the provider acted
  (``hang_after_work``; killed once the ledger shows the work);
* after the call, before the settle (``effect.after_call``);
* after the effect settled, before the step did (``worker.before_settle``): the replay reads the
  recorded result -- and must still record it as sent if the contact unsubscribed meanwhile.

For the email provider (idempotency key + search by metadata) the second process reconciles or
repeats the same key: the ledger holds EXACTLY ONE message for the effect key every time. For
the payment provider (neither) an unknown outcome parks the step for a person ('review') with
what is known, and the ledger holds at most one charge.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import (
    Process,
    effect_row,
    eventually,
    history,
    run_row,
    step_row,
)
from onward.testing import attempts as step_attempts  # `attempts` names a parameter here
from tests.acceptance.conftest import Spawn

pytestmark = pytest.mark.acceptance

ORG = "test"  # the `settings` fixture's organisation: the test's engine starts runs there
MAYA = "maya@example.test"


# -- worker processes ---------------------------------------------------------------------------
@pytest.fixture
def effect_worker(spawn: Spawn) -> Spawn:
    """``effect_worker(name, crash_at=, sweeper=True)``: a worker + relay (+ sweeper) process
    with a 2 s lease (the effect lease is the same), reaped at teardown."""

    def start(name: str, *, crash_at: str | None = None, sweeper: bool = True) -> Process:
        return spawn(name, crash_at=crash_at, sweeper=sweeper, lease=2.0, sweep=0.3)

    return start


def effect_history(sql: psycopg.Connection, run_id: str) -> list[dict]:
    """The run's effect rows (issue 15), oldest first."""
    return [dict(e) for e in history(sql, run_id) if e["event"].startswith("effect_")]


# -- the provider (the ``sandbox`` and ``admin`` fixtures: tests/conftest.py) --------------------
async def start_one(
    engine: Engine, sandbox: SandboxServer, provider: str, event_id: str
) -> tuple[str, str]:
    """Connect the provider, publish a one-effect automation, start a run; (run_id, key)."""
    connection = {"email": "mailbox", "payment": "billing"}[provider]
    await engine.integrations.add_connection(
        ORG, connection, provider=provider, base_url=sandbox.url, account="acct_1", secret="acct_1"
    )
    if provider == "email":
        flow = Automation("send-once").step(
            "send",
            "email.send",
            connection="mailbox",
            to=MAYA,
            subject="Your follow-up",
            body="Hi {input.name}",
        )
    else:
        flow = Automation("charge-once").step(
            "send", "payment.charge", connection="billing", amount=4200, customer="cus_maya"
        )
    flow = flow.step("after", "set", values={"done": "true"})
    published = await engine.publish(flow.build())
    started = await engine.start(published.automation_id, {"name": "Maya"}, event_id=event_id)
    return started.run_id, f"{started.run_id}/send/1"


async def kill_on(
    worker: Process, check: Callable[[], bool], what: str, timeout: float = 20.0
) -> None:
    """SIGKILL ``worker`` as soon as ``check()`` holds (polled, the worker must stay alive)."""

    async def ready() -> bool:
        assert worker.alive(), f"{worker.name} exited early:\n{worker.log_text()}"
        return check()

    await eventually(ready, timeout=timeout, interval=0.02, what=what)
    worker.kill()


# -- email: exactly one message, whatever line the worker died on ---------------------------
EMAIL_CASES = {
    # name: (crash point armed in proc-a, effect attempts once the run completes)
    "before_call": ("effect.after_claim", 2),  # nothing to find: a new attempt, same key
    # the request is at the provider, which has not acted yet: 1 if it still acts after the
    # caller died (reconciled), 2 if it drops a departed caller's request (the sandbox does)
    "during_call_before_work": (None, None),
    "during_call_after_work": (None, 1),  # the provider acted; the answer never came
    "after_call": ("effect.after_call", 1),  # the answer came; the settle never happened
    # the effect is settled, the step is not: the replay reads the recorded result
    "after_effect_settled": ("worker.before_settle", 1),
}


@pytest.mark.parametrize("case", list(EMAIL_CASES))
async def test_email_is_sent_exactly_once_whatever_line_the_worker_dies_on(
    case: str,
    engine: Engine,
    sql: psycopg.Connection,
    admin: SandboxAdmin,
    sandbox: SandboxServer,
    effect_worker: Spawn,
) -> None:
    crash_at, attempts = EMAIL_CASES[case]
    if case == "during_call_before_work":
        # longer than the effect heartbeat interval (lease 2 s / 3), shorter than the lease
        admin.faults("email", latency_ms=1500)
    elif case == "during_call_after_work":
        admin.faults("email", script=["hang_after_work"], hang_s=30)
    run_id, key = await start_one(engine, sandbox, "email", f"evt-{case}")

    a = effect_worker("proc-a", crash_at=crash_at, sweeper=False)
    if crash_at is not None:
        assert await a.exited() == -signal.SIGKILL, a.log_text()
        assert f"crash point {crash_at} reached" in a.log_text()
    elif case == "during_call_before_work":
        # the effect's own heartbeat has extended its lease: the call has been open for a
        # third of the lease, so the request is at the provider (inside its latency)
        def call_open() -> bool:
            row = sql.execute(
                "SELECT 1 FROM effects WHERE org_id = %s AND effect_key = %s"
                " AND status = 'in_flight'"
                " AND lease_until > first_attempt_at + interval '2.3 seconds'",
                (ORG, key),
            ).fetchone()
            return row is not None

        await kill_on(a, call_open, "the effect call to be open")
        assert await a.exited() == -signal.SIGKILL
        assert admin.ledger("email") == [], "killed too late: the provider had already acted"
        admin.faults("email")  # back to no latency for everything after the kill
    else:
        await kill_on(a, lambda: len(admin.ledger("email")) == 1, "the provider to act")
        assert await a.exited() == -signal.SIGKILL

    # the worst line: from the database, "never called" and "done, not recorded" look the same
    left = effect_row(sql, key)
    assert left is not None
    if case == "after_effect_settled":
        assert (left["status"], left["attempts"]) == ("settled", 1), left
    else:
        assert (left["status"], left["attempts"], left["result"]) == ("in_flight", 1, None), left
    step = step_row(sql, run_id, 1)
    assert (step["status"], step["attempt"], step["owner"]) == ("running", 1, "proc-a"), step
    # the timeline holds exactly the effect transitions that committed (each row is written by
    # its transition's own statement): the claim, and the settle when it happened
    at_crash = [(e["event"], e["worker"]) for e in effect_history(sql, run_id)]
    if case == "after_effect_settled":
        assert at_crash == [("effect_claimed", "proc-a"), ("effect_settled", "proc-a")]
    else:
        assert at_crash == [("effect_claimed", "proc-a")]
    if case == "before_call":
        assert admin.ledger("email") == []
    elif case != "during_call_before_work":
        assert len(admin.ledger("email")) == 1

    b = effect_worker("proc-b")
    assert await engine.wait(run_id, timeout=40) == "completed", b.log_text()

    [entry] = admin.ledger("email")
    assert entry["idempotency_key"] == key
    assert entry["metadata"]["effect_key"] == key
    assert entry["request"]["to"] == MAYA
    done = effect_row(sql, key)
    assert done is not None
    assert done["status"] == "settled"
    assert attempts is None or done["attempts"] == attempts, done
    assert done["result"]["id"] == entry["response_id"]
    send = step_row(sql, run_id, 1)
    assert (send["status"], send["attempt"]) == ("done", 2), send
    assert send["output"]["message_id"] == entry["response_id"]
    claims = [(e["attempt"], e["worker"]) for e in step_attempts(sql, run_id, seq=1)]
    assert claims == [(1, "proc-a"), (2, "proc-b")]
    assert len(history(sql, run_id, "lease_expired")) == 1
    assert [e["worker"] for e in history(sql, run_id, "step_done") if e["seq"] == 1] == ["proc-b"]
    # every attempt of the effect claimed it on the timeline, and its last row is its outcome
    rows = effect_history(sql, run_id)
    assert len([e for e in rows if e["event"] == "effect_claimed"]) == done["attempts"], rows
    assert rows[-1]["event"] in ("effect_settled", "effect_reconciled"), rows
    assert rows[-1]["detail"]["reference"] == entry["response_id"]
    if case != "after_effect_settled":  # proc-b found the lapsed effect lease first
        assert ("effect_unknown", "proc-b") in [(e["event"], e["worker"]) for e in rows], rows

    b.terminate()
    assert await b.exited() == 0, b.log_text()
    assert len(admin.ledger("email")) == 1  # nothing was still on its way


# -- payment: no idempotency, no search -> a person decides -----------------------------------
@pytest.mark.parametrize(
    ("crash_at", "charges"), [("effect.after_claim", 0), ("effect.after_call", 1)]
)
async def test_payment_with_unknown_outcome_parks_for_review_and_never_charges_twice(
    crash_at: str,
    charges: int,
    engine: Engine,
    sql: psycopg.Connection,
    admin: SandboxAdmin,
    sandbox: SandboxServer,
    effect_worker: Spawn,
) -> None:
    run_id, key = await start_one(engine, sandbox, "payment", f"evt-{crash_at}")

    a = effect_worker("proc-a", crash_at=crash_at, sweeper=False)
    assert await a.exited() == -signal.SIGKILL, a.log_text()
    assert len(admin.ledger("payment")) == charges
    left = effect_row(sql, key)
    assert left is not None and (left["status"], left["attempts"]) == ("in_flight", 1), left

    t0 = time.monotonic()
    b = effect_worker("proc-b")
    assert await engine.wait(run_id, timeout=40) == "parked", b.log_text()
    assert time.monotonic() - t0 < 30

    run = run_row(sql, run_id)
    assert run["status"] == "parked"
    assert key in run["status_reason"], run
    step = step_row(sql, run_id, 1)
    assert (step["status"], step["wait_kind"], step["attempt"]) == ("parked", "review", 2), step
    assert step["error"]["type"] == "NeedsReview"
    known = step["error"]["detail"]
    assert known["effect_key"] == key
    assert known["provider"] == "payment"
    assert known["attempts"] == 1
    assert known["first_attempt_at"] not in (None, "None")
    effect = effect_row(sql, key)
    assert effect is not None
    assert (effect["status"], effect["attempts"], effect["result"]) == ("review", 1, None)
    assert effect["lease_until"] is None
    (parked,) = history(sql, run_id, "step_parked")
    assert (parked["attempt"], parked["worker"]) == (2, "proc-b")
    assert parked["detail"]["detail"]["effect_key"] == key
    (run_parked,) = history(sql, run_id, "run_parked")
    assert key in run_parked["detail"]["reason"]
    assert history(sql, run_id, "step_done", "run_completed") == []
    assert step_row(sql, run_id, 1)["status"] == "parked"

    b.terminate()
    assert await b.exited() == 0, b.log_text()
    entries = admin.ledger("payment")
    assert len(entries) == charges  # at most one charge, ever
    assert all(e["idempotency_key"] == key for e in entries)


async def test_an_unsubscribe_after_the_email_went_out_does_not_rewrite_what_happened(
    engine: Engine,
    sql: psycopg.Connection,
    admin: SandboxAdmin,
    sandbox: SandboxServer,
    effect_worker: Spawn,
) -> None:
    """The send step's effect is settled (the message is out), then the worker dies before the
    step is; Maya unsubscribes before the step runs again. The replay must record the send
    that happened (the effect's result), not claim the email was skipped for consent."""
    run_id, key = await start_one(engine, sandbox, "email", "evt-sent-then-unsubscribed")
    a = effect_worker("proc-a", crash_at="worker.before_settle", sweeper=False)
    assert await a.exited() == -signal.SIGKILL, a.log_text()
    [entry] = admin.ledger("email")
    sent = effect_row(sql, key)
    assert sent is not None and sent["status"] == "settled"

    await engine.integrations.suppress(ORG, MAYA, "unsubscribed")
    b = effect_worker("proc-b")
    assert await engine.wait(run_id, timeout=40) == "completed", b.log_text()

    assert len(admin.ledger("email")) == 1
    send = step_row(sql, run_id, 1)
    assert (send["status"], send["output"].get("sent")) == ("done", True), send
    assert send["output"]["message_id"] == entry["response_id"]
    assert history(sql, run_id, "step_skipped") == []
