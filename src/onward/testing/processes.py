"""Real child processes for tests and for ``onward chaos``: started with their output in a log
file, signalled (SIGKILL, SIGTERM, SIGSTOP/SIGCONT), always reaped.

* :func:`process_env`: a child's environment -- unbuffered output, ``ONWARD_CRASH_AT`` armed
  (``crash_at``) or cleared, the wall and monotonic clocks moved with libfaketime
  (``clock_offset="+300"``);
* :class:`Process`: one child and its log (``tell`` writes a line to its stdin, ``read_new``
  reads what it wrote since the last call, ``find``/``wait_for`` a line matching a pattern,
  ``stop`` is SIGTERM and the exit code);
* :class:`Processes`: the children of one test, reaped together, their logs printed at the
  end (pytest shows them when the test failed); ``Processes.onward(url, *args)`` starts a
  long-running ``onward`` command (``up``, ``api``, ``worker``);
* :func:`onward_argv` and :func:`run_onward`: the ``onward`` command in this interpreter, run
  to completion (``publish``, ``start``, ``migrate``, ``doctor``...);
* :func:`run_python` and :func:`loaded_modules`: a snippet in a fresh interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Self

from onward.testing.waiting import eventually, eventually_sync

if TYPE_CHECKING:
    from onward.config import Settings

_KEEP_TEXT = 200_000  # what read_new keeps in ``text``


def libfaketime() -> str | None:
    """The libfaketime shared library (Debian package ``faketime``), if installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")) + sorted(
        glob.glob("/usr/lib/faketime/libfaketime.so.1")
    )
    return found[0] if found else None


SANDBOX_ALLOW = "127.0.0.1/32"  # where the sandbox serves: a child's engine-wide allow-list


def process_env(
    *,
    crash_at: str | None = None,
    clock_offset: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """This process's environment for a child: unbuffered output, ``ONWARD_CRASH_AT`` set to
    ``crash_at`` (``point[@n]``) or removed, ``ONWARD_OUTBOUND_ALLOW`` naming the sandbox's
    loopback address unless set, and with ``clock_offset`` (e.g. ``"+600"``) the
    child's clocks (``time.time()``, ``datetime.now()``, the monotonic clock) that far ahead.

    libfaketime is preloaded directly, not through the ``faketime`` wrapper (which forks), so
    signals sent to the child reach the Python process itself."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # The sandbox serves on loopback, which outbound HTTP reaches only when allowed
    # (onward.outbound): a child allows it unless the environment says otherwise.
    env.setdefault("ONWARD_OUTBOUND_ALLOW", SANDBOX_ALLOW)
    env.pop("ONWARD_CRASH_AT", None)
    if crash_at:
        env["ONWARD_CRASH_AT"] = crash_at
    if clock_offset is not None:
        lib = libfaketime()
        if lib is None:
            raise RuntimeError("libfaketime is not installed: apt-get install -y faketime")
        env.update(LD_PRELOAD=lib, FAKETIME=clock_offset, FAKETIME_NO_CACHE="1")
    env.update(extra or {})
    return env


@dataclass
class Process:
    """One child process writing stdout and stderr to ``log_path``. ``close()`` reaps it."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes] = field(repr=False)
    offset: int = field(default=0, repr=False)
    text: str = field(default="", repr=False)  # what read_new() has read so far (capped)

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        name: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        cwd: str | Path | None = None,
        **fields: Any,
    ) -> Self:
        """Start ``argv``; ``stdin=True`` gives it a pipe for :meth:`tell`. ``fields`` go to a
        subclass's own fields."""
        log = log_path.open("wb")
        popen = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            env=dict(env) if env is not None else process_env(),
            cwd=cwd,
        )
        return cls(name=name, popen=popen, log_path=log_path, log=log, **fields)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    def terminate(self) -> None:
        self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.popen.send_signal(signal.SIGKILL)

    def tell(self, line: str) -> bool:
        """Write ``line`` to the child's stdin; False if it is gone (or has no pipe)."""
        if self.popen.stdin is None:
            return False
        try:
            self.popen.stdin.write(line.encode())
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return False
        return True

    def close_stdin(self) -> None:
        """EOF on the child's stdin."""
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()

    def log_text(self) -> str:
        """Everything the child wrote so far (it writes the file itself)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, chars: int = 1500) -> str:
        return self.log_text()[-chars:]

    def read_new(self) -> str:
        """What the child wrote since the last call (also appended to ``text``)."""
        with self.log_path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        chunk = data.decode(errors="replace")
        if len(self.text) < _KEEP_TEXT:
            self.text += chunk
        return chunk

    def printed(self, prefix: str) -> bool:
        """A line starting with ``prefix`` is in the log."""
        return ("\n" + prefix) in ("\n" + self.log_text())

    def find(self, pattern: str) -> re.Match[str] | None:
        """The first line of the log in which the regular expression ``pattern`` is found
        (``re.search``), or None."""
        for line in self.log_text().splitlines():
            if found := re.search(pattern, line):
                return found
        return None

    def wait_for(self, pattern: str, *, timeout: float = 30.0) -> re.Match[str]:
        """Wait (blocking: for synchronous tests) until :meth:`find` finds ``pattern``; the
        match. The child must stay alive meanwhile."""

        def check() -> re.Match[str] | None:
            assert self.alive(), f"{self.name} exited ({self.returncode}):\n{self.tail(3000)}"
            return self.find(pattern)

        found = eventually_sync(check, timeout=timeout, what=f"{self.name} printing {pattern!r}")
        assert found is not None
        return found

    async def ready(self, *, timeout: float = 30.0, line: str = "ready ") -> None:
        """Wait until the child printed a line starting with ``line``; it must stay alive."""

        async def check() -> bool:
            assert self.alive(), f"{self.name} exited:\n{self.tail(3000)}"
            return self.printed(line)

        await eventually(check, timeout=timeout, interval=0.05, what=f"{self.name} ready")

    async def exited(self, timeout: float = 20.0) -> int:
        """Wait (without blocking the event loop) until the child exits; its return code."""

        async def gone() -> bool:
            return not self.alive()

        await eventually(gone, timeout=timeout, what=f"{self.name} to exit")
        return int(self.popen.returncode)

    def wait(self, timeout: float = 20.0) -> int:
        """Wait (blocking: for synchronous tests) until the child exits; its return code.
        ``AssertionError`` with the end of its log if it still runs after ``timeout``."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout}s:\n{self.tail(3000)}"
            ) from None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a graceful stop), then :meth:`wait`; the return code."""
        self.terminate()
        return self.wait(timeout)

    def close(self) -> None:
        """Kill the child if it still runs (SIGCONT first: a stopped one cannot die), reap it,
        close its log and stdin."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGCONT)
                self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        self.close_stdin()
        if not self.log.closed:
            self.log.close()


class Processes:
    """The processes one test started, logs in ``log_dir``. Closing reaps every one (SIGKILL
    by its own pid if still running) and prints the end of each log."""

    def __init__(self, log_dir: str | Path, *, log_chars: int = 20_000) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_chars = log_chars
        self.started: list[Process] = []

    def start(
        self,
        argv: Sequence[str],
        name: str,
        *,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        cwd: str | Path | None = None,
    ) -> Process:
        """Start ``argv`` (any command line) in this group, its output in ``<name>.log``; a
        name already taken in the group gets a suffix (``name-2``)."""
        taken = {proc.name for proc in self.started}
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = f"{name}-{n}"
        proc = Process.start(
            argv,
            name=unique,
            log_path=self.log_dir / f"{unique}.log",
            env=env,
            stdin=stdin,
            cwd=cwd,
        )
        self.started.append(proc)
        return proc

    def onward(
        self,
        database_url: str | None,
        *args: str,
        name: str = "onward",
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log_level: str = "info",
    ) -> Process:
        """``onward --database-url URL ARGS`` (:func:`onward_argv`) in this group, logging at
        ``log_level``; ``env`` adds to the environment. For the long-running commands (``up``,
        ``api``, ``worker``): ``wait_for`` what they print, ``stop()`` them."""
        extra = {"ONWARD_LOG_LEVEL": log_level, **(env or {})}
        return self.start(
            onward_argv(database_url, *args), name, env=process_env(extra=extra), cwd=cwd
        )

    def worker(self, settings: Settings, name: str, **options: Any) -> Process:
        """A real onward process (:func:`onward.testing.worker.spawn_worker`) in this group."""
        from onward.testing.worker import spawn_worker

        proc = spawn_worker(settings, name, log_dir=self.log_dir, **options)
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.started:
            proc.close()
        for proc in self.started:
            print(f"--- log of {proc.name} (pid {proc.pid}, exit {proc.returncode}) ---")
            print(proc.log_text()[-self.log_chars :])

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def onward_argv(database_url: str | None, *args: str) -> list[str]:
    """The command line of ``onward [--database-url URL] ARGS`` in this interpreter."""
    url = ["--database-url", database_url] if database_url is not None else []
    return [sys.executable, "-m", "onward.cli", *url, *args]


def run_onward(
    database_url: str | None,
    *args: str,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    log_level: str = "warning",
) -> subprocess.CompletedProcess[str]:
    """Run ``onward --database-url URL ARGS`` to completion (``publish``, ``start``, ``show``,
    ``migrate``, ``doctor``, ``bench``...), logging at ``log_level``; ``env`` adds to the
    environment. Its exit code, stdout and stderr (text); it is not checked.

    The process is forked from this test process's zygote (:mod:`onward.testing.zygote`: onward
    already imported) unless ``ONWARD_TEST_FORK=0`` or its environment needs a fresh
    interpreter (libfaketime, other ``PYTHON*`` settings)."""
    argv = onward_argv(database_url, *args)
    child_env = process_env(extra={"ONWARD_LOG_LEVEL": log_level, **(env or {})})
    if _forkable(child_env):
        return _Zygote.get().run(argv, child_env, cwd, timeout)
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=child_env, cwd=cwd, check=False
    )


def _forkable(env: Mapping[str, str]) -> bool:
    if os.environ.get("ONWARD_TEST_FORK", "1") == "0" or "LD_PRELOAD" in env:
        return False
    here = process_env()
    return all(
        env.get(k) == here.get(k) for k in {*env, *here} if k.startswith(("PYTHON", "FAKETIME"))
    )


class _Zygote:
    """This test process's zygote: started on first use, restarted if it died; it ends by itself
    when this process does."""

    _current: _Zygote | None = None

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="onward-zygote-")
        self.path = os.path.join(self.dir, "socket")
        self.owner = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "onward.testing.zygote", self.path],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=process_env(),
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the zygote did not start (exit {self.proc.wait()})")
        atexit.register(self.close)

    @classmethod
    def get(cls) -> _Zygote:
        zygote = cls._current
        if zygote is None or zygote.owner != os.getpid() or zygote.proc.poll() is not None:
            zygote = cls._current = cls()
        return zygote

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | Path | None,
        timeout: float,
    ) -> subprocess.CompletedProcess[str]:
        out = os.path.join(self.dir, f"{os.getpid()}-{next(_serial)}")
        files = (out + ".out", out + ".err")
        request = {
            "args": list(argv[3:]),  # after: python -m onward.cli
            "env": dict(env),
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
            "stdout": files[0],
            "stderr": files[1],
        }
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(self.path)
            conn.sendall(json.dumps(request).encode() + b"\n")
            reader = conn.makefile("rb")
            pid = int(reader.readline().split()[1])
            try:
                line = reader.readline()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(list(argv), timeout) from None
        returncode = int(line.split()[1])
        texts = []
        for name in files:
            with open(name, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
            os.unlink(name)
        return subprocess.CompletedProcess(list(argv), returncode, texts[0], texts[1])

    def close(self) -> None:
        if self.owner == os.getpid() and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_serial = itertools.count()


def run_python(
    code: str, *args: str, clock_offset: str | None = None, timeout: float = 60.0
) -> str:
    """Run ``code`` in a fresh interpreter (``python -c code args...``); its stdout. Raises
    ``AssertionError`` with its stderr when it fails."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=process_env(clock_offset=clock_offset),
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"python -c failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def loaded_modules(*imports: str, prefix: str = "onward") -> set[str]:
    """The modules named ``prefix`` or below it that a fresh interpreter has loaded after
    ``import`` of each of ``imports``."""
    code = "".join(f"import {name}\n" for name in imports) + (
        "import sys\n"
        f"print('\\n'.join(m for m in sys.modules if m == {prefix!r} "
        f"or m.startswith({prefix + '.'!r})))\n"
    )
    return set(run_python(code).split())


# -- what /proc says of a process (Linux) -------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server told to listen on it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (``/proc/PID/task/PID/children``); none if it is gone."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far (those gone count nothing)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def peak_rss_mb(pids: list[int]) -> float:
    """The largest peak resident set (VmHWM) among the processes, in MB."""
    peak = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except OSError:
            continue
    return round(peak / 1024, 1)
