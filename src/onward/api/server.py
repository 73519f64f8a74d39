"""Serving the API with uvicorn inside an asyncio loop that is already running.

``onward up`` and ``onward demo`` run the API beside the worker, relay and sweeper in one
process, so uvicorn must neither own the loop (``uvicorn.run``) nor the signals: the process
installs its own SIGINT/SIGTERM handlers and stops every part in order. ``ApiServer`` binds the
listening socket itself (port 0 = any free port, with no race between choosing and using it)
and returns from ``start()`` once uvicorn accepts connections.

    async with ApiServer(create_app(engine), port=0) as api:
        print(api.url)
        await api.wait_closed()        # until api.stop() / should_exit
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from types import TracebackType
from typing import Any, Self

import uvicorn

from onward.errors import ConfigError


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the host process owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port=0``: a free port). ``reuse_port``:
    with ``SO_REUSEPORT``, so that each process of ``onward api --workers N`` listens on a
    socket of its own and the kernel spreads the connections among them (by a hash of each
    connection's addresses); ``listen=False``: bound only (the supervisor's hold on the port,
    which is handed no connection)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says TCP, and without it every answer waits ~40 ms (Nagle + delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


class ApiServer:
    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str | None = None,
        access_log: bool = True,
        own_logging: bool = False,
        graceful_seconds: float = 10.0,
        sock: socket.socket | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._given = sock  # a listening socket bound before (shared by `onward api --workers`)
        self.config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,  # None: the process's own levels (ONWARD_LOG_LEVEL(S)) decide
            access_log=access_log,
            # An embedded server leaves the process's logging configuration alone.
            log_config=uvicorn.config.LOGGING_CONFIG if own_logging else None,
            proxy_headers=False,
            server_header=False,
            # httptools' parser and uvloop (cli._run) when installed: both are dependencies
            http="auto",
            lifespan="off",
            timeout_graceful_shutdown=max(1, int(graceful_seconds)),
        )
        self.server = _Server(self.config)
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, timeout: float = 30.0) -> Self:
        self._sock = self._given or bind(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        self._task = asyncio.create_task(self.server.serve(sockets=[self._sock]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.server.started:
            if self._task.done():
                await self._task  # raises what stopped it
                raise RuntimeError("the API server stopped during startup")
            if loop.time() > deadline:
                await self.stop()
                raise RuntimeError(f"the API server did not start within {timeout}s")
            await asyncio.sleep(0.01)
        return self

    async def wait_closed(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Stop accepting, let requests in progress finish (up to the grace period), close."""
        self.server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
