"""Acceptance fixtures: real onward processes (``python -m onward.testing.worker``, see
``procs.py``) against the test's database, in the test's ``processes`` group
(tests/conftest.py): every one is reaped at teardown and its log printed then."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from onward.testing import Process, Processes
from onward.testing.kinds import register_kinds
from tests.acceptance.procs import KINDS, TIMINGS, worker_settings

register_kinds()  # the in-test workers must know the kinds the processes run

Spawn = Callable[..., Process]


@pytest.fixture
def spawn(db_url: str, processes: Processes) -> Spawn:
    """``spawn(name, crash_at=, clock_offset=, lease=, grace=, sweeper=, ...)``: a worker
    process on the test's database with the test kinds loaded: the timings of
    ``procs.TIMINGS`` (``lease=2``), the rest as :func:`onward.testing.worker.spawn_worker`
    takes them (``sweeper=True``, ``relay=False``, ``lanes="io=4"``)."""

    def _spawn(name: str, **options: Any) -> Process:
        timings = {k: options.pop(k) for k in list(options) if k in TIMINGS}
        return processes.worker(worker_settings(db_url, **timings), name, kinds=KINDS, **options)

    return _spawn
