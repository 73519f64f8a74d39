"""The HTTP API (B2): start runs by webhook, publish automations, list and inspect runs.

``create_app(engine)`` serves an engine that is already open (``onward up``, ``onward api``,
tests); ``app_from_env`` is a uvicorn factory that opens its own engine from ``ONWARD_*``
(``uvicorn --factory onward.api.app:app_from_env``).

The webhook (``POST /v1/hooks/{automation_id}``): the JSON body is the run's input. Providers
deliver at least once, so every run has a start key and a second delivery is answered as a
duplicate, never as an error (R1). An automation given secrets (``onward.intake``) requires the
Standard Webhooks signature (401 otherwise); every organisation's intake is rate-limited (429
with ``Retry-After``). The start key comes from, in this order:

1. the ``webhook-id`` header -- the Standard Webhooks message id (verified on a signed endpoint);
2. the ``X-Event-Id`` header -- the provider's event id (your adapter copies it there);
3. the ``Idempotency-Key`` header -- the usual HTTP convention, same meaning;
4. a top-level ``event_id`` field of the body (string or integer);
5. otherwise a sha256 hash of the body. This is **weaker**: two genuinely separate
   submissions with identical content collapse into one run. The answer says which kind of
   key was used (``start_key_kind``: ``event`` or ``payload_hash``).

Answers: ``202 {run_id, created: true, duplicate: false}`` for a new run;
``200 {run_id, created: false, duplicate: true}`` for a repeated delivery (same run id);
``404`` unknown automation; ``413`` payload over ``ONWARD_MAX_PAYLOAD_BYTES``; ``422`` a body
that is not a JSON object, that PostgreSQL cannot store, or an event id longer than 256
characters; ``503`` with ``Retry-After`` while the database cannot be reached.

Errors: every error, whatever the status, is one JSON body (``ErrorBody``:
``{error, detail, problems?}``) -- unknown routes (404), methods (405, with an ``Allow`` header
naming every method of the path), bodies over the limit (413), invalid input (422), a database
that cannot be reached (503 with ``Retry-After``), and anything unexpected (500, logged).

A lost database connection (a PostgreSQL restart) is repeated once for reads, starts
(idempotent by their start key: a repeat of a start that did commit answers as the duplicate it
is, with the same run id) and publishes (idempotent by digest); other writes answer 503 and are
safe to send again.

Organisations and keys: every route but the health probe, the documentation and the signed
provider callbacks needs an API key (``Authorization: Bearer onw_...``, or HTTP Basic with the
key as user name or password) of one organisation, holding the scope the route needs
(``onward.api.scopes``); the request then acts for that organisation only, and what belongs to
another is answered exactly as what does not exist (404). A missing, wrong or revoked key is
401 with no detail about which; a key without the scope, 403. Provider callbacks name their
organisation in the path (``/v1/orgs/{org_id}/hooks/{automation_id}``, ``.../slack/...``) and
prove themselves by their signature instead.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import psycopg
from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import StringConstraints, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onward import api_keys, audit
from onward import intake as intake_ops
from onward.api import actions as action_routes
from onward.api import audit as audit_routes
from onward.api import cancel as cancel_routes
from onward.api import contacts as contact_routes
from onward.api import flow as flow_routes
from onward.api import hooks as hook_routes
from onward.api import keys as key_routes
from onward.api import metrics as metrics_routes
from onward.api import migrations as migration_routes
from onward.api import notify as notify_routes
from onward.api import outbound as outbound_routes
from onward.api import people as people_routes
from onward.api import retention as retention_routes
from onward.api import schedules as schedule_routes
from onward.api import scopes
from onward.api.models import (
    MAX_EVENT_ID,
    NO_NUL,
    AutomationSummary,
    ConnectionAnswer,
    ConnectionIn,
    ErrorBody,
    Health,
    ProbeAnswer,
    PublishAnswer,
    RestoreAnswer,
    RunSummary,
    RunView,
    StartAnswer,
    StartBatchAnswer,
    StartBatchItem,
    StartBatchRequest,
    StartRequest,
    SuppressionAnswer,
    SuppressionIn,
)
from onward.automations.document import ID_PATTERN, AutomationDoc, parse_text
from onward.automations.versions import Published, list_automations
from onward.db import RETRY_AFTER_SECONDS, read, write
from onward.engine import Engine
from onward.errors import (
    ActionRefused,
    ContactErased,
    DecisionRefused,
    IntakeLimited,
    InvalidAutomation,
    InvalidInput,
    MigrationRefused,
    OnwardError,
    PayloadTooLarge,
    SecretUnreadable,
    SignalRefused,
    SignatureRefused,
    Unavailable,
    UnknownApproval,
    UnknownAutomation,
    UnknownConnection,
    UnknownOperation,
    UnknownRun,
)
from onward.inputs import check_text, parse_json
from onward.start import Start, Started, start_key_kind

log = logging.getLogger("onward.api")
T = TypeVar("T")

# -- the organisation of a request: its API key (or a provider's signature) ----------------


async def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


EngineDep = Annotated[Engine, Depends(get_engine)]


@dataclass(frozen=True)
class Org:
    """The engine seen from one organisation: what every route works through. ``engine`` acts
    for ``org_id`` only (``Engine.for_org``). Reads (and the idempotent writes: start,
    publish) are repeated once after a lost connection; every database call answers
    ``Unavailable`` (503) while the database cannot be reached."""

    engine: Engine
    org_id: str

    async def read(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await read(self.engine.pool, fn)

    async def write(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await write(self.engine.pool, fn)

    async def publish(self, document: dict[str, Any]) -> Published:
        return await self.read(lambda: self.engine.publish(document))  # idempotent: digest

    async def start(self, automation_id: str, payload: dict[str, Any], **kw: Any) -> Started:
        return await self.read(lambda: self.engine.start(automation_id, payload, **kw))

    async def show(self, run_id: str) -> dict[str, Any]:
        return await self.read(lambda: self.engine.show(run_id))

    async def runs(self, **filters: Any) -> list[dict[str, Any]]:
        return await self.read(lambda: self.engine.runs(**filters))

    async def automations(self) -> list[dict[str, Any]]:
        return await self.read(lambda: list_automations(self.engine.pool, self.org_id))


UNAUTHORIZED_DETAIL = "a valid API key is required"
_bearer = HTTPBearer(
    auto_error=False,
    description="An API key (`onw_...`) of the organisation: `Authorization: Bearer <key>` "
    "(or HTTP Basic with the key as user name or password). Made by `onward keys create` or "
    "`POST /v1/keys`.",
)


def presented_key(authorization: str | None) -> str | None:
    """The key an ``Authorization`` header presents: ``Bearer <key>``, or HTTP Basic with the
    key as user name or password (what a provider that only knows Basic can send)."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return value or None
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return next((part for part in (user, password) if part.startswith(api_keys.PREFIX)), None)
    return None


async def get_org(
    request: Request,
    engine: EngineDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Org:
    """The organisation a request acts for, by the route's row in ``onward.api.scopes``: the
    org of its API key (401 with no detail for a missing, wrong or revoked key; 403 for a key
    without the scope), or for a signed callback the org its path names."""
    return await org_of(request, engine)


async def org_of(request: Request, engine: Engine) -> Org:
    """``get_org`` called directly (the webhook routes: no dependency to solve)."""
    need = scopes.needed(request)
    if need in (scopes.SIGNED, scopes.PUBLIC):
        org_id = request.path_params.get("org_id") or engine.org_id
        audit.act_as(f"callback:{need}")
        return Org(engine.as_tenant(org_id), org_id)
    token = presented_key(request.headers.get("authorization"))
    principal = await read(engine.pool, lambda: engine.authenticate(token)) if token else None
    if principal is None:
        raise Refused(401, "unauthorized", UNAUTHORIZED_DETAIL, {"WWW-Authenticate": "Bearer"})
    if not principal.allows(need):
        raise Refused(403, "forbidden", f"this key does not have the scope {need}")
    audit.act_as(principal.actor)  # this request's audit actor
    return Org(engine.as_tenant(principal.org_id), principal.org_id)


OrgDep = Annotated[Org, Depends(get_org)]


async def get_callback_org(request: Request, engine: EngineDep) -> Org:
    """The organisation of a signed provider callback (``scopes.SIGNED``): the one its path
    names, else the engine's own. No key is asked for, and none is documented: the route checks
    the provider's signature itself before anything is stored."""
    assert scopes.needed(request) == scopes.SIGNED, "a callback route is SIGNED in the table"
    org_id = request.path_params.get("org_id") or engine.org_id
    audit.act_as("callback")
    return Org(engine.as_tenant(org_id), org_id)


CallbackOrgDep = Annotated[Org, Depends(get_callback_org)]

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


class CatchAll:
    """The last line: an exception no handler took is logged and answered as a JSON 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            log.exception("internal error serving %s %s", scope.get("method"), scope.get("path"))
            if started:  # too late for an answer of our own
                raise
            detail = "an internal error; it was logged and nothing more can be said here"
            await _error(500, "internal", detail)(scope, receive, send)


class JsonRequest(Request):
    """A request whose JSON body is parsed by ``onward.inputs.parse_json``: what PostgreSQL
    cannot store (deep nesting, NUL, lone surrogates, NaN, 1e400) is a 422, never a 500."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = parse_json(await self.body(), "body")
            except InvalidInput as exc:
                raise Refused(422, "invalid_input", str(exc)) from None
        return self._json


class JsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive))

        return route


def event_id_of(headers: dict[str, str | None], body: dict[str, Any]) -> str | None:
    for header, value in headers.items():
        text = (value or "").strip()
        if text:
            return _checked_event_id(text, header)
    field = body.get("event_id")
    if isinstance(field, bool) or not isinstance(field, str | int):
        return None
    text = str(field).strip()
    return _checked_event_id(text, "event_id") if text else None


def _checked_event_id(value: str, where: str) -> str:
    if len(value) > MAX_EVENT_ID:
        raise InvalidInput(f"{where}: an event id has at most {MAX_EVENT_ID} characters")
    return check_text(value, where)


def _answer(started: Started, **how: Any) -> StartAnswer:
    return StartAnswer(
        run_id=started.run_id,
        created=started.created,
        duplicate=not started.created,
        start_key=started.start_key,
        start_key_kind=start_key_kind(how.get("event_id"), how.get("key")),
    )


# -- errors ----------------------------------------------------------------------------------


class Refused(HTTPException):
    """An HTTP error with its own ``error`` name."""

    def __init__(
        self, status: int, error: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status, detail, headers)
        self.error = error


def _error(status: int, error: str, detail: str, **extra: Any) -> JSONResponse:
    body = ErrorBody(error=error, detail=detail, **extra)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status)


def _unavailable(detail: str, retry_after: float) -> JSONResponse:
    response = _error(503, "unavailable", detail)
    response.headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return response


ERRORS: dict[type[OnwardError], tuple[int, str]] = {
    UnknownRun: (404, "unknown_run"),
    UnknownAutomation: (404, "unknown_automation"),
    UnknownConnection: (404, "unknown_connection"),
    UnknownApproval: (404, "unknown_approval"),
    UnknownOperation: (404, "unknown_operation"),
    MigrationRefused: (422, "migration_refused"),
    ActionRefused: (409, "action_refused"),
    PayloadTooLarge: (413, "payload_too_large"),
    SignalRefused: (409, "signal_refused"),
    ContactErased: (409, "contact_erased"),
    DecisionRefused: (409, "decision_refused"),
    InvalidInput: (422, "invalid_input"),
    SignatureRefused: (401, "unauthorized"),
    IntakeLimited: (429, "rate_limited"),
    SecretUnreadable: (409, "secret_unreadable"),
}
HTTP_ERRORS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    422: "invalid_request",
    429: "rate_limited",
}


def _flat(routes: list[Any]) -> list[Any]:
    """The routes, with those of included routers (``original_router``) in their place."""
    out: list[Any] = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        out.extend(_flat(inner.routes) if inner is not None else [route])
    return out


def allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette names only the first route's).
    A path with a route of its own (``/v1/runs/cancel``) names that route's methods, not those
    of a templated route it also fits (``/v1/runs/{run_id}``)."""
    matching = [
        route
        for route in _flat(request.app.router.routes)
        if route.matches(request.scope)[0] is not Match.NONE
    ]
    exact = [r for r in matching if "{" not in getattr(r, "path", "{")]
    methods: set[str] = set()
    for route in exact or matching:
        methods |= getattr(route, "methods", None) or set()
    order = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    return ", ".join(sorted(methods, key=lambda m: (order.index(m) if m in order else 99, m)))


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(InvalidAutomation)
    async def invalid_automation(request: Request, exc: InvalidAutomation) -> JSONResponse:
        return _error(
            422,
            "invalid_automation",
            f"invalid automation: {len(exc.problems)} problem(s); nothing was stored",
            problems=exc.problems,
        )

    @app.exception_handler(Unavailable)
    async def unavailable(request: Request, exc: Unavailable) -> JSONResponse:
        return _unavailable(str(exc), exc.retry_after)

    @app.exception_handler(psycopg.OperationalError)
    async def database_error(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
        # a lost connection outside the read/write helpers, or a pool timeout
        log.warning("database error serving %s %s: %s", request.method, request.url.path, exc)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return _unavailable(f"the database cannot be reached: {reason}", RETRY_AFTER_SECONDS)

    @app.exception_handler(OnwardError)
    async def onward_error(request: Request, exc: OnwardError) -> JSONResponse:
        for cls, (status, name) in ERRORS.items():
            if isinstance(exc, cls):
                if isinstance(exc, MigrationRefused):  # every reason, one a line
                    return _error(status, name, str(exc), problems=exc.problems)
                if isinstance(exc, IntakeLimited):
                    response = _error(status, name, str(exc))
                    response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
                    return response
                return _error(status, name, str(exc))
        raise exc  # not the caller's fault: CatchAll logs it and answers 500

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        name = getattr(exc, "error", None) or HTTP_ERRORS.get(exc.status_code, "error")
        response = _error(exc.status_code, name, str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            response.headers["Allow"] = allowed_methods(request)
        return response

    @app.exception_handler(RequestValidationError)
    async def request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()]
        return _error(422, "invalid_request", "; ".join(problems), problems=problems)


ERROR_DESCRIPTIONS = {
    401: "Not authenticated: no valid API key (or, on a callback, the signature does not hold)",
    403: "The API key does not have the scope this route needs",
    404: "No such resource",
    409: "Refused in the state the resource is in (recorded); the detail says why",
    413: "The body is larger than the limit; nothing was stored",
    422: "The request cannot be accepted as sent; nothing was stored",
    429: "Too many requests from this organisation in the window; nothing was stored. "
    "Try again after Retry-After seconds",
    500: "An internal error (logged)",
    503: "The database cannot be reached; nothing was changed. Try again later",
}
RETRY_AFTER_HEADER = {
    "Retry-After": {
        "description": "seconds to wait before trying again",
        "required": True,
        "schema": {"type": "integer", "minimum": 1},
    }
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses: each status answers ``ErrorBody`` (503 with ``Retry-After``)."""
    answer: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        answer[status] = {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[status]}
        if status in (429, 503):
            answer[status]["headers"] = RETRY_AFTER_HEADER
    return answer


# What any route can answer: a body over the limit, invalid input, an internal error, a
# database that cannot be reached.
COMMON_ERRORS = _errors(401, 403, 413, 422, 500, 503)
NOT_FOUND = _errors(404)

NoNulPath = Annotated[str, Path(pattern=NO_NUL, max_length=256)]
AutomationIdPath = Annotated[str, Path(pattern=ID_PATTERN)]
ConnectionIdPath = Annotated[str, Path(pattern=ID_PATTERN)]
OrgIdPath = Annotated[str, Path(pattern=NO_NUL, min_length=1, max_length=256)]
TraceparentHeader = Annotated[
    str | None,
    Header(
        alias="traceparent",
        description="W3C trace context: the run's steps continue this trace (onward.tracing); "
        "a malformed value is ignored",
    ),
]


@dataclass(frozen=True)
class Declared:
    """A parameter the webhook routes read themselves (``hook_params``) rather than declare:
    text of ``shortest`` to ``longest`` characters matching ``pattern`` (None: any). What its
    OpenAPI entry and a refusal say are what FastAPI's own would for the declared parameter."""

    name: str
    where: str  # "path" (required) or "header" (optional)
    description: str | None = None
    longest: int | None = MAX_EVENT_ID
    shortest: int | None = None
    pattern: str | None = NO_NUL

    def parameter(self) -> dict[str, Any]:
        text: dict[str, Any] = {"type": "string"}
        if self.longest is not None:
            text["maxLength"] = self.longest
        if self.shortest is not None:
            text["minLength"] = self.shortest
        if self.pattern is not None:
            text["pattern"] = self.pattern
        if self.where == "path":
            title = self.name.replace("_", " ").title()
            return {
                "name": self.name,
                "in": "path",
                "required": True,
                "schema": {**text, "title": title},
            }
        schema = {
            "anyOf": [text, {"type": "null"}],
            "description": self.description,
            "title": self.name if self.name[0].isupper() else self.name.title(),
        }
        return {
            "name": self.name,
            "in": "header",
            "required": False,
            "schema": schema,
            "description": self.description,
        }

    def problem(self, value: str) -> dict[str, Any] | None:
        """The validation error (as FastAPI's own) of a value this parameter does not take."""
        if (
            (self.longest is None or len(value) <= self.longest)
            and (self.shortest is None or len(value) >= self.shortest)
            and (self.pattern is None or _pattern(self.pattern).match(value) is not None)
        ):
            return None
        adapter = _declared_adapters.get(self)
        if adapter is None:
            constraints = StringConstraints(
                min_length=self.shortest, max_length=self.longest, pattern=self.pattern
            )
            adapter = TypeAdapter(Annotated[str, constraints])
            _declared_adapters[self] = adapter
        try:
            adapter.validate_python(value)
        except ValidationError as exc:
            err = dict(exc.errors()[0])
            err["loc"] = (self.where, self.name)
            return err
        return None  # pragma: no cover - the quick check and the adapter agree


_declared_adapters: dict[Declared, TypeAdapter[str]] = {}


@functools.cache
def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


#: the headers of ``POST /v1/hooks/{automation_id}`` and its signed twin, in the order their
#: parameters are documented (read by hook_params)
HOOK_HEADERS = (
    Declared("X-Event-Id", "header", "the provider's event id: the start key"),
    Declared("Idempotency-Key", "header", "the same, by the usual HTTP name (X-Event-Id wins)"),
    Declared(
        "webhook-id",
        "header",
        "Standard Webhooks: the message id, the start key (first of all; verified when the "
        "endpoint requires a signature)",
    ),
    Declared(
        "webhook-timestamp",
        "header",
        "Standard Webhooks: seconds since the epoch (signed endpoints)",
    ),
    Declared(
        "webhook-signature",
        "header",
        "Standard Webhooks: `v1,<base64>` signatures, space-separated",
        longest=4096,
    ),
    Declared(
        "traceparent",
        "header",
        "W3C trace context: the run's steps continue this trace (onward.tracing); a malformed "
        "value is ignored",
        longest=None,
        pattern=None,
    ),
)
AUTOMATION_PATH = Declared("automation_id", "path", longest=None, pattern=ID_PATTERN)
ORG_PATH = Declared("org_id", "path", shortest=1)
_KEY_HEADERS = ("webhook-id", "X-Event-Id", "Idempotency-Key")  # the start key's, in order


@dataclass(frozen=True)
class HookRequest:
    """What a webhook route reads of its request, checked (``hook_params``)."""

    automation_id: str
    ids: dict[str, str | None]  # the start key's headers, in the order event_id_of takes them
    traceparent: str | None


def hook_params(request: Request) -> HookRequest:
    """The automation id (path), start-key headers and ``traceparent`` of a webhook request;
    422 ``invalid_request`` naming every path parameter and header it does not take (too long,
    NUL, not an id), as declared parameters would answer -- after the caller's organisation is
    known, as a declared parameter is checked after the route's dependencies."""
    path, headers = request.path_params, request.headers
    problems = []
    for param in (ORG_PATH, AUTOMATION_PATH):
        value = path.get(param.name)
        if value is not None and (problem := param.problem(value)) is not None:
            problems.append(problem)
    for header in HOOK_HEADERS:
        value = headers.get(header.name)
        if value is not None and (problem := header.problem(value)) is not None:
            problems.append(problem)
    if problems:
        raise RequestValidationError(problems)
    return HookRequest(
        path["automation_id"],
        {name: headers.get(name) for name in _KEY_HEADERS},
        headers.get("traceparent"),
    )


def _hook_openapi(body: dict[str, Any], *, signed: bool) -> dict[str, Any]:
    """A webhook route's OpenAPI additions: its body, its path parameters and headers (read by
    hook_params, not declared) and, unless it is signed instead, the API key it needs."""
    path = [ORG_PATH, AUTOMATION_PATH] if signed else [AUTOMATION_PATH]
    extra: dict[str, Any] = {
        **body,
        "parameters": [p.parameter() for p in (*path, *HOOK_HEADERS)],
    }
    if not signed:
        extra["security"] = [{"HTTPBearer": []}]
    return extra


def start_answer(started: Started, kind: str) -> Response:
    """A start's answer (``StartAnswer``), 202 for a new run, 200 for a duplicate, serialised
    here (the webhook's hot path: no response model to validate)."""
    body = {
        "run_id": started.run_id,
        "created": started.created,
        "duplicate": not started.created,
        "start_key": started.start_key,
        "start_key_kind": kind,
    }
    return Response(
        json.dumps(body, separators=(",", ":")).encode(),
        status_code=202 if started.created else 200,
        media_type="application/json",
    )


def _request_body(content: dict[str, Any], *, required: bool) -> dict[str, Any]:
    return {"requestBody": {"required": required, "content": content}}


# -- the application -------------------------------------------------------------------------


def create_app(engine: Engine | None = None, *, lifespan: Any = None) -> FastAPI:
    """The API for an open engine (or for the engine ``lifespan`` puts in ``app.state``)."""
    app = FastAPI(
        title="onward",
        version="0.1.0",
        summary="A durable workflow engine: start runs by webhook, publish automations, "
        "inspect runs.",
        description="Every error answers one JSON body, `ErrorBody`. Text that PostgreSQL "
        "cannot store (`\\u0000`, lone surrogates), `NaN`, numbers beyond a double and JSON "
        "nested deeper than 64 levels are refused with 422; nothing is stored. While the "
        "database cannot be reached every route answers 503 with `Retry-After`.",
        lifespan=lifespan,
        responses=COMMON_ERRORS,
        redirect_slashes=False,
    )
    app.router.route_class = JsonRoute
    from onward.api.timers import router as timers_router  # its routes use this module's

    app.include_router(timers_router)
    if engine is not None:
        app.state.engine = engine
    app.add_middleware(BodyLimit, limit=lambda: body_limit(app.state.engine))
    app.add_middleware(CatchAll)
    _install_error_handlers(app)

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz(engine: EngineDep) -> Health:
        """The process is up and reaches its database (503 with ``Retry-After`` if not). No
        key needed; ``org_id`` is the engine's own organisation (``ONWARD_ORG``)."""

        async def select_one() -> None:
            async with engine.pool.connection(timeout=5.0) as conn:
                await conn.execute("SELECT 1")

        await read(engine.pool, select_one)
        return Health(ok=True, database="ok", org_id=engine.org_id)

    # -- automations ---------------------------------------------------------------------

    @app.post(
        "/v1/automations",
        response_model=PublishAnswer,
        status_code=201,
        tags=["automations"],
        responses={200: {"model": PublishAnswer, "description": "Identical content: unchanged"}},
        openapi_extra=_request_body(
            {
                "application/json": {"schema": {"$ref": "#/components/schemas/AutomationDoc"}},
                "application/yaml": {
                    "schema": {"type": "string", "description": "the same document as YAML"}
                },
            },
            required=True,
        ),
    )
    async def publish_automation(request: Request, org: OrgDep, response: Response) -> Any:
        """Publish an automation document (JSON, or YAML with a ``yaml`` content type).

        201: a new immutable version. 200: identical content is already published (unchanged).
        422: the document is invalid -- its shape (the schema), or its graph (an unknown step
        kind, a transition to no step, bad CEL, an unreachable step: checks no schema can
        express); every problem is listed and nothing is stored."""
        raw = await request.body()
        if "yaml" in request.headers.get("content-type", ""):
            document: Any = parse_text(raw, source="body")
        else:
            try:
                document = parse_json(raw, "body") if raw.strip() else None
            except InvalidInput as exc:
                raise InvalidAutomation([str(exc)]) from None
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
    async def list_published(org: OrgDep) -> Any:
        """Every published automation with its latest version."""
        return await org.automations()

    # -- starting runs -------------------------------------------------------------------

    hook_responses: dict[int | str, dict[str, Any]] = {
        200: {"model": StartAnswer, "description": "A duplicate delivery: the same run"},
        **NOT_FOUND,
        **_errors(401, 429),
    }
    hook_body = _request_body(
        {"application/json": {"schema": {"type": "object", "description": "the run's input"}}},
        required=False,
    )

    async def take_hook(org: Org, request: Request, *, signed: bool) -> Response:
        settings = org.engine.settings
        pool, org_id = org.engine.pool, org.org_id
        headers = request.headers
        hook = hook_params(request)
        automation_id = hook.automation_id
        raw = await request.body()

        async def verify() -> None:
            await org.read(
                lambda: intake_ops.verify(
                    pool, org_id, automation_id, headers, raw, required=signed
                )
            )

        if signed:  # an unsigned caller must not spend the organisation's intake limit
            await verify()
        if settings.intake_limit > 0:
            # repeated once after a lost connection (a restart): counting a request twice in
            # its window only brings its limit a request nearer
            await org.read(org.engine.admit_intake)
        if not signed:
            await verify()
        payload = parse_json(raw, "body") if raw.strip() else {}
        if not isinstance(payload, dict):
            raise InvalidInput("body: must be a JSON object (the run's input)")
        event_id = event_id_of(hook.ids, payload)
        started = await org.start(
            automation_id, payload, event_id=event_id, traceparent=hook.traceparent
        )
        return start_answer(started, "event" if event_id else "payload_hash")

    # The two webhook routes read their path and headers from the request themselves
    # (hook_params) and answer a Response built here: no declared parameter, no dependency, no
    # response model for FastAPI to solve and serialise on every delivery -- the hot path of
    # intake. Their OpenAPI entries say what declared parameters would (_hook_openapi).
    @app.post(
        "/v1/hooks/{automation_id}",
        response_model=StartAnswer,
        status_code=202,
        tags=["runs"],
        responses=hook_responses,
        openapi_extra=_hook_openapi(hook_body, signed=False),
    )
    async def webhook(request: Request) -> Any:
        """Start a run from a webhook delivery, with an API key (``runs:write``); the JSON
        body is the run's input. For a provider that signs instead, see
        ``/v1/orgs/{org_id}/hooks/{automation_id}``.

        An endpoint given secrets (``/v1/automations/{automation_id}/hook-secrets``) requires
        the Standard Webhooks signature of the body's exact bytes under one of them as well:
        401 with no detail otherwise. Each organisation's intake is rate-limited: 429 with
        ``Retry-After``. Start key: header ``webhook-id``, else ``X-Event-Id``, else
        ``Idempotency-Key``, else the body's ``event_id`` field, else a hash of the body
        (weaker: identical payloads collapse). 202 for a new run, 200 with ``duplicate: true``
        and the same run id for a repeat."""
        org = await org_of(request, request.app.state.engine)
        return await take_hook(org, request, signed=False)

    @app.post(
        "/v1/orgs/{org_id}/hooks/{automation_id}",
        response_model=StartAnswer,
        status_code=202,
        tags=["runs"],
        responses=hook_responses,
        openapi_extra=_hook_openapi(hook_body, signed=True),
    )
    async def signed_webhook(request: Request) -> Any:
        """A provider's webhook to the organisation ``org_id``: no API key, the Standard
        Webhooks signature instead -- the endpoint must have secrets
        (``/v1/automations/{automation_id}/hook-secrets``) and the request must be signed by
        one of them (401 with no detail otherwise, before anything is counted or stored).
        Otherwise as ``/v1/hooks/{automation_id}``; the verified ``webhook-id`` is the start
        key."""
        org = await get_callback_org(request, request.app.state.engine)
        return await take_hook(org, request, signed=True)

    @app.post(
        "/v1/runs",
        response_model=StartAnswer,
        status_code=202,
        tags=["runs"],
        responses={
            200: {"model": StartAnswer, "description": "A duplicate start: the same run"},
            **NOT_FOUND,
            **_errors(409),
        },
    )
    async def start(
        body: StartRequest, org: OrgDep, response: Response, traceparent: TraceparentHeader = None
    ) -> Any:
        """Start a run with explicit fields. Start key: ``key``, else ``event_id``, else a
        hash of ``input`` (weaker). 202 for a new run, 200 for a duplicate; 409
        ``contact_erased`` when ``contact_id`` names an erased contact (nothing started)."""
        started = await org.start(
            body.automation_id,
            body.input,
            event_id=body.event_id,
            key=body.key,
            version=body.version,
            contact_id=body.contact_id,
            traceparent=traceparent,
        )
        if not started.created:
            response.status_code = 200
        return _answer(started, event_id=body.event_id, key=body.key)

    @app.post(
        "/v1/runs:batch",
        response_model=StartBatchAnswer,
        tags=["runs"],
        responses={**NOT_FOUND, **_errors(409)},
    )
    async def start_batch(
        body: StartBatchRequest, org: OrgDep, traceparent: TraceparentHeader = None
    ) -> Any:
        """Start 1 to 1,000 runs in one statement and one commit. Each item is what
        ``POST /v1/runs`` takes and gets its own start key and answer (``index``, ``run_id``,
        ``created``), in request order; a key that has a run already -- or that an earlier item
        of the batch used -- answers that run, ``created`` false. The batch is whole or
        nothing: an invalid item (422), one naming no published automation or version (404
        ``unknown_automation``) or an erased contact (409 ``contact_erased``) starts nothing,
        and the error's detail names the item (``starts[i]: ...``). ``traceparent`` applies to every run."""
        starts = [
            Start(s.automation_id, s.input, s.event_id, s.key, s.version, s.contact_id)
            for s in body.starts
        ]
        answers = await org.read(lambda: org.engine.start_many(starts, traceparent=traceparent))
        items = [
            StartBatchItem(
                index=i,
                run_id=a.run_id,
                created=a.created,
                duplicate=not a.created,
                start_key=a.start_key,
                start_key_kind=start_key_kind(s.event_id, s.key),
            )
            for i, (a, s) in enumerate(zip(answers, starts, strict=True))
        ]
        created = sum(a.created for a in answers)
        return StartBatchAnswer(started=items, created=created, duplicates=len(items) - created)

    # -- inspecting runs -----------------------------------------------------------------

    @app.get("/v1/runs", response_model=list[RunSummary], tags=["runs"])
    async def list_runs(
        org: OrgDep,
        status: Annotated[
            str | None,
            Query(pattern=NO_NUL, max_length=64, description="e.g. active, waiting, completed"),
        ] = None,
        automation: Annotated[
            str | None, Query(pattern=NO_NUL, max_length=256, description="an automation id")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> Any:
        """Newest runs first."""
        return await org.runs(status=status, automation_id=automation, limit=limit)

    @app.get("/v1/runs/{run_id}", response_model=RunView, tags=["runs"], responses=NOT_FOUND)
    async def show_run(run_id: NoNulPath, org: OrgDep) -> Any:
        """One run on one screen: the run, its steps and its ordered history."""
        return await org.show(run_id)

    # -- connections and consent (R14, R15) ---------------------------------------------------

    @app.post(
        "/v1/connections",
        response_model=ConnectionAnswer,
        status_code=201,
        tags=["connections"],
    )
    async def add_connection(body: ConnectionIn, org: OrgDep) -> Any:
        """Connect an account (or replace its credentials). The secret is never returned."""

        async def add() -> None:
            await org.engine.integrations.add_connection(
                org.org_id,
                body.connection_id,
                provider=body.provider,
                base_url=body.base_url,
                account=body.account,
                secret=body.secret,
            )

        try:
            await org.write(add)
        except KeyError as exc:  # a provider no connector serves
            raise InvalidInput(f"provider: {str(exc).strip(chr(39) + chr(34))}") from None
        return ConnectionAnswer(connection_id=body.connection_id, provider=body.provider)

    @app.post(
        "/v1/connections/{connection_id}/restore",
        response_model=RestoreAnswer,
        tags=["connections"],
        responses=NOT_FOUND,
    )
    async def restore_connection(connection_id: ConnectionIdPath, org: OrgDep) -> Any:
        """The account was reconnected: every run parked on it resumes from the same step."""
        resumed = await org.write(
            lambda: org.engine.integrations.restore(org.org_id, connection_id)
        )
        return RestoreAnswer(connection_id=connection_id, resumed=[r["run_id"] for r in resumed])

    @app.post(
        "/v1/connections/{connection_id}/probe",
        response_model=ProbeAnswer,
        tags=["connections"],
        responses=NOT_FOUND,
    )
    async def probe_connection(connection_id: ConnectionIdPath, org: OrgDep) -> Any:
        """Check the connection ahead of time; a refused one is marked broken."""
        problem = await org.write(lambda: org.engine.integrations.probe(org.org_id, connection_id))
        return ProbeAnswer(connection_id=connection_id, healthy=problem is None, problem=problem)

    @app.post(
        "/v1/suppressions",
        response_model=SuppressionAnswer,
        status_code=201,
        tags=["consent"],
    )
    async def suppress(body: SuppressionIn, org: OrgDep) -> Any:
        """Never contact this person on this channel again (checked at send time)."""
        await org.write(
            lambda: org.engine.integrations.suppress(
                org.org_id, body.contact, body.reason, body.channel
            )
        )
        return SuppressionAnswer(contact=body.contact.lower(), channel=body.channel)

    app.include_router(schedule_routes.router())
    app.include_router(people_routes.router())
    app.include_router(flow_routes.router())
    app.include_router(migration_routes.router())
    app.include_router(contact_routes.router())
    app.include_router(action_routes.router())
    app.include_router(retention_routes.router())
    app.include_router(audit_routes.router())
    app.include_router(outbound_routes.router())
    app.include_router(notify_routes.router())
    app.include_router(cancel_routes.router())
    app.include_router(hook_routes.router())
    app.include_router(key_routes.router())
    from onward.console.pages import router as console_router  # pages at /, for people

    app.include_router(console_router())
    app.include_router(metrics_routes.router())
    _document_automation_schema(app)
    return app


def _document_automation_schema(app: FastAPI) -> None:
    """Put the automation document's JSON schema among the components, for the publish route."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            defs = AutomationDoc.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(defs.pop("$defs", {}))
            components["AutomationDoc"] = defs
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


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
