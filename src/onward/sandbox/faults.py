"""Fault injection for the sandbox providers: latency, 5xx, 429, revoked auth, lost responses.

Each provider has its own knobs (:class:`FaultKnobs`), set through ``POST /_admin/faults/{p}``.
A deterministic ``script`` is consumed one entry per provider request before the random rates
apply, so a test can say exactly "this request gets a 503, the next one a 429".

:class:`FaultInjector` is a raw ASGI wrapper around the FastAPI app rather than a Starlette
middleware, for one reason: to drop a connection *after* the work was done it needs uvicorn's own
``send`` callable (Starlette's error middleware would wrap it and answer 500 instead). Order for
every provider request: latency, auth (401 for a missing token or a revoked account), then the
fault decision, then the route.

It also measures (:class:`ConcurrencyMeter`): how many requests of each (provider, account)
are in progress at once -- from the moment the request reaches the fault layer, through its
injected latency and the route, until its handling ends -- and the peak since the last reset.
That is what a provider would see of an engine's concurrency caps.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onward.sandbox.common import PROVIDERS, bearer_token

Action = Literal["ok", "status", "drop_after_work", "hang_after_work"]


@dataclass(frozen=True)
class Decision:
    """What the fault layer does with one request."""

    action: Action
    status: int = 200


OK = Decision("ok")


def parse_script_entry(entry: str) -> Decision:
    """Parse ``"ok"``, ``"drop_after_work"``, ``"hang_after_work"`` or an error code (``"503"``)."""
    if entry == "ok":
        return OK
    if entry == "drop_after_work":
        return Decision("drop_after_work")
    if entry == "hang_after_work":
        return Decision("hang_after_work")
    if entry.isdigit() and 400 <= int(entry) <= 599:
        return Decision("status", int(entry))
    raise ValueError(
        f"unknown script entry {entry!r}: expected 'ok', 'drop_after_work', "
        "'hang_after_work' or an HTTP status code between 400 and 599"
    )


class FaultKnobs(BaseModel):
    """The complete fault configuration of one provider. Omitted knobs take their defaults."""

    model_config = ConfigDict(extra="forbid")

    latency_ms: float = Field(default=0, ge=0)
    error_rate: float = Field(default=0, ge=0, le=1)
    rate_limit_rate: float = Field(default=0, ge=0, le=1)
    retry_after_s: int = Field(default=1, ge=0)
    drop_after_work_rate: float = Field(default=0, ge=0, le=1)
    hang_s: float = Field(default=30, ge=0)
    script: list[str] = Field(default_factory=list)
    seed: int | None = None

    @field_validator("script")
    @classmethod
    def _script_entries_are_known(cls, script: list[str]) -> list[str]:
        for entry in script:
            parse_script_entry(entry)
        return script

    @model_validator(mode="after")
    def _rates_fit_in_one(self) -> FaultKnobs:
        # One random draw per request picks at most one fault, so the rates must partition [0, 1).
        if self.error_rate + self.rate_limit_rate + self.drop_after_work_rate > 1:
            raise ValueError("error_rate + rate_limit_rate + drop_after_work_rate must be <= 1")
        return self


class ProviderFaults:
    """The live fault state of one provider: its knobs, what is left of its script, its RNG."""

    def __init__(self, knobs: FaultKnobs | None = None) -> None:
        self.configure(knobs or FaultKnobs())

    def configure(self, knobs: FaultKnobs) -> None:
        self.knobs = knobs
        self._script: deque[Decision] = deque(parse_script_entry(e) for e in knobs.script)
        self._rng = random.Random(knobs.seed)

    def next_decision(self) -> Decision:
        if self._script:
            return self._script.popleft()
        k = self.knobs
        draw = self._rng.random()
        if draw < k.error_rate:
            return Decision("status", 503)
        draw -= k.error_rate
        if draw < k.rate_limit_rate:
            return Decision("status", 429)
        draw -= k.rate_limit_rate
        if draw < k.drop_after_work_rate:
            return Decision("drop_after_work")
        return OK

    def snapshot(self) -> dict[str, Any]:
        remaining = [d.action if d.action != "status" else str(d.status) for d in self._script]
        return {**self.knobs.model_dump(), "script_remaining": remaining}


class FaultBoard:
    """Fault knobs of every provider plus the set of revoked (provider, account) pairs."""

    def __init__(self) -> None:
        self.providers: dict[str, ProviderFaults] = {p: ProviderFaults() for p in PROVIDERS}
        self._revoked: set[tuple[str, str]] = set()

    def configure(self, provider: str, knobs: FaultKnobs) -> None:
        self.providers[provider].configure(knobs)

    def revoke(self, provider: str, account: str) -> None:
        self._revoked.add((provider, account))

    def restore(self, provider: str, account: str) -> None:
        self._revoked.discard((provider, account))

    def is_revoked(self, provider: str, account: str) -> bool:
        return (provider, account) in self._revoked

    def reset(self) -> None:
        for faults in self.providers.values():
            faults.configure(FaultKnobs())
        self._revoked.clear()

    def snapshot(self) -> dict[str, Any]:
        return {
            "providers": {p: f.snapshot() for p, f in self.providers.items()},
            "revoked": [{"provider": p, "account": a} for p, a in sorted(self._revoked)],
        }


class ConcurrencyMeter:
    """Requests in progress per (provider, account), now and at most since the last reset.
    Only touched from the event loop, so no locking."""

    def __init__(self) -> None:
        self._now: dict[tuple[str, str], int] = {}
        self._peak: dict[tuple[str, str], int] = {}

    def enter(self, provider: str, account: str) -> None:
        key = (provider, account)
        now = self._now.get(key, 0) + 1
        self._now[key] = now
        self._peak[key] = max(self._peak.get(key, 0), now)

    def leave(self, provider: str, account: str) -> None:
        key = (provider, account)
        now = self._now.get(key, 0) - 1
        if now > 0:
            self._now[key] = now
        else:
            self._now.pop(key, None)

    def reset(self) -> None:
        """Forget the peaks: from now on a peak counts from the requests still in progress (a
        request that began before the reset still ends after it)."""
        self._peak = dict(self._now)

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{provider: {account: {"peak": n, "now": m}}}`` for every pair seen since reset."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for (provider, account), peak in sorted(self._peak.items()):
            out.setdefault(provider, {})[account] = {
                "peak": peak,
                "now": self._now.get((provider, account), 0),
            }
        return out


def provider_of(path: str) -> str | None:
    """``/email/messages`` → ``email``; None for admin and unknown paths."""
    first = path.lstrip("/").split("/", 1)[0]
    return first if first in PROVIDERS else None


class FaultInjector:
    """ASGI wrapper that applies a provider's faults around the wrapped app."""

    def __init__(
        self, app: ASGIApp, board: FaultBoard, meter: ConcurrencyMeter | None = None
    ) -> None:
        self.app = app
        self.board = board
        self.meter = meter or ConcurrencyMeter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        provider = provider_of(scope["path"]) if scope["type"] == "http" else None
        if provider is None:
            await self.app(scope, receive, send)
            return
        account = bearer_token(Headers(scope=scope).get("authorization"))
        if account is None:  # nobody to count it for: answered 401 after the latency
            await self._handle(provider, account, scope, receive, send)
            return
        self.meter.enter(provider, account)
        try:
            await self._handle(provider, account, scope, receive, send)
        finally:
            self.meter.leave(provider, account)

    async def _handle(
        self, provider: str, account: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        faults = self.board.providers[provider]
        if faults.knobs.latency_ms:
            await asyncio.sleep(faults.knobs.latency_ms / 1000)

        if account is None or self.board.is_revoked(provider, account):
            await _drain_request_body(receive)
            await _unauthorized(provider, account)(scope, receive, send)
            return

        decision = faults.next_decision()
        if decision.action == "ok":
            await self.app(scope, receive, send)
        elif decision.action == "status":
            # Refused before any work: nothing reaches the route, nothing reaches the ledger.
            await _drain_request_body(receive)
            await _injected_error(decision.status, faults.knobs)(scope, receive, send)
        else:
            # Do the work (the route runs and writes the ledger), but throw the answer away.
            await self.app(scope, receive, _discard)
            if decision.action == "hang_after_work":
                await _wait_for_disconnect(receive, within_s=faults.knobs.hang_s)
            await _drop_connection(send, receive, hang_s=faults.knobs.hang_s)


async def _discard(message: Message) -> None:
    """A ``send`` that swallows the response the route produced."""


async def _drain_request_body(receive: Receive) -> None:
    # Read the body we are about to ignore, so the connection stays in a clean HTTP state.
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


async def _wait_for_disconnect(receive: Receive, *, within_s: float) -> None:
    """Wait until the client goes away (or ``within_s`` passes), without answering it."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within_s):
            while (await receive())["type"] != "http.disconnect":
                pass


async def _drop_connection(send: Send, receive: Receive, *, hang_s: float) -> None:
    """Close the TCP connection without sending a single byte of response.

    uvicorn passes its per-request cycle's bound ``send`` method to the app, and that cycle owns
    the transport. Closing it is what a crashed load balancer or a reset looks like to the client:
    ``httpx.RemoteProtocolError("Server disconnected without sending a response.")``. If a future
    server hides the transport, fall back to hanging for ``hang_s`` so the client times out.
    """
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if not isinstance(transport, asyncio.BaseTransport):
        await _wait_for_disconnect(receive, within_s=hang_s)
        return
    transport.close()
    # uvicorn marks the cycle disconnected on connection_lost; waiting for that stops it from
    # logging "returned without starting response" and writing a 500 into a closed socket.
    await _wait_for_disconnect(receive, within_s=5)


def _unauthorized(provider: str, account: str | None) -> JSONResponse:
    if account is None:
        body = {"error": "not_authed", "message": "missing bearer token"}
    else:
        body = {
            "error": "invalid_auth",
            "message": f"the {provider} access of account {account} was revoked",
            "provider": provider,
            "account": account,
        }
    return JSONResponse(
        body, status_code=401, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'}
    )


def _injected_error(status: int, knobs: FaultKnobs) -> JSONResponse:
    if status == 429:
        return JSONResponse(
            {"error": "rate_limited", "retry_after": knobs.retry_after_s},
            status_code=429,
            headers={"Retry-After": str(knobs.retry_after_s)},
        )
    error = "unavailable" if status == 503 else "injected_fault"
    return JSONResponse({"error": error, "status": status}, status_code=status)
