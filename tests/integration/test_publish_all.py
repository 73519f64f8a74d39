"""``publish_all``: many documents in one transaction (all or none, each problem named with its
source), and ``list_automations``."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from onward.automations.versions import list_automations, publish, publish_all
from onward.engine import Engine
from onward.errors import InvalidAutomation


def doc(automation_id: str, value: str = "1", kind: str = "set") -> dict[str, Any]:
    return {
        "id": automation_id,
        "steps": [{"id": "only", "kind": kind, "with": {"values": {"x": value}}}],
    }


def count_versions(sql: psycopg.Connection[dict[str, Any]]) -> int:
    row = sql.execute("SELECT count(*) AS n FROM automation_versions").fetchone()
    assert row is not None
    return int(row["n"])


async def test_publishes_every_document_in_order_and_lists_them(
    engine: Engine, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    await publish(engine.pool, engine.org_id, doc("beta"))
    out = await publish_all(
        engine.pool,
        engine.org_id,
        [("gamma.yaml", doc("gamma")), ("beta.yaml", doc("beta")), ("alpha.json", doc("alpha"))],
    )
    assert [(p.automation_id, p.version, p.created) for p in out] == [
        ("gamma", 1, True),
        ("beta", 1, False),  # identical content: unchanged
        ("alpha", 1, True),
    ]
    listed = await list_automations(engine.pool, engine.org_id)
    assert [(r["automation_id"], r["latest_version"]) for r in listed] == [
        ("alpha", 1),
        ("beta", 1),
        ("gamma", 1),
    ]
    assert set(listed[0]) == {"automation_id", "latest_version", "updated_at"}
    assert await list_automations(engine.pool, "another-org") == []
    assert count_versions(sql) == 3


async def test_one_bad_document_stores_nothing_and_names_its_source(
    engine: Engine, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    with pytest.raises(InvalidAutomation) as caught:
        await publish_all(
            engine.pool,
            engine.org_id,
            [
                ("good.yaml", doc("good")),
                ("welcome.yaml", doc("welcome", kind="crm.tag")),
                ("cel.yaml", doc("cel", value="vars.x +")),
            ],
        )
    problems = caught.value.problems
    assert any(
        p.startswith("welcome.yaml: step only: unknown step kind 'crm.tag'") for p in problems
    ), problems
    assert any(p.startswith("cel.yaml: ") for p in problems), problems
    assert not any(p.startswith("good.yaml") for p in problems), problems
    assert count_versions(sql) == 0
    assert await list_automations(engine.pool, engine.org_id) == []


async def test_two_documents_with_one_id_are_refused(
    engine: Engine, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    with pytest.raises(InvalidAutomation) as caught:
        await publish_all(
            engine.pool, engine.org_id, [("a.yaml", doc("same")), ("b.yaml", doc("same", "2"))]
        )
    assert caught.value.problems == ["b.yaml: automation 'same' is also published by a.yaml"]
    assert count_versions(sql) == 0


async def test_a_single_publish_has_no_prefix(engine: Engine) -> None:
    with pytest.raises(InvalidAutomation) as caught:
        await publish(engine.pool, engine.org_id, doc("x", kind="nope"))
    assert caught.value.problems[0].startswith("step only: unknown step kind 'nope'")
