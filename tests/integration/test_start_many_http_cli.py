"""Batch starts over HTTP (``POST /v1/runs:batch``) and from the CLI (``onward start-many``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.testing import onward_argv, process_env, run_onward

from .api_client import api_client

FLOW = Automation("greet").step("hello", "set", values={"greeting": "'hi ' + input.name"}).build()
Sql = psycopg.Connection[dict[str, Any]]


def _runs(sql: Sql) -> int:
    row = sql.execute("SELECT count(*) AS n FROM runs").fetchone()
    assert row is not None
    return int(row["n"])


async def test_a_batch_answers_each_start_in_order(engine: Engine, sql: Sql) -> None:
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with api_client(engine, publish=FLOW, scopes=("runs:write",)) as client:
        old = await client.post("/v1/runs", json={"automation_id": "greet", "key": "k-old"})
        assert old.status_code == 202, old.text
        reply = await client.post(
            "/v1/runs:batch",
            json={
                "starts": [
                    {"automation_id": "greet", "input": {"name": "A"}, "event_id": "e1"},
                    {"automation_id": "greet", "input": {"name": "B"}, "key": "k-old"},
                    {"automation_id": "greet", "input": {"name": "C"}},
                    {"automation_id": "greet", "input": {"name": "A2"}, "event_id": "e1"},
                ]
            },
            headers={"traceparent": tp},
        )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    started = body["started"]
    assert [s["index"] for s in started] == [0, 1, 2, 3]
    assert [s["created"] for s in started] == [True, False, True, False]
    assert [s["duplicate"] for s in started] == [False, True, False, True]
    assert [s["start_key_kind"] for s in started] == ["event", "caller", "payload_hash", "event"]
    assert started[0]["start_key"] == "greet:e1" and started[3]["run_id"] == started[0]["run_id"]
    assert started[1]["run_id"] == old.json()["run_id"]
    assert (body["created"], body["duplicates"]) == (2, 2)
    rows = sql.execute("SELECT run_id, traceparent FROM runs").fetchall()
    assert len(rows) == 3
    traced = {r["run_id"] for r in rows if r["traceparent"] == tp}
    assert traced == {started[0]["run_id"], started[2]["run_id"]}


@pytest.mark.parametrize(
    ("starts", "status", "error", "reason"),
    [
        ([], 422, "invalid_request", "starts: List should have at least 1 item"),
        (
            [{"automation_id": "greet"}] * 1001,
            422,
            "invalid_request",
            "starts: List should have at most 1000 items",
        ),
        (
            [{"automation_id": "greet"}, {"automation_id": "greet", "key": "x" * 513}],
            422,
            "invalid_request",
            "starts.1.key: String should have at most 512 characters",
        ),
        (
            [{"automation_id": "greet"}, {"automation_id": "greet", "colour": "red"}],
            422,
            "invalid_request",
            "starts.1.colour: Extra inputs are not permitted",
        ),
        (
            [{"automation_id": "greet", "key": "a"}, {"automation_id": "nope", "key": "b"}],
            404,
            "unknown_automation",
            "starts[1]: no published automation 'nope'",
        ),
        (
            [{"automation_id": "greet", "key": "a"}, {"automation_id": "greet", "version": 7}],
            404,
            "unknown_automation",
            "starts[1]: no published version 7 of automation 'greet'",
        ),
        (
            [{"automation_id": "greet"}, {"automation_id": "greet", "input": {"x": "\ud800"}}],
            422,
            "invalid_input",
            "$.starts[1].input.x: a lone surrogate",
        ),
        (
            [{"automation_id": "greet", "input": {"blob": "x" * 300_000}}] * 2,
            422,
            "invalid_input",
            "starts[0]: payload of",
        ),
    ],
)
async def test_a_bad_batch_is_refused_with_its_reason_and_nothing_stored(
    engine: Engine, sql: Sql, starts: list[Any], status: int, error: str, reason: str
) -> None:
    async with api_client(engine, publish=FLOW, scopes=("runs:write",)) as client:
        reply = await client.post(  # json.dumps: a lone surrogate escaped
            "/v1/runs:batch",
            content=json.dumps({"starts": starts}),
            headers={"Content-Type": "application/json"},
        )
    assert reply.status_code == status, reply.text
    assert reply.json()["error"] == error
    assert reason in reply.json()["detail"]
    assert _runs(sql) == 0


async def test_an_erased_contact_is_409_and_nothing_stored(engine: Engine, sql: Sql) -> None:
    await engine.erase_contact("c_gone", by="dpo")
    async with api_client(engine, publish=FLOW, scopes=("runs:write",)) as client:
        reply = await client.post(
            "/v1/runs:batch",
            json={
                "starts": [
                    {"automation_id": "greet", "contact_id": "c_here"},
                    {"automation_id": "greet", "contact_id": "c_gone"},
                ]
            },
        )
    assert reply.status_code == 409, reply.text
    assert reply.json()["error"] == "contact_erased"
    assert reply.json()["detail"].startswith("starts[1]: contact 'c_gone'")
    assert _runs(sql) == 0


async def test_the_batch_needs_runs_write(engine: Engine, sql: Sql) -> None:
    body = {"starts": [{"automation_id": "greet"}]}
    async with api_client(engine, publish=FLOW, scopes=("runs:read",)) as reader:
        refused = await reader.post("/v1/runs:batch", json=body)
        assert refused.status_code == 403
        assert "runs:write" in refused.json()["detail"]
        nobody = await reader.post("/v1/runs:batch", json=body, headers={"Authorization": ""})
        assert nobody.status_code == 401
    assert _runs(sql) == 0
    async with api_client(engine, scopes=("runs:write",)) as writer:
        assert (await writer.post("/v1/runs:batch", json=body)).status_code == 200
    assert _runs(sql) == 1


# -- the CLI ---------------------------------------------------------------------------------


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture
def published(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "greet.json"
    path.write_text(json.dumps(FLOW))
    _ok(run_onward(db_url, "publish", str(path)))


@pytest.mark.usefixtures("published")
def test_start_many_reads_json_lines_and_arrays_and_prints_one_answer_a_line(
    db_url: str, tmp_path: Path, sql: Sql
) -> None:
    lines = tmp_path / "starts.jsonl"
    lines.write_text(
        '{"automation_id": "greet", "input": {"name": "A"}, "event_id": "e1"}\n'
        "\n"
        '{"automation_id": "greet", "input": {"name": "B"}, "key": "k-b"}\n'
        '{"automation_id": "greet", "input": {"name": "A"}, "event_id": "e1"}\n'
    )
    answers = [
        json.loads(x)
        for x in _ok(run_onward(db_url, "start-many", str(lines), "--json")).splitlines()
    ]
    assert [a["index"] for a in answers] == [0, 1, 2]
    assert [a["created"] for a in answers] == [True, True, False]
    assert answers[2]["run_id"] == answers[0]["run_id"]
    assert set(answers[0]) == {
        "index",
        "run_id",
        "created",
        "duplicate",
        "start_key",
        "start_key_kind",
    }
    array = json.dumps(
        [{"automation_id": "greet", "key": "k-b"}, {"automation_id": "greet", "key": "k-c"}]
    )
    result = subprocess.run(
        onward_argv(db_url, "start-many", "-"),
        input=array,
        capture_output=True,
        text=True,
        timeout=60,
        env=process_env(),
        check=False,
    )
    out = _ok(result).splitlines()
    assert out[0] == f"0: duplicate: {answers[1]['run_id']} was already started by k-b"
    assert out[1].startswith("1: started run_") and "(start key k-c [caller])" in out[1]
    assert _runs(sql) == 3


@pytest.mark.usefixtures("published")
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "starts: List should have at least 1 item"),
        ('{"automation_id": "greet"}\n{"automation_id": "greet", "key": 5}\n', "starts.1.key"),
        ('{"automation_id": "greet"}\n{"automation_id": "nope"}\n', "starts[1]: no published"),
        ('{"automation_id": "greet"}\n{not json\n', "line 2"),
        ('[{"automation_id": "greet"}, 3]', "starts.1: Input should be"),
        ("\n".join(['{"automation_id": "greet"}'] * 1001), "at most 1000 items"),
    ],
)
def test_start_many_refuses_a_bad_file_in_one_line_and_stores_nothing(
    db_url: str, tmp_path: Path, sql: Sql, content: str, message: str
) -> None:
    path = tmp_path / "starts.jsonl"
    path.write_text(content)
    result = run_onward(db_url, "start-many", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert "Traceback" not in result.stderr
    assert _runs(sql) == 0


def test_start_many_names_an_unreadable_file(db_url: str, tmp_path: Path) -> None:
    result = run_onward(db_url, "start-many", str(tmp_path / "missing.jsonl"))
    assert result.returncode == 2 and "missing.jsonl: cannot read" in result.stderr
