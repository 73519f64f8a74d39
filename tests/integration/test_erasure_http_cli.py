"""Erasing a contact from HTTP (``POST /v1/contacts/{contact_id}/erase``) and the CLI
(``onward contacts erase``), against a real server and real ``onward`` processes: the answer
says what was done, a second call says it was already done, bad input is a 422 / one line and
exit 2 with nothing stored, and a start naming the erased contact is a 409 ``contact_erased``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from onward import Automation
from onward.api import ApiServer, create_app
from onward.engine import Engine
from onward.testing import api_key, auth, run_onward, run_row

MAYA_ID = "contact-maya-7f3a"
MAYA = "maya@example.test"


@pytest.fixture
async def http(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    await engine.publish(Automation("hello").step("wait", "wait_for", duration="1h").build())
    server = ApiServer(create_app(engine), port=0, log_level="warning", access_log=False)
    headers = auth(await api_key(engine))
    async with (
        server,
        httpx.AsyncClient(base_url=server.url, timeout=30, headers=headers) as client,
    ):
        yield client


async def test_http_erase_cancels_erases_and_refuses_a_later_start(
    engine: Engine, http: httpx.AsyncClient, sql: psycopg.Connection[Any]
) -> None:
    start = {"automation_id": "hello", "input": {"email": MAYA}, "contact_id": MAYA_ID}
    started = await http.post("/v1/runs", json={**start, "event_id": "h1"})
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]

    got = await http.post(
        f"/v1/contacts/{MAYA_ID}/erase", json={"emails": ["Maya.Other@example.test"], "by": "dpo"}
    )
    assert got.status_code == 200, got.text
    body = got.json()
    assert (body["status"], body["contact_id"], body["requested_by"]) == ("done", MAYA_ID, "dpo")
    assert body["runs"] == [{"run_id": run_id, "cancel": "cancelled", "erasure": "erased"}]
    assert body["identifiers"] == 3 and body["suppressed"] == 3
    assert run_row(sql, run_id)["status"] == "cancelled"

    again = await http.post(f"/v1/contacts/{MAYA_ID}/erase")  # no body: by "operator"
    assert again.status_code == 200
    assert again.json()["runs"][0]["erasure"] == "already_erased"
    assert again.json()["requests"] == 2

    refused = await http.post("/v1/runs", json={**start, "event_id": "h2"})
    assert refused.status_code == 409
    assert refused.json()["error"] == "contact_erased"


@pytest.mark.parametrize(
    "body",
    [
        {"emails": ["not-an-address"]},
        {"emails": ["a@b.c"] * 101},
        {"by": ""},
        {"who": "dpo"},
        {"emails": "maya@example.test"},
    ],
)
async def test_http_erase_refuses_bad_input_and_stores_nothing(
    http: httpx.AsyncClient, sql: psycopg.Connection[Any], body: dict[str, Any]
) -> None:
    got = await http.post(f"/v1/contacts/{MAYA_ID}/erase", json=body)
    assert got.status_code == 422, got.text
    assert got.json()["error"] in ("invalid_request", "invalid_input")
    assert sql.execute("SELECT count(*) AS n FROM erasures").fetchone() == {"n": 0}


async def test_cli_erase_prints_what_it_did_and_refuses_bad_input(
    engine: Engine, db_url: str, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(Automation("hello").step("wait", "wait_for", duration="1h").build())
    run = await engine.start("hello", {"email": MAYA}, event_id="c1", contact_id=MAYA_ID)

    done = run_onward(
        db_url, "--org", "test", "contacts", "erase", MAYA_ID, "--by", "dpo", "--json"
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == "done"
    assert answer["runs"] == [{"run_id": run.run_id, "cancel": "cancelled", "erasure": "erased"}]

    again = run_onward(db_url, "--org", "test", "contacts", "erase", MAYA_ID, "--email", MAYA)
    assert again.returncode == 0, again.stderr
    assert f"contact {MAYA_ID}: erasure done (request 2" in again.stdout
    assert "0 erased now, 1 already erased" in again.stdout
    assert f"{run.run_id}  already_erased, already_cancelled" in again.stdout

    bad = run_onward(db_url, "--org", "test", "contacts", "erase", "other", "--email", "nobody")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "onward: identifier 'nobody': not an email address"
    (row,) = sql.execute("SELECT requests FROM erasures").fetchall()
    assert row["requests"] == 2
