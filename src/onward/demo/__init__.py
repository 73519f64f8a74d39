"""``onward demo``: the whole engine in one process, on the embedded PostgreSQL by default.

It publishes the reference scenario ``demo-follow-up`` (``follow_up.yaml``), serves the API on
a free localhost port with an API key of its own (``runs:write``: the webhook deliveries present
it as ``Bearer``, the sandbox's inbound email as the URL's Basic user info), starts the
sandbox's providers, and drives one run through every part of
it (:mod:`onward.demo.follow_up`): the form's webhook delivered twice over real HTTP with the
same event id (the second answered as a duplicate with the same run id), the 09:00 wait (skipped
by an operator's command), the model draft, the CRM update, Sam's approval clicked in the
sandbox's Slack, the email, and Maya's reply through the inbound-email webhook. It runs the
worker, relay and sweeper in this process until the run finishes, and prints the run's
timeline. ``welcome.yaml`` is a smaller example of the built-in step kinds alone.

Given ``documents`` (``onward --app MODULE:ATTR demo``: the app's automations), it publishes
all of them in one transaction instead and runs the first, with ``payload`` as the webhook's
body (default ``{"name": "Maya"}``).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from onward.automations.document import AutomationDoc, parse_text
from onward.automations.versions import publish_all
from onward.config import Settings
from onward.engine import Engine
from onward.history import render_timeline

DEMO_FILE = "follow_up.yaml"


def demo_document(name: str = DEMO_FILE) -> dict[str, Any]:
    """The demo automation document shipped in this package."""
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    return parse_text(text, source=f"onward/demo/{name}")


def redact(url: str) -> str:
    """A database URL fit to print: no password."""
    parts = urlsplit(url)
    if parts.password:
        host = parts.hostname or ""
        netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


@dataclass
class DemoResult:
    run_id: str
    status: str
    seconds: float
    answers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    timeline: str = ""


async def run_demo(
    settings: Settings,
    *,
    out: Callable[[str], None] = print,
    name: str = "Maya",
    timeout: float = 45.0,
    documents: list[tuple[str, dict[str, Any] | AutomationDoc]] | None = None,
    payload: dict[str, Any] | None = None,
    prepare: Callable[[Engine], Awaitable[None]] | None = None,
) -> DemoResult:
    """Run the demo end to end; ``out`` receives each line to show. ``prepare`` runs once the
    automations are published (the CLI connects what ``onward.toml`` declares)."""
    from onward.api import ApiServer, create_app  # the API is only needed here

    began = time.monotonic()
    where = (
        redact(settings.database_url)
        if settings.database_url
        else f"embedded PostgreSQL in {settings.data_dir}"
    )
    out(f"onward demo -- database: {where}, queue: {settings.queue}")
    builtin = documents is None
    if documents is None:
        documents = [(f"onward/demo/{DEMO_FILE}", demo_document())]
    body = payload if payload is not None else {"name": name}
    if builtin:
        timeout = max(timeout, 60.0)
    async with Engine.open(settings) as engine:
        every = await publish_all(engine.pool, engine.org_id, documents, registry=engine.registry)
        for each in every:
            state = "new" if each.created else "unchanged"
            out(f"published {each.automation_id} version {each.version} ({state})")
        published = every[0]
        if prepare is not None:
            await prepare(engine)

        answers: list[tuple[int, dict[str, Any]]] = []
        key_row, key = await engine.create_key("demo", ["runs:write"], by="demo")
        api = ApiServer(
            create_app(engine), port=0, log_level="warning", access_log=False, graceful_seconds=2
        )
        async with engine.running(), api:
            out(f"API listening on {api.url}  (OpenAPI: {api.url}/docs)")
            out(f"API key {key_row['key_id']} (runs:write) made for the demo's calls")
            if builtin:
                from onward.demo.follow_up import run_follow_up

                run_id, answers = await run_follow_up(
                    settings, engine, api.url, key, out=out, payload=payload, timeout=timeout
                )
                status = await engine.status(run_id)
            else:
                run_id, answers, status = await _run_documents(
                    engine, api.url, key, published.automation_id, body, out, timeout
                )
        view = await engine.show(run_id)
    seconds = time.monotonic() - began
    timeline = render_timeline(view)
    out(timeline)
    variables = (view["run"].get("ctx") or {}).get("vars", {})
    result = variables.get("summary") or variables.get("outcome")
    if result:
        out(f"result: {result}")
    out(f"run {run_id} {status}; demo took {seconds:.1f}s")
    return DemoResult(run_id, status, seconds, answers, timeline)


async def _run_documents(
    engine: Engine,
    api_url: str,
    key: str,
    automation_id: str,
    body: dict[str, Any],
    out: Callable[[str], None],
    timeout: float,
) -> tuple[str, list[tuple[int, dict[str, Any]]], str]:
    """Deliver the first automation's webhook twice and run it until it finishes."""
    answers = await deliver_twice(api_url, key, automation_id, body, out, event_prefix="evt_demo")
    run_id = answers[0][1]["run_id"]
    out(f"running {run_id} ...")
    status = await engine.wait(run_id, timeout=timeout)
    return run_id, answers, status


async def deliver_twice(
    api_url: str,
    key: str,
    automation_id: str,
    body: dict[str, Any],
    out: Callable[[str], None],
    *,
    event_prefix: str,
) -> list[tuple[int, dict[str, Any]]]:
    """POST the automation's webhook twice with one event id, as a provider retrying would,
    with the API key ``key``; the second answer must name the same run (a duplicate)."""
    event_id = f"{event_prefix}_{secrets.token_hex(4)}"
    path = f"/v1/hooks/{automation_id}"
    answers: list[tuple[int, dict[str, Any]]] = []
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=api_url, timeout=30.0, headers=auth) as client:
        for delivery in (1, 2):
            reply = await client.post(path, json=body, headers={"X-Event-Id": event_id})
            answer = reply.json()
            answers.append((reply.status_code, answer))
            what = "duplicate" if answer.get("duplicate") else "created"
            out(
                f"delivery {delivery}: POST {path}  X-Event-Id: {event_id}"
                f"  -> {reply.status_code} {what}  {json.dumps(answer)}"
            )
            if reply.status_code >= 400:
                raise RuntimeError(f"the webhook refused the delivery: {answer}")
    if len({a["run_id"] for _, a in answers}) != 1:  # pragma: no cover - what R1 forbids
        raise RuntimeError("two deliveries of one event started two runs")
    return answers
