"""Approvals in Slack that are safe to click (R10), end to end over real HTTP: the engine posts
to the sandbox's Slack, the sandbox clicks as a person would (signed, or forged, stale,
re-serialised, replayed), the engine verifies, decides once and tells the clicker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from onward import Automation, DecisionRefused
from onward.api import ApiServer, create_app
from onward.approvals import mint, token_secret
from onward.engine import Engine
from onward.sandbox import SandboxServer
from onward.testing import eventually, history

pytestmark = pytest.mark.usefixtures("admin")  # every test starts on a clean sandbox

WORKSPACE = "T_ACME"
SIGNING = "sandbox-signing-secret"
SAM, ANA, LEAD, EVE = "U_SAM", "U_ANA", "U_LEAD", "U_EVE"


def flow(automation_id: str = "approve", **approval: Any) -> dict[str, Any]:
    params = {
        "connection": "slack",
        "channel": "#approvals",
        "approvers": [SAM, ANA],
        "text": "Send to {input.name}: {vars.draft}",
        "deadline": "30s",
        **approval,
    }
    return (
        Automation(automation_id)
        .step("draft", "set", values={"draft": "'Hello ' + input.name"})
        .step("approve", "approval", **params)
        .step("after", "set", values={"decision": "steps.approve.decision"})
        .build()
    )


class Slack:
    """The sandbox's Slack, driven over its admin API from the test's event loop."""

    def __init__(self, url: str) -> None:
        self.client = httpx.AsyncClient(base_url=url, timeout=30.0)

    async def messages(self) -> list[dict[str, Any]]:
        reply = await self.client.get("/_admin/slack/messages", params={"account": WORKSPACE})
        reply.raise_for_status()
        data: list[dict[str, Any]] = reply.json()["data"]
        return data

    async def click(self, ts: str, action_id: str, user: str, **knobs: Any) -> dict[str, Any]:
        reply = await self.client.post(
            "/_admin/slack/click",
            json={"ts": ts, "action_id": action_id, "user": user, **knobs},
        )
        reply.raise_for_status()
        answer: dict[str, Any] = reply.json()
        return answer

    async def nth_message(self, n: int) -> dict[str, Any]:
        async def posted() -> Any:
            got = await self.messages()
            return got[n - 1] if len(got) >= n else None

        message: dict[str, Any] = await eventually(posted, what=f"Slack message {n}")
        return message

    async def updates(self, ts: str, count: int) -> list[dict[str, Any]]:
        async def told() -> Any:
            (message,) = [m for m in await self.messages() if m["ts"] == ts]
            return message["updates"] if len(message["updates"]) >= count else None

        updates: list[dict[str, Any]] = await eventually(told, what="response_url updates")
        return updates


@pytest.fixture
async def slack(engine: Engine, sandbox: SandboxServer) -> AsyncIterator[Slack]:
    api = ApiServer(create_app(engine), port=0, log_level="warning", access_log=False)
    async with api:
        await engine.integrations.add_connection(
            engine.org_id,
            "slack",
            provider="slack",
            base_url=sandbox.url,
            account=WORKSPACE,
            secret=WORKSPACE,
            signing_secret=SIGNING,
        )
        driver = Slack(sandbox.url)
        reply = await driver.client.post(
            "/_admin/slack/app",
            json={
                "account": WORKSPACE,
                "interactivity_url": f"{api.url}/v1/slack/slack/interactivity",
                "signing_secret": SIGNING,
            },
        )
        reply.raise_for_status()
        for who in (SAM, ANA, LEAD):
            await engine.grant_approver(who)
        try:
            yield driver
        finally:
            await driver.client.aclose()


def approvals_of(sql: psycopg.Connection[Any], run_id: str) -> list[dict[str, Any]]:
    return list(
        sql.execute(
            "SELECT * FROM approvals WHERE run_id = %s ORDER BY request", (run_id,)
        ).fetchall()
    )


def output(sql: psycopg.Connection[Any], run_id: str, step_id: str = "approve") -> Any:
    row = sql.execute(
        "SELECT output FROM steps WHERE run_id = %s AND step_id = %s ORDER BY seq DESC",
        (run_id, step_id),
    ).fetchone()
    assert row is not None
    return row["output"]


async def started(engine: Engine, key: str, **approval: Any) -> str:
    await engine.publish(flow(**approval))
    return (await engine.start("approve", {"name": "Maya"}, event_id=key)).run_id


async def test_approve_in_slack_decides_once_and_tells_the_clicker(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack
) -> None:
    run_id = await started(engine, "a1")
    async with engine.running():
        message = await slack.nth_message(1)
        assert message["channel"] == "#approvals"
        assert "Send to Maya: Hello Maya" in message["blocks"][0]["text"]["text"]
        answer = await slack.click(message["ts"], "approve", SAM)
        assert answer["status"] == 200 and answer["body"]["outcome"] == "approved"
        assert await engine.wait(run_id, timeout=30) == "completed"
        (update,) = await slack.updates(message["ts"], 1)
        assert update["replace_original"] is True and SAM in update["text"]
        # a replay of the very same request, and a Slack retry of it: nothing new is decided
        replayed = await slack.click(message["ts"], "approve", SAM, replay=True)
        assert replayed["body"]["outcome"] == "decided"
        retried = await slack.click(message["ts"], "approve", SAM, retry_num=1)
        assert retried["body"]["outcome"] == "decided"
    out = output(sql, run_id)
    assert (out["decision"], out["decided_by"], out["via"]) == ("approved", SAM, "slack")
    (request,) = approvals_of(sql, run_id)
    assert (request["status"], request["decided_by"]) == ("approved", SAM)
    assert len(history(sql, run_id, "approval_decided")) == 1
    deadline = sql.execute(
        "SELECT fired_by FROM timers WHERE run_id = %s AND purpose = 'deadline'", (run_id,)
    ).fetchone()
    assert deadline == {"fired_by": "approval"}


async def test_forged_stale_reserialised_requests_are_refused_before_parsing(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack
) -> None:
    run_id = await started(engine, "a2")
    async with engine.running():
        message = await slack.nth_message(1)
        for knobs in ({"forge": True}, {"timestamp_offset_s": 301}, {"reserialise": True}):
            answer = await slack.click(message["ts"], "approve", SAM, **knobs)
            assert answer["status"] == 401, knobs
            assert answer["body"]["error"] == "invalid_signature"
        # a replay of a forged request is as forged as the first
        again = await slack.click(message["ts"], "approve", SAM, replay=True)
        assert again["status"] == 401
    (request,) = approvals_of(sql, run_id)
    assert request["status"] == "pending"
    assert history(sql, run_id, "approval_decided", "approval_refused") == []


async def test_tokens_for_another_run_step_or_org_and_reused_tokens_are_refused(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack
) -> None:
    run_a = await started(engine, "a3")
    run_b = (await engine.start("approve", {"name": "Ben"}, event_id="a3b")).run_id
    async with engine.running():
        await slack.nth_message(2)
        secret = await token_secret(engine.pool)
        req_a = (await engine.approvals(run_id=run_a))[0]
        req_b = (await engine.approvals(run_id=run_b))[0]
        full_b = await engine.approval(req_b["approval_id"])
        # a token naming run B's request but run A's run / another step entry / another org
        forged = [
            mint(secret, engine.org_id, {**full_b, "run_id": run_a}, "approved"),
            mint(secret, engine.org_id, {**full_b, "seq": 1}, "approved"),
            mint(secret, "other-org", full_b, "approved"),
            mint("not-the-secret", engine.org_id, full_b, "approved"),
            mint(secret, engine.org_id, {**full_b, "nonce": "guessed"}, "approved"),
        ]
        for token in forged:
            with pytest.raises(DecisionRefused) as refused:
                await engine.decide_by_token(token, SAM)
            assert refused.value.reason == "invalid_token"
        # the button of one decision cannot make the other
        good = mint(secret, engine.org_id, full_b, "approved")
        with pytest.raises(DecisionRefused):
            await engine.decide_by_token(good, SAM, action="reject")
        assert (await engine.decide_by_token(good, SAM))["status"] == "approved"
        with pytest.raises(DecisionRefused) as reused:
            await engine.decide_by_token(good, ANA)
        assert reused.value.reason == "decided" and reused.value.decision is not None
        assert reused.value.decision["decided_by"] == SAM
        assert await engine.wait(run_b, timeout=30) == "completed"
    assert approvals_of(sql, run_a)[0]["status"] == "pending"
    assert req_a["approval_id"] != req_b["approval_id"]


async def test_a_revoked_approver_is_refused_and_told_so_in_slack(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack
) -> None:
    run_id = await started(engine, "a4", approvers=[SAM, EVE])
    async with engine.running():
        message = await slack.nth_message(1)
        await engine.revoke_approver(SAM)
        answer = await slack.click(message["ts"], "approve", SAM)
        assert answer["body"]["outcome"] == "not_permitted"
        (update,) = await slack.updates(message["ts"], 1)
        assert update["replace_original"] is False and "may not decide" in update["text"]
        # never asked, never granted: refused too
        eve = await slack.click(message["ts"], "approve", EVE)
        assert eve["body"]["outcome"] == "not_permitted"
        await engine.grant_approver(SAM)
        assert (await slack.click(message["ts"], "reject", SAM))["body"]["outcome"] == "rejected"
        assert await engine.wait(run_id, timeout=30) == "completed"
    assert output(sql, run_id)["decision"] == "rejected"
    reasons = [h["detail"]["reason"] for h in history(sql, run_id, "approval_refused")]
    assert reasons == ["not_permitted", "not_permitted"]


async def test_two_approvers_clicking_at_once_make_one_decision(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack
) -> None:
    run_id = await started(engine, "a5")
    async with engine.running():
        message = await slack.nth_message(1)
        answers = await asyncio.gather(
            slack.click(message["ts"], "approve", SAM),
            slack.click(message["ts"], "reject", ANA),
        )
        assert await engine.wait(run_id, timeout=30) == "completed"
    outcomes = sorted(a["body"]["outcome"] for a in answers)
    assert outcomes in (["approved", "decided"], ["decided", "rejected"])
    (request,) = approvals_of(sql, run_id)
    loser = next(a for a in answers if a["body"]["outcome"] == "decided")
    assert request["status"] in loser["body"]["text"]  # read back: "already approved by ..."
    assert output(sql, run_id)["decision"] == request["status"]
    assert len(history(sql, run_id, "approval_decided")) == 1


async def test_a_changed_draft_refuses_the_old_buttons_and_asks_again(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack
) -> None:
    run_id = await started(engine, "a6")
    async with engine.running():
        first = await slack.nth_message(1)

        async def waits() -> Any:
            return sql.execute(
                "SELECT 1 FROM steps WHERE run_id = %s AND step_id = 'approve' "
                "AND status = 'waiting'",
                (run_id,),
            ).fetchone()

        # the draft is edited while the request waits (an operator's correction): once the
        # step waits, not while it still runs -- the message is posted before the step's wait
        # is committed, and that settle writes the run's context from its steps (a run's row
        # is left behind mid-chain: migration 0030), which would put the first draft back
        await eventually(waits, what="the approval step waiting")
        # in a thread: a blocking write on this loop could wait for a lock that the engine's
        # open transaction (on this same loop) holds, and never get it
        await asyncio.to_thread(
            sql.execute,
            "UPDATE runs SET ctx = jsonb_set(ctx, '{vars,draft}', %s) WHERE run_id = %s",
            (Jsonb("Hello Maya, corrected"), run_id),
        )
        stale = await slack.click(first["ts"], "approve", SAM)
        assert stale["body"]["outcome"] == "superseded"
        second = await slack.nth_message(2)
        assert "corrected" in second["blocks"][0]["text"]["text"]
        again = await slack.click(first["ts"], "approve", SAM)
        assert again["body"]["outcome"] == "superseded"
        assert (await slack.click(second["ts"], "approve", SAM))["body"]["outcome"] == "approved"
        assert await engine.wait(run_id, timeout=30) == "completed"
    old, new = approvals_of(sql, run_id)
    assert (old["status"], new["status"]) == ("superseded", "approved")
    assert old["digest"] != new["digest"]
    assert output(sql, run_id)["digest"] == new["digest"]


async def test_the_deadline_escalates_then_the_default_decides(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack
) -> None:
    run_id = await started(
        engine,
        "a7",
        deadline="0.5s",
        on_deadline="escalate",
        escalate_to=[LEAD],
        default="reject",
    )
    async with engine.running():
        first = await slack.nth_message(1)
        escalated = await slack.nth_message(2)  # nobody decided: the lead is asked
        late = await slack.click(first["ts"], "approve", SAM)
        assert late["body"]["outcome"] == "expired"
        assert await engine.wait(run_id, timeout=30) == "completed"  # the lead did not either
    assert escalated["ts"] != first["ts"]
    old, new = approvals_of(sql, run_id)
    assert (old["status"], new["status"]) == ("expired", "expired")
    assert list(new["approvers"]) == [LEAD]
    out = output(sql, run_id)
    assert (out["decision"], out["via"], out["timed_out"]) == ("rejected", "default", True)
    assert len(history(sql, run_id, "approval_expired")) == 2


async def test_the_escalated_approver_decides(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack
) -> None:
    run_id = await started(
        engine, "a8", deadline="2s", on_deadline="escalate", escalate_to=[LEAD]
    )  # the escalation's deadline is as long: the lead's click must land within it
    async with engine.running():
        await slack.nth_message(1)
        escalated = await slack.nth_message(2)
        # the deadline of the escalation is fresh: the lead has time to decide
        answer = await slack.click(escalated["ts"], "approve", LEAD)
        assert answer["body"]["outcome"] == "approved"
        assert await engine.wait(run_id, timeout=30) == "completed"
    assert output(sql, run_id)["decided_by"] == LEAD


async def test_the_stop_policy_parks_the_run_visibly(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack
) -> None:
    run_id = await started(engine, "a9", deadline="0.3s")
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "parked"
    run = sql.execute("SELECT status_reason FROM runs WHERE run_id = %s", (run_id,)).fetchone()
    assert run is not None and "nobody decided before the deadline" in run["status_reason"]
    (request,) = approvals_of(sql, run_id)
    assert request["status"] == "expired"


async def test_a_decision_over_the_api_and_bad_input(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack
) -> None:
    run_id = await started(engine, "a10")
    async with engine.running():
        await slack.nth_message(1)
        (request,) = await engine.approvals(run_id=run_id)
        with pytest.raises(DecisionRefused) as refused:
            await engine.decide(request["approval_id"], "approve", user=EVE)
        assert refused.value.reason == "not_permitted"
        got = await engine.decide(request["approval_id"], "approve", user=ANA)
        assert (got["status"], got["decided_by"]) == ("approved", ANA)
        assert await engine.wait(run_id, timeout=30) == "completed"
    assert output(sql, run_id)["via"] == "api"


async def test_an_approval_step_that_does_not_fit_is_refused_at_publish(engine: Engine) -> None:
    from onward import InvalidAutomation

    with pytest.raises(InvalidAutomation, match="escalate_to"):
        await engine.publish(flow("bad", on_deadline="escalate"))
    with pytest.raises(InvalidAutomation, match="default"):
        await engine.publish(flow("bad2", on_deadline="default"))


async def test_a_decision_before_the_step_waits_wakes_it_as_soon_as_it_waits(
    engine: Engine, sql: psycopg.Connection[Any], slack: Slack, sandbox: SandboxServer
) -> None:
    # the Slack post is slow: the request exists, the step is still running when Sam decides
    reply = await slack.client.post("/_admin/faults/slack", json={"latency_ms": 1500})
    reply.raise_for_status()
    run_id = await started(engine, "a11", deadline="1h")
    async with engine.running():

        async def requested() -> Any:
            return sql.execute(
                "SELECT approval_id FROM approvals WHERE run_id = %s", (run_id,)
            ).fetchone()

        row = await eventually(requested, what="the request")
        step = sql.execute(
            "SELECT status FROM steps WHERE run_id = %s AND step_id = 'approve'", (run_id,)
        ).fetchone()
        assert step == {"status": "running"}
        got = await engine.decide(row["approval_id"], "approve", user=SAM)
        assert got["status"] == "approved"
        assert await engine.wait(run_id, timeout=30) == "completed"  # not after the hour
    waited, decided = history(sql, run_id, "step_waiting", "approval_decided")[-2:]
    assert (waited["event"], decided["event"]) == ("step_waiting", "approval_decided")
    assert output(sql, run_id)["decided_by"] == SAM
