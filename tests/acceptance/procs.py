"""The acceptance tests' worker processes: ``python -m onward.testing.worker`` (see
:mod:`onward.testing.worker`) with the timings these tests use and the test kinds
(:mod:`onward.testing.kinds`, ``test.sleep``) loaded.

``spawn_worker(database_url, worker_id, log_dir=, clock_offset=, **options)`` keeps the
signature other tests still import (tests/integration/test_leases.py); new tests use the
``spawn`` fixture (tests/acceptance/conftest.py) or ``onward.testing`` directly.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onward.config import Settings
from onward.testing.kinds import SLEEP_KIND, register_kinds
from onward.testing.processes import Process, process_env
from onward.testing.worker import worker_argv

KINDS = ("onward.testing.kinds",)
# option -> Settings field, and the processes' defaults
TIMINGS = {
    "lease": ("lease_seconds", 3.0),
    "heartbeat": ("heartbeat_seconds", 0.5),
    "grace": ("shutdown_grace_seconds", 1.0),
    "poll": ("poll_seconds", 0.2),
    "sweep": ("sweep_seconds", 0.2),
    "queue": ("queue", "postgres"),
    "org": ("org_id", "test"),
}


def worker_settings(database_url: str, **timings: Any) -> Settings:
    """The settings of an acceptance worker process: ``lease=2`` -> ``lease_seconds=2``."""
    values = {field: timings.pop(name, default) for name, (field, default) in TIMINGS.items()}
    if timings:
        raise TypeError(f"unknown timings: {sorted(timings)}")
    return Settings(database_url=database_url, **values)


@dataclass
class WorkerProcess(Process):
    """A :class:`~onward.testing.Process`; ``proc`` and ``worker_id`` as older tests call them."""

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.popen

    @property
    def worker_id(self) -> str:
        return self.name


def spawn_worker(
    database_url: str,
    worker_id: str,
    *,
    log_dir: str | Path | None = None,
    clock_offset: str | None = None,
    crash_at: str | None = None,
    **options: Any,
) -> WorkerProcess:
    """Start one acceptance worker process. ``options``: the timings above (``grace=1``) and
    the worker's own (``sweeper=True``, ``relay=False``, ``lanes="io=4"``)."""
    timings = {k: options.pop(k) for k in list(options) if k in TIMINGS}
    settings = worker_settings(database_url, **timings)
    return WorkerProcess.start(
        worker_argv(settings, worker_id, kinds=KINDS, **options),
        name=worker_id,
        log_path=Path(log_dir or tempfile.gettempdir()) / f"{worker_id}.log",
        env=process_env(crash_at=crash_at, clock_offset=clock_offset),
    )


__all__ = [
    "KINDS",
    "SLEEP_KIND",
    "WorkerProcess",
    "register_kinds",
    "spawn_worker",
    "worker_settings",
]
