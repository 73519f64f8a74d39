"""People in the loop from the command line (R9, R10): ``onward approvers``, ``onward signal`` /
``signals``, ``onward approvals`` and ``onward timers skip``, each a real ``onward`` process
against the test's database. What was asked wrongly or refused is one line ``onward: ...`` and
exit 2; nothing anywhere prints a traceback.

The pending approval the ``approvals`` commands act on is a real one: a worker in the test's
process runs an ``approval`` step against the sandbox's Slack, which posts the request.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from typing import Any

import httpx
import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.sandbox import SandboxServer
from onward.testing import eventually, history, run_onward

pytestmark = pytest.mark.usefixtures("admin")  # a clean sandbox for each test

ORG = "test"  # the `settings` fixture's organisation: the engine's and the commands'
WORKSPACE = "T_CLI"
SAM, ANA, EVE = "U_SAM", "U_ANA", "U_EVE"
SIGNAL_KEYS = {"signal_id", "name", "status", "run_id", "seq", "duplicate", "reason", "deliveries"}


def onward(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``onward --org test ARGS`` to completion; never a traceback, whatever the outcome."""
    result = run_onward(db_url, "--org", ORG, *args)
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout
    return result


async def onward_async(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """:func:`onward` off the event loop (a worker in this process keeps running meanwhile)."""
    return await asyncio.to_thread(onward, db_url, *args)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], needle: str) -> str:
    """Exit 2 with one line ``onward: ...`` on stderr containing ``needle``; that line."""
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("onward: "), result.stderr
    assert needle in lines[0], lines[0]
    assert result.stdout == ""
    return lines[0]


# -- onward approvers --------------------------------------------------------------------------


def test_approvers_grant_list_revoke_and_a_missing_grant(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    assert ok(onward(db_url, "approvers", "list")) == "no approvers\n"
    assert ok(onward(db_url, "approvers", "grant", "U1")) == "granted U1 for *\n"
    scoped = onward(db_url, "approvers", "grant", "U1", "--automation", "A")
    assert ok(scoped) == "granted U1 for A\n"
    assert ok(onward(db_url, "approvers", "list")).splitlines() == ["U1  *  live", "U1  A  live"]

    assert ok(onward(db_url, "approvers", "revoke", "U1")) == "revoked U1 for *\n"
    listed = ok(onward(db_url, "approvers", "list")).splitlines()
    assert listed[0].startswith("U1  *  revoked 20") and listed[1] == "U1  A  live", listed
    rows = json.loads(ok(onward(db_url, "approvers", "list", "--json")))
    assert [set(r) for r in rows] == [{"approver", "scope", "granted_at", "revoked_at"}] * 2
    assert [(r["scope"], r["revoked_at"] is None) for r in rows] == [("*", False), ("A", True)]

    # revoked already, never granted, another scope: refused, one line, nothing changed
    refused(onward(db_url, "approvers", "revoke", "U1"), "no live grant for U1 on *")
    refused(onward(db_url, "approvers", "revoke", "U2"), "no live grant for U2 on *")
    missing = onward(db_url, "approvers", "revoke", "U1", "--automation", "B")
    refused(missing, "no live grant for U1 on B")
    live = sql.execute(
        "SELECT approver, scope FROM approvers WHERE org_id = %s AND revoked_at IS NULL", (ORG,)
    ).fetchall()
    assert live == [{"approver": "U1", "scope": "A"}]

    # granting again restores a revoked grant
    assert ok(onward(db_url, "approvers", "grant", "U1")) == "granted U1 for *\n"
    assert ok(onward(db_url, "approvers", "list")).splitlines() == ["U1  *  live", "U1  A  live"]


# -- onward signal / signals -------------------------------------------------------------------


def test_signal_by_key_is_unrouted_then_a_repeat_and_bad_requests_are_refused(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    first = ok(onward(db_url, "signal", "reply", "--id", "e1", "--key", "email:m1"))
    assert first == (
        "signal e1 reply: unrouted -> nobody yet (unrouted: kept until its key is recorded)\n"
    )
    again = ok(onward(db_url, "signal", "reply", "--id", "e1", "--key", "email:m1"))
    assert again.startswith("signal e1 reply: unrouted -> ")
    assert again.rstrip().endswith("(a repeat of a stored signal)"), again
    answer = json.loads(
        ok(onward(db_url, "signal", "reply", "--id", "e1", "--key", "email:m1", "--json"))
    )
    assert set(answer) == SIGNAL_KEYS
    assert {k: answer[k] for k in ("signal_id", "name", "status", "run_id", "duplicate")} == {
        "signal_id": "e1",
        "name": "reply",
        "status": "unrouted",
        "run_id": None,
        "duplicate": True,
    }
    assert answer["deliveries"] == 3

    # an unknown run; neither or both of --run / --key; a payload that is not a JSON object
    refused(onward(db_url, "signal", "reply", "--id", "e2", "--run", "nope"), "unknown run 'nope'")
    refused(onward(db_url, "signal", "reply", "--id", "e3"), "give --run or --key")
    both = onward(db_url, "signal", "reply", "--id", "e4", "--run", "r", "--key", "email:m1")
    refused(both, "give --run or --key")
    bad = onward(db_url, "signal", "reply", "--id", "e5", "--key", "email:m1", "-p", "{bad")
    refused(bad, "--payload: not valid JSON")
    stored = sql.execute("SELECT signal_id, deliveries FROM signals ORDER BY signal_id").fetchall()
    assert stored == [{"signal_id": "e1", "deliveries": 3}]  # nothing refused was stored

    # a payload that is one is kept with the signal
    with_payload = onward(
        db_url, "signal", "reply", "--id", "e7", "--key", "email:m2", "-p", '{"text": "yes"}'
    )
    assert "unrouted" in ok(with_payload)
    kept = sql.execute("SELECT payload FROM signals WHERE signal_id = 'e7'").fetchone()
    assert kept == {"payload": {"text": "yes"}}

    listed = ok(onward(db_url, "signals", "--unrouted")).splitlines()
    assert len(listed) == 2, listed
    assert re.search(r"\be7\s+reply\s+unrouted\s+-\s+x1$", listed[0]), listed
    assert re.search(r"\be1\s+reply\s+unrouted\s+-\s+x3$", listed[1]), listed
    rows = json.loads(ok(onward(db_url, "signals", "--unrouted", "--json")))
    assert [(r["signal_id"], r["correlation_key"]) for r in rows] == [
        ("e7", "email:m2"),
        ("e1", "email:m1"),
    ]
    assert {(r["status"], r["run_id"], r["seq"]) for r in rows} == {("unrouted", None, None)}
    assert ok(onward(db_url, "signals", "--status", "consumed")) == "no signals\n"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("{bad", "--payload: not valid JSON"),
        ('{"a": "x\\u0000y"}', "--payload: $.a: \\u0000 (NUL) cannot be stored"),
        ("[1]", "--payload: the payload must be a JSON object"),
        ("@/nonexistent/payload.json", "--payload: cannot read /nonexistent/payload.json"),
    ],
)
def test_a_signal_payload_that_cannot_be_taken_is_one_line_and_exit_2(
    db_url: str, sql: psycopg.Connection[Any], payload: str, message: str
) -> None:
    result = onward(db_url, "signal", "reply", "--id", "e1", "--key", "email:m1", "-p", payload)
    refused(result, message)
    assert sql.execute("SELECT count(*) AS n FROM signals").fetchone() == {"n": 0}


# -- onward approvals --------------------------------------------------------------------------


async def pending_approval(engine: Engine, sandbox: SandboxServer, sql: Any) -> tuple[str, str]:
    """A run whose ``approval`` step asked SAM and ANA in the sandbox's Slack and now waits;
    its run id and approval id. The worker ran in this process and is stopped again."""
    await engine.integrations.add_connection(
        engine.org_id,
        "slack",
        provider="slack",
        base_url=sandbox.url,
        account=WORKSPACE,
        secret=WORKSPACE,
    )
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
    run_id = (await engine.start("approve", {"name": "Maya"}, event_id="cli-1")).run_id
    async with httpx.AsyncClient(base_url=sandbox.url, timeout=30) as admin:

        async def posted() -> Any:
            reply = await admin.get("/_admin/slack/messages", params={"account": WORKSPACE})
            return reply.json()["data"]

        async with engine.running():
            await eventually(posted, what="the approval's Slack message")

            async def waits() -> Any:
                return sql.execute(
                    "SELECT 1 FROM steps WHERE run_id = %s AND status = 'waiting' "
                    "AND wait_kind = 'approval'",
                    (run_id,),
                ).fetchone()

            await eventually(waits, what="the step to wait on its approval")
    (request,) = await engine.approvals(run_id=run_id)
    return run_id, request["approval_id"]


async def test_approvals_list_and_decide_on_a_real_request(
    db_url: str, engine: Engine, sandbox: SandboxServer, sql: psycopg.Connection[Any]
) -> None:
    await engine.grant_approver(SAM)
    await engine.grant_approver(ANA)
    run_id, approval_id = await pending_approval(engine, sandbox, sql)

    listed = ok(await onward_async(db_url, "approvals", "list")).splitlines()
    assert len(listed) == 1 and listed[0].startswith(f"{approval_id}  pending  asks U_SAM, U_ANA")
    rows = json.loads(
        ok(await onward_async(db_url, "approvals", "list", "--status", "pending", "--json"))
    )
    assert [(r["approval_id"], r["run_id"], r["status"]) for r in rows] == [
        (approval_id, run_id, "pending")
    ]
    assert rows[0]["approvers"] == [SAM, ANA] and rows[0]["message_ts"]

    # refusals: an unknown request, a bad decision, somebody who may not decide
    unknown = await onward_async(db_url, "approvals", "decide", "nope", "approve", "--as", SAM)
    refused(unknown, "unknown approval 'nope'")
    maybe = await onward_async(db_url, "approvals", "decide", approval_id, "maybe", "--as", SAM)
    refused(maybe, "decision: approve or reject, not 'maybe'")
    eve = await onward_async(db_url, "approvals", "decide", approval_id, "approve", "--as", EVE)
    refused(eve, f"{EVE} may not decide this request (not asked, or permission revoked)")
    assert (await engine.approval(approval_id))["status"] == "pending"

    decided = await onward_async(db_url, "approvals", "decide", approval_id, "approve", "--as", SAM)
    assert ok(decided) == f"{approval_id}: approved by {SAM}\n"
    # the first decision wins: a later one is refused and reads it back
    late = await onward_async(db_url, "approvals", "decide", approval_id, "reject", "--as", ANA)
    refused(late, f"already approved by {SAM} at ")

    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    after = ok(await onward_async(db_url, "approvals", "list", "--status", "approved"))
    assert after.startswith(f"{approval_id}  approved by {SAM} (api)  asks U_SAM, U_ANA"), after
    assert ok(await onward_async(db_url, "approvals", "list", "--status", "pending")) == (
        "no approval requests\n"
    )
    reasons = [h["detail"]["reason"] for h in history(sql, run_id, "approval_refused")]
    assert reasons == ["not_permitted"]  # the late one read the decision back, unrecorded
    (event,) = history(sql, run_id, "approval_decided")
    assert (event["detail"]["decided_by"], event["detail"]["via"]) == (SAM, "api")


# -- onward timers skip ------------------------------------------------------------------------


async def test_timers_skip_fires_a_long_wait_now_and_says_when_there_is_none(
    db_url: str, engine: Engine, sql: psycopg.Connection[Any]
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
        skipped = ok(await onward_async(db_url, "timers", "skip", "--run", run_id))
        assert skipped.startswith(f"{run_id} timer {timer['timer_id']} (wait): "), skipped
        assert skipped.rstrip().endswith(" -> now"), skipped
        assert await engine.wait(run_id, timeout=30) == "completed"

    (moved,) = history(sql, run_id, "timer_moved")
    assert moved["detail"]["reason"] == "skipped by an operator"
    assert moved["detail"]["timer_id"] == timer["timer_id"]
    assert len(history(sql, run_id, "timer_fired")) == 1

    # a finished run and a run not yet waiting wait on no timer; an unknown run is refused
    idle = (await engine.start("slow", {}, event_id="skip-2")).run_id  # no worker runs now
    done = ok(await onward_async(db_url, "timers", "skip", "--run", run_id))
    assert done == f"{run_id} waits on no timer\n"
    assert (
        json.loads(ok(await onward_async(db_url, "timers", "skip", "--run", idle, "--json"))) == []
    )
    refused(await onward_async(db_url, "timers", "skip", "--run", "nope"), "unknown run 'nope'")
    assert history(sql, idle, "timer_moved") == []
