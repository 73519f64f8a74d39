"""The HTTP API (B2): start runs by webhook, publish automations, list and inspect runs.

``create_app(engine)`` serves an engine that is already open (``onward up``, ``onward api``,
tests); ``app_from_env`` is a uvicorn factory that opens its own engine from ``ONWARD_*``
(``uvicorn --factory onward.api.app:app_from_env``).

The webhook (``POST /v1/hooks/{automation_id}``): the JSON body is the run's input. Providers
deliver at least once, so every run has a start key and a second delivery is answered as a
duplicate, never as an error (R1). The start key comes from, in this order:

1. the ``X-Event-Id`` header -- the provider's event id (your adapter copies it there);
2. the ``Idempotency-Key`` header -- the usual HTTP convention, same meaning;
3. a top-level ``event_id`` field of the body (string or integer);
4. otherwise a sha256 hash of the body. This is **weaker**: two genuinely separate
   submissions with identical content collapse into one run. The answer says which kind of
   key was used (``start_key_kind``: ``event`` or ``payload_hash``).

Answers: ``202 {run_id, created: true, duplicate: false}`` for a new run;
``200 {run_id, created: false, duplicate: true}`` for a repeated delivery (same run id);
``404`` unknown automation; ``413`` payload over ``ONWARD_MAX_PAYLOAD_BYTES``; ``422`` a body
that is not a JSON object or an event id longer than 256 characters.

Organisations: every request is served for the organisation :func:`current_org` resolves --
for now always the engine's (``ONWARD_ORG``); tenancy (an API key naming its organisation)
replaces that one function.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onward.api.models import (
    AutomationSummary,
    ErrorBody,
    Health,
    ProblemsBody,
    PublishAnswer,
    RunSummary,
    RunView,
    StartAnswer,
    StartRequest,
)
from onward.automations.document import parse_text
from onward.automations.versions import Published
from onward.automations.versions import Q as VERSIONS_Q
from onward.engine import Engine
from onward.errors import (
    InvalidAutomation,
    OnwardError,
    PayloadTooLarge,
    UnknownAutomation,
    UnknownRun,
)
from onward.start import Started, start_key_for

MAX_EVENT_ID = 256
EVENT_ID_HEADERS = ("x-event-id", "idempotency-key")

# -- the organisation of a request (the one place tenancy will change) ----------------------


async def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


async def current_org(engine: Annotated[Engine, Depends(get_engine)]) -> str:
    """The organisation this request acts for. Today: the engine's own (``ONWARD_ORG``)."""
    return engine.org_id


@dataclass(frozen=True)
class Org:
    """The engine seen from one organisation: what every route works through."""

    engine: Engine
    org_id: str

    def _check(self) -> None:
        # Engine methods act for engine.org_id; serving another organisation needs them to
        # take an org_id first (tenancy). Fail loudly rather than act for the wrong one.
        if self.org_id != self.engine.org_id:  # pragma: no cover - no tenancy yet
            raise RuntimeError(f"organisation {self.org_id!r} is not served by this engine")

    async def publish(self, document: dict[str, Any]) -> Published:
        self._check()
        return await self.engine.publish(document)

    async def start(self, automation_id: str, payload: dict[str, Any], **kw: Any) -> Started:
        self._check()
        return await self.engine.start(automation_id, payload, **kw)

    async def show(self, run_id: str) -> dict[str, Any]:
        self._check()
        return await self.engine.show(run_id)

    async def runs(self, **filters: Any) -> list[dict[str, Any]]:
        self._check()
        return await self.engine.runs(**filters)

    async def automations(self) -> list[dict[str, Any]]:
        async with self.engine.pool.connection() as conn:
            cur = await conn.execute(VERSIONS_Q.list_automations, {"org_id": self.org_id})
            return list(await cur.fetchall())


async def get_org(
    engine: Annotated[Engine, Depends(get_engine)], org_id: Annotated[str, Depends(current_org)]
) -> Org:
    return Org(engine, org_id)


OrgDep = Annotated[Org, Depends(get_org)]

# -- request bodies --------------------------------------------------------------------------


def body_limit(engine: Engine) -> int:
    """The most bytes any request body may have: a guard for memory, well above the payload
    limit (the exact limit applies to the input as stored, see ``start_run``)."""
    return max(4 * engine.settings.max_payload_bytes, 1024 * 1024)


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413 before they are read whole."""

    def __init__(self, app: ASGIApp, limit: Callable[[], int]) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                response = _error(413, "payload_too_large", str(PayloadTooLarge(int(value), limit)))
                await response(scope, receive, send)
                return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # a chunked body without Content-Length
                    raise HTTPException(413, str(PayloadTooLarge(seen, limit)))
            return message

        await self.app(scope, limited, send)


def _parse_json(raw: bytes, what: str) -> Any:
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HTTPException(422, f"{what} is not valid JSON: {exc}") from None


def event_id_of(request: Request, body: dict[str, Any]) -> str | None:
    for header in EVENT_ID_HEADERS:
        header_value = request.headers.get(header, "").strip()
        if header_value:
            return _checked_event_id(header_value, header)
    field = body.get("event_id")
    if isinstance(field, bool) or not isinstance(field, str | int):
        return None
    text = str(field).strip()
    return _checked_event_id(text, "event_id") if text else None


def _checked_event_id(value: str, where: str) -> str:
    if len(value) > MAX_EVENT_ID:
        raise HTTPException(422, f"{where}: an event id has at most {MAX_EVENT_ID} characters")
    return value


def _answer(started: Started, automation_id: str, payload: Any, **how: Any) -> StartAnswer:
    _, kind = start_key_for(automation_id, payload, how.get("event_id"), how.get("key"))
    return StartAnswer(
        run_id=started.run_id,
        created=started.created,
        duplicate=not started.created,
        start_key=started.start_key,
        start_key_kind=kind,
    )


# -- errors ----------------------------------------------------------------------------------


def _error(status: int, error: str, detail: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail, **extra}, status_code=status)


ERRORS: dict[type[OnwardError], tuple[int, str]] = {
    UnknownRun: (404, "unknown_run"),
    UnknownAutomation: (404, "unknown_automation"),
    PayloadTooLarge: (413, "payload_too_large"),
}
HTTP_ERRORS = {
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    422: "invalid",
}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(InvalidAutomation)
    async def invalid_automation(request: Request, exc: InvalidAutomation) -> JSONResponse:
        return _error(
            422,
            "invalid_automation",
            f"invalid automation: {len(exc.problems)} problem(s); nothing was stored",
            problems=exc.problems,
        )

    @app.exception_handler(OnwardError)
    async def onward_error(request: Request, exc: OnwardError) -> JSONResponse:
        for cls, (status, name) in ERRORS.items():
            if isinstance(exc, cls):
                return _error(status, name, str(exc))
        return _error(500, type(exc).__name__, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = _error(exc.status_code, HTTP_ERRORS.get(exc.status_code, "error"), exc.detail)
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(RequestValidationError)
    async def request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()]
        return _error(422, "invalid_request", "; ".join(problems), problems=problems)


NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody}}
TOO_LARGE: dict[int | str, dict[str, Any]] = {413: {"model": ErrorBody}}
INVALID: dict[int | str, dict[str, Any]] = {422: {"model": ErrorBody}}
JSON_OBJECT_BODY = {
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}

# -- the application -------------------------------------------------------------------------


def create_app(engine: Engine | None = None, *, lifespan: Any = None) -> FastAPI:
    """The API for an open engine (or for the engine ``lifespan`` puts in ``app.state``)."""
    app = FastAPI(
        title="onward",
        version="0.1.0",
        summary="A durable workflow engine: start runs by webhook, publish automations, "
        "inspect runs.",
        lifespan=lifespan,
    )
    if engine is not None:
        app.state.engine = engine
    app.add_middleware(BodyLimit, limit=lambda: body_limit(app.state.engine))
    _install_error_handlers(app)

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz(org: OrgDep, response: Response) -> Health:
        """The process is up and reaches its database."""
        try:
            async with org.engine.pool.connection(timeout=5.0) as conn:
                await conn.execute("SELECT 1")
        except Exception as exc:
            response.status_code = 503
            return Health(
                ok=False, database=f"unreachable: {type(exc).__name__}", org_id=org.org_id
            )
        return Health(ok=True, database="ok", org_id=org.org_id)

    # -- automations ---------------------------------------------------------------------

    @app.post(
        "/v1/automations",
        response_model=PublishAnswer,
        status_code=201,
        tags=["automations"],
        responses={
            200: {"model": PublishAnswer, "description": "Identical content: unchanged"},
            422: {"model": ProblemsBody, "description": "Invalid: nothing was stored"},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/yaml": {"schema": {"type": "string"}},
                },
            }
        },
    )
    async def publish_automation(request: Request, org: OrgDep, response: Response) -> Any:
        """Publish an automation document (JSON, or YAML with a ``yaml`` content type).

        201: a new immutable version. 200: identical content is already published (unchanged).
        422: the document is invalid; every problem is listed and nothing is stored."""
        raw = await request.body()
        if "yaml" in request.headers.get("content-type", ""):
            document: Any = parse_text(raw.decode("utf-8", "replace"), source="body")
        else:
            try:
                document = json.loads(raw) if raw.strip() else None
            except (ValueError, UnicodeDecodeError) as exc:
                raise InvalidAutomation([f"body: not valid JSON: {exc}"]) from None
        if not isinstance(document, dict):
            raise InvalidAutomation(["body: the document must be a JSON object with id and steps"])
        published = await org.publish(document)
        if not published.created:
            response.status_code = 200
        return PublishAnswer(
            automation_id=published.automation_id,
            version=published.version,
            digest=published.digest,
            created=published.created,
        )

    @app.get("/v1/automations", response_model=list[AutomationSummary], tags=["automations"])
    async def list_automations(org: OrgDep) -> Any:
        """Every published automation with its latest version."""
        return await org.automations()

    # -- starting runs -------------------------------------------------------------------

    @app.post(
        "/v1/hooks/{automation_id}",
        response_model=StartAnswer,
        status_code=202,
        tags=["runs"],
        responses={
            200: {"model": StartAnswer, "description": "A duplicate delivery: the same run"},
            **NOT_FOUND,
            **TOO_LARGE,
            **INVALID,
        },
        openapi_extra=JSON_OBJECT_BODY,
    )
    async def webhook(automation_id: str, request: Request, org: OrgDep, response: Response) -> Any:
        """Start a run from a webhook delivery; the JSON body is the run's input.

        Start key: header ``X-Event-Id``, else header ``Idempotency-Key``, else the body's
        ``event_id`` field, else a hash of the body (weaker: identical payloads collapse).
        202 for a new run, 200 with ``duplicate: true`` and the same run id for a repeat."""
        payload = _parse_json(await request.body(), "the body")
        if not isinstance(payload, dict):
            raise HTTPException(422, "the body must be a JSON object (the run's input)")
        event_id = event_id_of(request, payload)
        started = await org.start(automation_id, payload, event_id=event_id)
        if not started.created:
            response.status_code = 200
        return _answer(started, automation_id, payload, event_id=event_id)

    @app.post(
        "/v1/runs",
        response_model=StartAnswer,
        status_code=202,
        tags=["runs"],
        responses={
            200: {"model": StartAnswer, "description": "A duplicate start: the same run"},
            **NOT_FOUND,
            **TOO_LARGE,
            **INVALID,
        },
    )
    async def start(body: StartRequest, org: OrgDep, response: Response) -> Any:
        """Start a run with explicit fields. Start key: ``key``, else ``event_id``, else a
        hash of ``input`` (weaker). 202 for a new run, 200 for a duplicate."""
        started = await org.start(
            body.automation_id,
            body.input,
            event_id=body.event_id,
            key=body.key,
            version=body.version,
            contact_id=body.contact_id,
        )
        if not started.created:
            response.status_code = 200
        return _answer(
            started, body.automation_id, body.input, event_id=body.event_id, key=body.key
        )

    # -- inspecting runs -----------------------------------------------------------------

    @app.get("/v1/runs", response_model=list[RunSummary], tags=["runs"])
    async def list_runs(
        org: OrgDep,
        status: Annotated[str | None, Query(description="e.g. active, waiting, completed")] = None,
        automation: Annotated[str | None, Query(description="an automation id")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> Any:
        """Newest runs first."""
        return await org.runs(status=status, automation_id=automation, limit=limit)

    @app.get("/v1/runs/{run_id}", response_model=RunView, tags=["runs"], responses=NOT_FOUND)
    async def show_run(run_id: str, org: OrgDep) -> Any:
        """One run on one screen: the run, its steps and its ordered history (R17)."""
        return await org.show(run_id)

    # -- connections and consent (R14, R15) ---------------------------------------------------

    @app.post("/v1/connections", status_code=201, tags=["connections"])
    async def add_connection(body: ConnectionIn, org: OrgDep) -> dict[str, Any]:
        """Connect an account (or replace its credentials). The secret is never returned."""
        try:
            await org.engine.integrations.add_connection(
                org.org_id,
                body.connection_id,
                provider=body.provider,
                base_url=body.base_url,
                account=body.account,
                secret=body.secret,
            )
        except KeyError as exc:
            raise HTTPException(422, str(exc).strip("'\"")) from None
        return {"connection_id": body.connection_id, "provider": body.provider}

    @app.post("/v1/connections/{connection_id}/restore", tags=["connections"])
    async def restore_connection(connection_id: str, org: OrgDep) -> dict[str, Any]:
        """The account was reconnected: every run parked on it resumes from the same step."""
        resumed = await org.engine.integrations.restore(org.org_id, connection_id)
        return {"connection_id": connection_id, "resumed": [r["run_id"] for r in resumed]}

    @app.post("/v1/connections/{connection_id}/probe", tags=["connections"])
    async def probe_connection(connection_id: str, org: OrgDep) -> dict[str, Any]:
        """Check the connection ahead of time; a refused one is marked broken."""
        problem = await org.engine.integrations.probe(org.org_id, connection_id)
        return {"connection_id": connection_id, "healthy": problem is None, "problem": problem}

    @app.post("/v1/suppressions", status_code=201, tags=["consent"])
    async def suppress(body: SuppressionIn, org: OrgDep) -> dict[str, Any]:
        """Never contact this person on this channel again (checked at send time)."""
        await org.engine.integrations.suppress(org.org_id, body.contact, body.reason, body.channel)
        return {"contact": body.contact.lower(), "channel": body.channel}

    return app


class ConnectionIn(BaseModel):
    connection_id: str = Field(min_length=1, max_length=128)
    provider: str
    base_url: str
    account: str
    secret: str = Field(repr=False)


class SuppressionIn(BaseModel):
    contact: str = Field(min_length=1, max_length=320)
    reason: str = Field(min_length=1, max_length=500)
    channel: str = "email"


# -- a uvicorn factory -------------------------------------------------------------------------


def app_from_env() -> FastAPI:
    """``uvicorn --factory onward.api.app:app_from_env``: opens its own engine from ONWARD_*."""
    from onward.config import Settings

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with Engine.open(Settings.from_env(), start_queue=False) as engine:
            app.state.engine = engine
            yield

    return create_app(lifespan=lifespan)
