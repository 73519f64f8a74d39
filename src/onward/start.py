"""Starting runs, once per start key (R1), with their first wake in the outbox (R2).

The start key comes from the provider's event id when there is one
(``<automation_id>:<event_id>``); otherwise from a hash of the payload, which is weaker: two
genuinely separate submissions with identical content collapse into one run. A caller may also
pass its own key. A second start with the same key is acknowledged as a duplicate, not an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import orjson
from psycopg.types.json import Jsonb

from onward import audit, erasure, ids, metrics, tracing
from onward.automations.versions import VersionCache
from onward.batching import Coalescer, outcome
from onward.crashpoints import crash_point
from onward.db import Conn, Pool, is_connection_error
from onward.db.sql import Queries
from onward.errors import ContactErased, InvalidInput, PayloadTooLarge, UnknownAutomation
from onward.inputs import check_storable, check_text
from onward.kinds import Registry

Q = Queries(__package__, "start.sql")

#: The longest ids a start takes, in characters; the API and the CLI refuse longer ones too.
MAX_EVENT_ID = 256
MAX_KEY = 512
MAX_CONTACT_ID = 320
MAX_VERSION = 2**31 - 1


@dataclass(frozen=True)
class Started:
    run_id: str
    created: bool  # False: a duplicate delivery of a start that already made this run
    start_key: str


def start_key_for(
    automation_id: str, payload: Any, event_id: str | None, key: str | None
) -> tuple[str, str]:
    if key:
        return key, "caller"
    if event_id:
        return ids.event_start_key(automation_id, event_id), "event"
    return ids.payload_start_key(automation_id, payload), "payload_hash"


def _checked(
    automation_id: str,
    payload: Any,
    event_id: str | None,
    key: str | None,
    version: int | None,
    contact_id: str | None,
    max_payload_bytes: int,
) -> str:
    """Refuse, before anything is written, what PostgreSQL would refuse mid-statement (NUL, lone
    surrogates, NaN, too deep) and what is over a limit; answer the payload as JSON text."""
    limits = (
        ("automation id", automation_id, None),
        ("event id", event_id, MAX_EVENT_ID),
        ("key", key, MAX_KEY),
        ("contact id", contact_id, MAX_CONTACT_ID),
    )
    for what, text, longest in limits:
        if text is None:
            continue
        if not isinstance(text, str):
            raise InvalidInput(f"{what}: must be text, not {type(text).__name__}")
        check_text(text, what)
        if longest is not None and len(text) > longest:
            raise InvalidInput(f"{what}: at most {longest} characters ({len(text)} given)")
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION
    ):
        raise InvalidInput(f"version: a whole number from 1 to {MAX_VERSION} ({version!r} given)")
    if not isinstance(payload, dict):
        raise InvalidInput(f"the payload must be a JSON object, not {type(payload).__name__}")
    # max_bytes: a structure that shares one sub-list many times stops here, early, instead of
    # being expanded by the encoding below
    check_storable(payload, "the payload", max_bytes=4 * max_payload_bytes)
    raw = _json_bytes(payload)
    if len(raw) > max_payload_bytes:
        raise PayloadTooLarge(len(raw), max_payload_bytes)
    return raw.decode()


def _json_bytes(value: Any) -> bytes:
    """A checked value (``check_storable``: JSON's types only) as JSON in UTF-8, as PostgreSQL
    will hold it: orjson, a tenth of ``json``'s time (two ``json.dumps`` a start were about 15 %
    of the starting process's CPU, 2026-12-07); ``json`` for the little orjson refuses (an
    integer beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, ensure_ascii=False).encode()


def start_key_kind(event_id: str | None, key: str | None) -> str:
    """The kind of start key ``start_key_for`` makes from these (without hashing a payload)."""
    return "caller" if key else "event" if event_id else "payload_hash"


@dataclass(frozen=True)
class Prepared:
    """One start, checked and keyed, not yet written (``prepare``)."""

    automation_id: str
    payload: dict[str, Any]
    text: str  # the payload as the JSON _checked measured
    start_key: str
    start_key_kind: str
    version: int | None
    contact_id: str | None
    traceparent: str | None  # a valid W3C trace context, or None


def prepare(
    automation_id: str,
    payload: dict[str, Any],
    *,
    event_id: str | None = None,
    key: str | None = None,
    version: int | None = None,
    contact_id: str | None = None,
    max_payload_bytes: int = 256 * 1024,
    traceparent: str | None = None,
) -> Prepared:
    """Check a start and make its start key, before anything is written: what is refused here
    (``InvalidInput``, ``PayloadTooLarge``) is refused alone, whoever else is starting."""
    text = _checked(automation_id, payload, event_id, key, version, contact_id, max_payload_bytes)
    start_key, kind = start_key_for(automation_id, payload, event_id, key)
    return Prepared(
        automation_id,
        payload,
        text,
        start_key,
        kind,
        version,
        contact_id,
        tracing.valid_traceparent(traceparent),
    )


async def start_run(
    pool: Pool,
    org_id: str,
    automation_id: str,
    payload: dict[str, Any],
    *,
    event_id: str | None = None,
    key: str | None = None,
    version: int | None = None,
    contact_id: str | None = None,
    max_payload_bytes: int = 256 * 1024,
    registry: Registry | None = None,
    versions: VersionCache | None = None,
    traceparent: str | None = None,
) -> Started:
    """Start a run of the latest (or given) version: one statement, one commit, for a new run
    and for a duplicate whose run committed before (one more statement for a duplicate that
    raced its original). ``registry`` and ``versions`` are accepted for callers
    that pass them; the version's first step was resolved when it was published.
    ``traceparent``: the W3C trace context of the request that asked for the run, kept so its
    steps continue that trace (``onward.tracing``; an invalid one is ignored)."""
    p = prepare(
        automation_id,
        payload,
        event_id=event_id,
        key=key,
        version=version,
        contact_id=contact_id,
        max_payload_bytes=max_payload_bytes,
        traceparent=traceparent,
    )
    return await write_one(pool, org_id, p)


async def write_one(pool: Pool, org_id: str, p: Prepared) -> Started:
    """Write one prepared start (``start.sql start_run``); ``start_run`` is ``prepare`` and
    this."""
    args = {
        "org_id": org_id,
        "run_id": ids.new_run_id(),
        "automation_id": p.automation_id,
        "version": p.version,
        "start_key": p.start_key,
        "start_key_kind": p.start_key_kind,
        "input": Jsonb(p.payload, dumps=lambda _: p.text),  # the JSON _checked measured
        "contact_id": p.contact_id,
        "traceparent": p.traceparent,
    }
    async with pool.connection() as conn:
        if p.contact_id is None:
            row = await (await conn.execute(Q.start_run, args)).fetchone()
        else:  # refused if the contact was erased; ordered with an erasure by its lock
            async with conn.transaction():
                await erasure.check_start(conn, org_id, p.contact_id)
                row = await (await conn.execute(Q.start_run, args)).fetchone()
        if row is not None and row["created"]:
            crash_point("start.after_commit")
            metrics.run_started(True)
            return Started(row["run_id"], True, p.start_key)
        if row is not None:  # a duplicate, recorded by the same statement
            metrics.run_started(False)
            return Started(row["run_id"], False, p.start_key)
        # Conflict with a run committed while the statement ran (a fresh statement sees it), or
        # no such automation or version.
        cur = await conn.execute(Q.find_duplicate, {"org_id": org_id, "start_key": p.start_key})
        dup = await cur.fetchone()
    if dup is None:
        raise _unknown(org_id, p)
    metrics.run_started(False)
    return Started(dup["run_id"], False, p.start_key)


def _unknown(org_id: str, p: Prepared) -> UnknownAutomation:
    what = f"version {p.version} of " if p.version else ""
    return UnknownAutomation(f"no published {what}automation {p.automation_id!r} in {org_id!r}")


# -- batches ---------------------------------------------------------------------------------

#: The most starts in one batch (``start_many``, ``POST /v1/runs:batch``, ``onward start-many``).
MAX_BATCH = 1000
#: The most bytes a batch's payloads may hold together (each is also held to the payload limit).
MAX_BATCH_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Start:
    """One start of a batch: the arguments ``start_run`` takes for one run."""

    automation_id: str
    payload: dict[str, Any] = field(default_factory=dict)
    event_id: str | None = None
    key: str | None = None
    version: int | None = None
    contact_id: str | None = None


_START_FIELDS = frozenset(f.name for f in fields(Start))


def _as_start(item: Start | Mapping[str, Any], i: int) -> Start:
    if isinstance(item, Start):
        return item
    if not isinstance(item, Mapping):
        raise InvalidInput(
            f"starts[{i}]: a start is a Start or a mapping, not {type(item).__name__}"
        )
    unknown = sorted(str(k) for k in item if k not in _START_FIELDS)
    if unknown:
        raise InvalidInput(f"starts[{i}]: unknown field(s) {', '.join(unknown)}")
    if "automation_id" not in item:
        raise InvalidInput(f"starts[{i}]: automation_id is required")
    return Start(**item)


def _item_error(i: int, exc: Exception) -> InvalidInput:
    return InvalidInput(f"starts[{i}]: {exc}")


def _items_json(prepared: Sequence[Prepared]) -> str:
    """``start.sql start_many``'s items: one JSON array, each start with its index, a new run
    id, its key and its payload as ``prepare`` measured it (not encoded again)."""
    items = []
    for i, p in enumerate(prepared):
        head = _json_bytes(
            {
                "idx": i,
                "run_id": ids.new_run_id(),
                "automation_id": p.automation_id,
                "version": p.version,
                "start_key": p.start_key,
                "start_key_kind": p.start_key_kind,
                "contact_id": p.contact_id,
                "traceparent": p.traceparent,
            }
        )
        items.append(f'{head[:-1].decode()}, "input": {p.text}}}')
    return "[" + ",".join(items) + "]"


async def _answers(
    conn: Conn, org_id: str, rows: Sequence[Any], keys: Sequence[str]
) -> list[Started | None]:
    """Each start's answer from ``start.sql start_many``'s rows (``keys``: the start keys, in
    its items' order). A start whose key a transaction committed after the statement's snapshot
    began (no run in its row) is found by one more read (``start.sql find_duplicates``); None:
    its run is gone again."""
    answers: list[Started | None] = [None] * len(keys)
    leftover: list[int] = []
    for row in rows:
        i = row["idx"]
        if row["run_id"] is None:
            leftover.append(i)
        else:
            answers[i] = Started(row["run_id"], row["created"], keys[i])
    if leftover:
        wanted = [keys[i] for i in leftover]
        cur = await conn.execute(Q.find_duplicates, {"org_id": org_id, "start_keys": wanted})
        found = {row["start_key"]: row["run_id"] for row in await cur.fetchall()}
        for i in leftover:
            if keys[i] in found:
                answers[i] = Started(found[keys[i]], False, keys[i])
    return answers


async def start_many(
    pool: Pool,
    org_id: str,
    starts: Sequence[Start | Mapping[str, Any]],
    *,
    max_payload_bytes: int = 256 * 1024,
    traceparent: str | None = None,
) -> list[Started]:
    """Start up to ``MAX_BATCH`` runs in one statement and one commit (``start.sql
    start_many``), answering each start in the order given.

    Each start is ``start_run``'s: its own start key (``start_key_for``) and answer; a start
    whose key has a run already -- before the batch, or from an earlier start of the same
    batch -- answers that run, ``created`` False (``start_duplicate`` in its history). The
    batch is whole or nothing: every start is checked first, and a bad one (``InvalidInput``
    naming its index: ``starts[3]: ...``), one naming no published automation or version
    (``UnknownAutomation``, unless its key has a run already) or an erased contact
    (``ContactErased``) refuses the batch with nothing written. ``traceparent`` applies to
    every run of the batch. A start whose key a concurrent transaction committed after the
    statement began is answered by one more read (``start.sql find_duplicates``)."""
    if not isinstance(starts, Sequence) or isinstance(starts, (str, bytes)):
        raise InvalidInput("starts: a list of starts")
    if not 1 <= len(starts) <= MAX_BATCH:
        raise InvalidInput(f"starts: 1 to {MAX_BATCH} starts in a batch ({len(starts)} given)")
    prepared: list[Prepared] = []
    contacts: dict[str, int] = {}  # contact id -> the first start naming it
    total = 0
    for i, raw in enumerate(starts):
        try:
            s = _as_start(raw, i)
            p = prepare(
                s.automation_id,
                s.payload,
                event_id=s.event_id,
                key=s.key,
                version=s.version,
                contact_id=s.contact_id,
                max_payload_bytes=max_payload_bytes,
            )
        except (InvalidInput, PayloadTooLarge, TypeError) as exc:
            raise _item_error(i, exc) from None
        total += len(p.text)
        if total > MAX_BATCH_BYTES:
            raise InvalidInput(f"starts: the payloads hold more than {MAX_BATCH_BYTES} bytes")
        prepared.append(p)
        if s.contact_id is not None:
            contacts.setdefault(s.contact_id, i)
    keys = [p.start_key for p in prepared]
    args = {
        "org_id": org_id,
        "items": _items_json(prepared),
        "traceparent": tracing.valid_traceparent(traceparent),
    }
    async with pool.connection() as conn:
        if not contacts:
            rows = await (await conn.execute(Q.start_many, args)).fetchall()
        else:  # refused if a contact was erased; ordered with an erasure by its lock
            async with conn.transaction():
                erased = await erasure.check_starts(conn, org_id, contacts)
                if erased:
                    first = min(erased, key=contacts.__getitem__)
                    refused = ContactErased(org_id, first)
                    refused.args = (f"starts[{contacts[first]}]: {refused}",)
                    raise refused
                rows = await (await conn.execute(Q.start_many, args)).fetchall()
        unknown = [row["idx"] for row in rows if row["unknown"]]
        if unknown:
            i = unknown[0]
            s = _as_start(starts[i], i)
            what = f"version {s.version} of " if s.version else ""
            raise UnknownAutomation(
                f"starts[{i}]: no published {what}automation {s.automation_id!r} in {org_id!r}"
                " (nothing was started)"
            )
        crash_point("start.after_commit")
        answers = await _answers(conn, org_id, rows, keys)
    done = [a for a in answers if a is not None]
    if len(done) < len(answers):  # the run was removed between the two statements
        i = answers.index(None)
        raise UnknownAutomation(f"starts[{i}]: the run of start key {keys[i]!r} is gone")
    for a in done:
        metrics.run_started(a.created)
    return done


# -- concurrent starts, written together ------------------------------------------------------

#: The most payload bytes ``StartBatcher`` puts in one statement (at least one start a statement).
BATCHER_MAX_BYTES = 8 * 1024 * 1024


class StartBatcher:
    """The concurrent starts of one organisation through one pool, written together
    (``onward.batching.Coalescer``): while fewer than ``in_flight`` of its statements run, the
    starts waiting are sent at once -- one alone as ``start.sql start_run``, several (up to
    ``MAX_BATCH``) as one ``start.sql start_many`` and one commit (``Engine.start``,
    ``ONWARD_START_BATCHES``).

    Each caller gets the answer ``start_run`` would have given it alone: a start naming no
    published automation, or an erased contact, is refused alone and the others of its
    statement are written (``_write_many``); any other failure of a statement is tried again
    start by start, so an error reaches the start that caused it (a lost connection reaches
    each, and each caller decides, as with ``start_run``). A start is durable when its
    statement commits, as ``start_run``'s: the crash point ``start.after_commit`` is the same.
    """

    def __init__(self, pool: Pool, org_id: str, in_flight: int) -> None:
        self.pool, self.org_id, self.in_flight = pool, org_id, in_flight
        self._coalescer: Coalescer[Prepared, Started] = Coalescer(
            self._write,
            in_flight=in_flight,
            max_items=MAX_BATCH,
            weight=lambda p: len(p.text),
            max_weight=BATCHER_MAX_BYTES,
        )

    async def start(self, p: Prepared) -> Started:
        return await self._coalescer.submit(p)

    async def _write(self, batch: list[Prepared]) -> list[Started | Exception]:
        if len(batch) == 1:
            return [await outcome(write_one(self.pool, self.org_id, batch[0]))]
        try:
            return await self._write_many(batch)
        except Exception as exc:
            if is_connection_error(exc):
                raise
            # one start's fault (or the statement's): each start alone, its own answer
            return [await outcome(write_one(self.pool, self.org_id, p)) for p in batch]

    async def _write_many(self, prepared: list[Prepared]) -> list[Started | Exception]:
        """One ``start.sql start_many`` for these starts, after refusing alone those naming an
        erased contact (their locks held until it commits) -- and again without those naming
        no published automation, if any did (that statement wrote nothing)."""
        org_id = self.org_id
        out: dict[int, Started | Exception] = {}
        todo = list(range(len(prepared)))
        async with self.pool.connection() as conn:
            while todo:
                contacts = {c for i in todo if (c := prepared[i].contact_id) is not None}
                if not contacts:
                    rows = await self._statement(conn, [prepared[i] for i in todo])
                else:  # refused if a contact was erased; ordered with an erasure by its lock
                    async with conn.transaction():
                        erased = await erasure.check_starts(conn, org_id, contacts)
                        for i in todo:
                            if prepared[i].contact_id in erased:
                                out[i] = ContactErased(org_id, prepared[i].contact_id or "")
                        todo = [i for i in todo if i not in out]
                        if not todo:
                            break
                        rows = await self._statement(conn, [prepared[i] for i in todo])
                unknown = [todo[row["idx"]] for row in rows if row["unknown"]]
                if unknown:  # nothing was written: again without them
                    for i in unknown:
                        out[i] = _unknown(org_id, prepared[i])
                    todo = [i for i in todo if i not in out]
                    continue
                crash_point("start.after_commit")
                keys = [prepared[i].start_key for i in todo]
                written = await _answers(conn, org_id, rows, keys)
                for i, key, w in zip(todo, keys, written, strict=True):
                    gone = UnknownAutomation(f"the run of start key {key!r} is gone")
                    out[i] = w if w is not None else gone
                break
        answers = [out[i] for i in range(len(prepared))]
        for a in answers:
            if isinstance(a, Started):
                metrics.run_started(a.created)
        return answers

    async def _statement(self, conn: Conn, prepared: list[Prepared]) -> list[Any]:
        args = {"org_id": self.org_id, "items": _items_json(prepared), "traceparent": None}
        return await (await conn.execute(Q.start_many, args)).fetchall()


@dataclass(frozen=True)
class ForkPlan:
    """Where a fork starts: the run it comes from, the step entry it starts at (same ``seq``,
    its ``iteration``), that step's kind and lane in ``version``, and what the run knew before
    it (``ctx``: variables and step outputs; ``visits``: entries per step id)."""

    from_run_id: str
    automation_id: str
    version: int
    seq: int
    step_id: str
    kind: str
    lane: str
    iteration: int
    ctx: dict[str, Any]
    visits: dict[str, int]


async def fork_run(pool: Pool, org_id: str, plan: ForkPlan, *, by: str) -> Started:
    """Start the fork ``plan`` describes (one statement, one commit; ``start.sql fork_run``):
    a new run linked to the old one (``runs.forked_from``), with copies of the steps before the
    chosen one and ``run_forked`` in both runs' history. Its start key
    (``ids.fork_start_key``) makes a repeat return the first fork (``created`` False)."""
    start_key = ids.fork_start_key(plan.from_run_id, plan.seq, plan.version)
    args = {
        "org_id": org_id,
        "run_id": ids.new_run_id(),
        "from_run_id": plan.from_run_id,
        "automation_id": plan.automation_id,
        "version": plan.version,
        "start_key": start_key,
        "seq": plan.seq,
        "step_id": plan.step_id,
        "kind": plan.kind,
        "lane": plan.lane,
        "iteration": plan.iteration,
        "ctx": Jsonb(plan.ctx),
        "visits": Jsonb(plan.visits),
        "by": by,
    }
    async with pool.connection() as conn:
        async with conn.transaction():  # the fork and its audit row commit together
            row = await (await conn.execute(Q.fork_run, args)).fetchone()
            if row is not None:
                await audit.record(
                    conn,
                    org_id,
                    actor=by,
                    action="fork",
                    target=plan.from_run_id,
                    detail={"run_id": row["run_id"], "step": plan.step_id, "version": plan.version},
                )
        if row is not None:
            metrics.run_started(True)
            return Started(row["run_id"], True, start_key)
        dup = await (
            await conn.execute(Q.find_duplicate, {"org_id": org_id, "start_key": start_key})
        ).fetchone()
    if dup is None:
        raise UnknownAutomation(
            f"no published version {plan.version} of automation {plan.automation_id!r}"
        )
    return Started(dup["run_id"], False, start_key)
