"""Generic JSON-over-HTTP connector, for providers without a dedicated connector.

Params: ``method`` (default POST), ``path`` (relative to the connection's base URL) or ``url``
(absolute, and then it must lie under the base URL), ``json`` (the body), ``query``,
``headers``, and ``idempotency_header`` (default ``Idempotency-Key``; set it to what the
provider expects, e.g. ``X-Request-Id``). The effect key is always sent in that header; whether
the far side dedups on it is the automation author's promise, which is why
``supports_idempotency`` is True here.

The connection's bearer token goes only to its own base URL. A path that would leave it is a
:class:`~onward.errors.PermanentError` before any request is made: an absolute URL elsewhere, a
scheme (``javascript:``, ``HTTP://``) or a scheme-relative ``//host``, ``..`` climbing above
the base path (also percent-encoded, also double-encoded), a backslash, an encoded ``/`` or
``\\`` inside a segment, control characters, a fragment. ``.`` and ``..`` that stay inside are
resolved here, so the server sees the path that was checked.

The result is the response's JSON object, or ``{"status_code", "body"}`` for anything else.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from onward.connectors.base import Connector
from onward.errors import PermanentError

# For a probe, any answer but refused credentials, rate limiting or a server error is healthy.
_PROBE_OK = frozenset(range(300, 500)) - {401, 403, 408, 425, 429}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_DECODE_ROUNDS = 4  # %252e%252e is ".." after two decodes; servers have decoded twice


def _unsafe_chars(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def _decoded(segment: str) -> str:
    for _ in range(_DECODE_ROUNDS):
        once = unquote(segment)
        if once == segment:
            break
        segment = once
    return segment


def url_under(base_url: str, path: str) -> str:
    """The absolute URL of ``path`` under ``base_url``, with dot segments resolved; raises
    :class:`~onward.errors.PermanentError` when ``path`` would leave the base URL."""
    base = base_url.rstrip("/")

    def refuse(why: str) -> PermanentError:
        return PermanentError(
            f"http.call refuses {path[:200]!r}: {why}; a path must stay under the connection's "
            f"base URL {base!r}",
            detail={"path": path[:500], "base_url": base},
        )

    rest = path
    if rest == base or rest.startswith((base + "/", base + "?")):
        rest = rest[len(base) :]  # an absolute URL under the base: keep what follows it
    elif _SCHEME.match(rest):
        raise refuse("an absolute URL or a scheme (start a relative path with '/')")
    if _unsafe_chars(rest):
        raise refuse("control characters")
    if "\\" in rest:
        raise refuse("a backslash")
    if rest.startswith("//"):
        raise refuse("a scheme-relative URL ('//host')")
    if "#" in rest:
        raise refuse("a fragment ('#')")
    raw, sep, query = rest.partition("?")
    kept: list[str] = []
    for segment in raw.split("/"):
        plain = _decoded(segment)
        if "/" in plain or "\\" in plain:
            raise refuse("an encoded '/' or '\\' inside a segment")
        if _unsafe_chars(plain):
            raise refuse("encoded control characters")
        if plain == "..":
            if not kept:
                raise refuse("'..' above the base path")
            kept.pop()
        elif plain not in ("", "."):
            kept.append(segment)
    trailing = "/" if kept and raw.endswith("/") else ""
    return f"{base}/{'/'.join(kept)}{trailing}{sep}{query}"


class HttpConnector(Connector):
    provider = "http"
    supports_idempotency = True
    supports_reconcile = False

    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        target = url_under(
            self.connection.base_url, str(params.get("url") or params.get("path") or "/")
        )
        header = str(params.get("idempotency_header") or self.idempotency_header)
        headers = {**(params.get("headers") or {}), header: idempotency_key}
        response = await self.request(
            str(params.get("method", "POST")),
            target,
            json=params.get("json"),
            params=params.get("query"),
            headers=headers,
        )
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        if isinstance(body, dict):
            return body
        return {"status_code": response.status_code, "body": body}

    async def probe(self) -> None:
        # There is no known "who am I" endpoint, so GET the base URL: a 404 there still proves
        # the credentials were accepted.
        await self.request("GET", url_under(self.connection.base_url, "/"), accept=_PROBE_OK)
