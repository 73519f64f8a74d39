"""``onward demo`` on the embedded PostgreSQL (a temporary ``ONWARD_DATA_DIR``, never the shared
one): without ``--keep`` it stops the server it started and no PostgreSQL process of that
folder is left (a /proc scan); with ``--keep`` the server runs on, ``onward status`` shows it
answering, and ``onward stop`` stops it; a server that ran before the demo is left running."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from onward.db.embedded import server_info, server_processes, stop_server

pytestmark = pytest.mark.timeout(300)


def onward(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONWARD_")}
    env["ONWARD_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-m", "onward.cli", *args],
        env=env,
        cwd=data_dir.parent,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # under /tmp, not pytest's root-only tmp_path: run as root, the server runs as the wheel's
    # system user, who must reach the folder (the wheel opens its parents for it)
    base = Path(tempfile.mkdtemp(prefix="onward-demo-", dir="/tmp"))
    yield base / "data"
    if server_processes(str(base / "data")):
        stop_server(str(base / "data"))
    shutil.rmtree(base, ignore_errors=True)


def test_the_demo_stops_the_server_it_started(data_dir: Path) -> None:
    done = onward(data_dir, "demo")
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"stopped the embedded PostgreSQL in {data_dir} (pid ")
    assert last.endswith("which the demo started; nothing left running")
    assert (data_dir / "pgdata" / "PG_VERSION").is_file()  # it did run on the embedded server
    assert server_processes(str(data_dir)) == []
    assert server_info(str(data_dir)) is None  # stopped cleanly: no postmaster.pid


def test_keep_leaves_it_running_and_onward_stop_stops_it(data_dir: Path) -> None:
    done = onward(data_dir, "demo", "--keep")
    assert done.returncode == 0, done.stdout + done.stderr
    info = server_info(str(data_dir))
    assert info is not None and info.running
    assert done.stdout.strip().splitlines()[-1] == (
        f"left running (--keep): the embedded PostgreSQL in {data_dir} (pid {info.pid}); "
        f"`onward --data-dir {data_dir} stop` stops it"
    )

    status = onward(data_dir, "status", "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["embedded"]["pid"] == info.pid and shown["embedded"]["answers"] is True
    assert shown["database"]["answers"] is True
    assert [lead["name"] for lead in shown["leaders"]] == ["sweeper"]  # the demo's, lapsed
    assert shown["queue"]["kind"] == "postgres"

    # a server that ran before the demo is left as it was
    again = onward(data_dir, "demo")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.strip().splitlines()[-1].startswith("left running: ")
    assert "as it was before the demo" in again.stdout
    assert server_info(str(data_dir)).running  # type: ignore[union-attr]

    stopped = onward(data_dir, "stop")
    assert stopped.stdout.strip() == f"stopped the embedded PostgreSQL in {data_dir}"
    assert server_processes(str(data_dir)) == []
    assert onward(data_dir, "stop").stdout.strip() == f"no embedded PostgreSQL runs in {data_dir}"
    hidden = onward(data_dir, "stop-embedded")  # the old name still works
    assert hidden.returncode == 0 and "no embedded PostgreSQL runs" in hidden.stdout

    status = onward(data_dir, "status")
    assert status.returncode == 0
    assert status.stdout.startswith(f"embedded PostgreSQL: not running ({data_dir})")
