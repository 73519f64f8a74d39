"""The runtime does not carry the tools: ``import onward`` and a real worker process load none
of ``onward.bench``, ``onward.chaos``, ``onward.sandbox`` or ``onward.testing``. Each check runs
in a fresh interpreter (this one has loaded them all)."""

from __future__ import annotations

import sys
from pathlib import Path

from onward.testing import Processes, eventually, loaded_modules

TOOLS = ("onward.bench", "onward.chaos", "onward.sandbox", "onward.testing")

# Runs the real `onward` console script in this interpreter and, at exit, prints which onward
# modules it loaded.
CLI_REPORTING_MODULES = """
import atexit, sys
atexit.register(lambda: print("modules " + " ".join(
    sorted(m for m in sys.modules if m == "onward" or m.startswith("onward."))), flush=True))
from onward.cli import main
main()
"""


def tools_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith(TOOLS))


def test_import_onward_loads_no_tools() -> None:
    # `import onward` loads its errors; the rest of its API when first named
    assert loaded_modules("onward") <= {"onward", "onward.errors"}
    modules = loaded_modules("onward", "onward.engine")
    assert "onward.engine" in modules  # it did load the engine
    assert tools_in(modules) == []


def test_the_modules_of_a_worker_load_no_tools() -> None:
    modules = loaded_modules(
        "onward",
        "onward.engine",
        "onward.worker",
        "onward.queue.postgres",
        "onward.queue.redis",
        "onward.doctor",
        "onward.cli",
    )
    assert {"onward.worker", "onward.queue.postgres", "onward.cli"} <= modules
    assert tools_in(modules) == []


async def test_a_running_onward_worker_process_loads_no_tools(db_url: str, tmp_path: Path) -> None:
    with Processes(tmp_path) as procs:
        worker = procs.start(
            [sys.executable, "-c", CLI_REPORTING_MODULES, "--database-url", db_url, "worker"],
            "onward-worker",
        )

        async def working() -> bool:
            assert worker.alive(), worker.log_text()
            return " running (postgres) as " in worker.log_text()

        await eventually(working, timeout=60, what="the worker to run")
        worker.terminate()
        assert await worker.exited(timeout=30) == 0, worker.log_text()
    [line] = [x for x in worker.log_text().splitlines() if x.startswith("modules ")]
    modules = set(line.split()[1:])
    assert {"onward.worker", "onward.sweep", "onward.outbox", "onward.queue.postgres"} <= modules
    assert tools_in(modules) == []
    # nor the HTTP API: `onward worker` serves none, so it never imports FastAPI
    assert not {m for m in modules if m == "onward.api" or m.startswith("onward.api.")}
