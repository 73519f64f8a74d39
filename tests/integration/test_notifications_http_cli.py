"""Notifications from the outside (R15): ``onward notifications ...`` (real subprocesses) and
``/v1/notifications`` + ``/v1/notification-destinations`` over real HTTP (a real uvicorn).
Good input is stored and listed back; bad input -- an invalid URL above all -- is refused
(exit 2 with one ``onward: ...`` line and no traceback, or 422 with the reason) and stores
nothing. A notification written by a broken connection is listed with its delivery state, and
``onward doctor --json`` warns about it without failing."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
import pytest

from onward.api import ApiServer, create_app
from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import api_key, auth, eventually, run_onward

pytestmark = pytest.mark.usefixtures("admin")


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("onward: "), result.stderr
    assert needle in lines[0], lines[0]
    assert result.stdout == ""


def destinations(sql: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return [
        dict(r)
        for r in sql.execute(
            "SELECT org_id, destination_id, kind, url, connection_id, target"
            " FROM notification_destinations ORDER BY org_id, destination_id"
        ).fetchall()
    ]


def test_cli_destinations_are_set_listed_and_removed_and_a_bad_url_stores_nothing(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    assert "no destinations" in ok(run_onward(db_url, "notifications", "destinations"))
    for needle, args in {
        "is not a URL": ("--webhook", "https://example.test:abc/"),
        "no spaces": ("--webhook", "http://exa mple.test/"),
        "port 99999 out of range": ("--webhook", "http://example.test:99999/"),
        "http:// or https://": ("--webhook", "ftp://example.test/"),
        "give one of --webhook": (),
        "an email address": ("--email", "alerts", "--to", "nobody"),
        "--channel goes with --slack": ("--webhook", "https://x.test/", "--channel", "#ops"),
        "whsec_": ("--webhook", "https://x.test/", "--secret", "nope"),
    }.items():
        refused(run_onward(db_url, "notifications", "set", "ops", *args), needle)
    refused(run_onward(db_url, "notifications", "set", "bad id", "--webhook", "https://x.test/"),
            "destination_id")  # fmt: skip
    assert destinations(sql) == []

    out = ok(run_onward(db_url, "notifications", "set", "ops", "--webhook", "https://x.test/h"))
    first, second = out.splitlines()
    assert first == "ops: webhook https://x.test/h (0 undelivered now go there)"
    assert second.startswith("signing secret (shown once): whsec_")
    ok(run_onward(db_url, "notifications", "set", "mail", "--email", "alerts", "--to", "o@x.test"))
    listed = json.loads(ok(run_onward(db_url, "notifications", "destinations", "--json")))
    assert [(d["destination_id"], d["kind"], d["signed"]) for d in listed] == [
        ("mail", "email", False),
        ("ops", "webhook", True),
    ]
    assert "secret" not in listed[1]  # never listed, only shown when made
    assert ok(run_onward(db_url, "notifications", "remove", "mail")).strip() == "removed mail"
    refused(run_onward(db_url, "notifications", "remove", "mail"), "no destination 'mail'")
    assert [d["destination_id"] for d in destinations(sql)] == ["ops"]
    refused(run_onward(db_url, "notifications", "retry", "12345"), "no notification 12345")
    assert ok(run_onward(db_url, "notifications", "list")).strip() == "no notifications"


@asynccontextmanager
async def served(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        ApiServer(create_app(engine), port=0, log_level="warning", access_log=False) as api,
        httpx.AsyncClient(
            base_url=api.url, timeout=10, headers=auth(await api_key(engine))
        ) as client,
    ):
        yield client


async def test_http_destinations_and_a_delivered_notification(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    sql: psycopg.Connection[Any],
    db_url: str,
) -> None:
    async with served(engine) as client:
        for body, needle in (
            ({"url": "not a url"}, "url"),
            ({"url": "javascript:alert(1)"}, "http:// or https://"),
            ({"url": "https://example.test/#x"}, "#fragment"),
            ({"kind": "slack", "connection_id": "slack"}, "a channel"),
        ):
            bad = await client.put("/v1/notification-destinations/ops", json=body)
            assert bad.status_code == 422, bad.text
            assert bad.json()["error"] == "invalid_input"
            assert needle in bad.json()["detail"]
        schema_bad = await client.put("/v1/notification-destinations/ops", json={"kind": "pager"})
        assert schema_bad.status_code == 422
        assert destinations(sql) == []

        put = await client.put(
            "/v1/notification-destinations/ops", json={"url": admin.hook_url("acme")}
        )
        assert put.status_code == 200, put.text
        assert put.json()["secret"].startswith("whsec_")
        listed = (await client.get("/v1/notification-destinations")).json()
        assert [(d["destination_id"], d["url"]) for d in listed] == [
            ("ops", admin.hook_url("acme"))
        ]

        admin.hook_inbox("acme", fail_next=1)
        await engine.integrations.add_connection(
            "test", "mailbox", provider="email", base_url=sandbox.url, account="a1", secret="a1"
        )
        admin.revoke("email", "a1")
        await engine.integrations.probe("test", "mailbox")
        async with engine.running():

            async def delivered() -> list[dict[str, Any]] | None:
                rows: list[dict[str, Any]] = (await client.get("/v1/notifications")).json()
                return rows if rows[0]["delivered_at"] else None

            (note,) = await eventually(delivered, timeout=20, what="delivered over HTTP")
        assert note["webhook_id"] == f"ntf_{note['notification_id']}"
        assert note["subject"] == "reconnect the email account a1"
        (delivery,) = note["deliveries"]
        assert (delivery["status"], delivery["attempts"]) == ("delivered", 2)
        assert admin.hook_received("acme")["distinct"] == 1
        undelivered = (await client.get("/v1/notifications", params={"undelivered": True})).json()
        assert undelivered == []

        retry = await client.post(f"/v1/notifications/{note['notification_id']}/retry")
        assert (retry.status_code, retry.json()) == (200, {"retried": 0})  # nothing left to do
        missing = await client.post("/v1/notifications/999999/retry")
        assert (missing.status_code, missing.json()["error"]) == (404, "not_found")
        gone = await client.delete("/v1/notification-destinations/nope")
        assert gone.status_code == 404
        assert (await client.delete("/v1/notification-destinations/ops")).status_code == 204

    # the command line shows the same notification and its delivery
    out = ok(run_onward(db_url, "--org", "test", "notifications", "list"))
    assert "connection_broken  delivered" in out and "ops: delivered after 2 attempt(s)" in out


async def test_doctor_warns_about_an_undelivered_notification_but_exits_0(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, db_url: str
) -> None:
    await engine.integrations.add_connection(
        "test", "mailbox", provider="email", base_url=sandbox.url, account="a1", secret="a1"
    )
    admin.revoke("email", "a1")
    await engine.integrations.probe("test", "mailbox")  # a notification, nowhere to go
    result = run_onward(db_url, "--org", "test", "doctor", "--json", "--grace", "0")
    report = json.loads(result.stdout)
    check = next(c for c in report["checks"] if c["name"] == "undelivered_notifications")
    assert (check["ok"], check["warning"], check["value"]) == (False, True, 1)
    assert "1 with no destination" in check["detail"]
    text = run_onward(db_url, "--org", "test", "doctor", "--grace", "0").stdout
    assert "[WRN] undelivered_notifications" in text
    # the warning alone never makes the doctor unhealthy (other checks may, on this database)
    others_ok = all(c["ok"] for c in report["checks"] if c["name"] != check["name"])
    assert report["healthy"] == others_ok
    assert (result.returncode == 0) == others_ok
