"""Acceptance fixtures: real onward processes (``python -m onward.testing.worker``, see
``procs.py``) against the test's database.

Every process a test starts is reaped at teardown (SIGKILL by its own pid if still running),
and its log is printed then: pytest shows it when the test failed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from onward.testing import Process, Processes
from onward.testing.kinds import register_kinds
from tests.acceptance.procs import spawn_worker

register_kinds()  # the in-test workers must know the kinds the processes run

Spawn = Callable[..., Process]


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    with Processes(tmp_path / "logs") as group:
        yield group


@pytest.fixture
def spawn(db_url: str, processes: Processes) -> Spawn:
    """``spawn(name, crash_at=, clock_offset=, lease=, grace=, sweeper=, ...)``: a worker
    process on the test's database (see ``procs.spawn_worker``), reaped at teardown."""

    def _spawn(name: str, **options: Any) -> Process:
        proc = spawn_worker(db_url, name, log_dir=processes.log_dir, **options)
        processes.started.append(proc)
        return proc

    return _spawn
