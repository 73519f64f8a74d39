"""Secrets encrypted at rest (onward.vault), against real PostgreSQL and the sandbox over HTTP.

* Round trip: a connection's secret and signing secret, a webhook destination's secret, the
  approval token secret and an organisation's pseudonym key are stored as ``enc:v1:...`` (the
  plain value appears in no column: a SQL check) and read back as they were given.
* A ciphertext copied into another organisation's row, or another column, is refused with
  ``SecretUnreadable`` (naming the organisation and column, never the value); a step using
  such a connection is retried, not crashed.
* Rotation: encrypted under key A; key B put first; ``rotate_secrets`` (batches of 1) moves
  every row under B; A removed, everything still reads; a second rotation re-encrypts nothing.
  A plain row written before encryption reads as it is and is encrypted by the rotation.
* The secret values appear in no run history, API answer, CLI output or log line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import httpx
import psycopg
import pytest

from onward import Automation, SecretUnreadable, vault
from onward.api import ApiServer, create_app
from onward.approvals import token_secret
from onward.config import Settings
from onward.doctor import run_checks
from onward.engine import Engine
from onward.errors import ConfigError, RetryableError
from onward.notify import new_secret
from onward.pseudonyms import key as pseudonym_key
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import api_key, auth, eventually, run_onward

pytestmark = pytest.mark.usefixtures("admin")

TOKEN = "tok_vault_TOKEN_7c1e9a"  # the sandbox's bearer token (it names the account)
SIGNING = "sign_vault_SIGNING_52b0d4"
KEY_A, KEY_B = vault.new_key(), vault.new_key()


def stored(sql: psycopg.Connection[Any]) -> list[str]:
    """Every value of every encrypted column (the database's own key excluded)."""
    rows = sql.execute(
        "SELECT secret FROM connections UNION ALL SELECT signing_secret FROM connections"
        " WHERE signing_secret IS NOT NULL"
        " UNION ALL SELECT secret FROM notification_destinations WHERE secret IS NOT NULL"
        " UNION ALL SELECT secret FROM engine_secrets"
        " WHERE NOT (org_id = '_system' AND name = 'secrets_key')"
    ).fetchall()
    return [r["secret"] for r in rows]


def dump(sql: psycopg.Connection[Any], table: str) -> str:
    rows = sql.execute(f"SELECT to_jsonb(t)::text AS j FROM {table} t").fetchall()
    return "\n".join(r["j"] for r in rows)


async def connect(engine: Engine, sandbox: SandboxServer, org: str = "test") -> None:
    await engine.integrations.add_connection(
        org,
        "mailbox",
        provider="email",
        base_url=sandbox.url,
        account="acct_v",
        secret=TOKEN,
        signing_secret=SIGNING,
    )


async def test_secrets_round_trip_and_no_column_holds_the_plain_value(
    engine: Engine, sandbox: SandboxServer, sql: psycopg.Connection[Any]
) -> None:
    await connect(engine, sandbox)
    hook_secret = new_secret()
    made = await engine.set_notification_destination("ops", url="https://x.test/h")
    await engine.set_notification_destination("ops2", url="https://x.test/h", secret=hook_secret)
    approval = await token_secret(engine.pool)
    async with engine.pool.connection() as conn:
        pkey = await pseudonym_key(conn, "test")

    values = stored(sql)
    assert len(values) == 6 and all(v.startswith("enc:v1:local:") for v in values), values
    joined = "\n".join(values)
    for plain in (TOKEN, SIGNING, hook_secret, made["secret"], approval, pkey):
        assert plain not in joined
    for table in ("connections", "notification_destinations", "engine_secrets"):
        text = dump(sql, table)
        assert TOKEN not in text and SIGNING not in text and hook_secret not in text

    connector = await engine.integrations.connector("test", "mailbox")
    assert connector.connection.token == TOKEN
    assert await engine.integrations.signing_secret("test", "mailbox") == SIGNING
    assert await token_secret(engine.pool) == approval
    async with engine.pool.connection() as conn:
        assert await pseudonym_key(conn, "test") == pkey
    assert await engine.integrations.probe("test", "mailbox") is None  # the sandbox took TOKEN
    # each encryption has its own nonce: the same value twice is two different ciphertexts
    await connect(engine, sandbox, org="other")
    (a, b) = [r["secret"] for r in sql.execute("SELECT secret FROM connections").fetchall()]
    assert a != b


async def test_a_ciphertext_copied_to_another_org_or_column_does_not_decrypt(
    engine: Engine, sandbox: SandboxServer, sql: psycopg.Connection[Any]
) -> None:
    await connect(engine, sandbox, org="test")
    await engine.integrations.add_connection(
        "other", "mailbox", provider="email", base_url=sandbox.url, account="b", secret="tok_b"
    )
    sql.execute(
        "UPDATE connections SET secret = (SELECT secret FROM connections WHERE org_id = 'test')"
        " WHERE org_id = 'other'"
    )
    with pytest.raises(SecretUnreadable) as refused:
        await engine.integrations.probe("other", "mailbox")
    message = str(refused.value)
    assert "connections.secret" in message and "'other'" in message
    assert "does not belong to this organisation and column" in message
    assert TOKEN not in message and "enc:v1" not in message
    with pytest.raises(RetryableError, match="cannot be decrypted"):  # a step retries
        await engine.integrations.connector("other", "mailbox")

    # within one organisation, a value moved to another column does not decrypt either
    sql.execute(
        "UPDATE connections SET signing_secret = secret WHERE org_id = 'test'"
    )  # fmt: skip
    with pytest.raises(SecretUnreadable, match=r"connections\.signing_secret"):
        await engine.integrations.signing_secret("test", "mailbox")

    # over HTTP: a 409 with the reason, not a 500, and no value in it
    async with (
        ApiServer(create_app(engine), port=0, log_level="warning", access_log=False) as api,
        httpx.AsyncClient(
            base_url=api.url, timeout=10, headers=auth(await api_key(engine))
        ) as client,
    ):
        sql.execute(
            "UPDATE connections SET secret = (SELECT secret FROM connections"
            " WHERE org_id = 'other') WHERE org_id = 'test'"
        )
        answer = await client.post("/v1/connections/mailbox/probe")
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"] == "secret_unreadable"
        assert "enc:v1" not in answer.text and TOKEN not in answer.text


async def test_rotation_moves_every_secret_to_the_new_key_and_the_old_one_can_go(
    engine: Engine,
    sandbox: SandboxServer,
    sql: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(vault.ENV, f"a:{KEY_A}")
    for org in ("test", "other", "third"):
        await connect(engine, sandbox, org=org)
    hook = (await engine.set_notification_destination("ops", url="https://x.test/h"))["secret"]
    approval = await token_secret(engine.pool)
    async with engine.pool.connection() as conn:
        pkey = await pseudonym_key(conn, "test")
    assert {v.split(":")[2] for v in stored(sql)} == {"a"}

    # a row written before encryption existed: read as it is, encrypted by the rotation
    sql.execute("UPDATE connections SET secret = 'tok_plain' WHERE org_id = 'third'")
    assert (await engine.integrations.connector("third", "mailbox")).connection.token == (
        "tok_plain"
    )

    monkeypatch.setenv(vault.ENV, f"b:{KEY_B},a:{KEY_A}")
    checks = {c.name: c for c in await run_checks(engine)}
    assert checks["secrets_at_rest"].value == {"mode": "environment", "not_current": 6}  # rows
    assert "encrypting with 'b'" in checks["secrets_at_rest"].detail
    report = await engine.rotate_secrets(batch=1)
    assert report == {
        "connections": {"scanned": 3, "reencrypted": 3},
        "notification_destinations": {"scanned": 1, "reencrypted": 1},
        "hook_secrets": {"scanned": 0, "reencrypted": 0},  # none here (test_signed_intake's)
        "engine_secrets": {"scanned": 2, "reencrypted": 2},
    }
    values = stored(sql)
    assert len(values) == 9 and {v.split(":")[2] for v in values} == {"b"}
    assert "tok_plain" not in "\n".join(values)

    monkeypatch.setenv(vault.ENV, f"b:{KEY_B}")  # key A removed
    assert (await engine.integrations.connector("test", "mailbox")).connection.token == TOKEN
    assert (await engine.integrations.connector("third", "mailbox")).connection.token == (
        "tok_plain"
    )
    assert await engine.integrations.signing_secret("other", "mailbox") == SIGNING
    assert await token_secret(engine.pool) == approval
    async with engine.pool.connection() as conn:
        assert await pseudonym_key(conn, "test") == pkey
        row = await (await conn.execute("SELECT secret FROM notification_destinations")).fetchone()
        assert row is not None
        assert await vault.unseal(
            conn, "test", "notification_destinations.secret", row["secret"]
        ) == (hook)
    again = await engine.rotate_secrets(batch=2)
    assert [c["reencrypted"] for c in again.values()] == [0, 0, 0, 0]
    assert [c["scanned"] for c in again.values()] == [3, 1, 0, 2]
    checks = {c.name: c for c in await run_checks(engine)}
    assert checks["secrets_at_rest"].ok and checks["secrets_at_rest"].value["not_current"] == 0

    # a key that is no longer configured: refused with its id, never a crash
    monkeypatch.setenv(vault.ENV, f"a:{KEY_A}")
    with pytest.raises(SecretUnreadable, match="key 'b', which is not configured"):
        await engine.integrations.signing_secret("test", "mailbox")


async def test_the_database_kept_key_is_a_doctor_warning_and_still_decrypts_after_keys_are_set(
    engine: Engine,
    sandbox: SandboxServer,
    sql: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(vault.ENV, raising=False)
    await connect(engine, sandbox)
    check = {c.name: c for c in await run_checks(engine)}["secrets_at_rest"]
    assert (check.ok, check.warning, check.value["mode"]) == (False, True, "database")
    assert "WARNING" in check.detail and "ONWARD_SECRET_KEYS" in check.detail

    monkeypatch.setenv(vault.ENV, f"a:{KEY_A}")
    assert await engine.integrations.signing_secret("test", "mailbox") == SIGNING  # 'local'
    assert (await engine.rotate_secrets())["connections"]["reencrypted"] == 1
    assert {v.split(":")[2] for v in stored(sql)} == {"a"}


def test_a_malformed_key_list_stops_the_process_and_names_no_key() -> None:
    for spec, needle in (
        ("nokey", "id:key"),
        ("a:short", "32 bytes"),
        (f"local:{KEY_A}", "not 'local'"),
        (f"a:{KEY_A},a:{KEY_B}", "appears twice"),
    ):
        with pytest.raises(ConfigError, match=needle) as refused:
            vault.parse_keys(spec)
        assert KEY_A not in str(refused.value) and KEY_B not in str(refused.value)


async def test_no_secret_in_history_api_answers_cli_output_or_logs(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    sql: psycopg.Connection[Any],
    db_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    hook_secret = new_secret()
    admin.hook_inbox("vault", secret=hook_secret)  # it checks each attempt's signature
    answers: list[str] = []
    async with (
        ApiServer(create_app(engine), port=0, log_level="debug", access_log=True) as api,
        httpx.AsyncClient(
            base_url=api.url, timeout=10, headers=auth(await api_key(engine))
        ) as client,
    ):
        put = await client.post(
            "/v1/connections",
            json={
                "connection_id": "mailbox",
                "provider": "email",
                "base_url": sandbox.url,
                "account": "acct_v",
                "secret": TOKEN,
            },
        )
        assert put.status_code in (200, 201), put.text
        await engine.integrations.add_connection(  # a signing secret: not settable over HTTP
            "test", "slack", provider="slack", base_url=sandbox.url, account="w", secret="tok_w",
            signing_secret=SIGNING,
        )  # fmt: skip
        answers.append(put.text)
        dest = await client.put(
            "/v1/notification-destinations/ops",
            json={"url": admin.hook_url("vault"), "secret": hook_secret},
        )
        assert dest.status_code == 200, dest.text
        answers.append(dest.text)
        flow = Automation("send").step(
            "send", "email.send", connection="mailbox", to="m@example.test", subject="Hi", body="x"
        )
        await engine.publish(flow.build())
        async with engine.running():
            run_id = (await engine.start("send", {}, event_id="v1")).run_id
            assert await engine.wait(run_id, timeout=20) == "completed"
            admin.revoke("email", TOKEN)  # a refused credential: a notification, a probe answer
            probe = await client.post("/v1/connections/mailbox/probe")
            answers.append(probe.text)

            async def delivered() -> bool:
                rows = sql.execute("SELECT delivered_at FROM notifications").fetchall()
                return bool(rows) and rows[0]["delivered_at"] is not None

            await eventually(delivered, timeout=20, what="the notification delivered")
        for path in (
            f"/v1/runs/{run_id}",
            "/v1/notification-destinations",
            "/v1/notifications",
        ):
            got = await client.get(path)
            assert got.status_code in (200, 404), got.text
            answers.append(got.text)
    received = admin.hook_received("vault")
    assert received["log"] and all(a["signature_ok"] for a in received["log"])  # signed right

    cli = [
        run_onward(db_url, "notifications", "destinations", "--json").stdout,
        run_onward(db_url, "notifications", "list", "--json").stdout,
        run_onward(db_url, "show", str(run_id)).stdout,
        run_onward(db_url, "doctor", "--json").stdout,
        run_onward(db_url, "keys", "rotate-secrets", "--json").stdout,
    ]
    history = dump(sql, "history") + dump(sql, "steps") + dump(sql, "effects") + dump(sql, "runs")
    # every record but the test's own calls to the sandbox's admin API (its URL names the
    # sandbox account, which the sandbox takes to be the token)
    logs = "\n".join(r.getMessage() for r in caplog.records if "/_admin/" not in r.getMessage())
    assert "POST /v1/connections" in logs and "email/messages" in logs  # they were captured
    notifications = dump(sql, "notifications") + dump(sql, "notification_deliveries")
    assert "email.send" in history and json.loads(cli[4])["connections"]["scanned"] == 2
    for where, text in {
        "history": history,
        "notifications": notifications,
        "api answers": "\n".join(answers),
        "cli output": "\n".join(cli),
        "logs": logs,
    }.items():
        for secret in (TOKEN, SIGNING, hook_secret):
            assert secret not in text, f"{secret} in {where}"


def test_settings_refuse_a_bad_key_list_at_start(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(vault.ENV, "a:short")
    with pytest.raises(ConfigError, match="ONWARD_SECRET_KEYS"):
        dataclasses.replace(settings).validate()
