"""Which event loop a process of onward runs on: uvloop's when installed (a dependency: about a
quarter less CPU per HTTP request and per step here), unless ``ONWARD_LOOP=asyncio`` asks for
the standard one. Every command (``onward.cli``) and every process a benchmark starts
(``onward.bench.proc``) runs on it, so a benchmark measures the loop users run."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    if os.environ.get("ONWARD_LOOP", "uvloop").strip().lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency; absent only in odd installs
        return None
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
