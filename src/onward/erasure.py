"""Erasing a contact (R14): every run that references it cancelled and emptied of its data,
the contact suppressed by a pseudonym, and nothing left in clear text.

    answer = await engine.erase_contact("c_81", identifiers=["maya@example.test"], by="dpo")

**Which identifiers.** The contact id, the identifiers the caller names, and every email
address found in the input of the contact's runs (every string in ``runs.input``, at any
depth, searched with :data:`EMAIL`), each normalised (``pseudonyms.normalise``). A run belongs
to the contact when ``runs.contact_id`` is the id as given, in lower case, or its pseudonym
(an erased run keeps the pseudonym, so a repeat still finds it).

**Three kinds of transaction**, so a contact with many runs never needs one huge one:

1. *The record* (under the contact's lock): the ``erasures`` row (``pending``, keyed by the
   contact's pseudonym, holding only pseudonyms); every unfinished run cancelled through
   :func:`onward.cancel.cancel_in_tx` -- at once when nothing executes, cancel-requested when a
   step is in flight; every run's ``contact_id`` replaced by the pseudonym (and a start key that
   names an identifier by ``erased:<run_id>``); the contact's clear-text suppressions replaced
   by pseudonyms (``connections.pseudonymise_suppressions``); unrouted signals, bulk operations
   and notifications that name an identifier scrubbed. Crash point ``erasure.after_record``.
2. *One per finished run* (under the run's transition lock): its timers' intents, steps'
   outputs, errors and wakes, effects' results and errors, signals' payloads and keys,
   approvals' content, correlations, history details (the skeleton stays: events, times, step
   ids) and the run's input, variables and reason -- replaced by the marker
   ``{"redacted": "erased"}`` (``[erased]`` in text columns); one ``run_erased`` history row
   (who; its time says when); ``runs.erased_at`` set. Crash point ``erasure.after_run``.
3. *The finish* (under the contact's lock): ``done`` once no run of the contact is left
   unerased.

**A run with a step in flight** is only asked to stop; its data is erased once it has stopped.
The ``erasures`` row stays ``pending`` until then, and the elected sweeper
(:func:`finish_pending`, every tick) or the same request again erases it and finishes. A
process killed between the transactions leaves the row ``pending`` and the runs findable by
the pseudonym: nothing is lost track of.

**After erasure.** A start naming the erased contact id is refused (``ContactErased``, HTTP
409 ``contact_erased``), under the contact's lock shared (:func:`check_start`), so a start and
an erasure cannot pass each other. A start that only carries an erased address in its input is
accepted (onward cannot tell whose it is), and its ``email.send`` to that address is skipped at
send time, the reason not repeating the address.

**Idempotent.** Erasing again changes nothing already erased and says so: ``already_erased``
per run, ``requests`` counts the calls.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from onward import audit, cancel, connections, pseudonyms, signals
from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import ContactErased, InvalidInput
from onward.inputs import check_text

Q = Queries(__package__, "erasure.sql")

MARKER = "[erased]"
MAX_IDENTIFIER = 320
MAX_IDENTIFIERS = 100
MAX_BY = 256
#: an email address inside any text ("Maya <maya@example.test>" gives the address)
EMAIL = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
#: a contact id shorter than this is matched outside its runs only as a whole JSON string
#: (``"c_81"``), so a short id cannot scrub unrelated text that happens to contain it
SHORT_ID = 8
PASSES = 3  # a run that finished while an erasure worked is erased in the next pass


def emails_in(value: Any) -> set[str]:
    """Every email address in a JSON value's strings (keys too), at any depth."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.update(m.group(0) for m in EMAIL.finditer(item))
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def check_request(
    contact_id: str, identifiers: Iterable[str], by: str
) -> tuple[str, list[str], str]:
    """The request as it will be used; ``InvalidInput`` before anything is written."""
    if not isinstance(contact_id, str) or not contact_id.strip():
        raise InvalidInput("contact id: must not be empty")
    check_text(contact_id, "contact id")
    if len(contact_id) > MAX_IDENTIFIER:
        raise InvalidInput(f"contact id: at most {MAX_IDENTIFIER} characters")
    named = list(identifiers)
    if len(named) > MAX_IDENTIFIERS:
        raise InvalidInput(f"identifiers: at most {MAX_IDENTIFIERS}")
    for ident in named:
        check_text(ident, "identifier")
        if len(ident) > MAX_IDENTIFIER:
            raise InvalidInput(f"identifier: at most {MAX_IDENTIFIER} characters")
        if not EMAIL.fullmatch(ident.strip()):
            raise InvalidInput(f"identifier {ident[:80]!r}: not an email address")
    if not by.strip() or len(by) > MAX_BY:
        raise InvalidInput(f"by: 1 to {MAX_BY} characters")
    check_text(by, "by")
    return contact_id, named, by


def _needles(contact_id: str, identifiers: set[str]) -> list[str]:
    """What is searched for (lower case) outside the contact's runs."""
    contact = pseudonyms.normalise(contact_id)
    out = {i for i in identifiers if i != contact}
    out.add(contact if len(contact) >= SHORT_ID else f'"{contact}"')
    return sorted(out)


async def erase_contact(
    pool: Pool,
    org_id: str,
    contact_id: str,
    *,
    identifiers: Iterable[str] = (),
    by: str = "operator",
) -> dict[str, Any]:
    """Erase a contact: see the module's docstring. Returns what was done: ``status``
    (``done``, or ``pending`` while a run with a step in flight has not stopped), per run its
    cancel outcome and its erasure (``erased``, ``already_erased``, ``waiting``), counts."""
    contact_id, named, by = check_request(contact_id, identifiers, by)
    async with pool.connection() as conn:
        async with conn.transaction():
            answer = await _record(conn, org_id, contact_id, named, by)
        crash_point("erasure.after_record")
        done = await _complete(conn, org_id, answer["subject"], by=by)
    runs = {r["run_id"]: r for r in answer.pop("runs")}
    for run_id, outcome in done.pop("outcomes").items():
        runs.setdefault(run_id, {"run_id": run_id, "cancel": None})["erasure"] = outcome
    for r in runs.values():
        r.setdefault("erasure", "already_erased" if r.pop("was_erased", False) else "waiting")
        r.pop("was_erased", None)
    answer["runs"] = sorted(runs.values(), key=lambda r: r["run_id"])
    for what in ("erased", "already_erased", "waiting"):
        answer[what] = sum(1 for r in answer["runs"] if r["erasure"] == what)
    answer["cancelled"] = sum(
        1 for r in answer["runs"] if r["cancel"] in ("cancelled", "cancel_requested")
    )
    return {**answer, **done, "contact_id": contact_id}


async def _record(
    conn: Conn, org_id: str, contact_id: str, named: list[str], by: str
) -> dict[str, Any]:
    key = await pseudonyms.key(conn, org_id)
    subject = pseudonyms.digest(key, contact_id)
    args = {"org_id": org_id, "subject": subject}
    await conn.execute(Q.lock_contact, args)
    ids = sorted({contact_id, pseudonyms.normalise(contact_id), subject})
    runs = await (await conn.execute(Q.contact_runs, {**args, "ids": ids})).fetchall()
    found: set[str] = set()
    for r in runs:
        if not r["erased"]:
            found |= emails_in(r["input"])
    identifiers = {pseudonyms.normalise(i) for i in (contact_id, *named, *found)}
    digests = sorted({pseudonyms.digest(key, i) for i in identifiers})
    row = await (await conn.execute(Q.record, {**args, "digests": digests, "by": by})).fetchone()
    assert row is not None
    cancels: list[dict[str, Any]] = []
    for r in runs:  # in run id order: each run's locks, one run after another
        got = await cancel.cancel_in_tx(
            conn, org_id, r["run_id"], by=by, reason="contact erased", worker="erasure"
        )
        outcome = got["outcome"]
        cancels.append(
            {
                "run_id": r["run_id"],
                "cancel": None if outcome.startswith("already_finished") else outcome,
                "was_erased": r["erased"],
            }
        )
    await audit.record(  # the pseudonym only: never the contact's id or identifiers
        conn,
        org_id,
        actor=by,
        action="erase",
        target=subject,
        detail={"runs": len(runs), "requests": row["requests"]},
    )
    needles = _needles(contact_id, identifiers)
    run_ids = [r["run_id"] for r in runs]
    await conn.execute(
        Q.pseudonymise_runs, {**args, "run_ids": run_ids, "needles": sorted(identifiers)}
    )
    suppressions = await connections.pseudonymise_suppressions(
        conn, org_id, sorted(identifiers), digests, reason="erased"
    )
    scrubbed = {"suppressions_in_clear": suppressions["forgotten"]}
    scrub = {"org_id": org_id, "needles": needles, "marker": MARKER, "ids": sorted(identifiers)}
    for name, query in (
        ("unrouted_signals", Q.scrub_unrouted_signals),
        ("operations", Q.scrub_operations),
        ("notifications", Q.scrub_notifications),
    ):
        scrubbed[name] = (await conn.execute(query, scrub)).rowcount
    return {
        "subject": subject,
        "requested_by": row["requested_by"],
        "requested_at": row["requested_at"],
        "requests": row["requests"],
        "identifiers": len(identifiers),
        "suppressed": suppressions["added"],
        "scrubbed": scrubbed,
        "runs": cancels,
    }


async def erase_run(conn: Conn, org_id: str, run_id: str, *, by: str, subject: str) -> str:
    """Erase one finished run's data in its own transaction: ``erased``, ``already_erased``,
    ``waiting`` (not finished: a step was in flight) or ``gone`` (no such run any more)."""
    args = {"org_id": org_id, "run_id": run_id}
    async with conn.transaction():
        await signals.lock_run(conn, org_id, run_id)
        run = await (await conn.execute(Q.lock_run_row, args)).fetchone()
        if run is None:
            return "gone"
        if run["erased"]:
            return "already_erased"
        if not run["finished"]:
            return "waiting"
        red = {**args, "marker": MARKER}
        # lock order: timers, steps, then the rest of the run's rows, the run row last
        for query in (
            Q.redact_timers,
            Q.redact_steps,
            Q.redact_effects,
            Q.redact_signals,
            Q.forget_correlations,
            Q.redact_approvals,
        ):
            await conn.execute(query, red)
        await conn.execute(
            Q.redact_history, {**args, "by": by, "subject": subject, "worker": "erasure"}
        )
        await conn.execute(Q.redact_run, red)
    return "erased"


async def _complete(conn: Conn, org_id: str, subject: str, *, by: str) -> dict[str, Any]:
    """Erase every finished run of the contact not erased yet, then finish if none is left."""
    args = {"org_id": org_id, "subject": subject}
    outcomes: dict[str, str] = {}
    waiting: list[str] = []
    for _ in range(PASSES):
        rows = await (await conn.execute(Q.remaining, args)).fetchall()
        todo = [r["run_id"] for r in rows if r["finished"]]
        waiting = [r["run_id"] for r in rows if not r["finished"]]
        for run_id in todo:
            outcomes[run_id] = await erase_run(conn, org_id, run_id, by=by, subject=subject)
            crash_point("erasure.after_run")
        if not todo:
            break
    for run_id in waiting:
        outcomes.setdefault(run_id, "waiting")
    async with conn.transaction():
        await conn.execute(Q.lock_contact, args)
        rows = await (await conn.execute(Q.remaining, args)).fetchall()
        if rows:
            return {"status": "pending", "outcomes": outcomes, "finished_at": None}
        row = await (await conn.execute(Q.finish, args)).fetchone()
    assert row is not None
    return {"status": row["status"], "outcomes": outcomes, "finished_at": row["finished_at"]}


async def finish_pending(pool: Pool, *, limit: int = 20) -> int:
    """The elected sweeper's part: erase the runs of pending erasures that have stopped since,
    and finish the erasures that have no run left. Returns how many erasures finished."""
    finished = 0
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q.pending, {"limit": limit})).fetchall()
        for r in rows:
            done = await _complete(conn, r["org_id"], r["subject"], by=r["requested_by"])
            finished += done["status"] == "done"
    return finished


async def check_start(conn: Conn, org_id: str, contact_id: str) -> None:
    """In a start's transaction, before its run is written: take the contact's lock shared
    and refuse (``ContactErased``) if the contact was erased or is being erased."""
    subject = pseudonyms.digest(await pseudonyms.key(conn, org_id), contact_id)
    args = {"org_id": org_id, "subject": subject}
    await conn.execute(Q.lock_contact_shared, args)
    # a separate statement: its snapshot sees an erasure that committed while the lock waited
    row = await (await conn.execute(Q.erased, args)).fetchone()
    if row is not None:
        raise ContactErased(org_id, contact_id)


async def check_starts(conn: Conn, org_id: str, contact_ids: Iterable[str]) -> set[str]:
    """:func:`check_start` for a batch of starts, in two statements whatever its size: take
    every named contact's lock shared and answer which of the ids given were erased (or are
    being erased)."""
    pkey = await pseudonyms.key(conn, org_id)
    subjects = {contact_id: pseudonyms.digest(pkey, contact_id) for contact_id in contact_ids}
    if not subjects:
        return set()
    args = {"org_id": org_id, "subjects": sorted(set(subjects.values()))}
    await conn.execute(Q.lock_contacts_shared, args)
    # a separate statement: its snapshot sees an erasure that committed while the locks waited
    erased = {row["subject"] for row in await (await conn.execute(Q.erased_any, args)).fetchall()}
    return {contact_id for contact_id, subject in subjects.items() if subject in erased}
