"""API keys for tests that call the HTTP API: every route but the health probe, the
documentation and the signed provider callbacks needs one (``onward.api.scopes``).

    key = await api_key(engine)  # admin; or api_key(engine, "runs:read")
    async with httpx.AsyncClient(base_url=api.url, headers=auth(key)) as client:
        ...

A provider that can only be given a URL (the sandbox's inbound email, say) gets the key as the
URL's Basic user info: ``onward.api_keys.with_key(url, key)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onward.engine import Engine


async def api_key(engine: Engine, *scopes: str, name: str = "test") -> str:
    """A new live key of ``engine``'s organisation holding ``scopes`` (default ``admin``)."""
    _, key = await engine.create_key(name, list(scopes) or ["admin"])
    return key


def auth(key: str) -> dict[str, str]:
    """The request headers that present ``key``: ``Authorization: Bearer <key>``."""
    return {"Authorization": f"Bearer {key}"}
