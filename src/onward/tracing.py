"""Traces: one span per step and per effect call, one trace per run (B5; optional).

``pip install 'onward[otel]'`` installs the OpenTelemetry API and SDK; the process that wants
traces configures a tracer provider and its exporter the OpenTelemetry way (the SDK's
environment variables, or ``trace.set_tracer_provider`` in your ``--app`` module). Without
``opentelemetry`` installed (or with ``ONWARD_TRACES=off``) every function here is a no-op and
nothing imports it.

Which trace a step belongs to is decided by its run, so every step of a run -- on whichever
worker, after whichever crash -- lands in one trace:

* a run started by a request that carried a W3C ``traceparent`` header (``POST
  /v1/hooks/{automation_id}``, ``POST /v1/runs``) keeps it (``runs.traceparent``): its steps are
  children of the caller's span, in the caller's trace;
* otherwise the trace id and a parent span id are derived from the run id (SHA-256): the same
  for every step, stable across processes. No span is exported for that parent: the run is the
  trace, its steps its top-level spans.

Step spans carry ``onward.org_id``, ``onward.run_id``, ``onward.step_id``, ``onward.seq``,
``onward.kind``, ``onward.lane``, ``onward.attempt`` and ``onward.worker``; an effect call's span
(a child of its step's) carries ``onward.effect_key`` (the provider's idempotency key),
``onward.provider`` and ``onward.effect_attempt``. A step that raised ends its span with an
error status and the exception recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
from typing import Any

TRACER = "onward"
#: ``version-traceid-parentid-flags``, lower-case hex; all-zero ids are invalid (W3C).
_TRACEPARENT = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")

_checked = False
_trace: Any = None  # the opentelemetry.trace module, when installed and not switched off


def valid_traceparent(value: str | None) -> str | None:
    """``value`` if it is a W3C ``traceparent`` this engine can continue, else None (a
    malformed header is ignored, as the W3C recommendation says, never refused)."""
    if not value:
        return None
    value = value.strip().lower()
    return value if _TRACEPARENT.match(value) else None


def _api() -> Any:
    global _checked, _trace
    if not _checked:
        _checked = True
        wanted = os.environ.get("ONWARD_TRACES", "on").strip().lower() not in ("off", "0", "false")
        try:
            found = wanted and importlib.util.find_spec("opentelemetry.trace") is not None
        except (ImportError, ValueError):  # not installed (or hidden from this interpreter)
            found = False
        if found:
            from opentelemetry import trace

            _trace = trace
    return _trace


_UNKNOWN = object()
#: a provider named by the environment (OpenTelemetry makes it on first use)
_ENV_PROVIDER = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
_tracer_of: tuple[Any, Any] | None = None  # (provider, its tracer): one lookup per provider


def _tracer() -> Any:
    """The tracer of the configured tracer provider; None while there is none (the API's
    proxy or no-op provider): then no span is made at all, which keeps a step's cost where it
    was (a non-recording span still costs about 12 us a step)."""
    global _tracer_of
    trace = _api()
    if trace is None:
        return None
    # The API's global, read directly: while none is set, get_tracer_provider looks up an
    # environment variable on every call (an exception inside os.environ each time, about 3 %
    # of a worker's CPU here). If a later API names it otherwise, the public call serves.
    provider: Any = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None and not _ENV_PROVIDER:
        return None
    if provider is None or provider is _UNKNOWN:
        provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    if _tracer_of is None or _tracer_of[0] is not provider:
        _tracer_of = (provider, provider.get_tracer(TRACER))
    return _tracer_of[1]


def enabled() -> bool:
    """Whether spans are made: the OpenTelemetry API is installed, not switched off, and a
    tracer provider is configured."""
    return _tracer() is not None


def run_ids(run_id: str) -> tuple[int, int]:
    """The trace id and parent span id of a run that came with no ``traceparent``."""
    digest = hashlib.sha256(run_id.encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


def _parent(trace: Any, run_id: str, traceparent: str | None) -> Any:
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    if traceparent:
        _, trace_hex, span_hex, flags = traceparent.split("-")
        trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
        trace_flags = TraceFlags(int(flags, 16) & 0xFF)
    else:
        trace_id, span_id = run_ids(run_id)
        trace_flags = TraceFlags(TraceFlags.SAMPLED)
    remote = SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace_flags)
    return trace.set_span_in_context(NonRecordingSpan(remote))


def step_span(
    *,
    org_id: str,
    run_id: str,
    seq: int,
    step_id: str,
    kind: str,
    lane: str,
    attempt: int,
    worker: str,
    traceparent: str | None = None,
) -> contextlib.AbstractContextManager[Any]:
    """The span of one attempt of one step, in its run's trace (a no-op without OpenTelemetry).
    Enter it before the step's task is created: the task copies the current context."""
    tracer = _tracer()
    if tracer is None:
        return contextlib.nullcontext()
    trace = _api()
    return tracer.start_as_current_span(
        f"step {step_id}",
        context=_parent(trace, run_id, valid_traceparent(traceparent)),
        kind=trace.SpanKind.INTERNAL,
        attributes={
            "onward.org_id": org_id,
            "onward.run_id": run_id,
            "onward.seq": seq,
            "onward.step_id": step_id,
            "onward.kind": kind,
            "onward.lane": lane,
            "onward.attempt": attempt,
            "onward.worker": worker,
        },
    )


def effect_span(
    provider: str, effect_key: str, attempt: int
) -> contextlib.AbstractContextManager[Any]:
    """The span of one call to a provider, a child of the current step's span."""
    tracer = _tracer()
    if tracer is None:
        return contextlib.nullcontext()
    return tracer.start_as_current_span(
        f"effect {provider}",
        kind=_api().SpanKind.CLIENT,
        attributes={
            "onward.effect_key": effect_key,
            "onward.provider": provider,
            "onward.effect_attempt": attempt,
        },
    )
