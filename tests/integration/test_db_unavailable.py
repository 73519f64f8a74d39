"""The API when PostgreSQL restarts or cannot be reached (a real PostgreSQL, real backends
terminated the way a restart terminates them).

* After a restart every pooled connection is dead and its first statement fails once: reads,
  starts and publishes are repeated once on a fresh connection, so the caller sees no error.
* Other writes are not repeated blindly: they answer 503 with ``Retry-After`` and are safe to
  send again.
* While the database refuses connections every route answers 503 with ``Retry-After`` and the
  one JSON error body -- never a plain-text 500 -- and answers again once it is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from onward.engine import Engine
from onward.testing import TemporaryDatabases
from tests.integration.api_client import api_client

Sql = psycopg.Connection[dict[str, Any]]

GREET = {
    "id": "greet",
    "steps": [{"id": "hello", "kind": "set", "with": {"values": {"greeting": "'hi'"}}}],
}
CONNECTION = {
    "connection_id": "mailbox",
    "provider": "email",
    "base_url": "http://127.0.0.1:9",
    "account": "a",
    "secret": "s3cret",
}


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(engine, publish=GREET) as c:
        yield c


def dbname(db_url: str) -> str:
    return urlsplit(db_url).path.lstrip("/")


def terminate_backends(sql: Sql) -> int:
    """What a restart does to every session of this database (ours excepted), waiting until
    each backend has exited."""
    rows = sql.execute(
        "SELECT pg_terminate_backend(pid, 5000) AS gone FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    assert all(r["gone"] for r in rows)
    return len(rows)


@pytest.fixture
def admin(databases: TemporaryDatabases) -> Iterator[Sql]:
    """A session on another database, which survives what is done to the test's database."""
    with psycopg.connect(databases.admin_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


def allow_connections(admin: Sql, db_url: str, allowed: bool) -> None:
    name = pgsql.Identifier(dbname(db_url))
    value = pgsql.SQL("true" if allowed else "false")
    admin.execute(pgsql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(name, value))


@pytest.fixture
def refusing(db_url: str, admin: Sql) -> Iterator[None]:
    """The database refuses every new connection, and every session of it is terminated,
    until the test ends (or allows connections again)."""
    allow_connections(admin, db_url, False)
    try:
        admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = %s",
            [dbname(db_url)],
        )
        yield
    finally:
        allow_connections(admin, db_url, True)


async def warm(client: httpx.AsyncClient) -> None:
    """Several connections in the pool, all of which the restart will kill."""
    replies = await asyncio.gather(*(client.get("/v1/runs") for _ in range(6)))
    assert {r.status_code for r in replies} == {200}


def assert_unavailable(reply: httpx.Response) -> None:
    assert reply.status_code == 503, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert int(reply.headers["Retry-After"]) >= 1
    body = reply.json()
    assert body["error"] == "unavailable" and "database" in body["detail"]
    assert set(body) <= {"error", "detail", "problems"}


async def test_reads_after_a_restart_are_repeated_once_and_succeed(
    client: httpx.AsyncClient, sql: Sql, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="onward.db")
    started = await client.post("/v1/hooks/greet", json={"name": "Maya"})
    run_id = started.json()["run_id"]
    reads = ["/healthz", "/v1/runs", "/v1/automations", f"/v1/runs/{run_id}"]
    for path in reads:
        await warm(client)
        assert terminate_backends(sql) >= 1
        caplog.clear()
        reply = await client.get(path)
        assert reply.status_code == 200, (path, reply.text)
        assert "repeating a read once" in caplog.text, path


async def test_a_start_and_a_publish_after_a_restart_are_repeated_once(
    client: httpx.AsyncClient, sql: Sql
) -> None:
    await warm(client)
    terminate_backends(sql)
    started = await client.post("/v1/hooks/greet", json={"n": 1}, headers={"X-Event-Id": "e1"})
    assert started.status_code == 202, started.text
    again = await client.post("/v1/hooks/greet", json={"n": 1}, headers={"X-Event-Id": "e1"})
    assert again.status_code == 200 and again.json()["run_id"] == started.json()["run_id"]
    await warm(client)
    terminate_backends(sql)
    published = await client.post("/v1/automations", json={**GREET, "name": "v2"})
    assert published.status_code == 201, published.text
    row = sql.execute("SELECT count(*) AS n FROM runs").fetchone()
    assert row is not None and row["n"] == 1


async def test_another_write_after_a_restart_is_503_and_safe_to_repeat(
    client: httpx.AsyncClient, sql: Sql
) -> None:
    await warm(client)
    terminate_backends(sql)
    first = await client.post("/v1/connections", json=CONNECTION)
    assert_unavailable(first)
    repeated = await client.post("/v1/connections", json=CONNECTION)
    assert repeated.status_code == 201, repeated.text
    row = sql.execute("SELECT count(*) AS n FROM connections").fetchone()
    assert row is not None and row["n"] == 1


async def test_a_database_that_refuses_connections_is_503_with_retry_after(
    client: httpx.AsyncClient, db_url: str, admin: Sql, request: pytest.FixtureRequest
) -> None:
    await warm(client)
    request.getfixturevalue("refusing")
    calls = [
        ("GET", "/healthz", None),
        ("GET", "/v1/runs", None),
        ("GET", "/v1/automations", None),
        ("GET", "/v1/runs/run_x", None),
        ("POST", "/v1/hooks/greet", {"name": "Maya"}),
        ("POST", "/v1/runs", {"automation_id": "greet"}),
        ("POST", "/v1/automations", {**GREET, "name": "v2"}),
        ("POST", "/v1/connections", CONNECTION),
        ("POST", "/v1/connections/mailbox/restore", None),
        ("POST", "/v1/suppressions", {"contact": "a@b.test", "reason": "unsubscribed"}),
    ]
    for method, path, body in calls:
        reply = await asyncio.wait_for(client.request(method, path, json=body), timeout=15)
        assert_unavailable(reply)
    allow_connections(admin, db_url, True)
    back = await client.get("/v1/runs")
    assert back.status_code == 200 and back.json() == []
    after = await client.post("/v1/connections", json=CONNECTION)
    assert after.status_code == 201, after.text
    with psycopg.connect(db_url, row_factory=dict_row) as sql:
        counts = sql.execute(
            "SELECT (SELECT count(*) FROM runs) AS runs, "
            "(SELECT count(*) FROM automation_versions) AS versions, "
            "(SELECT count(*) FROM suppressions) AS suppressions"
        ).fetchone()
    assert counts == {"runs": 0, "versions": 1, "suppressions": 0}
