"""Published versions (R11): immutable, numbered, deduplicated by content digest.

Publishing content that is already published returns that version (a no-op); changed content
becomes version N+1. Runs record the version they started on and finish on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from onward import audit, schedules
from onward.automations.document import AutomationDoc
from onward.automations.validate import validate
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import InvalidAutomation, UnknownAutomation
from onward.kinds import Registry
from onward.kinds import registry as default_registry

Q = Queries(__package__, "versions.sql")


@dataclass(frozen=True)
class Published:
    automation_id: str
    version: int
    digest: str
    created: bool  # False: identical content was already published as this version


Document = dict[str, Any] | AutomationDoc


async def publish(
    pool: Pool,
    org_id: str,
    data: Document,
    *,
    registry: Registry | None = None,
    actor: str | None = None,
) -> Published:
    """Validate and store a version. Raises ``InvalidAutomation`` and stores nothing if invalid.
    A new version is audited (``publish``, by ``actor``) in its transaction."""
    return (await _publish_many(pool, org_id, [("", data)], registry, actor))[0]


async def publish_all(
    pool: Pool,
    org_id: str,
    documents: list[tuple[str, Document]],
    *,
    registry: Registry | None = None,
    actor: str | None = None,
) -> list[Published]:
    """Publish several documents in ONE transaction: all of them or none.

    Each entry is ``(source, document)``; ``source`` (a file name, say) prefixes every problem
    of that document, so ``InvalidAutomation`` names where to look: ``welcome.yaml: step tag:
    unknown step kind 'crm.tag'``. Every document is validated before anything is written; two
    documents with the same automation id are refused (which one would be current?). Answers
    in the order given.
    """
    return await _publish_many(pool, org_id, documents, registry, actor)


async def _publish_many(
    pool: Pool,
    org_id: str,
    documents: list[tuple[str, Document]],
    registry: Registry | None,
    actor: str | None = None,
) -> list[Published]:
    kinds = registry or default_registry
    docs: list[AutomationDoc] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for source, data in documents:
        prefix = f"{source}: " if source else ""
        try:
            doc = validate(data, kinds)
        except InvalidAutomation as exc:
            problems.extend(prefix + p for p in exc.problems)
            continue
        if doc.id in seen:
            other = seen[doc.id] or "this batch"
            problems.append(f"{prefix}automation {doc.id!r} is also published by {other}")
        seen.setdefault(doc.id, source)
        docs.append(doc)
    if problems:
        raise InvalidAutomation(problems)
    results: dict[str, Published] = {}
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(Q.ensure_org, {"org_id": org_id})
        # One lock order (by id) for every publisher, so two batches never deadlock.
        for doc in sorted(docs, key=lambda d: d.id):
            results[doc.id] = got = await _store(conn, org_id, doc, kinds)
            if got.created:  # a re-publish of the same content changes nothing
                await audit.record(
                    conn,
                    org_id,
                    actor=audit.actor(actor),
                    action="publish",
                    target=f"{doc.id}:v{got.version}",
                    detail={"digest": got.digest},
                )
    return [results[doc.id] for doc in docs]


async def _store(conn: Conn, org_id: str, doc: AutomationDoc, kinds: Registry) -> Published:
    """Store one validated document inside the caller's transaction."""
    digest = doc.digest()
    args = {"org_id": org_id, "automation_id": doc.id, "digest": digest}
    cur = await conn.execute(Q.lock_automation, args)
    latest = (await cur.fetchone())["latest_version"]  # type: ignore[index]
    cur = await conn.execute(Q.find_by_digest, args)
    same = await cur.fetchone()
    if same is not None:
        return Published(doc.id, same["version"], digest, created=False)
    version = latest + 1
    first = doc.step(doc.start_step)
    spec = kinds.get(first.kind)
    await conn.execute(
        Q.insert_version,
        {
            **args,
            "version": version,
            "document": Jsonb(doc.canonical()),
            "start_step_id": first.id,
            "start_kind": first.kind,
            "start_lane": first.lane or (spec.lane if spec else "io"),
            "max_steps": doc.budget.max_steps,
            "max_age_s": doc.budget.max_age_seconds,
        },
    )
    await schedules.sync(conn, org_id, doc, version)  # its schedule rows, in this transaction
    return Published(doc.id, version, digest, created=True)


async def list_automations(pool: Pool, org_id: str) -> list[dict[str, Any]]:
    """Every automation of an organisation that has a published version, by id:
    ``{"automation_id", "latest_version", "updated_at"}``."""
    async with pool.connection() as conn:
        cur = await conn.execute(Q.list_automations, {"org_id": org_id})
        return list(await cur.fetchall())


async def load_version(
    pool: Pool, org_id: str, automation_id: str, version: int | None = None
) -> tuple[int, AutomationDoc]:
    """A published version (latest when ``version`` is None)."""
    async with pool.connection() as conn:
        if version is None:
            cur = await conn.execute(Q.latest, {"org_id": org_id, "automation_id": automation_id})
        else:
            cur = await conn.execute(
                Q.get_version,
                {"org_id": org_id, "automation_id": automation_id, "version": version},
            )
        row = await cur.fetchone()
    if row is None:
        what = f"version {version} of " if version else ""
        raise UnknownAutomation(f"no published {what}automation {automation_id!r} in {org_id!r}")
    return row["version"], AutomationDoc.model_validate(row["document"])


class VersionCache:
    """Versions are immutable, so a worker caches each one forever after its first load."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._docs: dict[tuple[str, str, int], AutomationDoc] = {}

    async def get(self, org_id: str, automation_id: str, version: int) -> AutomationDoc:
        key = (org_id, automation_id, version)
        doc = self._docs.get(key)
        if doc is None:
            _, doc = await load_version(self._pool, org_id, automation_id, version)
            self._docs[key] = doc
        return doc
