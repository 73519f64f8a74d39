"""An HTTP client that talks to the API in-process (``httpx.ASGITransport``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI

from onward.api import create_app
from onward.engine import Engine


@contextlib.asynccontextmanager
async def api_client(
    target: Engine | FastAPI, *, publish: dict[str, Any] | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``create_app(engine)`` (or of the given app); ``publish`` is published
    through the engine first."""
    app = target if isinstance(target, FastAPI) else create_app(target)
    if publish is not None:
        await app.state.engine.publish(publish)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://onward.test") as client:
        yield client
