"""The ``onward`` command (B3), run as a real subprocess against the per-test database."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from onward.testing import Process, Processes, auth, eventually_sync, run_onward, run_row

GREET_YAML = """\
id: greet
steps:
  - id: hello
    kind: set
    with: {values: {greeting: "'hi ' + input.name"}}
"""
INVALID_YAML = """\
id: broken
steps:
  - id: a
    kind: no_such_kind
    next: nowhere
  - id: b
    kind: set
    with: {values: {x: "vars.x +"}}
"""


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture
def greet_file(tmp_path: Path) -> Path:
    path = tmp_path / "greet.yaml"
    path.write_text(GREET_YAML)
    return path


def test_migrate_status_json_and_verify(db_url: str) -> None:
    rows = json.loads(ok(run_onward(db_url, "migrate", "--status", "--json")))
    assert rows and rows[0]["version"] == 1 and rows[0]["name"] == "core"
    assert all(r["applied"] and r["checksum_ok"] for r in rows)
    assert set(rows[0]) == {"version", "name", "applied", "checksum_ok"}
    assert "nothing to apply" in ok(run_onward(db_url, "migrate"))
    assert "ok:" in ok(run_onward(db_url, "migrate", "--verify"))


def test_migrate_verify_fails_on_an_empty_database(
    db_url: str, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    sql.execute("DROP TABLE onward_migrations")
    result = run_onward(db_url, "migrate", "--verify")
    assert result.returncode == 1
    assert "migration 0001_core is not applied" in result.stderr
    assert "Traceback" not in result.stderr


def test_publish_prints_the_version_then_unchanged(db_url: str, greet_file: Path) -> None:
    assert ok(run_onward(db_url, "publish", str(greet_file))).strip() == "published greet version 1"
    assert ok(run_onward(db_url, "publish", str(greet_file))).strip() == "greet version 1 unchanged"
    as_json = json.loads(ok(run_onward(db_url, "publish", str(greet_file), "--json")))
    assert as_json["version"] == 1 and as_json["created"] is False


def test_publish_invalid_file_exits_2_with_every_problem(
    db_url: str, tmp_path: Path, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text(INVALID_YAML)
    result = run_onward(db_url, "publish", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert any("unknown step kind 'no_such_kind'" in line for line in lines)
    assert any("bad CEL" in line for line in lines)
    assert any("unknown step 'nowhere'" in line for line in lines)
    assert all(line.startswith("onward: invalid automation: ") for line in lines), lines
    assert "Traceback" not in result.stderr
    missing = run_onward(db_url, "publish", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    assert sql.execute("SELECT count(*) AS n FROM automation_versions").fetchone() == {"n": 0}


def test_start_twice_is_a_duplicate_then_runs_and_show(db_url: str, greet_file: Path) -> None:
    ok(run_onward(db_url, "publish", str(greet_file)))
    payload = '{"name": "Maya"}'
    first = ok(run_onward(db_url, "start", "greet", "--payload", payload, "--event-id", "evt_1"))
    match = re.search(r"started (run_\w+)", first)
    assert match, first
    run_id = match.group(1)
    second = run_onward(
        db_url, "start", "greet", "--payload", payload, "--event-id", "evt_1", "--json"
    )
    answer = json.loads(ok(second))
    assert answer == {
        "run_id": run_id,
        "created": False,
        "duplicate": True,
        "start_key": "greet:evt_1",
        "start_key_kind": "event",
    }
    assert f"duplicate: {run_id}" in ok(
        run_onward(db_url, "start", "greet", "-p", payload, "--event-id", "evt_1")
    )

    listed = json.loads(ok(run_onward(db_url, "runs", "--json")))
    assert [r["run_id"] for r in listed] == [run_id]
    assert set(listed[0]) >= {"run_id", "automation_id", "version", "status", "created_at"}
    assert re.match(r"\d{4}-\d\d-\d\dT", listed[0]["created_at"])  # ISO datetimes
    assert json.loads(ok(run_onward(db_url, "runs", "--json", "--status", "completed"))) == []
    assert run_id in ok(run_onward(db_url, "runs", "--automation", "greet"))

    timeline = ok(run_onward(db_url, "show", run_id))
    assert timeline.startswith(f"run {run_id}  greet v1")
    assert "run_started" in timeline and "start_duplicate" in timeline
    view = json.loads(ok(run_onward(db_url, "show", run_id, "--json")))
    assert view["run"]["run_id"] == run_id and view["run"]["input"] == {"name": "Maya"}
    assert [e["event"] for e in view["history"]][:2] == ["run_started", "step_ready"]
    assert view["steps"][0]["step_id"] == "hello"


def test_payload_from_a_file_and_the_hash_fallback(
    db_url: str, greet_file: Path, tmp_path: Path
) -> None:
    ok(run_onward(db_url, "publish", str(greet_file)))
    payload = tmp_path / "maya.json"
    payload.write_text('{"name": "Maya"}')
    first = json.loads(
        ok(run_onward(db_url, "start", "greet", "--payload", f"@{payload}", "--json"))
    )
    again = json.loads(
        ok(run_onward(db_url, "start", "greet", "--payload", f"@{payload}", "--json"))
    )
    assert first["start_key_kind"] == "payload_hash" and first["created"]
    assert again["run_id"] == first["run_id"] and again["duplicate"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "run_nope"], "unknown run 'run_nope'"),
        (["start", "nope"], "no published automation 'nope'"),
        (["start", "greet", "--payload", "{bad"], "--payload: not valid JSON"),
        (["start", "greet", "--payload", "[1]"], "must be a JSON object"),
        (["--queue", "carrier-pigeon", "runs"], "ONWARD_QUEUE='carrier-pigeon'"),
        (["worker", "--lanes", "fast=lots"], "--lanes: fast='lots'"),
    ],
)
def test_errors_are_one_line_and_exit_2(db_url: str, args: list[str], message: str) -> None:
    result = run_onward(db_url, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.startswith("onward: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_payload_too_large_exits_2(db_url: str, greet_file: Path) -> None:
    ok(run_onward(db_url, "publish", str(greet_file)))
    payload = json.dumps({"name": "x" * 300})
    result = run_onward(
        db_url, "start", "greet", "--payload", payload, env={"ONWARD_MAX_PAYLOAD_BYTES": "100"}
    )
    assert result.returncode == 2
    assert "exceeds the limit of 100 bytes" in result.stderr


def test_demo_finishes_with_a_completed_run_and_the_duplicate_in_its_timeline(db_url: str) -> None:
    result = run_onward(db_url, "demo", timeout=90)
    out = ok(result)
    assert re.search(r"delivery 1: .* -> 202 created", out), out
    assert re.search(r"delivery 2: .* -> 200 duplicate", out), out
    run_ids = re.findall(r'"run_id": "(run_\w+)"', out)
    assert len(run_ids) == 2 and run_ids[0] == run_ids[1]
    assert f"run {run_ids[0]}  demo-follow-up v1  status=completed" in out
    # the reference scenario: the 09:00 wait skipped, Sam's click, Maya's reply by email
    assert "start_duplicate" in out and "timer_moved" in out and "timer_fired" in out
    assert re.search(r"U_SAM clicks Approve .* -> 200 .*'outcome': 'approved'", out), out
    assert "approval_requested" in out and "approval_decided" in out
    assert re.search(r"Maya replies .* -> \[202, 200\]", out), out
    assert "signal_consumed" in out
    assert "result: replied: Yes, Thursday works for me." in out
    assert "run completed" in out


def serve(
    processes: Processes,
    db_url: str,
    command: str,
    *args: str,
    app: str | None = None,
    cwd: Path | None = None,
) -> Process:
    """A long-running ``onward [--app APP] COMMAND ARGS`` (``up``, ``api``, ``worker``) in the
    test's group, logging at info, with a 2 s shutdown grace."""
    argv = ["--app", app, command, *args] if app else [command, *args]
    env = {"ONWARD_SHUTDOWN_GRACE_SECONDS": "2"}
    return processes.onward(db_url, *argv, name=command, env=env, cwd=cwd)


def api_url(proc: Process) -> str:
    """Wait until the process serves its API; its URL."""
    return proc.wait_for(r"API on (http://\S+)").group(1)


def cli_key(db_url: str, *args: str, cwd: Path | None = None) -> str:
    """A new admin API key made by ``onward [ARGS] keys create`` (``ARGS``: ``--org``, ``--app``
    as the API's own command line has them, so the key is of the API's organisation)."""
    made = ok(
        run_onward(db_url, *args, "keys", "create", "test", "--scope", "admin", "--json", cwd=cwd)
    )
    key: str = json.loads(made)["key"]
    return key


def deliver_and_complete(
    url: str,
    key: str,
    automation: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> str:
    """POST a webhook to the API at ``url`` with the API key ``key``, expect a new run, wait
    until it completes."""
    with httpx.Client(base_url=url, timeout=10, headers=auth(key)) as client:
        reply = client.post(f"/v1/hooks/{automation}", json=body, headers=headers or {})
        assert reply.status_code == 202, reply.text
        run_id: str = reply.json()["run_id"]
        eventually_sync(
            lambda: client.get(f"/v1/runs/{run_id}").json()["run"]["status"] == "completed",
            timeout=30,
            what="the run to complete",
        )
    return run_id


def test_up_serves_webhooks_and_stops_gracefully_on_sigterm(
    db_url: str, greet_file: Path, processes: Processes
) -> None:
    ok(run_onward(db_url, "publish", str(greet_file)))
    up = serve(processes, db_url, "up", "--port", "0")
    key = cli_key(db_url)
    deliver_and_complete(api_url(up), key, "greet", {"name": "Maya"}, {"X-Event-Id": "e"})
    assert up.stop() == 0, up.log_text()
    assert up.find(r"SIGTERM: shutting down gracefully")
    # structured logs (onward.logs): stderr is not a terminal, so one JSON object a line
    assert up.find(r'^\{"event": "stopped", .*"logger": "onward\.cli"')
    assert not up.find("Traceback")


def test_worker_runs_steps_and_stops_gracefully_on_sigterm(
    db_url: str, greet_file: Path, processes: Processes, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    ok(run_onward(db_url, "publish", str(greet_file)))
    started = json.loads(
        ok(run_onward(db_url, "start", "greet", "--payload", '{"name": "Sam"}', "--json"))
    )
    worker = serve(processes, db_url, "worker", "--lanes", "fast=8,wait=8")
    eventually_sync(
        lambda: run_row(sql, started["run_id"])["status"] == "completed",
        timeout=30,
        what="the worker to complete the run",
    )
    assert worker.stop() == 0, worker.log_text()
    assert worker.find(r"worker, relay, sweeper running")
    assert worker.find(r"SIGTERM: shutting down gracefully")
    assert not worker.find("Traceback")


def count_runs(sql: psycopg.Connection[dict[str, Any]]) -> int:
    row = sql.execute("SELECT count(*) AS n FROM runs").fetchone()
    assert row is not None
    return int(row["n"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--event-id", "e" * 257], "--event-id: String should have at most 256 characters"),
        (["--key", "k" * 513], "--key: String should have at most 512 characters"),
        (["--event-id", "evt_\udcff"], "--event-id: not valid UTF-8 text"),
    ],
)
def test_start_caps_ids_as_the_api_does(
    db_url: str,
    greet_file: Path,
    sql: psycopg.Connection[dict[str, Any]],
    args: list[str],
    message: str,
) -> None:
    ok(run_onward(db_url, "publish", str(greet_file)))
    result = run_onward(db_url, "start", "greet", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"onward: {message}\n"
    assert count_runs(sql) == 0
    ok(run_onward(db_url, "start", "greet", "--event-id", "e" * 256))  # the limit itself is fine
    assert count_runs(sql) == 1


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("[" * 50_000, "--payload: nested deeper than"),
        ('{"a": "x\\u0000y"}', "--payload: $.a: \\u0000 (NUL) cannot be stored"),
        ('{"a": ["\\ud800"]}', "--payload: $.a[0]: a lone surrogate (\\ud800)"),
        ('{"a": NaN}', "--payload: $.a: NaN is not a number"),
        ('{"a": 1e400}', "--payload: $.a: 1e400 is not a number"),
        ('{"a\\u0000": 1}', "--payload: "),
    ],
)
def test_start_refuses_a_hostile_payload_and_stores_nothing(
    db_url: str,
    greet_file: Path,
    sql: psycopg.Connection[dict[str, Any]],
    payload: str,
    message: str,
) -> None:
    ok(run_onward(db_url, "publish", str(greet_file)))
    result = run_onward(db_url, "start", "greet", "--payload", payload)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"onward: {message}"), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert count_runs(sql) == 0


def test_start_refuses_a_payload_file_that_is_not_utf8(
    db_url: str, greet_file: Path, tmp_path: Path, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    ok(run_onward(db_url, "publish", str(greet_file)))
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{"name": "Zoë"}'.encode("latin-1"))
    result = run_onward(db_url, "start", "greet", "--payload", f"@{latin1}")
    assert result.returncode == 2
    assert result.stderr == f"onward: {latin1}: not UTF-8 (invalid byte at offset 12)\n"
    assert count_runs(sql) == 0


def test_chaos_json_prints_only_json_on_stdout(db_url: str) -> None:
    result = run_onward(db_url, "chaos", "--runs", "1", "--kills", "0", "--json", timeout=240)
    report = json.loads(ok(result))  # the whole of stdout is one JSON document
    assert report["runs"] == 1 and report["started"] == 1
    assert "onward chaos: 1 runs" in result.stderr  # progress went to stderr


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, n in zip("abcdefg", "bcdefgh", strict=True)
)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("latin1.yaml", "id: café\nsteps: []\n".encode("latin-1")),
        ("deep.yaml", ("[" * 20_000 + "]" * 20_000).encode()),
        ("deep.json", ('{"id": "x", "steps": ' + "[" * 20_000 + "]" * 20_000 + "}").encode()),
        ("bomb.yaml", ALIAS_BOMB.encode()),
        ("nul.json", b'{"id": "x\\u0000", "steps": []}'),
    ],
)
def test_publish_a_hostile_file_is_one_line_and_stores_nothing(
    db_url: str,
    tmp_path: Path,
    sql: psycopg.Connection[dict[str, Any]],
    name: str,
    content: bytes,
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    result = run_onward(db_url, "publish", str(path))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"onward: invalid automation: {path}: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert sql.execute("SELECT count(*) AS n FROM automation_versions").fetchone() == {"n": 0}
