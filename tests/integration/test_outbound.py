"""Outbound safety (issue 14, item 5), against real PostgreSQL and the sandbox over real HTTP.

An engine with no allow-list of its own (``outbound_allow=()``) calls connections and webhooks
through :mod:`onward.outbound`'s checked clients:

* each address of the issue's Show bullet is refused -- 127.0.0.1, 10.0.0.1, 169.254.169.254,
  ``[::1]``, and ``localhost`` (a DNS name resolving to loopback) -- with a PermanentError
  naming the address, the reason and how to allow it; the sandbox, a real server on
  127.0.0.1, records no request;
* a redirect from an allowed sandbox endpoint to any of them is refused: the engine's client
  does not follow it (the step fails on the 307), and a client that follows redirects
  re-checks each hop and refuses the target;
* an answer larger than the cap is cut off;
* the organisation's allow-list lets exactly the sandbox through (host:port), removing the
  entry refuses it again; the same list is read and set through the CLI and over HTTP, a bad
  entry is refused there with the reason and nothing is stored;
* an ``http.call`` step to a private address fails the run with the reason, and a notification
  webhook to loopback is marked failed at once with it.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import httpcore
import httpx
import psycopg
import pytest

from onward import Automation, outbound
from onward.api import ApiServer, create_app
from onward.config import Settings
from onward.engine import Engine
from onward.errors import OutboundRefused, PermanentError
from onward.notify import DeliveryRelay
from onward.outbound import AllowList, guarded_client, parse_entry
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import api_key, auth, run_onward

pytestmark = pytest.mark.usefixtures("admin")

ORG = "test"
SHOWN = {  # the Show bullet's addresses: base URL -> what the refusal names
    "http://127.0.0.1:{port}": "destination 127.0.0.1 is a loopback address",
    "http://10.0.0.1": "destination 10.0.0.1 is a private address",
    "http://169.254.169.254": "destination 169.254.169.254 is a cloud metadata address",
    "http://[::1]:{port}": "destination ::1 is a loopback address",
    "http://localhost:{port}": "is a loopback address (localhost resolves to it)",
}


@pytest.fixture
async def strict(settings: Settings) -> AsyncIterator[Engine]:
    """An engine whose own allow-list is empty (the tests' engines allow the sandbox)."""
    async with Engine.open(
        dataclasses.replace(settings, outbound_allow=(), outbound_max_response_bytes=100_000),
        migrate=False,
    ) as eng:
        yield eng


async def call(engine: Engine, base_url: str, path: str = "/hooks/box") -> dict[str, Any]:
    await engine.integrations.add_connection(
        ORG, "api", provider="http", base_url=base_url, account="acct_api", secret="t"
    )
    connector = await engine.integrations.connector(ORG, "api")
    params = {"path": path, "json": {"hello": "world"}, "idempotency_header": "webhook-id"}
    return await connector.perform("key-1", params)


async def test_each_address_of_the_show_bullet_is_refused_and_nothing_is_sent(
    strict: Engine, sandbox: SandboxServer, admin: SandboxAdmin
) -> None:
    for template, reason in SHOWN.items():
        base = template.format(port=sandbox.port)
        with pytest.raises(OutboundRefused, match="allow it with `onward outbound allow") as got:
            await call(strict, base)
        assert reason in str(got.value), (base, str(got.value))
        assert isinstance(got.value, PermanentError)
    assert admin.hook_received("box")["attempts"] == 0  # the sandbox on 127.0.0.1 saw nothing


async def test_the_organisations_allow_list_lets_exactly_the_sandbox_through(
    strict: Engine, sandbox: SandboxServer, admin: SandboxAdmin
) -> None:
    assert await strict.outbound_allow() == {"engine": [], "org": []}
    view = await strict.allow_outbound([sandbox.allow_entry, "10.0.0.0/8"])
    assert view == {"engine": [], "org": sorted([sandbox.allow_entry, "10.0.0.0/8"])}
    answer = await call(strict, sandbox.url, "/hooks/box")
    assert answer["ok"] is True
    assert admin.hook_received("box")["attempts"] == 1
    # the entry names the port: the same address on another port is still refused
    with pytest.raises(OutboundRefused, match=r"127\.0\.0\.1 is a loopback"):
        await call(strict, "http://127.0.0.1:1")
    await strict.disallow_outbound([sandbox.allow_entry])
    with pytest.raises(OutboundRefused, match=r"127\.0\.0\.1 is a loopback"):
        await call(strict, sandbox.url)
    assert admin.hook_received("box")["attempts"] == 1


async def test_a_redirect_to_a_refused_address_is_refused(
    strict: Engine, sandbox: SandboxServer, admin: SandboxAdmin
) -> None:
    await strict.allow_outbound([sandbox.allow_entry])
    admin.hook_inbox("moved", redirect_to="http://169.254.169.254/latest/meta-data/")
    # the engine does not follow redirects: the 307 is the answer, and the step fails on it
    with pytest.raises(PermanentError, match="HTTP 307"):
        await call(strict, sandbox.url, "/hooks/moved")
    # a client that follows them re-checks every hop, so each target is refused
    allow = AllowList((parse_entry(sandbox.allow_entry),))
    async with guarded_client(allow) as client:
        client.follow_redirects = True
        for template, reason in SHOWN.items():
            target = template.format(port=1 if "127" in template else sandbox.port)
            if "localhost" in template:
                target = "http://localhost:1"
            admin.hook_inbox("moved", redirect_to=f"{target}/x")
            with pytest.raises(OutboundRefused) as got:
                await client.post(f"{sandbox.url}/hooks/moved", json={})
            assert reason.split(" (")[0].removeprefix("destination ") in str(got.value)
    assert admin.hook_received("moved")["attempts"] == 1 + len(SHOWN)  # only the first hops


async def test_an_oversized_answer_is_cut_off(
    strict: Engine, sandbox: SandboxServer, admin: SandboxAdmin
) -> None:
    await strict.allow_outbound([sandbox.allow_entry])
    admin.hook_inbox("big", pad_bytes=300_000)
    with pytest.raises(OutboundRefused, match="larger than 100000 bytes"):
        await call(strict, sandbox.url, "/hooks/big")
    admin.hook_inbox("small", pad_bytes=1_000)
    assert len((await call(strict, sandbox.url, "/hooks/small"))["pad"]) == 1_000


async def test_an_http_call_step_to_a_private_address_fails_the_run_with_the_reason(
    strict: Engine,
) -> None:
    await strict.integrations.add_connection(
        ORG, "internal", provider="http", base_url="http://10.0.0.1", account="a", secret="t"
    )
    flow = Automation("poke").step("poke", "http.call", connection="internal", path="/admin")
    await strict.publish(flow.build())
    async with strict.running():
        started = await strict.start("poke", {}, event_id="e1")
        assert await strict.wait(started.run_id, timeout=20) == "failed"
    view = await strict.show(started.run_id)
    assert "destination 10.0.0.1 is a private address" in json.dumps(view, default=str)


async def test_a_webhook_to_loopback_is_marked_failed_at_once_with_the_reason(
    strict: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    await strict.integrations.add_connection(
        ORG, "mailbox", provider="email", base_url=sandbox.url, account="acct_1", secret="acct_1"
    )
    await strict.allow_outbound([sandbox.allow_entry])  # the provider, not the receiver
    await strict.set_notification_destination("ops", url="http://localhost:1/hook")
    admin.revoke("email", "acct_1")  # the probe marks the mailbox broken: one notification
    assert await strict.integrations.probe(ORG, "mailbox") is not None
    relay = DeliveryRelay(strict.pool, strict.integrations, worker_id="t")
    assert await relay.run_once() == 1
    (row,) = sql.execute(
        "SELECT status, attempts, last_error FROM notification_deliveries WHERE org_id = %s",
        (ORG,),
    ).fetchall()
    assert row["status"] == "failed" and row["attempts"] == 1
    assert "is a loopback address (localhost resolves to it)" in row["last_error"]
    assert "onward outbound allow" in row["last_error"]


# -- CLI and HTTP -------------------------------------------------------------------------------


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_cli_shows_allows_and_disallows_and_a_bad_entry_stores_nothing(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    bad = run_onward(db_url, "outbound", "allow", "10.0.0.0/8", "not a host!")
    assert bad.returncode != 0 and bad.stdout == ""
    (line,) = bad.stderr.splitlines()
    assert line.startswith("onward: ") and "outbound allow entry 'not a host!'" in line
    assert sql.execute("SELECT count(*) AS n FROM outbound_allow").fetchone() == {"n": 0}
    out = ok(run_onward(db_url, "outbound", "allow", "10.0.0.1/8", "[::1]:8099", "Hooks.Internal"))
    assert out.splitlines()[-1] == "organisation: 10.0.0.0/8, [::1]:8099, hooks.internal"
    ok(run_onward(db_url, "outbound", "disallow", "hooks.internal"))
    shown = json.loads(ok(run_onward(db_url, "outbound", "show", "--json")))
    assert shown["org"] == ["10.0.0.0/8", "[::1]:8099"]


async def test_http_shows_allows_and_disallows_and_a_bad_entry_is_a_422(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    server = ApiServer(create_app(engine), port=0, log_level="warning")
    headers = auth(await api_key(engine))
    async with server as api, httpx.AsyncClient(base_url=api.url, headers=headers) as http:
        bad = await http.post("/v1/outbound/allow", json={"entries": ["ok.test", "a/b/c"]})
        assert bad.status_code == 422 and "a/b/c" in bad.text
        assert sql.execute("SELECT count(*) AS n FROM outbound_allow").fetchone() == {"n": 0}
        good = await http.post("/v1/outbound/allow", json={"entries": ["fd00::/8", "x.test"]})
        assert good.status_code == 200
        assert good.json() == {"engine": ["127.0.0.1"], "org": ["fd00::/8", "x.test"]}
        gone = await http.post("/v1/outbound/disallow", json={"entries": ["x.test"]})
        assert gone.json()["org"] == ["fd00::/8"]
        assert (await http.get("/v1/outbound/allow")).json()["org"] == ["fd00::/8"]


async def test_a_name_the_idna_codec_refuses_is_a_connect_error_not_a_crash() -> None:
    # found by schemathesis: a connection's base URL with a 64-character label made the probe
    # answer 500 (UnicodeError out of getaddrinfo)
    for host in ("x" * 64 + ".example", "a..b.example"):
        with pytest.raises(httpcore.ConnectError, match="cannot resolve"):
            await outbound.resolve(host, 443, 5.0)


async def test_an_engine_makes_its_first_http_client_when_a_request_needs_one(
    strict: Engine, sandbox: SandboxServer, admin: SandboxAdmin
) -> None:
    """Opening an engine builds no HTTP client (each builds a TLS context, tens of
    milliseconds: Engine.open took 77 ms with two of them, 6 ms without); the first request
    to the organisation's destinations makes the one its allow-list needs, checked as ever."""
    clients = strict.integrations.outbound._clients
    assert clients == {}
    await strict.allow_outbound([sandbox.allow_entry])
    answer = await call(strict, sandbox.url, "/hooks/box")
    assert answer["ok"] is True
    assert list(clients) == [(sandbox.allow_entry,)]
    with pytest.raises(OutboundRefused, match=r"10\.0\.0\.1 is a private address"):
        await call(strict, "http://10.0.0.1")
    assert admin.hook_received("box")["attempts"] == 1
