"""The console over HTTP, without a browser: every page needs a session (a redirect to /login
otherwise), a key logs in to a signed HttpOnly SameSite=Strict cookie, what a person types
wrong is a 400 page naming the field (never a JSON error or a 500), actions need the CSRF
token, the same origin and the write scope, and they call the engine's own methods -- a
cancelled run, a fork, a resolved review are in the run's history naming the console's key."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator

import httpx
import psycopg
import pytest

from onward import Automation
from onward.api import create_app
from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import eventually, history, run_row
from tests.integration.test_operator_actions import parked_for_review

ADMIN, READER, OTHER = "admin", "reader", "other"
KEYS: dict[str, str] = {}  # the role above -> this test's API key


@pytest.fixture(autouse=True)
async def keys(engine: Engine) -> None:
    KEYS.clear()
    KEYS[ADMIN] = (await engine.create_key("console", ["admin"]))[1]
    KEYS[READER] = (await engine.create_key("reader", ["runs:read"]))[1]
    KEYS[OTHER] = (await engine.for_org("other").create_key("other", ["admin"]))[1]


def key_id_of(role: str) -> str:
    return KEYS[role].split("_")[1]


@contextlib.asynccontextmanager
async def client(engine: Engine, key: str | None = ADMIN) -> AsyncIterator[httpx.AsyncClient]:
    """A browser-like client of the app, logged in with ``key`` (none: no session)."""
    transport = httpx.ASGITransport(app=create_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as http:
        if key is not None:
            reply = await http.post("/login", data={"key": KEYS.get(key, key), "next": "/"})
            assert reply.status_code == 303, reply.text
        yield http


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def problem(reply: httpx.Response) -> str:
    found = re.search(r'class="problem"[^>]*>(.*?)<', reply.text, re.S)
    assert found, reply.text[:500]
    return found.group(1)


async def _status_is(engine: Engine, run_id: str, status: str) -> bool:
    return await engine.status(run_id) == status


async def test_every_page_needs_a_session_and_a_valid_key_logs_in(engine: Engine) -> None:
    async with client(engine, key=None) as http:
        for path in ("/", "/runs/x", "/parked", "/health", "/automations", "/schedules"):
            reply = await http.get(path)
            assert reply.status_code == 303, path
            assert reply.headers["location"].startswith("/login?next=")
        refused = await http.post("/login", data={"key": "nope", "next": "/"})
        assert refused.status_code == 401 and "not valid" in problem(refused)
        away = await http.post("/login", data={"key": KEYS[ADMIN], "next": "https://evil.test/"})
        assert away.status_code == 303 and away.headers["location"] == "/"  # no open redirect
        cookie = away.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and KEYS[ADMIN] not in cookie
        page = await http.get("/")
        assert page.status_code == 200 and "<h1>Runs</h1>" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        http.cookies.set("onward_session", cookie.split(";")[0].split("=", 1)[1] + "x")
        assert (await http.get("/")).status_code == 303  # a tampered cookie is no session


async def test_another_organisations_key_sees_its_own_console_and_a_revoked_key_none(
    engine: Engine,
) -> None:
    await engine.publish(Automation("one").step("a", "set", values={"x": "1"}).build())
    ours = (await engine.start("one", {}, event_id="e1")).run_id
    async with client(engine, OTHER) as http:
        listed = await http.get("/")
        assert listed.status_code == 200 and ours not in listed.text
        assert (await http.get(f"/runs/{ours}")).status_code == 404  # as a run that is not
    async with client(engine, ADMIN) as http:
        assert ours in (await http.get("/")).text
        await engine.revoke_key(key_id_of(ADMIN))
        assert (await http.get("/")).status_code == 303  # the session ends with its key


async def test_wrong_input_is_a_400_page_naming_the_field(engine: Engine) -> None:
    async with client(engine) as http:
        for query, field in (
            ("status=bogus", "status"),
            ("version=abc", "version"),
            ("parked=review&status=completed", "parked"),
            ("range=1y", "range"),
            ("since=yesterday", "since"),
            ("before=garbage", "before"),
            ("contact=%00", "contact"),
            ("since=2026-02-01T00:00Z&until=2026-01-01T00:00Z", "since"),
        ):
            reply = await http.get(f"/?{query}")
            assert reply.status_code == 400, query
            assert reply.headers["content-type"].startswith("text/html")
            assert problem(reply).startswith(field), (query, problem(reply))
        missing = await http.get("/runs/run_nope")
        assert missing.status_code == 404 and "unknown run" in problem(missing)
        assert (await http.get("/automations/nope")).status_code == 404
        assert (await http.get("/static/../../etc/passwd")).status_code == 404
        spec = (await http.get("/openapi.json")).json()
        assert not [p for p in spec["paths"] if not p.startswith(("/v1", "/healthz"))]


async def test_the_list_pages_by_keyset_and_filters(engine: Engine) -> None:
    await engine.publish(Automation("one").step("a", "set", values={"x": "1"}).build())
    await engine.publish(Automation("two").step("a", "set", values={"x": "1"}).build())
    ids = [(await engine.start("one", {"n": n}, event_id=f"o{n}")).run_id for n in range(60)]
    other = (await engine.start("two", {}, event_id="t0", contact_id="c_9")).run_id
    async with client(engine) as http:
        first = await http.get("/")
        shown = re.findall(r'href="/runs/(run_\w+)" class="mono"', first.text)
        assert len(shown) == 50 and shown[0] == other  # newest first
        older = re.search(r'rel="next" href="([^"]+)"', first.text)
        assert older is not None
        second = await http.get(older.group(1).replace("&amp;", "&"))
        rest = re.findall(r'href="/runs/(run_\w+)" class="mono"', second.text)
        assert len(rest) == 11 and not set(rest) & set(shown)
        assert set(shown + rest) == {*ids, other}
        assert 'rel="next"' not in second.text  # the last page
        newer = re.search(r'rel="prev" href="([^"]+)"', second.text)
        assert newer is not None
        back = await http.get(newer.group(1).replace("&amp;", "&"))
        assert re.findall(r'href="/runs/(run_\w+)" class="mono"', back.text) == shown
        by_auto = await http.get("/?automation=two")
        assert re.findall(r'href="/runs/(run_\w+)" class="mono"', by_auto.text) == [other]
        by_contact = await http.get("/?contact=c_9")
        assert re.findall(r'href="/runs/(run_\w+)" class="mono"', by_contact.text) == [other]
        none = await http.get("/?status=failed&range=1h")
        assert "No run matches." in none.text


async def test_actions_need_csrf_same_origin_and_the_write_scope(
    engine: Engine, sql: psycopg.Connection
) -> None:
    flow = (
        Automation("pause")
        .step("nap", "wait_for", duration="1h")
        .step("after", "set", values={"x": "1"})
    )
    await engine.publish(flow.build())
    run_id = (await engine.start("pause", {}, event_id="evt-nap")).run_id
    async with engine.running():
        await eventually(
            lambda: _status_is(engine, run_id, "waiting"), timeout=30, what="the run waits"
        )
    assert await engine.status(run_id) == "waiting"
    async with client(engine, READER) as reader:
        page = await reader.get(f"/runs/{run_id}")
        assert "Cancel run" not in page.text and 'name="csrf"' not in page.text
        refused = await reader.post(f"/runs/{run_id}/cancel", data={"csrf": "x"})
        assert refused.status_code == 403 and "runs:write" in problem(refused)
    async with client(engine) as http:
        page = await http.get(f"/runs/{run_id}")
        assert "timers #" in page.text  # way forward: the wait's timer row
        token = csrf_of(page.text)
        forged = await http.post(f"/runs/{run_id}/cancel", data={"csrf": "0" * 64})
        assert forged.status_code == 403 and "CSRF" in problem(forged)
        cross = await http.post(
            f"/runs/{run_id}/cancel", data={"csrf": token}, headers={"Origin": "https://evil.test"}
        )
        assert cross.status_code == 403
        assert run_row(sql, run_id)["status"] == "waiting"  # nothing changed so far
        done = await http.post(
            f"/runs/{run_id}/cancel",
            data={"csrf": token, "reason": "not needed"},
            headers={"Origin": "http://console.test"},
        )
        assert done.status_code == 303 and done.headers["location"].startswith(f"/runs/{run_id}")
        assert run_row(sql, run_id)["status"] == "cancelled"
        again = await http.post(f"/runs/{run_id}/resume", data={"csrf": token})
        assert again.status_code == 409 and "finished" in problem(again)
        retried = await http.post(f"/runs/{run_id}/retry", data={"csrf": token})
        assert retried.status_code == 303 and "retried" in retried.headers["location"]
    who = f"console:{key_id_of(ADMIN)}"
    (cancelled,) = history(sql, run_id, "run_cancelled")
    assert who in str(cancelled["detail"]), cancelled
    (forked,) = history(sql, run_id, "run_forked")
    assert forked["detail"]["by"] == who


async def test_a_review_is_resolved_from_the_run_page(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    run_id, key = await parked_for_review(engine, sandbox, admin, sql)
    async with client(engine) as http:
        parked = await http.get("/parked?reason=review")
        assert run_id in parked.text and key in parked.text
        page = await http.get(f"/runs/{run_id}")
        assert "Resolve the review" in page.text and key in page.text
        token = csrf_of(page.text)
        bad = await http.post(f"/runs/{run_id}/review", data={"csrf": token, "how": "happened"})
        assert bad.status_code == 400 and "reference" in problem(bad)
        reference = admin.ledger("payment")[0]["response_id"]
        done = await http.post(
            f"/runs/{run_id}/review",
            data={"csrf": token, "how": "happened", "reference": reference},
        )
        assert done.status_code == 303, done.text
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    (resolved,) = history(sql, run_id, "review_resolved")
    assert resolved["detail"]["reference"] == reference
    assert resolved["detail"]["by"] == f"console:{key_id_of(ADMIN)}"
    assert len(admin.ledger("payment")) == 1  # not charged again
