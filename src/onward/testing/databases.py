"""Helpers for testing automations and the engine itself against a real PostgreSQL.

* ``TemporaryDatabases``: a migrated template database, cloned per test (fast: a file copy),
  so each test has its own empty onward schema.
* ``eventually``: wait for a condition by polling, never by a fixed sleep.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from onward.db.migrate import apply

T = TypeVar("T")


def with_database(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


class TemporaryDatabases:
    """Create ``onward_tpl_<tag>`` once (migrated), then clone it per test."""

    def __init__(self, admin_url: str, tag: str = "test") -> None:
        self.admin_url = admin_url
        self.template = f"onward_tpl_{tag}"
        self.created: list[str] = []

    def _admin(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_url, autocommit=True)

    def prepare_template(self) -> None:
        with self._admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(self.template)
                )
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        apply(with_database(self.admin_url, self.template))

    def create(self) -> str:
        name = f"onward_t_{secrets.token_hex(5)}"
        with self._admin() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(self.template)
                )
            )
        self.created.append(name)
        return with_database(self.admin_url, name)

    def drop(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        with self._admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def drop_template(self) -> None:
        with self._admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(self.template)
                )
            )


async def eventually(
    check: Callable[[], Awaitable[T]],
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll ``check`` until it returns a truthy value; return it. Raises ``AssertionError``
    with the last value seen when ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s (last: {last!r})")
        await asyncio.sleep(interval)


def eventually_sync(
    check: Callable[[], T],
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s (last: {last!r})")
        time.sleep(interval)
