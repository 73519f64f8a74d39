"""Migrations: several processes migrating one empty database at once (advisory lock)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from onward.db.migrate import available, verify
from onward.testing import Processes, TemporaryDatabases, with_database
from tests.conftest import ADMIN_URL


@pytest.fixture
def empty_db(databases: TemporaryDatabases) -> Iterator[str]:
    name = "onward_empty_migrate"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    yield with_database(ADMIN_URL, name)
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_five_processes_migrating_at_once_apply_each_migration_once(
    empty_db: str, processes: Processes
) -> None:
    procs = [processes.onward(empty_db, "migrate", name=f"migrate-{i}") for i in range(5)]
    results = [(p.wait(timeout=120), p.log_text()) for p in procs]
    assert all(rc == 0 for rc, _log in results), results
    with psycopg.connect(empty_db) as conn:
        rows = conn.execute("SELECT version FROM onward_migrations ORDER BY version").fetchall()
    assert [r[0] for r in rows] == [m.version for m in available()]
    assert verify(empty_db) == []
