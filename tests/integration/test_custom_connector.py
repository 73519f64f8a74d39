"""A custom connector, end to end: the README's ``announce_app.py`` (a ``Connector`` subclass
registered under its own provider, and a step kind that calls it with ``onward.run_effect``),
loaded by ``onward --app announce_app:flows up``, connected over the API to the sandbox's mail
provider, which drops the connection after its first send. The effect protocol repeats the
call with the same key; the provider's ledger shows exactly one message, carrying the effect
key as its idempotency key."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import httpx
import psycopg
import pytest

from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import Processes, auth, run_effects, steps
from tests.integration.test_cli import api_url, cli_key, deliver_and_complete, serve
from tests.integration.test_readme_examples import readme_files, readme_section


def test_a_custom_connector_runs_once_through_the_effect_protocol(
    db_url: str,
    tmp_path: Path,
    sandbox: SandboxServer,
    admin: SandboxAdmin,
    processes: Processes,
    sql: psycopg.Connection[dict[str, Any]],
) -> None:
    files = readme_files(readme_section("Using it"))
    (tmp_path / "announce_app.py").write_text(files["announce_app.py"], encoding="utf-8")
    admin.faults("email", script=["drop_after_work"])  # sends, then hangs up

    up = serve(processes, db_url, "up", "--port", "0", app="announce_app:flows", cwd=tmp_path)
    url = api_url(up)
    assert up.find(r"published announce version 1  \(announce_app:flows\[0\]\)")
    connection = {
        "connection_id": "news",
        "provider": "announce",
        "base_url": sandbox.url,
        "account": "acme",
        "secret": "acme",
    }
    key = cli_key(db_url)
    reply = httpx.post(f"{url}/v1/connections", json=connection, timeout=10, headers=auth(key))
    assert reply.status_code == 201, reply.text

    run_id = deliver_and_complete(url, key, "announce", {"email": "maya@example.test"})
    assert up.stop() == 0, up.log_text()

    effects = run_effects(sql, run_id)
    assert len(effects) == 1, effects
    effect = effects[0]
    assert effect["provider"] == "announce" and effect["status"] == "settled"
    assert effect["attempts"] == 2  # the dropped call, then the same key again
    ledger = admin.ledger("email")
    assert [(e["idempotency_key"], e["account"]) for e in ledger] == [
        (effect["effect_key"], "acme")
    ]
    assert ledger[0]["request"]["to"] == "maya@example.test"
    assert effect["result"]["id"] == ledger[0]["response_id"]  # the first answer, replayed
    (send,) = steps(sql, run_id, "send")
    assert send["output"]["id"] == ledger[0]["response_id"]


def test_register_connector_refuses_what_is_not_a_connector() -> None:
    from onward import Connector, register_connector

    with pytest.raises(TypeError, match="a Connector subclass"):
        register_connector(cast(Any, dict))

    class Nameless(Connector):
        async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
            return {}

    with pytest.raises(TypeError, match=r"Nameless\.provider must name the provider"):
        register_connector(Nameless)
