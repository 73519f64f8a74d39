"""Signals over real HTTP (R9): ``POST /v1/signals``, ``GET /v1/signals`` and the provider-shaped
inbound-email webhook, served by uvicorn on a free port (``ApiServer``) against a real
PostgreSQL; the email replies come from the provider sandbox, which POSTs them to the engine's
inbound URL as the provider would, duplicates included.

* ``POST /v1/signals``: 202 for a new signal (``consumed`` when its step waits, ``pending``
  when it does not yet), 200 for a repeat with the same answer, 404 for an unknown run, 409
  ``signal_refused`` for a finished run (recorded as refused), 422 for what cannot be accepted
  as sent (nothing stored).
* ``GET /v1/signals?unrouted=true``: a signal whose correlation key nobody recorded is kept.
* ``POST /v1/inbound/email``: a reply to the message a run's ``email.send`` step sent is routed
  by ``in_reply_to`` to that run; three deliveries of one event are one signal (202, 200, 200);
  an unsubscribe is the signal ``unsubscribe`` and suppresses its sender.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from onward import Automation
from onward.api import ApiServer, create_app
from onward.api_keys import with_key
from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import api_key, auth, eventually, history

pytestmark = pytest.mark.usefixtures("admin")  # every test starts on a clean sandbox

ORG = "test"  # the `settings` fixture's organisation
MAYA = "maya@example.test"
ACCOUNT = "acct_1"  # the sandbox account of the connection (its bearer secret)
SAME_ANSWER = ("signal_id", "name", "status", "run_id", "seq", "reason")


def flow(automation_id: str = "reply", *, deadline: str = "30s") -> dict[str, Any]:
    return (
        Automation(automation_id)
        .step("wait", "wait_signal", signals=["reply", "unsubscribe"], deadline=deadline)
        .step("after", "set", values={"got": "steps.wait.signal"})
        .build()
    )


def email_flow() -> dict[str, Any]:
    """Send an email through the sandbox, wait for its reply (or an unsubscribe), branch."""
    return (
        Automation("follow-up")
        .step(
            "send",
            "email.send",
            connection="mailbox",
            to=MAYA,
            subject="Shall we talk?",
            body="Hi {input.name}, reply yes to book a call.",
        )
        .step("wait", "wait_signal", signals=["reply", "unsubscribe"], deadline="30s")
        .branch("route", cases=[("steps.wait.signal == 'reply'", "book")], default="drop")
        .step("book", "set", end=True, values={"outcome": "'booked'"})
        .step("drop", "set", values={"outcome": "'dropped'"})
        .build()
    )


@pytest.fixture
async def api(engine: Engine) -> AsyncIterator[ApiServer]:
    async with ApiServer(create_app(engine), port=0, log_level="warning", access_log=False) as s:
        yield s


@pytest.fixture
async def http(engine: Engine, api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    headers = auth(await api_key(engine))
    async with httpx.AsyncClient(base_url=api.url, timeout=30, headers=headers) as client:
        yield client


async def post_signal(http: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await http.post("/v1/signals", json=body)


async def waits_on_signals(sql: psycopg.Connection[Any], run_id: str) -> None:
    async def check() -> Any:
        return sql.execute(
            "SELECT 1 FROM steps WHERE run_id = %s AND status = 'waiting' AND wait_kind = 'signal'",
            (run_id,),
        ).fetchone()

    await eventually(check, what="the step to wait on signals")


def signal_rows(sql: psycopg.Connection[Any], run_id: str | None = None) -> list[dict[str, Any]]:
    if run_id is None:
        return list(sql.execute("SELECT * FROM signals ORDER BY received_at").fetchall())
    return list(
        sql.execute(
            "SELECT * FROM signals WHERE run_id = %s ORDER BY received_at", (run_id,)
        ).fetchall()
    )


def step_output(sql: psycopg.Connection[Any], run_id: str, step_id: str) -> Any:
    row = sql.execute(
        # a step's output, as every reader reads it (a `set` step's is its variables: 0032)
        "SELECT onward_step_output(s) AS output FROM steps s WHERE s.run_id = %s AND s.step_id = %s",
        (run_id, step_id),
    ).fetchone()
    assert row is not None
    return row["output"]


# -- POST /v1/signals --------------------------------------------------------------------------
async def test_a_new_signal_is_202_and_a_repeat_200_with_the_same_answer(
    engine: Engine, http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(flow())
    early = (await engine.start("reply", {}, event_id="e-early")).run_id
    waiting = (await engine.start("reply", {}, event_id="e-waiting")).run_id

    # no worker yet: the step of `early` does not wait, so the signal is kept (pending)
    kept = {"signal_id": "evt-kept", "name": "reply", "run_id": early, "payload": {"n": 1}}
    first = await post_signal(http, kept)
    assert first.status_code == 202, first.text
    assert (first.json()["status"], first.json()["duplicate"]) == ("pending", False)
    repeat = await post_signal(http, kept)
    assert repeat.status_code == 200, repeat.text
    assert {k: repeat.json()[k] for k in SAME_ANSWER} == {k: first.json()[k] for k in SAME_ANSWER}
    assert (repeat.json()["duplicate"], repeat.json()["deliveries"]) == (True, 2)

    async with engine.running():
        await waits_on_signals(sql, waiting)
        body = {"signal_id": "evt-now", "name": "unsubscribe", "run_id": waiting}
        now = await post_signal(http, body)
        assert now.status_code == 202, now.text
        answer = now.json()
        assert answer == {
            "signal_id": "evt-now",
            "name": "unsubscribe",
            "status": "consumed",
            "run_id": waiting,
            "seq": 1,
            "duplicate": False,
            "reason": None,
            "deliveries": 1,
        }
        again = await post_signal(http, body)
        assert again.status_code == 200, again.text
        assert again.json() == {**answer, "duplicate": True, "deliveries": 2}
        assert await engine.wait(waiting, timeout=30) == "completed"
        assert await engine.wait(early, timeout=30) == "completed"  # took the kept one

    assert step_output(sql, waiting, "wait")["signal"] == "unsubscribe"
    assert step_output(sql, early, "wait")["payload"] == {"n": 1}
    assert [(r["signal_id"], r["status"], r["deliveries"]) for r in signal_rows(sql)] == [
        ("evt-kept", "consumed", 2),
        ("evt-now", "consumed", 2),
    ]
    assert len(history(sql, waiting, "signal_consumed")) == 1
    assert len(history(sql, early, "signal_consumed")) == 1


async def test_unknown_runs_are_404_and_finished_runs_409_recorded_as_refused(
    engine: Engine, http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    unknown = await post_signal(http, {"signal_id": "evt-x", "name": "reply", "run_id": "run_no"})
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["error"] == "unknown_run"
    assert signal_rows(sql) == []

    await engine.publish(flow("quick", deadline="0.2s"))
    run_id = (await engine.start("quick", {}, event_id="e-done")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    assert step_output(sql, run_id, "wait")["timed_out"] is True

    body = {"signal_id": "evt-late", "name": "reply", "run_id": run_id}
    refused = await post_signal(http, body)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "signal_refused"
    assert "completed" in refused.json()["detail"]
    (row,) = signal_rows(sql, run_id)
    assert (row["signal_id"], row["status"], row["deliveries"]) == ("evt-late", "refused", 1)
    assert "completed" in row["reason"]
    (recorded,) = history(sql, run_id, "signal_refused")
    assert recorded["detail"]["signal_id"] == "evt-late"

    again = await post_signal(http, body)  # a repeat is refused the same way, stored once
    assert again.status_code == 409, again.text
    assert again.json()["error"] == "signal_refused"
    (row,) = signal_rows(sql, run_id)
    assert (row["status"], row["deliveries"]) == ("refused", 2)
    assert len(history(sql, run_id, "signal_refused")) == 1

    listed = await http.get("/v1/signals", params={"status": "refused"})
    assert listed.status_code == 200, listed.text
    assert [(s["signal_id"], s["status"]) for s in listed.json()] == [("evt-late", "refused")]


@pytest.mark.parametrize(
    ("body", "error", "says"),
    [
        pytest.param(
            {"signal_id": "evt-1", "name": "reply"},
            "invalid_input",
            "one of them",
            id="neither run nor key",
        ),
        pytest.param(
            {"signal_id": "evt-1", "name": "reply", "run_id": "RUN", "correlation_key": "k:1"},
            "invalid_input",
            "one of them",
            id="both run and key",
        ),
        pytest.param(
            {"signal_id": "evt-1", "name": "", "run_id": "RUN"},
            "invalid_request",
            "body.name",
            id="empty name",
        ),
        pytest.param(
            {"signal_id": "evt-1", "name": "reply", "run_id": "RUN", "payload": {"t": "a\x00b"}},
            "invalid_input",
            "NUL",
            id="NUL in payload",
        ),
        pytest.param(
            {"signal_id": "evt-1", "name": "reply", "run_id": "RUN", "urgent": True},
            "invalid_request",
            "body.urgent",
            id="unknown field",
        ),
    ],
)
async def test_a_signal_that_cannot_be_accepted_as_sent_is_422_and_stores_nothing(
    body: dict[str, Any],
    error: str,
    says: str,
    engine: Engine,
    http: httpx.AsyncClient,
    sql: psycopg.Connection[Any],
) -> None:
    await engine.publish(flow())
    run_id = (await engine.start("reply", {}, event_id="e-422")).run_id
    body = {k: run_id if v == "RUN" else v for k, v in body.items()}
    answer = await post_signal(http, body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == error, answer.text
    assert says in answer.json()["detail"], answer.text
    assert signal_rows(sql) == []


async def test_an_unrouted_signal_is_kept_and_listed(
    http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    body = {"signal_id": "evt-u", "name": "reply", "correlation_key": "email:msg_nobody"}
    kept = await post_signal(http, body)
    assert kept.status_code == 202, kept.text
    assert (kept.json()["status"], kept.json()["run_id"]) == ("unrouted", None)
    again = await post_signal(http, body)
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "unrouted" and again.json()["duplicate"] is True

    listed = await http.get("/v1/signals", params={"unrouted": "true"})
    assert listed.status_code == 200, listed.text
    (view,) = listed.json()
    assert (view["signal_id"], view["correlation_key"], view["run_id"], view["status"]) == (
        "evt-u",
        "email:msg_nobody",
        None,
        "unrouted",  # listed as what it is: pending, with nobody to route it to
    )
    assert view["deliveries"] == 2
    everything = await http.get("/v1/signals")
    assert [s["signal_id"] for s in everything.json()] == ["evt-u"]
    (row,) = signal_rows(sql)
    assert (row["run_id"], row["status"]) == (None, "pending")  # kept, not settled


# -- POST /v1/inbound/email, from the sandbox ---------------------------------------------------
async def sent_and_waiting(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    api: ApiServer,
    sql: psycopg.Connection[Any],
    event_id: str,
) -> tuple[str, str]:
    """Connect the sandbox's email, send through it, wait for the reply: (run_id, message id)."""
    await engine.integrations.add_connection(
        ORG, "mailbox", provider="email", base_url=sandbox.url, account=ACCOUNT, secret=ACCOUNT
    )
    key = await api_key(engine, "runs:write")
    admin.email_inbound(ACCOUNT, with_key(f"{api.url}/v1/inbound/email", key))
    await engine.publish(email_flow())
    run_id = (await engine.start("follow-up", {"name": "Maya"}, event_id=event_id)).run_id
    await waits_on_signals(sql, run_id)
    sent = step_output(sql, run_id, "send")
    assert sent["sent"] is True
    (message,) = [m for m in admin.email_messages(account=ACCOUNT) if m["direction"] == "outbound"]
    assert message["id"] == sent["message_id"]
    return run_id, str(sent["message_id"])


async def test_an_email_reply_delivered_three_times_completes_the_run_once(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    api: ApiServer,
    sql: psycopg.Connection[Any],
) -> None:
    async with engine.running():
        run_id, message_id = await sent_and_waiting(engine, sandbox, admin, api, sql, "e-mail")
        # the admin client is synchronous; the engine serves the inbound URL on this loop
        result = await asyncio.to_thread(admin.reply, message_id, text="yes", deliveries=3)
        assert await engine.wait(run_id, timeout=30) == "completed"

    assert [d["status"] for d in result["deliveries"]] == [202, 200, 200], result
    answers = [d["body"] for d in result["deliveries"]]
    assert answers[0]["status"] == "consumed" and answers[0]["duplicate"] is False
    assert all(a["duplicate"] and a["status"] == "consumed" for a in answers[1:])
    assert [a["deliveries"] for a in answers] == [1, 2, 3]
    out = step_output(sql, run_id, "wait")
    assert (out["signal"], out["timed_out"]) == ("reply", False)
    assert out["payload"]["text"] == "yes"
    assert out["payload"]["in_reply_to"] == message_id
    assert out["payload"]["from"] == MAYA
    assert step_output(sql, run_id, "book") == {"outcome": "booked"}
    (row,) = signal_rows(sql, run_id)
    assert row["signal_id"] == f"email:{result['event_id']}"
    assert (row["name"], row["status"], row["deliveries"]) == ("reply", "consumed", 3)
    assert row["correlation_key"] == f"email:{message_id}"
    assert len(history(sql, run_id, "signal_consumed")) == 1
    assert sql.execute("SELECT count(*) AS n FROM suppressions").fetchone() == {"n": 0}


async def test_an_unsubscribe_by_email_is_its_own_signal_and_suppresses_the_sender(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    api: ApiServer,
    sql: psycopg.Connection[Any],
) -> None:
    async with engine.running():
        run_id, message_id = await sent_and_waiting(engine, sandbox, admin, api, sql, "e-unsub")
        result = await asyncio.to_thread(admin.reply, message_id, kind="unsubscribe")
        assert await engine.wait(run_id, timeout=30) == "completed"

    assert [d["status"] for d in result["deliveries"]] == [202], result
    out = step_output(sql, run_id, "wait")
    assert (out["signal"], out["timed_out"]) == ("unsubscribe", False)
    assert step_output(sql, run_id, "drop") == {"outcome": "dropped"}
    (row,) = signal_rows(sql, run_id)
    assert (row["name"], row["status"], row["deliveries"]) == ("unsubscribe", "consumed", 1)
    suppressed = sql.execute(
        "SELECT contact, channel, reason FROM suppressions WHERE org_id = %s", (ORG,)
    ).fetchall()
    assert [(s["contact"], s["channel"]) for s in suppressed] == [(MAYA, "email")]
    assert "unsubscribed" in suppressed[0]["reason"]
