"""The acceptance tests' worker processes: ``python -m onward.testing.worker`` (see
:mod:`onward.testing.worker`) with the timings these tests use and the test kinds
(:mod:`onward.testing.kinds`, ``test.sleep``) loaded. Started by the ``spawn`` fixture
(tests/acceptance/conftest.py) or by ``processes.worker(worker_settings(...), name)``.
"""

from __future__ import annotations

from typing import Any

from onward.config import Settings

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
    # The sandbox serves on loopback, which outbound HTTP reaches only when allowed.
    return Settings(database_url=database_url, outbound_allow=("127.0.0.1/32",), **values)
