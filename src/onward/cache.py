"""What a process may trust for a moment without asking the database again.

:class:`Recent` keeps answers that are read on every request and change rarely -- a verified API
key (``onward.api_keys``), an endpoint's webhook secrets (``onward.intake``) -- for ``seconds``
(``ONWARD_AUTH_CACHE_SECONDS``, 1 by default; 0 keeps nothing). The process that changes one
forgets it at once; other processes see the change within ``seconds``: a key revoked in one API
process still opens the others for up to that long, and a secret added to an endpoint is
required there after it. Bounded: past ``size`` entries it starts again empty.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DEFAULT_SECONDS = 1.0


class Recent(Generic[K, V]):
    def __init__(self, seconds: float = DEFAULT_SECONDS, size: int = 10_000) -> None:
        self.seconds, self.size = seconds, size
        self._items: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, asyncio.Future[V | None]] = {}  # fetch: the load under way
        self._forgotten = 0  # how many forget() calls: a load begun before one is not kept

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if time.monotonic() >= item[0]:
            self._items.pop(key, None)
            return None
        return item[1]

    async def fetch(self, key: K, load: Callable[[], Awaitable[V | None]]) -> V | None:
        """The trusted value for ``key``, else ``load()``'s (kept unless None) -- one load at a
        time per key in this process: a request that misses while another's load of the same
        key is under way waits for that answer instead of asking the database too (when an
        entry lapses under load, every request in flight would otherwise miss at once). If
        that load fails, the waiting request loads for itself."""
        known = self.get(key)
        if known is not None:
            return known
        loop = asyncio.get_running_loop()
        pending = self._loading.get(key)
        if pending is not None and pending.get_loop() is loop:
            await asyncio.wait([pending])
            if not pending.cancelled():
                return pending.result()
            return await load()
        mine: asyncio.Future[V | None] = loop.create_future()
        self._loading[key] = mine
        forgotten = self._forgotten
        try:
            value = await load()
        except BaseException:
            mine.cancel()
            raise
        finally:
            if self._loading.get(key) is mine:
                del self._loading[key]
        if value is not None and forgotten == self._forgotten:
            self.put(key, value)
        mine.set_result(value)
        return value

    def put(self, key: K, value: V) -> None:
        if self.seconds <= 0:
            return
        if len(self._items) >= self.size:
            self._items.clear()
        self._items[key] = (time.monotonic() + self.seconds, value)

    def forget(self, match: Callable[[K, V], bool]) -> None:
        """Drop every entry ``match`` says (this process changed what it held), and let no
        load under way keep what it read before the change."""
        self._forgotten += 1
        self._loading.clear()
        for key in [k for k, (_, v) in self._items.items() if match(k, v)]:
            self._items.pop(key, None)


#: every cache of this module's kind, so a process sets their lifetime once (Engine.open)
ALL: list[Recent[Any, Any]] = []


def trusted(size: int = 10_000) -> Recent[Any, Any]:
    cache: Recent[Any, Any] = Recent(DEFAULT_SECONDS, size)
    ALL.append(cache)
    return cache


def configure(seconds: float) -> None:
    for cache in ALL:
        cache.seconds = seconds
        if seconds <= 0:
            cache.forget(lambda _k, _v: True)
