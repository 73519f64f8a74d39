"""``onward init``: each template, generated into a temporary folder, passes its own test with
plain ``pytest`` and runs through the CLI as a user would run it -- publish (which connects
what onward.toml declares), start (or the schedule's trigger), a worker process until the run
completes -- against a real database."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onward.init import TEMPLATES
from onward.testing import Processes, eventually_sync, run_row

BIN = Path(sys.executable).parent


def project_env(db_url: str) -> dict[str, str]:
    """The environment a user's shell would have: the installed ``onward``, the database,
    fast timings; nothing of this test run's own pytest."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ONWARD_"))}
    return {
        **env,
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "ONWARD_DATABASE_URL": db_url,
        "ONWARD_POLL_SECONDS": "0.2",
        "ONWARD_SWEEP_SECONDS": "0.2",
        "ONWARD_SHUTDOWN_GRACE_SECONDS": "2",
        "ONWARD_LOG_LEVEL": "warning",
    }


def onward(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["onward", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_a_generated_project_passes_its_test_and_runs_through_the_cli(
    template: str,
    db_url: str,
    tmp_path: Path,
    sql: psycopg.Connection[dict[str, Any]],
    processes: Processes,
) -> None:
    env = project_env(db_url)
    made = onward(["init", "my-project", "--template", template], tmp_path, env)
    assert made.returncode == 0, made.stderr
    project = tmp_path / "my-project"
    assert sorted(p.name for p in project.iterdir()) == [
        "README.md",
        "my-project.yaml",
        "my_project_app.py",
        "onward.toml",
        "test_my_project.py",
    ]
    title, *lines = (project / "README.md").read_text().splitlines()
    assert title == f"# my-project ({template})" and len([x for x in lines if x]) == 5

    # 1. the project's own test, with plain pytest in its folder
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert re.search(r"^1 passed", tested.stdout, re.MULTILINE), tested.stdout

    # 2. generate, publish, start, complete: the CLI reads the app and connection from onward.toml
    published = onward(["publish"], project, env)
    assert published.returncode == 0, published.stderr
    assert published.stdout.startswith("published my-project version 1"), published.stdout
    assert "connected notebook (notebook, from onward.toml)" in published.stderr
    if template == "schedule":
        started = onward(["schedules", "trigger", "my-project", "daily", "--json"], project, env)
        assert started.returncode == 0, started.stderr
        run_id = json.loads(started.stdout)["run_id"]
    else:
        payload = json.dumps(TEMPLATES[template].payload)
        started = onward(["start", "my-project", "--payload", payload], project, env)
        assert started.returncode == 0, started.stderr
        run_id = re.match(r"started (run_\w+)", started.stdout).group(1)  # type: ignore[union-attr]
    worker = processes.start(["onward", "worker"], "worker", env=env, cwd=project)
    eventually_sync(
        lambda: run_row(sql, run_id)["status"] == "completed",
        timeout=60,
        what=f"{template}'s run to complete in the worker",
    )
    assert worker.stop() == 0, worker.tail(3000)
    assert not worker.find("Traceback"), worker.tail(3000)
    notes = [json.loads(line) for line in (project / "notebook.jsonl").read_text().splitlines()]
    assert [(n["run"], n["text"]) for n in notes] == [(run_id, TEMPLATES[template].expected)]


def test_init_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    refused = onward(["init", str(tmp_path)], tmp_path, project_env("postgresql://unused/x"))
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0  # one line
    assert "is not empty (--force writes the project's files anyway)" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]

    forced = onward(["init", str(tmp_path), "--force"], tmp_path, project_env("postgresql://x/y"))
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    assert (tmp_path / "onward.toml").is_file()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    unknown = onward(
        ["init", "x", "--template", "cron"], elsewhere, project_env("postgresql://x/y")
    )
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "onward: --template: 'cron'; choose one of follow-up, webhook, schedule"
    )
