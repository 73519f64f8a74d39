"""Migrations: several processes migrating one empty database at once (advisory lock)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from onward.db.migrate import LOCK_KEY, apply, available, verify
from onward.testing import Processes, TemporaryDatabases, eventually_sync, with_database
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


def test_a_migration_whose_connection_is_terminated_is_applied_on_a_new_one(empty_db: str) -> None:
    """``onward.db.migrate.apply`` repeats once after a lost connection (``onward chaos``
    terminates connections while processes start): the first connection waits for the lock,
    is terminated there, and the repeat applies every migration, each once."""
    url = empty_db + ("&" if "?" in empty_db else "?") + "application_name=migrate-terminated"
    with psycopg.connect(empty_db, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        with ThreadPoolExecutor(1) as pool:
            applying = pool.submit(apply, url)

            def waiting() -> int | None:
                row = holder.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'migrate-terminated'"
                    " AND wait_event_type = 'Lock'"
                ).fetchone()
                return row[0] if row else None

            pid = eventually_sync(waiting, what="the migration waits for the lock")
            holder.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # gone from the lock's queue: the repeat may already wait there under the same
            # application_name, on a connection of its own (another pid)
            eventually_sync(lambda: waiting() != pid, what="the first connection is gone")
            holder.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
            done = applying.result(timeout=120)
    assert [m.version for m in done] == [m.version for m in available()]
    assert verify(empty_db) == []
