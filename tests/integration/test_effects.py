"""Outside effects through the engine (R4, R14, R15) against the real sandbox over HTTP.

* Two attempts racing on one effect never call the provider at the same time: the loser (or a
  replacement whose step lease was taken over) waits on the live effect lease and reads the
  winner's result. Every HTTP request is counted on the client, so an idempotent replay that the
  provider's ledger would hide still shows.
* A loop that really sends three emails sends three (the iteration is part of the key).
* Consent is checked at send time: an unsubscribe between enrolment and send skips the step, with
  the reason in the run's history.
* A revoked mailbox parks the run ("reconnect ..."), marks the connection broken and notifies the
  customer once; restoring it resumes the run from the same step, which sends once.
* Retries: 503 then ok, 429 with Retry-After (which wins over the backoff), and a response lost
  after the provider acted (reconciled: exactly one message).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from onward import Automation
from onward.automations.document import StepDef
from onward.connections import Integrations
from onward.effects import Effects
from onward.engine import Engine
from onward.errors import NeedsReview, OutcomeUnknown
from onward.kinds import StepContext
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import (
    attempts,
    effect_row,
    eventually,
    history,
    run_effects,
    run_row,
    steps,
)

ORG = "test"  # the `settings` fixture's organisation
MAYA = "maya@example.test"
SAM = "sam@example.test"


pytestmark = pytest.mark.usefixtures("admin")  # every test starts on a clean sandbox


async def connect(engine: Engine, sandbox: SandboxServer, connection: str, provider: str) -> None:
    await engine.integrations.add_connection(
        ORG, connection, provider=provider, base_url=sandbox.url, account="acct_1", secret="acct_1"
    )


@pytest.fixture
async def mailbox(engine: Engine, sandbox: SandboxServer) -> str:
    await connect(engine, sandbox, "mailbox", "email")
    return "mailbox"


def send_step(flow: Automation, step_id: str = "send", **changes: Any) -> Automation:
    params: dict[str, Any] = {
        "connection": "mailbox",
        "to": MAYA,
        "subject": "Your follow-up",
        "body": "Hi {input.name}",
        **changes,
    }
    return flow.step(step_id, "email.send", **params)


async def publish_send_once(engine: Engine, automation_id: str = "send-once") -> str:
    flow = send_step(Automation(automation_id)).step("after", "set", values={"done": "true"})
    published = await engine.publish(flow.build())
    return str(published.automation_id)


# -- rows --------------------------------------------------------------------------------------
def connection_row(sql: psycopg.Connection, connection: str) -> dict[str, Any]:
    row = sql.execute(
        "SELECT status, broken_reason, broken_at, checked_at FROM connections"
        " WHERE org_id = %s AND connection_id = %s",
        (ORG, connection),
    ).fetchone()
    assert row is not None
    return dict(row)


def notifications(sql: psycopg.Connection) -> list[dict[str, Any]]:
    rows = sql.execute(
        "SELECT kind, subject, body FROM notifications WHERE org_id = %s ORDER BY notification_id",
        (ORG,),
    ).fetchall()
    return [dict(r) for r in rows]


# -- 1. racing attempts never overlap a live effect lease -------------------------------------
class CountingClient:
    """A real ``httpx.AsyncClient`` that counts every request it sends, by method and path."""

    def __init__(self) -> None:
        self.sent: Counter[tuple[str, str]] = Counter()
        self.client = httpx.AsyncClient(event_hooks={"request": [self._count]})

    async def _count(self, request: httpx.Request) -> None:
        self.sent[(request.method, request.url.path)] += 1


@pytest.fixture
async def counting() -> AsyncIterator[CountingClient]:
    counter = CountingClient()
    yield counter
    await counter.client.aclose()


def context(run_id: str, step_id: str, kind: str, *, attempt: int = 1) -> StepContext:
    return StepContext(
        org_id=ORG,
        run_id=run_id,
        seq=1,
        step_id=step_id,
        kind=kind,
        lane="io",
        iteration=1,
        attempt=attempt,
        worker=f"worker-{attempt}",
        params=None,
        input={},
        vars={},
        steps={},
        wake=None,
        definition=StepDef(id=step_id, kind=kind),
    )


RACES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "payment": ("POST", "/payment/charges", {"amount": 4200, "currency": "eur", "customer": "c"}),
    "email": ("POST", "/email/messages", {"from": "a@b.test", "to": MAYA, "subject": "Hi"}),
}


@pytest.mark.parametrize("provider", list(RACES))
async def test_two_attempts_racing_on_one_effect_call_the_provider_once(
    provider: str,
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    counting: CountingClient,
    sql: psycopg.Connection,
) -> None:
    method, path, params = RACES[provider]
    await connect(engine, sandbox, "conn", provider)
    admin.faults(provider, latency_ms=1000)
    # two workers: each its own effect store and HTTP client, one database. The effect lease
    # (0.6 s) is shorter than the call: only its heartbeat keeps the waiting attempt waiting.
    integ = Integrations(engine.pool, client=counting.client)
    first = Effects(engine.pool, lease_seconds=0.6, poll=0.05)
    second = Effects(engine.pool, lease_seconds=0.6, poll=0.05)
    step = context("run_race", "act", f"{provider}.x")
    connector = await integ.connector(ORG, "conn")

    async def timed(effects: Effects) -> tuple[dict[str, Any], float]:
        result = await effects.run(step, connector, dict(params))
        return result, time.monotonic()

    t0 = time.monotonic()
    (a, a_done), (b, b_done) = await asyncio.gather(timed(first), timed(second))

    assert a == b
    assert a["id"]
    assert counting.sent[(method, path)] == 1, counting.sent
    [entry] = admin.ledger(provider)
    assert entry["response_id"] == a["id"]
    assert entry["idempotency_key"] == step.effect_key == "run_race/act/1"
    # neither could have answered before the one call returned
    assert min(a_done, b_done) - t0 >= 1.0
    row = effect_row(sql, step.effect_key)
    assert row is not None
    assert (row["status"], row["attempts"], row["owner_token"]) == ("settled", 1, 1), row


async def test_a_replacement_waits_on_the_live_effect_lease_instead_of_calling(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    counting: CountingClient,
    sql: psycopg.Connection,
) -> None:
    """Attempt 1 of a step is inside the provider call when its step lease is taken over;
    attempt 2 (the replacement) must wait for that call instead of charging again."""
    await connect(engine, sandbox, "billing", "payment")
    admin.faults("payment", latency_ms=1500)
    integ = Integrations(engine.pool, client=counting.client)
    connector = await integ.connector(ORG, "billing")
    old = Effects(engine.pool, lease_seconds=0.6, poll=0.05)
    new = Effects(engine.pool, lease_seconds=0.6, poll=0.05)
    params = {"amount": 4200, "currency": "eur", "customer": "cus_maya"}
    key = "run_takeover/charge/1"

    t0 = time.monotonic()
    slow = asyncio.create_task(
        old.run(context("run_takeover", "charge", "payment.charge"), connector, dict(params))
    )

    async def in_flight() -> bool:
        row = effect_row(sql, key)
        return row is not None and row["status"] == "in_flight"

    await eventually(in_flight, timeout=5, interval=0.02, what="attempt 1 inside the call")
    replacement = context("run_takeover", "charge", "payment.charge", attempt=2)
    assert replacement.effect_key == key  # the key names the effect, not the attempt
    result = await new.run(replacement, connector, dict(params))
    replaced_at = time.monotonic()
    original = await slow

    assert result == original
    assert replaced_at - t0 >= 1.5, "the replacement answered before the only call returned"
    assert counting.sent[("POST", "/payment/charges")] == 1, counting.sent
    assert len(admin.ledger("payment")) == 1
    row = effect_row(sql, key)
    assert row is not None
    assert (row["status"], row["attempts"], row["owner_token"]) == ("settled", 1, 1), row


async def lose_a_charge(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    counting: CountingClient,
    run_id: str,
    params: dict[str, Any],
) -> tuple[StepContext, Any]:
    """A charge the provider made but whose answer was lost: its effect's outcome is unknown."""
    await connect(engine, sandbox, "billing", "payment")
    admin.faults("payment", script=["drop_after_work"])
    integ = Integrations(engine.pool, client=counting.client)
    connector = await integ.connector(ORG, "billing")
    step = context(run_id, "charge", "payment.charge")
    with pytest.raises(OutcomeUnknown):
        await engine.effects.run(step, connector, dict(params))
    return step, connector


async def test_a_lost_payment_response_parks_for_review_and_a_retry_never_charges_again(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    counting: CountingClient,
    sql: psycopg.Connection,
) -> None:
    params = {"amount": 4200, "currency": "eur", "customer": "cus_maya"}
    step, connector = await lose_a_charge(engine, sandbox, admin, counting, "run_lost", params)
    row = effect_row(sql, step.effect_key)
    assert row is not None and row["status"] == "outcome_unknown", row

    retry = context("run_lost", "charge", "payment.charge", attempt=2)
    with pytest.raises(NeedsReview) as review:
        await engine.effects.run(retry, connector, dict(params))

    assert review.value.detail["effect_key"] == step.effect_key
    assert review.value.detail["attempts"] == 1
    assert step.effect_key in str(review.value)
    assert counting.sent[("POST", "/payment/charges")] == 1
    assert len(admin.ledger("payment")) == 1
    row = effect_row(sql, step.effect_key)
    assert row is not None and (row["status"], row["attempts"]) == ("review", 1), row


async def test_doctor_fails_on_an_unknown_outcome_and_only_warns_of_one_parked_for_review(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    counting: CountingClient,
) -> None:
    from onward.console.health import measure
    from onward.doctor import run_checks

    params = {"amount": 1700, "currency": "eur", "customer": "cus_dana"}
    _, connector = await lose_a_charge(engine, sandbox, admin, counting, "run_doctor", params)

    # unknown and nobody has moved it yet: the engine's to settle, a failure past the grace
    checks = {c.name: c for c in await run_checks(engine, grace=0.0)}
    assert checks["unsettled_effects"].value == 1 and not checks["unsettled_effects"].healthy
    assert checks["effects_in_review"].value == 0 and checks["effects_in_review"].ok

    with pytest.raises(NeedsReview):
        retry = context("run_doctor", "charge", "payment.charge", attempt=2)
        await engine.effects.run(retry, connector, dict(params))
    # parked for a person by design: shown as a warning, no longer counted as unsettled
    checks = {c.name: c for c in await run_checks(engine, grace=0.0)}
    assert checks["unsettled_effects"].value == 0 and checks["unsettled_effects"].ok
    review = checks["effects_in_review"]
    assert (review.value, review.ok, review.warning, review.healthy) == (1, False, True, True)
    assert "onward review resolve" in review.detail
    # the console's health page agrees: listed, not failing
    health = await measure(engine.pool, ORG, circuits=[], grace=0.0)
    effects = {c.name: c for c in health.checks}["unsettled_effects"]
    assert effects.ok and effects.value == 0 and "1 review" in effects.detail


# -- 2. a loop that sends three emails sends three ----------------------------------------------
async def test_a_loop_that_sends_three_emails_sends_three(
    engine: Engine, mailbox: str, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    flow = (
        Automation("three-notes")
        .step("init", "set", values={"n": "0"})
        .step("count", "set", values={"n": "vars.n + 1"})
        .step(
            "send",
            "email.send",
            connection=mailbox,
            to=MAYA,
            subject="Note {vars.n}",
            body="Note {vars.n} for {input.name}",
        )
        .branch("check", cases=[("vars.n < 3", "again")], default="done")
        .goto("again", "count")
        .step("done", "set", values={"finished": "true"})
    )
    await engine.publish(flow.build())
    started = await engine.start("three-notes", {"name": "Maya"}, event_id="evt-loop")
    run_id = started.run_id

    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"

    entries = admin.ledger("email")
    keys = [e["idempotency_key"] for e in entries]
    assert keys == [f"{run_id}/send/1", f"{run_id}/send/2", f"{run_id}/send/3"]
    assert [e["request"]["subject"] for e in entries] == ["Note 1", "Note 2", "Note 3"]
    assert len({e["response_id"] for e in entries}) == 3
    assert [(e["effect_key"], e["status"], e["attempts"]) for e in run_effects(sql, run_id)] == [
        (key, "settled", 1) for key in keys
    ]
    sends = steps(sql, run_id, "send")
    assert [(s["iteration"], s["status"]) for s in sends] == [(1, "done"), (2, "done"), (3, "done")]
    assert [s["output"]["message_id"] for s in sends] == [e["response_id"] for e in entries]


# -- 3. consent is checked at send time ---------------------------------------------------------
async def test_an_unsubscribe_between_enrolment_and_send_means_no_email_and_says_why(
    engine: Engine, mailbox: str, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    flow = send_step(
        Automation("follow-up").step("pause", "wait_for", duration="1s"), to="{input.email}"
    ).step("after", "set", values={"done": "true"})
    await engine.publish(flow.build())
    maya = (await engine.start("follow-up", {"name": "Maya", "email": MAYA}, event_id="m")).run_id
    sam = (await engine.start("follow-up", {"name": "Sam", "email": SAM}, event_id="s")).run_id

    async with engine.running():

        async def both_waiting() -> bool:
            return {await engine.status(maya), await engine.status(sam)} == {"waiting"}

        await eventually(both_waiting, timeout=10, what="both runs waiting before the send")
        # enrolled while eligible; Maya unsubscribes before her send step runs
        await engine.integrations.suppress(ORG, MAYA, "unsubscribed")
        assert await engine.wait(maya, timeout=20) == "completed"
        assert await engine.wait(sam, timeout=20) == "completed"

    (send,) = steps(sql, maya, "send")
    assert send["status"] == "skipped"
    assert send["output"]["sent"] is False
    assert "unsubscribed" in send["output"]["reason"]
    (skipped,) = history(sql, maya, "step_skipped")
    assert skipped["step_id"] == "send"
    assert MAYA in skipped["detail"]["skipped"]
    assert "unsubscribed" in skipped["detail"]["skipped"]
    assert history(sql, maya, "step_done")[-1]["step_id"] == "after"  # the run went on
    assert run_effects(sql, maya) == []  # no effect was even claimed
    # only Sam, who did not unsubscribe, got his email
    [entry] = admin.ledger("email")
    assert entry["request"]["to"] == SAM
    assert entry["idempotency_key"] == f"{sam}/send/1"
    assert [row["status"] for row in steps(sql, sam, "send")] == ["done"]


# -- 4. revoked credentials park the run until the mailbox is reconnected ---------------------
async def test_a_revoked_mailbox_parks_the_run_and_restoring_it_sends_once(
    engine: Engine, mailbox: str, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    await publish_send_once(engine)
    admin.revoke("email", "acct_1")

    async with engine.running():
        first = (await engine.start("send-once", {"name": "Maya"}, event_id="r1")).run_id
        assert await engine.wait(first, timeout=20) == "parked"

        run = run_row(sql, first)
        assert "reconnect" in run["status_reason"], run
        assert "acct_1" in run["status_reason"]
        (send,) = steps(sql, first, "send")
        assert (send["status"], send["wait_kind"], send["attempt"]) == ("parked", "reconnect", 1)
        assert send["error"]["connection"] == mailbox
        assert send["error"]["type"] == "AuthorizationError"
        conn = connection_row(sql, mailbox)
        assert conn["status"] == "broken"
        assert "reconnect" in conn["broken_reason"]
        [note] = notifications(sql)
        assert note["kind"] == "connection_broken"
        assert note["subject"] == "reconnect the email account acct_1"
        assert note["body"]["connection_id"] == mailbox
        assert admin.ledger("email") == []
        assert run_effects(sql, first) == []  # the 401 withdrew the claim: nothing was sent
        assert len(history(sql, first, "step_parked")) == 1
        assert history(sql, first, "step_retry") == []  # authorisation failures are not retried

        # a second run reaching the broken connection parks without calling the provider
        second = (await engine.start("send-once", {"name": "Maya"}, event_id="r2")).run_id
        assert await engine.wait(second, timeout=20) == "parked"
        assert [row["wait_kind"] for row in steps(sql, second, "send")] == ["reconnect"]
        assert run_effects(sql, second) == []
        assert len(notifications(sql)) == 1  # the customer is told once, not once per run

        # the customer reconnects
        admin.restore("email", "acct_1")
        resumed = await engine.integrations.restore(ORG, mailbox)
        assert sorted(r["run_id"] for r in resumed) == sorted([first, second])
        assert await engine.wait(first, timeout=20) == "completed"
        assert await engine.wait(second, timeout=20) == "completed"

    assert connection_row(sql, mailbox)["status"] == "ok"
    entries = admin.ledger("email")
    assert sorted(e["idempotency_key"] for e in entries) == sorted(
        [f"{first}/send/1", f"{second}/send/1"]
    )
    (send,) = steps(sql, first, "send")
    assert (send["status"], send["attempt"]) == ("done", 2)  # the same step, resumed
    (resumed_event,) = history(sql, first, "step_resumed")
    assert resumed_event["detail"] == {"by": "reconnect", "connection_id": mailbox}
    assert [e["status"] for e in run_effects(sql, first)] == ["settled"]


async def test_probe_finds_a_revoked_connection_ahead_of_time(
    engine: Engine, mailbox: str, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    assert await engine.integrations.probe(ORG, mailbox) is None
    healthy = connection_row(sql, mailbox)
    assert healthy["status"] == "ok"
    assert healthy["checked_at"] is not None

    admin.revoke("email", "acct_1")
    reason = await engine.integrations.probe(ORG, mailbox)

    assert reason is not None
    assert "reconnect the email account acct_1" in reason
    assert "401" in reason
    conn = connection_row(sql, mailbox)
    assert conn["status"] == "broken"
    assert conn["broken_reason"] == reason
    [note] = notifications(sql)
    assert note["subject"] == "reconnect the email account acct_1"
    # probing again still answers why, and does not notify twice
    again = await engine.integrations.probe(ORG, mailbox)
    assert again is not None and "reconnect" in again
    assert len(notifications(sql)) == 1
    assert admin.ledger("email") == []


# -- 5. retries ---------------------------------------------------------------------------------
async def run_send_once(engine: Engine, event_id: str) -> str:
    await publish_send_once(engine)
    run_id = (await engine.start("send-once", {"name": "Maya"}, event_id=event_id)).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    return str(run_id)


async def test_a_503_is_retried_and_the_second_attempt_sends_once(
    engine: Engine, mailbox: str, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    admin.faults("email", script=["503", "ok"])

    run_id = await run_send_once(engine, "evt-503")

    [entry] = admin.ledger("email")
    key = f"{run_id}/send/1"
    assert entry["idempotency_key"] == key
    (send,) = steps(sql, run_id, "send")
    assert (send["status"], send["attempt"]) == ("done", 2)
    assert send["output"]["message_id"] == entry["response_id"]
    (retry,) = history(sql, run_id, "step_retry")
    assert retry["detail"]["error"]["detail"]["status"] == 503
    assert 0 <= retry["detail"]["delay_s"] <= 1.0  # full jitter under the first ceiling
    effect = effect_row(sql, key)
    assert effect is not None
    # the 503 said "not done": the claim was withdrawn, so the retry started clean
    assert (effect["status"], effect["attempts"]) == ("settled", 1), effect


async def test_a_429_waits_as_long_as_retry_after_says(
    engine: Engine, mailbox: str, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    admin.faults("email", script=["429"], retry_after_s=1)

    run_id = await run_send_once(engine, "evt-429")

    assert len(admin.ledger("email")) == 1
    (retry,) = history(sql, run_id, "step_retry")
    assert retry["detail"]["delay_s"] == pytest.approx(1.0)  # Retry-After wins over the jitter
    assert retry["detail"]["error"]["type"] == "RateLimited"
    claims = [e for e in attempts(sql, run_id) if e["step_id"] == "send"]
    assert [c["attempt"] for c in claims] == [1, 2]
    waited = (claims[1]["claimed_at"] - retry["at"]).total_seconds()
    assert waited >= 0.95, f"attempt 2 claimed {waited:.2f}s after the 429"
    assert [row["attempt"] for row in steps(sql, run_id, "send")] == [2]


async def test_a_response_lost_after_the_work_is_reconciled_not_resent(
    engine: Engine, mailbox: str, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    admin.faults("email", script=["drop_after_work"])

    run_id = await run_send_once(engine, "evt-drop")

    key = f"{run_id}/send/1"
    [entry] = admin.ledger("email")
    assert entry["idempotency_key"] == key
    (retry,) = history(sql, run_id, "step_retry")
    assert retry["detail"]["error"]["type"] == "OutcomeUnknown"
    effect = effect_row(sql, key)
    assert effect is not None
    # found by reconciling (search by the effect key), not by a second attempt
    assert (effect["status"], effect["attempts"]) == ("settled", 1), effect
    assert effect["result"]["id"] == entry["response_id"]
    (send,) = steps(sql, run_id, "send")
    assert (send["status"], send["attempt"]) == ("done", 2)
    assert send["output"]["message_id"] == entry["response_id"]
