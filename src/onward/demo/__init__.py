"""``onward demo``: the whole engine in one process, on the embedded PostgreSQL by default.

It publishes ``welcome.yaml`` (built-in step kinds only: set, wait_for, branch, goto), serves
the API on a free localhost port, delivers the automation's start webhook twice over real
HTTP with the same event id (the second delivery is answered as a duplicate with the same run
id), runs the worker, relay and sweeper in this process until the run finishes, and prints the
run's timeline.

Given ``documents`` (``onward --app MODULE:ATTR demo``: the app's automations), it publishes
all of them in one transaction instead and runs the first, with ``payload`` as the webhook's
body (default ``{"name": "Maya"}``).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
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

DEMO_FILE = "welcome.yaml"


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
) -> DemoResult:
    """Run the demo end to end; ``out`` receives each line to show."""
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
    async with Engine.open(settings) as engine:
        every = await publish_all(engine.pool, engine.org_id, documents, registry=engine.registry)
        for each in every:
            state = "new" if each.created else "unchanged"
            out(f"published {each.automation_id} version {each.version} ({state})")
        published = every[0]

        answers: list[tuple[int, dict[str, Any]]] = []
        api = ApiServer(
            create_app(engine), port=0, log_level="warning", access_log=False, graceful_seconds=2
        )
        async with engine.running(), api:
            out(f"API listening on {api.url}  (OpenAPI: {api.url}/docs)")
            event_id = f"evt_demo_{secrets.token_hex(4)}"
            path = f"/v1/hooks/{published.automation_id}"
            async with httpx.AsyncClient(base_url=api.url, timeout=30.0) as client:
                for delivery in (1, 2):
                    reply = await client.post(path, json=body, headers={"X-Event-Id": event_id})
                    body = reply.json()
                    answers.append((reply.status_code, body))
                    what = "duplicate" if body.get("duplicate") else "created"
                    out(
                        f"delivery {delivery}: POST {path}  X-Event-Id: {event_id}"
                        f"  -> {reply.status_code} {what}  {json.dumps(body)}"
                    )
                    if reply.status_code >= 400:
                        raise RuntimeError(f"the webhook refused the delivery: {body}")
            run_ids = {body["run_id"] for _, body in answers}
            if len(run_ids) != 1:  # pragma: no cover - what R1 forbids
                raise RuntimeError(f"two deliveries of one event started {len(run_ids)} runs")
            run_id = run_ids.pop()
            how = " (a 2 s durable timer, then a loop that runs twice)" if builtin else ""
            out(f"running {run_id}{how} ...")
            status = await engine.wait(run_id, timeout=timeout)
        view = await engine.show(run_id)
    seconds = time.monotonic() - began
    timeline = render_timeline(view)
    out(timeline)
    summary = (view["run"].get("ctx") or {}).get("vars", {}).get("summary")
    if summary:
        out(f"result: {summary}")
    out(f"run {run_id} {status}; demo took {seconds:.1f}s")
    return DemoResult(run_id, status, seconds, answers, timeline)
