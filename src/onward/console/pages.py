"""The console's routes: server-rendered pages at ``/`` beside the API (``create_app`` includes
:func:`router`), for people, behind a session from ``/login`` (``onward.console.auth``).

Pages: ``/`` runs (filters, keyset paging, live refresh), ``/runs/{id}`` one run on one screen,
``/parked`` parked runs and their actions, ``/health``, ``/automations`` (versions, document,
graph), ``/schedules``. Actions are POST forms with a CSRF token (``/runs/{id}/resume``,
``/review``, ``/retry``, ``/cancel``) that call the engine's own methods and answer 303 to the
run's page. Every page reads through the session's organisation only.

Input a person types (filters, cursors, form fields) is checked here: what does not fit is a
400 page naming the field, an action that does not apply a 409 page with the engine's reason,
an unknown run a 404 page -- HTML for a browser, never a JSON error or a 500. The routes are
left out of the OpenAPI document: they are pages, not the API.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlencode

import jinja2
from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from onward import audit
from onward.api.app import Org
from onward.approvals import token_secret
from onward.automations.document import parse_model
from onward.console import auth, charts, graph, health, reads, way
from onward.engine import Engine
from onward.errors import (
    ActionRefused,
    InvalidInput,
    OnwardError,
    Unavailable,
    UnknownAutomation,
    UnknownRun,
)

STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
LIVE_SECONDS = 5
#: the most bytes of a form (login, actions); the API's body limit applies first
MAX_FORM = 16 * 1024
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
STATUS_FOR = {UnknownRun: 404, UnknownAutomation: 404, InvalidInput: 400, ActionRefused: 409}
SECRETISH = ("secret", "token", "password", "authorization", "api_key", "apikey")


# -- templates ---------------------------------------------------------------------------------


@cache
def templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("onward.console", "templates"),
        autoescape=jinja2.select_autoescape(default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ts=_ts, ago=_ago, excerpt=excerpt, seconds=_seconds, short=_short)
    return env


def _ts(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    value = float(value)
    if abs(value) < 1:
        return f"{value * 1000:.0f} ms"
    if abs(value) < 120:
        return f"{value:.1f} s"
    if abs(value) < 7200:
        return f"{value / 60:.1f} min"
    if abs(value) < 172800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} d"


def _ago(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "—"
    delta = (now - value).total_seconds()
    return f"{_seconds(delta)} ago" if delta >= 0 else f"in {_seconds(-delta)}"


def _short(value: str | None, n: int = 12) -> str:
    return "—" if not value else (value if len(value) <= n else value[:n] + "…")


def _redacted(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: "***" if any(s in str(k).lower() for s in SECRETISH) else _redacted(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def excerpt(value: Any, limit: int = 300) -> str:
    """A bounded, redacted excerpt of stored JSON (keys that name secrets are starred)."""
    if value is None:
        return ""
    text = json.dumps(_redacted(value), default=str, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- a request's context ---------------------------------------------------------------------


@dataclass
class Ctx:
    request: Request
    engine: Engine
    session: auth.Session
    sessions: auth.Sessions

    @property
    def org(self) -> Org:
        return Org(self.engine, self.session.principal.org_id)

    @property
    def org_id(self) -> str:
        return self.session.principal.org_id

    @property
    def who(self) -> str:
        """Who acts, written in the run's history and the audit: the console's key."""
        return f"console:{self.session.principal.key_id}"

    def can_write(self) -> bool:
        return self.session.principal.can(auth.WRITE)

    def render(self, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        return page(
            name,
            status,
            session=self.session,
            csrf=self.sessions.csrf(self.session),
            can_write=self.can_write(),
            path=self.request.url.path,
            **values,
        )


def page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
    values.setdefault("session", None)
    values.setdefault("csrf", "")
    values.setdefault("can_write", False)
    values.setdefault("path", "")
    values.setdefault("live", None)
    html = templates().get_template(name).render(**values)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


async def _sessions(engine: Engine) -> auth.Sessions:
    key = await token_secret(engine.engine_pool, engine.settings.signing_secret)
    return auth.Sessions(key)


def _error_page(exc: Exception, status: int) -> HTMLResponse:
    title = {400: "Bad input", 404: "Not found", 409: "Refused", 503: "Unavailable"}
    return page("error.html", status, title=title.get(status, "Error"), message=str(exc))


async def serve(
    request: Request, scope: str, handler: Callable[[Ctx], Awaitable[Response]]
) -> Response:
    """Check the session (to ``/login`` without one), its scope, then run the page; an
    ``OnwardError`` becomes an HTML page with its status."""
    engine: Engine = request.app.state.engine
    try:
        sessions = await _sessions(engine)
    except Exception as exc:  # the database is down: the key cannot be read
        return _error_page(Unavailable(f"the database cannot be reached: {exc}"), 503)
    session = sessions.read(request.cookies.get(auth.COOKIE))
    if session is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)
    if not session.principal.can(scope):
        return page(
            "error.html",
            403,
            title="Not allowed",
            message=f"this key lacks the scope {scope}",
            session=session,
        )
    if not await auth.still_live(engine, session.principal):  # revoked since the login
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)
    audit.act_as(f"console:{session.principal.key_id}")
    # every read and action of the page through the API's role, for the key's organisation
    ctx = Ctx(request, engine.as_tenant(session.principal.org_id), session, sessions)
    began = time.perf_counter()
    try:
        response = await handler(ctx)
        # the server's own time for the page, reads and rendering (what the bench reports)
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - began) * 1000:.2f}"
        return response
    except Unavailable as exc:
        return _error_page(exc, 503)
    except OnwardError as exc:
        for cls, status in STATUS_FOR.items():
            if isinstance(exc, cls):
                return _error_page(exc, status)
        raise


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form (what every console form posts), at most ``MAX_FORM`` bytes."""
    body = await request.body()
    if len(body) > MAX_FORM:
        raise InvalidInput(f"the form is larger than {MAX_FORM} bytes")
    try:
        return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20))
    except (UnicodeDecodeError, ValueError):
        raise InvalidInput("the form is not urlencoded UTF-8") from None


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if not origin or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host


# -- the router ------------------------------------------------------------------------------


def router() -> APIRouter:
    r = APIRouter(include_in_schema=False)

    @r.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in STATIC:
            return page("error.html", 404, title="Not found", message="no such file")
        body = resources.files("onward.console").joinpath("static", name).read_bytes()
        return Response(
            body, media_type=STATIC[name], headers={"Cache-Control": "public, max-age=3600"}
        )

    # -- login -------------------------------------------------------------------------------

    @r.get("/login")
    async def login_form(request: Request) -> Response:
        return page("login.html", next=_next(request.query_params.get("next")), error=None)

    @r.post("/login")
    async def login(request: Request) -> Response:
        engine: Engine = request.app.state.engine
        if not _same_origin(request):
            return page("error.html", 403, title="Not allowed", message="cross-site login")
        try:
            form = await form_of(request)
        except InvalidInput as exc:
            return _error_page(exc, 400)
        target = _next(form.get("next"))
        key = form.get("key", "").strip()
        principal = await auth.authenticate(engine.pool, key) if key else None
        error = None
        if principal is None:
            error = "That key is not valid."
        elif not principal.can(auth.READ):
            error = "That key cannot read runs (scope runs:read)."
        if error is not None:
            return page("login.html", 401, next=target, error=error)
        assert principal is not None
        sessions = await _sessions(engine)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            auth.COOKIE,
            sessions.issue(principal),
            max_age=auth.SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    @r.post("/logout")
    async def logout(request: Request) -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(auth.COOKIE, path="/")
        return response

    # -- runs --------------------------------------------------------------------------------

    @r.get("/")
    async def runs(request: Request) -> Response:
        async def show(ctx: Ctx) -> Response:
            query = dict(request.query_params)
            filters = reads.Filters.parse(query)
            before = reads.Cursor.parse(query["before"], "before") if query.get("before") else None
            after = reads.Cursor.parse(query["after"], "after") if query.get("after") else None
            began = time.perf_counter()
            pool = ctx.engine.pool
            found = await ctx.org.read(
                lambda: reads.page(pool, ctx.org_id, filters, before=before, after=after)
            )
            counts = await ctx.org.read(lambda: reads.unfinished_counts(pool, ctx.org_id))
            automations = await ctx.org.automations()
            kept = {k: v for k, v in query.items() if k not in ("before", "after") and v.strip()}
            return ctx.render(
                "runs.html",
                page=found,
                filters=filters,
                query=kept,
                counts=counts,
                automations=automations,
                statuses=reads.STATUSES,
                reasons=reads.PARKED_REASONS,
                ranges=list(reads.RANGES),
                link=lambda **more: "/?" + urlencode({**kept, **more}),
                live=LIVE_SECONDS if query.get("live") else None,
                now=datetime.now(UTC),
                server_ms=(time.perf_counter() - began) * 1000,
            )

        return await serve(request, auth.READ, show)

    @r.get("/runs/{run_id}")
    async def run(request: Request, run_id: str) -> Response:
        async def show(ctx: Ctx) -> Response:
            return await _run_page(ctx, run_id)

        return await serve(request, auth.READ, show)

    @r.post("/runs/{run_id}/{action}")
    async def act(request: Request, run_id: str, action: str) -> Response:
        async def do(ctx: Ctx) -> Response:
            if action not in ACTIONS:
                return page("error.html", 404, title="Not found", message="no such action")
            if not _same_origin(request):
                return page("error.html", 403, title="Not allowed", message="cross-site form")
            form = await form_of(request)
            if not ctx.sessions.csrf_ok(ctx.session, form.get("csrf")):
                return page(
                    "error.html",
                    403,
                    title="Not allowed",
                    message="the form's CSRF token does not hold: reload the page and try again",
                )
            done = await ACTIONS[action](ctx, run_id, form)
            return RedirectResponse(f"/runs/{run_id}?" + urlencode({"done": done}), 303)

        return await serve(request, auth.WRITE, do)

    # -- parked, health, automations, schedules ------------------------------------------

    @r.get("/parked")
    async def parked(request: Request) -> Response:
        async def show(ctx: Ctx) -> Response:
            reason = request.query_params.get("reason") or None
            if reason is not None and reason not in reads.PARKED_REASONS:
                raise InvalidInput(f"reason: one of {', '.join(reads.PARKED_REASONS)}")
            pool = ctx.engine.pool
            found = await ctx.org.read(lambda: reads.parked(pool, ctx.org_id, wait_kind=reason))
            return ctx.render(
                "parked.html",
                runs=found["runs"],
                review=found["review"],
                reason=reason,
                reasons=reads.PARKED_REASONS,
                now=datetime.now(UTC),
                live=LIVE_SECONDS if request.query_params.get("live") else None,
            )

        return await serve(request, auth.READ, show)

    @r.get("/health")
    async def health_page(request: Request) -> Response:
        async def show(ctx: Ctx) -> Response:
            circuits = await ctx.org.read(lambda: ctx.engine.circuits())
            measured = await ctx.org.read(
                lambda: health.measure(ctx.engine.pool, ctx.org_id, circuits=circuits)
            )
            s = measured.series
            drawn = {
                "Timer lateness (worst per minute)": charts.bars(
                    s["timer_lateness_s"], label="timer lateness", unit=" s"
                ),
                "Timers fired": charts.bars(s["timers_fired"], label="timers fired"),
                "Effects claimed, not settled": charts.bars(
                    s["effects_unsettled"], label="effects unsettled"
                ),
                "Outbox lag (worst per minute)": charts.bars(
                    s["outbox_lag_s"], label="outbox lag", unit=" s"
                ),
                "Runs started": charts.bars(s["runs_started"], label="runs started"),
                "Runs finished": charts.bars(s["runs_finished"], label="runs finished"),
            }
            return ctx.render(
                "health.html",
                health=measured,
                charts=drawn,
                circuits=circuits,
                live=LIVE_SECONDS if request.query_params.get("live") else None,
            )

        return await serve(request, auth.READ, show)

    @r.get("/automations")
    async def automations(request: Request) -> Response:
        async def show(ctx: Ctx) -> Response:
            return ctx.render("automations.html", automations=await ctx.org.automations())

        return await serve(request, auth.READ, show)

    @r.get("/automations/{automation_id}")
    async def automation(request: Request, automation_id: str) -> Response:
        async def show(ctx: Ctx) -> Response:
            raw = request.query_params.get("version")
            return await _automation_page(ctx, automation_id, raw)

        return await serve(request, auth.READ, show)

    @r.get("/schedules")
    async def schedules(request: Request) -> Response:
        async def show(ctx: Ctx) -> Response:
            rows = await ctx.org.read(lambda: ctx.engine.schedules())
            return ctx.render("schedules.html", schedules=rows, now=datetime.now(UTC))

        return await serve(request, auth.READ, show)

    return r


def _next(value: str | None) -> str:
    """Where to go after logging in: a path of this site only (no open redirect)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value[:1000]


# -- one run on one screen -----------------------------------------------------------------


@dataclass(slots=True)
class Line:
    """One transition of the timeline, formatted once (a 1,000-row page renders in a loop
    that only prints: attribute lookups and filters per cell are what a template pays for)."""

    n: int
    at: str
    offset: str
    event: str
    step: str
    seq: str
    lane: str
    attempt: str
    worker: str
    detail: str
    related: list[str]


#: which rows of a step's other tables a timeline event shows beside it
RELATED = {
    "step_done": "effects",
    "step_parked": "effects",
    "step_retry": "effects",
    "step_failed": "effects",
    "review_resolved": "effects",
    "step_waiting": "timers",
    "approval_requested": "approvals",
    "approval_decided": "approvals",
    "signal_consumed": "signals",
}


def _related(kind: str, row: dict[str, Any]) -> str:
    if kind == "effects":
        result = f" → {excerpt(row['result'], 160)}" if row.get("result") else ""
        return f"effect {row['effect_key']} [{row['status']}]{result}"
    if kind == "timers":
        return (
            f"timer #{row['timer_id']} {row['purpose']}: {excerpt(row['intent'], 120)} → "
            f"{_ts(row['due_at'])}"
        )
    if kind == "approvals":
        decided = (
            f" by {row['decided_by']} via {row['decided_via']} at {_ts(row['decided_at'])}"
            if row.get("decided_by")
            else ""
        )
        return f"approval {row['approval_id']} [{row['status']}]{decided} · digest {_short(row['digest'], 16)}"
    key = f" key {row['correlation_key']}" if row.get("correlation_key") else ""
    return f"signal {row['name']} {row['signal_id']}{key}"


def _claimed(e: dict[str, Any], t0: Any) -> list[str]:
    """A row that ends an attempt: when the attempt was claimed and how long it ran."""
    claimed = e.get("claimed_at")
    if claimed is None or t0 is None:
        return []
    ran = (e["at"] - claimed).total_seconds() * 1000
    return [f"claimed at +{(claimed - t0).total_seconds():.3f}s, ran {ran:.1f} ms"]


def timeline(
    history: list[dict[str, Any]],
    lanes: dict[int, str],
    by_seq: dict[int, dict[str, list[dict[str, Any]]]],
) -> list[Line]:
    t0 = history[0]["at"] if history else None
    lines = []
    for n, e in enumerate(history, 1):
        seq = e["seq"]
        kind = RELATED.get(e["event"])
        related = by_seq.get(seq, {}).get(kind, []) if kind and seq is not None else []
        lines.append(
            Line(
                n=n,
                at=_ts(e["at"]),
                offset=f"{(e['at'] - t0).total_seconds():.3f}" if t0 else "",
                event=e["event"],
                step=e["step_id"] or "",
                seq=f"#{seq}" if seq is not None and e["step_id"] else "",
                lane=lanes.get(seq, "") if seq is not None else "",
                attempt="" if e["attempt"] is None else str(e["attempt"]),
                worker=e["worker"] or "",
                detail=excerpt(e["detail"]) if e["detail"] else "",
                related=_claimed(e, t0) + ([_related(kind, r) for r in related] if kind else []),
            )
        )
    return lines


async def _run_page(ctx: Ctx, run_id: str) -> Response:
    engine, pool, org = ctx.engine, ctx.engine.pool, ctx.org
    began = time.perf_counter()
    view = await org.show(run_id)
    screen = await org.read(lambda: reads.run_screen(pool, ctx.org_id, run_id))
    approvals = await org.read(lambda: engine.approvals(run_id=run_id, limit=500))
    signals = await org.read(lambda: engine.signals(run_id=run_id, limit=500))
    circuits = await org.read(lambda: engine.circuits())
    run, steps, history = view["run"], view["steps"], view["history"]
    doc = None
    with contextlib.suppress(UnknownAutomation):
        doc = await engine.versions.get(ctx.org_id, run["automation_id"], run["version"])
    current = next((s for s in steps if s["status"] in way.UNFINISHED_STEP), None)
    if current is not None and doc is not None and current["wait_kind"] == "signal":
        try:
            names = doc.step(current["step_id"]).params.get("signals") or []
            current = {**current, "signals": [str(n) for n in names]}
            steps = [current if s["seq"] == current["seq"] else s for s in steps]
        except KeyError:
            pass
    now = screen["more"].get("db_now") or datetime.now(UTC)
    ways = way.ways_forward(
        run,
        steps,
        timers=screen["timers"],
        approvals=approvals,
        correlations=screen["correlations"],
        circuits=circuits,
        more=screen["more"],
        now=now,
    )
    svg = None
    if doc is not None:
        svg = graph.render_svg(
            graph.graph_of(doc, engine.registry),
            path=graph.path_of(steps),
            current=current["step_id"] if current else None,
            current_status=current["status"] if current else None,
            title=f"{run['automation_id']} v{run['version']}: the path run {run_id} took",
        )
    lanes = {s["seq"]: s["lane"] for s in steps}
    by_seq: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for kind, rows in (
        ("effects", screen["effects"]),
        ("timers", screen["timers"]),
        ("approvals", approvals),
        ("signals", signals),
    ):
        for row in rows:
            if row.get("seq") is not None:
                by_seq.setdefault(row["seq"], {}).setdefault(kind, []).append(row)
    review = [e for e in screen["effects"] if e["status"] == "review"]
    unfinished = run["finished_at"] is None
    return ctx.render(
        "run.html",
        run=run,
        more=screen["more"],
        steps=steps,
        history=history,
        lines=timeline(history, lanes, by_seq),
        effects=screen["effects"],
        timers=screen["timers"],
        correlations=screen["correlations"],
        approvals=approvals,
        signals=signals,
        ways=ways,
        svg=svg,
        current=current,
        review=review,
        done=ctx.request.query_params.get("done"),
        now=now,
        live=LIVE_SECONDS if unfinished else None,
        server_ms=(time.perf_counter() - began) * 1000,
    )


# -- actions (the engine's own methods) ----------------------------------------------------


async def _resume(ctx: Ctx, run_id: str, form: dict[str, str]) -> str:
    await ctx.org.write(lambda: ctx.engine.resume(run_id, by=ctx.who))
    return "resumed"


async def _review(ctx: Ctx, run_id: str, form: dict[str, str]) -> str:
    how = form.get("how", "")
    reference = form.get("reference", "").strip() or None
    if how != "happened":
        reference = None  # the field is on the form for every choice; it goes with happened
    effect_key = form.get("effect_key") or None
    await ctx.org.write(
        lambda: ctx.engine.resolve_review(
            run_id, how, by=ctx.who, reference=reference, effect_key=effect_key
        )
    )
    return f"review resolved: {how}"


async def _cancel(ctx: Ctx, run_id: str, form: dict[str, str]) -> str:
    reason = form.get("reason", "").strip()[:500] or None
    done = await ctx.org.write(lambda: ctx.engine.cancel(run_id, by=ctx.who, reason=reason))
    return str(done.get("outcome", "cancelled")).replace("_", " ")


async def _retry(ctx: Ctx, run_id: str, form: dict[str, str]) -> str:
    step = form.get("from_step") or None
    forked = await ctx.org.write(lambda: ctx.engine.fork(run_id, by=ctx.who, from_step=step))
    return f"retried as run {forked.run_id}"


ACTIONS: dict[str, Callable[[Ctx, str, dict[str, str]], Awaitable[str]]] = {
    "resume": _resume,
    "review": _review,
    "cancel": _cancel,
    "retry": _retry,
}


# -- automations -----------------------------------------------------------------------------


async def _automation_page(ctx: Ctx, automation_id: str, raw_version: str | None) -> Response:
    pool = ctx.engine.pool
    found = await ctx.org.read(lambda: reads.versions(pool, ctx.org_id, automation_id))
    if not found["versions"]:
        raise UnknownAutomation(automation_id)
    numbers = [v["version"] for v in found["versions"]]
    if raw_version is None:
        number = numbers[0]
    elif raw_version.isdigit() and int(raw_version) in numbers:
        number = int(raw_version)
    else:
        raise InvalidInput(f"version: one of {', '.join(map(str, numbers))}")
    row = await ctx.org.read(lambda: reads.version(pool, ctx.org_id, automation_id, number))
    assert row is not None
    doc = parse_model(row["document"])
    svg = graph.render_svg(
        graph.graph_of(doc, ctx.engine.registry), title=f"{automation_id} v{number}"
    )
    return ctx.render(
        "automation.html",
        automation_id=automation_id,
        versions=found["versions"],
        unfinished=found["unfinished"],
        row=row,
        doc=doc,
        document=json.dumps(row["document"], indent=2, ensure_ascii=False),
        svg=svg,
    )
