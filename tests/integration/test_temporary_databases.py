"""``onward.testing.TemporaryDatabases`` with clones made ahead (``ahead=2``), as the suite runs
it: each test gets its own migrated database, a dropped one is gone once the background thread
has run, and ``drop_template`` leaves no database behind -- the clones never handed out
included."""

from __future__ import annotations

import os
import secrets

import psycopg

from onward.testing import TemporaryDatabases, eventually_sync

ADMIN_URL = os.environ.get("ONWARD_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _names(prefix: str) -> set[str]:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (prefix + "%",)
        ).fetchall()
    return {r[0] for r in rows}


def test_clones_made_ahead_are_separate_migrated_databases_and_none_is_left_behind() -> None:
    dbs = TemporaryDatabases(ADMIN_URL, tag=f"ahead_{secrets.token_hex(3)}", ahead=2)
    dbs.prepare_template()
    try:
        first, second = dbs.create(), dbs.create()
        assert first != second
        for url in (first, second):
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM onward_migrations").fetchone()
                assert row is not None and row[0] > 0  # the template's schema, migrated
        with psycopg.connect(first, autocommit=True) as conn:
            conn.execute("CREATE TABLE only_here (x int)")
        with psycopg.connect(second, autocommit=True) as conn:
            row = conn.execute("SELECT to_regclass('only_here')").fetchone()
            assert row == (None,)  # a clone of the template, not of the first
        first_name = first.rsplit("/", 1)[1]
        dbs.drop(first)  # dropped by the background thread

        def gone() -> bool:
            return first_name not in _names("onward_t_")

        eventually_sync(gone, timeout=30, what="the dropped clone gone")
    finally:
        made = [*dbs.created]
        dbs.drop_template()
    assert made and not (_names("onward_t_") & set(made))  # the unused clones too
    assert dbs.template not in _names(dbs.template)
