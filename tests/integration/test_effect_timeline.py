"""Effects on a run's timeline (R17, issue 15): every effect transition of a run driven by the
engine through the real sandbox is a history row, written by the transition's own statement,
with the effect key (the provider's idempotency key), the provider's reference, the attempt
and a bounded, redacted excerpt of the request and result -- shown by ``onward show`` and
``GET /v1/runs/{run_id}``.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.history import render_timeline
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import effect_row, history, run_row
from tests.integration.api_client import api_client

ORG = "test"
MAYA = "maya@example.test"
SECRET = "sk_live_do_not_show_me"

pytestmark = pytest.mark.usefixtures("admin")


async def connect(engine: Engine, sandbox: SandboxServer, connection: str, provider: str) -> None:
    await engine.integrations.add_connection(
        ORG, connection, provider=provider, base_url=sandbox.url, account="acct_1", secret="acct_1"
    )


def effect_events(sql: psycopg.Connection[Any], run_id: str) -> list[dict[str, Any]]:
    return [dict(e) for e in history(sql, run_id) if e["event"].startswith("effect_")]


async def run_until(engine: Engine, run_id: str, status: str) -> None:
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == status


async def test_a_send_is_claimed_then_settled_with_the_reference_and_redacted_excerpts(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    await connect(engine, sandbox, "mailbox", "email")
    flow = Automation("note").step(
        "send",
        "email.send",
        connection="mailbox",
        to=MAYA,
        subject="Your follow-up",
        body="x" * 5000,
        metadata={"api_token": SECRET, "campaign": "spring"},
    )
    await engine.publish(flow.build())
    run_id = (await engine.start("note", {}, event_id="e1")).run_id

    await run_until(engine, run_id, "completed")

    [entry] = admin.ledger("email")
    key = f"{run_id}/send/1"
    claimed, settled = effect_events(sql, run_id)
    assert [claimed["event"], settled["event"]] == ["effect_claimed", "effect_settled"]
    for row in (claimed, settled):
        assert (row["seq"], row["step_id"], row["attempt"]) == (1, "send", 1)
        assert row["worker"]
        assert row["detail"]["effect_key"] == row["detail"]["idempotency_key"] == key
        assert entry["idempotency_key"] == key  # what the provider really received
        assert row["detail"]["provider"] == "email"
        assert row["detail"]["effect_attempt"] == 1
    request = claimed["detail"]["request"]
    assert request["to"] == MAYA and request["subject"] == "Your follow-up"
    assert request["metadata"] == {"api_token": "[redacted]", "campaign": "spring"}
    assert len(request["body"]) == 200  # clipped
    assert settled["detail"]["reference"] == entry["response_id"]
    assert settled["detail"]["result"]["id"] == entry["response_id"]
    # bounded, and the secret is in no history row at all
    for row in history(sql, run_id):
        text = json.dumps(row["detail"], default=str)
        assert SECRET not in text
        assert len(text.encode()) <= 1400, row
    # the effect row still holds what was really sent (the excerpt is the timeline's only)
    effect = effect_row(sql, key)
    assert effect is not None and effect["status"] == "settled"

    # onward show (the same view and renderer) and GET /v1/runs/{run_id}
    view = await engine.show(run_id)
    text = render_timeline(view)
    assert f"effect_settled    send#1 attempt 1 by {settled['worker']}" in text
    assert f"email {key}  effect attempt 1  ref {entry['response_id']}" in text
    async with api_client(engine) as client:
        body = (await client.get(f"/v1/runs/{run_id}")).json()
    shown = [e for e in body["history"] if e["event"].startswith("effect_")]
    assert [e["event"] for e in shown] == ["effect_claimed", "effect_settled"]
    assert shown[1]["detail"]["reference"] == entry["response_id"]


async def test_not_done_then_unknown_then_reconciled_each_leave_a_row(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    """503 (the provider says: not done), then a response lost after the work (unknown), then
    the third attempt finds the message by its key (reconciled): one message, five rows."""
    await connect(engine, sandbox, "mailbox", "email")
    admin.faults("email", script=["503", "drop_after_work"])
    flow = Automation("note").step(
        "send", "email.send", connection="mailbox", to=MAYA, subject="Hi", body="Hello"
    )
    await engine.publish(flow.build())
    run_id = (await engine.start("note", {}, event_id="e2")).run_id

    await run_until(engine, run_id, "completed")

    [entry] = admin.ledger("email")
    rows = effect_events(sql, run_id)
    assert [(r["event"], r["attempt"], r["detail"].get("effect_attempt")) for r in rows] == [
        ("effect_claimed", 1, 1),
        ("effect_not_done", 1, 1),
        ("effect_claimed", 2, 1),  # the withdrawn claim: the next attempt starts clean
        ("effect_unknown", 2, 1),
        ("effect_reconciled", 3, 1),
    ]
    not_done, unknown, reconciled = rows[1], rows[3], rows[4]
    assert not_done["detail"]["now"] == "withdrawn"
    assert not_done["detail"]["error"]["detail"]["status"] == 503
    assert unknown["detail"]["error"]["type"] == "OutcomeUnknown"
    assert reconciled["detail"]["reference"] == entry["response_id"]
    # each row is in the timeline between the step's own rows, in commit order
    send = [e["event"] for e in history(sql, run_id, seq=1)]
    assert send == [
        "step_ready",
        "effect_claimed",
        "effect_not_done",
        "step_retry",
        "effect_claimed",
        "effect_unknown",
        "step_retry",
        "effect_reconciled",
        "step_done",
    ]
    # each attempt's end row says when it was claimed, before its effect rows
    ends = [e for e in history(sql, run_id, seq=1) if e["claimed_at"] is not None]
    assert [(e["event"], e["attempt"]) for e in ends] == [
        ("step_retry", 1),
        ("step_retry", 2),
        ("step_done", 3),
    ]
    text = render_timeline(await engine.show(run_id))
    assert "effect_unknown" in text and "OutcomeUnknown" in text
    assert "now withdrawn" in text


async def test_parked_for_review_then_a_retry_with_the_same_key_is_on_the_timeline(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    """A payment provider offers neither idempotency nor a search: a lost answer parks the
    effect for a person (effect_review); the person allows one more attempt, which claims the
    effect again under the same key (effect_claimed, repeat) and settles it."""
    await connect(engine, sandbox, "billing", "payment")
    admin.faults("payment", script=["drop_after_work"])
    flow = Automation("charge").step(
        "charge", "payment.charge", connection="billing", amount=4200, customer="cus_maya"
    )
    await engine.publish(flow.build())
    run_id = (await engine.start("charge", {}, event_id="e3")).run_id

    await run_until(engine, run_id, "parked")
    assert run_row(sql, run_id)["status_reason"]
    await engine.resolve_review(run_id, "retry", by="sam")
    await run_until(engine, run_id, "completed")

    key = f"{run_id}/charge/1"
    rows = effect_events(sql, run_id)
    assert [(r["event"], r["attempt"], r["detail"].get("effect_attempt")) for r in rows] == [
        ("effect_claimed", 1, 1),
        ("effect_unknown", 1, 1),
        ("effect_review", 2, 1),
        ("effect_claimed", 3, 2),
        ("effect_settled", 3, 2),
    ]
    assert all(r["detail"]["idempotency_key"] == key for r in rows)
    review, again, settled = rows[2], rows[3], rows[4]
    assert review["detail"]["attempts"] == 1 and review["detail"]["first_attempt_at"]
    assert again["detail"]["repeat"] is True
    assert again["detail"]["request"]["amount"] == 4200
    assert settled["detail"]["reference"] == admin.ledger("payment")[-1]["response_id"]
    events = [e["event"] for e in history(sql, run_id, seq=1)]
    parked = events.index("step_parked")
    assert events[parked - 1] == "effect_review"  # the effect first, then its step parks
    assert events.index("review_resolved") < events.index("effect_claimed", parked)
