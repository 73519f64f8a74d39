"""Shared fixtures: a real PostgreSQL (a fresh database per test, cloned from a migrated
template), real Redis, real processes (``processes``: reaped at teardown, their logs printed)
and the real provider sandbox (``sandbox``, one server per test module; ``admin`` resets it).
Nothing here mocks the database, the queue or a process."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
from psycopg.rows import dict_row

from onward.config import Settings
from onward.engine import Engine
from onward.testing import Processes, TemporaryDatabases

if TYPE_CHECKING:
    from onward.sandbox import SandboxAdmin, SandboxServer

ADMIN_URL = os.environ.get("ONWARD_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ONWARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
#: The sandbox serves on loopback, which the outbound check (onward.outbound) refuses unless
#: the allow-list names it: every test engine and worker allows it.
SANDBOX_ALLOW = ("127.0.0.1/32",)


@pytest.fixture(scope="session")
def databases() -> Iterator[TemporaryDatabases]:
    dbs = TemporaryDatabases(ADMIN_URL, tag=f"{os.getpid()}", ahead=2)
    dbs.prepare_template()
    yield dbs
    dbs.drop_template()  # every database it made, then the template


@pytest.fixture
def db_url(databases: TemporaryDatabases) -> Iterator[str]:
    url = databases.create()
    yield url
    databases.drop(url)


@pytest.fixture
def settings(db_url: str) -> Settings:
    """Fast timings for tests; each test may ``dataclasses.replace`` what it needs."""
    return Settings(
        database_url=db_url,
        org_id="test",
        lease_seconds=3.0,
        heartbeat_seconds=0.5,
        poll_seconds=0.2,
        sweep_seconds=0.2,
        shutdown_grace_seconds=2.0,
        queue="postgres",
        outbound_allow=SANDBOX_ALLOW,
    )


@pytest.fixture
async def engine(settings: Settings) -> AsyncIterator[Engine]:
    async with Engine.open(settings, migrate=False) as eng:
        yield eng


@pytest.fixture
def sql(db_url: str) -> Iterator[psycopg.Connection]:
    """A plain synchronous connection for assertions on the rows themselves."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


@pytest.fixture
def processes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Processes]:
    """The processes a test starts (``processes.worker(settings, name, ...)``,
    ``processes.start(argv, name)``, ``processes.onward(db_url, "up", ...)``): every one is
    reaped at teardown (SIGKILL by its own pid if still running) and its log printed then,
    which pytest shows when the test failed. A test or module marked
    ``pytest.mark.processes(log_chars=6000)`` passes those options to ``Processes``."""
    marker = request.node.get_closest_marker("processes")
    options = dict(marker.kwargs) if marker is not None else {}
    with Processes(tmp_path / "logs", **options) as group:
        yield group


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxServer]:
    """The provider sandbox, served over real HTTP: one server per test module."""
    from onward.sandbox import SandboxServer

    with SandboxServer() as server:
        yield server


@pytest.fixture
def admin(sandbox: SandboxServer) -> SandboxAdmin:
    """The sandbox's admin, reset: no faults, no revocations, an empty ledger. A module whose
    every test needs a clean sandbox says ``pytestmark = pytest.mark.usefixtures("admin")``."""
    sandbox.admin.reset()
    return sandbox.admin
