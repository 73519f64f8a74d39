"""Connections and consent over the HTTP API: bad input is refused, nothing half-written."""

from __future__ import annotations

import httpx
import psycopg

from onward.api.app import create_app
from onward.engine import Engine


def _client(engine: Engine) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://t"
    )


async def test_connection_lifecycle_over_http(engine: Engine, sql: psycopg.Connection) -> None:
    async with _client(engine) as http:
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
