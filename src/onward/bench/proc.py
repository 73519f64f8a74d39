"""Processes of the benches: ``python -m onward.bench.proc {worker|api|loop} ...``.

Each child opens what it needs (an engine, an API server, plain connections), prints one JSON
line ``{"event": "ready", ...}`` to stdout (the API's has its ``url`` and an admin API ``key`` of
its organisation, made before the clock starts, for the parent's requests) and waits for ``go`` on stdin, so the parent starts
every clock at the same instant and no process start-up is timed. A worker or an API server
then serves until ``stop`` (or the end of stdin); a loop runs until its work is drained. Each
child ends by printing ``{"event": "done", ...}`` with its own figures: what it did, its CPU
seconds and its peak resident memory (``VmHWM``).

:class:`Child` is the parent's side of that protocol.

``--what-if NAME`` (workers and the API; ``run(..., what_if=[...])`` of the benches, from
Python only) patches one change into the child, for diagnosis in the same sitting: the cost of
something measured as the difference it makes, never a default.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

from onward import loops
from onward.bench.ceiling import vm_kb


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")
    sys.stdout.flush()


async def _line() -> str:
    return (await asyncio.to_thread(sys.stdin.readline)).strip()


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _settings(url: str, org: str, queue: str = "postgres", **kw: Any) -> Any:
    from onward.config import Settings, env_start_batches

    kw.setdefault("start_batches", env_start_batches())
    return Settings(database_url=url, org_id=org, queue=queue, **kw)


async def warm_pool(pool: Any, n: int) -> None:
    """Open ``n`` pool connections now, so none is opened while the clock runs."""

    async def hold(ready: asyncio.Event, release: asyncio.Event) -> None:
        async with pool.connection():
            ready.set()
            await release.wait()

    release = asyncio.Event()
    readies = [asyncio.Event() for _ in range(n)]
    tasks = [asyncio.create_task(hold(r, release)) for r in readies]
    await asyncio.gather(*(r.wait() for r in readies))
    release.set()
    await asyncio.gather(*tasks)


SQL_FILES = (
    "leases.sql",
    "outbox.sql",
    "sweep.sql",
    "timers.sql",
    "leader.sql",
    "start.sql",
    "effects.sql",
    "history.sql",
)


class SqlCounter:
    """Counts every statement this process sends (by its name in onward's ``.sql`` files) and
    the time spent awaiting it: where a worker's round trips go. Installed by patching
    ``psycopg.AsyncCursor.execute``, through which every ``conn.execute`` passes."""

    def __init__(self) -> None:
        from onward.db.sql import load

        self.names: dict[str, str] = {}
        for fname in SQL_FILES:
            try:
                for name, text in load("onward", fname).items():
                    self.names[text] = f"{fname[:-4]}.{name}"
            except (FileNotFoundError, ValueError):
                continue
        self.count: dict[str, int] = {}
        self.ms: dict[str, float] = {}

    def label(self, query: Any) -> str:
        text = query if isinstance(query, str) else str(query)
        if text in self.names:
            return self.names[text]
        if not text.strip():
            return "(empty query: pool check)"
        return " ".join(text.split())[:48]

    def install(self) -> None:
        import psycopg

        original = psycopg.AsyncCursor.execute
        counter = self

        async def execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            label = counter.label(query)
            t0 = time.perf_counter()
            try:
                return await original(self, query, params, **kw)
            finally:
                counter.count[label] = counter.count.get(label, 0) + 1
                counter.ms[label] = counter.ms.get(label, 0.0) + (time.perf_counter() - t0) * 1e3

        psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]

    def reset(self) -> None:
        self.count.clear()
        self.ms.clear()

    def report(self) -> dict[str, dict[str, float]]:
        return {
            k: {"n": n, "ms": round(self.ms[k], 1)}
            for k, n in sorted(self.count.items(), key=lambda kv: -kv[1])
        }


async def _simple_check(conn: Any) -> None:
    await conn.execute("", prepare=False)


def _pool_check() -> Any:
    from psycopg_pool import AsyncConnectionPool

    return AsyncConnectionPool.check_connection


# the pool's health check on every checkout: psycopg_pool's own (with prepare_threshold=0 an
# empty query is prepared again each time: two round trips and two commits), or one simple
# round trip, or none
POOL_WHAT_IF: dict[str, Any] = {
    "pool-check": _pool_check,
    "simple-pool-check": lambda: _simple_check,
    "no-pool-check": lambda: None,
}


# Diagnosis only, never a default: how the engine would do with one change, in the same
# sitting. A pool change patches this process's pool after Engine.open made it; the others
# patch a class before the worker starts.
WHAT_IF: dict[str, Any] = {**POOL_WHAT_IF}


class TimerTrace:
    """Where a timer's time goes inside a worker (``--trace-timers``): when each timer wake
    arrived (this process's clock, which on one machine is the database's), and each call of
    ``timers.fire`` -- its start and end, how many timers it was asked to fire and fired, and
    by whom (``wake`` or ``sweep``). Installed by patching ``Worker.on_wake`` and
    ``timers.fire``; the parent joins it with the timers' own ``due_at`` and ``fired_at``."""

    def __init__(self) -> None:
        self.received: dict[int, float] = {}  # timer_id -> first arrival of its wake
        self.fired: dict[int, int] = {}  # timer_id -> the index of the call that fired it
        self.calls: list[tuple[str, float, float, int, int]] = []

    def install(self) -> None:
        from onward import timers
        from onward.worker import Worker

        trace = self
        on_wake, fire = Worker.on_wake, timers.fire

        def traced_on_wake(self: Any, wake: Any) -> None:
            timer_id = wake.payload.get("timer_id") if wake.topic == "timer" else None
            if isinstance(timer_id, int):
                trace.received.setdefault(timer_id, time.time())
            on_wake(self, wake)

        async def traced_fire(conn: Any, batch: Any, *, by: str, **kw: Any) -> Any:
            t0 = time.time()
            out = await fire(conn, batch, by=by, **kw)
            trace.calls.append((by, t0, time.time(), len(batch), len(out)))
            for f in out:
                trace.fired[f["timer_id"]] = len(trace.calls) - 1
            return out

        Worker.on_wake = traced_on_wake  # type: ignore[method-assign]
        timers.fire = traced_fire  # type: ignore[assignment]

    def report(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "fired": self.fired,
            "calls": self.calls,
        }


def _knobs(pairs: list[str]) -> dict[str, Any]:
    """``--set NAME=VALUE`` (repeatable): a Settings field of the worker, typed as its default
    is, int or float (the batching knobs the latency bench tunes: ``relay_poll_seconds=0.05``)."""
    from dataclasses import fields

    from onward.config import Settings

    kinds = {f.name: type(f.default).__name__ for f in fields(Settings) if f.init}
    cast: dict[str, Any] = {"int": lambda v: int(float(v)), "float": float}
    out: dict[str, Any] = {}
    for pair in pairs:
        name, _, raw = pair.partition("=")
        if kinds.get(name) not in cast:
            raise SystemExit(f"--set {pair!r}: not a numeric Settings field")
        out[name] = cast[kinds[name]](raw)
    return out


async def _worker(a: argparse.Namespace) -> None:
    from onward import metrics
    from onward.engine import Engine
    from onward.worker import Worker, lanes_from_spec

    metrics.configure(a.metrics)  # off: every increment returns at once
    settings = _settings(
        a.url,
        a.org,
        a.queue,
        poll_seconds=a.poll,
        sweep_seconds=a.sweep,
        redis_url=a.redis_url,
        queue_prefix=a.prefix,
        **_knobs(a.set),
    )
    lanes = lanes_from_spec(a.lanes, {})
    sql = SqlCounter() if a.count_sql else None
    if sql is not None:
        sql.install()
    trace = TimerTrace() if a.trace_timers else None
    if trace is not None:
        trace.install()
    for what in a.what_if:
        if what not in POOL_WHAT_IF:
            WHAT_IF[what]()
    async with (
        metrics.serving(a.metrics_port) as metrics_port,
        Engine.open(settings, migrate=False, pool_size=a.pool) as engine,
    ):
        for what in a.what_if:
            if what in POOL_WHAT_IF:
                engine.pool._check = POOL_WHAT_IF[what]()
        await warm_pool(engine.pool, a.pool)
        for automation_id in a.automation:  # the version cache, as a long-running worker has it
            await engine.versions.get(a.org, automation_id, 1)
        svc = engine.background(worker=False, relay=a.relay, sweeper=a.sweeper)
        worker = Worker(
            engine.pool,
            engine.queue,
            settings=settings,
            registry=engine.registry,
            versions=engine.versions,
            worker_id=engine.id,
            lanes=lanes,
            eager=a.eager,
            claim_batch=a.batch,
            integrations=engine.integrations,
        )
        svc.worker = worker
        # as `onward worker` does once started (onward.cli._serve): what start-up made is
        # frozen out of the collector's sight, so a collection walks only what steps made
        gc.collect()
        gc.freeze()
        _emit(
            "ready",
            lanes=lanes,
            batch=a.batch,
            pool=a.pool,
            relay=a.relay,
            metrics_port=metrics_port,
        )
        await _line()  # go
        if sql is not None:
            sql.reset()
        cpu0, t0 = _cpu_s(), time.perf_counter()
        task = asyncio.create_task(engine.run_background(svc))
        await _line()  # stop
        cpu1, t1 = _cpu_s(), time.perf_counter()
        statements = sql.report() if sql is not None else {}
        svc.stop.set()
        await task
        relayed = svc.relay.published if svc.relay is not None else 0
    _emit(
        "done",
        stats=worker.stats.__dict__,
        relayed=relayed,
        statements=statements,
        timer_trace=trace.report() if trace is not None else None,
        cpu_s=round(cpu1 - cpu0, 3),
        wall_s=round(t1 - t0, 3),
        vm_hwm_kb=vm_kb(os.getpid(), "VmHWM"),
        vm_rss_kb=vm_kb(os.getpid(), "VmRSS"),
    )


def _inline_sync_deps() -> None:
    """Call FastAPI's plain-``def`` dependencies inline, as ``async def`` ones would be,
    instead of on a worker thread each (three thread hops per webhook request today)."""
    import fastapi.dependencies.utils as fdu

    async def inline(func: Any, *args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    fdu.run_in_threadpool = inline


def _no_key() -> None:
    """The webhook route as it was before API keys (issue 14): it asks for no key and acts for
    the process's own organisation -- the figure authentication is measured against."""
    from onward.api import scopes

    scopes.ROUTES[("POST", "/v1/hooks/{automation_id}")] = scopes.PUBLIC


API_WHAT_IF: dict[str, Any] = {"inline-deps": _inline_sync_deps, "no-key": _no_key}


async def _api(a: argparse.Namespace) -> None:
    from onward.api.app import create_app
    from onward.api.server import ApiServer
    from onward.engine import Engine

    for what in a.what_if:
        API_WHAT_IF[what]()
    settings = _settings(a.url, a.org)
    async with Engine.open(settings, migrate=False, pool_size=a.pool, start_queue=False) as engine:
        await warm_pool(engine.pool, a.pool)
        _, key = await engine.create_key("bench", ["admin"], by="bench")
        app = create_app(engine)
        async with ApiServer(app, port=0, log_level="warning", access_log=False) as api:
            _emit("ready", url=api.url, key=key)
            await _line()  # go
            cpu0 = _cpu_s()
            await _line()  # stop
            cpu1 = _cpu_s()
    _emit("done", cpu_s=round(cpu1 - cpu0, 3), vm_hwm_kb=vm_kb(os.getpid(), "VmHWM"))


async def _loop(a: argparse.Namespace) -> None:
    from onward.bench.ceiling import loop

    marks: dict[str, float] = {}

    async def go() -> None:
        _emit("ready", conns=a.conns, kind=a.kind)
        await _line()
        marks["cpu0"] = _cpu_s()

    async def drained(elapsed: float) -> None:
        marks["cpu1"] = _cpu_s()
        _emit("drained", elapsed_s=elapsed)
        await _line()  # stop

    res = await loop(
        a.url,
        kind=a.kind,
        conns=a.conns,
        batch=a.batch,
        steps=a.steps,
        lane=a.lane,
        go=go,
        drained=drained,
    )
    _emit(
        "done",
        **res,
        cpu_s=round(marks.get("cpu1", 0.0) - marks.get("cpu0", 0.0), 3),
        vm_hwm_kb=vm_kb(os.getpid(), "VmHWM"),
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m onward.bench.proc")
    sub = p.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("worker", help="an engine worker (+ relay, sweeper) serving some lanes")
    w.add_argument("--url", required=True)
    w.add_argument("--org", default="bench")
    w.add_argument("--lanes", default="fast=128")
    w.add_argument("--batch", type=int, default=128)
    w.add_argument("--pool", type=int, default=10)
    w.add_argument("--poll", type=float, default=2.0)
    w.add_argument("--sweep", type=float, default=2.0)
    w.add_argument("--queue", choices=("postgres", "redis", "none"), default="postgres")
    w.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    w.add_argument("--prefix", default="onward", help="the queue's prefix (ONWARD_QUEUE_PREFIX)")
    w.add_argument("--set", action="append", default=[], help="a Settings knob: NAME=VALUE")
    w.add_argument("--automation", action="append", default=[])
    w.add_argument("--relay", action=argparse.BooleanOptionalAction, default=True)
    w.add_argument("--sweeper", action=argparse.BooleanOptionalAction, default=True)
    w.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True)
    w.add_argument("--count-sql", action="store_true", help="count statements by name")
    w.add_argument(
        "--trace-timers", action="store_true", help="time timer wakes and fires (TimerTrace)"
    )
    w.add_argument("--metrics", choices=("on", "off"), default="on", help="ONWARD_METRICS")
    w.add_argument("--metrics-port", type=int, help="serve /metrics on this port (0: any)")
    w.add_argument("--what-if", action="append", default=[], choices=sorted(WHAT_IF))
    api = sub.add_parser("api", help="the HTTP API on a free port (no worker)")
    api.add_argument("--url", required=True)
    api.add_argument("--org", default="bench")
    api.add_argument("--pool", type=int, default=10)
    api.add_argument("--what-if", action="append", default=[], choices=sorted(API_WHAT_IF))
    lp = sub.add_parser("loop", help="a plain psycopg claim/settle loop (the ceiling)")
    lp.add_argument("--url", required=True)
    lp.add_argument("--kind", choices=("minimal", "grouped", "engine"), default="minimal")
    lp.add_argument("--conns", type=int, default=10)
    lp.add_argument("--batch", type=int, default=32)
    lp.add_argument("--steps", type=int, default=3)
    lp.add_argument("--lane", default="io")
    return p


def main(argv: list[str] | None = None) -> None:
    a = _parser().parse_args(argv)
    mode = {"worker": _worker, "api": _api, "loop": _loop}[a.mode]
    loops.run(mode(a))  # the loop `onward worker` and `onward api` run on


# -- the parent's side ------------------------------------------------------------------------


class ChildFailed(RuntimeError):
    pass


class Child:
    """One bench process: start it, wait for its ``ready``, send ``go``/``stop``, read ``done``."""

    def __init__(self, *args: str) -> None:
        self.args = args
        # closed by kill(): it outlives this method, as the child does
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "onward.bench.proc", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            bufsize=1,
        )
        self.ready: dict[str, Any] = {}
        self.done: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_tail(self, lines: int = 15) -> str:
        self._err.seek(0)
        text = self._err.read().decode(errors="replace")
        return "\n".join(text.strip().splitlines()[-lines:])

    def expect(self, event: str, timeout: float = 120.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChildFailed(f"{self.args[0]} {self.pid}: no {event!r} in {timeout}s")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                continue
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(timeout=5)
                raise ChildFailed(
                    f"{self.args[0]} {self.pid} exited ({self.proc.returncode}) before "
                    f"{event!r}:\n{self.stderr_tail()}"
                )
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # not ours (a stray print)
            if msg.get("event") == event:
                return dict(msg)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        self.ready = self.expect("ready", timeout)
        return self.ready

    def finish(self, timeout: float = 120.0) -> dict[str, Any]:
        self.done = self.expect("done", timeout)
        self.proc.wait(timeout=timeout)
        return self.done

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._err.close()


if __name__ == "__main__":
    main()
