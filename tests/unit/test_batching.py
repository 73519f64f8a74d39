"""``onward.batching.Coalescer``: concurrent calls handed to one write in batches, with no
timer, each caller its own answer."""

from __future__ import annotations

import asyncio

import pytest

from onward.batching import Coalescer


class Recorder:
    """A write that records its batches and how many ran at once, answering each item with its
    double (or a ValueError for a negative item); ``gate`` holds every write until set."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.running = 0
        self.most = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.began = asyncio.Condition()

    async def writes_began(self, n: int) -> None:
        async with self.began:
            await self.began.wait_for(lambda: len(self.batches) >= n)

    async def write(self, items: list[int]) -> list[int | Exception]:
        self.batches.append(list(items))
        async with self.began:
            self.began.notify_all()
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.gate.wait()
            return [ValueError(f"item {i}") if i < 0 else 2 * i for i in items]
        finally:
            self.running -= 1


async def test_a_lone_call_is_written_at_once_and_alone() -> None:
    rec = Recorder()
    c = Coalescer(rec.write, in_flight=2, max_items=100)
    assert await c.submit(21) == 42
    assert rec.batches == [[21]]


async def test_calls_made_while_writes_run_share_the_next_write_and_get_their_own_answers() -> None:
    rec = Recorder()
    rec.gate.clear()
    c = Coalescer(rec.write, in_flight=2, max_items=100)
    first = [asyncio.ensure_future(c.submit(i)) for i in range(3)]
    await rec.writes_began(1)  # the first write took everything made in that turn of the loop
    later = [asyncio.ensure_future(c.submit(i)) for i in range(3, 10)]
    await rec.writes_began(2)
    more = [asyncio.ensure_future(c.submit(i)) for i in range(10, 15)]  # both writes running
    for _ in range(20):
        await asyncio.sleep(0)
    assert rec.batches == [[0, 1, 2], [3, 4, 5, 6, 7, 8, 9]]  # the third waits for a free write
    rec.gate.set()
    answers = await asyncio.gather(*first, *later, *more)
    assert answers == [2 * i for i in range(15)]
    assert rec.batches[2] == list(range(10, 15))
    assert rec.most == 2


async def test_an_item_s_error_reaches_its_caller_only() -> None:
    rec = Recorder()
    c = Coalescer(rec.write, in_flight=1, max_items=100)
    answers = await asyncio.gather(*(c.submit(i) for i in (1, -2, 3)), return_exceptions=True)
    assert answers[0] == 2 and answers[2] == 6
    assert isinstance(answers[1], ValueError) and str(answers[1]) == "item -2"
    assert rec.batches == [[1, -2, 3]]


async def test_a_write_that_raises_answers_every_caller_of_its_batch_and_the_next_still_runs() -> (
    None
):
    calls: list[list[int]] = []

    async def write(items: list[int]) -> list[int | Exception]:
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("the statement failed")
        return list(items)

    c = Coalescer(write, in_flight=1, max_items=100)
    answers = await asyncio.gather(c.submit(1), c.submit(2), return_exceptions=True)
    assert [type(a) for a in answers] == [RuntimeError, RuntimeError]
    assert await c.submit(3) == 3


async def test_max_items_and_max_weight_bound_a_write_but_never_starve_a_heavy_item() -> None:
    rec = Recorder()
    c = Coalescer(rec.write, in_flight=1, max_items=3, weight=lambda i: i, max_weight=10)
    answers = await asyncio.gather(*(c.submit(i) for i in (1, 1, 1, 1, 4, 4, 50, 1)))
    assert answers == [2, 2, 2, 2, 8, 8, 100, 2]
    assert rec.batches == [[1, 1, 1], [1, 4, 4], [50], [1]]


async def test_a_caller_cancelled_while_waiting_is_not_written() -> None:
    rec = Recorder()
    rec.gate.clear()
    c = Coalescer(rec.write, in_flight=1, max_items=100)
    running = asyncio.ensure_future(c.submit(1))
    await rec.writes_began(1)
    waiting = [asyncio.ensure_future(c.submit(i)) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    waiting[1].cancel()
    rec.gate.set()
    assert await running == 2
    assert await waiting[0] == 4 and await waiting[2] == 8
    with pytest.raises(asyncio.CancelledError):
        await waiting[1]
    assert rec.batches == [[1], [2, 4]]
