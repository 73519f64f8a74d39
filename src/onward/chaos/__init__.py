"""Chaos: real processes killed at every crash point while the reference scenario runs.

``run_chaos(settings, runs=, kills_per_point=, out=) -> Report`` is what ``onward chaos`` runs;
:mod:`onward.chaos.faults` holds the other real faults (a queue that repeats and reorders, a
Redis and a PostgreSQL of one's own to kill or restart, connections terminated at random).

The processes it starts are ``python -m onward.testing.worker`` (:mod:`onward.testing`). The
runner is imported lazily: importing ``onward.chaos.faults`` does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onward.chaos.runner import Report, run_chaos

__all__ = ["Report", "run_chaos"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from onward.chaos import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'onward.chaos' has no attribute {name!r}")
