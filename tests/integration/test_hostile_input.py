"""Hostile input answers a 422 naming the problem, never a 500, and nothing is stored.

Python's parsers take what PostgreSQL's jsonb and text refuse (``\\u0000``, lone surrogates,
``NaN``, ``1e400``), recurse on deep nesting (``RecursionError``), and YAML aliases expand a
small request into a huge document. Each is refused before anything is written, on every route
that takes a body or an id, against a real PostgreSQL; and by ``load_file`` for the CLI.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from onward import Automation, StepContext, step_kind
from onward.automations.document import MAX_DOCUMENT_BYTES, load_file
from onward.engine import Engine
from onward.errors import InvalidAutomation
from tests.integration.api_client import api_client

Sql = psycopg.Connection[dict[str, Any]]

GREET = {
    "id": "greet",
    "steps": [{"id": "hello", "kind": "set", "with": {"values": {"ok": "true"}}}],
}

# A JSON value (as bytes, to be put where a value goes) and what the answer must name.
HOSTILE: list[tuple[bytes, str]] = [
    (b"[" * 50_000 + b"]" * 50_000, "nested deeper than 64 levels"),
    (b'"x\\u0000y"', "\\u0000 (NUL)"),
    (b'{"k\\u0000": 1}', "\\u0000 (NUL)"),
    (b'"\\ud800"', "lone surrogate"),
    (b"NaN", "NaN is not a number"),
    (b"-Infinity", "-Infinity is not a number"),
    (b"1e400", "1e400 is not a number"),
    (b'"\xff\xfe"', "not UTF-8"),
]

# Every route that takes a JSON body, with the hostile value put inside a body it would take.
BODIES = {
    "webhook": ("/v1/hooks/greet", b'{"name": "Maya", "x": %s}'),
    "start": ("/v1/runs", b'{"automation_id": "greet", "input": {"x": %s}}'),
    "start-id": ("/v1/runs", b'{"automation_id": "greet", "event_id": %s}'),
    "publish": (
        "/v1/automations",
        b'{"id": "other", "steps": [{"id": "a", "kind": "set", "with": {"values": {"v": %s}}}]}',
    ),
    "connection": (
        "/v1/connections",
        b'{"connection_id": "c1", "provider": "email", "base_url": "http://127.0.0.1:9", '
        b'"account": %s, "secret": "s"}',
    ),
    "suppression": ("/v1/suppressions", b'{"contact": %s, "reason": "unsubscribed"}'),
}

TABLES = ("runs", "steps", "history", "automation_versions", "connections", "suppressions")


def counts(sql: Sql) -> dict[str, int]:
    rows = {}
    for table in TABLES:
        row = sql.execute(f"SELECT count(*) AS n FROM {table}").fetchone()
        assert row is not None
        rows[table] = int(row["n"])
    return rows


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(engine, publish=GREET) as c:
        yield c


def assert_refused(reply: httpx.Response, message: str) -> dict[str, Any]:
    assert reply.status_code == 422, reply.text
    assert reply.headers["content-type"] == "application/json"
    body: dict[str, Any] = reply.json()
    assert set(body) <= {"error", "detail", "problems"}
    assert body["error"] in {"invalid_input", "invalid_automation", "invalid_request"}
    assert message in body["detail"] + " ".join(body.get("problems") or []), body
    return body


@pytest.mark.parametrize("route", list(BODIES))
async def test_a_hostile_json_body_is_422_naming_it_and_nothing_is_stored(
    client: httpx.AsyncClient, sql: Sql, route: str
) -> None:
    path, template = BODIES[route]
    before = counts(sql)
    for case in HOSTILE:
        value, message = case
        reply = await client.post(
            path, content=template % value, headers={"content-type": "application/json"}
        )
        body = assert_refused(reply, message)
        said = body["detail"] + " ".join(body.get("problems") or [])
        if route != "start-id" and message != "not UTF-8":
            assert "$." in said or "line 1 column" in said, said  # says where
    assert counts(sql) == before


def alias_bomb() -> bytes:
    """A few hundred bytes of YAML whose aliases expand to gigabytes."""
    lines = ["id: bomb", "steps:", "  - id: a", "    kind: set", "    with:", "      values:"]
    lines.append('        l0: &l0 ["' + "x" * 40 + '"]')
    for i in range(1, 10):
        lines.append(f"        l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines).encode()


YAML_HOSTILE: list[tuple[bytes, str]] = [
    (alias_bomb(), f"larger than {MAX_DOCUMENT_BYTES} bytes once expanded"),
    (b"id: deep\nsteps: " + b"[" * 50_000 + b"]" * 50_000, "nested deeper"),
    (b'id: x\nsteps: [{id: a, kind: set, with: {values: {v: "a\\0b"}}}]', "NUL"),
    (
        b'id: x\nsteps: [{id: a, kind: set, with: {values: {v: "\\ud800"}}}]',
        "lone surrogate",
    ),
    (b"id: x\nsteps: [{id: a, kind: set, with: {values: {v: 1" + b"9" * 5000 + b"}}}]", "4300"),
    (b"id: x\nsteps: [{id: a, kind: set, with: {values: {v: 2026-02-30}}}]", "day is out of"),
    (b"id: x\nname: \xff\xfe\n", "not UTF-8"),
]


async def test_a_hostile_yaml_automation_is_422_and_nothing_is_stored(
    client: httpx.AsyncClient, sql: Sql
) -> None:
    before = counts(sql)
    for case in YAML_HOSTILE:
        text, message = case
        reply = await client.post(
            "/v1/automations", content=text, headers={"content-type": "application/yaml"}
        )
        body = assert_refused(reply, message)
        assert body["error"] == "invalid_automation"
    assert counts(sql) == before


def test_the_alias_bomb_is_small() -> None:
    assert len(alias_bomb()) < 1000  # the request is small; the expansion is what is refused


IDS: list[tuple[str, str]] = [
    ("post", "/v1/hooks/gr%00eet"),
    ("get", "/v1/runs/run_%00"),
    ("get", "/v1/runs?status=a%00b"),
    ("get", "/v1/runs?automation=%00"),
    ("post", "/v1/connections/c%00/restore"),
    ("post", "/v1/connections/c%00/probe"),
]


async def test_nul_in_an_id_is_422(client: httpx.AsyncClient, sql: Sql) -> None:
    before = counts(sql)
    for case in IDS:
        method, path = case
        reply = await client.request(method, path)
        assert_refused(reply, "should match pattern")
    assert counts(sql) == before


async def test_nul_in_an_event_id_header_is_422(client: httpx.AsyncClient, sql: Sql) -> None:
    before = counts(sql)
    for header in ("X-Event-Id", "Idempotency-Key"):
        # httpx refuses to send NUL in a header, so the request is built by hand as a server
        # would hand it to the application
        scope_headers = [(header.lower().encode(), b"evt\x00one")]
        reply = await raw_post(client, "/v1/hooks/greet", b'{"name": "Maya"}', scope_headers)
        assert reply[0] == 422
        assert b"invalid_request" in reply[1] and header.encode() in reply[1]
    assert counts(sql) == before


async def raw_post(
    client: httpx.AsyncClient, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[int, bytes]:
    """One request straight into the ASGI app, headers exactly as given (and the client's API
    key)."""
    transport = client._transport
    assert isinstance(transport, httpx.ASGITransport)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"onward.test"),
            (b"content-type", b"application/json"),
            (b"authorization", client.headers["authorization"].encode()),
            *headers,
        ],
        "client": ("127.0.0.1", 1),
        "server": ("onward.test", 80),
    }
    sent: list[MutableMapping[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await transport.app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, content


async def test_an_event_id_over_256_characters_is_422(client: httpx.AsyncClient) -> None:
    reply = await client.post("/v1/hooks/greet", json={"event_id": "e" * 257})
    assert_refused(reply, "at most 256 characters")
    header = await client.post("/v1/hooks/greet", json={}, headers={"X-Event-Id": "e" * 257})
    assert_refused(header, "at most 256 characters")


# -- the library: load_file (what `onward publish FILE` reads) -------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"id: x\nname: caf\xe9\n", "not UTF-8 text (invalid byte at offset 15)"),
        pytest.param(b"id: x\nsteps: " + b"[" * 50_000 + b"]" * 50_000, "nested deeper"),
        pytest.param(b"id: x\nsteps: " + b"[" * 70 + b"]" * 70, "nested deeper than 64"),
        pytest.param(alias_bomb(), "larger than 1048576 bytes once expanded"),
        pytest.param(b"id: [\n", "not valid YAML/JSON"),
    ],
    ids=["not-utf8", "deep-50k", "deep-70", "bomb", "broken"],
)
def test_load_file_refuses_in_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "automation.yaml"
    path.write_bytes(content)
    with pytest.raises(InvalidAutomation) as caught:
        load_file(path)
    assert len(caught.value.problems) == 1
    problem = caught.value.problems[0]
    assert problem.startswith(str(path)) and message in problem
    assert "\n" not in str(caught.value)


async def test_the_library_publish_refuses_a_bomb_before_expanding_it(engine: Engine) -> None:
    import yaml

    document = yaml.safe_load(alias_bomb())
    with pytest.raises(InvalidAutomation, match="larger than 1048576 bytes once expanded"):
        await engine.publish(document)


@step_kind("hostile.echo", lane="fast", replace=True)
async def _echo(step: StepContext) -> dict[str, Any]:
    return {"text": step.input["text"]}


async def test_an_output_postgresql_cannot_store_fails_its_own_step_only(
    engine: Engine, sql: Sql
) -> None:
    """A step whose output holds a ``\\u0000`` or a lone surrogate (jsonb cannot store either)
    fails by itself with a reason naming it; the steps of other runs settled in the same
    batch statement complete (one bad output must not fail the whole batch)."""
    await engine.publish(
        Automation("echo")
        .step("echo", "hostile.echo")
        .step("after", "set", values={"done": "true"})
        .build()
    )
    bad = {
        "nul": (await engine.start("echo", {"text": "ok"}, event_id="nul")).run_id,
        "surrogate": (await engine.start("echo", {"text": "ok"}, event_id="sur")).run_id,
    }
    good = [
        (await engine.start("echo", {"text": f"fine {i}"}, event_id=f"good-{i}")).run_id
        for i in range(20)
    ]
    poison = {bad["nul"]: "a\x00b", bad["surrogate"]: "\ud800"}

    @step_kind("hostile.echo", lane="fast", replace=True)
    async def _poison(step: StepContext) -> dict[str, Any]:
        return {"text": poison.get(step.run_id, step.input["text"])}

    try:
        async with engine.running():
            for run_id in good:
                assert await engine.wait(run_id, timeout=30) == "completed"
            for run_id in bad.values():
                assert await engine.wait(run_id, timeout=30) == "failed"
    finally:
        step_kind("hostile.echo", lane="fast", replace=True)(_echo)
    nul = sql.execute("SELECT status_reason FROM runs WHERE run_id = %s", (bad["nul"],)).fetchone()
    assert nul is not None and "\\u0000 (NUL)" in nul["status_reason"]
    sur = sql.execute(
        "SELECT status_reason FROM runs WHERE run_id = %s", (bad["surrogate"],)
    ).fetchone()
    assert sur is not None and "lone surrogate" in sur["status_reason"]
