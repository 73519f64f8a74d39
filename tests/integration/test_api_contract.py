"""The OpenAPI document describes what the API does, and every error is one JSON body.

``test_schemathesis_finds_nothing`` runs schemathesis (every phase it runs in-process:
examples, coverage, fuzzing, stateful) over the ASGI app against a real engine on the test
database, with a fixed seed and a bounded number of examples, and asserts that no check fails:
no 5xx, every status documented, every body as documented (errors included), schema-valid
requests accepted, schema-invalid ones refused, ``Allow`` naming every method of a path.

Two choices of the run are deliberate, and documented in the API itself:

* ``allow-x00: false``: PostgreSQL cannot store ``\\u0000``; the schema says so for every text
  field it can (``pattern``), but the free-form run input cannot carry a pattern. Requests
  holding NUL are still sent as schema-invalid data (coverage, negative fuzzing) and must be
  refused with a 4xx.
* ``POST /v1/automations`` may answer 422 to a schema-valid document: the schema describes the
  document's shape; its graph (known step kinds, transitions to existing steps, valid CEL,
  reachable steps) is checked on publish and no JSON Schema can express it.
* the timers routes may answer 422 to a schema-valid request for the same reason: a rule is a
  small language (cron, RRULE, "09:00 on weekdays") and a zone an IANA name this process's tz
  database knows, both checked by ``onward.calendar``; and a recompute must say which timers
  (a run, a contact, an automation, or every organisation's, alone).
* ``POST /v1/signals`` may answer 422 to a schema-valid request: a signal names exactly one of
  ``run_id`` and ``correlation_key`` (the API says so; the schema keeps both optional); and 404
  when the run it names does not exist (no generator can know a run id).
* ``POST /v1/automations/{automation_id}/migrations`` may answer 422 to a schema-valid body:
  the versions and step ids it names must exist (and the map leave no reachable step
  unmapped); ``GET /v1/operations/{operation_id}`` answers 404 for an id nobody began.
* the operator actions (``POST /v1/runs/{run_id}/review``, ``/resume``, ``/fork``) may answer
  404 (no generator can know a run id), 409 (the action does not apply to the run as it is)
  and 422 (``happened`` without its reference, or a reference with another resolution).
* ``POST /v1/runs/cancel`` may answer 422 to a schema-valid filter: it must name at least one
  field (the schema keeps each optional); ``POST /v1/runs/{run_id}/cancel`` and ``GET
  /v1/operations/{operation_id}`` answer 404 for ids no generator can know.
* ``PUT /v1/limits/{key}`` may answer 422 to a schema-valid body: a rate needs both ``calls``
  and ``per_seconds``, and a limit needs a cap or a rate (the engine says which is missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events, from_schema
from schemathesis.python import asgi
from slack_sdk.signature import SignatureVerifier
from standardwebhooks.webhooks import Webhook

from onward.api import create_app
from onward.config import Settings
from onward.engine import Engine
from onward.errors import ConfigError
from onward.testing import api_key, auth
from tests.integration.api_client import api_client

EXAMPLES = 25
SEED = 20261201

CONFIG = {
    "seed": SEED,
    "workers": 1,
    "generation": {
        "max-examples": EXAMPLES,
        "deterministic": True,
        "database": "none",
        "allow-x00": False,
    },
    "checks": {"enabled": True},
    "operations": [
        {
            "include-name": name,
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "422"]}},
        }
        for name in (
            "POST /v1/automations",
            "GET /v1/timers/preview",
            "POST /v1/timers/recompute",
            # an allow-list entry is a CIDR, an address or a host name: other strings are 422
            "POST /v1/outbound/allow",
            "POST /v1/outbound/disallow",
        )
    ]
    + [
        {
            "include-name": "PUT /v1/limits/{key}",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "422"]}},
        },
        {
            "include-name": "PUT /v1/notification-destinations/{destination_id}",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "422"]}},
        },
        {
            "include-name": "POST /v1/notifications/{notification_id}/retry",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404"]}},
        },
        {
            "include-name": "POST /v1/runs/cancel",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "422"]}},
        },
        {
            "include-name": "POST /v1/runs/{run_id}/cancel",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404"]}},
        },
        {
            "include-name": "GET /v1/operations/{operation_id}",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404"]}},
        },
        {  # an automation no generator published: 404; a secret not whsec_<base64>: 422
            "include-name": "POST /v1/automations/{automation_id}/hook-secrets",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404", "422"]}},
        },
        {  # a secret id nobody added
            "include-name": "DELETE /v1/automations/{automation_id}/hook-secrets/{secret_id}",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404"]}},
        },
        {  # an endpoint given a secret by an earlier case refuses the unsigned: 401
            "include-name": "POST /v1/hooks/{automation_id}",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "401", "404"]}},
        },
        {
            "include-name": "POST /v1/signals",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404", "422"]}},
        },
        {
            # a migration names versions and steps no generator can know: refused with 422
            "include-name": "POST /v1/automations/{automation_id}/migrations",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "422"]}},
        },
        {  # an email that is not an address, a contact id of blanks: 422
            "include-name": "POST /v1/contacts/{contact_id}/erase",
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "422"]}},
        },
        {  # a generated contact id may be one an earlier case erased: 409 contact_erased
            "include-name": "POST /v1/runs",
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ["2xx", "404", "409", "422"]}
            },
        },
    ]
    + [
        {
            "include-name": name,
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ["2xx", "404", "409", "422"]}
            },
        }
        for name in (
            "POST /v1/runs/{run_id}/review",
            "POST /v1/runs/{run_id}/resume",
            "POST /v1/runs/{run_id}/fork",
        )
    ],
}


def app_with_its_own_engine(settings: Settings) -> FastAPI:
    """schemathesis calls the app from its own event loop: the engine is opened there."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with Engine.open(settings, migrate=False, start_queue=False) as engine:
            app.state.engine = engine
            yield

    return create_app(lifespan=lifespan)


# The signed callbacks, for which no API key counts: schemathesis sends them to one endpoint that
# has a hook secret and one Slack connection with a signing secret, and ``Signing`` -- the
# provider's part -- signs each request's exact bytes before the app sees them, so every phase
# runs past the signature check (a generated signature header would only ever be refused).
SIGNED_HOOK, SLACK_CONNECTION, SLACK_SECRET = "signed-flow", "slack", "8f14e45fceea167a5a36dedd"
SIGNED_PATHS = {
    f"/v1/orgs/test/hooks/{SIGNED_HOOK}": "webhook",
    f"/v1/orgs/test/slack/{SLACK_CONNECTION}/interactivity": "slack",
    f"/v1/slack/{SLACK_CONNECTION}/interactivity": "slack",
}
CALLBACKS = [
    {
        "include-name": "POST /v1/orgs/{org_id}/hooks/{automation_id}",
        "parameters": {"path.org_id": "test", "path.automation_id": SIGNED_HOOK},
        "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "422"]}},
    },
    {  # a click names an approval token no generator can know: 404, 409 or 422
        "include-name": "POST /v1/orgs/{org_id}/slack/{connection_id}/interactivity",
        "parameters": {"path.org_id": "test", "path.connection_id": SLACK_CONNECTION},
        "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404", "409", "422"]}},
    },
    {
        "include-name": "POST /v1/slack/{connection_id}/interactivity",
        "parameters": {"path.connection_id": SLACK_CONNECTION},
        "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404", "409", "422"]}},
    },
]


class Signing:
    """The providers' side of the signed callbacks: read the body as it will arrive, sign it
    (Standard Webhooks with the endpoint's secret, Slack v0 with the connection's), pass it on."""

    def __init__(self, app: Any, hook_secret: str) -> None:
        self.app, self.hook_secret = app, hook_secret
        self.signed = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = SIGNED_PATHS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if kind is None:
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            text = body.decode()
        except UnicodeDecodeError:  # no provider signs what is not text: left unsigned (401)
            text = None
        if any(len(v) > HEADER_LIMITS.get(k.lower(), 1 << 20) for k, v in scope["headers"]):
            # a schema-violating header (a negative case): the app must refuse it as it is
            await self.app(scope, _replay(body, receive), send)
            return
        headers = [h for h in scope["headers"] if not h[0].lower().startswith(SIGNED_NAMES)]
        now = datetime.now(UTC)
        if text is not None and kind == "webhook":
            msg_id = f"msg_{self.signed}"
            signature = Webhook(self.hook_secret).sign(msg_id, now, text)
            headers += [
                (b"webhook-id", msg_id.encode()),
                (b"webhook-timestamp", str(int(now.timestamp())).encode()),
                (b"webhook-signature", signature.encode()),
            ]
        elif text is not None:
            stamp = str(int(now.timestamp()))
            signature = SignatureVerifier(SLACK_SECRET).generate_signature(
                timestamp=stamp, body=text
            )
            headers += [
                (b"x-slack-request-timestamp", stamp.encode()),
                (b"x-slack-signature", signature.encode()),
            ]
        self.signed += text is not None
        await self.app({**scope, "headers": headers}, _replay(body, receive), send)


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


SIGNED_NAMES = (b"webhook-", b"x-slack-")
# the documented maximum of each signature header (longer: schema-violating, must be a 422)
HEADER_LIMITS = {
    b"webhook-id": 256,
    b"webhook-timestamp": 256,
    b"webhook-signature": 4096,
    b"x-slack-request-timestamp": 32,
    b"x-slack-signature": 256,
    b"x-slack-retry-num": 8,
}


async def prepare(settings: Settings) -> tuple[str, str]:
    """An admin key, and the signed endpoints: an automation with a hook secret, a Slack
    connection with a signing secret."""
    async with Engine.open(settings, migrate=False, start_queue=False) as engine:
        key = await api_key(engine)
        await engine.publish(
            {
                "id": SIGNED_HOOK,
                "steps": [{"id": "a", "kind": "set", "with": {"values": {"x": "1"}}}],
            }
        )
        hook = await engine.add_hook_secret(SIGNED_HOOK)
        await engine.integrations.add_connection(
            engine.org_id,
            SLACK_CONNECTION,
            provider="slack",
            base_url="http://127.0.0.1:9",
            account="T0",
            secret="xoxb-0",
            signing_secret=SLACK_SECRET,
        )
        return key, hook["secret"]


# hypothesis warns when an example it would print is over 50 kB (a large generated body); the
# suite turns warnings into errors, and schemathesis would report that as an error of the run
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
# a hang guard, not a time goal: the run is ~105 s of one core's CPU, which a shared 2-core
# machine beside the other test process stretched to 120-200 s of wall time (2026-12-05)
@pytest.mark.timeout(360)
def test_schemathesis_finds_nothing(settings: Settings) -> None:
    key, hook_secret = asyncio.run(prepare(settings))
    app = Signing(app_with_its_own_engine(dataclasses.replace(settings, queue="none")), hook_secret)
    config = SchemathesisConfig.from_dict(
        {**CONFIG, "headers": auth(key), "operations": CONFIG["operations"] + CALLBACKS}
    )
    failures: dict[tuple[str, str], str] = {}
    errors: list[str] = []
    phases: dict[str, Status] = {}
    checked: set[str] = set()
    try:
        schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
        for event in from_schema(schema).execute():
            if isinstance(event, events.ScenarioFinished | events.FuzzScenarioFinished):
                for case_id, nodes in event.recorder.checks.items():
                    case = event.recorder.cases[case_id].value
                    checked.add(case.operation.label)
                    for node in nodes:
                        if node.failure_info is not None:
                            failure = node.failure_info.failure
                            key = (failure.operation or "?", failure.title)
                            failures.setdefault(key, node.failure_info.code_sample)
            elif isinstance(event, events.NonFatalError | events.FatalError):
                errors.append(str(getattr(event, "value", None) or event.exception))
            elif isinstance(event, events.PhaseFinished):
                phases[event.phase.name.value] = event.status
    finally:
        asgi.shutdown_lifespans()  # closes the engine before the database is dropped
    assert not errors, errors
    assert not failures, "\n".join(
        f"{op}: {title}\n  {sample}" for (op, title), sample in failures.items()
    )
    for phase in ("examples", "coverage", "fuzzing", "stateful"):
        assert phases.get(phase) == Status.SUCCESS, phases
    operations = {
        f"{method.upper()} {path}"
        for path, item in schema.raw_schema["paths"].items()
        for method in item
    }
    assert checked == operations
    assert app.signed > 0  # the signed callbacks were reached with valid signatures


# -- the error model, by hand ------------------------------------------------------------------


@pytest.fixture
async def app(engine: Engine) -> FastAPI:
    app = create_app(engine)

    @app.get("/test-only/boom", include_in_schema=False)
    async def boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/test-only/misconfigured", include_in_schema=False)
    async def misconfigured() -> None:
        raise ConfigError("an OnwardError no status maps")

    return app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(app) as c:
        yield c


def error_body(reply: httpx.Response, status: int, error: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    body: dict[str, Any] = reply.json()
    assert body["error"] == error and isinstance(body["detail"], str) and body["detail"]
    assert set(body) <= {"error", "detail", "problems"}
    return body


async def test_unknown_routes_and_methods_answer_the_error_body(
    client: httpx.AsyncClient,
) -> None:
    error_body(await client.get("/v2/nothing"), 404, "not_found")
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        reply = await client.request(method, "/v1/automations")
        error_body(reply, 405, "method_not_allowed")
        assert reply.headers["Allow"] == "GET, POST"
        runs = await client.request(method, "/v1/runs")
        assert runs.headers["Allow"] == "GET, POST"
    hook = await client.get("/v1/hooks/greet")
    error_body(hook, 405, "method_not_allowed")
    assert hook.headers["Allow"] == "POST"
    slash = await client.get("/v1/runs/")  # no redirect: one answer, documented or 404
    error_body(slash, 404, "not_found")


async def test_an_unexpected_error_is_a_logged_json_500(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="onward.api")
    body = error_body(await client.get("/test-only/boom"), 500, "internal")
    assert "a bug" not in body["detail"]  # nothing of the inside leaks out
    assert "RuntimeError: a bug" in caplog.text and "/test-only/boom" in caplog.text
    error_body(await client.get("/test-only/misconfigured"), 500, "internal")
    assert "an OnwardError no status maps" in caplog.text


async def test_the_document_describes_the_real_shapes(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    error_ref = "#/components/schemas/ErrorBody"
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": error_ref}, (method, path, status)
            assert {"422", "500", "503"} <= set(operation["responses"]), (method, path)
            retry_after = operation["responses"]["503"]["headers"]["Retry-After"]
            assert retry_after["required"] is True
    components = spec["components"]["schemas"]
    assert "HTTPValidationError" not in components  # FastAPI's own 422 shape is not used
    document = components["AutomationDoc"]
    assert set(document["required"]) == {"id", "steps"}  # {} is documented as invalid
    assert document["properties"]["steps"]["minItems"] == 1
    provider = components["ConnectionIn"]["properties"]["provider"]
    assert "email" in provider["enum"] and "" not in provider["enum"]
    publish = spec["paths"]["/v1/automations"]["post"]["requestBody"]["content"]
    assert publish["application/json"]["schema"] == {"$ref": "#/components/schemas/AutomationDoc"}
    for path in ("/v1/runs/{run_id}", "/v1/hooks/{automation_id}"):
        operation = next(iter(spec["paths"][path].values()))
        assert "404" in operation["responses"], path
    for path in (
        "/v1/connections/{connection_id}/restore",
        "/v1/connections/{connection_id}/probe",
    ):
        assert "404" in spec["paths"][path]["post"]["responses"], path


async def test_an_empty_automation_and_an_empty_provider_are_refused_as_documented(
    client: httpx.AsyncClient,
) -> None:
    empty = await client.post("/v1/automations", json={})
    body = error_body(empty, 422, "invalid_automation")
    assert any("id" in p for p in body["problems"]) and any("steps" in p for p in body["problems"])
    connection = {
        "connection_id": "c1",
        "provider": "",
        "base_url": "http://127.0.0.1:9",
        "account": "a",
        "secret": "s",
    }
    refused = await client.post("/v1/connections", json=connection)
    assert "provider" in error_body(refused, 422, "invalid_input")["detail"]
