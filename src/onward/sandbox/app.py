"""Assembles the sandbox: one in-memory world, the provider routes, the admin routes, faults.

:func:`create_app` returns the ASGI app uvicorn serves. The admin routes (``/_admin/...``) are
never subject to faults or auth: they are how tests and the chaos runner steer the world. Neither
is Slack's ``response_url`` (``/slack/response/{ts}``), which real Slack serves without a token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from starlette.types import Receive, Scope, Send

from onward.sandbox import crm, email, hooks, model, payment, slack
from onward.sandbox.common import PROVIDERS, Account
from onward.sandbox.faults import ConcurrencyMeter, FaultBoard, FaultInjector, FaultKnobs
from onward.sandbox.ledger import Ledger


@dataclass
class World:
    """Everything one sandbox process knows. Reset wipes all of it."""

    ledger: Ledger = field(default_factory=Ledger)
    faults: FaultBoard = field(default_factory=FaultBoard)
    concurrency: ConcurrencyMeter = field(default_factory=ConcurrencyMeter)
    email: email.EmailStore = field(default_factory=email.EmailStore)
    crm: crm.CrmStore = field(default_factory=crm.CrmStore)
    slack: slack.SlackStore = field(default_factory=slack.SlackStore)
    hooks: hooks.HookStore = field(default_factory=hooks.HookStore)  # customers' receivers

    def reset(self) -> None:
        self.ledger.clear()
        self.faults.reset()
        self.concurrency.reset()
        self.email.reset()
        self.crm.reset()
        self.slack.reset()
        self.hooks.reset()


def get_world(request: Request) -> World:
    world: World = request.app.state.world
    return world


WorldDep = Annotated[World, Depends(get_world)]

admin = APIRouter(prefix="/_admin", tags=["admin"])


def _known_provider(provider: str) -> str:
    if provider not in PROVIDERS:
        raise HTTPException(404, detail=f"unknown provider {provider!r}; known: {list(PROVIDERS)}")
    return provider


@admin.get("/health")
async def health() -> dict[str, Any]:
    return {"ok": True, "providers": list(PROVIDERS)}


@admin.post("/reset")
async def reset(world: WorldDep) -> dict[str, bool]:
    world.reset()
    return {"ok": True}


@admin.get("/ledger")
async def ledger(
    world: WorldDep,
    provider: str | None = None,
    account: str | None = None,
    idempotency_key: str | None = None,
) -> dict[str, list[dict[str, Any]]]:
    entries = world.ledger.entries(
        provider=provider, account=account, idempotency_key=idempotency_key
    )
    return {"entries": [e.to_json() for e in entries]}


@admin.get("/concurrency")
async def concurrency(world: WorldDep) -> dict[str, dict[str, dict[str, int]]]:
    """Requests in progress per provider and account: ``{provider: {account: {"peak": n,
    "now": m}}}``, the peak since the last reset (latency included)."""
    return world.concurrency.snapshot()


@admin.get("/faults")
async def get_faults(world: WorldDep) -> dict[str, Any]:
    return world.faults.snapshot()


@admin.post("/faults/{provider}")
async def set_faults(provider: str, knobs: FaultKnobs, world: WorldDep) -> dict[str, Any]:
    world.faults.configure(_known_provider(provider), knobs)
    return world.faults.providers[provider].snapshot()


@admin.post("/accounts/{provider}/{account}/revoke")
async def revoke(provider: str, account: str, world: WorldDep) -> dict[str, Any]:
    world.faults.revoke(_known_provider(provider), account)
    return {"provider": provider, "account": account, "revoked": True}


@admin.post("/accounts/{provider}/{account}/restore")
async def restore(provider: str, account: str, world: WorldDep) -> dict[str, Any]:
    world.faults.restore(_known_provider(provider), account)
    return {"provider": provider, "account": account, "revoked": False}


whoami = APIRouter(tags=["auth"])


@whoami.get("/{provider}/me")
async def me(provider: str, account: Account) -> dict[str, str]:
    """The cheapest authenticated call of every provider: what connectors use to probe health."""
    return {"provider": _known_provider(provider), "account": account}


class SandboxApp:
    """The ASGI app: :class:`FaultInjector` around the FastAPI routes, sharing one World."""

    def __init__(self, world: World | None = None) -> None:
        self.world = world or World()
        self.api = FastAPI(title="onward sandbox providers", docs_url=None, redoc_url=None)
        self.api.state.world = self.world
        for router in (admin, email.router, crm.router, model.router, payment.router, slack.router):
            self.api.include_router(router)
        self.api.include_router(email.admin_router)
        self.api.include_router(slack.admin_router)
        self.api.include_router(hooks.router)  # a customer's webhook receiver: no auth, no faults
        self.api.include_router(hooks.admin_router)
        self.api.include_router(whoami)  # last: its /{provider}/me pattern must not shadow others
        self._asgi = FaultInjector(self.api, self.world.faults, self.world.concurrency)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(slack.RESPONSE_URL_PREFIX):
            # Slack's response_url takes no token: it bypasses the fault layer (auth and faults).
            await self.api(scope, receive, send)
            return
        await self._asgi(scope, receive, send)


def create_app(world: World | None = None) -> SandboxApp:
    """A fresh sandbox app (with a fresh world unless one is given)."""
    return SandboxApp(world)
