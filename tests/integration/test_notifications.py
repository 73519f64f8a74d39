"""Notifications that arrive (R15), against real PostgreSQL and the sandbox over real HTTP.

* A broken connection (a provider answering 401 during an ``email.send``) reaches the
  organisation's webhook exactly once although the receiver fails twice: the receiver counts
  3 attempts and 1 distinct notification, every attempt carried the same ``webhook-id`` and a
  signature that holds, and ``delivered_at`` is written.
* The intent is written in the statement that writes the notification: an organisation with no
  destination keeps it undelivered (the doctor warns, and never fails the exit code for it),
  and the first destination set receives it.
* A receiver that keeps failing: the intent fails after its attempts (full-jitter backoff
  between them), and an operator's retry delivers it.
* An email destination: the notification is sent once through the sandbox's email provider,
  keyed by the notification id.
* Bad input -- an invalid URL, an unknown kind, a bad secret -- is refused with the reason and
  stores nothing.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.doctor import run_checks
from onward.engine import Engine
from onward.errors import InvalidInput
from onward.notify import DeliveryRelay, new_secret, webhook_id
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import eventually

pytestmark = pytest.mark.usefixtures("admin")

ORG = "test"
MAYA = "maya@example.test"


async def connect_mailbox(engine: Engine, sandbox: SandboxServer) -> None:
    await engine.integrations.add_connection(
        ORG, "mailbox", provider="email", base_url=sandbox.url, account="acct_1", secret="acct_1"
    )


async def publish_send_once(engine: Engine) -> None:
    flow = (
        Automation("send-once")
        .step("send", "email.send", connection="mailbox", to=MAYA, subject="Hi", body="Hello")
        .step("after", "set", values={"done": "true"})
    )
    await engine.publish(flow.build())


def notification_rows(sql: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return [
        dict(r)
        for r in sql.execute(
            "SELECT notification_id, kind, subject, delivered_at FROM notifications"
            " WHERE org_id = %s ORDER BY notification_id",
            (ORG,),
        ).fetchall()
    ]


def delivery_rows(sql: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return [
        dict(r)
        for r in sql.execute(
            "SELECT notification_id, destination_id, status, attempts, last_status, last_error,"
            " delivered_at FROM notification_deliveries WHERE org_id = %s"
            " ORDER BY notification_id, destination_id",
            (ORG,),
        ).fetchall()
    ]


async def break_mailbox_with_a_run(engine: Engine, admin: SandboxAdmin) -> str:
    """A run's email.send meets a 401: the connection is marked broken (the notification
    written), the run parks."""
    await publish_send_once(engine)
    admin.revoke("email", "acct_1")
    run_id = (await engine.start("send-once", {"name": "Maya"}, event_id="n1")).run_id
    assert await engine.wait(run_id, timeout=20) == "parked"
    return str(run_id)


async def test_a_broken_connection_reaches_the_webhook_once_despite_two_failures(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    await connect_mailbox(engine, sandbox)
    secret = new_secret()
    admin.hook_inbox("acme", fail_next=2, secret=secret)
    dest = await engine.set_notification_destination(
        "ops", url=admin.hook_url("acme"), secret=secret
    )
    assert (dest["kind"], dest["url"], dest["backlog"]) == ("webhook", admin.hook_url("acme"), 0)

    async with engine.running():
        await break_mailbox_with_a_run(engine, admin)
        (note,) = notification_rows(sql)

        async def delivered() -> dict[str, Any] | None:
            rows = notification_rows(sql)
            return rows[0] if rows[0]["delivered_at"] is not None else None

        await eventually(delivered, timeout=20, what="delivered_at")

    got = admin.hook_received("acme")
    assert (got["attempts"], got["distinct"]) == (3, 1)
    assert [a["status"] for a in got["log"]] == [503, 503, 200]
    assert {a["webhook_id"] for a in got["log"]} == {webhook_id(note["notification_id"])}
    assert all(a["signature_ok"] for a in got["log"])
    (received,) = got["received"]
    event = received["event"]
    assert event["type"] == "connection_broken"
    assert event["data"]["subject"] == "reconnect the email account acct_1"
    assert event["data"]["connection_id"] == "mailbox"
    assert event["data"]["id"] == webhook_id(note["notification_id"])
    (delivery,) = delivery_rows(sql)
    assert (delivery["status"], delivery["attempts"], delivery["last_status"]) == (
        "delivered",
        3,
        200,
    )
    assert delivery["delivered_at"] is not None
    listed = await engine.notifications()
    assert listed[0]["delivered_at"] is not None
    assert listed[0]["deliveries"][0]["status"] == "delivered"


async def test_a_notification_with_no_destination_waits_for_the_first_one(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    await connect_mailbox(engine, sandbox)
    admin.revoke("email", "acct_1")
    assert await engine.integrations.probe(ORG, "mailbox") is not None  # marks it broken
    (note,) = notification_rows(sql)
    assert delivery_rows(sql) == []  # nowhere to go yet

    checks = {c.name: c for c in await run_checks(engine, grace=0.0)}
    warn = checks["undelivered_notifications"]
    assert (warn.ok, warn.warning, warn.value) == (False, True, 1)
    assert "no destination" in warn.detail

    dest = await engine.set_notification_destination("ops", url=admin.hook_url("late"))
    assert dest["backlog"] == 1 and dest["secret"].startswith("whsec_")
    async with engine.running():

        async def delivered() -> bool:
            return notification_rows(sql)[0]["delivered_at"] is not None

        await eventually(delivered, timeout=20, what="the backlog delivered")
    got = admin.hook_received("late")
    assert (got["attempts"], got["distinct"]) == (1, 1)
    assert got["received"][0]["webhook_id"] == webhook_id(note["notification_id"])
    checks = {c.name: c for c in await run_checks(engine, grace=0.0)}
    assert checks["undelivered_notifications"].ok


async def test_a_receiver_that_keeps_failing_fails_the_intent_and_a_retry_delivers(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    await connect_mailbox(engine, sandbox)
    admin.hook_inbox("down", fail_next=3)
    await engine.set_notification_destination("ops", url=admin.hook_url("down"))
    admin.revoke("email", "acct_1")
    await engine.integrations.probe(ORG, "mailbox")
    relay = DeliveryRelay(
        engine.pool, engine.integrations, worker_id="t", max_attempts=3, backoff=(0.01, 0.05)
    )
    try:

        async def failed() -> bool:
            await relay.run_once()
            return delivery_rows(sql)[0]["status"] == "failed"

        await eventually(failed, timeout=20, what="the intent failed")
        (row,) = delivery_rows(sql)
        assert (row["attempts"], row["last_status"]) == (3, 503)
        assert "HTTP 503" in row["last_error"]
        assert await relay.run_once() == 0  # failed: nobody claims it any more
        assert notification_rows(sql)[0]["delivered_at"] is None

        (note,) = notification_rows(sql)
        retried = await engine.retry_notifications(note["notification_id"])
        assert [r["destination_id"] for r in retried] == ["ops"]
        assert await relay.run_once() == 1
    finally:
        await relay.aclose()
    (row,) = delivery_rows(sql)
    assert (row["status"], row["attempts"]) == ("delivered", 4)
    assert notification_rows(sql)[0]["delivered_at"] is not None
    assert admin.hook_received("down")["attempts"] == 4
    with pytest.raises(InvalidInput, match="no notification 999999"):
        await engine.retry_notifications(999999)


async def test_an_email_destination_sends_the_notification_once(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    await connect_mailbox(engine, sandbox)
    await engine.integrations.add_connection(
        ORG, "alerts", provider="email", base_url=sandbox.url, account="acct_2", secret="acct_2"
    )
    await engine.set_notification_destination(
        "mail", "email", connection_id="alerts", target="ops@acme.test"
    )
    admin.revoke("email", "acct_1")
    await engine.integrations.probe(ORG, "mailbox")
    async with engine.running():

        async def delivered() -> bool:
            return notification_rows(sql)[0]["delivered_at"] is not None

        await eventually(delivered, timeout=20, what="the email notification")
    (note,) = notification_rows(sql)
    (sent,) = admin.ledger("email", account="acct_2")
    assert sent["idempotency_key"] == f"{webhook_id(note['notification_id'])}/mail"
    (message,) = [m for m in admin.email_messages("acct_2") if m["direction"] == "outbound"]
    assert message["to"] == "ops@acme.test"
    assert message["subject"] == "reconnect the email account acct_1"


@pytest.mark.parametrize(
    ("kind", "options", "reason"),
    [
        ("webhook", {"url": "not a url"}, "url"),
        ("webhook", {"url": "ftp://example.test/x"}, "http:// or https://"),
        ("webhook", {"url": "http:///nohost"}, "url"),
        ("webhook", {"url": "https://user:pw@example.test/"}, "user:password"),
        ("webhook", {"url": "https://example.test/", "secret": "plain"}, "whsec_"),
        ("webhook", {}, "takes a url"),
        ("pager", {"url": "https://example.test/"}, "one of webhook, slack, email"),
        ("email", {"connection_id": "alerts", "target": "nobody"}, "an email address"),
        ("slack", {"connection_id": "slack"}, "a channel"),
    ],
)
async def test_bad_destinations_are_refused_and_store_nothing(
    engine: Engine, sql: psycopg.Connection[Any], kind: str, options: dict[str, Any], reason: str
) -> None:
    with pytest.raises(InvalidInput, match=reason):
        await engine.set_notification_destination("ops", kind, **options)
    assert sql.execute("SELECT count(*) AS n FROM notification_destinations").fetchone() == {"n": 0}
    with pytest.raises(InvalidInput, match="destination_id"):
        await engine.set_notification_destination("bad id!", url="https://example.test/")


async def test_removing_a_destination_completes_what_the_others_delivered(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    await connect_mailbox(engine, sandbox)
    admin.hook_inbox("dead", fail_next=1000)
    await engine.set_notification_destination("good", url=admin.hook_url("good"))
    await engine.set_notification_destination("dead", url=admin.hook_url("dead"))
    admin.revoke("email", "acct_1")
    await engine.integrations.probe(ORG, "mailbox")
    relay = DeliveryRelay(engine.pool, engine.integrations, worker_id="t", backoff=(5.0, 5.0))
    try:
        assert await relay.run_once() == 2
    finally:
        await relay.aclose()
    statuses = {r["destination_id"]: r["status"] for r in delivery_rows(sql)}
    assert statuses == {"dead": "pending", "good": "delivered"}
    assert notification_rows(sql)[0]["delivered_at"] is None  # one destination still owes it

    assert await engine.remove_notification_destination("dead") is True
    assert await engine.remove_notification_destination("dead") is False
    assert [d["destination_id"] for d in await engine.notification_destinations()] == ["good"]
    assert notification_rows(sql)[0]["delivered_at"] is not None


async def test_a_slack_destination_posts_the_notification_in_its_channel(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    await connect_mailbox(engine, sandbox)
    await engine.integrations.add_connection(
        ORG, "slack", provider="slack", base_url=sandbox.url, account="T_ACME", secret="T_ACME"
    )
    await engine.set_notification_destination(
        "ops-slack", "slack", connection_id="slack", target="#ops"
    )
    admin.revoke("email", "acct_1")
    await engine.integrations.probe(ORG, "mailbox")
    async with engine.running():

        async def delivered() -> bool:
            return notification_rows(sql)[0]["delivered_at"] is not None

        await eventually(delivered, timeout=20, what="the Slack notification")
    (note,) = notification_rows(sql)
    (message,) = admin.slack_messages(channel="#ops")
    assert message["account"] == "T_ACME"
    assert "reconnect the email account acct_1" in message["text"]
    assert webhook_id(note["notification_id"]) in message["text"]


async def test_delivered_notifications_are_pruned_after_their_keep_and_undelivered_never(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    from onward.notify import prune_delivered

    await connect_mailbox(engine, sandbox)
    await engine.integrations.add_connection(
        ORG, "other", provider="email", base_url=sandbox.url, account="acct_9", secret="acct_9"
    )
    await engine.set_notification_destination("ops", url=admin.hook_url("keep"))
    admin.revoke("email", "acct_1")
    await engine.integrations.probe(ORG, "mailbox")
    relay = DeliveryRelay(engine.pool, engine.integrations, worker_id="t")
    try:
        assert await relay.run_once() == 1
    finally:
        await relay.aclose()
    await engine.remove_notification_destination("ops")
    admin.revoke("email", "acct_9")
    await engine.integrations.probe(ORG, "other")  # undelivered: nowhere to go
    async with engine.pool.connection() as conn:
        assert await prune_delivered(conn) == 0  # delivered just now: kept
        assert await prune_delivered(conn, keep_seconds=0.0) == 1
    (left,) = notification_rows(sql)
    assert left["delivered_at"] is None and "acct_9" in left["subject"]
    assert delivery_rows(sql) == []
