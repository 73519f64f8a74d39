"""Real faults for the chaos runner and its tests. Nothing here mocks the database or a process.

* :class:`DuplicatingQueue` wraps a real queue adapter: every wake is published twice in a
  shuffled order, and every wake a consumer receives is handed over twice, once shuffled with
  its neighbours and once more, late, when the step has usually moved on.
* :class:`RedisServer`: a Redis server of one's own (``redis-server`` on a free port), to stop
  or kill without touching a shared one.
* :class:`ThrowawayPostgres`: a PostgreSQL cluster of one's own (``initdb`` in a temporary
  folder, run as the ``postgres`` user when we are root), to restart mid-load.
* :class:`BackendKiller`: terminates the engine's own database connections
  (``pg_terminate_backend``, chosen by ``application_name``) at random moments, so database
  calls fail for real across a whole run.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psycopg

from onward.queue.base import OnReconnect, OnWake, Queue, Wake

# -- the queue: twice and out of order -----------------------------------------------------------


class DuplicatingQueue(Queue):
    """A real queue adapter whose wakes arrive twice and out of order (consumers must cope)."""

    def __init__(self, inner: Queue, *, seed: int | None = None, late_s: float = 1.0) -> None:
        self.inner = inner
        self.name = inner.name
        self.supports_delay = inner.supports_delay
        self.late_s = late_s
        self._rng = random.Random(seed)
        if hasattr(inner, "publish_tx"):
            self.publish_tx = self._publish_tx

    def _twice_shuffled(self, wakes: Sequence[Wake]) -> list[Wake]:
        doubled = [*wakes, *wakes]
        self._rng.shuffle(doubled)
        return doubled

    async def start(self) -> None:
        await self.inner.start()

    async def publish(self, wakes: Sequence[Wake]) -> None:
        await self.inner.publish(self._twice_shuffled(wakes))

    async def _publish_tx(self, conn: Any, wakes: Sequence[Wake]) -> None:
        await self.inner.publish_tx(conn, self._twice_shuffled(wakes))  # type: ignore[attr-defined]

    async def consume(
        self, lanes: Sequence[str], on_wake: OnWake, on_reconnect: OnReconnect | None = None
    ) -> None:
        loop = asyncio.get_running_loop()
        pending: list[Wake] = []
        flushed = asyncio.Event()

        def capture(wake: Wake) -> None:
            pending.append(wake)
            flushed.set()
            # the late duplicate: arrives after the step has usually moved on
            loop.call_later(self._rng.uniform(0.05, self.late_s), on_wake, wake)

        async def flush() -> None:
            while True:
                await flushed.wait()
                flushed.clear()
                await asyncio.sleep(0.02)  # gather neighbours, then hand them over shuffled
                batch, pending[:] = list(pending), []
                self._rng.shuffle(batch)
                for wake in batch:
                    on_wake(wake)

        flusher = asyncio.create_task(flush())
        try:
            await self.inner.consume(lanes, capture, on_reconnect)
        finally:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)

    async def health(self) -> list[str]:
        return await self.inner.health()

    async def close(self) -> None:
        await self.inner.close()


# -- helpers ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        time.sleep(0.05)


# -- Redis of one's own -------------------------------------------------------------------------


class RedisServer:
    """``redis-server`` on a free port, no persistence, until :meth:`kill` or :meth:`stop`."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or shutil.which("redis-server") or "redis-server"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--maxmemory-policy",
                "noeviction",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        _wait_for(answers, 10.0, "redis-server answering")
        return self

    def kill(self) -> None:
        """SIGKILL: the queue disappears with everything in it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- PostgreSQL of one's own --------------------------------------------------------------------


def postgres_bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` live (PATH first, then Debian's versioned folders)."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    return None


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary folder on a free port, trust auth, fsync off.

    As root, ``initdb`` and ``pg_ctl`` run as the ``postgres`` user (``runuser``), which owns
    the folder. :meth:`restart` uses ``-m immediate``: every session is cut and the server
    recovers from its WAL, as after a crash."""

    def __init__(self, bin_dir: Path | None = None, user: str = "postgres") -> None:
        found = bin_dir or postgres_bin_dir()
        if found is None:
            raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
        self.bin_dir = found
        self.user = user
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="onward-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._started = False

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str, timeout: float = 60.0) -> None:
        cmd = [str(self.bin_dir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        done = subprocess.run(
            cmd, capture_output=True, timeout=timeout, check=False, cwd=str(self.root)
        )
        if done.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(argv[:2])} failed ({done.returncode}): "
                f"{done.stderr.decode(errors='replace')[-2000:]}\n{tail}"
            )

    def start(self) -> Self:
        if os.geteuid() == 0:
            shutil.chown(self.root, user=self.user)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "start")
        self._started = True
        return self

    def restart(self) -> None:
        """Cut every session and restart (crash recovery), waiting until it accepts again."""
        # -l again: without it the new postmaster writes to (and holds open) our pipe
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", "immediate", "-w", "restart"
        )

    def stop(self) -> None:
        if self._started:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self._started = False
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- database calls failing at random -----------------------------------------------------------


def terminate_backends(admin_url: str, application_prefix: str, *, limit: int | None = None) -> int:
    """Terminate connections whose ``application_name`` starts with the prefix (never our own).

    ``limit``: at most this many, chosen at random. Returns how many were terminated."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s"
            " AND pid <> pg_backend_pid() ORDER BY random() LIMIT %s",
            (application_prefix + "%", limit),
        ).fetchall()
        killed = 0
        for (pid,) in rows:
            row = conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
            killed += int(bool(row and row[0]))
    return killed


class BackendKiller:
    """A thread that terminates one random engine connection every ``interval`` seconds
    (jittered), until stopped: statements, commits and LISTENs fail for real."""

    def __init__(
        self, admin_url: str, application_prefix: str, *, interval: float = 0.5, seed: int = 0
    ) -> None:
        self.admin_url, self.prefix, self.interval = admin_url, application_prefix, interval
        self.killed = 0
        self.errors = 0
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="backend-killer", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._rng.uniform(0.5, 1.5) * self.interval):
            try:
                self.killed += terminate_backends(self.admin_url, self.prefix, limit=1)
            except psycopg.Error:
                self.errors += 1

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
