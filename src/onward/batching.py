"""Concurrent calls written together ("smart batching", with no timer).

A :class:`Coalescer` takes items from concurrent callers and hands them to one ``write``
function in batches: while fewer than ``in_flight`` writes run, every item waiting goes into
the next one. A lone call waits for nothing (its write starts at the end of the current turn of
the event loop); under load, each write -- one statement, one commit -- carries every item that
arrived while the last ones ran, so PostgreSQL parses, plans and commits once for many. This is
how ``Engine.start`` (``onward.start.StartBatcher``) and the intake limit's counter
(``onward.intake.Admitter``) keep a commit per call from being the ceiling of the API.

``write`` answers each item of its batch, in order, with a result or an exception; that item's
caller gets it. If ``write`` raises, every caller of the batch gets that exception. Nothing is
durable here: an item is written when its write commits, exactly as a direct call would be,
and a process that dies before that has written nothing for it (its caller never got an
answer either).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    def __init__(
        self,
        write: Callable[[list[T]], Awaitable[list[R | Exception]]],
        *,
        in_flight: int,
        max_items: int,
        weight: Callable[[T], int] | None = None,
        max_weight: int | None = None,
    ) -> None:
        """``max_items`` and ``max_weight`` (the sum of ``weight`` over a batch) bound one
        write; a batch always takes at least one item."""
        self.write, self.in_flight, self.max_items = write, in_flight, max_items
        self.weight, self.max_weight = weight, max_weight
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._running = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> R:
        """``item``'s answer from the write that carried it. A caller cancelled while its item
        waits takes it out; once its write began, the write goes on without the caller."""
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, fut))
        self._kick()
        return await fut

    def _kick(self) -> None:
        if self._scheduled or self._running >= self.in_flight or not self._waiting:
            return
        # at the end of this turn of the loop: the calls made in the same turn go together
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._scheduled = False
        while self._running < self.in_flight and self._waiting:
            batch = self._take()
            if batch:
                self._running += 1
                task = asyncio.create_task(self._write(batch))
                self._tasks.add(task)
                task.add_done_callback(self._written)

    def _take(self) -> list[tuple[T, asyncio.Future[R]]]:
        batch: list[tuple[T, asyncio.Future[R]]] = []
        total = 0
        taken = 0
        for item, fut in self._waiting:
            if len(batch) >= self.max_items:
                break
            w = self.weight(item) if self.weight is not None else 0
            if batch and self.max_weight is not None and total + w > self.max_weight:
                break
            taken += 1
            if not fut.done():  # a caller cancelled while waiting: not written
                batch.append((item, fut))
                total += w
        del self._waiting[:taken]
        return batch

    def _written(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._running -= 1
        self._kick()

    async def _write(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            outcomes = await self.write([item for item, _ in batch])
            if len(outcomes) != len(batch):  # pragma: no cover - a bug in write
                raise RuntimeError(f"{len(outcomes)} answers for a batch of {len(batch)}")
        except Exception as exc:
            outcomes = [exc] * len(batch)
        except BaseException:
            for _, fut in batch:
                fut.cancel()
            raise
        for (_, fut), outcome in zip(batch, outcomes, strict=True):
            if fut.done():
                continue
            if isinstance(outcome, Exception):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)


async def outcome(aw: Awaitable[R]) -> R | Exception:
    """``aw``'s result, or the exception it raised (a write's answer for one item)."""
    try:
        return await aw
    except Exception as exc:
        return exc
