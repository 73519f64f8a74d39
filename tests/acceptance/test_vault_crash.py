"""``onward keys rotate-secrets`` SIGKILLed between two batches (crash point
``vault.between_batches``: the first batch re-encrypted under the new key and committed, the
rest still under the old one). Nothing is left half-written: every row decrypts, whichever key
it is under, while both keys are configured; running the rotation again re-encrypts only the
rows not yet under the new key, each once, and the old key can then be removed.

The rotation is a real ``onward keys rotate-secrets --batch 2`` process over five connections."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from onward import vault
from onward.engine import Engine
from onward.sandbox import SandboxServer
from onward.testing import Processes, onward_argv, process_env, run_onward

pytestmark = pytest.mark.acceptance

KEY_A, KEY_B = vault.new_key(), vault.new_key()


def key_ids(sql: psycopg.Connection[Any]) -> list[str]:
    rows = sql.execute("SELECT secret FROM connections ORDER BY org_id, connection_id").fetchall()
    return [str(vault.key_id_of(r["secret"])) for r in rows]


async def test_a_rotation_killed_between_batches_leaves_every_secret_readable_and_finishes(
    db_url: str,
    engine: Engine,
    sandbox: SandboxServer,
    sql: psycopg.Connection[Any],
    processes: Processes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(vault.ENV, f"a:{KEY_A}")
    for i in range(5):
        await engine.integrations.add_connection(
            "test", f"c{i}", provider="email", base_url=sandbox.url, account=f"a{i}",
            secret=f"tok_{i}",
        )  # fmt: skip
    assert key_ids(sql) == ["a"] * 5

    both = {vault.ENV: f"b:{KEY_B},a:{KEY_A}"}
    argv = onward_argv(db_url, "keys", "rotate-secrets", "--batch", "2")
    rotator = processes.start(
        argv, "rotator", env=process_env(crash_at="vault.between_batches@1", extra=both)
    )
    assert await rotator.exited(timeout=60) == -9
    assert rotator.printed("onward: crash point vault.between_batches reached, SIGKILL")

    # the first batch committed under b; the rest still under a, and everything reads
    assert key_ids(sql) == ["b", "b", "a", "a", "a"]
    monkeypatch.setenv(vault.ENV, both[vault.ENV])
    for i in range(5):
        assert (await engine.integrations.connector("test", f"c{i}")).connection.token == f"tok_{i}"

    again = run_onward(db_url, "keys", "rotate-secrets", "--batch", "2", "--json", env=both)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["connections"] == {"scanned": 5, "reencrypted": 3}
    assert key_ids(sql) == ["b"] * 5

    monkeypatch.setenv(vault.ENV, f"b:{KEY_B}")  # key a removed
    for i in range(5):
        assert (await engine.integrations.connector("test", f"c{i}")).connection.token == f"tok_{i}"
