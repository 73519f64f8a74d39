"""Row-level security (issue 14, Build 2 and its first Show item): every table with org_id has
it enabled and forced, with a policy per role; the API's role sees and changes one
organisation's rows only, and with no organisation set sees nothing; the engine's role crosses
organisations because its policy says so.

Two organisations, ``acme`` and ``globex``, each with runs (waiting and finished), history,
steps, timers, outbox rows, keys, audit rows, hook secrets and a limit: then, through SQL as
the API's role, and through HTTP with each organisation's key driven by hypothesis with random
operations, nothing of one organisation is seen, changed or betrayed by the other."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from onward import Automation
from onward.api import ApiServer, create_app
from onward.config import Settings
from onward.db import API_ROLE, org_pool
from onward.engine import Engine

ORGS = ("acme", "globex")
SYSTEM_TABLES = {"leader_leases", "onward_migrations"}  # not the API's at all
WAIT = Automation("flow-0").step("wait", "wait_for", duration="1h").build()
QUICK = (
    Automation("quick")
    .step("a", "set", values={"x": "1"})
    .step("b", "set", values={"y": "2"})
    .build()
)


def tables_with_org_id(sql: psycopg.Connection[Any]) -> list[str]:
    rows = sql.execute(
        """SELECT c.relname FROM pg_class c
           WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
             AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid
                         AND a.attname = 'org_id' AND NOT a.attisdropped)
           ORDER BY 1"""
    ).fetchall()
    return [r["relname"] for r in rows]


@pytest.fixture
def as_api(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection as the API's role (what ``onward.db.make_pool(role=API_ROLE)`` lends)."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(f"SET ROLE {API_ROLE}")
        yield conn


def set_org(conn: psycopg.Connection[Any], org: str | None) -> None:
    if org is None:
        conn.execute("RESET onward.org_id")
    else:
        conn.execute("SELECT set_config('onward.org_id', %s, false)", (org,))


async def two_organisations(engine: Engine) -> dict[str, dict[str, Any]]:
    """Both organisations with rows in most tables: waiting and finished runs, keys, audit,
    a hook secret, a limit, an operation."""
    made: dict[str, dict[str, Any]] = {}
    for org in ORGS:
        e = engine.for_org(org)
        await e.publish(WAIT)
        await e.publish(QUICK)
        waiting = [(await e.start("flow-0", {"i": i}, event_id=f"w{i}")).run_id for i in range(3)]
        quick = [(await e.start("quick", {"i": i}, event_id=f"q{i}")).run_id for i in range(2)]
        _, key = await e.create_key("root", ["admin"], by=f"ops@{org}")
        await e.add_hook_secret("flow-0")
        await e.set_limit("provider:crm", max_concurrent=2)
        await e.cancel(waiting[0], by=f"ops@{org}")
        made[org] = {"waiting": waiting, "quick": quick, "key": key}
    async with engine.running():
        for org in ORGS:
            for run_id in made[org]["quick"]:
                assert await engine.for_org(org).wait(run_id, timeout=30) == "completed"
    return made


def test_every_table_with_org_id_has_row_security_forced_with_both_policies(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    tables = tables_with_org_id(sql)
    assert len(tables) >= 35  # every table of the engine has org_id
    flags = {
        r["relname"]: (r["relrowsecurity"], r["relforcerowsecurity"])
        for r in sql.execute(
            "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class "
            "WHERE relname = ANY(%s)",
            (tables,),
        ).fetchall()
    }
    assert {t: f for t, f in flags.items() if f != (True, True)} == {}
    policies: dict[str, set[tuple[str, str]]] = {}
    for r in sql.execute("SELECT tablename, policyname, roles::text[] AS roles FROM pg_policies"):
        policies.setdefault(r["tablename"], set()).add((r["policyname"], r["roles"][0]))
    for table in tables:
        expected = {("every_org", "onward_engine")}
        if table not in SYSTEM_TABLES:
            expected.add(("one_org", "onward_api"))
        assert policies.get(table) == expected, table


async def test_through_sql_as_the_api_role_each_organisation_sees_its_rows_and_no_other(
    engine: Engine, sql: psycopg.Connection[Any], as_api: psycopg.Connection[Any]
) -> None:
    await two_organisations(engine)
    # and the view `history` (security_invoker): history_log's rows and the settle events the
    # step rows carry (migration 0029), each under its own table's policies
    tables = [t for t in tables_with_org_id(sql) if t not in SYSTEM_TABLES] + ["history"]
    for org in ORGS:  # the view shows both halves for both organisations
        kinds = sql.execute(
            "SELECT count(*) FILTER (WHERE event = 'step_done') AS done, count(*) AS n "
            "FROM history WHERE org_id = %s",
            (org,),
        ).fetchone()
        assert kinds is not None and 0 < kinds["done"] < kinds["n"], org
    populated = 0
    for table in tables:
        q = pgsql.Identifier(table)
        truth = {
            r["org_id"]: r["n"]
            for r in sql.execute(
                pgsql.SQL("SELECT org_id, count(*) AS n FROM {} GROUP BY org_id").format(q)
            ).fetchall()
        }
        populated += all(truth.get(org) for org in ORGS)
        for org in ORGS:
            set_org(as_api, org)
            seen = as_api.execute(
                pgsql.SQL("SELECT org_id, count(*) AS n FROM {} GROUP BY org_id").format(q)
            ).fetchall()
            assert {r["org_id"]: r["n"] for r in seen} == (
                {org: truth[org]} if truth.get(org) else {}
            ), table
        set_org(as_api, None)
        nothing = as_api.execute(pgsql.SQL("SELECT count(*) AS n FROM {}").format(q)).fetchone()
        assert nothing is not None and nothing["n"] == 0, table
    assert populated >= 12  # the check looked at tables that hold both organisations' rows
    # the engine's own secrets (org '_system', the database's key) are no organisation's
    assert (
        sql.execute("SELECT count(*) AS n FROM engine_secrets WHERE org_id = '_system'").fetchone()[
            "n"
        ]
        > 0
    )  # type: ignore[index]
    for table in SYSTEM_TABLES:  # the engine's own tables: not the API's at all
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_api.execute(pgsql.SQL("SELECT 1 FROM {}").format(pgsql.Identifier(table)))


@hsettings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    table=st.sampled_from(["runs", "audit", "api_keys", "limits", "hook_secrets", "history_log"]),
    acting=st.sampled_from(ORGS),
    target=st.sampled_from(ORGS),
    change=st.sampled_from(["update", "delete"]),
)
def _changes_cross_no_organisation(
    conn: psycopg.Connection[Any], table: str, acting: str, target: str, change: str
) -> None:
    q = pgsql.Identifier(table)
    set_org(conn, acting)
    with conn.transaction(force_rollback=True):
        if change == "update":
            cur = conn.execute(
                pgsql.SQL("UPDATE {} SET org_id = org_id WHERE org_id = %s").format(q), (target,)
            )
        else:
            cur = conn.execute(pgsql.SQL("DELETE FROM {} WHERE org_id = %s").format(q), (target,))
        touched = cur.rowcount
    if acting != target:
        assert touched == 0
    # and no row may be written into another organisation
    with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
        conn.execute(
            "INSERT INTO audit (org_id, actor, action, target) VALUES (%s, 'x', 'publish', 'x')",
            (ORGS[1] if acting == ORGS[0] else ORGS[0],),
        )


async def test_no_update_delete_or_insert_crosses_organisations_as_the_api_role(
    engine: Engine, as_api: psycopg.Connection[Any]
) -> None:
    await two_organisations(engine)
    await asyncio.to_thread(_changes_cross_no_organisation, as_api)


async def test_the_api_pool_lends_only_with_an_organisation_and_each_loan_sees_its_own(
    engine: Engine,
) -> None:
    await two_organisations(engine)
    assert engine.api_pool is not None
    acme = org_pool(engine.api_pool, "acme")
    async with acme.connection() as conn:
        who = await (await conn.execute("SELECT current_user AS u")).fetchone()
        runs = await (await conn.execute("SELECT DISTINCT org_id FROM runs")).fetchall()
    assert who is not None and who["u"] == API_ROLE
    assert [r["org_id"] for r in runs] == ["acme"]  # a query that forgot its org_id
    # its connections keep their last organisation between loans: none is lent without one
    with pytest.raises(RuntimeError, match="only with an organisation"):
        async with engine.api_pool.connection():
            pass
    # the same physical connections, lent in turn to each organisation: each sees its own
    globex = org_pool(engine.api_pool, "globex")
    for _ in range(3):
        for pool, org in ((globex, "globex"), (acme, "acme"), (acme, "acme")):
            async with pool.connection() as conn:
                seen = await (await conn.execute("SELECT DISTINCT org_id FROM runs")).fetchall()
            assert [r["org_id"] for r in seen] == [org]
    async with engine.pool.connection() as conn:  # the engine's role: every organisation
        every = await (await conn.execute("SELECT DISTINCT org_id FROM runs ORDER BY 1")).fetchall()
    assert [r["org_id"] for r in every] == ["acme", "globex"]


# -- through HTTP: random operations of two organisations --------------------------------------

OPS = (
    "publish",
    "start",
    "hook",
    "show_other",
    "cancel_other",
    "signal_other",
    "resume_other",
    "revoke_other_key",
    "hook_secrets_other",
    "operation_other",
)


def _not_found_alike(a: httpx.Response, b: httpx.Response, other_id: str, fake_id: str) -> None:
    """``a`` (about another organisation's thing) says exactly what ``b`` (about a thing that
    does not exist) says, once the ids are swapped."""
    assert a.status_code == b.status_code, (a.text, b.text)
    assert a.text.replace(other_id, "ID") == b.text.replace(fake_id, "ID")


def _check_http(base: str, keys: dict[str, str], db_url: str) -> None:
    clients = {
        org: httpx.Client(base_url=base, headers={"Authorization": f"Bearer {keys[org]}"})
        for org in ORGS
    }
    truth = psycopg.connect(db_url, autocommit=True, row_factory=dict_row)

    def ids(query: str, org: str) -> list[str]:
        return [r["id"] for r in truth.execute(query, (org,)).fetchall()]

    @hsettings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.lists(
            st.tuples(st.sampled_from(ORGS), st.sampled_from(OPS), st.integers(0, 2)),
            min_size=1,
            max_size=8,
        )
    )
    def run(ops: list[tuple[str, str, int]]) -> None:
        for org, op, n in ops:
            other = ORGS[1] if org == ORGS[0] else ORGS[0]
            me = clients[org]
            their_runs = ids("SELECT run_id AS id FROM runs WHERE org_id = %s", other)
            their_run = their_runs[n % len(their_runs)] if their_runs else "run_none"
            fake = "run_" + "0" * 24
            if op == "publish":
                doc = Automation(f"flow-{n}").step("wait", "wait_for", duration=f"{n + 1}h").build()
                answer = me.post("/v1/automations", json=doc)
                assert answer.status_code in (200, 201), answer.text
            elif op == "start":
                answer = me.post("/v1/runs", json={"automation_id": f"flow-{n}", "input": {}})
                mine = ids("SELECT automation_id AS id FROM automations WHERE org_id = %s", org)
                assert answer.status_code == (202 if f"flow-{n}" in mine else 404) or (
                    answer.status_code == 200 and f"flow-{n}" in mine
                ), answer.text
            elif op == "hook":  # another org's automation of that id does not exist here
                answer = me.post(f"/v1/hooks/flow-{n}", json={"n": n})
                mine = ids("SELECT automation_id AS id FROM automations WHERE org_id = %s", org)
                if f"flow-{n}" not in mine:
                    assert answer.status_code == 404, answer.text
            elif op == "show_other":
                _not_found_alike(
                    me.get(f"/v1/runs/{their_run}"), me.get(f"/v1/runs/{fake}"), their_run, fake
                )
            elif op == "cancel_other":
                before = truth.execute(
                    "SELECT status, cancel_requested_at FROM runs WHERE run_id = %s", (their_run,)
                ).fetchone()
                _not_found_alike(
                    me.post(f"/v1/runs/{their_run}/cancel", json={}),
                    me.post(f"/v1/runs/{fake}/cancel", json={}),
                    their_run,
                    fake,
                )
                after = truth.execute(
                    "SELECT status, cancel_requested_at FROM runs WHERE run_id = %s", (their_run,)
                ).fetchone()
                assert before == after
            elif op == "signal_other":
                sig = {"signal_id": f"s-{n}-{their_run}", "name": "reply", "run_id": their_run}
                fake_sig = {"signal_id": f"s-{n}-{fake}", "name": "reply", "run_id": fake}
                _not_found_alike(
                    me.post("/v1/signals", json=sig),
                    me.post("/v1/signals", json=fake_sig),
                    their_run,
                    fake,
                )
            elif op == "resume_other":
                _not_found_alike(
                    me.post(f"/v1/runs/{their_run}/resume", json={"by": "x"}),
                    me.post(f"/v1/runs/{fake}/resume", json={"by": "x"}),
                    their_run,
                    fake,
                )
            elif op == "revoke_other_key":
                their_key = ids("SELECT key_id AS id FROM api_keys WHERE org_id = %s", other)[0]
                _not_found_alike(
                    me.delete(f"/v1/keys/{their_key}"),
                    me.delete("/v1/keys/0000000000000000"),
                    their_key,
                    "0000000000000000",
                )
            elif op == "hook_secrets_other":
                answer = me.get("/v1/automations/flow-0/hook-secrets")
                theirs = ids("SELECT secret_id AS id FROM hook_secrets WHERE org_id = %s", other)
                assert answer.status_code == 200
                assert not {s["secret_id"] for s in answer.json()} & set(theirs)
            elif op == "operation_other":
                their_ops = ids(
                    "SELECT operation_id AS id FROM operations WHERE org_id = %s", other
                )
                if their_ops:
                    fake_op = "op_" + "0" * 24
                    _not_found_alike(
                        me.get(f"/v1/operations/{their_ops[0]}"),
                        me.get(f"/v1/operations/{fake_op}"),
                        their_ops[0],
                        fake_op,
                    )
        # what each organisation reads is its own, whole, and nothing else
        for org in ORGS:
            me = clients[org]
            runs = {r["run_id"] for r in me.get("/v1/runs", params={"limit": 1000}).json()}
            assert runs == set(ids("SELECT run_id AS id FROM runs WHERE org_id = %s", org))
            autos = {a["automation_id"] for a in me.get("/v1/automations").json()}
            assert autos == set(
                ids("SELECT automation_id AS id FROM automations WHERE org_id = %s", org)
            )
            keys_seen = {k["key_id"] for k in me.get("/v1/keys").json()}
            assert keys_seen == set(ids("SELECT key_id AS id FROM api_keys WHERE org_id = %s", org))
            audit = me.get("/v1/audit", params={"limit": 500}).json()["rows"]
            audit_ids = {a["audit_id"] for a in audit}
            assert audit_ids <= {
                int(i) for i in ids("SELECT audit_id::text AS id FROM audit WHERE org_id = %s", org)
            }
            for path in ("/v1/signals", "/v1/approvals", "/v1/operations", "/v1/limits"):
                answer = me.get(path)
                assert answer.status_code == 200, (path, answer.text)
                other_runs = set(ids("SELECT run_id AS id FROM runs WHERE org_id <> %s", org))
                assert not any(r in answer.text for r in other_runs), path

    try:
        run()
    finally:
        for c in clients.values():
            c.close()
        truth.close()


async def test_over_http_random_operations_of_two_organisations_never_cross(
    settings: Settings, engine: Engine, db_url: str
) -> None:
    made = await two_organisations(engine)
    keys = {org: made[org]["key"] for org in ORGS}
    roomy = dataclasses.replace(settings, intake_limit=0)  # the property sends many requests
    async with (
        Engine.open(roomy, migrate=False) as served,
        ApiServer(create_app(served), port=0, log_level="warning", access_log=False) as api,
    ):
        await asyncio.to_thread(_check_http, api.url, keys, db_url)
