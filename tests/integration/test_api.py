"""The HTTP API (B2, R1, R17) over real HTTP semantics against a real PostgreSQL.

Most tests drive the ASGI app through ``httpx.ASGITransport``; one serves it with uvicorn on a
free port and talks to it over a socket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from onward.api import ApiServer, create_app
from onward.config import Settings
from onward.engine import Engine
from onward.testing import api_key, auth

Sql = psycopg.Connection[dict[str, Any]]

GREET = {
    "id": "greet",
    "steps": [
        {"id": "hello", "kind": "set", "with": {"values": {"greeting": "'hi ' + input.name"}}}
    ],
}
INVALID = {
    "id": "broken",
    "steps": [
        {"id": "a", "kind": "no_such_kind", "next": "b"},
        {
            "id": "b",
            "kind": "branch",
            "with": {"cases": [{"when": "vars.x ==", "next": "nowhere"}]},
        },
        {"id": "c", "kind": "set", "with": {"values": {"x": "1"}}},
    ],
}


def count(sql: Sql, query: str) -> int:
    row = sql.execute(query).fetchone()
    assert row is not None
    return int(row["n"])


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(engine))
    headers = auth(await api_key(engine))
    async with httpx.AsyncClient(
        transport=transport, base_url="http://onward.test", headers=headers
    ) as c:
        yield c


async def publish(client: httpx.AsyncClient, document: dict = GREET) -> httpx.Response:
    reply = await client.post("/v1/automations", json=document)
    assert reply.status_code in (200, 201), reply.text
    return reply


async def test_fifty_concurrent_deliveries_of_one_event_make_one_run(
    client: httpx.AsyncClient, sql: Sql
) -> None:
    await publish(client)
    replies = await asyncio.gather(
        *(
            client.post(
                "/v1/hooks/greet", json={"name": "Maya"}, headers={"X-Event-Id": "evt_7Hq2"}
            )
            for _ in range(50)
        )
    )
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [200] * 49 + [202]
    bodies = [r.json() for r in replies]
    assert len({b["run_id"] for b in bodies}) == 1
    created = [b for b in bodies if b["created"]]
    assert len(created) == 1 and created[0]["duplicate"] is False
    assert all(b["duplicate"] and not b["created"] for b in bodies if b is not created[0])
    assert {b["start_key"] for b in bodies} == {"greet:evt_7Hq2"}
    assert {b["start_key_kind"] for b in bodies} == {"event"}
    assert count(sql, "SELECT count(*) AS n FROM runs") == 1
    assert count(sql, "SELECT count(*) AS n FROM history WHERE event = 'start_duplicate'") == 49


async def test_without_an_event_id_the_payload_hash_is_the_start_key(
    client: httpx.AsyncClient, sql: Sql
) -> None:
    await publish(client)
    first = await client.post("/v1/hooks/greet", json={"name": "Maya", "n": 1})
    # the same content, keys in another order: the same canonical payload
    again = await client.post(
        "/v1/hooks/greet",
        content=json.dumps({"n": 1, "name": "Maya"}),
        headers={"content-type": "application/json"},
    )
    other = await client.post("/v1/hooks/greet", json={"name": "Sam", "n": 1})
    assert (first.status_code, again.status_code, other.status_code) == (202, 200, 202)
    assert first.json()["start_key_kind"] == "payload_hash"
    assert ":sha256:" in first.json()["start_key"]
    assert again.json()["run_id"] == first.json()["run_id"] and again.json()["duplicate"]
    assert other.json()["run_id"] != first.json()["run_id"]
    assert count(sql, "SELECT count(*) AS n FROM runs WHERE start_key_kind = 'payload_hash'") == 2


async def test_event_id_sources_in_order_of_precedence(client: httpx.AsyncClient) -> None:
    await publish(client)
    body = {"name": "Maya", "event_id": "from_body"}
    by_header = await client.post(
        "/v1/hooks/greet", json=body, headers={"X-Event-Id": "x1", "Idempotency-Key": "k1"}
    )
    assert by_header.json()["start_key"] == "greet:x1"
    by_key = await client.post("/v1/hooks/greet", json=body, headers={"Idempotency-Key": "k1"})
    assert by_key.json()["start_key"] == "greet:k1"
    by_body = await client.post("/v1/hooks/greet", json=body)
    assert by_body.json()["start_key"] == "greet:from_body"
    assert by_body.json()["start_key_kind"] == "event"
    numeric = await client.post("/v1/hooks/greet", json={"name": "Sam", "event_id": 42})
    assert numeric.json()["start_key"] == "greet:42"
    too_long = await client.post("/v1/hooks/greet", json={}, headers={"X-Event-Id": "e" * 257})
    assert too_long.status_code == 422


async def test_webhook_refuses_what_it_cannot_start(client: httpx.AsyncClient) -> None:
    await publish(client)
    unknown = await client.post("/v1/hooks/nope", json={"name": "Maya"})
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "unknown_automation"
    assert "nope" in unknown.json()["detail"]
    not_json = await client.post(
        "/v1/hooks/greet", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert not_json.status_code == 422 and "not valid JSON" in not_json.json()["detail"]
    not_object = await client.post("/v1/hooks/greet", json=[1, 2])
    assert not_object.status_code == 422 and "JSON object" in not_object.json()["detail"]


async def test_payload_over_the_limit_is_413_and_nothing_is_stored(
    settings: Settings, sql: Sql
) -> None:
    small = dataclasses.replace(settings, max_payload_bytes=2000)
    async with Engine.open(small, migrate=False) as engine:
        transport = httpx.ASGITransport(app=create_app(engine))
        headers = auth(await api_key(engine))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=headers
        ) as client:
            await publish(client)
            # over the payload limit, under the body guard: refused by the start itself
            over = await client.post("/v1/hooks/greet", json={"name": "x" * 3000})
            assert over.status_code == 413, over.text
            assert over.json()["error"] == "payload_too_large"
            # far over: refused from Content-Length before the body is read
            huge = await client.post("/v1/hooks/greet", json={"name": "x" * 2_000_000})
            assert huge.status_code == 413

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as read
                yield b'{"name": "'
                for _ in range(40):
                    yield b"x" * 65536
                yield b'"}'

            chunked = await client.post(
                "/v1/hooks/greet", content=chunks(), headers={"content-type": "application/json"}
            )
            assert chunked.status_code == 413 and chunked.json()["error"] == "payload_too_large"
            explicit = await client.post(
                "/v1/runs", json={"automation_id": "greet", "input": {"name": "x" * 3000}}
            )
            assert explicit.status_code == 413
            ok = await client.post("/v1/hooks/greet", json={"name": "Maya"})
            assert ok.status_code == 202
    assert count(sql, "SELECT count(*) AS n FROM runs") == 1


async def test_invalid_automation_is_422_with_every_problem_and_nothing_stored(
    client: httpx.AsyncClient, sql: Sql
) -> None:
    await publish(client)
    before = count(sql, "SELECT count(*) AS n FROM automation_versions")
    reply = await client.post("/v1/automations", json=INVALID)
    assert reply.status_code == 422
    body = reply.json()
    assert body["error"] == "invalid_automation"
    problems = "\n".join(body["problems"])
    assert "unknown step kind 'no_such_kind'" in problems
    assert "bad CEL" in problems
    assert "transition to unknown step 'nowhere'" in problems
    assert "step c: unreachable" in problems
    not_a_document = await client.post("/v1/automations", json=["id"])
    assert not_a_document.status_code == 422 and not_a_document.json()["problems"]
    bad_yaml = await client.post(
        "/v1/automations", content=b"id: [", headers={"content-type": "application/yaml"}
    )
    assert bad_yaml.status_code == 422
    assert count(sql, "SELECT count(*) AS n FROM automation_versions") == before
    assert count(sql, "SELECT count(*) AS n FROM automations WHERE automation_id = 'broken'") == 0


async def test_publishing_the_same_document_twice_is_unchanged(client: httpx.AsyncClient) -> None:
    first = await client.post("/v1/automations", json=GREET)
    assert first.status_code == 201
    assert first.json()["created"] is True and first.json()["version"] == 1
    same = await client.post("/v1/automations", json=GREET)
    assert same.status_code == 200
    assert same.json() == {**first.json(), "created": False}
    as_yaml = await client.post(
        "/v1/automations",
        content=yaml.safe_dump(GREET).encode(),
        headers={"content-type": "application/yaml"},
    )
    assert as_yaml.status_code == 200 and as_yaml.json()["version"] == 1
    changed = {**GREET, "name": "Greeting"}
    second = await client.post("/v1/automations", json=changed)
    assert second.status_code == 201 and second.json()["version"] == 2
    listed = await client.get("/v1/automations")
    assert [(a["automation_id"], a["latest_version"]) for a in listed.json()] == [("greet", 2)]


async def test_unknown_run_is_404_json(client: httpx.AsyncClient) -> None:
    reply = await client.get("/v1/runs/run_doesnotexist")
    assert reply.status_code == 404
    assert reply.json()["error"] == "unknown_run"
    assert "run_doesnotexist" in reply.json()["detail"]
    route = await client.get("/v1/nothing-here")
    assert route.status_code == 404 and route.json()["error"] == "not_found"


async def test_start_list_and_show_runs(client: httpx.AsyncClient, engine: Engine) -> None:
    await publish(client)
    body = {"automation_id": "greet", "input": {"name": "Maya"}, "key": "signup-42"}
    first = await client.post("/v1/runs", json=body)
    again = await client.post("/v1/runs", json=body)
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["start_key_kind"] == "caller" and again.json()["duplicate"]
    run_id = first.json()["run_id"]
    bad = await client.post("/v1/runs", json={"automation_id": "greet", "surprise": 1})
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"
    unknown_version = await client.post("/v1/runs", json={"automation_id": "greet", "version": 9})
    assert unknown_version.status_code == 404

    async with engine.running():
        assert await engine.wait(run_id, timeout=20) == "completed"

    listed = (await client.get("/v1/runs", params={"status": "completed"})).json()
    assert [r["run_id"] for r in listed] == [run_id]
    assert listed[0]["automation_id"] == "greet" and listed[0]["finished_at"]
    assert (await client.get("/v1/runs", params={"automation": "other"})).json() == []
    assert (await client.get("/v1/runs", params={"limit": 0})).status_code == 422

    view = (await client.get(f"/v1/runs/{run_id}")).json()
    assert view["run"]["status"] == "completed"
    assert view["run"]["ctx"]["vars"] == {"greeting": "hi Maya"}
    assert [s["step_id"] for s in view["steps"]] == ["hello"]
    events = [e["event"] for e in view["history"]]
    assert events[0] == "run_started" and events[-1] == "step_done"
    assert view["history"][-1]["detail"] == {"run": "completed"}
    assert view["history"][-1]["claimed_at"] is not None
    assert "start_duplicate" in events


async def test_openapi_and_health(client: httpx.AsyncClient) -> None:
    health = await client.get("/healthz")
    assert health.status_code == 200 and health.json() == {
        "ok": True,
        "database": "ok",
        "org_id": "test",
    }
    spec = (await client.get("/openapi.json")).json()
    for path in ("/v1/automations", "/v1/hooks/{automation_id}", "/v1/runs", "/v1/runs/{run_id}"):
        assert path in spec["paths"]
    hook = spec["paths"]["/v1/hooks/{automation_id}"]["post"]
    assert {"200", "202", "404", "413"} <= set(hook["responses"])


async def test_real_uvicorn_server_runs_a_webhook_start_to_the_end(engine: Engine) -> None:
    await engine.publish(GREET)
    headers = auth(await api_key(engine))
    async with (
        ApiServer(create_app(engine), port=0, log_level="warning", access_log=False) as api,
        httpx.AsyncClient(base_url=api.url, timeout=10, headers=headers) as client,
        engine.running(),
    ):
        assert api.port != 0
        assert (await client.get("/healthz")).json()["ok"] is True
        headers = {"X-Event-Id": "evt_real_http"}
        first = await client.post("/v1/hooks/greet", json={"name": "Maya"}, headers=headers)
        second = await client.post("/v1/hooks/greet", json={"name": "Maya"}, headers=headers)
        assert (first.status_code, second.status_code) == (202, 200)
        run_id = first.json()["run_id"]
        assert second.json()["run_id"] == run_id
        assert await engine.wait(run_id, timeout=20) == "completed"
        view = (await client.get(f"/v1/runs/{run_id}")).json()
        assert view["run"]["status"] == "completed"
    # stopped: the port no longer answers
    with pytest.raises(httpx.TransportError):
        async with httpx.AsyncClient(timeout=2) as after:
            await after.get(f"{api.url}/healthz")
