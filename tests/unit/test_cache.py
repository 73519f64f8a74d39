"""onward.cache.Recent.fetch: one load at a time per key, so an entry lapsing under load sends
one request to the database, not every request in flight."""

from __future__ import annotations

import asyncio

import pytest

from onward.cache import Recent


async def test_requests_that_miss_together_share_one_load() -> None:
    cache: Recent[str, int] = Recent(seconds=60)
    loads = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def load() -> int:
        nonlocal loads
        loads += 1
        started.set()
        await release.wait()
        return 7

    waiting = [asyncio.ensure_future(cache.fetch("k", load)) for _ in range(20)]
    await started.wait()  # the first request's load is under way
    release.set()
    assert await asyncio.gather(*waiting) == [7] * 20
    assert loads == 1
    assert await cache.fetch("k", load) == 7 and loads == 1  # kept


async def test_a_failed_load_lets_the_waiting_requests_load_for_themselves() -> None:
    cache: Recent[str, int] = Recent(seconds=60)
    calls = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def load() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            started.set()
            await release.wait()
            raise RuntimeError("the database went away")
        return 3

    first = asyncio.ensure_future(cache.fetch("k", load))
    await started.wait()
    others = [asyncio.ensure_future(cache.fetch("k", load)) for _ in range(3)]
    release.set()  # the others start first (FIFO), find the load under way and wait for it
    with pytest.raises(RuntimeError):
        await first
    assert await asyncio.gather(*others) == [3, 3, 3]


async def test_none_is_not_kept_and_a_load_begun_before_forget_is_not_kept() -> None:
    cache: Recent[str, int] = Recent(seconds=60)

    async def nothing() -> int | None:
        return None

    assert await cache.fetch("k", nothing) is None and cache.get("k") is None
    started, release = asyncio.Event(), asyncio.Event()

    async def old_value() -> int:
        started.set()
        await release.wait()
        return 1

    loading = asyncio.ensure_future(cache.fetch("k", old_value))
    await started.wait()
    cache.forget(lambda _k, _v: True)  # this process changed it meanwhile
    release.set()
    assert await loading == 1
    assert cache.get("k") is None  # the next request reads it again
