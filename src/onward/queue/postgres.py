"""Wake-ups over PostgreSQL LISTEN/NOTIFY: the default, no extra service.

One channel per lane (``<prefix>_wake_<lane>``). NOTIFY has no delayed delivery, so the relay
keeps a delayed wake in the outbox until it is due (``supports_delay = False``).

The step wakes of one lane in one publish are one notification (``_coalesced``): a step wake
tells a listener only that its lane has ready work -- the worker claims whatever is ready, not
the step the wake names -- so a relay round of 150 starts' wakes woke each worker 150 times
for one claim's worth of news, and each notification cost the server a queue entry read by
every listener and each worker a parse. Timer wakes name their timer and each stays one.

The consumer holds one dedicated connection. When it drops, it reconnects with backoff and
LISTENs again on every channel -- a LISTEN does not survive a reconnect, and forgetting to
re-issue it is how other Postgres queues went silent -- and then calls ``on_reconnect`` so
the worker polls once for whatever was notified while it was away.

Health (``onward doctor``): a wake channel can go silent without an error, so :meth:`health`
proves delivery instead of trusting it. In a process that consumes, every listener must be
connected, and a NOTIFY on the health channel (``<prefix>_health``, which every listener
also LISTENs on) sent through the publishing connection must come back through the listener
within ``health_timeout``. A process that does not consume (``onward doctor`` itself) makes
the same round trip through a listener of its own, which proves the server still delivers
notifications. Either way the server's NOTIFY queue must be less than ``notify_queue_limit``
full: a session that LISTENs and then stays inside a transaction holds it, and when it is full
every NOTIFY -- every wake -- fails.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from onward.queue.base import OnReconnect, OnWake, Queue, Wake

log = logging.getLogger("onward.queue.postgres")


def channel(prefix: str, lane: str) -> str:
    return f"{prefix}_wake_{lane}"


def _coalesced(wakes: Sequence[Wake]) -> list[Wake]:
    """The first step wake of each lane, and every other wake, in order (the module's
    docstring says why)."""
    lanes: set[str] = set()
    out: list[Wake] = []
    for w in wakes:
        if w.topic == "step":
            if w.lane in lanes:
                continue
            lanes.add(w.lane)
        out.append(w)
    return out


def health_channel(prefix: str) -> str:
    return f"{prefix}_health"


# One JSON array of [channel, payload] pairs: orjson writes it in C, where two text arrays of
# JSON payloads went through psycopg's Python array dumper (a regex escape per element).
_NOTIFY = "SELECT pg_notify(e ->> 0, e ->> 1) FROM jsonb_array_elements(%s::jsonb) AS e"


class PostgresQueue(Queue):
    name = "postgres"
    supports_delay = False

    def __init__(
        self,
        url: str,
        prefix: str = "onward",
        *,
        health_timeout: float = 5.0,
        notify_queue_limit: float = 0.5,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.health_timeout = health_timeout
        self.notify_queue_limit = notify_queue_limit
        self._pub: psycopg.AsyncConnection | None = None
        self._pub_lock = asyncio.Lock()
        # one entry per running consume(): its listening connection, None while it reconnects
        self._listeners: dict[object, psycopg.AsyncConnection | None] = {}
        self._lost_at: dict[object, float] = {}  # loop time each listener lost its connection
        self._probes: dict[str, asyncio.Future[None]] = {}  # health tokens awaiting their echo

    async def _on_publisher(self, query: str, params: Any = None) -> Any:
        """Run one statement on the publishing connection (reconnected when closed); its first
        row. A connection error drops the connection, so the next call starts afresh."""
        async with self._pub_lock:
            if self._pub is None or self._pub.closed:
                self._pub = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            try:
                cur = await self._pub.execute(query, params)
                return await cur.fetchone()
            except psycopg.OperationalError:
                await self._pub.close()
                self._pub = None
                raise

    async def _notify(self, channels: list[str], payloads: list[str]) -> None:
        await self._on_publisher(_NOTIFY, (Jsonb(list(zip(channels, payloads, strict=True))),))

    async def publish(self, wakes: Sequence[Wake]) -> None:
        wakes = _coalesced(wakes)
        if not wakes:
            return
        await self._notify(
            [channel(self.prefix, w.lane) for w in wakes], [w.to_json() for w in wakes]
        )

    async def publish_tx(self, conn: psycopg.AsyncConnection, wakes: Sequence[Wake]) -> None:
        """Publish inside the caller's transaction: delivered if and only if it commits."""
        wakes = _coalesced(wakes)
        if wakes:
            await conn.execute(
                _NOTIFY, (Jsonb([[channel(self.prefix, w.lane), w.to_json()] for w in wakes]),)
            )

    async def _listen(self, channels: Sequence[str]) -> psycopg.AsyncConnection:
        # TCP keepalives: a listener whose peer vanished without closing (a partition) would
        # otherwise wait in notifies() for the OS default of about two hours.
        conn = await psycopg.AsyncConnection.connect(
            self.url,
            autocommit=True,
            keepalives=1,
            keepalives_idle=30,
            keepalives_interval=10,
            keepalives_count=3,
        )
        try:
            for name in channels:
                await conn.execute(f'LISTEN "{name}"')
        except BaseException:
            await conn.close()
            raise
        return conn

    def _echo(self, token: str) -> None:
        probe = self._probes.get(token)
        if probe is not None and not probe.done():
            probe.set_result(None)

    async def consume(
        self, lanes: Sequence[str], on_wake: OnWake, on_reconnect: OnReconnect | None = None
    ) -> None:
        me = object()
        health = health_channel(self.prefix)
        loop = asyncio.get_running_loop()
        self._listeners[me] = None
        delay = 0.1
        first = True
        try:
            while True:
                try:
                    async with await self._listen(
                        [health, *(channel(self.prefix, lane) for lane in lanes)]
                    ) as conn:
                        self._listeners[me] = conn
                        self._lost_at.pop(me, None)
                        if not first and on_reconnect is not None:
                            on_reconnect()
                        first, delay = False, 0.1
                        async for note in conn.notifies():
                            if note.channel == health:
                                self._echo(note.payload)
                                continue
                            try:
                                on_wake(Wake.from_json(note.payload))
                            except (ValueError, KeyError):
                                log.warning("ignoring malformed wake %r", note.payload)
                except (psycopg.OperationalError, OSError) as exc:
                    log.warning("wake listener lost its connection (%s); reconnecting", exc)
                    self._listeners[me] = None
                    self._lost_at.setdefault(me, loop.time())
                    first = False
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 5.0)
        finally:
            self._listeners.pop(me, None)
            self._lost_at.pop(me, None)

    # -- health -----------------------------------------------------------------------------

    async def health(self) -> list[str]:
        loop = asyncio.get_running_loop()
        lost = [
            loop.time() - self._lost_at.get(me, loop.time())
            for me, conn in self._listeners.items()
            if conn is None or conn.closed
        ]
        if lost:
            return [
                f"{len(lost)} of {len(self._listeners)} wake listeners of this process "
                f"{'is' if len(lost) == 1 else 'are'} not connected (reconnecting for "
                f"{max(lost):.0f}s): wakes sent meanwhile are lost; workers only poll"
            ]
        for attempt in (1, 2):  # a publishing connection left over from before a restart fails once
            try:
                async with asyncio.timeout(self.health_timeout):
                    await self._round_trip()
                    row = await self._on_publisher("SELECT pg_notification_queue_usage()")
                break
            except TimeoutError:
                return [
                    f"a NOTIFY on {health_channel(self.prefix)!r} did not come back within "
                    f"{self.health_timeout:g}s: the wake listener is not receiving"
                ]
            except (psycopg.Error, OSError) as exc:
                if attempt == 2 or not isinstance(exc, psycopg.OperationalError):
                    why = str(exc).strip() or type(exc).__name__
                    return [f"PostgreSQL wake channel unusable: {why}"]
        usage = float(row[0])
        if usage > self.notify_queue_limit:
            return [
                f"the server's NOTIFY queue is {usage:.1%} full (limit "
                f"{self.notify_queue_limit:.1%}): a session that LISTENs is stuck inside a "
                "transaction, and when the queue is full every wake fails"
            ]
        return []

    async def _round_trip(self) -> None:
        """NOTIFY a fresh token on the health channel and wait until a listener hears it."""
        token = uuid.uuid4().hex
        health = health_channel(self.prefix)
        if self._listeners:  # this process consumes: the echo must come through its listeners
            probe = asyncio.get_running_loop().create_future()
            self._probes[token] = probe
            try:
                await self._notify([health], [token])
                await probe
            finally:
                self._probes.pop(token, None)
            return
        async with await self._listen([health]) as conn:
            await self._notify([health], [token])
            async for note in conn.notifies():
                if note.channel == health and note.payload == token:
                    return

    async def close(self) -> None:
        if self._pub is not None:
            await self._pub.close()
            self._pub = None
