"""The README's Quickstart, run as written: every ``$ `` line of its ``sh quickstart`` blocks, in
order, in a temporary folder, as an ordinary user (``onward-qs``, made if missing, when the test
runs as root: the embedded PostgreSQL refuses root, and a newcomer is no root), in a fresh
virtualenv that the first line installs the package into (a copy of this checkout at
``./onward``; pip reads the machine's own index). Every output line the README shows without
``...`` must be printed by the real command. The test ends as the README does, with ``onward
stop``, and then no PostgreSQL process of that folder may be left."""

from __future__ import annotations

import functools
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from onward.db.embedded import server_processes, stop_server
from onward.testing import Processes, eventually_sync

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
USER = "onward-qs"
FENCE = re.compile(r"^```sh quickstart\n(.*?)^```", re.MULTILINE | re.DOTALL)
LONG_RUNNING = "onward up"
CWD_MARK = "@@cwd="

pytestmark = pytest.mark.timeout(600)


def quickstart() -> list[tuple[str, list[str]]]:
    """``(command, the output lines the README shows for it)`` for every ``$ `` line."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Quickstart\n")
    section = text[start : text.index("\n## ", start + 1)]
    steps: list[tuple[str, list[str]]] = []
    for block in FENCE.findall(section):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
    return steps


def system_python() -> str:
    """A Python an ordinary user may run (this test's may live under /root)."""
    for candidate in ("/usr/local/bin/python3", "/usr/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


class User:
    """Runs command lines with bash as the ordinary user, in a clean environment."""

    def __init__(self, base: Path) -> None:
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(USER)
            except KeyError:
                subprocess.run(["useradd", "-m", USER], check=True)
            entry = pwd.getpwnam(USER)
            self.prefix = [
                "setpriv",
                f"--reuid={entry.pw_uid}",
                f"--regid={entry.pw_gid}",
                "--init-groups",
                "--",
            ]
            self.uid, self.gid, home = entry.pw_uid, entry.pw_gid, entry.pw_dir
        else:
            self.prefix, self.uid, self.gid = [], os.getuid(), os.getgid()
            home = os.environ.get("HOME", str(base))
        venv = base / "venv"
        pip = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
        self.env = {
            **pip,
            "HOME": home,
            "LANG": "C.UTF-8",
            "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
            "VIRTUAL_ENV": str(venv),
        }

    def argv(self, line: str) -> list[str]:
        env = [f"{k}={v}" for k, v in self.env.items()]
        return [*self.prefix, "env", "-i", *env, "bash", "-c", line]

    def run(self, line: str, cwd: Path) -> tuple[str, Path]:
        """Run ``line`` in ``cwd``; its output, and the folder it ended in (``cd``)."""
        done = subprocess.run(
            self.argv(f'set -e\n{line}\necho "{CWD_MARK}$PWD"'),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"$ {line}\n{output}"
        assert "Traceback" not in output, f"$ {line}\n{output}"
        where = re.search(rf"^{CWD_MARK}(.*)$", done.stdout, re.MULTILINE)
        assert where is not None, output
        return output.replace(where.group(0) + "\n", ""), Path(where.group(1))


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A folder under /tmp the user owns, holding a copy of this checkout at ``./onward``."""
    base = Path(tempfile.mkdtemp(prefix="onward-qs-", dir="/tmp"))
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        source = ROOT / name.decode()
        if source.is_file():
            target = base / "onward" / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    try:
        yield base
    finally:
        for data_dir in base.rglob(".onward"):  # a failed test leaves nothing running either
            if server_processes(str(data_dir)):
                stop_server(str(data_dir))
        shutil.rmtree(base, ignore_errors=True)


def chown_all(base: Path, uid: int, gid: int) -> None:
    for path in [base, *base.rglob("*")]:
        os.chown(path, uid, gid, follow_symlinks=False)


#: what differs from one run to the next: run ids, instants, worker ids, pids
VARYING = [
    (re.compile(r"run_[0-9a-f]{24}"), "run_ID"),
    (re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+(Z|[+-]\d\d:\d\d)"), "INSTANT"),
    (re.compile(r"\b[\w.-]+:\d+:[0-9a-f]{4}\b"), "WORKER"),
    (re.compile(r"pid \d+"), "pid N"),
]


def same_shape(text: str) -> str:
    for pattern, replacement in VARYING:
        text = pattern.sub(replacement, text)
    return text


def shown_lines_appear(command: str, shown: list[str], output: str) -> None:
    """Every line the README shows for ``command`` (but those it trims with ``...``) was
    printed, up to run ids, instants, worker ids and pids."""
    printed = same_shape(output)
    for line in shown:
        if "..." not in line and line.strip():
            assert same_shape(line) in printed, (
                f"$ {command}: the README shows {line!r}; it printed:\n{output}"
            )


def completed(user: User, command: str, cwd: Path) -> str | None:
    """``command``'s output once it shows a completed run."""
    output = user.run(command, cwd)[0]
    return output if " completed " in output else None


def test_the_quickstart_runs_as_written(workspace: Path, processes: Processes) -> None:
    steps = quickstart()
    commands = [c for c, _ in steps]
    assert len(commands[: commands.index(LONG_RUNNING) + 1]) == 5, commands  # five commands
    assert commands[-1] == "onward stop", commands
    user = User(workspace)
    chown_all(workspace, user.uid, user.gid)
    user.run(f"{system_python()} -m venv {workspace / 'venv'}", workspace)

    cwd, up = workspace, None
    for command, shown in steps:
        if command == LONG_RUNNING:
            up = processes.start(user.argv(f"exec {command}"), "up", cwd=cwd)
            up.wait_for(r"worker, relay, sweeper running", timeout=120)
            output = up.log_text()
        elif command == "onward runs":  # while `onward up` runs the run to its end
            output = eventually_sync(
                functools.partial(completed, user, command, cwd),
                timeout=90,
                interval=1.0,
                what="onward runs to show the run completed",
            )
        else:
            if command == "onward stop" and up is not None:
                up.signal(signal.SIGINT)  # Ctrl-C in the first terminal
                assert up.wait() == 0, up.tail(3000)
            output, cwd = user.run(command, cwd)
        shown_lines_appear(command, shown, output)

    assert "stopped the embedded PostgreSQL in .onward" in output
    data_dir = cwd / ".onward"
    assert (data_dir / "pgdata").is_dir(), "the quickstart ran on the embedded PostgreSQL"
    assert server_processes(str(data_dir)) == [], "a PostgreSQL of the quickstart still runs"
    notes = (cwd / "notebook.jsonl").read_text(encoding="utf-8")
    assert '"text": "Hello Maya, welcome aboard!"' in notes
