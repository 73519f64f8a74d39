"""A process dies at an approval's crash points (R10), and the request is still asked once and
decided once.

* ``approval.after_request`` -- in the worker, after the request row committed, before the
  Slack message is posted. A real worker process armed there dies with SIGKILL: the request
  is ``pending``, nothing is in Slack, the step still ``running`` (its lease lapsing). A
  second worker rescues the step and finishes the *same* request (same approval id, request
  number 1): one row, one Slack message. A decision then completes the run.
* ``approval.after_decide`` -- in ``approvals.decide``, inside the decision's transaction,
  before it commits. The decision is made in its own process (a snippet opening an Engine on
  the test's database, clicking as Slack would with the button's token): it dies and nothing
  of it is left -- the request ``pending``, the step ``waiting``, no ``approval_decided``, the
  deadline timer unfired. Slack's retry of that click, through the real interactivity
  endpoint, then decides once and the run completes.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from onward import Automation
from onward.api import ApiServer, create_app
from onward.engine import Engine
from onward.sandbox import SandboxServer
from onward.testing import (
    Processes,
    assert_nothing_applied_twice,
    eventually,
    history,
    process_env,
    step_row,
)
from tests.acceptance.procs import worker_settings

pytestmark = [pytest.mark.acceptance, pytest.mark.usefixtures("admin")]

ORG = "test"  # the `settings` fixture's organisation, and the worker processes'
LEASE = 2.0
WORKSPACE = "T_CRASH"
SIGNING = "crash-signing-secret"
SAM = "U_SAM"

# The decision in its own process: the button's token, as Slack's click would carry it.
DECIDE = """
import asyncio, json, sys
from onward.config import Settings
from onward.engine import Engine

async def main() -> None:
    url, org, token, user, action = sys.argv[1:6]
    settings = Settings(database_url=url, org_id=org, outbound_allow=("127.0.0.1/32",))
    async with Engine.open(settings, migrate=False, start_queue=False) as engine:
        print("deciding", flush=True)
        got = await engine.decide_by_token(token, user, action=action)
        print("decided", json.dumps(got, default=str), flush=True)

asyncio.run(main())
"""


def flow(automation_id: str) -> dict[str, Any]:
    return (
        Automation(automation_id)
        .step("draft", "set", values={"draft": "'Hello ' + input.name"})
        .step(
            "approve",
            "approval",
            connection="slack",
            channel="#approvals",
            approvers=[SAM],
            text="Send to {input.name}: {vars.draft}",
            deadline="10m",  # far beyond the test: the deadline never decides here
        )
        .step("after", "set", values={"decision": "steps.approve.decision"})
        .build()
    )


class Slack:
    """The sandbox's Slack over its admin API, without blocking the test's event loop."""

    def __init__(self, url: str) -> None:
        self.client = httpx.AsyncClient(base_url=url, timeout=30.0)

    async def messages(self) -> list[dict[str, Any]]:
        reply = await self.client.get("/_admin/slack/messages", params={"account": WORKSPACE})
        reply.raise_for_status()
        data: list[dict[str, Any]] = reply.json()["data"]
        return data

    async def first_message(self) -> dict[str, Any]:
        async def posted() -> dict[str, Any] | None:
            got = await self.messages()
            return got[0] if got else None

        message: dict[str, Any] = await eventually(posted, timeout=30, what="the Slack message")
        return message

    async def click(self, ts: str, action_id: str, user: str, **knobs: Any) -> dict[str, Any]:
        reply = await self.client.post(
            "/_admin/slack/click", json={"ts": ts, "action_id": action_id, "user": user, **knobs}
        )
        reply.raise_for_status()
        answer: dict[str, Any] = reply.json()
        return answer


@pytest.fixture
async def slack(engine: Engine, sandbox: SandboxServer) -> AsyncIterator[Slack]:
    await engine.integrations.add_connection(
        engine.org_id,
        "slack",
        provider="slack",
        base_url=sandbox.url,
        account=WORKSPACE,
        secret=WORKSPACE,
        signing_secret=SIGNING,
    )
    await engine.grant_approver(SAM)
    driver = Slack(sandbox.url)
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


def deadline_timers(sql: psycopg.Connection[Any], run_id: str) -> list[dict[str, Any]]:
    return list(
        sql.execute(
            "SELECT * FROM timers WHERE run_id = %s AND purpose = 'deadline' ORDER BY timer_id",
            (run_id,),
        ).fetchall()
    )


def approve_output(sql: psycopg.Connection[Any], run_id: str) -> dict[str, Any]:
    row = sql.execute(
        "SELECT output FROM steps WHERE run_id = %s AND step_id = 'approve'", (run_id,)
    ).fetchone()
    assert row is not None
    out: dict[str, Any] = row["output"]
    return out


def waiting_on_approval(sql: psycopg.Connection[Any], run_id: str) -> dict[str, Any] | None:
    """The approval step of the run, once it waits on its approval (None before)."""
    row: dict[str, Any] | None = sql.execute(
        "SELECT * FROM steps WHERE run_id = %s AND step_id = 'approve' AND status = 'waiting' "
        "AND wait_kind = 'approval'",
        (run_id,),
    ).fetchone()
    return row


def button(message: dict[str, Any], action_id: str) -> str:
    """The token a button of a posted approval message carries."""
    (actions,) = [b for b in message["blocks"] if b["type"] == "actions"]
    (value,) = [e["value"] for e in actions["elements"] if e["action_id"] == action_id]
    token: str = value
    return token


async def test_a_worker_killed_after_opening_a_request_posts_it_once_on_the_rescue(
    db_url: str,
    engine: Engine,
    sql: psycopg.Connection[Any],
    processes: Processes,
    slack: Slack,
) -> None:
    point = "approval.after_request"
    await engine.publish(flow("crash-request"))
    run_id = (await engine.start("crash-request", {"name": "Maya"}, event_id="e-req")).run_id

    settings = worker_settings(db_url, sweep=0.2, lease=LEASE)
    a = processes.worker(settings, "w-a", crash_at=point, sweeper=False)
    assert await a.exited(timeout=30) == -signal.SIGKILL, a.tail(3000)
    assert f"crash point {point} reached" in a.log_text()

    # the request committed; the Slack post never happened; the step's attempt is lapsing
    (request,) = approvals_of(sql, run_id)
    assert (request["status"], request["request"], request["message_ts"]) == ("pending", 1, None)
    assert await slack.messages() == []
    approve = step_row(sql, run_id, 2)
    assert (approve["step_id"], approve["status"], approve["attempt"]) == ("approve", "running", 1)
    assert approve["lease_until"] is not None
    assert len(history(sql, run_id, "approval_requested")) == 1
    assert deadline_timers(sql, run_id) == []

    b = processes.worker(settings, "w-b", sweeper=True, leader_ttl=LEASE)

    async def asked() -> dict[str, Any] | None:
        assert b.alive(), b.tail(3000)
        return waiting_on_approval(sql, run_id)

    await eventually(asked, timeout=30, what="the rescued step to wait on its approval")
    message = await slack.first_message()
    assert "Send to Maya: Hello Maya" in message["blocks"][0]["text"]["text"]

    # the same request, finished: one row, one message, its ts recorded
    (same,) = approvals_of(sql, run_id)
    assert (same["approval_id"], same["request"], same["nonce"]) == (
        request["approval_id"],
        1,
        request["nonce"],
    )
    assert same["deadline_at"] == request["deadline_at"]  # the deadline did not move
    assert same["message_ts"] == message["ts"]
    assert len(await slack.messages()) == 1
    assert len(history(sql, run_id, "approval_requested")) == 1
    assert len(history(sql, run_id, "lease_expired", seq=2)) == 1
    (timer,) = deadline_timers(sql, run_id)
    assert timer["fired_at"] is None

    got = await engine.decide(request["approval_id"], "approve", user=SAM)
    assert (got["status"], got["decided_by"]) == ("approved", SAM)
    assert await engine.wait(run_id, timeout=30) == "completed"
    assert b.alive(), b.tail(3000)

    out = approve_output(sql, run_id)
    assert (out["decision"], out["decided_by"], out["approval_id"]) == (
        "approved",
        SAM,
        request["approval_id"],
    )
    assert len(history(sql, run_id, "approval_decided")) == 1
    assert len(await slack.messages()) == 1  # nothing was posted twice, even after the decision
    assert_nothing_applied_twice(sql)
    assert b.stop() == 0


async def test_a_decider_killed_before_its_decision_commits_leaves_it_open_for_slacks_retry(
    db_url: str,
    engine: Engine,
    sql: psycopg.Connection[Any],
    processes: Processes,
    sandbox: SandboxServer,
    slack: Slack,
) -> None:
    point = "approval.after_decide"
    await engine.publish(flow("crash-decide"))
    run_id = (await engine.start("crash-decide", {"name": "Ben"}, event_id="e-dec")).run_id
    w = processes.worker(worker_settings(db_url, sweep=0.2, lease=LEASE), "w", sweeper=True)

    async def asked() -> dict[str, Any] | None:
        assert w.alive(), w.tail(3000)
        return waiting_on_approval(sql, run_id)

    await eventually(asked, timeout=30, what="the step to wait on its approval")
    message = await slack.first_message()
    (request,) = approvals_of(sql, run_id)
    (timer,) = deadline_timers(sql, run_id)
    assert timer["fired_at"] is None

    # Sam's click, handled by a process that dies inside the decision's transaction
    decider = processes.start(
        [sys.executable, "-c", DECIDE, db_url, ORG, button(message, "approve"), SAM, "approve"],
        "decider",
        env=process_env(crash_at=point),
    )
    assert await decider.exited(timeout=30) == -signal.SIGKILL, decider.tail(3000)
    assert decider.printed("deciding")
    assert f"crash point {point} reached" in decider.log_text()
    assert not decider.printed("decided")

    # the transaction died with the process: nothing of the decision is left
    (still,) = approvals_of(sql, run_id)
    assert (still["status"], still["decided_by"], still["decided_at"]) == ("pending", None, None)
    approve = step_row(sql, run_id, 2)
    assert (approve["status"], approve["wait_kind"]) == ("waiting", "approval")
    assert history(sql, run_id, "approval_decided", "approval_refused") == []
    (unfired,) = deadline_timers(sql, run_id)
    assert (unfired["timer_id"], unfired["fired_at"], unfired["fired_by"]) == (
        timer["timer_id"],
        None,
        None,
    )
    assert sql.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,)).fetchone() == {
        "status": "waiting"
    }

    # Slack got no answer and retries the click: through the real interactivity endpoint
    api = ApiServer(create_app(engine), port=0, log_level="warning", access_log=False)
    async with api:
        registered = await slack.client.post(
            "/_admin/slack/app",
            json={
                "account": WORKSPACE,
                "interactivity_url": f"{api.url}/v1/slack/slack/interactivity",
                "signing_secret": SIGNING,
            },
        )
        registered.raise_for_status()
        retried = await slack.click(message["ts"], "approve", SAM, retry_num=1)
        assert retried["status"] == 200, retried
        assert (retried["body"]["ok"], retried["body"]["outcome"]) == (True, "approved")
        assert await engine.wait(run_id, timeout=30) == "completed"
        # a further retry decides nothing new: it reads the decision back
        again = await slack.click(message["ts"], "approve", SAM, retry_num=2)
        assert (again["body"]["ok"], again["body"]["outcome"]) == (False, "decided")
    assert w.alive(), w.tail(3000)

    (decided,) = approvals_of(sql, run_id)
    assert (decided["approval_id"], decided["status"], decided["decided_by"]) == (
        request["approval_id"],
        "approved",
        SAM,
    )
    assert decided["decided_via"] == "slack"
    (event,) = history(sql, run_id, "approval_decided")
    assert event["detail"]["deadline_timer"] == timer["timer_id"]
    (closed,) = deadline_timers(sql, run_id)
    assert closed["fired_by"] == "approval"
    assert history(sql, run_id, "timer_fired") == []
    out = approve_output(sql, run_id)
    assert (out["decision"], out["decided_by"], out["via"]) == ("approved", SAM, "slack")
    assert len(await slack.messages()) == 1
    assert_nothing_applied_twice(sql)
    assert w.stop() == 0
