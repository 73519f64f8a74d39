"""Schedules from the outside: ``onward schedules list|pause|resume|trigger`` (a real
subprocess) and ``/v1/schedules`` over HTTP (in-process ASGI), against the test's database."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psycopg

from onward.engine import Engine
from onward.testing import run_onward
from tests.integration.api_client import api_client

TICKER_YAML = """\
id: ticker
steps:
  - {id: tick, kind: set, with: {values: {at: "input.schedule.instant"}}}
schedules:
  - id: morning
    rule: 09:00 on weekdays
    zone: Europe/Berlin
    jitter: 5m
    input: {team: sales}
"""


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """Exit 2 with one line on stderr, no traceback."""
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onward: "), result.stderr
    return lines[0]


def row(sql: psycopg.Connection[dict[str, Any]]) -> dict[str, Any]:
    found = sql.execute("SELECT * FROM schedules WHERE schedule_id = 'morning'").fetchone()
    assert found is not None
    return found


def test_the_cli_lists_pauses_resumes_and_triggers(
    db_url: str, tmp_path: Path, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    document = tmp_path / "ticker.yaml"
    document.write_text(TICKER_YAML)
    ok(run_onward(db_url, "publish", str(document)))
    assert "no schedules" not in ok(run_onward(db_url, "schedules", "list"))

    listed = json.loads(ok(run_onward(db_url, "schedules", "list", "--json")))
    assert [(s["automation_id"], s["schedule_id"]) for s in listed] == [("ticker", "morning")]
    assert listed[0]["zone"] == "Europe/Berlin" and listed[0]["jitter_s"] == 300
    assert listed[0]["paused"] is False and listed[0]["next_fire_at"] is not None
    text = ok(run_onward(db_url, "schedules", "list", "--automation", "ticker"))
    assert "ticker/morning" in text and "active" in text

    assert "paused ticker/morning" in ok(
        run_onward(db_url, "schedules", "pause", "ticker", "morning")
    )
    assert row(sql)["paused"]
    assert "paused" in ok(run_onward(db_url, "schedules", "list"))
    resumed = json.loads(
        ok(run_onward(db_url, "schedules", "resume", "ticker", "morning", "--json"))
    )
    assert resumed["paused"] is False and not row(sql)["paused"]

    fired = json.loads(
        ok(run_onward(db_url, "schedules", "trigger", "ticker", "morning", "--key", "k1", "--json"))
    )
    assert fired["outcome"] == "started"
    assert fired["start_key"] == "ticker:schedule:morning:trigger:k1"
    run = sql.execute("SELECT input FROM runs WHERE run_id = %s", (fired["run_id"],)).fetchone()
    assert run is not None and run["input"]["team"] == "sales"
    assert run["input"]["schedule"]["id"] == "morning"
    # overlap skip: that run is unfinished (no worker runs here)
    again = ok(run_onward(db_url, "schedules", "trigger", "ticker", "morning"))
    assert again.startswith("skipped: run " + fired["run_id"])

    line = refused(run_onward(db_url, "schedules", "pause", "ticker", "nope"))
    assert "unknown schedule 'nope'" in line
    assert "not an id" in refused(run_onward(db_url, "schedules", "resume", "tick er", "morning"))
    assert "--key" in refused(
        run_onward(db_url, "schedules", "trigger", "ticker", "morning", "--key", "x" * 201)
    )


async def test_the_http_api_lists_pauses_resumes_and_triggers(
    engine: Engine, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    async with api_client(engine) as client:
        published = await client.post(
            "/v1/automations", content=TICKER_YAML, headers={"content-type": "application/yaml"}
        )
        assert published.status_code == 201, published.text
        listed = await client.get("/v1/schedules")
        assert listed.status_code == 200
        assert [s["schedule_id"] for s in listed.json()] == ["morning"]
        assert (await client.get("/v1/schedules", params={"automation": "other"})).json() == []

        base = "/v1/schedules/ticker/morning"
        paused = await client.post(f"{base}/pause")
        assert paused.status_code == 200 and paused.json()["paused"] is True
        resumed = await client.post(f"{base}/resume", params={"catch_up": "true"})
        assert resumed.status_code == 200 and resumed.json()["paused"] is False

        first = await client.post(f"{base}/trigger", headers={"Idempotency-Key": "press-1"})
        assert first.status_code == 202, first.text
        assert first.json()["outcome"] == "started"
        repeat = await client.post(f"{base}/trigger", headers={"Idempotency-Key": "press-1"})
        assert repeat.status_code == 200
        assert (repeat.json()["outcome"], repeat.json()["run_id"]) == (
            "duplicate",
            first.json()["run_id"],
        )
        busy = await client.post(f"{base}/trigger")
        assert busy.status_code == 200 and busy.json()["outcome"] == "skipped"
        assert "unfinished" in busy.json()["reason"]

        for path in ("/v1/schedules/ticker/nope/pause", "/v1/schedules/nope/morning/trigger"):
            unknown = await client.post(path)
            assert unknown.status_code == 404
            assert unknown.json()["error"] == "unknown_schedule"
        bad = await client.post(f"{base}/trigger", headers={"Idempotency-Key": "x" * 201})
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"
    counts = row(sql)
    assert (counts["fired_count"], counts["skipped_count"]) == (1, 1)
