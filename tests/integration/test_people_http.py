"""People in the loop over real HTTP (R10, R6): approvers, approvals, Slack's interactivity
endpoint and ``POST /v1/timers/skip``, served by uvicorn on a free port (``ApiServer``)
against a real PostgreSQL. Every error answer is an ``ErrorBody``: its ``error`` name and a
one-line ``detail``.

The pending approval the decisions act on is a real one: a worker in the test's process runs
an ``approval`` step against the sandbox's Slack, which posts the request.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import psycopg
import pytest
from slack_sdk.signature import SignatureVerifier

from onward import Automation
from onward.api import ApiServer, create_app
from onward.engine import Engine
from onward.sandbox import SandboxServer
from onward.testing import api_key, auth, eventually, history

pytestmark = pytest.mark.usefixtures("admin")  # a clean sandbox for each test

WORKSPACE = "T_HTTP"
SIGNING = "http-signing-secret"
SAM, ANA, EVE = "U_SAM", "U_ANA", "U_EVE"
APPROVAL_KEYS = {
    "approval_id",
    "run_id",
    "seq",
    "step_id",
    "request",
    "digest",
    "approvers",
    "channel",
    "status",
    "decided_by",
    "decided_via",
    "decided_at",
    "deadline_at",
    "message_ts",
    "created_at",
}


@pytest.fixture
async def api(engine: Engine) -> AsyncIterator[ApiServer]:
    async with ApiServer(create_app(engine), port=0, log_level="warning", access_log=False) as s:
        yield s


@pytest.fixture
async def http(engine: Engine, api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    headers = auth(await api_key(engine))
    async with httpx.AsyncClient(base_url=api.url, timeout=30, headers=headers) as client:
        yield client


async def slack_connection(engine: Engine, sandbox: SandboxServer) -> None:
    await engine.integrations.add_connection(
        engine.org_id,
        "slack",
        provider="slack",
        base_url=sandbox.url,
        account=WORKSPACE,
        secret=WORKSPACE,
        signing_secret=SIGNING,
    )


def error(reply: httpx.Response, status: int, name: str) -> str:
    """``reply`` is an ``ErrorBody`` with this status and ``error``; its detail."""
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) <= {"error", "detail", "problems"} and body["error"] == name, body
    detail: str = body["detail"]
    assert detail and "\n" not in detail
    return detail


# -- approvers ---------------------------------------------------------------------------------


async def test_approvers_grant_list_revoke_and_a_missing_grant(
    http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    assert (await http.get("/v1/approvers")).json() == []
    granted = await http.post("/v1/approvers", json={"approver": "U1"})
    assert granted.status_code == 201, granted.text
    body = granted.json()
    assert (body["approver"], body["scope"], body["revoked_at"]) == ("U1", "*", None)
    datetime.fromisoformat(body["granted_at"])
    scoped = await http.post("/v1/approvers", json={"approver": "U1", "automation_id": "demo"})
    assert scoped.status_code == 201 and scoped.json()["scope"] == "demo", scoped.text

    listed = (await http.get("/v1/approvers")).json()
    assert [(r["approver"], r["scope"], r["revoked_at"]) for r in listed] == [
        ("U1", "*", None),
        ("U1", "demo", None),
    ]
    assert all(set(r) == {"approver", "scope", "granted_at", "revoked_at"} for r in listed)

    revoked = await http.delete("/v1/approvers/U1")
    assert revoked.status_code == 200, revoked.text
    assert (revoked.json()["scope"], revoked.json()["revoked_at"] is not None) == ("*", True)
    # revoked already, never granted, a scope never granted: 404 and nothing changes
    detail = error(await http.delete("/v1/approvers/U1"), 404, "not_found")
    assert detail == "no live grant for U1 on *"
    error(await http.delete("/v1/approvers/U2"), 404, "not_found")
    other = await http.delete("/v1/approvers/U1", params={"automation_id": "other"})
    assert error(other, 404, "not_found") == "no live grant for U1 on other"
    scoped_off = await http.delete("/v1/approvers/U1", params={"automation_id": "demo"})
    assert scoped_off.status_code == 200 and scoped_off.json()["scope"] == "demo"
    after = (await http.get("/v1/approvers")).json()
    assert [(r["scope"], r["revoked_at"] is not None) for r in after] == [
        ("*", True),
        ("demo", True),
    ]
    # what cannot be accepted as sent: 422, nothing stored
    error(await http.post("/v1/approvers", json={"approver": "U3", "x": 1}), 422, "invalid_request")
    error(await http.post("/v1/approvers", json={"approver": ""}), 422, "invalid_request")
    bad_scope = {"approver": "U3", "automation_id": "not an id!"}
    error(await http.post("/v1/approvers", json=bad_scope), 422, "invalid_request")
    assert sql.execute("SELECT count(*) AS n FROM approvers").fetchone() == {"n": 2}


# -- approvals ---------------------------------------------------------------------------------


async def pending_approval(
    engine: Engine, sandbox: SandboxServer, sql: psycopg.Connection[Any]
) -> tuple[str, str]:
    """A run whose ``approval`` step asked SAM and ANA in the sandbox's Slack and now waits;
    its run id and approval id. The worker ran in this process and is stopped again."""
    await slack_connection(engine, sandbox)
    await engine.publish(
        Automation("approve")
        .step(
            "approve",
            "approval",
            connection="slack",
            channel="#approvals",
            approvers=[SAM, ANA],
            text="Send to {input.name}",
            deadline="10m",
        )
        .step("after", "set", values={"decision": "steps.approve.decision"})
        .build()
    )
    run_id = (await engine.start("approve", {"name": "Maya"}, event_id="http-1")).run_id
    async with httpx.AsyncClient(base_url=sandbox.url, timeout=30) as admin:

        async def posted() -> Any:
            reply = await admin.get("/_admin/slack/messages", params={"account": WORKSPACE})
            return reply.json()["data"]

        async def waits() -> Any:
            return sql.execute(
                "SELECT 1 FROM steps WHERE run_id = %s AND status = 'waiting' "
                "AND wait_kind = 'approval'",
                (run_id,),
            ).fetchone()

        async with engine.running():
            await eventually(posted, what="the approval's Slack message")
            await eventually(waits, what="the step to wait on its approval")
    (request,) = await engine.approvals(run_id=run_id)
    return run_id, request["approval_id"]


async def test_list_and_decide_approvals_with_every_refusal(
    engine: Engine, sandbox: SandboxServer, http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    for who in (SAM, ANA):
        assert (await http.post("/v1/approvers", json={"approver": who})).status_code == 201
    run_id, approval_id = await pending_approval(engine, sandbox, sql)

    pending = await http.get("/v1/approvals", params={"status": "pending"})
    assert pending.status_code == 200, pending.text
    (view,) = pending.json()
    assert set(view) == APPROVAL_KEYS
    assert (view["approval_id"], view["run_id"], view["step_id"], view["status"]) == (
        approval_id,
        run_id,
        "approve",
        "pending",
    )
    assert (view["request"], view["approvers"], view["channel"]) == (1, [SAM, ANA], "#approvals")
    assert view["message_ts"] and view["decided_by"] is None
    error(await http.get("/v1/approvals", params={"status": "maybe"}), 422, "invalid_request")

    def decide(decision: str, user: str, approval: str = approval_id) -> dict[str, str]:
        return {"approval_id": approval, "decision": decision, "user": user}

    unknown = await http.post("/v1/approvals/decide", json=decide("approve", SAM, "nope"))
    assert "unknown approval 'nope'" in error(unknown, 404, "unknown_approval")
    bad = await http.post("/v1/approvals/decide", json=decide("maybe", SAM))
    assert "decision" in error(bad, 422, "invalid_request")
    extra = await http.post("/v1/approvals/decide", json={**decide("approve", SAM), "x": 1})
    error(extra, 422, "invalid_request")
    eve = await http.post("/v1/approvals/decide", json=decide("approve", EVE))
    assert error(eve, 409, "decision_refused") == (
        f"{EVE} may not decide this request (not asked, or permission revoked)"
    )
    # revoked since the request was sent: refused at decision time
    assert (await http.delete(f"/v1/approvers/{quote(ANA)}")).status_code == 200
    ana = await http.post("/v1/approvals/decide", json=decide("reject", ANA))
    assert "may not decide" in error(ana, 409, "decision_refused")
    assert (await engine.approval(approval_id))["status"] == "pending"

    decided = await http.post("/v1/approvals/decide", json=decide("approve", SAM))
    assert decided.status_code == 200, decided.text
    answer = decided.json()
    assert (answer["approval_id"], answer["status"], answer["decided_by"]) == (
        approval_id,
        "approved",
        SAM,
    )
    # the first decision wins: a later one (even Sam's own, the other way) reads it back
    assert (await http.post("/v1/approvers", json={"approver": ANA})).status_code == 201
    late = await http.post("/v1/approvals/decide", json=decide("reject", ANA))
    assert error(late, 409, "decision_refused").startswith(f"already approved by {SAM} at ")
    mine = await http.post("/v1/approvals/decide", json=decide("reject", SAM))
    assert error(mine, 409, "decision_refused").startswith(f"already approved by {SAM} at ")
    same = await http.post("/v1/approvals/decide", json=decide("approve", SAM))
    assert error(same, 409, "decision_refused").startswith("already approved by you at ")

    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    assert (await http.get("/v1/approvals", params={"status": "pending"})).json() == []
    (approved,) = (await http.get("/v1/approvals", params={"status": "approved"})).json()
    assert (approved["approval_id"], approved["decided_by"], approved["decided_via"]) == (
        approval_id,
        SAM,
        "api",
    )
    by_run = (await http.get("/v1/approvals", params={"run_id": run_id})).json()
    assert [a["approval_id"] for a in by_run] == [approval_id]
    assert len(history(sql, run_id, "approval_decided")) == 1
    reasons = [h["detail"]["reason"] for h in history(sql, run_id, "approval_refused")]
    assert reasons == ["not_permitted", "not_permitted"]


# -- Slack's interactivity endpoint ------------------------------------------------------------


def signed(secret: str, body: str, *, age_s: int = 0) -> dict[str, str]:
    """The headers Slack sends with ``body``, signed with ``secret`` ``age_s`` seconds ago."""
    timestamp = str(int(time.time()) - age_s)
    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    assert signature is not None
    return {
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }


async def test_slack_interactivity_checks_the_signature_before_reading_the_body(
    engine: Engine, sandbox: SandboxServer, http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    await slack_connection(engine, sandbox)
    url = "/v1/slack/slack/interactivity"
    click = {
        "type": "block_actions",
        "user": {"id": SAM},
        "actions": [{"action_id": "approve", "value": "not-a-token"}],
    }
    body = urlencode({"payload": json.dumps(click)})
    form = {"Content-Type": "application/x-www-form-urlencoded"}

    unsigned = await http.post(url, content=body, headers=form)
    assert "signing secret" in error(unsigned, 401, "invalid_signature")
    forged = await http.post(url, content=body, headers=signed("not-the-secret", body))
    error(forged, 401, "invalid_signature")
    stale = await http.post(url, content=body, headers=signed(SIGNING, body, age_s=301))
    error(stale, 401, "invalid_signature")
    tampered = body.replace("not-a-token", "not-a-tokem")
    error(
        await http.post(url, content=tampered, headers=signed(SIGNING, body)),
        401,
        "invalid_signature",
    )

    unknown = await http.post(
        "/v1/slack/nowhere/interactivity", content=body, headers=signed(SIGNING, body)
    )
    assert "nowhere" in error(unknown, 404, "unknown_connection")

    # signed, but not a block_actions payload with a button: 422, whatever shape it has
    for shape in (
        "",
        "text=hello",
        urlencode({"payload": "{not json"}),
        urlencode({"payload": json.dumps({"type": "view_submission", "user": {"id": SAM}})}),
        urlencode({"payload": json.dumps({**click, "actions": []})}),
        urlencode({"payload": json.dumps({**click, "actions": [{"action_id": "approve"}]})}),
    ):
        answer = await http.post(url, content=shape, headers=signed(SIGNING, shape))
        detail = error(answer, 422, "invalid_input")
        assert detail == "not a Slack block_actions payload with a button", shape

    # signed and well formed, with a token that is not the engine's: refused, 200 for Slack
    refused = await http.post(url, content=body, headers=signed(SIGNING, body))
    assert refused.status_code == 200, refused.text
    assert (refused.json()["ok"], refused.json()["outcome"]) == (False, "invalid_token")
    assert sql.execute(
        "SELECT count(*) AS n FROM history WHERE event LIKE 'approval%'"
    ).fetchone() == {"n": 0}


# -- POST /v1/timers/skip ----------------------------------------------------------------------


async def test_skip_a_waiting_runs_timer_over_http(
    engine: Engine, http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(
        Automation("slow")
        .step("wait", "wait_for", duration="6h")
        .step("after", "set", values={"done": "true"})
        .build()
    )
    run_id = (await engine.start("slow", {}, event_id="skip-1")).run_id
    async with engine.running():

        async def waits() -> bool:
            return await engine.status(run_id) == "waiting"

        await eventually(waits, what="the run to wait")
        (timer,) = sql.execute(
            "SELECT timer_id, due_at FROM timers WHERE run_id = %s", (run_id,)
        ).fetchall()
        reply = await http.post("/v1/timers/skip", json={"run_id": run_id})
        assert reply.status_code == 200, reply.text
        (move,) = reply.json()
        assert set(move) == {"timer_id", "from", "to", "purpose"}
        assert (move["timer_id"], move["purpose"]) == (timer["timer_id"], "wait")
        assert datetime.fromisoformat(move["from"]) == timer["due_at"]
        assert datetime.fromisoformat(move["to"]) < timer["due_at"]
        assert await engine.wait(run_id, timeout=30) == "completed"

    (moved,) = history(sql, run_id, "timer_moved")
    assert moved["detail"]["reason"] == "skipped by an operator"
    assert moved["detail"]["timer_id"] == timer["timer_id"]
    assert len(history(sql, run_id, "timer_fired")) == 1

    # a finished run waits on no timer; an unknown run is 404; what cannot be taken is 422
    again = await http.post("/v1/timers/skip", json={"run_id": run_id})
    assert again.status_code == 200 and again.json() == [], again.text
    nope = await http.post("/v1/timers/skip", json={"run_id": "nope"})
    assert "unknown run 'nope'" in error(nope, 404, "unknown_run")
    extra = await http.post("/v1/timers/skip", json={"run_id": run_id, "when": "now"})
    assert "when" in error(extra, 422, "invalid_request")
    error(await http.post("/v1/timers/skip", json={}), 422, "invalid_request")
    assert len(history(sql, run_id, "timer_moved")) == 1


async def test_a_decisions_answer_says_how_and_when_it_was_made(
    engine: Engine, sandbox: SandboxServer, http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    """The 200 of ``POST /v1/approvals/decide`` reads back the decision as stored: the channel
    it came through and its time, as the request's row (and ``GET /v1/approvals``) has them."""
    await engine.grant_approver(SAM)
    _, approval_id = await pending_approval(engine, sandbox, sql)
    decided = await http.post(
        "/v1/approvals/decide",
        json={"approval_id": approval_id, "decision": "approve", "user": SAM},
    )
    assert decided.status_code == 200, decided.text
    (stored,) = (await http.get("/v1/approvals", params={"status": "approved"})).json()
    assert (stored["decided_by"], stored["decided_via"]) == (SAM, "api")
    answer = decided.json()
    assert {k: answer[k] for k in ("decided_by", "decided_via", "decided_at")} == {
        k: stored[k] for k in ("decided_by", "decided_via", "decided_at")
    }
