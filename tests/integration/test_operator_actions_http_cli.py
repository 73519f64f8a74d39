"""Operator actions from the outside (B2/B3): ``POST /v1/runs/{run_id}/review|resume|fork``
over the API, and ``onward review resolve`` / ``resume`` / ``fork`` as real subprocesses, on
the same database as the engine that runs the runs. An action that applies answers what it did;
one that does not is a 409 ``action_refused`` (or 404, 422), or exit 2 with one ``onward: ...``
line -- and changes nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import psycopg
import pytest

from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import history, run_onward, steps
from tests.integration.api_client import api_client
from tests.integration.test_operator_actions import events, failed_run, parked_for_review

pytestmark = pytest.mark.usefixtures("admin")

AS_TEST_ORG = {"ONWARD_ORG": "test"}  # the engine fixture's organisation


async def onward(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_onward, db_url, *args, env=AS_TEST_ORG)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], needle: str) -> str:
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("onward: "), result.stderr
    assert needle in lines[0], lines[0]
    assert result.stdout == ""
    return lines[0]


async def test_http_resolves_a_review_and_refuses_what_does_not_apply(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    run_id, key = await parked_for_review(engine, sandbox, admin, sql)
    reference = admin.ledger("payment")[0]["response_id"]
    before = events(sql, run_id)
    async with api_client(engine) as http:
        missing = await http.post(f"/v1/runs/{run_id}/review", json={"how": "happened", "by": "a"})
        assert missing.status_code == 422 and "reference" in missing.json()["detail"]
        resume = await http.post(f"/v1/runs/{run_id}/resume", json={"by": "ana"})
        assert resume.status_code == 409, resume.text
        assert resume.json()["error"] == "action_refused"
        assert "resolve the review" in resume.json()["detail"]
        blank = await http.post(f"/v1/runs/{run_id}/resume", json={"by": "  "})
        assert blank.status_code == 422
        unknown = await http.post("/v1/runs/run_nope/review", json={"how": "skip", "by": "ana"})
        assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_run")
        assert events(sql, run_id) == before  # nothing changed

        done = await http.post(
            f"/v1/runs/{run_id}/review",
            json={"how": "happened", "reference": reference, "by": "ana"},
        )
        assert done.status_code == 200, done.text
        body = done.json()
        assert (body["status"], body["how"], body["reference"], body["by"]) == (
            "active",
            "happened",
            reference,
            "ana",
        )
        assert (body["step_id"], body["seq"], body["effects"]) == ("charge", 1, [key])
        again = await http.post(f"/v1/runs/{run_id}/review", json={"how": "skip", "by": "bob"})
        assert (again.status_code, again.json()["error"]) == (409, "action_refused")
        assert "not parked" in again.json()["detail"]
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    assert len(admin.ledger("payment")) == 1
    assert [h["detail"]["by"] for h in history(sql, run_id, "review_resolved")] == ["ana"]


async def test_cli_resolves_a_review_resumes_and_refuses_with_one_line(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    sql: psycopg.Connection,
    db_url: str,
) -> None:
    run_id, _ = await parked_for_review(engine, sandbox, admin, sql)
    before = events(sql, run_id)
    refused(await onward(db_url, "review", "resolve", run_id), "say how, once")
    refused(await onward(db_url, "review", "resolve", run_id, "--retry", "--skip"), "say how, once")
    refused(await onward(db_url, "review", "resolve", run_id, "--happened"), "reference")
    refused(await onward(db_url, "resume", run_id, "--by", "ana"), "resolve the review")
    refused(await onward(db_url, "review", "resolve", "run_nope", "--skip"), "run_nope")
    assert events(sql, run_id) == before

    line = ok(await onward(db_url, "review", "resolve", run_id, "--skip", "--by", "ana"))
    assert line.strip() == (f"run {run_id}: review resolved, skip, by ana; step charge#1 is ready")
    refused(await onward(db_url, "review", "resolve", run_id, "--skip"), "not parked")
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    (charge,) = steps(sql, run_id, "charge")
    assert charge["status"] == "skipped"
    refused(await onward(db_url, "resume", run_id, "--by", "ana"), "has finished")
    assert len(history(sql, run_id, "review_resolved")) == 1


async def test_a_fork_over_http_and_the_cli_is_one_fork(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    sql: psycopg.Connection,
    db_url: str,
) -> None:
    old, _ = await failed_run(engine, sandbox, admin)
    async with api_client(engine) as http:
        nope = await http.post(f"/v1/runs/{old}/fork", json={"from_step": "nope", "by": "ana"})
        assert (nope.status_code, nope.json()["error"]) == (409, "action_refused")
        no_version = await http.post(f"/v1/runs/{old}/fork", json={"version": 9, "by": "ana"})
        assert (no_version.status_code, no_version.json()["error"]) == (404, "unknown_automation")
        assert history(sql, old, "run_forked") == []

        first = await http.post(f"/v1/runs/{old}/fork", json={"from_step": "charge", "by": "ana"})
        assert first.status_code == 201, first.text
        fork: dict[str, Any] = first.json()
        assert (fork["forked_from"], fork["created"], fork["step_id"], fork["seq"]) == (
            old,
            True,
            "charge",
            4,
        )
        second = await http.post(f"/v1/runs/{old}/fork", json={"by": "bob"})
        assert second.status_code == 200
        assert (second.json()["run_id"], second.json()["duplicate"]) == (fork["run_id"], True)

    listed = json.loads(
        ok(await onward(db_url, "fork", old, "--from-step", "charge", "--by", "cy", "--json"))
    )
    assert (listed["run_id"], listed["created"]) == (fork["run_id"], False)
    line = ok(await onward(db_url, "fork", old, "--by", "cy")).strip()
    assert line == f"{fork['run_id']} already forked from {old} at step charge#4 (version 1)"
    refused(await onward(db_url, "fork", old, "--from-step", "nope"), "never reached step 'nope'")
    refused(await onward(db_url, "fork", fork["run_id"]), "not finished")

    async with engine.running():
        assert await engine.wait(fork["run_id"], timeout=30) == "completed"
    assert len(admin.ledger("email")) == 1 and len(admin.ledger("payment")) == 1
    (forked,) = history(sql, old, "run_forked")
    assert forked["detail"]["by"] == "ana"
