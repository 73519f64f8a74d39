"""The ``none`` queue: no wake-ups. Workers find ready steps by polling and the due sweep fires
timers, so every run still finishes; this adapter exists to prove exactly that."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from onward.queue.base import OnReconnect, OnWake, Queue, Wake


class NoQueue(Queue):
    name = "none"
    supports_delay = False

    async def publish(self, wakes: Sequence[Wake]) -> None:
        return None

    async def consume(
        self, lanes: Sequence[str], on_wake: OnWake, on_reconnect: OnReconnect | None = None
    ) -> None:
        await asyncio.Event().wait()  # never delivers; returns only when cancelled
