"""Signed intake (issue 14, ``onward.intake``): a webhook endpoint given secrets requires the
Standard Webhooks signature, checked by the ``standardwebhooks`` package, over real HTTP (a
real uvicorn) against a real PostgreSQL.

Refused with 401 and the same detail whatever failed (nothing stored): no signature, a wrong
secret, a timestamp outside the tolerance (either way), a body re-serialised (same JSON,
other bytes), a removed secret. A replayed ``webhook-id`` starts nothing new (200 duplicate,
one run). During rotation the old and the new secret are both valid. Endpoints without a
secret take unsigned requests as before. The body is capped before it is parsed (413), its
nesting too (422), and each organisation's intake is rate-limited (429 + ``Retry-After``).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
from standardwebhooks import Webhook

from onward import ids
from onward.api import ApiServer, create_app
from onward.api.app import body_limit
from onward.config import Settings
from onward.engine import Engine
from onward.testing import api_key, auth, run_onward

Sql = psycopg.Connection[dict[str, Any]]


def doc(automation_id: str) -> dict[str, Any]:
    return {
        "id": automation_id,
        "steps": [{"id": "hello", "kind": "set", "with": {"values": {"ok": "true"}}}],
    }


@asynccontextmanager
async def served(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    for automation_id in ("signed", "open"):
        await engine.publish(doc(automation_id))
    async with (
        ApiServer(create_app(engine), port=0, log_level="warning", access_log=False) as api,
        httpx.AsyncClient(
            base_url=api.url, timeout=10, headers=auth(await api_key(engine))
        ) as client,
    ):
        yield client


def signed(secret: str, msg_id: str, body: bytes, *, at: datetime | None = None) -> dict[str, str]:
    """The Standard Webhooks headers a sender with ``secret`` puts on ``body``."""
    when = at or datetime.now(UTC)
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, when, body.decode()),
    }


def runs(sql: Sql, automation_id: str) -> list[dict[str, Any]]:
    return sql.execute(
        "SELECT run_id, start_key FROM runs WHERE automation_id = %s ORDER BY run_id",
        (automation_id,),
    ).fetchall()


def unauthorized(reply: httpx.Response) -> str:
    assert reply.status_code == 401, reply.text
    body = reply.json()
    assert body["error"] == "unauthorized"
    detail: str = body["detail"]
    assert "signature" in detail, detail  # the signature's refusal, not the API key's
    return detail


async def add_secret(client: httpx.AsyncClient, automation_id: str) -> dict[str, Any]:
    reply = await client.post(f"/v1/automations/{automation_id}/hook-secrets", json={})
    assert reply.status_code == 201, reply.text
    added: dict[str, Any] = reply.json()
    assert added["secret"].startswith("whsec_") and added["secret_id"].startswith("hsec_")
    return added


async def test_a_signed_endpoint_refuses_every_bad_signature_alike_and_deduplicates_by_webhook_id(
    engine: Engine, sql: Sql
) -> None:
    async with served(engine) as client:
        secret = (await add_secret(client, "signed"))["secret"]
        listed = (await client.get("/v1/automations/signed/hook-secrets")).json()
        assert [set(r) for r in listed] == [{"automation_id", "secret_id", "created_at"}]

        body = json.dumps({"name": "Maya", "n": 1}, separators=(",", ":")).encode()
        other = Webhook("whsec_" + "QUJD" * 11)  # a secret of another endpoint
        now = datetime.now(UTC)
        refused = {
            "unsigned": await client.post(
                "/v1/hooks/signed", content=body, headers={"content-type": "application/json"}
            ),
            "wrong secret": await client.post(
                "/v1/hooks/signed",
                content=body,
                headers={
                    **signed(secret, "msg_1", body),
                    "webhook-signature": other.sign("msg_1", now, body.decode()),
                },
            ),
            "too old": await client.post(
                "/v1/hooks/signed",
                content=body,
                headers=signed(secret, "msg_1", body, at=now - timedelta(minutes=6)),
            ),
            "too new": await client.post(
                "/v1/hooks/signed",
                content=body,
                headers=signed(secret, "msg_1", body, at=now + timedelta(minutes=6)),
            ),
            "re-serialised": await client.post(
                "/v1/hooks/signed",
                content=json.dumps(json.loads(body), indent=1).encode(),  # same JSON
                headers=signed(secret, "msg_1", body),
            ),
            "garbage signature": await client.post(
                "/v1/hooks/signed",
                content=body,
                headers={**signed(secret, "msg_1", body), "webhook-signature": "v1 ,x,y"},
            ),
        }
        details = {name: unauthorized(reply) for name, reply in refused.items()}
        assert len(set(details.values())) == 1, details  # no detail about which part failed
        assert runs(sql, "signed") == []

        headers = signed(secret, "msg_1", body)
        first = await client.post("/v1/hooks/signed", content=body, headers=headers)
        assert first.status_code == 202, first.text
        assert first.json()["start_key"] == ids.event_start_key("signed", "msg_1")
        assert first.json()["start_key_kind"] == "event"
        again = await client.post("/v1/hooks/signed", content=body, headers=headers)  # replay
        assert again.status_code == 200, again.text
        assert again.json()["duplicate"] is True
        assert again.json()["run_id"] == first.json()["run_id"]
        assert [r["run_id"] for r in runs(sql, "signed")] == [first.json()["run_id"]]

        # an endpoint with no secret takes unsigned requests as before
        plain = await client.post("/v1/hooks/open", json={"name": "Sam"})
        assert plain.status_code == 202, plain.text
        assert len(runs(sql, "open")) == 1


async def test_rotation_keeps_both_secrets_valid_until_the_old_one_is_removed(
    engine: Engine, sql: Sql
) -> None:
    async with served(engine) as client:
        old = await add_secret(client, "signed")
        new = await add_secret(client, "signed")
        body = b'{"name":"Maya"}'
        for n, secret in enumerate((old["secret"], new["secret"])):
            reply = await client.post(
                "/v1/hooks/signed", content=body, headers=signed(secret, f"rot_{n}", body)
            )
            assert reply.status_code == 202, reply.text

        gone = await client.delete(f"/v1/automations/signed/hook-secrets/{old['secret_id']}")
        assert gone.status_code == 204, gone.text
        again = await client.delete(f"/v1/automations/signed/hook-secrets/{old['secret_id']}")
        assert again.status_code == 404 and again.json()["error"] == "not_found"
        unauthorized(
            await client.post(
                "/v1/hooks/signed", content=body, headers=signed(old["secret"], "rot_2", body)
            )
        )
        ok = await client.post(
            "/v1/hooks/signed", content=body, headers=signed(new["secret"], "rot_3", body)
        )
        assert ok.status_code == 202, ok.text
        assert len(runs(sql, "signed")) == 3

        # the last secret removed: the endpoint takes unsigned requests again
        await client.delete(f"/v1/automations/signed/hook-secrets/{new['secret_id']}")
        assert (await client.post("/v1/hooks/signed", json={"x": 1})).status_code == 202
        assert engine.settings.intake_limit > 0  # these requests were all counted, none refused


async def test_secrets_are_checked_on_the_way_in(engine: Engine, sql: Sql) -> None:
    async with served(engine) as client:
        unknown = await client.post("/v1/automations/nope/hook-secrets", json={})
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_automation"
        for bad in ("nope", "whsec_short", "whsec_" + "A" * 16, "whsec_!!!!"):
            reply = await client.post("/v1/automations/signed/hook-secrets", json={"secret": bad})
            assert reply.status_code == 422, reply.text
            assert "whsec_" in reply.json()["detail"]
        given = "whsec_" + "QUJD" * 11
        reply = await client.post("/v1/automations/signed/hook-secrets", json={"secret": given})
        assert reply.status_code == 201 and reply.json()["secret"] == given
        stored = sql.execute("SELECT org_id, automation_id FROM hook_secrets").fetchall()
        assert stored == [{"org_id": engine.org_id, "automation_id": "signed"}]


async def test_the_body_is_capped_before_parsing_and_its_nesting_too(
    engine: Engine, sql: Sql
) -> None:
    async with served(engine) as client:
        secret = (await add_secret(client, "signed"))["secret"]
        huge = b'{"x": "' + b"a" * body_limit(engine) + b'"}'
        too_large = await client.post(
            "/v1/hooks/signed", content=huge, headers={"content-type": "application/json"}
        )
        assert too_large.status_code == 413, too_large.text  # before the signature is looked at
        assert too_large.json()["error"] == "payload_too_large"

        deep = b"[" * 65 + b"]" * 65
        body = b'{"x": ' + deep + b"}"
        nested = await client.post(
            "/v1/hooks/signed", content=body, headers=signed(secret, "deep", body)
        )
        assert nested.status_code == 422, nested.text
        assert "nested deeper than 64 levels" in nested.json()["detail"]
        assert runs(sql, "signed") == []


async def test_an_organisations_intake_is_rate_limited_with_retry_after(
    settings: Settings, sql: Sql
) -> None:
    limited = dataclasses.replace(settings, intake_limit=3, intake_window_seconds=60)
    async with Engine.open(limited, migrate=False) as engine, served(engine) as client:
        answers = [
            await client.post("/v1/hooks/open", json={"n": n}, headers={"X-Event-Id": f"e{n}"})
            for n in range(7)
        ]
        statuses = [a.status_code for a in answers]
        # at most one window boundary falls among 7 requests: one window holds 4 or more
        assert set(statuses) == {202, 429} and 3 <= statuses.count(202) <= 6, statuses
        assert statuses[:3] == [202, 202, 202], statuses
        refused = [a for a in answers if a.status_code == 429]
        for reply in refused:
            assert reply.json()["error"] == "rate_limited"
            assert 1 <= int(reply.headers["Retry-After"]) <= 60
        assert len(runs(sql, "open")) == statuses.count(202)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def refused_cli(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("onward: "), result.stderr
    assert needle in lines[0], lines[0]


async def test_cli_adds_lists_and_removes_secrets(engine: Engine, db_url: str, sql: Sql) -> None:
    await engine.publish(doc("signed"))

    def onward(*args: str) -> subprocess.CompletedProcess[str]:
        return run_onward(db_url, *args, env={"ONWARD_ORG": engine.org_id})

    assert "unsigned requests" in ok(onward("hooks", "secret", "list"))
    refused_cli(onward("hooks", "secret", "add", "nope"), "nope")
    refused_cli(onward("hooks", "secret", "add", "signed", "--secret", "x"), "whsec_")
    assert sql.execute("SELECT count(*) AS n FROM hook_secrets").fetchone() == {"n": 0}

    first, second = ok(onward("hooks", "secret", "add", "signed")).splitlines()
    secret_id = first.split()[2]
    assert first == f"signed: secret {secret_id} added"
    secret = second.removeprefix("signing secret (shown once): ")
    assert secret.startswith("whsec_")
    listed = json.loads(ok(onward("hooks", "secret", "list", "signed", "--json")))
    assert [(r["automation_id"], r["secret_id"]) for r in listed] == [("signed", secret_id)]
    assert secret not in json.dumps(listed)

    body = b'{"name":"Maya"}'
    async with served(engine) as client:
        reply = await client.post(
            "/v1/hooks/signed", content=body, headers=signed(secret, "c1", body)
        )
        assert reply.status_code == 202, reply.text
    out = ok(onward("hooks", "secret", "remove", "signed", secret_id))
    assert out.strip() == f"removed {secret_id} from signed"
    refused_cli(onward("hooks", "secret", "remove", "signed", secret_id), secret_id)


async def test_a_provider_without_a_key_signs_to_its_organisations_path(
    engine: Engine, sql: Sql
) -> None:
    async with served(engine) as client:
        secret = (await add_secret(client, "signed"))["secret"]
        path = f"/v1/orgs/{engine.org_id}/hooks/signed"
        body = b'{"name":"Maya"}'
        keyless = httpx.AsyncClient(base_url=str(client.base_url), timeout=10)
        async with keyless:
            first = await keyless.post(path, content=body, headers=signed(secret, "p1", body))
            assert first.status_code == 202, first.text
            again = await keyless.post(path, content=body, headers=signed(secret, "p1", body))
            assert again.status_code == 200 and again.json()["run_id"] == first.json()["run_id"]
            unsigned = await keyless.post(
                path, content=body, headers={"content-type": "application/json"}
            )
            unauthorized(unsigned)  # the signature's 401: no key is asked for here
            # an endpoint with no secret takes nobody on this path, signed or not
            unauthorized(
                await keyless.post(
                    f"/v1/orgs/{engine.org_id}/hooks/open",
                    content=body,
                    headers=signed(secret, "p2", body),
                )
            )
            # nor does another organisation's path name this automation's secrets
            unauthorized(
                await keyless.post(
                    "/v1/orgs/globex/hooks/signed", content=body, headers=signed(secret, "p3", body)
                )
            )
            # the keyed route still wants its key
            keyed = await keyless.post(
                "/v1/hooks/signed", content=body, headers=signed(secret, "p4", body)
            )
            assert keyed.status_code == 401 and "API key" in keyed.json()["detail"]
    assert [r["run_id"] for r in runs(sql, "signed")] == [first.json()["run_id"]]
    assert runs(sql, "open") == []
