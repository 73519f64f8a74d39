"""Step kinds for tests. Import this module (or pass ``--kinds onward.testing.kinds`` to a
worker process) to register them; a test's own engine and the processes it starts must know
the same kinds.

``test.sleep`` (lane ``io``) sleeps ``with.seconds`` (else ``input.seconds``, else 0) and
answers what it did, including the process's own ``time.time()`` (so a test can see that a
skewed clock really was skewed). ``with.retry_seconds``, when given, replaces the sleep on
attempts after the first: a step that blocked its first worker for a minute finishes quickly
once another worker takes it over.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from onward.kinds import Registry, StepContext, step_kind

SLEEP_KIND = "test.sleep"


async def _sleep(step: StepContext) -> dict[str, Any]:
    params = step.params or {}
    seconds = float(params.get("seconds", step.input.get("seconds", 0)))
    if step.attempt > 1 and "retry_seconds" in params:
        seconds = float(params["retry_seconds"])
    await asyncio.sleep(seconds)
    return {"slept": seconds, "attempt": step.attempt, "worker": step.worker, "clock": time.time()}


def register_kinds(into: Registry | None = None) -> None:
    """Register the test kinds into ``into`` (default: the global registry)."""
    step_kind(SLEEP_KIND, lane="io", replace=True, into=into)(_sleep)


register_kinds()
