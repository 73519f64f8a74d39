"""Structured logs (issue 15, B5) from a real ``onward worker`` process: with stderr not a
terminal every line is one JSON object; the lines written while a step runs -- the engine's
own, and a step kind's through ``logging`` or structlog -- carry org, run, step, seq, attempt
and worker; levels are set per component; a field named like a credential is redacted.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog

from onward import logs
from onward.errors import ConfigError
from onward.testing import Processes, eventually_sync, run_onward, run_row

SHOUT_APP = """
import logging

import structlog

import onward

log = logging.getLogger("shout_app")
slog = structlog.get_logger("shout_app")


@onward.step_kind("shout.say", lane="fast")
async def say(step: onward.StepContext) -> dict:
    log.info("saying %s", step.input["word"])
    slog.info("said", word=step.input["word"], api_token="tok_never_logged")
    return {"said": step.input["word"]}


flow = onward.Automation("shout").step("say", "shout.say").step("again", "shout.say")
"""


def ok(done: Any) -> str:
    assert done.returncode == 0, done.stderr
    return str(done.stdout)


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = [line for line in text.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


def test_a_workers_step_lines_are_json_with_org_run_step_attempt_and_worker(
    db_url: str, tmp_path: Path, processes: Processes, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    (tmp_path / "shout_app.py").write_text(SHOUT_APP)
    app = ("--app", "shout_app:flow")
    ok(run_onward(db_url, *app, "publish", cwd=tmp_path))
    started = ok(
        run_onward(
            db_url, *app, "start", "shout", "--payload", '{"word": "hey"}', "--json", cwd=tmp_path
        )
    )
    run_id = json.loads(started)["run_id"]

    worker = processes.onward(
        db_url,
        *app,
        "worker",
        "--lanes",
        "fast=4",
        "--log-levels",
        "onward.worker=debug,shout_app=info",
        cwd=tmp_path,
        log_level="warning",  # everything else: warnings only
    )
    eventually_sync(
        lambda: run_row(sql, run_id)["status"] == "completed", timeout=30, what="the run"
    )
    assert worker.stop() == 0, worker.log_text()

    text = worker.log_text()
    lines = json_lines(text)  # every line is JSON: nothing bypassed the renderer
    assert "tok_never_logged" not in text
    mine = [line for line in lines if line.get("run_id") == run_id]
    by_logger: dict[str, list[dict[str, Any]]] = {}
    for line in mine:
        by_logger.setdefault(line["logger"], []).append(line)
    said = [line for line in by_logger["shout_app"] if line["event"] == "said"]
    saying = [line for line in by_logger["shout_app"] if line["event"] == "saying hey"]
    running = by_logger["onward.worker"]
    assert len(said) == len(saying) == 2  # two steps, each logged once each way
    assert {line["level"] for line in running} == {"debug"}
    assert sorted(line["event"] for line in running) == [
        "step again (shout.say) running",
        "step say (shout.say) running",
    ]
    workers = {line["worker"] for line in mine}
    assert len(workers) == 1 and workers != {None}
    for line in mine:
        assert line["org_id"] == "default"
        assert line["attempt"] == 1
        assert line["step_id"] in ("say", "again")
        assert line["seq"] == (1 if line["step_id"] == "say" else 2)
        assert line["timestamp"]
    assert said[0]["api_token"] == "[redacted]" and said[0]["word"] == "hey"
    # the root level is warning: no info line of any other component
    assert not [line for line in lines if line["level"] == "info" and line["logger"] != "shout_app"]


def test_stdlib_and_structlog_lines_share_one_renderer_outside_a_step() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    before = (root.level, list(root.handlers))
    try:
        logs.configure("info", "onward.demo=warning", stream=stream, fmt="json", force=True)
        logging.getLogger("onward.sweep").info("swept %d", 3)
        logging.getLogger("onward.demo").info("hidden: its component is at warning")
        structlog.get_logger("onward.test").warning("careful", password="hunter2")
    finally:
        logs.configure("info", {}, stream=io.StringIO(), force=True)  # drop the test's handler
        for handler in list(root.handlers):
            if handler not in before[1]:
                root.removeHandler(handler)
        root.setLevel(before[0])
        logging.getLogger("onward.demo").setLevel(logging.NOTSET)
    swept, careful = json_lines(stream.getvalue())
    assert (swept["event"], swept["logger"], swept["level"]) == ("swept 3", "onward.sweep", "info")
    assert (careful["event"], careful["level"], careful["password"]) == (
        "careful",
        "warning",
        "[redacted]",
    )
    assert "run_id" not in swept


@pytest.mark.parametrize(
    ("level", "levels"),
    [("loud", None), ("info", "onward.worker"), ("info", "onward.worker=chatty")],
)
def test_a_bad_level_is_refused_with_one_line(level: str, levels: str | None) -> None:
    with pytest.raises(ConfigError):
        logs.configure(level, levels, stream=io.StringIO())


def test_the_cli_refuses_a_bad_log_level_with_one_line_and_exit_2(db_url: str) -> None:
    done = run_onward(db_url, "--log-levels", "onward.worker=shout", "runs")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "onward: ONWARD_LOG_LEVELS onward.worker: 'shout': choose one of debug, info, "
        "warning, error, critical"
    ]
