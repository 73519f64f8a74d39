"""A fuzz run (hypothesis) of the intake parsers and the automation document loader: whatever
arrives, the answer is a 2xx or a 4xx with a reason -- never a 500, never an uncaught exception.

* the webhook route (``POST /v1/hooks/{automation_id}``, signed and unsigned endpoints): random
  bytes, random JSON, random Standard Webhooks headers, and correctly signed random bodies;
* the document loader: ``parse_text`` on random bytes, text and YAML (aliases, tags, merge
  keys, dates, deep nesting) answers a mapping or ``InvalidAutomation``; the same text
  published (``POST /v1/automations``, YAML and JSON) answers 2xx or 422/413, and whatever
  ``parse_text`` accepts, ``Engine.publish`` accepts or refuses with ``InvalidAutomation``.

The API is a real uvicorn (with its engine, on an event loop of its own thread) over the test's
real PostgreSQL; examples are few and derandomised to keep the run short.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import yaml
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from standardwebhooks import Webhook

from onward.api import ApiServer, create_app
from onward.automations.document import parse_text
from onward.config import Settings
from onward.engine import Engine
from onward.errors import InvalidAutomation
from onward.testing import api_key, auth

FUZZ = hsettings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
SECRET = "whsec_" + "c2VjcmV0LW9mLXRoZS1mdXp6LXJ1bi0xMjM0NTY3OA=="

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80).map(
    str.strip
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.text(max_size=10), json_values, max_size=5).map(
        lambda v: json.dumps(v).encode()
    ),
    st.integers(1, 200).map(lambda n: b'{"x": ' + b"[" * n + b"]" * n + b"}"),
)

HOSTILE_YAML = [
    "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b]",
    "id: !!python/object/apply:os.system ['true']\nsteps: []",
    "id: x\nsteps: [{id: a, kind: set, with: {values: {d: 2024-01-01}}}]",
    "<<: {id: x}\nsteps: [{<<: {id: a}, kind: set}]",
    "id: x\nsteps:\n" + "  " * 1 + "- " * 80 + "a",
    "id: 1e400\nsteps: .nan",
    "id: x\nsteps: [{id: a, kind: branch, with: {cases: [{when: '1 +', next: a}]}}]",
    "id: x\nsteps: [{id: a, kind: wait_for, with: {duration: '-5s'}, next: nowhere}]",
    "id: x\nschedules: [{id: s, cron: '99 * * * *'}]\nsteps: [{id: a, kind: set}]",
    "\ufeffid: x\nsteps: []",
    'id: "\\0"\nsteps: []',
]

steps = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.sampled_from(["a", "b", "c", "", "A!", 7]),
            "kind": st.sampled_from(["set", "branch", "wait_for", "nope", "crm.tag", None]),
        },
        optional={
            "next": st.sampled_from(["a", "b", "zzz", None, 3]),
            "with": st.dictionaries(
                st.sampled_from(["values", "duration", "cases", "default", "until"]),
                json_values,
                max_size=3,
            ),
        },
    ),
    max_size=4,
)
documents = st.fixed_dictionaries(
    {"id": st.sampled_from(["fuzzed", "", "a b", "x" * 300, 5]), "steps": steps},
    optional={
        "budget": st.dictionaries(st.sampled_from(["max_steps", "max_age"]), json_values),
        "schedules": st.lists(json_values, max_size=2),
        "version": json_values,
    },
)
texts = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300),
    st.sampled_from(HOSTILE_YAML),
    documents.map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    documents.map(lambda d: json.dumps(d)),
    st.tuples(documents, st.integers(0, 200)).map(lambda t: yaml.safe_dump(t[0])[: t[1]]),
)


@contextlib.contextmanager
def served(settings: Settings) -> Iterator[httpx.Client]:
    """A real API server with its own engine on an event loop in a thread of its own (the
    hypothesis examples run synchronously in the test's thread)."""
    ready: list[tuple[str, str]] = []
    up = threading.Event()
    failed: list[BaseException] = []
    stopping: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def serve() -> None:
        async with Engine.open(settings, migrate=False, start_queue=False) as engine:
            for automation_id in ("signed", "open"):
                await engine.publish(
                    {
                        "id": automation_id,
                        "steps": [{"id": "a", "kind": "set", "with": {"values": {"ok": "true"}}}],
                    }
                )
            await engine.add_hook_secret("signed", SECRET)
            key = await api_key(engine)
            app = create_app(engine)
            async with ApiServer(app, port=0, log_level="warning", access_log=False) as api:
                stop = asyncio.Event()
                stopping.append((asyncio.get_running_loop(), stop))
                ready.append((api.url, key))
                up.set()
                await stop.wait()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            failed.append(exc)
            up.set()

    thread = threading.Thread(target=run, name="fuzzed-api")
    thread.start()
    try:
        up.wait(30)
        assert ready, failed
        url, key = ready[0]
        with httpx.Client(base_url=url, timeout=30, headers=auth(key)) as client:
            yield client
    finally:
        for loop, stop in stopping:
            loop.call_soon_threadsafe(stop.set)
        thread.join(30)
    assert not failed, failed


def assert_answered(reply: Any, allowed: set[int]) -> None:
    assert reply.status_code in allowed, (reply.status_code, reply.text[:300])
    if reply.status_code >= 400:
        body = reply.json()
        assert isinstance(body["error"], str) and body["detail"], body


def test_the_webhook_route_never_answers_500(settings: Settings) -> None:
    seen: set[int] = set()
    with served(dataclasses.replace(settings, queue="none", intake_limit=0)) as client:

        @FUZZ
        @given(
            automation=st.sampled_from(["signed", "open", "nope"]),
            body=bodies,
            headers=st.dictionaries(
                st.sampled_from(
                    ["webhook-id", "webhook-timestamp", "webhook-signature", "X-Event-Id"]
                ),
                header_text,
                max_size=4,
            ),
            sign=st.sampled_from([None, 0, -400, 400]),
        )
        def deliver(
            automation: str, body: bytes, headers: dict[str, str], sign: int | None
        ) -> None:
            sent = {"content-type": "application/json", **headers}
            try:
                text = body.decode()
            except UnicodeDecodeError:
                sign = None
            if sign is not None:
                when = datetime.now(UTC) + timedelta(seconds=sign)
                msg_id = headers.get("webhook-id") or "fuzz"
                sent |= {
                    "webhook-id": msg_id,
                    "webhook-timestamp": str(int(when.timestamp())),
                    "webhook-signature": Webhook(SECRET).sign(msg_id, when, text),
                }
            reply = client.post(f"/v1/hooks/{automation}", content=body, headers=sent)
            assert_answered(reply, {200, 202, 401, 404, 413, 422})
            seen.add(reply.status_code)
            if automation == "signed" and reply.status_code in (200, 202):
                assert sign == 0  # only a signature within the tolerance gets in

        deliver()
    assert {202, 401, 404, 422} <= seen, seen  # the run reached past each check


def test_the_document_loader_never_raises_anything_but_invalid_automation(
    settings: Settings,
) -> None:
    parsed: list[bool] = []
    with served(dataclasses.replace(settings, queue="none")) as client:

        @FUZZ
        @given(text=texts)
        def load(text: str | bytes) -> None:
            raw = text.encode() if isinstance(text, str) else text
            try:
                document = parse_text(raw, source="fuzz")
            except InvalidAutomation as exc:
                assert exc.problems and all(isinstance(p, str) for p in exc.problems)
                document = None
            parsed.append(document is not None)
            as_yaml = client.post(
                "/v1/automations", content=raw, headers={"content-type": "application/yaml"}
            )
            assert_answered(as_yaml, {200, 201, 413, 422})
            if document is None:
                assert as_yaml.status_code in (413, 422)
                return
            as_json = client.post(
                "/v1/automations",
                content=json.dumps(document, default=str).encode(),
                headers={"content-type": "application/json"},
            )
            assert_answered(as_json, {200, 201, 413, 422})

        load()
    assert any(parsed) and not all(parsed), parsed  # both sides of the loader were reached
