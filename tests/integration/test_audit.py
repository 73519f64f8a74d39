"""Audit (issue 14, Build 6): every change an operator or API caller makes is one audit row --
who, what, on what -- written in the same transaction as the change. A refused action writes
none; a change that fails takes its audit row with it (and the other way round); the rows are
read per organisation from the library, the CLI and HTTP."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.errors import ActionRefused, InvalidAutomation, InvalidInput
from onward.testing import api_key, run_onward

from .api_client import api_client

ORG = "test"  # the `settings` fixture's organisation
WAIT = Automation("hello").step("wait", "wait_for", duration="1h")


def audit_rows(sql: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return sql.execute("SELECT * FROM audit ORDER BY audit_id").fetchall()


async def started(engine: Engine, event_id: str, **kw: Any) -> str:
    return (await engine.start("hello", {"n": 1}, event_id=event_id, **kw)).run_id


Change = Callable[[Engine], Awaitable[Any]]


async def _cancel_one(engine: Engine) -> Any:
    run_id = await started(engine, "c-1")
    await engine.cancel(run_id, by="ops@acme")
    return run_id


async def _migrate(engine: Engine) -> Any:
    await engine.publish(Automation("hello").step("wait", "wait_for", duration="2h").build())
    return await engine.migrate_runs("hello", 1, 2, by="ops@acme")


async def _restore(engine: Engine) -> Any:
    await engine.integrations.add_connection(
        ORG, "crm", provider="crm", base_url="http://crm.test", account="acct", secret="s3cret!"
    )
    return await engine.integrations.restore(ORG, "crm", actor="ops@acme")


# (what the change does, its actor, action, target; None: the target the change answers)
CASES: list[tuple[str, Change, str, str, str | None]] = [
    (
        "publish",
        lambda e: e.publish(Automation("other").step("s", "set", values={"a": "1"}).build()),
        "operator",
        "publish",
        "other:v1",
    ),
    ("cancel", _cancel_one, "ops@acme", "cancel", None),
    (
        "cancel_many",
        lambda e: e.cancel_many(automation_id="hello", by="ops@acme"),
        "ops@acme",
        "cancel_many",
        "operation_id",
    ),
    ("migrate", _migrate, "ops@acme", "migrate", "operation_id"),
    (
        "retention",
        lambda e: e.set_retention(90, actor="ops@acme"),
        "ops@acme",
        "retention_set",
        ORG,
    ),
    (
        "destination",
        lambda e: e.set_notification_destination(
            "hook", url="https://hooks.example.test/x", secret="whsec_dG9wc2VjcmV0dG9wc2VjcmV0"
        ),
        "operator",
        "notify_destination_set",
        "hook",
    ),
    (
        "connection_add",
        lambda e: e.integrations.add_connection(
            ORG, "crm", provider="crm", base_url="http://crm.test", account="a", secret="s3cret!"
        ),
        "operator",
        "connection_add",
        "crm",
    ),
    ("connection_restore", _restore, "ops@acme", "connection_restore", "crm"),
    ("grant", lambda e: e.grant_approver("lee@acme"), "operator", "approver_grant", "lee@acme"),
    ("limit", lambda e: e.set_limit("org", max_concurrent=3), "operator", "limit_set", "org"),
    (
        "circuit",
        lambda e: e.configure_circuit("provider:crm", threshold=2),
        "operator",
        "circuit_set",
        "provider:crm",
    ),
    ("budget", lambda e: e.set_budget("*", "usd", 5.0), "operator", "budget_set", "*"),
]


@pytest.mark.parametrize(("name", "change", "actor", "action", "target"), CASES)
async def test_each_change_writes_exactly_one_audit_row_naming_who_what_and_target(
    engine: Engine,
    sql: psycopg.Connection[Any],
    name: str,
    change: Change,
    actor: str,
    action: str,
    target: str | None,
) -> None:
    await engine.publish(WAIT.build())
    await started(engine, "before")
    before = [r["action"] for r in audit_rows(sql)]
    assert before == ["publish"]  # the setup's own publish; a start is not audited

    answer = await change(engine)

    rows = audit_rows(sql)
    mine = rows[len(before) :]
    # a change with a setup step (restore adds first) writes the setup's row too
    assert [r["action"] for r in mine][-1:] == [action], mine
    assert sum(r["action"] == action for r in mine) == 1, mine
    row = mine[-1]
    assert (row["org_id"], row["actor"]) == (ORG, actor)
    if target is None:
        want = answer
    elif target == "operation_id":
        want = answer["operation_id"]
    else:
        want = target
    assert row["target"] == want, row
    assert "s3cret" not in json.dumps(row["detail"]) and "whsec_" not in json.dumps(row["detail"])
    # the library reads it back, newest first, filtered by action
    (read,) = await engine.audit(action=action, limit=1)
    assert (read["audit_id"], read["actor"], read["target"]) == (
        row["audit_id"],
        actor,
        row["target"],
    )


async def test_removals_revocations_and_a_repeated_publish(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(WAIT.build())
    await engine.publish(WAIT.build())  # the same content: no change, no row
    await engine.grant_approver("lee@acme")
    await engine.revoke_approver("lee@acme", actor="boss")
    await engine.revoke_approver("lee@acme", actor="boss")  # nothing left to revoke: no row
    await engine.set_limit("org", max_concurrent=2)
    await engine.remove_limit("org")
    await engine.remove_limit("org")  # none: no row
    await engine.set_notification_destination("hook", url="https://hooks.example.test/x")
    await engine.remove_notification_destination("hook", actor="boss")
    run_id = await started(engine, "x")
    await engine.cancel(run_id, by="a")
    await engine.cancel(run_id, by="a")  # already cancelled: no row
    got = [(r["action"], r["actor"], r["target"]) for r in audit_rows(sql)]
    assert got == [
        ("publish", "operator", "hello:v1"),
        ("approver_grant", "operator", "lee@acme"),
        ("approver_revoke", "boss", "lee@acme"),
        ("limit_set", "operator", "org"),
        ("limit_remove", "operator", "org"),
        ("notify_destination_set", "operator", "hook"),
        ("notify_destination_remove", "boss", "hook"),
        ("cancel", "a", run_id),
    ]
    # the destination's generated secret is in no audit row
    assert all("whsec_" not in json.dumps(r["detail"]) for r in audit_rows(sql))


async def test_refused_actions_write_no_audit_row(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(WAIT.build())
    run_id = await started(engine, "r")
    before = audit_rows(sql)
    with pytest.raises(InvalidAutomation):
        await engine.publish({"id": "broken", "steps": []})
    with pytest.raises(InvalidInput):
        await engine.set_retention(0.5)
    with pytest.raises(InvalidInput):
        await engine.set_limit("org")
    with pytest.raises(InvalidInput):
        await engine.cancel_many(by="ops")  # no filter
    with pytest.raises(InvalidInput):
        await engine.set_notification_destination("hook", url="ftp://nope")
    with pytest.raises(ActionRefused):
        await engine.resume(run_id, by="ops")  # not parked
    with pytest.raises(ActionRefused):
        await engine.resolve_review(run_id, "skip", by="ops")
    with pytest.raises(InvalidInput):
        await engine.erase_contact("c", identifiers=["not-an-address"], by="dpo")
    assert audit_rows(sql) == before


async def test_an_audit_row_commits_with_its_change_or_not_at_all(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    """A change that fails at commit (a deferred trigger on the changed table) takes its audit
    row with it; an audit insert that fails takes the change with it."""
    sql.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
    )
    sql.execute(
        "CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT OR UPDATE ON organisations "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()"
    )
    with pytest.raises(psycopg.errors.RaiseException):
        await engine.set_retention(90, actor="ops")
    assert audit_rows(sql) == []
    sql.execute("DROP TRIGGER refuse_at_commit ON organisations")

    sql.execute(
        "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION refuse()"
    )
    with pytest.raises(psycopg.errors.RaiseException):
        await engine.set_limit("org", max_concurrent=3)
    assert sql.execute("SELECT count(*) AS n FROM limits").fetchone()["n"] == 0
    with pytest.raises(psycopg.errors.RaiseException):
        await engine.publish(WAIT.build())
    assert sql.execute("SELECT count(*) AS n FROM automation_versions").fetchone()["n"] == 0
    sql.execute("DROP TRIGGER refuse_audit ON audit")
    await engine.set_limit("org", max_concurrent=3)
    assert [r["action"] for r in audit_rows(sql)] == ["limit_set"]


async def test_erasure_leaves_only_the_pseudonym_in_audit(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    contact = "contact-maya-7f3a"
    await engine.publish(WAIT.build())
    await started(engine, "m1", contact_id=contact)
    await engine.cancel_many(contact_id=contact, by="ops")  # the filter names her
    answer = await engine.erase_contact(contact, by="dpo@acme")
    rows = audit_rows(sql)
    assert not any(contact in json.dumps(r, default=str) for r in rows)
    erase = rows[-1]
    assert (erase["action"], erase["actor"], erase["target"]) == (
        "erase",
        "dpo@acme",
        answer["subject"],
    )
    assert rows[-2]["detail"]["contact_id"] == answer["subject"]  # the bulk cancel's filter


async def test_retention_deletes_no_audit_row(engine: Engine, sql: psycopg.Connection[Any]) -> None:
    await engine.publish(WAIT.build())
    run_id = await started(engine, "old")
    await engine.cancel(run_id, by="ops")
    await engine.set_retention(1)
    sql.execute("UPDATE runs SET finished_at = now() - interval '3 days'")
    before = audit_rows(sql)
    pruned = await engine.prune()
    assert pruned["pruned"] == 1
    assert audit_rows(sql) == before  # the cancel's row still names the pruned run


async def test_http_audit_pages_by_id_and_names_the_api_key_as_actor(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    key = await api_key(engine)
    async with api_client(engine, key=key) as http:
        for days in (10, 20, 30):
            assert (await http.put("/v1/retention", json={"days": days})).status_code == 200
        # the key's own key_create row is in the audit too: these pages are the settings'
        setting = {"action": "retention_set", "limit": 2}
        first = (await http.get("/v1/audit", params=setting)).json()
        assert [r["detail"]["days"] for r in first["rows"]] == [30, 20]
        assert {r["actor"] for r in first["rows"]} == {f"key:{key.split('_')[1]}"}
        rest = (
            await http.get("/v1/audit", params={**setting, "before": first["next_before"]})
        ).json()
        assert [r["detail"]["days"] for r in rest["rows"]] == [10]
        assert rest["next_before"] is None
        only = (await http.get("/v1/audit", params={"action": "publish"})).json()
        assert only["rows"] == []
        bad = await http.get("/v1/audit", params={"action": "nothing"})
        assert bad.status_code == 422
        bad = await http.get("/v1/audit", params={"since": "yesterday"})
        assert bad.status_code == 422


async def test_cli_audit_names_the_operator_and_refuses_bad_input(
    engine: Engine, db_url: str
) -> None:
    env = {"ONWARD_OPERATOR": "alice"}
    done = run_onward(db_url, "--org", ORG, "retention", "set", "--days", "45", env=env)
    assert done.returncode == 0, done.stderr
    out = run_onward(db_url, "--org", ORG, "audit", "--json", "--action", "retention_set")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert (row["actor"], row["action"], row["target"], row["detail"]) == (
        "alice",
        "retention_set",
        ORG,
        {"days": 45.0},
    )
    text = run_onward(db_url, "--org", ORG, "audit")
    assert "alice  retention_set  test" in text.stdout
    bad = run_onward(db_url, "--org", ORG, "audit", "--since", "yesterday")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "onward: --since: not an ISO 8601 instant: 'yesterday'"
