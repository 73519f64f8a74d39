"""Running an ``onward bench`` command as a real process and reading its JSON (shared by the
bench CLI test files)."""

from __future__ import annotations

import json
from typing import Any

from onward.testing import run_onward


def bench(db_url: str, *args: str) -> dict[str, Any]:
    out = run_onward(db_url, "bench", *args, timeout=300, log_level="info")
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result
