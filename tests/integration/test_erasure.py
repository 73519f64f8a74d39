"""Erasing a contact (R14), end to end with the sandbox's providers over real HTTP.

Before erasing, Maya has a finished run (a timer wait, a CRM upsert, an approval decided in
the sandbox's Slack, an email sent, her reply delivered by the sandbox's mailbox to the inbound
webhook) and a run waiting for her reply; a stray reply of hers is kept unrouted; she is
suppressed in clear text on another channel. Ravi, another contact, has a finished run of his
own. After ``erase_contact``:

* a scan of every text, varchar, jsonb and text[] column of every table (from
  information_schema, not a list) finds none of Maya's identifiers -- her contact id, the
  address the caller named, the addresses her runs' inputs held -- in any case;
* her waiting run is cancelled, her finished run keeps its history as a skeleton (the same
  events and steps, every detail the redaction marker) plus one ``run_erased`` row naming who;
* every row of Ravi's is exactly as it was;
* a start naming her contact id is refused (``ContactErased``); a start that only carries her
  address is accepted and its email is skipped at send time, the reason not naming her;
* erasing again changes nothing and says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from onward import Automation, ContactErased
from onward.api import ApiServer, create_app
from onward.api_keys import with_key
from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import api_key, eventually, history, run_row

pytestmark = pytest.mark.usefixtures("admin")  # every test starts on a clean sandbox

ORG = "test"  # the `settings` fixture's organisation
ACCOUNT = "acct_1"
WORKSPACE = "T_ACME"
SAM = "U_SAM"
MAYA_ID = "contact-maya-7f3a"
MAYA = "maya@example.test"
MAYA_WORK = "maya.work@example.test"  # only in her second run's input
MAYA_PRIVATE = "Maya.Private@Example.test"  # only named by the caller
RAVI_ID = "contact-ravi-91bc"
RAVI = "ravi@example.test"
MARKER = {"redacted": "erased"}


def follow_up() -> dict[str, Any]:
    """The reference scenario's shape: wait, CRM, approval in Slack, email, wait for the reply."""
    return (
        Automation("follow")
        .step("pause", "wait_for", duration="0.2s")
        .step(
            "crm",
            "crm.upsert",
            connection="crm",
            external_id="{input.contact_id}",
            fields={"email": "{input.email}", "name": "{input.name}"},
        )
        .step(
            "approve",
            "approval",
            connection="slack",
            channel="#approvals",
            approvers=[SAM],
            text="Send the follow-up to {input.name} <{input.email}>?",
            deadline="10m",
        )
        .step(
            "send",
            "email.send",
            connection="mailbox",
            to="{input.email}",
            subject="Following up, {input.name}",
            body="Hello {input.name}, shall we talk?",
        )
        .step("wait_reply", "wait_signal", signals=["reply"], deadline="10m")
        .step("thank", "set", values={"outcome": "'replied: ' + steps.wait_reply.payload.text"})
        .build()
    )


@pytest.fixture
async def api(engine: Engine) -> AsyncIterator[ApiServer]:
    async with ApiServer(create_app(engine), port=0, log_level="warning", access_log=False) as s:
        yield s


@pytest.fixture
async def connected(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, api: ApiServer
) -> Engine:
    for connection, provider, account in (
        ("crm", "crm", ACCOUNT),
        ("mailbox", "email", ACCOUNT),
        ("slack", "slack", WORKSPACE),
    ):
        await engine.integrations.add_connection(
            ORG,
            connection,
            provider=provider,
            base_url=sandbox.url,
            account=account,
            secret=account,
            signing_secret="sandbox-signing-secret" if provider == "slack" else None,
        )
    key = await api_key(engine, "runs:write")
    admin.email_inbound(ACCOUNT, with_key(f"{api.url}/v1/inbound/email", key))
    await engine.grant_approver(SAM)
    await engine.publish(follow_up())
    return engine


# -- the scan ------------------------------------------------------------------------------


def text_columns(sql: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """Every text, varchar, jsonb/json and text[]/varchar[] column of every table."""
    rows = sql.execute(
        """
        SELECT c.table_name, c.column_name
        FROM information_schema.columns c
        JOIN information_schema.tables t
          ON t.table_schema = c.table_schema AND t.table_name = c.table_name
        WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'
          AND (c.data_type IN ('text', 'character varying', 'jsonb', 'json')
               OR (c.data_type = 'ARRAY' AND c.udt_name IN ('_text', '_varchar')))
        ORDER BY 1, 2
        """
    ).fetchall()
    return [(r["table_name"], r["column_name"]) for r in rows]


def scan(sql: psycopg.Connection[Any], needles: list[str]) -> dict[str, int]:
    """``{"table.column: needle": rows}`` for every column holding a needle (any case)."""
    found: dict[str, int] = {}
    for table, column in text_columns(sql):
        for needle in needles:
            query = pgsql.SQL(
                "SELECT count(*) AS n FROM {t} WHERE strpos(lower({c}::text), %s) > 0"
            ).format(t=pgsql.Identifier(table), c=pgsql.Identifier(column))
            row = sql.execute(query, (needle.lower(),)).fetchone()
            if row and row["n"]:
                found[f"{table}.{column}: {needle}"] = row["n"]
    return found


def rows_of_run(sql: psycopg.Connection[Any], run_id: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table that has a run_id column, for one run (a snapshot)."""
    tables = sql.execute(
        "SELECT table_name FROM information_schema.columns WHERE table_schema = 'public' "
        "AND column_name = 'run_id' ORDER BY 1"
    ).fetchall()
    out = {}
    for t in tables:
        query = pgsql.SQL("SELECT * FROM {t} WHERE run_id = %s").format(
            t=pgsql.Identifier(t["table_name"])
        )
        out[t["table_name"]] = sorted(
            (dict(r) for r in sql.execute(query, (run_id,)).fetchall()), key=repr
        )
    return out


# -- driving runs ----------------------------------------------------------------------------


async def approve(engine: Engine, run_id: str) -> None:
    async def pending() -> Any:
        got = await engine.approvals(run_id=run_id, status="pending")
        return got[0] if got else None

    request = await eventually(pending, what=f"an approval request of {run_id}", timeout=30)
    await engine.decide(request["approval_id"], "approve", user=SAM)


async def sent(sql: psycopg.Connection[Any], run_id: str) -> str:
    """The run's email went out and it waits for the reply: the message id."""

    async def waiting() -> Any:
        row = sql.execute(
            "SELECT output FROM steps WHERE run_id = %s AND step_id = 'send' AND status = 'done'",
            (run_id,),
        ).fetchone()
        step = sql.execute(
            "SELECT 1 FROM steps WHERE run_id = %s AND step_id = 'wait_reply' "
            "AND status = 'waiting'",
            (run_id,),
        ).fetchone()
        return row["output"]["message_id"] if row and step else None

    message_id: str = await eventually(waiting, what=f"{run_id} waiting for a reply", timeout=30)
    return message_id


async def through_to_reply(
    engine: Engine, sql: psycopg.Connection[Any], run_id: str
) -> tuple[str, str]:
    await approve(engine, run_id)
    return run_id, await sent(sql, run_id)


async def scenario(
    engine: Engine, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> dict[str, str]:
    """Maya: one finished run, one waiting for her reply, a stray reply, a clear suppression.
    Ravi: one finished run. Answers the run ids."""
    maya = {"name": "Maya", "email": MAYA, "contact_id": MAYA_ID, "tz": "Europe/Berlin"}
    ravi = {"name": "Ravi", "email": RAVI, "contact_id": RAVI_ID}
    async with engine.running():
        done = await engine.start(
            "follow", maya, key=f"signup:{MAYA}", contact_id=MAYA_ID
        )  # a caller's start key that names her address
        waiting = await engine.start(
            "follow",
            {**maya, "email": MAYA_WORK, "note": f"also reachable as {MAYA}"},
            event_id="evt-2",
            contact_id=MAYA_ID,
        )
        other = await engine.start("follow", ravi, event_id="evt-ravi-1", contact_id=RAVI_ID)
        for run in (done, waiting, other):
            await through_to_reply(engine, sql, run.run_id)
        for run, who in ((done, "Maya"), (other, "Ravi")):
            message_id = await sent(sql, run.run_id)
            text = f"yes, this is {who}"
            await asyncio.to_thread(admin.reply, message_id, text=text, deliveries=2)
            assert await engine.wait(run.run_id, timeout=30) == "completed"
        stray = await engine.signal(
            "evt-stray-1",
            "reply",
            correlation_key="email:msg-nobody-recorded",
            payload={"from": MAYA, "text": "did you get my mail?"},
        )
        assert stray.status == "unrouted"
        stray_ravi = await engine.signal(
            "evt-stray-ravi",
            "reply",
            correlation_key="email:msg-nobody-recorded-either",
            payload={"from": RAVI, "text": "hello?"},
        )
        assert stray_ravi.status == "unrouted"
        await engine.integrations.suppress(ORG, MAYA.upper(), "complained", channel="sms")
    assert run_row(sql, waiting.run_id)["status"] == "waiting"
    return {"done": done.run_id, "waiting": waiting.run_id, "other": other.run_id}


# her identifiers, and her name, which only her runs held (so it goes with them)
MAYA_NEEDLES = [MAYA_ID, MAYA, MAYA_WORK, MAYA_PRIVATE, "Maya"]


async def test_after_erasing_no_column_of_any_table_holds_the_contact(
    connected: Engine, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    engine = connected
    runs = await scenario(engine, admin, sql)
    before = scan(sql, MAYA_NEEDLES)
    # the scan does find her, wherever the scenario put her (so finding nothing later means
    # something): runs, steps, history, effects, signals, approvals, suppressions
    tables = {key.split(".")[0] for key in before}
    assert {"runs", "steps", "history_log", "effects", "signals", "approvals"} <= tables, before
    assert "suppressions.contact: maya@example.test" in before
    assert len(text_columns(sql)) > 50
    ravi_before = rows_of_run(sql, runs["other"])
    events_before = [(h["event"], h["seq"], h["step_id"]) for h in history(sql, runs["done"])]

    answer = await engine.erase_contact(MAYA_ID, identifiers=[MAYA_PRIVATE], by="dpo@acme")

    assert scan(sql, MAYA_NEEDLES) == {}
    assert answer["status"] == "done" and answer["finished_at"] is not None
    assert answer["identifiers"] == 4  # her id, the named address, two from her inputs
    by_run = {r["run_id"]: r for r in answer["runs"]}
    assert by_run[runs["done"]] == {"run_id": runs["done"], "cancel": None, "erasure": "erased"}
    assert by_run[runs["waiting"]] == {
        "run_id": runs["waiting"],
        "cancel": "cancelled",
        "erasure": "erased",
    }
    assert (answer["erased"], answer["already_erased"], answer["waiting"]) == (2, 0, 0)
    assert answer["cancelled"] == 1
    assert answer["scrubbed"]["unrouted_signals"] == 1
    assert answer["scrubbed"]["suppressions_in_clear"] == 1
    # the waiting run was cancelled; both keep their status, times and an erasure mark
    assert run_row(sql, runs["waiting"])["status"] == "cancelled"
    for run_id in (runs["done"], runs["waiting"]):
        row = run_row(sql, run_id)
        assert row["erased_at"] is not None and row["input"] == MARKER
        assert row["contact_id"] == answer["subject"]
        assert row["contact_id"].startswith("hmac-sha256:")
    assert run_row(sql, runs["done"])["status"] == "completed"
    # the history keeps its skeleton: the same events and steps, every detail redacted, then
    # one run_erased row naming who
    after = history(sql, runs["done"])
    assert [(h["event"], h["seq"], h["step_id"]) for h in after[:-1]] == events_before
    assert all(h["detail"] in (None, MARKER) for h in after[:-1])
    assert after[-1]["event"] == "run_erased"
    assert after[-1]["detail"]["by"] == "dpo@acme"
    assert len(history(sql, runs["waiting"], "run_erased")) == 1
    # Ravi: every row exactly as it was, his stray reply and his suppression-free address kept
    assert rows_of_run(sql, runs["other"]) == ravi_before
    assert run_row(sql, runs["other"])["input"]["email"] == RAVI
    assert scan(sql, [RAVI_ID, RAVI]).keys() >= {
        "runs.input: ravi@example.test",
        "signals.payload: ravi@example.test",
        "runs.contact_id: contact-ravi-91bc",
    }
    # suppressed by pseudonyms only: email for every identifier, sms where she had complained
    sup = sql.execute("SELECT contact, channel, reason FROM suppressions ORDER BY 2, 1").fetchall()
    assert all(s["contact"].startswith("hmac-sha256:") for s in sup)
    assert sorted({s["channel"] for s in sup}) == ["email", "sms"]
    assert sum(s["channel"] == "email" for s in sup) == 4


async def test_after_erasure_a_start_naming_the_contact_is_refused_and_mail_is_suppressed(
    connected: Engine, admin: SandboxAdmin, sql: psycopg.Connection[Any]
) -> None:
    engine = connected
    answer = await engine.erase_contact(MAYA_ID, identifiers=[MAYA], by="dpo@acme")
    assert answer["status"] == "done" and answer["runs"] == []
    with pytest.raises(ContactErased):
        await engine.start("follow", {"name": "M"}, event_id="again-1", contact_id=MAYA_ID)
    with pytest.raises(ContactErased):  # ids compare in lower case
        await engine.start("follow", {}, event_id="again-2", contact_id=MAYA_ID.upper())
    assert sql.execute("SELECT count(*) AS n FROM runs").fetchone() == {"n": 0}
    # a start that only carries her address (a webhook knows no contact id) is accepted; its
    # email is skipped when it would be sent, and the reason does not repeat the address
    run = await engine.start("follow", {"name": "Maya", "email": MAYA.upper()}, event_id="hook")
    async with engine.running():
        await approve(engine, run.run_id)

        async def skipped() -> Any:
            got = history(sql, run.run_id, "step_skipped")
            return got or None

        (skip,) = await eventually(skipped, what="the send skipped", timeout=30)
    assert skip["step_id"] == "send"
    reason = skip["detail"]["skipped"]
    assert "must not be emailed: erased" in reason and MAYA not in reason.lower()
    outbound = [m for m in admin.email_messages(account=ACCOUNT) if m["direction"] == "outbound"]
    assert outbound == []


async def test_erasing_twice_is_harmless_and_says_what_it_did(
    connected: Engine, sql: psycopg.Connection[Any]
) -> None:
    engine = connected
    first_run = await engine.start("follow", {"email": MAYA}, event_id="e1", contact_id=MAYA_ID)
    first = await engine.erase_contact(MAYA_ID, by="dpo@acme")
    assert [(r["cancel"], r["erasure"]) for r in first["runs"]] == [("cancelled", "erased")]
    history_after_first = history(sql, first_run.run_id)

    second = await engine.erase_contact(MAYA_ID, by="someone else")
    assert second["status"] == "done" and second["requests"] == 2
    assert second["requested_by"] == "dpo@acme"  # the first request is remembered
    assert [(r["cancel"], r["erasure"]) for r in second["runs"]] == [
        ("already_cancelled", "already_erased")
    ]
    assert (second["erased"], second["already_erased"], second["cancelled"]) == (0, 1, 0)
    assert second["suppressed"] == 0  # nothing new to suppress
    assert history(sql, first_run.run_id) == history_after_first  # no second run_erased

    third = await engine.erase_contact(MAYA_ID, identifiers=[MAYA_PRIVATE], by="dpo@acme")
    assert third["suppressed"] == 1 and third["requests"] == 3  # a new address: suppressed
    (row,) = sql.execute("SELECT status, requests, digests FROM erasures").fetchall()
    assert (row["status"], row["requests"], len(row["digests"])) == ("done", 3, 3)
    assert scan(sql, MAYA_NEEDLES) == {}


async def test_bad_erasure_requests_are_refused_before_anything_is_stored(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    from onward import InvalidInput

    for contact, identifiers, by in (
        ("", (), "dpo"),
        ("c\x00", (), "dpo"),
        ("c" * 321, (), "dpo"),
        ("c1", ("not-an-address",), "dpo"),
        ("c1", ("a\ud800@example.test",), "dpo"),
        ("c1", (), ""),
    ):
        with pytest.raises(InvalidInput):
            await engine.erase_contact(contact, identifiers=identifiers, by=by)
    assert sql.execute("SELECT count(*) AS n FROM erasures").fetchone() == {"n": 0}
    assert sql.execute("SELECT count(*) AS n FROM suppressions").fetchone() == {"n": 0}


async def test_a_run_with_a_step_in_flight_is_erased_once_it_stops(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    from onward.testing.kinds import register_kinds

    register_kinds()
    flow = (
        Automation("slow")
        .step("work", "test.sleep", seconds=1.5)
        .step("after", "set", values={"seen": "input.email"})
        .build()
    )
    await engine.publish(flow)
    run = await engine.start("slow", {"email": MAYA}, event_id="slow-1", contact_id=MAYA_ID)
    async with engine.running():

        async def in_flight() -> Any:
            row = sql.execute(
                "SELECT status FROM steps WHERE run_id = %s AND seq = 1", (run.run_id,)
            ).fetchone()
            return row and row["status"] == "running"

        await eventually(in_flight, what="the step in flight")
        answer = await engine.erase_contact(MAYA_ID, by="dpo@acme")
        # only asked to stop: the erasure waits for it, and says so
        assert answer["status"] == "pending"
        assert [(r["cancel"], r["erasure"]) for r in answer["runs"]] == [
            ("cancel_requested", "waiting")
        ]
        # already now: the run carries the pseudonym, the suppression list has no address
        assert run_row(sql, run.run_id)["contact_id"] == answer["subject"]

        async def done() -> Any:
            row = sql.execute("SELECT status, runs_erased FROM erasures").fetchone()
            return row if row and row["status"] == "done" else None

        # the elected sweeper finishes it once the run has stopped at its next safe point
        row = await eventually(done, what="the erasure completed by the sweeper", timeout=30)
    assert row["runs_erased"] == 1
    final = run_row(sql, run.run_id)
    assert final["status"] == "cancelled" and final["erased_at"] is not None
    assert [h["event"] for h in history(sql, run.run_id)][-1] == "run_erased"
    assert scan(sql, [MAYA_ID, MAYA]) == {}
    again = await engine.erase_contact(MAYA_ID, by="dpo@acme")
    assert again["status"] == "done" and again["already_erased"] == 1
