"""Database access: resolving the URL (or the embedded server), the pool, migrations.

PostgreSQL is the engine's only record of progress and is used as itself: there is no
database abstraction layer, only named SQL files beside the modules that run them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from onward import jsoncodec
from onward.config import Settings
from onward.errors import Unavailable

Conn = psycopg.AsyncConnection[dict[str, Any]]
Pool = AsyncConnectionPool[Conn]


def resolve_url(settings: Settings) -> str:
    """The configured database URL, or the embedded server's (started if needed)."""
    if settings.database_url:
        return settings.database_url
    from onward.db.embedded import ensure_server

    return ensure_server(settings.data_dir)


# The roles a process's connections act as (migration 0019_row_security): the URL's user
# becomes one of them (the `role` setting in its startup options, as `SET ROLE` would), and
# row-level security applies from then on.
ENGINE_ROLE = "onward_engine"  # workers, sweeper, relays, CLI: crosses orgs, explicitly
API_ROLE = "onward_api"  # the HTTP API: one organisation per lent connection (OrgPool)


def _session_options(url: str, role: str) -> str:
    """The settings every connection starts with, in its startup packet (no statement, no
    round trip, no commit per new connection): every statement of onward is short, so a
    runaway one fails rather than hold locks; and the role it acts as. Options the URL gives
    come first."""
    given = conninfo_to_dict(url).get("options") or ""
    ours = f"-c statement_timeout=60s -c idle_in_transaction_session_timeout=120s -c role={role}"
    return f"{given} {ours}".strip()


# The organisation each API connection was last set to (OrgPool). A connection keeps its
# setting between loans: the API pool lends only through OrgPool, which sets the organisation
# of every loan before its first statement unless the connection already has it -- one round
# trip saved per request when consecutive loans serve one organisation, and none is lent with
# another's. A connection the pool replaces is a new key here.
_org_of: weakref.WeakKeyDictionary[Conn, str] = weakref.WeakKeyDictionary()


def make_pool(
    url: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    name: str = "onward",
    role: str = ENGINE_ROLE,
) -> Pool:
    """An async pool of autocommit connections returning dict rows, acting as ``role``.

    No per-checkout health check: it would cost a round trip on every statement of the hot
    path. A connection that breaks raises ``OperationalError`` to its user, who treats the
    outcome as unknown (fenced writes make that safe), and the pool discards it on return.
    The API's pool (``role=API_ROLE``) is lent only through :class:`OrgPool`, which sets the
    organisation of every loan: its own ``connection()`` refuses (:class:`_TenantPool`).
    """
    kind = _TenantPool if role == API_ROLE else AsyncConnectionPool
    return kind(
        url,
        connection_class=psycopg.AsyncConnection[dict[str, Any]],
        min_size=min_size,
        max_size=max_size,
        kwargs={
            "row_factory": dict_row,
            "autocommit": True,
            "prepare_threshold": 0,
            "options": _session_options(url, role),
            "context": jsoncodec.ADAPTERS,  # JSON with orjson
        },
        name=name,
        open=False,
    )


class _TenantPool(AsyncConnectionPool[Conn]):
    """The API's pool: its connections keep the organisation of their last loan, so none may be
    lent without one -- ``connection()`` refuses; :class:`OrgPool` lends (``_lend``)."""

    def connection(self, timeout: float | None = None) -> Any:
        raise RuntimeError(
            "the API pool lends a connection only with an organisation: org_pool(pool, org_id)"
        )

    def _lend(self, timeout: float | None = None) -> Any:
        return super().connection(timeout=timeout)


class OrgPool:
    """The API pool as one organisation sees it: every connection it lends has
    ``onward.org_id`` set to ``org_id`` before its first statement, so row-level security
    (role ``onward_api``) shows and admits that organisation's rows only -- whatever the
    query says. The setting is written only when the connection's last loan was for another
    organisation (or none): the API pool is lent through OrgPool alone.

    It stands in for a ``Pool`` wherever onward's functions take one (they use
    ``connection()``); the health bookkeeping of ``read``/``write`` uses ``base``."""

    def __init__(self, base: Pool, org_id: str) -> None:
        self.base, self.org_id = base, org_id

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[Conn]:
        lend = getattr(self.base, "_lend", self.base.connection)
        async with lend(timeout=timeout) as conn:
            if _org_of.get(conn) != self.org_id:
                _org_of.pop(conn, None)  # unknown until the setting is known to be written
                await conn.execute("SELECT set_config('onward.org_id', %s, false)", (self.org_id,))
                _org_of[conn] = self.org_id
            yield conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)


def org_pool(base: Pool, org_id: str) -> Pool:
    """``base`` (an API pool) lending connections that see ``org_id`` only (:class:`OrgPool`)."""
    return cast(Pool, OrgPool(base, org_id))


def _base(pool: Pool) -> Pool:
    return cast(Pool, getattr(pool, "base", pool))


# -- reads that survive a restart, and a database that is down ---------------------------------
#
# After a PostgreSQL restart every pooled connection is dead, and the first statement on each
# fails once (``AdminShutdown``, "server closed the connection unexpectedly"). A read is safe
# to repeat, so ``read`` repeats it once -- after checking that the database answers a new
# connection and dropping the other dead idle connections (``pool.check()``), so the repeat
# does not meet one of them. A write is not repeated blindly: ``write`` turns the error into
# ``Unavailable`` and the caller decides (every onward write the API offers is idempotent --
# a start by its start key, a publish by its digest -- so the API repeats those once too).
#
# While the database is known to be down, each call first tries one new connection (a few
# seconds at most) and answers ``Unavailable`` at once if that fails, instead of every caller
# waiting the pool's full timeout for a connection that will not come.

T = TypeVar("T")

RETRY_AFTER_SECONDS = 2.0
"""What ``Unavailable.retry_after`` says when the database cannot be reached."""
PROBE_TIMEOUT_SECONDS = 3

# sqlstate classes of a lost or refused connection: 08 connection exception, 57P admin or
# crash shutdown, cannot connect now, database dropped, idle session timeout.
_CONNECTION_STATES = ("08", "57P")
_down: weakref.WeakKeyDictionary[Pool, float] = weakref.WeakKeyDictionary()
log = logging.getLogger("onward.db")


def is_connection_error(exc: BaseException) -> bool:
    """True for an error that says the connection (or the database) is gone, not the query:
    those are the errors a repeat on another connection can cure."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith(_CONNECTION_STATES)


def _unavailable(exc: BaseException) -> Unavailable:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return Unavailable(f"the database cannot be reached: {reason}", retry_after=RETRY_AFTER_SECONDS)


async def reachable(pool: Pool) -> None:
    """Raise ``Unavailable`` unless a new connection to the pool's database opens now."""
    conninfo = pool.conninfo
    assert isinstance(conninfo, str), "make_pool builds pools from a URL"
    try:
        conn = await psycopg.AsyncConnection.connect(
            conninfo, connect_timeout=PROBE_TIMEOUT_SECONDS, autocommit=True
        )
    except psycopg.OperationalError as exc:
        _down[pool] = time.monotonic()
        raise _unavailable(exc) from None
    await conn.close()
    if _down.pop(pool, None) is not None:
        log.info("the database answers again")
        await pool.check()  # the connections that died while it was down


async def _attempt(pool: Pool, fn: Callable[[], Awaitable[T]], *, repeat: bool) -> T:
    pool = _base(pool)
    if pool in _down:
        await reachable(pool)
    try:
        return await fn()
    except psycopg.OperationalError as exc:
        if not is_connection_error(exc):
            raise
        first = exc
    await reachable(pool)  # Unavailable when the database itself is down
    await pool.check()  # the other connections that died with the first
    if not repeat:
        raise _unavailable(first) from first
    log.info("repeating a read once after a lost connection: %s", _unavailable(first))
    try:
        return await fn()
    except psycopg.OperationalError as exc:
        if not is_connection_error(exc):
            raise
        _down[pool] = time.monotonic()
        raise _unavailable(exc) from exc


async def read(pool: Pool, fn: Callable[[], Awaitable[T]]) -> T:
    """``await fn()``, repeated once if the connection it used was lost (a restart). Use for
    reads and for writes that are idempotent; ``Unavailable`` if the database is down."""
    return await _attempt(pool, fn, repeat=True)


async def write(pool: Pool, fn: Callable[[], Awaitable[T]]) -> T:
    """``await fn()``, never repeated: a lost connection becomes ``Unavailable`` (whether the
    write was applied is unknown; repeat it only if it is idempotent)."""
    return await _attempt(pool, fn, repeat=False)


TRANSIENT_REPEATS = 5
"""How often :func:`repeat_rolled_back` repeats a transaction the database rolled back."""
# sqlstates of a transaction the database rolled back whole to break a conflict: 40P01 a
# deadlock's victim, 40001 a serialization failure. Nothing it wrote remains.
_ROLLED_BACK = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


async def repeat_rolled_back(fn: Callable[[], Awaitable[T]]) -> T:
    """``await fn()`` -- one transaction, or one statement in autocommit -- repeated when the
    database chose it as a deadlock's victim or failed it for serialization (it rolled back
    whole, so a repeat applies it once), up to ``TRANSIENT_REPEATS`` times, after a pause that
    grows a little each time; the last such error is raised. A settle batch of workers and an
    operation's batch (a migration's, a bulk cancel's) lock the same steps: either may lose."""
    for repeat in range(TRANSIENT_REPEATS + 1):
        try:
            return await fn()
        except _ROLLED_BACK:
            if repeat == TRANSIENT_REPEATS:
                raise
            log.info("repeating a transaction the database rolled back (deadlock or conflict)")
            await asyncio.sleep(0.01 * (repeat + 1))
    raise AssertionError("unreachable")
