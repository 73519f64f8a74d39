"""Acceptance fixtures: real worker processes (``procs.py``) against the test's database.

Every process a test starts is reaped at teardown (SIGKILL by its own pid if still running),
and its log is printed when the test fails, so a failure shows what the process did."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.procs import WorkerProcess, register_kinds, spawn_worker

# the in-test workers must know the kinds the processes run
register_kinds()

Spawn = Callable[..., WorkerProcess]


@pytest.fixture
def spawn(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Spawn]:
    started: list[WorkerProcess] = []

    def _spawn(worker_id: str, **options: Any) -> WorkerProcess:
        wp = spawn_worker(db_url, worker_id, log_dir=tmp_path, **options)
        started.append(wp)
        return wp

    yield _spawn
    for wp in started:
        wp.close()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for wp in started:
            print(f"--- log of worker process {wp.worker_id} (pid {wp.pid}) ---")
            print(wp.log_text())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep
