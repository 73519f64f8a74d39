"""An HTTP client that talks to the API in-process (``httpx.ASGITransport``), presenting an
admin API key of the engine's organisation unless told otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI

from onward.api import create_app
from onward.engine import Engine
from onward.testing import api_key, auth


@contextlib.asynccontextmanager
async def api_client(
    target: Engine | FastAPI,
    *,
    publish: dict[str, Any] | None = None,
    key: str | None = None,
    scopes: tuple[str, ...] = ("admin",),
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``create_app(engine)`` (or of the given app) whose every request presents
    ``key`` (default: a new key of the engine's organisation with ``scopes``, admin);
    ``publish`` is published through the engine first."""
    app = target if isinstance(target, FastAPI) else create_app(target)
    engine: Engine = app.state.engine
    if publish is not None:
        await engine.publish(publish)
    if key is None:
        key = await api_key(engine, *scopes)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://onward.test", headers=auth(key)
    ) as client:
        yield client
