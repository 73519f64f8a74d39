"""Running the sandbox: :func:`serve` for the CLI, :class:`SandboxServer` for tests and chaos runs.

:class:`SandboxServer` binds a listening socket itself (port 0 means "any free port", with no
race between picking a port and using it) and hands it to uvicorn, either

* ``mode="process"`` (default): a child ``python -m onward.sandbox --fd N`` process. A worker
  killed by a test cannot take the sandbox down with it, and the child exits when its parent
  dies (it watches its stdin pipe for EOF), so no stray sandboxes outlive a test session; or
* ``mode="thread"``: uvicorn in a daemon thread of this process, cheaper to start.

Either way ``start()`` returns only once ``/_admin/health`` answers (polled, never a fixed sleep).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Literal, Self

import httpx
import uvicorn

from onward.sandbox.admin import SandboxAdmin
from onward.sandbox.app import create_app

Mode = Literal["process", "thread"]

# The sandbox is a fake: don't let a request stuck in a fault's hang delay shutdown for long.
_GRACEFUL_SHUTDOWN_S = 1


def _uvicorn_config(
    log_level: str, host: str = "127.0.0.1", port: int = 0, *, own_logging: bool = True
) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(),
        host=host,
        port=port,
        # In thread mode the process is someone else's (a test run): leave its logging alone
        # instead of letting uvicorn install its own logging configuration.
        log_config=uvicorn.config.LOGGING_CONFIG if own_logging else None,
        log_level=log_level,
        access_log=log_level in ("debug", "trace"),
        proxy_headers=False,
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
        # h11 and the standard loop, whatever is installed: a dropped connection after the work
        # (faults.drop_after_work) relies on how h11's protocol closes a response never sent
        http="h11",
        loop="asyncio",
    )


def serve(
    host: str = "127.0.0.1",
    port: int = 8099,
    *,
    fd: int | None = None,
    log_level: str = "info",
    exit_with_parent: bool = False,
) -> None:
    """Serve the sandbox until interrupted (blocking).

    ``fd`` serves on an already-listening inherited socket instead of binding ``host:port``.
    ``exit_with_parent`` shuts down when stdin reaches EOF, i.e. when the parent process that
    holds the other end of the pipe exits or closes it.
    """
    server = uvicorn.Server(_uvicorn_config(log_level, host, port))
    sockets = [socket.socket(fileno=fd)] if fd is not None else None
    if exit_with_parent:
        threading.Thread(
            target=_exit_on_stdin_eof, args=(server,), name="sandbox-parent-watch", daemon=True
        ).start()
    server.run(sockets=sockets)


def _exit_on_stdin_eof(server: uvicorn.Server) -> None:
    sys.stdin.buffer.read()  # returns only at EOF
    server.should_exit = True


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says TCP, and without it every answer waits ~40 ms (Nagle + delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # Listening before the server starts means early health polls wait in the backlog
    # instead of being refused.
    sock.listen(128)
    return sock


class SandboxServer:
    """A sandbox served on ``host`` (``port=0``: a free port), as a context manager.

    ``with SandboxServer() as sandbox: sandbox.url, sandbox.admin.reset()`` — also usable with
    ``async with`` (start and stop then run in a worker thread, not on the event loop).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        mode: Mode = "process",
        startup_timeout: float = 30.0,
        log_level: str = "warning",
    ) -> None:
        self.host = host
        self.port = port
        self.mode: Mode = mode
        self.startup_timeout = startup_timeout
        self.log_level = log_level
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._uvicorn: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._admin: SandboxAdmin | None = None

    @property
    def url(self) -> str:
        if not self.running:
            raise RuntimeError("the sandbox is not running; call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def allow_entry(self) -> str:
        """The outbound allow-list entry naming exactly this sandbox (``127.0.0.1:8099``): it
        serves on loopback, which onward's outbound check refuses unless allowed."""
        return self.url.removeprefix("http://")

    @property
    def running(self) -> bool:
        return self._process is not None or self._thread is not None

    @property
    def pid(self) -> int | None:
        """The sandbox child's process id (process mode), e.g. to kill it in a chaos test."""
        return self._process.pid if self._process is not None else None

    @property
    def admin(self) -> SandboxAdmin:
        if self._admin is None:
            self._admin = SandboxAdmin(self.url)
        return self._admin

    def start(self) -> Self:
        if self.running:
            raise RuntimeError("the sandbox is already running")
        sock = _listening_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        try:
            if self.mode == "process":
                self._start_process(sock)
            else:
                self._start_thread(sock)
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_process(self, sock: socket.socket) -> None:
        # Make sure the child imports this very onward, even if it isn't installed.
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        # Kept open for the child's lifetime (closed in stop()), so no `with` block here.
        self._log = tempfile.TemporaryFile(prefix="onward-sandbox-", suffix=".log")  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "onward.sandbox",
                    "--fd",
                    str(sock.fileno()),
                    "--log-level",
                    self.log_level,
                    "--exit-with-parent",
                ],
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                pass_fds=(sock.fileno(),),
                env=env,
            )
        finally:
            sock.close()  # the child has its own copy of the listening socket

    def _start_thread(self, sock: socket.socket) -> None:
        self._socket = sock
        self._uvicorn = uvicorn.Server(_uvicorn_config(self.log_level, own_logging=False))
        self._thread = threading.Thread(
            target=self._uvicorn.run,
            kwargs={"sockets": [sock]},
            name=f"onward-sandbox-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.01
        with httpx.Client(timeout=2.0) as client:
            while True:
                self._raise_if_dead()
                try:
                    if client.get(f"{self.url}/_admin/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sandbox at {self.url} not healthy after {self.startup_timeout}s\n"
                        + self._log_tail()
                    )
                time.sleep(delay)
                delay = min(delay * 2, 0.2)

    def _raise_if_dead(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(
                f"sandbox process exited with code {self._process.returncode}\n" + self._log_tail()
            )
        if self._thread is not None and not self._thread.is_alive():
            raise RuntimeError("sandbox server thread exited during startup")

    def _log_tail(self, limit: int = 4000) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-limit:]

    def stop(self) -> None:
        """Stop the sandbox (gracefully, then by force) and release everything it held."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._process is not None:
            process, self._process = self._process, None
            if process.stdin is not None:
                process.stdin.close()  # EOF: the child's watcher asks uvicorn to exit
            try:
                process.wait(timeout=_GRACEFUL_SHUTDOWN_S + 5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._thread is not None:
            thread, self._thread = self._thread, None
            if self._uvicorn is not None:
                self._uvicorn.should_exit = True
            thread.join(timeout=_GRACEFUL_SHUTDOWN_S + 5)
            self._uvicorn = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
