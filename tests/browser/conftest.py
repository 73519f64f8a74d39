"""Browser tests of the console: a real Chromium (Debian's ``chromium`` package, driven by
Playwright: a browser download does not work here) against a real uvicorn server
(``onward.api.ApiServer``) with a real engine and worker. ``scripts/browser-deps`` installs
Chromium and axe-core (npm) when they are missing; ``scripts/test`` runs it."""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright

ROOT = Path(__file__).resolve().parents[2]
AXE_JS = Path(
    os.environ.get("ONWARD_AXE_JS")
    or ROOT / ".venv" / "node" / "node_modules" / "axe-core" / "axe.min.js"
)


def chromium_path() -> str:
    found = os.environ.get("ONWARD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    assert Path(found).exists(), "Chromium is missing: run scripts/browser-deps"
    return found


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield launched
        finally:
            await launched.close()


@functools.cache
def axe_source() -> str:
    assert AXE_JS.exists(), f"axe-core is missing at {AXE_JS}: run scripts/browser-deps"
    return AXE_JS.read_text(encoding="utf-8")


async def axe_violations(page: Page) -> list[dict[str, Any]]:
    """axe-core's violations on the page as it is now (injected from the npm package)."""
    if not await page.evaluate("typeof window.axe !== 'undefined'"):
        await page.add_script_tag(content=axe_source())
    result = await page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "help": v["help"],
            "nodes": [n["target"] for n in v["nodes"]][:5],
        }
        for v in result["violations"]
    ]


def describe(violations: list[dict[str, Any]]) -> str:
    return json.dumps(violations, indent=1)
