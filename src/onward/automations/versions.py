"""Published versions (R11): immutable, numbered, deduplicated by content digest.

Publishing content that is already published returns that version (a no-op); changed content
becomes version N+1. Runs record the version they started on and finish on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from onward.automations.document import AutomationDoc
from onward.automations.validate import validate
from onward.db import Pool
from onward.db.sql import Queries
from onward.errors import UnknownAutomation
from onward.kinds import Registry
from onward.kinds import registry as default_registry

Q = Queries(__package__, "versions.sql")


@dataclass(frozen=True)
class Published:
    automation_id: str
    version: int
    digest: str
    created: bool  # False: identical content was already published as this version


async def publish(
    pool: Pool,
    org_id: str,
    data: dict[str, Any] | AutomationDoc,
    *,
    registry: Registry | None = None,
) -> Published:
    """Validate and store a version. Raises ``InvalidAutomation`` and stores nothing if invalid."""
    doc = validate(data, registry or default_registry)
    digest = doc.digest()
    args = {"org_id": org_id, "automation_id": doc.id, "digest": digest}
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(Q.ensure_org, args)
        cur = await conn.execute(Q.lock_automation, args)
        latest = (await cur.fetchone())["latest_version"]  # type: ignore[index]
        cur = await conn.execute(Q.find_by_digest, args)
        same = await cur.fetchone()
        if same is not None:
            return Published(doc.id, same["version"], digest, created=False)
        version = latest + 1
        first = doc.step(doc.start_step)
        spec = (registry or default_registry).get(first.kind)
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
    return Published(doc.id, version, digest, created=True)


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
