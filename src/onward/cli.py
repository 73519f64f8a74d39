"""The ``onward`` command line.

    onward init [DIR] [--template T]    a working project of your own (onward.init)
    onward demo [--keep]                everything in one process, on the embedded PostgreSQL
    onward status [--json]              what runs: the embedded server, database, leaders, queue
    onward stop                         stop the embedded PostgreSQL
    onward up                           API + worker + relay + sweeper until SIGINT/SIGTERM
    onward worker [--lanes fast=64,io=16]   worker + relay + sweeper (no API)
    onward api [--host H --port P]      the HTTP API only
    onward migrate [--status|--verify]  database migrations
    onward publish [FILE|DIR]           publish a document, a folder of them (one transaction),
                                        or, with no argument, the automations of --app M:ATTR
    onward start AUTOMATION [--payload JSON|@file] [--event-id ID] [--key K]
    onward runs [--status S] [--automation A] [--limit N]
    onward runs migrate --automation A --from 3 --to 4 [--map old:new,...]
        [--removed-step-policy park|skip-to:STEP|cancel] [--dry-run]   move runs between versions
    onward show RUN                     one run's timeline
    onward review resolve RUN --happened --reference REF | --retry | --skip   [--by WHO]
    onward resume RUN [--by WHO]        a parked run's step is ready again
    onward fork RUN [--from-step STEP] [--version V] [--by WHO]   retry a failed run, as a new one
    onward audit [--action A] [--since T] [--before ID] [--json]   who changed what, newest first
    onward sandbox [--host H --port P]  the fake providers, for trying connectors

Global options (before the command) override the environment: ``--app`` (ONWARD_APP: import
your module first, see ``onward.userapp``), ``--database-url`` (ONWARD_DATABASE_URL; unset =
embedded PostgreSQL), ``--queue`` (ONWARD_QUEUE), ``--org`` (ONWARD_ORG), ``--redis-url``
(ONWARD_REDIS_URL), ``--data-dir`` (ONWARD_DATA_DIR); below both, ``onward.toml`` in the working
folder (:mod:`onward.init.project`).
Listing and inspecting commands take ``--json``: the same bodies the HTTP API answers.

Exit codes: 0 success; 1 a runtime failure (database unreachable, run not finished, migration
problems found by ``--verify``); 2 a problem with what was asked (invalid automation, unknown run
or automation, payload too large, bad configuration) -- one line per problem on stderr, no
traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import psycopg
import typer

from onward.cli_schedules import schedules_app
from onward.config import QUEUES, Settings
from onward.errors import InvalidAutomation, InvalidInput, OnwardError
from onward.init.project import Connection as ProjectConnection
from onward.init.project import read_project
from onward.userapp import Document, UserApp, load_app

if TYPE_CHECKING:
    from onward.api import ApiServer
    from onward.automations.versions import Published
    from onward.engine import Engine

T = TypeVar("T")
log = logging.getLogger("onward.cli")

app = typer.Typer(
    name="onward",
    help="onward: a durable workflow engine. PostgreSQL stores what happened and what must "
    "happen next; a queue only wakes workers."
    "\n\n\b\nExample:\n    onward --app hello_app:app up",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(schedules_app)  # onward schedules list|pause|resume|trigger


class UsageProblem(Exception):
    """A problem with what the user asked (a bad flag value, unreadable file): exit 2."""


LogLevelOpt = Annotated[
    str,
    typer.Option(
        "--log-level",
        envvar="ONWARD_LOG_LEVEL",
        show_envvar=True,
        help="debug, info, warning, error: every component's level",
    ),
]
CommandLogLevelOpt = Annotated[
    str | None,
    typer.Option(
        "--log-level",
        envvar="ONWARD_LOG_LEVEL",
        show_envvar=True,
        help="debug, info, warning, error: every component's level (as the global option)",
    ),
]
LogLevelsOpt = Annotated[
    str | None,
    typer.Option(
        "--log-levels",
        envvar="ONWARD_LOG_LEVELS",
        show_envvar=True,
        metavar="LOGGER=LEVEL,...",
        help="levels per component, e.g. onward.worker=debug,onward.queue=warning",
    ),
]


def _reconfigure_logs(ctx: typer.Context, level: str | None, levels: str | None) -> None:
    """``up`` and ``worker`` take the logging flags after the command name as well."""
    if level is None and levels is None:
        return
    globals_: Globals = ctx.obj
    _configure_logs(level or globals_.log_level, levels or globals_.log_levels)


def _configure_logs(level: str, levels: str | None) -> None:
    """Structured logs (``onward.logs``): JSON on stderr unless it is a terminal."""
    from onward import logs

    try:
        logs.configure(level, levels)
    except OnwardError as exc:  # a bad level or spec: one line, exit 2
        raise UsageProblem(str(exc)) from None


# -- global options --------------------------------------------------------------------------


class Globals:
    def __init__(
        self,
        user_app: UserApp | None = None,
        *,
        log_level: str = "info",
        log_levels: str | None = None,
        **overrides: Any,
    ) -> None:
        self.user_app = user_app
        self.log_level, self.log_levels = log_level, log_levels
        self.overrides = overrides
        #: the connections ``onward.toml`` declares (connected when the app is published)
        self.connections: list[ProjectConnection] = []

    def settings(self, **extra: Any) -> Settings:
        overrides = {**self.overrides, **extra}
        if not overrides.get("data_dir") and not os.environ.get("ONWARD_DATA_DIR"):
            from onward.db.embedded import default_data_dir

            overrides["data_dir"] = default_data_dir()
        return Settings.from_env(**{k: v for k, v in overrides.items() if v not in (None, "")})


@app.callback()
def _globals(
    ctx: typer.Context,
    app_spec: Annotated[
        str | None,
        typer.Option(
            "--app",
            envvar="ONWARD_APP",
            show_envvar=True,
            metavar="MODULE[:ATTR]",
            help="import your module first (the current folder is importable): its step kinds, "
            "connectors and, with :ATTR, its automations",
        ),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            envvar="ONWARD_DATABASE_URL",
            show_envvar=True,
            help="PostgreSQL URL; unset: start the embedded PostgreSQL.",
        ),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue", envvar="ONWARD_QUEUE", show_envvar=True, help=f"one of {', '.join(QUEUES)}"
        ),
    ] = None,
    org: Annotated[
        str | None,
        typer.Option("--org", envvar="ONWARD_ORG", show_envvar=True, help="organisation id"),
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option("--redis-url", envvar="ONWARD_REDIS_URL", show_envvar=True),
    ] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(
            "--data-dir",
            envvar="ONWARD_DATA_DIR",
            show_envvar=True,
            help="embedded PostgreSQL folder (default /var/lib/onward as root, else ./.onward)",
        ),
    ] = None,
    log_level: LogLevelOpt = "info",
    log_levels: LogLevelsOpt = None,
) -> None:
    _configure_logs(log_level, log_levels)
    # onward.toml in this folder: below the flags and ONWARD_* variables, above the defaults
    project = read_project()
    given = project.settings
    app_spec = app_spec or given.get("app")
    user_app = load_app(app_spec) if app_spec else None
    ctx.obj = Globals(
        user_app,
        log_level=log_level,
        log_levels=log_levels,
        database_url=database_url or given.get("database_url"),
        queue=queue or given.get("queue"),
        org_id=org or given.get("org"),
        redis_url=redis_url or given.get("redis_url"),
        data_dir=data_dir or given.get("data_dir"),
    )
    ctx.obj.connections = project.connections


def _settings(ctx: typer.Context, **extra: Any) -> Settings:
    globals_: Globals = ctx.obj
    return globals_.settings(**extra)


def _app_automations(ctx: typer.Context) -> list[tuple[str, Document]]:
    """The automations named by ``--app MODULE:ATTR`` (none without ATTR or --app)."""
    globals_: Globals = ctx.obj
    return globals_.user_app.automations if globals_.user_app is not None else []


# -- helpers ---------------------------------------------------------------------------------

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]


def _run(coro: Coroutine[Any, Any, T]) -> T:
    from onward import loops

    return loops.run(_acting(coro))


def cli_actor() -> str:
    """Who acts from the CLI (the audit's actor): ``$ONWARD_OPERATOR``, else the login name."""
    import getpass

    try:
        return os.environ.get("ONWARD_OPERATOR") or getpass.getuser()
    except Exception:  # no login name (a container without a user entry)
        return "operator"


async def _acting(coro: Coroutine[Any, Any, T]) -> T:
    from onward import audit

    audit.act_as(cli_actor())  # in this run's own context: nothing leaks to the caller's
    return await coro


async def _has_live_key(engine: Engine) -> bool:
    """Whether the engine's organisation has a live API key: a hint at start, never a reason
    to stop (a lost connection answers "yes", and the API starts as it would)."""
    from onward.db import read

    try:
        return any(k["revoked_at"] is None for k in await read(engine.pool, engine.keys))
    except (psycopg.Error, OnwardError):
        return True


def _progress(line: str) -> None:
    typer.echo(line, err=True)


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _open(settings: Settings, **kw: Any) -> Any:
    from onward.engine import Engine

    kw.setdefault("start_queue", False)
    kw.setdefault("pool_size", 4)
    return Engine.open(settings, **kw)


def _parse_payload(text: str | None) -> dict[str, Any]:
    """``--payload``: JSON, ``@file`` or ``@-`` (stdin). What PostgreSQL could not store (too
    deep, ``\u0000``, a lone surrogate, NaN, 1e400, bytes that are not UTF-8) is refused with
    ``InvalidInput`` before anything is stored."""
    from onward.inputs import parse_json

    if text is None:
        return {}
    source = "--payload"
    raw: str | bytes = text
    if text.startswith("@"):
        path = text[1:]
        source = path
        try:
            raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        except OSError as exc:
            raise UsageProblem(f"--payload: cannot read {path}: {exc.strerror}") from None
    value = parse_json(raw, source)
    if not isinstance(value, dict):
        raise UsageProblem(f"{source}: the payload must be a JSON object")
    return value


# The flags of ``start`` that become fields of the API's StartRequest, which bounds them.
_START_FLAGS = {"automation_id": "AUTOMATION", "event_id": "--event-id", "key": "--key"}


def _check_start_ids(*, automation: str, event_id: str | None, key: str | None) -> None:
    """Refuse ids the API would refuse (an event id over 256 characters, ...) and text that
    is not UTF-8 (a lone surrogate from undecodable argv bytes)."""
    from pydantic import ValidationError

    from onward.api.models import StartRequest

    given = {"automation_id": automation, "event_id": event_id, "key": key}
    for name, value in given.items():
        try:
            (value or "").encode("utf-8")
        except UnicodeEncodeError:
            raise UsageProblem(f"{_START_FLAGS[name]}: not valid UTF-8 text") from None
    try:
        StartRequest.model_validate(given)
    except ValidationError as exc:
        err = exc.errors()[0]
        flag = _START_FLAGS.get(str(err["loc"][0]), str(err["loc"][0]))
        raise UsageProblem(f"{flag}: {err['msg']}") from None


def _parse_lanes(text: str | None) -> dict[str, int] | None:
    """``fast=64,io=16`` -> {"fast": 64, "io": 16}: the lanes this worker serves."""
    if not text:
        return None
    from onward.kinds import LANE_NAME, LANES

    lanes: dict[str, int] = {}
    for part in text.split(","):
        name, _, raw = part.strip().partition("=")
        if not LANE_NAME.match(name):
            raise UsageProblem(
                f"--lanes: {name!r} is not a lane name (lower-case letters, digits and _; "
                f"the built-in lanes: {', '.join(LANES)})"
            )
        if not raw.isdigit() or int(raw) < 1:
            raise UsageProblem(f"--lanes: {name}={raw!r}: the capacity must be a whole number >= 1")
        lanes[name] = int(raw)
    return lanes


# -- migrate ---------------------------------------------------------------------------------


@app.command()
def migrate(
    ctx: typer.Context,
    status: Annotated[
        bool, typer.Option("--status", help="list migrations; apply nothing")
    ] = False,
    verify: Annotated[
        bool, typer.Option("--verify", help="exit 1 if any is pending or was changed")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Apply pending database migrations (or list them, or verify them).

    \b
    Example:
        onward migrate --status
    """
    from onward.db import migrate as migrations
    from onward.db import resolve_url

    url = resolve_url(_settings(ctx))
    if not status and not verify:
        done = migrations.apply(url)
        if as_json:
            _print_json({"applied": [{"version": m.version, "name": m.name} for m in done]})
        elif done:
            for m in done:
                typer.echo(f"applied {m.version:04d}_{m.name}")
        else:
            typer.echo("nothing to apply: the database is up to date")
        return
    rows = migrations.status(url)
    problems = migrations.verify(url) if verify else []
    if as_json:
        out: dict[str, Any] = {"migrations": rows}
        if verify:
            out.update(ok=not problems, problems=problems)
        _print_json(out if verify else rows)
    else:
        if status:
            for row in rows:
                state = "applied" if row["applied"] else "pending"
                check = "" if row["checksum_ok"] else "  CHANGED AFTER IT WAS APPLIED"
                typer.echo(f"{row['version']:04d}_{row['name']:<30} {state}{check}")
        for problem in problems:
            typer.echo(f"onward: {problem}", err=True)
        if verify and not problems:
            typer.echo(f"ok: {len(rows)} migration(s) applied, none changed")
    if problems:
        raise typer.Exit(1)


# -- automations and runs --------------------------------------------------------------------


DOCUMENT_SUFFIXES = (".yaml", ".yml", ".json")


def _documents(ctx: typer.Context, target: Path | None) -> list[tuple[str, Document]]:
    """What ``publish`` publishes: a file, every document in a folder, or the app's."""
    from onward.automations.document import load_file

    if target is None:
        found = _app_automations(ctx)
        if not found:
            raise UsageProblem(
                "publish: give a FILE or DIR, or --app MODULE:ATTR naming your automations"
            )
        return found
    if not target.is_dir():
        return [(str(target), load_file(target))]
    files = sorted(
        p for p in target.iterdir() if p.suffix.lower() in DOCUMENT_SUFFIXES and p.is_file()
    )
    if not files:
        raise UsageProblem(f"{target}: no {', '.join('*' + s for s in DOCUMENT_SUFFIXES)} files")
    documents: list[tuple[str, Document]] = []
    problems: list[str] = []
    for path in files:
        try:
            documents.append((str(path), load_file(path)))
        except InvalidAutomation as exc:
            problems.extend(exc.problems)
        except InvalidInput as exc:
            text = _first_line(exc)
            problems.append(text if text.startswith(str(path)) else f"{path}: {text}")
    if problems:
        raise InvalidAutomation(problems)
    return documents


def _published_line(published: Published) -> str:
    if published.created:
        return f"published {published.automation_id} version {published.version}"
    return f"{published.automation_id} version {published.version} unchanged"


async def _publish_documents(
    engine: Engine, documents: list[tuple[str, Document]]
) -> list[Published]:
    return await engine.publish_all(documents)


def _connections(ctx: typer.Context) -> list[ProjectConnection]:
    globals_: Globals = ctx.obj
    return globals_.connections


async def _connect(engine: Engine, connections: Sequence[ProjectConnection]) -> None:
    """Add the connections ``onward.toml`` declares (or replace their credentials)."""
    for c in connections:
        await engine.integrations.add_connection(
            engine.org_id,
            c.connection_id,
            provider=c.provider,
            base_url=c.base_url,
            account=c.account,
            secret=c.secret,
            actor=cli_actor(),
        )
        _progress(f"connected {c.connection_id} ({c.provider}, from onward.toml)")


@app.command()
def publish(
    ctx: typer.Context,
    target: Annotated[
        Path | None,
        typer.Argument(
            metavar="[FILE|DIR]",
            help="an automation document (YAML or JSON), or a folder of them (*.yaml, *.yml, "
            "*.json; one transaction: all or none). None: the automations of --app MODULE:ATTR",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Publish automations as new immutable versions ("unchanged" if identical).

    \b
    Example:
        onward --app welcome_app publish flows/
    """
    documents = _documents(ctx, target)

    async def go() -> list[Published]:
        async with _open(_settings(ctx)) as engine:
            published = await _publish_documents(engine, documents)
            await _connect(engine, _connections(ctx))
            return published

    published = _run(go())
    single = target is not None and not target.is_dir()
    answers = [
        {
            "automation_id": p.automation_id,
            "version": p.version,
            "digest": p.digest,
            "created": p.created,
            **({} if single else {"source": source}),
        }
        for p, (source, _) in zip(published, documents, strict=True)
    ]
    if as_json:
        _print_json(answers[0] if single else answers)
        return
    for p, (source, _) in zip(published, documents, strict=True):
        typer.echo(_published_line(p) + ("" if single else f"  ({source})"))


@app.command()
def start(
    ctx: typer.Context,
    automation: Annotated[str, typer.Argument(help="the automation id")],
    payload: Annotated[
        str | None,
        typer.Option("--payload", "-p", help="the run's input: JSON, @file, or @- for stdin"),
    ] = None,
    event_id: Annotated[
        str | None, typer.Option("--event-id", help="the provider's event id (start key)")
    ] = None,
    key: Annotated[str | None, typer.Option("--key", help="your own start key")] = None,
    version: Annotated[int | None, typer.Option("--version", min=1)] = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a run. A second start with the same key is a duplicate: the same run, not an error.

    Start key: --key, else --event-id, else a hash of the payload (weaker: identical payloads
    collapse into one run).

    \b
    Example:
        onward start welcome --payload '{"name": "Maya"}' --event-id evt_7Hq2
    """
    from onward.api.models import StartAnswer
    from onward.start import start_key_for

    _check_start_ids(automation=automation, event_id=event_id, key=key)
    data = _parse_payload(payload)

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await engine.start(automation, data, event_id=event_id, key=key, version=version)

    started = _run(go())
    kind = start_key_for(automation, data, event_id, key)[1]
    if as_json:
        answer = StartAnswer(
            run_id=started.run_id,
            created=started.created,
            duplicate=not started.created,
            start_key=started.start_key,
            start_key_kind=kind,
        )
        _print_json(answer.model_dump(mode="json"))
    elif started.created:
        typer.echo(f"started {started.run_id}  (start key {started.start_key} [{kind}])")
    else:
        typer.echo(f"duplicate: {started.run_id} was already started by {started.start_key}")


@app.command("start-many")
def start_many(
    ctx: typer.Context,
    source: Annotated[
        str, typer.Argument(help="a file of starts (JSON lines or one JSON array), or - for stdin")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="one JSON answer per line (stable keys)")
    ] = False,
) -> None:
    """Start up to 1,000 runs in one statement: each start is what POST /v1/runs takes
    ({"automation_id": ..., "input": {...}, "event_id"?, "key"?, "version"?, "contact_id"?}).

    One answer per start, in order. The batch is whole or nothing: a bad start, an unknown
    automation or an erased contact starts nothing (exit 2, naming the start).

    \b
    Example:
        onward start-many starts.jsonl
    """
    from pydantic import ValidationError

    from onward.api.models import StartBatchItem, StartBatchRequest
    from onward.inputs import parse_json
    from onward.start import Start, start_key_kind

    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        raise UsageProblem(f"{source}: cannot read: {exc.strerror}") from None
    text = raw.lstrip()
    if text.startswith((b"[", b"\xef\xbb\xbf[")):
        items = parse_json(raw, source)
    else:  # JSON lines: one start a line, blank lines skipped
        items = [
            parse_json(line, f"{source} line {n}")
            for n, line in enumerate(raw.splitlines(), 1)
            if line.strip()
        ]
    try:
        batch = StartBatchRequest.model_validate({"starts": items})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UsageProblem(f"{source}: {where}: {err['msg']}") from None
    starts = [
        Start(s.automation_id, s.input, s.event_id, s.key, s.version, s.contact_id)
        for s in batch.starts
    ]

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await engine.start_many(starts)

    for i, (started, s) in enumerate(zip(_run(go()), starts, strict=True)):
        kind = start_key_kind(s.event_id, s.key)
        if as_json:
            answer = StartBatchItem(
                index=i,
                run_id=started.run_id,
                created=started.created,
                duplicate=not started.created,
                start_key=started.start_key,
                start_key_kind=kind,
            )
            typer.echo(answer.model_dump_json())
        elif started.created:
            typer.echo(f"{i}: started {started.run_id}  (start key {started.start_key} [{kind}])")
        else:
            typer.echo(
                f"{i}: duplicate: {started.run_id} was already started by {started.start_key}"
            )


runs_app = typer.Typer(
    name="runs",
    help="List runs, newest first; `onward runs migrate` moves runs between versions."
    "\n\n\b\nExample:\n    onward runs --status completed --limit 10",
    invoke_without_command=True,
)
app.add_typer(runs_app)  # onward runs [--status S ...] | onward runs migrate ...


@runs_app.callback()
def runs(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option("--status", help="e.g. active, completed")] = None,
    automation: Annotated[str | None, typer.Option("--automation", help="automation id")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List runs, newest first.

    \b
    Example:
        onward runs --status parked --automation welcome
    """
    if ctx.invoked_subcommand is not None:
        return
    from onward.api.models import RunSummary

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await engine.runs(status=status, automation_id=automation, limit=limit)

    rows = [RunSummary.model_validate(r) for r in _run(go())]
    if as_json:
        _print_json([r.model_dump(mode="json") for r in rows])
        return
    if not rows:
        typer.echo("no runs")
        return
    typer.echo(f"{'RUN':<30} {'AUTOMATION':<24} {'V':>3} {'STATUS':<10} {'STEPS':>5}  CREATED")
    for r in rows:
        reason = f"  ({r.status_reason})" if r.status_reason else ""
        typer.echo(
            f"{r.run_id:<30} {r.automation_id:<24} {r.version:>3} {r.status:<10} "
            f"{r.steps_executed:>5}  {r.created_at.isoformat(timespec='seconds')}{reason}"
        )


@app.command()
def show(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="a run id")],
    as_json: JsonOpt = False,
) -> None:
    """One run on one screen: every transition in order.

    \b
    Example:
        onward show run_01a2342e4f04fd923c735242
    """
    from onward.api.models import RunView
    from onward.history import render_timeline

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await engine.show(run_id)

    view = _run(go())
    if as_json:
        _print_json(RunView.model_validate(view).model_dump(mode="json"))
    else:
        typer.echo(render_timeline(view))


# -- long-running processes ------------------------------------------------------------------


def _on_signals(stop: asyncio.Event, on_second: Callable[[], None]) -> None:
    """SIGINT/SIGTERM: the first sets ``stop`` (graceful); a second one hurries."""
    loop = asyncio.get_running_loop()
    seen = 0

    def handler(sig: signal.Signals) -> None:
        nonlocal seen
        seen += 1
        if seen == 1:
            log.info("%s: shutting down gracefully (again to hurry)", sig.name)
            stop.set()
        else:
            log.warning("%s again: not waiting for the grace period", sig.name)
            on_second()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handler, sig)


async def _serve(
    settings: Settings,
    *,
    api_at: tuple[str, int] | None,
    background: bool,
    lanes: dict[str, int] | None = None,
    relay: bool = True,
    sweeper: bool = True,
    documents: Sequence[tuple[str, Document]] = (),
    connections: Sequence[ProjectConnection] = (),
    metrics_host: str = "127.0.0.1",
    api_sock: socket.socket | None = None,
    parent_pid: int | None = None,
) -> None:
    """Publish ``documents`` (the app's automations, for ``up``), then run the API and/or
    the background tasks until a signal, then stop in order: first the API (no new starts),
    then the background tasks (workers drain within the grace). ``api_sock``: a listening
    socket bound before; ``parent_pid``: stop, gracefully, when that process is gone (an API
    process of ``onward api --workers N`` whose supervisor died)."""
    from onward import metrics

    metrics.configure(settings.metrics)
    own_port = settings.metrics_port if api_at is None else None  # else: the API's /metrics
    async with (
        metrics.serving(own_port, metrics_host) as metrics_port,
        _open(settings, start_queue=background, pool_size=20) as engine,
    ):
        if metrics_port is not None:
            log.info("metrics on http://%s:%s/metrics", metrics_host, metrics_port)
        if documents:
            published = await _publish_documents(engine, list(documents))
            for p, (source, _) in zip(published, documents, strict=True):
                log.info("%s  (%s)", _published_line(p), source)
        if connections:
            await _connect(engine, connections)
        stop = asyncio.Event()
        api: ApiServer | None = None  # imported only when served: a worker never loads FastAPI
        svc = None
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]

        def hurry() -> None:
            if api is not None:
                api.server.force_exit = True
            for w in waiters:
                w.cancel()

        # before anything says "running": a signal from then on stops it gracefully
        _on_signals(stop, hurry)
        if api_at is not None:
            from onward.api import ApiServer, create_app

            api = ApiServer(
                create_app(engine),
                host=api_at[0],
                port=api_at[1],
                graceful_seconds=settings.shutdown_grace_seconds,
                sock=api_sock,
            )
            await api.start()
            waiters.append(asyncio.ensure_future(api.wait_closed()))
            log.info(
                "API on %s (OpenAPI at %s/docs; the console at %s/)", api.url, api.url, api.url
            )
            if not await _has_live_key(engine):
                log.info(
                    "organisation %s has no API key yet: every route but /healthz needs one "
                    "(onward --org %s keys create admin --scope admin)",
                    engine.org_id,
                    engine.org_id,
                )
        if background:
            svc = engine.background(lanes=lanes, relay=relay, sweeper=sweeper)
            waiters.append(asyncio.ensure_future(engine.run_background(svc)))
            parts = [
                p for p, on in (("worker", True), ("relay", relay), ("sweeper", sweeper)) if on
            ]
            log.info("%s running (%s) as %s", ", ".join(parts), settings.queue, engine.id)

        # What start-up made (modules, the app, its routes and schemas, the pools) lives as
        # long as the process: frozen out of the collector's sight, so a collection during a
        # request walks only what requests made -- shorter pauses in the latency tail
        gc.collect()
        gc.freeze()

        orphaned = None
        if parent_pid is not None:
            orphaned = asyncio.ensure_future(_orphaned(parent_pid))
            waiters.append(orphaned)
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.set()
            if orphaned is not None:
                orphaned.cancel()  # a watch, not a part to wait for
            if api is not None:
                await api.stop()
            if svc is not None:
                svc.stop.set()
            results = await asyncio.gather(*waiters, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result
        log.info("stopped")


async def _orphaned(parent_pid: int) -> None:
    """Returns once this process's parent is no longer ``parent_pid`` (it died)."""
    while True:  # no event to wait on: a parent's death only shows in getppid()
        if os.getppid() != parent_pid:
            break
        await asyncio.sleep(1.0)
    log.warning("the supervising process %s is gone: stopping", parent_pid)


def _serve_processes(settings: Settings, host: str, port: int, workers: int) -> int:
    """``onward api --workers N``: hold the port (bound, with ``SO_REUSEPORT``), fork N API
    processes that each listen on it with a socket of their own -- the kernel spreads the
    connections evenly among them (one shared listening socket hands a burst of new
    connections mostly to whichever process wakes first, and keep-alive connections stay
    where they landed) -- forward SIGTERM/SIGINT to them and wait. A process that dies stops
    the others: the supervisor above this one (systemd, Kubernetes) restarts the whole.
    Returns the exit code."""
    from onward.api.server import bind

    held = bind(host, port, reuse_port=True, listen=False)  # port 0: chosen here, once
    port = held.getsockname()[1]
    parent = os.getpid()
    children: list[int] = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:  # the child: its own process group, so a terminal's ^C reaches only us
            code = 1
            try:
                os.setpgid(0, 0)
                held.close()
                _run(
                    _serve(
                        settings,
                        api_at=(host, port),
                        background=False,
                        api_sock=bind(host, port, reuse_port=True),
                        parent_pid=parent,
                    )
                )
                code = 0
            except BaseException as exc:  # a child never returns into the parent's code
                if not isinstance(exc, KeyboardInterrupt | SystemExit):
                    log.error("API process failed: %s", _first_line(exc))
            finally:
                os._exit(code)
        children.append(pid)
    stopping = False

    def forward(sig: int, _frame: Any = None) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    log.info(
        "API on %s:%s in %d processes (%s)", host, port, workers, ", ".join(map(str, children))
    )
    worst = 0
    while children:
        pid, status = os.wait()
        children.remove(pid)
        code = os.waitstatus_to_exitcode(status)
        worst = max(worst, abs(code))
        if not stopping:
            log.error("API process %s exited (%s): stopping the others", pid, code)
            forward(signal.SIGTERM)
    held.close()
    return worst


HostOpt = Annotated[str, typer.Option("--host", help="address to listen on")]
PortOpt = Annotated[int, typer.Option("--port", min=0, max=65535, help="0: any free port")]
LanesOpt = Annotated[
    str | None,
    typer.Option("--lanes", help="lanes served and their capacity, e.g. fast=64,io=16"),
]


@app.command()
def up(
    ctx: typer.Context,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8080,
    lanes: LanesOpt = None,
    log_level: CommandLogLevelOpt = None,
    log_levels: LogLevelsOpt = None,
) -> None:
    """Everything in one process: API + worker + relay + sweeper, until SIGINT/SIGTERM.

    With ``--app MODULE:ATTR`` it first publishes the app's automations (unchanged when
    identical). Logs: JSON lines on stderr (console format on a terminal), every line of a
    step with its org, run, step, attempt and worker.

    \b
    Example:
        onward --app hello_app:app up --port 8080
    """
    _reconfigure_logs(ctx, log_level, log_levels)
    _run(
        _serve(
            _settings(ctx),
            api_at=(host, port),
            background=True,
            lanes=_parse_lanes(lanes),
            documents=_app_automations(ctx),
            connections=_connections(ctx),
        )
    )


@app.command()
def worker(
    ctx: typer.Context,
    lanes: LanesOpt = None,
    relay: Annotated[bool, typer.Option("--relay/--no-relay", help="publish the outbox")] = True,
    sweeper: Annotated[
        bool, typer.Option("--sweeper/--no-sweeper", help="stand for the sweeper election")
    ] = True,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            envvar="ONWARD_METRICS_PORT",
            min=0,
            max=65535,
            help="serve Prometheus metrics on this port (0: any free port)",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="address the metrics port listens on")
    ] = "127.0.0.1",
    log_level: CommandLogLevelOpt = None,
    log_levels: LogLevelsOpt = None,
) -> None:
    """Worker + relay + sweeper, without the API, until SIGINT/SIGTERM (graceful).

    On SIGTERM the worker stops claiming, lets running steps finish within the grace period
    and releases the rest. The relay and sweeper run here too unless turned off: any number
    of processes may run them (the relay shares rows with SKIP LOCKED, one sweeper is
    elected). Logs: JSON lines on stderr (console format on a terminal), every line of a
    step with its org, run, step, attempt and worker.

    \b
    Example:
        onward --app hello_app worker --lanes fast=64,io=16
    """
    _reconfigure_logs(ctx, log_level, log_levels)
    _run(
        _serve(
            _settings(ctx, metrics_port=metrics_port),
            api_at=None,
            background=True,
            lanes=_parse_lanes(lanes),
            metrics_host=metrics_host,
            relay=relay,
            sweeper=sweeper,
        )
    )


@app.command()
def api(
    ctx: typer.Context,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8080,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            envvar="ONWARD_API_WORKERS",
            min=1,
            max=64,
            help="API processes sharing the port, each with its own event loop and pool",
        ),
    ] = 1,
) -> None:
    """The HTTP API only (webhooks, publish, runs), until SIGINT/SIGTERM.

    With ``--workers N`` N processes serve the port, each listening on it (SO_REUSEPORT: the
    kernel spreads connections among them). A Python process uses one core: N up to the cores
    the API may have.

    \b
    Example:
        onward api --host 0.0.0.0 --port 8080 --workers 2
    """
    settings = _settings(ctx)
    if workers == 1:
        _run(_serve(settings, api_at=(host, port), background=False))
        return
    code = _serve_processes(settings, host, port, workers)
    if code:
        raise typer.Exit(code)


@app.command()
def demo(
    ctx: typer.Context,
    payload: Annotated[
        str | None,
        typer.Option(
            "--payload", "-p", help='the webhook body: JSON, @file or @- (default {"name": "Maya"})'
        ),
    ] = None,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep", help="leave the embedded PostgreSQL running at the end (`onward stop`)"
        ),
    ] = False,
) -> None:
    """Publish an example automation, deliver its webhook twice, run it, show its timeline.

    With ``--app MODULE:ATTR`` the example is yours: every automation of the app is published
    and the first one is run. Needs nothing installed: without a database URL it starts the
    embedded PostgreSQL, and stops it at the end unless ``--keep`` (one that was already
    running is left running). Its last line says what is left running.

    \b
    Example:
        onward demo --keep
    """
    from onward.db.embedded import is_running
    from onward.demo import run_demo

    settings = _settings(ctx)
    embedded = settings.database_url is None
    was_running = embedded and is_running(settings.data_dir)
    try:
        result = _run(
            run_demo(
                settings,
                out=typer.echo,
                documents=_app_automations(ctx) or None,
                payload=_parse_payload(payload) if payload is not None else None,
                prepare=lambda engine: _connect(engine, _connections(ctx)),
            )
        )
    finally:
        typer.echo(_demo_leaves(settings, embedded=embedded, was_running=was_running, keep=keep))
    if result.status != "completed":
        raise typer.Exit(1)


def _stop_command(data_dir: str) -> str:
    """The ``onward stop`` that stops the server of ``data_dir`` from this folder."""
    from onward.db.embedded import default_data_dir

    same = Path(data_dir).resolve() == Path(default_data_dir()).resolve()
    return "onward stop" if same else f"onward --data-dir {data_dir} stop"


def _demo_leaves(settings: Settings, *, embedded: bool, was_running: bool, keep: bool) -> str:
    """Stop the embedded server the demo started, unless kept; say what is left running."""
    from onward.db.embedded import server_info, stop_server

    if not embedded:
        return "nothing left running: the demo's API, worker and sandbox stopped with it"
    info = server_info(settings.data_dir)
    if info is None or not info.running:
        return "nothing left running"
    where = f"the embedded PostgreSQL in {info.folder} (pid {info.pid})"
    stop = _stop_command(settings.data_dir)
    if was_running:
        return f"left running: {where}, as it was before the demo; `{stop}` stops it"
    if keep:
        return f"left running (--keep): {where}; `{stop}` stops it"
    stop_server(settings.data_dir)
    return f"stopped {where}, which the demo started; nothing left running"


@app.command()
def sandbox(ctx: typer.Context, host: HostOpt = "127.0.0.1", port: PortOpt = 8099) -> None:
    """Serve the fake providers (email, CRM, model, payment, Slack) with fault knobs.

    \b
    Example:
        onward sandbox --port 8099
    """
    from onward.sandbox import serve

    serve(host, port)


# -- operations ------------------------------------------------------------------------------


@app.command()
def doctor(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    grace: Annotated[float, typer.Option(help="seconds before a lag counts as unhealthy")] = 300.0,
) -> None:
    """The silent-failure checks; exits 1 when any is unhealthy.

    \b
    Example:
        onward doctor --json
    """
    from onward.doctor import render, run_checks

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await run_checks(engine, grace=grace)

    checks = _run(go())
    if as_json:
        healthy = all(c.healthy for c in checks)
        _print_json({"healthy": healthy, "checks": [c.as_dict() for c in checks]})
    else:
        typer.echo(render(checks))
    if not all(c.healthy for c in checks):
        raise typer.Exit(1)


BENCHES = {
    "sweep": "onward.bench.sweep",
    "latency": "onward.bench.latency",
    "throughput": "onward.bench.throughput",
    "start": "onward.bench.start",
    "monday": "onward.bench.monday",
    "recompute": "onward.bench.recompute",
    "lanes": "onward.bench.lanes",
    "retention": "onward.bench.retention",
    "console": "onward.bench.console",
    "metrics": "onward.bench.metrics",
    "intake": "onward.bench.intake",
    "storage": "onward.bench.storage",
}


def _worker_counts(raw: str | None) -> list[int] | None:
    """``--workers 2`` or ``--workers 1,2,4,8`` (a scaling curve); None when not given."""
    if raw is None:
        return None
    try:
        counts = [int(part) for part in raw.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or max(counts) > 64:
        _fail([f"--workers {raw!r}: a whole number from 1 to 64, or a list of them: 1,2,4,8"], 2)
    return counts


@app.command()
def bench(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="one of: " + ", ".join(BENCHES))],
    as_json: JsonOpt = False,
    quick: Annotated[
        bool, typer.Option("--quick", help="a small run that proves it works")
    ] = False,
    runs: Annotated[int | None, typer.Option(help="runs to drive (benches that take it)")] = None,
    workers: Annotated[
        str | None,
        typer.Option(help="worker processes; a list (1,2,4,8): a scaling curve (throughput)"),
    ] = None,
    pairs: Annotated[
        int | None,
        typer.Option(
            help="alternations of drain, grouped ceiling and live run whose medians the goals "
            "are judged on (throughput; 3 unless --quick)",
        ),
    ] = None,
    capacity: Annotated[
        int | None,
        typer.Option(
            help="each worker's lane capacity and claim batch (throughput; 128 unless --quick)",
        ),
    ] = None,
) -> None:
    """Benchmarks that print their figures beside the machine's own ceiling.

    Each bench module exposes ``run(database_url, *, quick, **options) -> dict`` and
    ``render(result) -> str``; options it does not take are not passed.

    \b
    Example:
        onward bench latency --quick
    """
    import importlib
    import inspect

    from onward.bench.db import server
    from onward.db import resolve_url

    if name not in BENCHES:
        _fail([f"unknown bench {name!r}; choose one of {', '.join(BENCHES)}"], 2)
    module = importlib.import_module(BENCHES[name])
    settings = _settings(ctx)
    url = resolve_url(settings)
    accepted = inspect.signature(module.run).parameters
    counts = _worker_counts(workers)
    curve = counts if counts is not None and len(counts) > 1 else None
    if curve is not None and "curve" not in accepted:
        _fail([f"bench {name!r} takes one --workers count, not a list"], 2)
    single = counts[0] if counts is not None and curve is None else None
    if pairs is not None and not 1 <= pairs <= 9:
        _fail([f"--pairs {pairs}: a whole number from 1 to 9"], 2)
    if pairs is not None and "pairs" not in accepted:
        _fail([f"bench {name!r} takes no --pairs"], 2)
    if pairs is not None and curve is not None:
        _fail(["--pairs is for one worker count, not a scaling curve"], 2)
    if capacity is not None and not 1 <= capacity <= 10_000:
        _fail([f"--capacity {capacity}: a whole number from 1 to 10000"], 2)
    if capacity is not None and "capacity" not in accepted:
        _fail([f"bench {name!r} takes no --capacity"], 2)
    options = {
        k: v
        for k, v in {
            "runs": runs,
            "workers": single,
            "curve": curve,
            "pairs": pairs,
            "capacity": capacity,
            "redis_url": settings.redis_url,
        }.items()
        if v is not None and k in accepted
    }
    result = module.run(url, quick=quick, **options)
    # which server the figures are of: without ONWARD_DATABASE_URL, the embedded PostgreSQL,
    # not the machine's own (another version and configuration). A bench that names it on
    # its own first line (throughput) has it already; the others' text begins with it.
    named = "server" in result
    if not named:
        result["server"] = server(url)
    if as_json:
        _print_json(result)
    else:
        text = module.render(result)
        typer.echo(text if named else f"server: {result['server']}\n{text}")


@app.command()
def chaos(
    ctx: typer.Context,
    runs: Annotated[int, typer.Option(help="runs of the reference scenario")] = 60,
    kills: Annotated[int, typer.Option(help="kills per crash point")] = 1,
    as_json: JsonOpt = False,
) -> None:
    """Kill real workers at every crash point while runs flow; print what survived (exit 1 on
    any lost run, double transition -- a double decision, a signal consumed twice -- or
    duplicate effect at an idempotent provider).

    \b
    Example:
        onward chaos --runs 60 --kills 1
    """
    from onward.chaos import run_chaos

    # Progress goes to stderr: stdout holds only the report (only JSON with --json).
    report = run_chaos(_settings(ctx), runs=runs, kills_per_point=kills, out=_progress)
    if as_json:
        _print_json(report.as_dict())
    else:
        typer.echo(report.render())
    if not report.ok:
        raise typer.Exit(1)


# -- command groups in their own modules -------------------------------------------------------

from onward import (  # noqa: E402  (uses the helpers above)
    cli_actions,
    cli_cancel,
    cli_flow,
    cli_init,
    cli_keys,
    cli_migrate,
    cli_people,
    cli_status,
)
from onward.cli_audit import audit as audit_command  # noqa: E402  (uses the helpers above)
from onward.cli_contacts import contacts_app  # noqa: E402  (uses the helpers above)
from onward.cli_hooks import hooks_app  # noqa: E402  (uses the helpers above)
from onward.cli_notify import notifications_app  # noqa: E402  (uses the helpers above)
from onward.cli_outbound import outbound_app  # noqa: E402  (uses the helpers above)
from onward.cli_retention import retention_app  # noqa: E402  (uses the helpers above)
from onward.cli_timers import timers_app  # noqa: E402  (uses the helpers above)
from onward.cli_vault import keys_app  # noqa: E402  (uses the helpers above)

app.add_typer(timers_app)
app.command()(cli_people.signal)  # onward signal NAME --id E --run R | --key K
app.command()(cli_people.signals)  # onward signals [--unrouted]
app.add_typer(cli_people.approvals_app)  # onward approvals list|decide
app.add_typer(cli_people.approvers_app)  # onward approvers list|grant|revoke
app.add_typer(cli_flow.limits_app)  # onward limits list|set|remove
app.add_typer(cli_flow.circuits_app)  # onward circuits list|set
app.add_typer(cli_flow.budgets_app)  # onward budgets list|set
app.command()(cli_flow.lanes)  # onward lanes
runs_app.command("migrate")(cli_migrate.migrate_runs)  # onward runs migrate --automation A ...
app.add_typer(contacts_app)  # onward contacts erase
app.add_typer(cli_actions.review_app)  # onward review resolve RUN --happened|--retry|--skip
app.command()(cli_actions.resume)  # onward resume RUN
app.command()(cli_actions.fork)  # onward fork RUN [--from-step STEP] [--version V]
app.add_typer(retention_app)  # onward retention show|set|prune
app.add_typer(outbound_app)  # onward outbound show|allow|disallow
app.add_typer(notifications_app)  # onward notifications set|destinations|remove|list|retry
app.command()(cli_cancel.cancel)  # onward cancel RUN... | --automation A [--version V] ...
app.add_typer(cli_cancel.operations_app)  # onward operations [list|show|resume]
app.add_typer(hooks_app)  # onward hooks secret add|list|remove
cli_keys.register(keys_app)
app.add_typer(keys_app)  # onward keys create|list|revoke|new-key|rotate-secrets
app.command("audit")(audit_command)  # onward audit [--action A] [--since T] [--json]
app.command()(cli_init.init)  # onward init [DIR] [--template T] [--force]
app.command()(cli_status.status)  # onward status [--json]
app.command()(cli_status.stop)  # onward stop
app.command("stop-embedded", hidden=True)(cli_status.stop)  # the old name of `onward stop`

# -- entry point -----------------------------------------------------------------------------


def _fail(lines: Sequence[str], code: int) -> NoReturn:
    for line in lines:
        print(f"onward: {line}", file=sys.stderr)
    sys.exit(code)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> None:
    """The ``onward`` console script."""
    try:
        app(args=list(argv) if argv is not None else None, prog_name="onward")
    except InvalidAutomation as exc:
        _fail([f"invalid automation: {p}" for p in exc.problems], 2)
    except (OnwardError, UsageProblem) as exc:
        _fail([_first_line(exc)], 2)
    except psycopg.OperationalError as exc:
        _fail([f"database: {_first_line(exc)}"], 1)
    except KeyboardInterrupt:
        _fail(["interrupted"], 130)


if __name__ == "__main__":
    # Run the canonical module's app, not this __main__ copy's: the command groups in their own
    # modules import their helpers (and UsageProblem) from `onward.cli`, so an error they raise
    # must be caught by that module's main.
    from onward.cli import main as canonical_main

    with contextlib.suppress(BrokenPipeError):
        canonical_main()
