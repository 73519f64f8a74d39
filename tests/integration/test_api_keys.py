"""API keys (issue 14, Build 1): made and revoked by the CLI, the library and HTTP; stored
hashed; scoped; every route but the probe, the documentation and the signed callbacks needs
one; a wrong, missing or revoked key is one 401; another organisation's run is a 404."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import psycopg
import pytest

from onward.api import create_app
from onward.api import scopes as scope_table
from onward.api.app import _flat
from onward.config import Settings
from onward.engine import Engine
from onward.testing import run_onward

FLOW = {"id": "hello", "steps": [{"id": "hi", "kind": "set", "with": {"values": {"x": "1"}}}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def client(engine: Engine) -> Any:
    transport = httpx.ASGITransport(app=create_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://onward.test") as c:
        yield c


def test_every_route_of_the_app_has_its_row_in_the_scope_table() -> None:
    app = create_app()
    served = {  # the API's routes: the console's pages have their own sessions
        ("GET" if m == "HEAD" else m, r.path)
        for r in _flat(app.router.routes)
        for m in (getattr(r, "methods", None) or ())
        if getattr(r, "include_in_schema", False)
        or r.path in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
    }
    assert served - set(scope_table.ROUTES) == set()
    assert set(scope_table.ROUTES) - served == set()  # no stale rows either


async def test_a_key_is_shown_once_and_stored_only_as_its_hash(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    row, key = await engine.create_key("ci", ["runs:read"], by="maya")
    assert key.startswith("onw_") and row["key_id"] in key
    stored = sql.execute("SELECT * FROM api_keys").fetchone()
    assert stored is not None
    assert key.encode() not in json.dumps(stored, default=str).encode()
    assert key.split("_", 2)[2] not in json.dumps(stored, default=str)
    listed = await engine.keys()
    assert [k["key_id"] for k in listed] == [row["key_id"]]
    assert "key" not in listed[0] and "secret_hash" not in listed[0]
    audit = await engine.audit(action="key_create")
    assert audit[0]["actor"] == "maya" and audit[0]["target"] == row["key_id"]
    assert key not in json.dumps(audit, default=str)


async def test_missing_wrong_malformed_and_revoked_keys_are_one_401(
    engine: Engine, client: httpx.AsyncClient
) -> None:
    _, key = await engine.create_key("ci", ["runs:read"])
    row, revoked = await engine.create_key("old", ["admin"])
    await engine.revoke_key(row["key_id"], by="maya")
    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    answers = [
        await client.get("/v1/runs"),
        await client.get("/v1/runs", headers=bearer(wrong)),
        await client.get("/v1/runs", headers=bearer("onw_nonsense")),
        await client.get("/v1/runs", headers=bearer(revoked)),
        await client.get("/v1/runs", headers={"Authorization": "Token " + key}),
    ]
    assert {a.status_code for a in answers} == {401}
    assert {a.text for a in answers} == {answers[0].text}  # the same words whatever was wrong
    assert answers[0].json()["error"] == "unauthorized"
    assert answers[0].headers["www-authenticate"] == "Bearer"
    ok = await client.get("/v1/runs", headers=bearer(key))
    assert ok.status_code == 200
    basic = base64.b64encode(f"onward:{key}".encode()).decode()
    assert (
        await client.get("/v1/runs", headers={"Authorization": f"Basic {basic}"})
    ).status_code == 200


async def test_a_key_without_the_scope_is_403_and_admin_holds_every_scope(
    engine: Engine, client: httpx.AsyncClient
) -> None:
    _, reader = await engine.create_key("reader", ["runs:read"])
    _, admin = await engine.create_key("root", ["admin"])
    refused = await client.post("/v1/automations", json=FLOW, headers=bearer(reader))
    assert refused.status_code == 403 and "automations:write" in refused.json()["detail"]
    assert (await client.get("/v1/keys", headers=bearer(reader))).status_code == 403
    published = await client.post("/v1/automations", json=FLOW, headers=bearer(admin))
    assert published.status_code == 201


async def test_keys_over_http_made_listed_revoked_and_audited_as_the_key(
    engine: Engine, client: httpx.AsyncClient
) -> None:
    _, admin = await engine.create_key("root", ["admin"])
    made = await client.post(
        "/v1/keys",
        json={"name": "ci", "scopes": ["runs:write", "runs:read"]},
        headers=bearer(admin),
    )
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["scopes"] == ["runs:read", "runs:write"] and body["key"].startswith("onw_")
    assert (await client.get("/v1/runs", headers=bearer(body["key"]))).status_code == 200
    listed = (await client.get("/v1/keys", headers=bearer(admin))).json()
    assert {k["key_id"] for k in listed} >= {body["key_id"]}
    assert all("key" not in k for k in listed)
    gone = await client.delete(f"/v1/keys/{body['key_id']}", headers=bearer(admin))
    assert gone.status_code == 200 and gone.json()["revoked_at"] is not None
    assert (await client.get("/v1/runs", headers=bearer(body["key"]))).status_code == 401
    again = await client.delete(f"/v1/keys/{body['key_id']}", headers=bearer(admin))
    assert again.status_code == 404
    admin_id = admin.split("_")[1]
    rows = await engine.audit(action="key_revoke")
    assert rows[0]["actor"] == f"key:{admin_id}" and rows[0]["target"] == body["key_id"]
    bad = await client.post(
        "/v1/keys", json={"name": "x", "scopes": ["runs:delete"]}, headers=bearer(admin)
    )
    assert bad.status_code == 422
    assert len(await engine.keys()) == 2  # nothing stored for the refused one


async def test_another_organisations_run_is_exactly_a_run_that_does_not_exist(
    settings: Settings, engine: Engine, client: httpx.AsyncClient
) -> None:
    other = engine.for_org("globex")
    await other.publish(FLOW)
    theirs = await other.start("hello", {}, event_id="e1")
    _, ours = await engine.create_key("ours", ["admin"])
    _, their_key = await other.create_key("theirs", ["admin"])
    mine = await client.get(f"/v1/runs/{theirs.run_id}", headers=bearer(ours))
    unknown = await client.get("/v1/runs/run_000000000000000000000000", headers=bearer(ours))
    assert mine.status_code == unknown.status_code == 404
    assert mine.json()["error"] == unknown.json()["error"]
    seen = await client.get(f"/v1/runs/{theirs.run_id}", headers=bearer(their_key))
    assert seen.status_code == 200
    assert (await client.get("/v1/runs", headers=bearer(ours))).json() == []
    their_id = their_key.split("_")[1]
    assert (await client.delete(f"/v1/keys/{their_id}", headers=bearer(ours))).status_code == 404


async def test_the_probe_and_the_documentation_need_no_key(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).status_code == 200
    doc = await client.get("/openapi.json")
    assert doc.status_code == 200
    assert doc.json()["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_keys_from_the_cli_create_list_revoke(settings: Settings, db_url: str) -> None:
    made = run_onward(
        db_url, "--org", "acme", "keys", "create", "ci", "--scope", "runs:read", "--json"
    )
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)
    assert key["key"].startswith("onw_") and key["scopes"] == ["runs:read"]
    listed = run_onward(db_url, "--org", "acme", "keys", "list")
    assert key["key_id"] in listed.stdout and key["key"] not in listed.stdout
    elsewhere = run_onward(db_url, "--org", "other", "keys", "revoke", key["key_id"])
    assert elsewhere.returncode != 0 and "no live key" in elsewhere.stderr
    assert "Traceback" not in elsewhere.stderr
    revoked = run_onward(db_url, "--org", "acme", "keys", "revoke", key["key_id"])
    assert revoked.returncode == 0, revoked.stderr
    bad = run_onward(db_url, "--org", "acme", "keys", "create", "x", "--scope", "root")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1
