"""Contracts between the code and its two design documents, docs/state-machine.md and
docs/crash-points.md: every query they cite exists; the crash-point table equals the
``crash_point("...")`` calls and ``crashpoints.POINTS``; the "History events" table equals the
``history_event_known`` CHECK constraint; the settle table names real policy functions,
transitions and unit tests; and no document cites ``file:line``. No database is needed.

Citation format (the one the documents use and the only one parsed here): a query is a code span
holding its file and its name, `` `leases.sql settle_retry` ``; a shared statement fragment is
`` `fragments.sql make_ready` ``. A code span that mentions a ``.sql`` file holds nothing else.
Each failure says what to add where."""

from __future__ import annotations

import ast
import re
import typing
from collections import Counter
from pathlib import Path

import onward
from onward import crashpoints, policy
from onward.db.sql import fragments, load

SRC = Path(onward.__file__).parent
ROOT = SRC.parent.parent
DOCS = ROOT / "docs"
STATE_MACHINE = DOCS / "state-machine.md"
CRASH_POINTS = DOCS / "crash-points.md"
CITING = (STATE_MACHINE, CRASH_POINTS)
POLICY_TESTS = ROOT / "tests" / "unit" / "test_policy.py"

#: A Markdown code span: a run of backticks, its text, the same run again.
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
#: A code span that mentions a .sql file (not a module such as ``onward.db.sql.load``).
_MENTIONS_SQL = re.compile(r"\w\.sql(?= |$)")
#: The one citation format: ``file.sql`` or ``file.sql query_name`` (a path may lead the file).
_CITATION = re.compile(r"^(?P<file>[\w./-]*\w\.sql)(?: (?P<name>\w+))?$")
#: A line cited by number: ``worker.py:245``, ``effects.py:125-130``, ``sweep.py#L89``.
_FILE_LINE = re.compile(
    r"[\w./-]*\w\.(?:py|sql|md|toml|ya?ml|sh|js|ts|json|cfg|ini|txt|html|css)"
    r"(?::\d+(?:-\d+)?|#L\d+)"
)


# -- reading the documents -------------------------------------------------------------------


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _spans(text: str) -> list[tuple[int, str]]:
    """(line number, content) of every code span; spans that quote backticks are examples."""
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for m in _CODE_SPAN.finditer(line):
            content = m.group(2)
            if len(m.group(1)) > 1 and content.startswith(" ") and content.endswith(" "):
                content = content[1:-1]
            if "`" not in content:
                out.append((lineno, content))
    return out


def _section(doc: Path, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of the same or a higher level."""
    text = doc.read_text(encoding="utf-8")
    m = re.search(rf"^## {re.escape(heading)}[ \t]*$", text, re.MULTILINE)
    assert m is not None, f"{_rel(doc)} has no section '## {heading}': add it back"
    rest = text[m.end() :]
    end = re.search(r"^#{1,2} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def _cells(row: str) -> list[str]:
    """A table row's cells; a ``|`` inside a code span does not split."""
    cells, cell, tick = [], "", False
    for ch in row.strip().strip("|"):
        if ch == "`":
            tick = not tick
        if ch == "|" and not tick:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    cells.append(cell.strip())
    return cells


def _table(section: str) -> list[list[str]]:
    """The rows of the first table of a section, header first, without the ``---`` line."""
    rows: list[list[str]] = []
    for line in section.splitlines():
        if line.startswith("|"):
            if not re.fullmatch(r"\|[\s|:-]+\|?", line.strip()):
                rows.append(_cells(line))
        elif rows:
            break
    return rows


def _first_column_names(doc: Path, heading: str) -> list[str]:
    """The `name` in the first cell of each row of the section's table, in order."""
    rows = _table(_section(doc, heading))
    assert rows, f"{_rel(doc)}, section '{heading}': its table is missing"
    names = []
    for row in rows[1:]:
        m = re.fullmatch(r"`([^`]+)`", row[0])
        assert m is not None, (
            f"{_rel(doc)}, section '{heading}': the first cell of each row must be one `name` "
            f"in backticks, not {row[0]!r}"
        )
        names.append(m.group(1))
    return names


# -- 1. every cited query exists ---------------------------------------------------------------


def _resolve_sql(ref: str) -> tuple[Path | None, str | None]:
    """The .sql file under src/onward a citation names, or why there is none."""
    if "/" in ref:
        found = [p for p in SRC.rglob("*.sql") if p.as_posix().endswith("/" + ref)]
    else:
        found = [p for p in SRC.rglob("*.sql") if p.name == ref]
    if not found:
        return None, f"there is no {ref} under src/onward"
    if len(found) > 1:
        where = ", ".join(_rel(p) for p in sorted(found))
        return None, f"{ref} is ambiguous ({where}): cite it with its folder"
    return found[0], None


def _query_names(sql_file: Path) -> tuple[set[str], str]:
    """The names a file defines, and what kind of name they are."""
    if sql_file == SRC / "db" / "fragments.sql":
        return set(fragments()), "fragment"
    package = ".".join(("onward", *sql_file.parent.relative_to(SRC).parts))
    return set(load(package, sql_file.name)), "query"


def test_every_query_cited_in_the_design_docs_exists() -> None:
    problems = []
    cited = 0
    for doc in CITING:
        for lineno, span in _spans(doc.read_text(encoding="utf-8")):
            if not _MENTIONS_SQL.search(span):
                continue
            where = f"{_rel(doc)} line {lineno}"
            m = _CITATION.fullmatch(span)
            if m is None:
                problems.append(
                    f"{where}: `{span}` is not a citation: write a query as `file.sql name`, one "
                    "per code span, and anything else outside the backticks"
                )
                continue
            sql_file, why = _resolve_sql(m["file"])
            if sql_file is None:
                problems.append(f"{where}: `{span}`: {why}")
                continue
            if m["name"] is None:
                continue
            cited += 1
            if sql_file.parent.name == "migrations":
                problems.append(
                    f"{where}: `{span}`: a migration has no named queries; name the constraint "
                    "or function in its own code span"
                )
                continue
            names, kind = _query_names(sql_file)
            if m["name"] not in names:
                header = "-- fragment:" if kind == "fragment" else "-- name:"
                problems.append(
                    f"{where}: `{span}` is cited, but {_rel(sql_file)} has no {kind} "
                    f"{m['name']!r}: correct the citation, or add `{header} {m['name']}` to "
                    f"{_rel(sql_file)}"
                )
    assert cited > 0, "the design documents cite no query at all: was the citation format changed?"
    assert problems == [], "\n".join(problems)


# -- 2. the crash-point table equals the calls and POINTS --------------------------------------


def _crash_point_calls() -> tuple[dict[str, list[str]], list[str]]:
    """Every ``crash_point("name")`` call in src/onward: name -> the modules calling it."""
    calls: dict[str, list[str]] = {}
    problems = []
    for module in sorted(SRC.rglob("*.py")):
        rel = _rel(module)
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"), filename=rel)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            callee = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if callee != "crash_point":
                continue
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                calls.setdefault(arg.value, []).append(rel)
            else:
                problems.append(
                    f"{rel}: crash_point() is called without a literal name; pass the name as "
                    "a string literal so the table can be checked"
                )
    return calls, problems


def test_the_crash_point_table_equals_the_calls_and_points() -> None:
    calls, problems = _crash_point_calls()
    table = _first_column_names(CRASH_POINTS, "The crash points")
    planned = _first_column_names(CRASH_POINTS, "Planned crash points")
    doc = _rel(CRASH_POINTS)
    points = set(crashpoints.POINTS)
    called = set(calls)
    for name, n in sorted(Counter(table + planned).items()):
        if n > 1:
            problems.append(f"{doc}: `{name}` has {n} rows; keep one")
    for name in sorted(called - set(table)):
        where = ", ".join(calls[name])
        if name in planned:
            problems.append(
                f"`{name}` is called now ({where}): move its row in {doc} from "
                "'Planned crash points' to 'The crash points'"
            )
        else:
            problems.append(
                f"`{name}` is called ({where}) but {doc} does not list it: add a row to "
                "'The crash points' (where, the facts before and after, the row that lets "
                "another process continue, the mechanism)"
            )
    for name in sorted(set(table) - called):
        problems.append(
            f"{doc} lists `{name}` in 'The crash points', but no code calls "
            f"crash_point(\"{name}\"): remove the row, or move it to 'Planned crash points'"
        )
    for name in sorted(points - called - set(planned)):
        problems.append(
            f"src/onward/crashpoints.py POINTS lists `{name}`, which no code calls and {doc} "
            "does not list under 'Planned crash points': call it, add a planned row, or remove "
            "it from POINTS"
        )
    for name in sorted((called | set(planned)) - points):
        problems.append(
            f"`{name}` is missing from POINTS: add it to src/onward/crashpoints.py with a "
            "one-line description of the facts on either side"
        )
    assert problems == [], "\n".join(problems)


# -- 3. the history events table equals the CHECK constraint -----------------------------------


def _balanced(text: str, start: int) -> str:
    """The text of the parenthesis opening at ``start``, without the outer pair."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i]
    raise AssertionError(f"unbalanced parenthesis at offset {start}")


def _history_events() -> tuple[list[str] | None, str]:
    """The values of the latest definition of ``history_event_known`` (``history_log_event_known``
    since 0029) in the migrations, and
    the migration that defines it (None if it was dropped and not added again)."""
    values: list[str] | None = None
    source = "no migration"
    for migration in sorted((SRC / "db" / "migrations").glob("*.sql")):
        text = re.sub(r"--[^\n]*", "", migration.read_text(encoding="utf-8"))
        pattern = (  # renamed history_log_event_known with its table (0029)
            r"(DROP\s+CONSTRAINT\s+(?:IF\s+EXISTS\s+)?)?history(?:_log)?_event_known\b"
            r"(\s*CHECK\s*\()?"
        )
        for m in re.finditer(pattern, text, re.IGNORECASE):
            if m.group(1):
                values, source = None, f"dropped in {migration.name}"
            elif m.group(2):
                body = _balanced(text, m.end() - 1)
                values = [v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", body)]
                source = migration.name
    return values, source


def test_every_history_event_is_described_once() -> None:
    values, source = _history_events()
    assert values, (
        "no CHECK constraint history_event_known on history.event in "
        f"src/onward/db/migrations ({source}): history events must stay a closed list"
    )
    table = _first_column_names(STATE_MACHINE, "History events")
    doc = _rel(STATE_MACHINE)
    problems = []
    for name, n in sorted(Counter(table).items()):
        if n > 1:
            problems.append(
                f"{doc}, 'History events': `{name}` is described {n} times; keep one row"
            )
    for name in [v for v in values if v not in table]:
        problems.append(
            f"history event `{name}` (history_event_known, {source}) is not described: add a row "
            f"to the 'History events' table of {doc} (its meaning, the query that writes it)"
        )
    for name in sorted(set(table) - set(values)):
        problems.append(
            f"{doc}, 'History events' describes `{name}`, which history_event_known ({source}) "
            "does not allow: remove the row, or add the value to the CHECK in a new migration"
        )
    assert problems == [], "\n".join(problems)


# -- 4. no file:line citations -----------------------------------------------------------------


def test_no_document_cites_a_file_and_line() -> None:
    problems = []
    for doc in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        for lineno, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
            for m in _FILE_LINE.finditer(line):
                problems.append(
                    f"{_rel(doc)} line {lineno}: `{m.group(0)}` cites a line number, which goes "
                    "stale with the next edit: cite the module and function, or `file.sql name`"
                )
    assert problems == [], "\n".join(problems)


# -- 5. the settle table names real policy functions, transitions and tests ---------------------


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
    }


def _decisions() -> set[str]:
    """The functions of ``onward.policy`` that answer with a transition."""
    transitions = {cls.__name__ for cls in typing.get_args(policy.Transition)}
    tree = ast.parse(Path(policy.__file__).read_text(encoding="utf-8"))
    out = set()
    for node in tree.body:
        if (
            isinstance(node, ast.FunctionDef)
            and not node.name.startswith("_")
            and node.returns is not None
            and set(re.findall(r"\w+", ast.unparse(node.returns))) & transitions
        ):
            out.add(node.name)
    return out


def test_the_settle_table_names_real_policy_functions_transitions_and_tests() -> None:
    doc = _rel(STATE_MACHINE)
    rows = _table(_section(STATE_MACHINE, "The settle table"))
    assert len(rows) > 1, f"{doc}: the settle table has no rows"
    header = [h.lower() for h in rows[0]]
    for column in ("policy function", "transition", "sql", "unit test"):
        assert column in header, f"{doc}, settle table: add back the column '{column}'"
    col = {name: header.index(name) for name in ("transition", "sql")}
    transitions = {cls.__name__ for cls in typing.get_args(policy.Transition)}
    tests = _defined_tests(POLICY_TESTS)
    problems = []
    cited_functions: set[str] = set()
    for row in rows[1:]:
        label = f"{doc}, settle table row {row[0]}"
        spans = [content for _, content in _spans(" | ".join(row))]
        for span in spans:
            m = re.fullmatch(r"policy\.(\w+)", span)
            if m:
                cited_functions.add(m[1])
                if not hasattr(policy, m[1]):
                    problems.append(
                        f"{label}: `{span}` does not exist in onward.policy: correct the row or "
                        "add it to src/onward/policy.py"
                    )
            if re.fullmatch(r"test_\w+", span) and span not in tests:
                problems.append(
                    f"{label}: `{span}` is not a test of tests/unit/test_policy.py: correct the "
                    "row, or add the test there"
                )
        first = re.match(r"`(\w+)`", row[col["transition"]])
        if first is None or first[1] not in transitions:
            problems.append(
                f"{label}: the transition column must start with one of "
                f"{sorted(transitions)} in backticks, not {row[col['transition']]!r}"
            )
        if not re.search(r"`leases\.sql \w+`", row[col["sql"]]):
            problems.append(
                f"{label}: name the query that writes it as `leases.sql name` in the SQL column"
            )
    for name in sorted(_decisions() - cited_functions):
        problems.append(
            f"onward.policy.{name} answers with a transition but the settle table of {doc} has no "
            f"row for it: add one citing `policy.{name}`"
        )
    assert problems == [], "\n".join(problems)
