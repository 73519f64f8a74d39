"""`onward api --workers N`: one port, N real API processes; and how long a process trusts an API
key it verified (onward.cache) when another process revokes it.

Every process here is real: the API's processes are forked by the `onward api` under test,
stopped with real signals and really killed."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx

from onward import Automation
from onward.engine import Engine
from onward.testing import (
    Process,
    Processes,
    api_key,
    auth,
    child_pids,
    eventually,
    free_port,
    pid_alive,
    run_onward,
)

FLOW = Automation("hello").step("greet", "set", values={"greeting": "'hi'"}).build()


async def _serving(api: Process, url: str, workers: int) -> list[int]:
    async def up() -> list[int] | None:
        assert api.alive(), api.log_text()
        kids = child_pids(api.pid)
        if len(kids) != workers:
            return None
        try:
            async with httpx.AsyncClient() as client:
                ok = (await client.get(f"{url}/healthz", timeout=2)).status_code == 200
        except httpx.HTTPError:
            return None
        return kids if ok else None

    kids: list[int] = await eventually(up, timeout=60, what="the API processes answering")
    return kids


async def test_two_api_processes_share_one_port_and_stop_together(
    engine: Engine, db_url: str, processes: Processes
) -> None:
    await engine.publish(FLOW)
    key = await api_key(engine, "runs:write", "runs:read")
    port = free_port()
    api = processes.onward(
        db_url, "--org", "test", "api", "--port", str(port), "--workers", "2", name="api"
    )
    url = f"http://127.0.0.1:{port}"
    kids = await _serving(api, url, 2)
    assert len(set(kids)) == 2 and api.pid not in kids

    # many connections at once, each request a start or its duplicate: every one answered
    async def post(client: httpx.AsyncClient, i: int) -> tuple[int, str]:
        r = await client.post(
            f"{url}/v1/hooks/hello",
            json={"i": i // 2},
            headers={**auth(key), "X-Event-Id": f"evt-{i // 2}"},
        )
        return r.status_code, r.json()["run_id"]

    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(limits=limits, timeout=20) as client:
        answers = await asyncio.gather(*(post(client, i) for i in range(200)))
    assert sorted({s for s, _ in answers}) == [200, 202]
    by_event: dict[int, set[str]] = {}
    for i, (_, run_id) in enumerate(answers):
        by_event.setdefault(i // 2, set()).add(run_id)
    assert all(len(ids) == 1 for ids in by_event.values())  # a duplicate answers its run
    assert len(await engine.runs(limit=500)) == 100

    # SIGTERM to the supervisor: every API process stops gracefully, and so does it
    api.signal(signal.SIGTERM)
    assert await api.exited(timeout=30) == 0, api.log_text()
    assert not any(pid_alive(k) for k in kids)


async def test_a_dead_api_process_stops_the_others_and_an_orphan_stops_itself(
    db_url: str, processes: Processes
) -> None:
    port = free_port()
    api = processes.onward(db_url, "api", "--port", str(port), "--workers", "2", name="api")
    kids = await _serving(api, f"http://127.0.0.1:{port}", 2)
    os.kill(kids[0], signal.SIGKILL)
    assert await api.exited(timeout=30) != 0  # the supervisor stopped the other and failed
    assert "exited" in api.log_text()

    async def gone() -> bool:
        return not any(pid_alive(k) for k in kids)

    await eventually(gone, timeout=30, what="every API process gone")

    # the supervisor itself killed: its API processes notice and stop (no process is left)
    port = free_port()
    api = processes.onward(db_url, "api", "--port", str(port), "--workers", "2", name="api2")
    kids = await _serving(api, f"http://127.0.0.1:{port}", 2)
    api.kill()
    await api.exited(timeout=10)
    await eventually(gone, timeout=30, what="the orphaned API processes stopping")


async def test_a_key_revoked_elsewhere_stops_opening_an_api_process_within_its_cache_time(
    engine: Engine, db_url: str, processes: Processes
) -> None:
    key = await api_key(engine, "runs:read")
    rows = await engine.keys()
    key_id = next(r["key_id"] for r in rows if key.startswith(f"onw_{r['key_id']}_"))
    urls = {}
    for name, seconds in (("cached", "1"), ("uncached", "0")):
        port = free_port()
        processes.onward(
            db_url,
            "--org",
            "test",
            "api",
            "--port",
            str(port),
            name=name,
            env={"ONWARD_AUTH_CACHE_SECONDS": seconds},
        )
        urls[name] = f"http://127.0.0.1:{port}"

    async with httpx.AsyncClient(timeout=10) as client:

        async def status(name: str) -> int | None:
            try:
                return (await client.get(f"{urls[name]}/v1/runs", headers=auth(key))).status_code
            except httpx.HTTPError:
                return None

        for name in urls:  # both serve the key (the cached one now holds it)

            async def serves(name: str = name) -> bool:
                return await status(name) == 200

            await eventually(serves, timeout=60, what=f"{name} serving the key")

        # revoked by another process (the CLI): the uncached API refuses at once, the cached
        # one within its second
        done = run_onward(db_url, "--org", "test", "keys", "revoke", key_id)
        assert done.returncode == 0, done.stderr
        assert await status("uncached") == 401
        loop = asyncio.get_running_loop()
        revoked_at = loop.time()

        async def refused() -> bool:
            return await status("cached") == 401

        await eventually(refused, timeout=10, interval=0.05, what="the cached API refusing")
        assert loop.time() - revoked_at < 3.0  # its second, and the polls around it
