"""The console in a real browser (issue 15, Show): log in with a key, open the run list, filter
it, open a run of the reference scenario (Maya's follow-up, driven through the sandbox's
providers) and see its graph and its timeline with an effect and an approval, then resume a
parked run with a click and watch it complete as the page refreshes itself. Every page is
checked by axe-core (no critical violation) and saved as a screenshot under the test's tmp path
(``ONWARD_UPDATE_SCREENSHOTS=1`` also copies three into ``docs/screenshots/`` for the README).
A second browser context with JavaScript off reads the same run page."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psycopg
import pytest
from playwright.async_api import Browser, BrowserContext, Page

from onward import Automation, budgets
from onward.api import ApiServer, create_app
from onward.config import Settings
from onward.demo import demo_document
from onward.demo.follow_up import run_follow_up
from onward.engine import Engine
from onward.sandbox import SandboxServer
from onward.testing import eventually
from tests.browser.conftest import ROOT, axe_violations, describe

README_SHOTS = ("runs", "run", "health")


class Shots:
    """Screenshots of each page under the test's tmp path (the test's artefacts)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.taken: dict[str, Path] = {}

    async def take(self, page: Page, name: str) -> None:
        path = self.folder / f"{name}.png"
        # the run's page is long (its whole timeline): its first 1,700 pixels say enough
        clip = {"x": 0, "y": 0, "width": 1360, "height": 1700} if name == "run" else None
        await page.screenshot(path=str(path), full_page=True, clip=clip)
        self.taken[name] = path

    def publish(self) -> None:
        if os.environ.get("ONWARD_UPDATE_SCREENSHOTS") == "1":
            target = ROOT / "docs" / "screenshots"
            target.mkdir(parents=True, exist_ok=True)
            for name in README_SHOTS:
                shutil.copy(self.taken[name], target / f"console-{name}.png")


async def accessible(page: Page, what: str) -> None:
    violations = await axe_violations(page)
    critical = [v for v in violations if v["impact"] == "critical"]
    assert critical == [], f"{what}: critical accessibility violations\n{describe(critical)}"


async def budget_parked_run(engine: Engine, sandbox: SandboxServer) -> str:
    """A run parked on its budget by a worker that died holding the day's reservation (the
    reservation lapses; then the sweeper's backstop, or a person, resumes the step)."""
    await engine.integrations.add_connection(
        engine.org_id, "llm", provider="model", base_url=sandbox.url, account="a1", secret="a1"
    )
    await engine.set_budget("*", "tokens", 300)
    assert await budgets.reserve(
        engine.pool, engine.org_id, "other", "dead-worker/1", cost={"tokens": 300.0}, lease=1.0
    )
    flow = Automation("summarise").step("draft", "model.generate", connection="llm", prompt="hi")
    await engine.publish(flow.step("after", "set", values={"done": "true"}).build())
    run_id = (await engine.start("summarise", {}, event_id="evt-sum")).run_id
    assert await engine.wait(run_id, timeout=30) == "parked"
    return run_id


async def lapsed(sql: psycopg.Connection) -> bool:
    row = sql.execute(
        "SELECT bool_and(lease_until < now()) AS lapsed FROM budget_reservations"
        " WHERE effect_key = 'dead-worker/1'"
    ).fetchone()
    return bool(row and row["lapsed"])


async def log_in(context: BrowserContext, url: str, key: str) -> Page:
    page = await context.new_page()
    await page.goto(url + "/")
    assert "/login" in page.url  # every page needs a session
    await page.fill("#key", key)
    await page.click("button[type=submit]")
    await page.wait_for_url(url + "/")
    return page


@pytest.mark.timeout(240)
async def test_the_console_in_a_browser(
    engine: Engine,
    settings: Settings,
    sandbox: SandboxServer,
    sql: psycopg.Connection,
    browser: Browser,
    tmp_path: Path,
) -> None:
    _, key = await engine.create_key("console", ["admin"])
    _, reader_key = await engine.create_key("reader", ["runs:read"])
    shots = Shots(tmp_path / "screenshots")
    await engine.publish(demo_document())
    hello = Automation("hello").step("greet", "set", values={"greeting": "'hi'"}).build()
    await engine.publish(hello)
    lines: list[str] = []
    api = ApiServer(create_app(engine), port=0, log_level="warning", access_log=False)
    async with api:
        async with engine.running():
            # a few runs of another automation, for the list and its filter
            others = [
                (await engine.start("hello", {"n": n}, event_id=f"h{n}")).run_id for n in range(3)
            ]
            maya, _ = await run_follow_up(
                settings, engine, api.url, key, out=lines.append, payload=None, timeout=90
            )
            assert await engine.status(maya) == "completed", "\n".join(lines)
        # from here a worker and a relay, no sweeper: its backstop (S19) would resume the
        # budget-parked step itself once the dead worker's reservation lapsed; a person does here
        async with engine.running(sweeper=False):
            await in_the_browser(
                engine, sandbox, sql, browser, api, key, reader_key, maya, others, shots
            )
    shots.publish()
    assert set(shots.taken) >= {"login", "runs", "run", "parked", "health", "schedules"}


async def in_the_browser(
    engine: Engine,
    sandbox: SandboxServer,
    sql: psycopg.Connection,
    browser: Browser,
    api: ApiServer,
    key: str,
    reader_key: str,
    maya: str,
    others: list[str],
    shots: Shots,
) -> None:
    parked = await budget_parked_run(engine, sandbox)
    context = await browser.new_context(bypass_csp=True, viewport={"width": 1360, "height": 900})

    # -- log in (the login page first), then the run list ---------------------------------
    login = await context.new_page()
    await login.goto(api.url + "/runs/" + maya)
    assert "/login" in login.url
    await accessible(login, "login")
    await shots.take(login, "login")
    await login.fill("#key", "not-a-key")
    await login.click("button[type=submit]")
    assert "not valid" in await login.inner_text(".problem")
    await login.fill("#key", key)
    await login.click("button[type=submit]")
    await login.wait_for_url(f"{api.url}/runs/{maya}")  # back where it was going
    await login.close()

    page = await context.new_page()
    await page.goto(api.url + "/")
    listed = await page.locator("table.runs tbody a.mono").all_inner_texts()
    assert {maya, parked, *others} <= set(listed), listed
    await accessible(page, "runs")
    await shots.take(page, "runs")

    # -- filter: one automation, then parked on a budget -------------------------------
    await page.select_option("#f-automation", "demo-follow-up")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url("**automation=demo-follow-up**")
    assert await page.locator("table.runs tbody a.mono").all_inner_texts() == [maya]
    await page.goto(api.url + "/?parked=budget")
    assert await page.locator("table.runs tbody a.mono").all_inner_texts() == [parked]

    # -- the reference scenario's run on one screen -------------------------------------
    await page.goto(api.url + "/")
    await page.click(f"text={maya}")
    await page.wait_for_url(f"{api.url}/runs/{maya}")
    steps = [s["id"] for s in demo_document()["steps"]]
    drawn = await page.locator("svg.graph g.node").evaluate_all(
        "nodes => nodes.map(n => n.dataset.step)"
    )
    assert sorted(drawn) == sorted(steps)
    visited = await page.locator("svg.graph g.node.visited").evaluate_all(
        "nodes => nodes.map(n => n.dataset.step)"
    )
    assert {"morning", "draft", "crm", "approve", "send", "wait_reply", "thank"} <= set(visited)
    assert "not_sent" not in visited and "no_reply" not in visited
    assert await page.locator("svg.graph path.edge.taken").count() >= 6
    timeline = await page.locator("table.timeline tbody tr td:nth-child(4)").all_inner_texts()
    for event in ("run_started", "timer_moved", "approval_requested", "approval_decided"):
        assert event in timeline, timeline
    assert "signal_consumed" in timeline and timeline[-1] == "step_done"
    last = page.locator("table.timeline tbody tr").last
    assert '"run": "completed"' in (await last.locator("td.detail code").inner_text())
    effects = page.locator("section[aria-labelledby=eff-h] tbody tr")
    effect_rows = await effects.all_inner_texts()
    send = [r for r in effect_rows if f"{maya}/send/" in r]
    assert send and "settled" in send[0] and "email" in send[0], effect_rows
    approvals = await page.locator("section[aria-labelledby=ap-h] tbody tr").all_inner_texts()
    assert len(approvals) == 1 and "approved" in approvals[0] and "U_SAM" in approvals[0]
    assert "slack" in approvals[0]  # decided via Slack's button
    assert "finished" in await page.inner_text("section[aria-labelledby=way-h]")
    await accessible(page, "run")
    await shots.take(page, "run")

    # -- with JavaScript off the same page reads the same ---------------------------------
    plain = await browser.new_context(java_script_enabled=False)
    cookies = await context.cookies()
    assert next(c for c in cookies if c["name"] == "onward_session")["httpOnly"]
    await plain.add_cookies(cookies)
    still = await plain.new_page()
    await still.goto(f"{api.url}/runs/{maya}")
    assert "approval_decided" in await still.inner_text("table.timeline")
    await plain.close()

    # -- the parked list; resume with a click, watch it complete ------------------------
    await page.goto(api.url + "/parked")
    assert parked in await page.inner_text("table.parked")
    await accessible(page, "parked")
    await shots.take(page, "parked")
    await eventually(lambda: lapsed(sql), timeout=15, what="the dead worker's reservation")
    await page.click(f"table.parked button[aria-label='Resume {parked}']")
    await page.wait_for_url(f"{api.url}/runs/{parked}?done=resumed")
    assert "resumed" in await page.inner_text(".notice")
    # the page refreshes itself while the run is unfinished: no reload here
    await page.wait_for_selector("h1 .s-completed", timeout=60_000)
    assert await engine.status(parked) == "completed"
    resumed = sql.execute(
        "SELECT detail FROM history WHERE run_id = %s AND event = 'step_resumed'", (parked,)
    ).fetchone()
    assert resumed is not None and resumed["detail"]["by"] == f"console:{key.split('_')[1]}"
    await shots.take(page, "resumed")

    # -- health, automations, schedules --------------------------------------------------
    for path, name in (
        ("/health", "health"),
        ("/automations", "automations"),
        ("/automations/demo-follow-up", "automation"),
        ("/schedules", "schedules"),
    ):
        await page.goto(api.url + path)
        await accessible(page, name)
        await shots.take(page, name)
    await page.goto(api.url + "/health")
    checks = await page.locator("table.checks tbody tr").all_inner_texts()
    assert any(c.startswith("runs_without_way_forward") and "ok" in c for c in checks)
    assert await page.locator("svg.chart").count() == 6
    await page.goto(api.url + "/automations/demo-follow-up")
    assert await page.locator("svg.graph g.node").count() == len(steps)
    assert '"id": "demo-follow-up"' in await page.inner_text("pre.document")
    await context.close()

    # -- a key that may only read sees no action and cannot post one ---------------------
    reader = await browser.new_context()
    page = await log_in(reader, api.url, reader_key)
    await page.goto(f"{api.url}/runs/{maya}")
    assert await page.locator("section.actions").count() == 0
    await reader.close()
