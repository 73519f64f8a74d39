"""Traces (issue 15, B5): a real engine run with the OpenTelemetry SDK's in-memory exporter.

One span per step attempt and per effect call; every step of a run in one trace -- the trace
of the start request's W3C ``traceparent`` when it had one (kept with the run), else a trace
id derived from the run id; an effect call's span is a child of its step's. Without
``opentelemetry`` nothing imports it and steps run as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from onward import Automation, tracing
from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import run_python, run_row
from tests.integration.api_client import api_client

ORG = "test"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"

pytestmark = pytest.mark.usefixtures("admin")

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once: OpenTelemetry allows one per process)
    exporting to memory, emptied for each test."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


async def publish(engine: Engine, sandbox: SandboxServer) -> None:
    await engine.integrations.add_connection(
        ORG, "mailbox", provider="email", base_url=sandbox.url, account="a", secret="a"
    )
    flow = (
        Automation("traced")
        .step("prepare", "set", values={"subject": "'Hello'"})
        .step(
            "send",
            "email.send",
            connection="mailbox",
            to="maya@example.test",
            subject="Hi",
            body="Hello",
        )
    )
    await engine.publish(flow.build())


def of_run(exporter: InMemorySpanExporter, run_id: str) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("onward.run_id") == run_id
    ]


def children(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


async def test_a_webhooks_traceparent_is_continued_by_every_step_and_effect_call(
    engine: Engine,
    sandbox: SandboxServer,
    sql: psycopg.Connection[Any],
    spans: InMemorySpanExporter,
) -> None:
    await publish(engine, sandbox)
    traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    async with api_client(engine) as client:
        answer = await client.post(
            "/v1/hooks/traced", json={"name": "Maya"}, headers={"traceparent": traceparent}
        )
    assert answer.status_code == 202, answer.text
    run_id = answer.json()["run_id"]
    assert run_row(sql, run_id)["traceparent"] == traceparent

    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"

    steps = of_run(spans, run_id)
    assert sorted(s.name for s in steps) == ["step prepare", "step send"]
    for span in steps:
        assert span.context.trace_id == int(CALLER_TRACE, 16)
        assert span.parent is not None and span.parent.span_id == int(CALLER_SPAN, 16)
        attrs = span.attributes or {}
        assert attrs["onward.org_id"] == ORG
        assert attrs["onward.attempt"] == 1
        assert attrs["onward.run_id"] == run_id and attrs["onward.worker"]
    send = next(s for s in steps if s.name == "step send")
    [call] = children(spans, send)
    assert call.name == "effect email"
    assert call.kind == trace.SpanKind.CLIENT
    assert (call.attributes or {})["onward.effect_key"] == f"{run_id}/send/1"
    assert call.context.trace_id == int(CALLER_TRACE, 16)


async def test_without_a_traceparent_a_run_is_one_trace_derived_from_its_id(
    engine: Engine,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    sql: psycopg.Connection[Any],
    spans: InMemorySpanExporter,
) -> None:
    await publish(engine, sandbox)
    admin.faults("email", script=["503"])  # the first send fails: two attempts, two spans
    async with api_client(engine) as client:
        answer = await client.post(
            "/v1/runs",
            json={"automation_id": "traced", "input": {}},
            headers={"traceparent": "00-not-a-trace-context"},  # ignored, not refused
        )
    assert answer.status_code == 202, answer.text
    run_id = answer.json()["run_id"]
    assert run_row(sql, run_id)["traceparent"] is None

    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"

    trace_id, parent_id = tracing.run_ids(run_id)
    steps = of_run(spans, run_id)
    assert sorted((s.name, (s.attributes or {})["onward.attempt"]) for s in steps) == [
        ("step prepare", 1),
        ("step send", 1),
        ("step send", 2),
    ]
    assert {s.context.trace_id for s in steps} == {trace_id}
    assert {s.parent.span_id for s in steps if s.parent} == {parent_id}
    failed = next(
        s for s in steps if (s.attributes or {})["onward.attempt"] == 1 and "send" in s.name
    )
    assert failed.status.status_code == StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    [failed_call] = children(spans, failed)
    assert failed_call.status.status_code == StatusCode.ERROR


def test_without_opentelemetry_nothing_imports_it_and_no_span_is_made() -> None:
    hidden = run_python(
        """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
import onward, onward.worker, onward.effects
from onward import tracing
with tracing.step_span(org_id="o", run_id="r", seq=1, step_id="s", kind="set", lane="fast",
                       attempt=1, worker="w") as span:
    pass
print(tracing.enabled(), span, sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    )
    assert hidden.split() == ["False", "None", "[]"]


def test_with_no_tracer_provider_configured_no_span_is_made() -> None:
    """The API installed but no provider configured (the API's proxy): steps make no span, so
    they cost what they did without OpenTelemetry."""
    out = run_python(
        """
from opentelemetry import trace
from onward import tracing
with tracing.step_span(org_id="o", run_id="r", seq=1, step_id="s", kind="set", lane="fast",
                       attempt=1, worker="w") as before:
    pass
from opentelemetry.sdk.trace import TracerProvider
trace.set_tracer_provider(TracerProvider())
with tracing.step_span(org_id="o", run_id="r", seq=1, step_id="s", kind="set", lane="fast",
                       attempt=1, worker="w") as after:
    pass
print(before, after.get_span_context().trace_id == tracing.run_ids("r")[0])
"""
    )
    assert out.split() == ["None", "True"]
