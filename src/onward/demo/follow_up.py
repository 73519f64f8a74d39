"""The reference scenario, ``demo-follow-up`` (``follow_up.yaml``), end to end on one machine.

The sandbox's providers (model, CRM, Slack, email) run in a child process; the engine (API,
worker, relay, sweeper) in this one. Maya's form is delivered twice; her run waits for 09:00 on
the next weekday on her clock -- the demo then skips that wait, as an operator can
(``onward timers skip``) -- drafts with the model, updates the CRM, asks Sam in Slack; the
sandbox clicks Approve as Sam (a request signed as Slack signs it, verified by the engine), the
email goes out, and the sandbox delivers Maya's reply to the inbound-email webhook, which routes
it back to the run by the message id. Then the run's timeline is printed.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx

from onward.api_keys import with_key
from onward.config import Settings
from onward.engine import Engine

FILE = "follow_up.yaml"
WORKSPACE = "T_DEMO"
MAILBOX = "acct_demo_mail"
SAM = "U_SAM"
PAYLOAD = {
    "name": "Maya",
    "email": "maya@example.test",
    "contact_id": "c_81",
    "tz": "Europe/Berlin",
    "topic": "the onboarding call",
}
T = TypeVar("T")


async def _until(
    check: Callable[[], Awaitable[T | None]], what: str, timeout: float, poll: float = 0.05
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"the demo waited {timeout:.0f}s for {what}")
        await asyncio.sleep(poll)


async def run_follow_up(
    settings: Settings,
    engine: Engine,
    api_url: str,
    key: str,
    *,
    out: Callable[[str], None],
    payload: dict[str, Any] | None,
    timeout: float,
) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    """Drive one run of the reference scenario; returns its run id and the two webhook
    answers. The engine is running (worker, relay, sweeper) and its API serves ``api_url``;
    ``key`` is an API key with ``runs:write`` (the webhook and the inbound email present it)."""
    from onward.sandbox import SandboxServer

    body = payload if payload is not None else dict(PAYLOAD)
    async with SandboxServer(mode="process") as sandbox:
        out(f"sandbox providers (model, CRM, Slack, email) at {sandbox.url}")
        await _connect(engine, sandbox.url, api_url, key, out)
        from onward.demo import deliver_twice

        answers = await deliver_twice(
            api_url, key, "demo-follow-up", body, out, event_prefix="evt_form"
        )
        run_id = answers[0][1]["run_id"]
        await _skip_the_morning(engine, run_id, out, timeout)
        await _approve_in_slack(engine, sandbox, run_id, out, timeout)
        await _reply_by_email(engine, sandbox, run_id, out, timeout)
        status = await engine.wait(run_id, timeout=timeout)
        out(f"run {run_id} {status}")
    return run_id, answers


async def _connect(
    engine: Engine, sandbox_url: str, api_url: str, key: str, out: Callable[[str], None]
) -> None:
    signing = secrets.token_hex(16)
    org = engine.org_id
    integ = engine.integrations
    # The sandbox serves on loopback, which outbound HTTP may reach only when allowed: this
    # organisation allows exactly the sandbox's address and port (onward.outbound).
    await engine.allow_outbound([sandbox_url.removeprefix("http://")])
    for connection, provider, account in (
        ("model", "model", "acct_demo_model"),
        ("crm", "crm", "acct_demo_crm"),
        ("mailbox", "email", MAILBOX),
    ):
        await integ.add_connection(
            org,
            connection,
            provider=provider,
            base_url=sandbox_url,
            account=account,
            secret=account,
        )
    await integ.add_connection(
        org,
        "slack",
        provider="slack",
        base_url=sandbox_url,
        account=WORKSPACE,
        secret=WORKSPACE,
        signing_secret=signing,
    )
    await engine.grant_approver(SAM, automation_id="demo-follow-up")
    async with httpx.AsyncClient(base_url=sandbox_url, timeout=10.0) as admin:
        for path, body in (
            (
                "/_admin/slack/app",
                {
                    "account": WORKSPACE,
                    "interactivity_url": f"{api_url}/v1/slack/slack/interactivity",
                    "signing_secret": signing,
                },
            ),
            (
                "/_admin/email/inbound",
                # the mail provider can only be given a URL: the key rides in it (Basic)
                {"account": MAILBOX, "inbound_url": with_key(f"{api_url}/v1/inbound/email", key)},
            ),
        ):
            (await admin.post(path, json=body)).raise_for_status()
    out(
        "connections: model, crm, mailbox, slack (clicks go to "
        f"{api_url}/v1/slack/slack/interactivity, signed); approver {SAM} granted"
    )


async def _step(engine: Engine, run_id: str, step_id: str, status: str) -> dict[str, Any] | None:
    view = await engine.show(run_id)
    for step in view["steps"]:
        if step["step_id"] == step_id and step["status"] == status:
            return dict(step)
    return None


async def _skip_the_morning(
    engine: Engine, run_id: str, out: Callable[[str], None], timeout: float
) -> None:
    await _until(lambda: _step(engine, run_id, "morning", "waiting"), "the 09:00 wait", timeout)
    (moved,) = await engine.skip_wait(run_id)
    out(
        f"waiting until 09:00 on the next weekday in Europe/Berlin (+ spread): due "
        f"{moved['from']:%a %Y-%m-%d %H:%M:%S} UTC; the demo skips it "
        f"(`onward timers skip --run {run_id}`)"
    )


async def _approve_in_slack(
    engine: Engine, sandbox: Any, run_id: str, out: Callable[[str], None], timeout: float
) -> None:
    await _until(lambda: _step(engine, run_id, "approve", "waiting"), "the approval", timeout)
    messages = await asyncio.to_thread(sandbox.admin.slack_messages, None, WORKSPACE)
    message = messages[-1]
    shown = message["blocks"][0]["text"]["text"].replace("\n", " ")
    out(f"Slack {message['channel']}: {shown[:110]}... [Approve] [Reject]")
    clicked = await asyncio.to_thread(sandbox.admin.click, message["ts"], "approve", SAM)
    answer = clicked.get("body") or {}
    out(f"{SAM} clicks Approve (signed by Slack's rules) -> {clicked.get('status')} {answer}")


async def _reply_by_email(
    engine: Engine, sandbox: Any, run_id: str, out: Callable[[str], None], timeout: float
) -> None:
    await _until(
        lambda: _step(engine, run_id, "wait_reply", "waiting"), "the wait for a reply", timeout
    )
    sent = await _step(engine, run_id, "send", "done")
    message_id = (sent or {}).get("output", {}).get("message_id")
    if not message_id:
        raise RuntimeError("the send step recorded no message id")
    out(f"email {message_id} sent to Maya; correlation key email:{message_id} recorded")
    replied = await asyncio.to_thread(
        lambda: sandbox.admin.reply(message_id, "Yes, Thursday works for me.", deliveries=2)
    )
    codes = [d["status"] for d in replied["deliveries"]]
    out(f"Maya replies (delivered twice by the provider) -> {codes}: routed by In-Reply-To")
