"""Wait for a condition by polling, never by a fixed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


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
    """``eventually`` for synchronous code."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s (last: {last!r})")
        time.sleep(interval)


async def lock_awaited(sql: Any, *, besides: int, what: str = "a lock awaited") -> None:
    """Until some backend other than ``besides`` (the pid of the connection that holds the
    lock) waits for a lock: the moment a test that makes a real deadlock asks for its second
    lock. ``sql``: a synchronous psycopg connection returning dict rows."""

    async def waits() -> bool:
        row = sql.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE NOT granted AND pid <> %s", (besides,)
        ).fetchone()
        return bool(row and row["n"])

    await eventually(waits, what=what)
