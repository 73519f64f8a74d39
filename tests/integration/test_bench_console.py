"""`onward bench console --quick` as a real command: it seeds, serves every page it names and
reports each page's server time beside its ceilings. No timing is asserted (a benchmark, not a
timed test): only that the figures are there and hang together."""

from __future__ import annotations

import json

from onward.testing import run_onward


def test_bench_console_quick_serves_every_page_with_its_figures(db_url: str) -> None:
    out = run_onward(db_url, "bench", "console", "--quick", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["runs"] == 20_001  # the seeded runs and the long one
    pages = res["pages"]
    assert {"list first page", "list 90% back (keyset)", "run, 1,001 transitions"} <= set(pages)
    for name, page in pages.items():
        assert page["round_trip_ms"] > 0, name
        if name != "healthz":
            assert page["server_ms"] is not None and page["server_ms"] <= page["round_trip_ms"]
    assert any("runs_page" in line for line in res["plan_first_page"]), res["plan_first_page"]
