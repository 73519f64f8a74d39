"""Contracts between the code and itself, kept true by tests (the way procrastinate diffs its
migrated schema against a checked-in one): every named query is used, and only by the module
beside its file; the public error classes are exported; the migrated schema equals
``db/schema.sql``. Each failure says what to add where."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import onward
from onward import errors
from onward.db import schema
from onward.db.sql import load

SRC = Path(onward.__file__).parent
#: The benchmarks replay onward's own statements to measure them: the one declared exception
#: to "a module runs only its own queries".
MEASURING_TOOLS = ("bench/",)


def _sql_files() -> list[Path]:
    return sorted(
        p
        for p in SRC.rglob("*.sql")
        if p.parent.name != "migrations" and p.name not in ("fragments.sql", "schema.sql")
    )


def _package(sql_file: Path) -> str:
    return ".".join(("onward", *sql_file.parent.relative_to(SRC).parts))


def _rel(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def test_every_named_query_is_used_by_the_module_beside_its_file() -> None:
    problems = []
    for sql_file in _sql_files():
        module = sql_file.with_suffix(".py")
        if not module.exists():
            problems.append(
                f"{_rel(sql_file)}: no module {_rel(module)} beside it runs its queries"
            )
            continue
        source = module.read_text(encoding="utf-8")
        for name in load(_package(sql_file), sql_file.name):
            # Q.name, or the name as a string for a module that picks queries by name
            if not re.search(rf"\bQ\.{name}\b|[\"']{name}[\"']", source):
                problems.append(
                    f"{_rel(sql_file)} query {name!r} is not used by {_rel(module)}: "
                    f"use it (as Q.{name}) or delete it"
                )
    assert problems == [], "\n".join(problems)


def test_no_module_runs_another_modules_queries() -> None:
    """A module that needs another's transition calls its function, never its SQL."""
    own = {sql.with_suffix(".py") for sql in _sql_files()}
    problems = []
    for module in sorted(SRC.rglob("*.py")):
        rel = _rel(module)
        if rel.startswith(MEASURING_TOOLS) or rel == "db/sql.py":
            continue
        tree = ast.parse(module.read_text(encoding="utf-8"), filename=rel)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("onward")
            ):
                for alias in node.names:
                    if alias.name == "Q":
                        problems.append(f"{rel}: imports the queries of {node.module}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Queries":
                if module not in own:
                    problems.append(f"{rel}: loads queries of a file that is not beside it")
                else:
                    filename = node.args[1].value if len(node.args) > 1 else None  # type: ignore[attr-defined]
                    if filename != module.with_suffix(".sql").name:
                        problems.append(f"{rel}: loads {filename}, not its own file")
    assert problems == [], "call the owning module's function instead:\n" + "\n".join(problems)


def test_every_public_error_is_exported_from_onward() -> None:
    public = {
        name
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.OnwardError) and not name.startswith("_")
    }
    missing = sorted(public - set(onward.__all__))
    assert missing == [], f"add to onward.__all__ (src/onward/__init__.py): {missing}"
    for name in public:
        assert getattr(onward, name) is getattr(errors, name)


def test_every_public_error_is_drawn_in_the_hierarchy() -> None:
    doc = errors.__doc__ or ""
    public = [
        name
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.OnwardError)
    ]
    missing = [name for name in public if not re.search(rf"\b{name}\b", doc)]
    assert missing == [], f"draw these in the hierarchy of onward/errors.py's docstring: {missing}"


def test_the_migrated_schema_equals_db_schema_sql(db_url: str) -> None:
    expected = (SRC / "db" / "schema.sql").read_text(encoding="utf-8")
    actual = schema.dump(db_url)
    assert actual == expected, (
        "the migrations and src/onward/db/schema.sql disagree: regenerate it with "
        "`python -m onward.db.schema <empty database url> > src/onward/db/schema.sql` "
        "and review the diff"
    )


#: Indexes that do not lead with org_id, on purpose: partial indexes over pending rows only,
#: scanned across organisations by the workers' claim, the sweeper's rescue, the relay and the
#: notification relay; and the rotation order of the fair sweep (organisations is keyed by
#: org_id itself). The README's "Architecture" names the same five.
CROSS_ORG_INDEXES = {
    "steps_claimable",
    "steps_leased",
    "outbox_unsent",
    "notification_deliveries_due",
    "organisations_due",
    "api_keys_by_key_id",  # a presented key names no organisation until it is found
}


def test_every_key_and_index_leads_with_org_id_but_the_declared_ones() -> None:
    text = (SRC / "db" / "schema.sql").read_text(encoding="utf-8")
    keys = re.findall(r"CONSTRAINT (\w+) (?:PRIMARY KEY|UNIQUE) \((\w+)", text)
    indexes = re.findall(r"CREATE (?:UNIQUE )?INDEX (\w+) ON \S+ USING \w+ \((\w+)", text)
    leading_elsewhere = {name for name, first in keys + indexes if first != "org_id"}
    assert leading_elsewhere == CROSS_ORG_INDEXES, (
        "keys and indexes lead with org_id; declare a deliberate exception in "
        "CROSS_ORG_INDEXES and in the README's Architecture section"
    )


def test_no_statement_compares_org_id_with_the_bare_parameter() -> None:
    # `org_id = (SELECT %(org_id)s::text)`: the planner estimates an average organisation, as a
    # generic plan does. With the constant, an organisation the last ANALYZE did not see (a
    # new tenant) reads as one row, every index that leads with org_id ties, and a lookup by
    # key may read all of the organisation's rows (tests/integration/test_batch_plans.py)
    bare = re.compile(r"\borg_id = %\(\w+\)s")
    found = [
        f"{p.relative_to(SRC)}:{n}"
        for p in sorted(SRC.rglob("*.sql"))
        if p.parent.name != "migrations" and p.name not in ("fragments.sql", "schema.sql")
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if bare.search(line)
    ]
    assert found == [], f"compare with (SELECT %(org_id)s::text) in: {found}"
