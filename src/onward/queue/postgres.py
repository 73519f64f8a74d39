"""Wake-ups over PostgreSQL LISTEN/NOTIFY: the default, no extra service.

One channel per lane (``<prefix>_wake_<lane>``). NOTIFY has no delayed delivery, so the relay
keeps a delayed wake in the outbox until it is due (``supports_delay = False``).

The consumer holds one dedicated connection. When it drops, it reconnects with backoff and
LISTENs again on every channel -- a LISTEN does not survive a reconnect, and forgetting to
re-issue it is how other Postgres queues went silent -- and then calls ``on_reconnect`` so
the worker polls once for whatever was notified while it was away.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence

import psycopg

from onward.queue.base import OnReconnect, OnWake, Queue, Wake

log = logging.getLogger("onward.queue.postgres")


def channel(prefix: str, lane: str) -> str:
    return f"{prefix}_wake_{lane}"


class PostgresQueue(Queue):
    name = "postgres"
    supports_delay = False

    def __init__(self, url: str, prefix: str = "onward") -> None:
        self.url = url
        self.prefix = prefix
        self._pub: psycopg.AsyncConnection | None = None
        self._pub_lock = asyncio.Lock()

    async def publish(self, wakes: Sequence[Wake]) -> None:
        if not wakes:
            return
        async with self._pub_lock:
            if self._pub is None or self._pub.closed:
                self._pub = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            try:
                await self._pub.execute(
                    "SELECT pg_notify(c, p) FROM unnest(%s::text[], %s::text[]) AS x(c, p)",
                    (
                        [channel(self.prefix, w.lane) for w in wakes],
                        [w.to_json() for w in wakes],
                    ),
                )
            except psycopg.OperationalError:
                await self._pub.close()
                self._pub = None
                raise

    async def publish_tx(self, conn: psycopg.AsyncConnection, wakes: Sequence[Wake]) -> None:
        """Publish inside the caller's transaction: delivered if and only if it commits."""
        if wakes:
            await conn.execute(
                "SELECT pg_notify(c, p) FROM unnest(%s::text[], %s::text[]) AS x(c, p)",
                ([channel(self.prefix, w.lane) for w in wakes], [w.to_json() for w in wakes]),
            )

    async def consume(
        self, lanes: Sequence[str], on_wake: OnWake, on_reconnect: OnReconnect | None = None
    ) -> None:
        delay = 0.1
        first = True
        while True:
            try:
                # TCP keepalives: a listener whose peer vanished without closing (a partition)
                # would otherwise wait in notifies() for the OS default of about two hours.
                async with await psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    keepalives=1,
                    keepalives_idle=30,
                    keepalives_interval=10,
                    keepalives_count=3,
                ) as conn:
                    for lane in lanes:
                        await conn.execute(f'LISTEN "{channel(self.prefix, lane)}"')
                    if not first and on_reconnect is not None:
                        on_reconnect()
                    first, delay = False, 0.1
                    async for note in conn.notifies():
                        try:
                            on_wake(Wake.from_json(note.payload))
                        except (ValueError, KeyError):
                            log.warning("ignoring malformed wake %r", note.payload)
            except (psycopg.OperationalError, OSError) as exc:
                log.warning("wake listener lost its connection (%s); reconnecting", exc)
                first = False
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 5.0)

    async def close(self) -> None:
        if self._pub is not None:
            await self._pub.close()
            self._pub = None
