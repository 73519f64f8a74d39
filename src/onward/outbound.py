"""Outbound safety: user-configured HTTP reaches only public addresses, unless allowed.

Every request onward makes to an address an organisation configured (an ``http.call``
connection's base URL, any provider connection's base URL, a notification webhook's URL, a
Slack ``response_url``) goes through a client made here. Its transport checks the destination
**at connect time, after DNS resolution**, and connects to the very address it checked: the
host name is resolved once, each address is checked, and the TCP connection is opened to the
checked IP (TLS still verifies and sends SNI for the name; the ``Host`` header is the URL's).
A name that resolves to a private address is refused, and DNS rebinding between check and
connect has nothing to rebind.

Refused unless allowed: loopback (``127.0.0.0/8``, ``::1``), private (RFC 1918, ULA
``fc00::/7``), link-local (``169.254.0.0/16``, ``fe80::/10``), cloud metadata
(``169.254.169.254``, ``fd00:ec2::254``), unspecified (``0.0.0.0``, ``::``), multicast and
every other address that is not globally routable (shared ``100.64.0.0/10``, reserved,
documentation ranges); an IPv4-mapped IPv6 address is checked as its IPv4 address.

The allow-list: the engine's (``ONWARD_OUTBOUND_ALLOW``, comma-separated) plus the
organisation's (``outbound_allow`` rows). An entry is a CIDR or an address (``10.0.0.0/8``,
``::1``), or a host name (``hooks.internal``), each optionally with a port
(``127.0.0.1:8099``, ``[::1]:8099``, ``[fd00::/8]:443``, ``hooks.internal:8443``); a name
entry allows whatever that name resolves to.

Redirects are not followed (a 3xx is the provider's answer, a PermanentError); a client that
did follow them would re-check each hop, since each hop connects through the same check. An
answer larger than ``ONWARD_OUTBOUND_MAX_RESPONSE_BYTES`` is cut off (PermanentError), and an
exchange longer than ``ONWARD_OUTBOUND_MAX_SECONDS`` in all is a timeout, whatever the
per-read timeouts say. Environment proxies are ignored (a proxy would connect for us, past
the check), and the answer is asked for uncompressed (the size cap counts what arrives).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from onward.db import Conn
from onward.db.sql import Queries
from onward.errors import InvalidInput, OutboundRefused

Q = Queries(__package__, "outbound.sql")

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_ENTRIES = 100  # per organisation
MAX_ENTRY = 300
DEFAULT_MAX_RESPONSE_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_SECONDS = 30.0
METADATA = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254"))
_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*$"
)
ENTRY_HELP = (
    "a CIDR or an address (10.0.0.0/8, ::1) or a host name, optionally with :port "
    "(127.0.0.1:8099, [::1]:8099, hooks.internal:8443)"
)


# -- what is refused ----------------------------------------------------------------------------


def refusal(ip: IP) -> str | None:
    """Why ``ip`` may not be reached without an allow-list entry (None: it is public)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in METADATA:
        return "a cloud metadata address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_reserved:
        return "a reserved address (not globally routable)"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "a reserved address (not globally routable)"
    return None


# -- the allow-list -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    network: Network | None
    name: str | None
    port: int | None

    def __str__(self) -> str:
        if self.network is not None:
            one = self.network.num_addresses == 1
            host = str(self.network.network_address) if one else str(self.network)
            if self.port is None:
                return host
            return f"[{host}]:{self.port}" if self.network.version == 6 else f"{host}:{self.port}"
        name = self.name or ""
        return name if self.port is None else f"{name}:{self.port}"

    def allows(self, name: str, ip: IP, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            return ip.version == self.network.version and ip in self.network
        return self.name == _plain_name(name)


def _plain_name(name: str) -> str:
    return name.lower().rstrip(".")


def parse_entry(raw: str) -> Entry:
    """One allow-list entry; ``InvalidInput`` naming the syntax otherwise."""
    text = raw.strip() if isinstance(raw, str) else ""

    def bad(why: str) -> InvalidInput:
        return InvalidInput(f"outbound allow entry {str(raw)[:80]!r}: {why}; {ENTRY_HELP}")

    if not text or len(text) > MAX_ENTRY:
        raise bad(f"empty or longer than {MAX_ENTRY} characters")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text) or not text.isascii():
        raise bad("spaces, control or non-ASCII characters")
    host, port_text = text, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (text[end + 1 :] and not text[end + 1 :].startswith(":")):
            raise bad("a '[' without its ']:port'")
        host, port_text = text[1:end], text[end + 2 :] if text[end + 1 :] else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise bad("a port is a number from 1 to 65535")
        port = int(port_text)
    try:
        return Entry(ipaddress.ip_network(host, strict=False), None, port)
    except ValueError:
        pass
    name = _plain_name(host)
    if "/" in name or not _NAME.match(name):
        raise bad("neither an address, a CIDR nor a host name")
    return Entry(None, name, port)


def parse_entries(raws: Iterable[str]) -> tuple[Entry, ...]:
    return tuple(parse_entry(r) for r in raws)


@dataclass(frozen=True)
class AllowList:
    entries: tuple[Entry, ...] = ()

    def allows(self, name: str, ip: IP, port: int) -> bool:
        return any(e.allows(name, ip, port) for e in self.entries)


# -- the check at connect time ------------------------------------------------------------------


async def resolve(host: str, port: int, timeout: float | None) -> list[IP]:
    """The addresses ``host`` stands for, in the resolver's order (a literal: itself)."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except TimeoutError:
        raise httpcore.ConnectTimeout(f"resolving {host!r} took longer than {timeout}s") from None
    except OSError as exc:
        raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
    except UnicodeError as exc:  # a name the idna codec refuses (an empty or 64+ char label)
        raise httpcore.ConnectError(f"cannot resolve {host[:200]!r}: {exc}") from exc
    out: list[IP] = []
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).partition("%")[0])
        if ip not in out:
            out.append(ip)
    return out


def refused_error(host: str, ip: IP, port: int, why: str) -> OutboundRefused:
    try:
        literal = ipaddress.ip_address(host.strip("[]")) == ip
    except ValueError:
        literal = False
    via = "" if literal else f" ({host[:200]} resolves to it)"
    entry = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    return OutboundRefused(
        f"destination {ip} is {why}{via}; allow it with `onward outbound allow {entry}` "
        f"(this organisation) or ONWARD_OUTBOUND_ALLOW (the engine)",
        detail={"host": host[:200], "address": str(ip), "port": port, "reason": why},
    )


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the check: connects only to a checked address."""

    def __init__(self, allow: AllowList, inner: httpcore.AsyncNetworkBackend | None = None):
        self.allow = allow
        self.inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        refused: OutboundRefused | None = None
        failed: Exception | None = None
        for ip in await resolve(host, port, timeout):
            why = refusal(ip)
            if why is not None and not self.allow.allows(host, ip, port):
                refused = refused or refused_error(host, ip, port, why)
                continue
            try:
                return await self.inner.connect_tcp(
                    str(ip),
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failed = exc  # try the next checked address, as a resolver's list is meant
        if failed is not None:
            raise failed
        raise refused or httpcore.ConnectError(f"{host!r} resolves to no address")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise OutboundRefused("outbound HTTP does not connect to unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class _Capped(httpx.AsyncByteStream):
    """A response body read no further than ``max_bytes`` and no later than ``deadline``."""

    def __init__(
        self, inner: httpx.AsyncByteStream, request: httpx.Request, max_bytes: int, deadline: float
    ) -> None:
        self.inner, self.request = inner, request
        self.max_bytes, self.deadline = max_bytes, deadline

    async def __aiter__(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        chunks = self.inner.__aiter__()
        seen = 0
        while True:
            try:
                async with asyncio.timeout_at(self.deadline):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise httpx.ReadTimeout(
                    "the answer took longer than the outbound time cap", request=self.request
                ) from None
            seen += len(chunk)
            if seen > self.max_bytes:
                raise OutboundRefused(
                    f"the answer of {self.request.url.host} is larger than {self.max_bytes} "
                    "bytes (ONWARD_OUTBOUND_MAX_RESPONSE_BYTES): cut off",
                    detail={"host": self.request.url.host, "max_bytes": self.max_bytes},
                )
            if loop.time() > self.deadline:
                raise httpx.ReadTimeout("the outbound time cap passed", request=self.request)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a connection pool whose network backend checks each address."""

    def __init__(
        self,
        allow: AllowList,
        *,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_seconds: float = DEFAULT_MAX_SECONDS,
    ) -> None:
        super().__init__(trust_env=False)
        self.max_response_bytes, self.max_seconds = max_response_bytes, max_seconds
        # httpx's transport takes no network backend, but its pool (httpcore's public API)
        # does: the same pool httpx would build, with the checking backend.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=GuardedBackend(allow),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Accept-Encoding"] = "identity"
        deadline = asyncio.get_running_loop().time() + self.max_seconds
        try:
            async with asyncio.timeout_at(deadline):
                response = await super().handle_async_request(request)
        except TimeoutError:
            raise httpx.ReadTimeout(
                f"no answer within {self.max_seconds:g}s (ONWARD_OUTBOUND_MAX_SECONDS)",
                request=request,
            ) from None
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Capped(response.stream, request, self.max_response_bytes, deadline)
        return response


def guarded_client(
    allow: AllowList,
    *,
    timeout: float = 10.0,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    max_seconds: float = DEFAULT_MAX_SECONDS,
) -> httpx.AsyncClient:
    """An httpx client for user-configured destinations: checked, capped, no redirects."""
    transport = GuardedTransport(
        allow, max_response_bytes=max_response_bytes, max_seconds=max_seconds
    )
    return httpx.AsyncClient(
        transport=transport, timeout=timeout, follow_redirects=False, trust_env=False
    )


class Clients:
    """One guarded client per distinct allow-list (the engine's plus an organisation's).

    Clients are not shared between different allow-lists: a pooled connection to an address
    one organisation allowed must not carry another organisation's request."""

    def __init__(
        self,
        engine_allow: Iterable[str] = (),
        *,
        timeout: float = 10.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_seconds: float = DEFAULT_MAX_SECONDS,
    ) -> None:
        self.engine_allow = tuple(str(e) for e in parse_entries(engine_allow))
        self.timeout, self.max_response_bytes = timeout, max_response_bytes
        self.max_seconds = max_seconds
        self._clients: dict[tuple[str, ...], httpx.AsyncClient] = {}

    def client(self, org_entries: Iterable[str] = ()) -> httpx.AsyncClient:
        key = tuple(sorted({*self.engine_allow, *org_entries}))
        found = self._clients.get(key)
        if found is None:
            found = self._clients[key] = guarded_client(
                AllowList(parse_entries(key)),
                timeout=self.timeout,
                max_response_bytes=self.max_response_bytes,
                max_seconds=self.max_seconds,
            )
        return found

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()


# -- the organisation's allow-list --------------------------------------------------------------


async def entries(conn: Conn, org_id: str) -> list[str]:
    """The organisation's allow-list entries, sorted."""
    cur = await conn.execute(Q.entries, {"org_id": org_id})
    return [str(row["entry"]) for row in await cur.fetchall()]


def _canonical(raws: Iterable[str]) -> list[str]:
    if isinstance(raws, str):
        raws = [raws]
    out = list(dict.fromkeys(str(e) for e in parse_entries(raws)))
    if not out:
        raise InvalidInput(f"outbound allow: name at least one entry: {ENTRY_HELP}")
    if len(out) > MAX_ENTRIES:
        raise InvalidInput(f"outbound allow: at most {MAX_ENTRIES} entries per organisation")
    return out


async def allow(conn: Conn, org_id: str, raws: Iterable[str]) -> list[str]:
    """Add entries (checked, in canonical form) to the organisation's allow-list, in the
    caller's transaction; returns the whole list. ``InvalidInput``: nothing is stored."""
    new = _canonical(raws)
    await conn.execute(Q.add, {"org_id": org_id, "entries": new})
    cur = await conn.execute(Q.count, {"org_id": org_id})
    row = await cur.fetchone()
    if row is not None and int(row["n"]) > MAX_ENTRIES:
        raise InvalidInput(f"outbound allow: at most {MAX_ENTRIES} entries per organisation")
    return await entries(conn, org_id)


async def disallow(conn: Conn, org_id: str, raws: Iterable[str]) -> list[str]:
    """Remove entries from the organisation's allow-list; returns the whole list."""
    await conn.execute(Q.remove, {"org_id": org_id, "entries": _canonical(raws)})
    return await entries(conn, org_id)
