"""A process dies between a receiver's 2xx and ``delivered_at`` (crash point
``notify.after_send``), and the customer still holds the notification once (R15).

A real worker process (worker + outbox relay + notification relay) runs a run whose
``email.send`` meets a 401: the connection is marked broken, which writes the notification and
its delivery intent in one statement. The same process's delivery relay POSTs it to the
sandbox's receiver, which answers 200, and the process SIGKILLs itself before writing the
outcome. What is left: the receiver holds it (1 attempt, 1 distinct), the intent is
``pending`` with one attempt counted, ``delivered_at`` is NULL. A second process claims the
intent once the first one's claim lease lapses and sends it again **with the same
``webhook-id``**: the receiver counts 2 attempts and still 1 distinct notification (the second
answered as a duplicate), and ``delivered_at`` is written.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.notify import new_secret, webhook_id
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import eventually
from tests.acceptance.conftest import Spawn

pytestmark = [pytest.mark.acceptance, pytest.mark.usefixtures("admin")]

ORG = "test"  # the `settings` fixture's organisation, and the worker processes'
LEASE = 2.0


def delivery(sql: psycopg.Connection[Any]) -> dict[str, Any] | None:
    row = sql.execute(
        "SELECT d.status, d.attempts, d.delivered_at, n.delivered_at AS notified_at,"
        " n.notification_id FROM notification_deliveries d"
        " JOIN notifications n USING (org_id, notification_id) WHERE d.org_id = %s",
        (ORG,),
    ).fetchone()
    return dict(row) if row else None


async def test_a_kill_after_the_receivers_2xx_delivers_once_more_with_the_same_id(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    spawn: Spawn,
    sql: psycopg.Connection[Any],
) -> None:
    await engine.integrations.add_connection(
        ORG, "mailbox", provider="email", base_url=sandbox.url, account="acct_1", secret="acct_1"
    )
    secret = new_secret()
    admin.hook_inbox("acme", secret=secret)
    await engine.set_notification_destination("ops", url=admin.hook_url("acme"), secret=secret)
    flow = Automation("send-once").step(
        "send", "email.send", connection="mailbox", to="maya@example.test", subject="Hi", body="x"
    )
    await engine.publish(flow.build())
    admin.revoke("email", "acct_1")

    a = spawn("proc-a", crash_at="notify.after_send", lease=LEASE, sweeper=True)
    run_id = (await engine.start("send-once", {"name": "Maya"}, event_id="k1")).run_id
    assert await a.exited(timeout=30) == -signal.SIGKILL, a.log_text()
    assert "crash point notify.after_send reached" in a.log_text()

    got = admin.hook_received("acme")
    assert (got["attempts"], got["distinct"]) == (1, 1)  # the receiver has it...
    row = delivery(sql)
    assert row is not None
    assert (row["status"], row["attempts"]) == ("pending", 1)  # ...the database does not know
    assert row["delivered_at"] is None and row["notified_at"] is None

    b = spawn("proc-b", lease=LEASE, sweeper=True)

    async def delivered() -> dict[str, Any] | None:
        found = delivery(sql)
        return found if found and found["notified_at"] is not None else None

    done = await eventually(delivered, timeout=30, what="delivered_at after the kill")
    assert (done["status"], done["attempts"]) == ("delivered", 2)
    got = admin.hook_received("acme")
    assert (got["attempts"], got["distinct"]) == (2, 1)
    msg_id = webhook_id(done["notification_id"])
    assert [(a["webhook_id"], a["duplicate"]) for a in got["log"]] == [
        (msg_id, False),
        (msg_id, True),
    ]
    assert all(a["signature_ok"] for a in got["log"])

    # the run itself is parked for its reconnect, as without the kill
    async def parked() -> bool:
        return await engine.status(run_id) == "parked"

    await eventually(parked, timeout=30, what="the run parked")
    b.terminate()
    assert await b.exited() == 0, b.log_text()
