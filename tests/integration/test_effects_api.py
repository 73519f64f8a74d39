"""Connections and consent over the HTTP API: bad input is refused, nothing half-written."""

from __future__ import annotations

import psycopg

from onward.engine import Engine
from tests.integration.api_client import api_client


async def test_connection_lifecycle_over_http(engine: Engine, sql: psycopg.Connection) -> None:
    async with api_client(engine) as http:
        bad = await http.post(
            "/v1/connections",
            json={
                "connection_id": "x",
                "provider": "fax",
                "base_url": "http://h",
                "account": "a",
                "secret": "s",
            },
        )
        assert bad.status_code == 422 and "fax" in bad.text
        assert sql.execute("SELECT count(*) AS n FROM connections").fetchone()["n"] == 0
        ok = await http.post(
            "/v1/connections",
            json={
                "connection_id": "mailbox",
                "provider": "email",
                "base_url": "http://127.0.0.1:9",
                "account": "a",
                "secret": "s3cret",
            },
        )
        assert ok.status_code == 201 and "s3cret" not in ok.text
        restored = await http.post("/v1/connections/mailbox/restore")
        assert restored.json() == {"connection_id": "mailbox", "resumed": []}
        probe = await http.post("/v1/connections/mailbox/probe")
        assert probe.json()["healthy"] is False  # nothing listens on port 9: unreachable
        sup = await http.post(
            "/v1/suppressions", json={"contact": "Maya@Example.test", "reason": "unsubscribed"}
        )
        assert sup.status_code == 201
    row = sql.execute("SELECT contact, reason FROM suppressions").fetchone()
    assert row == {"contact": "maya@example.test", "reason": "unsubscribed"}


async def test_restore_and_probe_of_an_unknown_connection_are_404(
    engine: Engine, sql: psycopg.Connection
) -> None:
    async with api_client(engine) as http:
        for action in ("restore", "probe"):
            reply = await http.post(f"/v1/connections/nosuch/{action}")
            assert reply.status_code == 404, (action, reply.text)
            assert reply.json()["error"] == "unknown_connection"
            assert "nosuch" in reply.json()["detail"]
    for table in ("connections", "notifications"):
        assert sql.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"] == 0
