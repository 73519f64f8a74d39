"""Database access: resolving the URL (or the embedded server), the pool, migrations.

PostgreSQL is the engine's only record of progress and is used as itself: there is no
database abstraction layer, only named SQL files beside the modules that run them.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from onward.config import Settings

Conn = psycopg.AsyncConnection[dict[str, Any]]
Pool = AsyncConnectionPool[Conn]


def resolve_url(settings: Settings) -> str:
    """The configured database URL, or the embedded server's (started if needed)."""
    if settings.database_url:
        return settings.database_url
    from onward.db.embedded import ensure_server

    return ensure_server(settings.data_dir)


async def _configure(conn: Conn) -> None:
    # Every statement of onward is short; a runaway one should fail rather than hold locks.
    await conn.execute("SET statement_timeout = '60s'")
    await conn.execute("SET idle_in_transaction_session_timeout = '120s'")
    await conn.set_autocommit(True)


def make_pool(url: str, *, min_size: int = 1, max_size: int = 10, name: str = "onward") -> Pool:
    """An async pool of autocommit connections returning dict rows.

    No per-checkout health check: it would cost a round trip on every statement of the hot
    path. A connection that breaks raises ``OperationalError`` to its user, who treats the
    outcome as unknown (fenced writes make that safe), and the pool discards it on return.
    """
    return AsyncConnectionPool(
        url,
        connection_class=psycopg.AsyncConnection[dict[str, Any]],
        min_size=min_size,
        max_size=max_size,
        kwargs={"row_factory": dict_row, "autocommit": True, "prepare_threshold": 0},
        configure=_configure,
        name=name,
        open=False,
    )
