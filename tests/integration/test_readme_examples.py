"""The README's "Using it" examples, copied out of README.md and run as written: the Python
module as a script and through ``--app``, the YAML published with ``--app``, and every line of
the shell block, against the per-test database (``ONWARD_DATABASE_URL``)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from onward.testing import Processes, eventually_sync, run_row, steps

README = Path(__file__).resolve().parents[2] / "README.md"
LONG_RUNNING = {"worker", "up", "api"}
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
FILE_MARK = re.compile(r"^# ([\w.-]+\.(?:py|ya?ml|json))\n")


def readme_section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def readme_files(section: str) -> dict[str, str]:
    """Every fenced block whose first line is ``# NAME.ext``: {NAME.ext: the block}."""
    files = {}
    for _, body in FENCE.findall(section):
        if m := FILE_MARK.match(body):
            files[m.group(1)] = body
    return files


def readme_commands(section: str, mentioning: str) -> list[list[str]]:
    """The lines of the ``sh`` block that mentions ``mentioning``, comments stripped."""
    for lang, body in FENCE.findall(section):
        if lang == "sh" and mentioning in body:
            return [shlex.split(line, comments=True) for line in body.splitlines() if line]
    raise AssertionError(f"no sh block mentioning {mentioning!r} in the README")


def cli_env(db_url: str) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "ONWARD_DATABASE_URL": db_url,
        "ONWARD_POLL_SECONDS": "0.2",
        "ONWARD_SWEEP_SECONDS": "0.2",
        "ONWARD_SHUTDOWN_GRACE_SECONDS": "2",
        "ONWARD_LOG_LEVEL": "warning",
    }


def all_completed(sql: psycopg.Connection[dict[str, Any]], run_ids: list[str]) -> bool:
    return all(run_row(sql, run_id)["status"] == "completed" for run_id in run_ids)


def run_until(
    processes: Processes,
    args: list[str],
    *,
    name: str,
    cwd: Path,
    env: dict[str, str],
    done: Callable[[], bool],
) -> None:
    """Run a long-running command until ``done()``, then SIGTERM it: it must stop cleanly."""
    proc = processes.start(args, name, env=env, cwd=cwd)

    def finished() -> bool:
        assert proc.alive(), f"{shlex.join(args)} exited ({proc.returncode}):\n{proc.tail(3000)}"
        return done()

    eventually_sync(finished, timeout=60, what=f"{shlex.join(args)} to finish its work")
    assert proc.stop() == 0, proc.tail(3000)
    assert not proc.find("Traceback"), proc.tail(3000)


def test_the_using_it_examples_run_as_written(
    db_url: str, tmp_path: Path, sql: psycopg.Connection[dict[str, Any]], processes: Processes
) -> None:
    section = readme_section("Using it")
    files = readme_files(section)
    assert {"welcome_app.py", "welcome.yaml"} <= set(files), sorted(files)
    for name in ("welcome_app.py", "welcome.yaml"):
        (tmp_path / name).write_text(files[name], encoding="utf-8")
    commands = readme_commands(section, "welcome_app")
    env = cli_env(db_url)

    # Without --app the YAML's kind is unknown: the reason the README names the module.
    plain = subprocess.run(
        ["onward", "publish", "welcome.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.returncode == 2
    assert "welcome.yaml: step tag: unknown step kind 'crm.tag'" in plain.stderr

    outputs: list[str] = []
    started: list[str] = []
    for args in commands:
        assert args[0] in ("python", "onward"), args
        subcommand = next((a for a in args[1:] if a in LONG_RUNNING), None)
        if subcommand is None:
            result = subprocess.run(
                args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
            )
            assert result.returncode == 0, f"{shlex.join(args)}\n{result.stdout}{result.stderr}"
            assert "Traceback" not in result.stderr
            outputs.append(result.stdout)
            started += re.findall(r"^started (run_\w+)", result.stdout, re.MULTILINE)
            continue
        # A long-running command: run it until every run started so far has completed.
        run_until(
            processes,
            args,
            name=subcommand,
            cwd=tmp_path,
            env=env,
            done=partial(all_completed, sql, list(started)),
        )

    script, flow, yaml_, start = outputs[:4]
    assert script.strip().splitlines()[-1] == "completed"  # `python welcome_app.py`
    assert flow.strip() == "welcome version 1 unchanged  (welcome_app:flow)"
    assert yaml_.strip() == "welcome version 1 unchanged"  # the YAML is the same automation
    assert len(started) == 1 and start.startswith(f"started {started[0]}")
    rows = sql.execute("SELECT input, status, version FROM runs ORDER BY created_at").fetchall()
    assert [(r["input"]["name"], r["status"], r["version"]) for r in rows] == [
        ("Maya", "completed", 1),
        ("Sam", "completed", 1),
    ]
    tags = steps(sql, started[0], "tag")
    assert [s["output"] for s in tags] == [{"tagged": "sam@example.test"}]
