"""Branch conditions and computed values in CEL (Common Expression Language).

Uses ``common-expression-language`` (Rust core, ~15 µs an evaluation here, against ~535 µs for
the pure-Python cel-python). Expressions see three variables: ``input`` (what started the run),
``vars`` (values set by earlier steps) and ``steps`` (each finished step's output by step id).
Compiled programs are cached: automation versions are immutable, so an expression never changes.
An evaluation hands the library only the variables its program names (``program.variables()``,
cached with it): converting a run's whole ``steps`` for ``vars.x == 1`` cost ~20 µs a step, and
a constant needs none of them.

The library is imported on first use, not by ``import onward``: its package also loads its
command line (prompt_toolkit, rich), about 200 ms that a process evaluating no CEL never needs.
A worker loads it when it is made (``load``), so its first step does not pay those 200 ms.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

ROOTS = frozenset({"input", "vars", "steps"})


class CelError(ValueError):
    """An expression failed to compile or to evaluate."""


def load() -> None:
    """Import the CEL library now (a worker, before it claims its first step)."""
    import cel  # noqa: F401


@lru_cache(maxsize=4096)
def compile_expr(source: str) -> Any:
    import cel

    try:
        return cel.compile(source)
    except (ValueError, RuntimeError) as exc:
        raise CelError(f"bad CEL {source!r}: {str(exc).splitlines()[0]}") from None


@lru_cache(maxsize=4096)
def _roots(source: str) -> tuple[str, ...]:
    """The root variables the compiled ``source`` reads (a macro's own names left out)."""
    return tuple(sorted(ROOTS.intersection(str(v) for v in compile_expr(source).variables())))


def check(source: str) -> list[str]:
    """Problems with an expression at publish time: syntax, and unknown root variables."""
    try:
        program = compile_expr(source)
    except CelError as exc:
        return [str(exc)]
    unknown = sorted({str(v).split(".")[0] for v in program.variables()} - ROOTS)
    if unknown:
        return [
            f"CEL {source!r} uses unknown variable(s) {', '.join(unknown)}; use input, vars or steps"
        ]
    return []


def evaluate(source: str, env: dict[str, Any]) -> Any:
    program = compile_expr(source)
    try:
        return program.execute({k: env.get(k, {}) for k in _roots(source)})
    except KeyError as exc:
        raise CelError(f"CEL {source!r}: no such field {exc}") from None
    except (ValueError, RuntimeError, TypeError) as exc:
        raise CelError(f"CEL {source!r}: {exc}") from None
