"""Migrating runs from the CLI (``onward runs migrate``, a real process) and over HTTP: a bad
migration is refused with its reason (one line and exit 2; 422 with every problem), a dry run
lists what would move, a migration moves the runs and reports its operation."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from onward.engine import Engine
from onward.testing import eventually, history, run_onward
from tests.integration.api_client import api_client
from tests.integration.test_run_migrations import ID, doc, publish_v3, start


async def on_v3_and_v4_without_reply(engine: Engine) -> list[str]:
    await publish_v3(engine)
    await engine.publish(doc("v4", reply=None))
    return await start(engine, "signal", 3, "a", version=3)  # ready at start (no worker)


def versions(sql: psycopg.Connection[Any], run_ids: list[str]) -> list[int]:
    return [
        sql.execute("SELECT version FROM runs WHERE run_id = %s", (r,)).fetchone()["version"]  # type: ignore[index]
        for r in run_ids
    ]


async def test_the_cli_refuses_a_bad_migration_in_one_line_dry_runs_and_migrates(
    db_url: str, engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    runs = await on_v3_and_v4_without_reply(engine)
    base = ("--org", "test", "runs", "migrate", "--automation", ID, "--from", "3", "--to", "4")

    refused = run_onward(db_url, *base)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr
    assert "migration refused: step 'reply' of version 3 is reachable" in lines[0]

    bad_map = run_onward(db_url, *base, "--map", "reply:nowhere")
    assert bad_map.returncode == 2
    assert bad_map.stderr.strip().splitlines() == [
        "onward: migration refused: map reply:nowhere: version 4 has no step 'nowhere'"
    ]
    garbled = run_onward(db_url, *base, "--map", "reply")
    assert garbled.returncode == 2 and "--map: 'reply' is not old:new" in garbled.stderr

    dry = run_onward(db_url, *base, "--map", "reply:finish", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] is True and plan["outcomes"] == {"moved": 3}
    assert {(p["from_step"], p["to_step"]) for p in plan["plan"]} == {("start", "start")}
    text = run_onward(db_url, *base, "--map", "reply:finish", "--dry-run")
    assert text.returncode == 0 and all(r in text.stdout for r in runs)
    assert versions(sql, runs) == [3, 3, 3]

    done = run_onward(db_url, *base, "--map", "reply:finish", "--batch", "2", "--by", "maya")
    assert done.returncode == 0, done.stderr
    assert "done: 3 run(s) of mig v3 -> v4" in done.stdout
    assert "pass 1: 2 run(s) handled" in done.stderr  # progress, batch by batch
    assert versions(sql, runs) == [4, 4, 4]
    for r in runs:
        (moved,) = history(sql, r, "run_migrated")
        assert moved["detail"]["by"] == "maya" and moved["detail"]["map"] == {"reply": "finish"}


async def test_http_refuses_with_422_and_every_reason_dry_runs_and_answers_202_with_progress(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    runs = await on_v3_and_v4_without_reply(engine)
    url = f"/v1/automations/{ID}/migrations"
    async with api_client(engine) as client:
        refused = await client.post(url, json={"from": 3, "to": 4, "map": {"nope": "gone"}})
        assert refused.status_code == 422
        body = refused.json()
        assert body["error"] == "migration_refused"
        assert body["problems"] == [
            "map nope:gone: version 3 has no step 'nope'",
            "map nope:gone: version 4 has no step 'gone'",
            "step 'reply' of version 3 is reachable (an unfinished run is at it or can enter "
            "it) and version 4 has no such step: map it (--map old:new) or give a removed-step "
            "policy",
        ]
        unknown = await client.post(url, json={"from": 3, "to": 12})
        assert unknown.status_code == 422
        assert "to version 12 of automation 'mig' is not published" in unknown.json()["detail"]
        same = await client.post(url, json={"from": 4, "to": 4})
        assert same.status_code == 422 and "same version" in same.json()["detail"]
        bad_policy = await client.post(
            url, json={"from": 3, "to": 4, "removed_step_policy": "explode"}
        )
        assert bad_policy.status_code == 422 and bad_policy.json()["error"] == "invalid_request"

        dry = await client.post(
            url,
            json={"from": 3, "to": 4, "removed_step_policy": "skip-to:finish", "dry_run": True},
        )
        assert dry.status_code == 200
        assert dry.json()["outcomes"] == {"moved": 3} and len(dry.json()["plan"]) == 3
        assert versions(sql, runs) == [3, 3, 3]

        began = await client.post(
            url, json={"from": 3, "to": 4, "removed_step_policy": "park", "by": "api-test"}
        )
        assert began.status_code == 202
        op_id = began.json()["operation_id"]

        async def done() -> dict[str, Any] | None:
            view = (await client.get(f"/v1/operations/{op_id}")).json()
            return view if view["status"] == "done" else None

        view = await eventually(done, timeout=20, what="the migration to finish")
        assert view["outcomes"] == {"moved": 3} and view["done"] == 3 and view["pass"] == 1
        assert versions(sql, runs) == [4, 4, 4]
        missing = await client.get("/v1/operations/op_0123")
        assert missing.status_code == 404 and missing.json()["error"] == "unknown_operation"
