"""Automation documents (B1): every invalid document is refused with a clear list of *all* its
problems, and the Python builder produces the same canonical document as the equivalent YAML.

Pure logic: no database. Validation runs against the default registry (the built-in kinds
``set``, ``branch``, ``goto``, ``wait_for``) plus a private registry where a test needs its own.
"""

from __future__ import annotations

from typing import Any

import pytest

import onward  # noqa: F401  (imports the engine, which registers the built-in kinds)
from onward import Automation, InvalidAutomation
from onward.automations import parse_text
from onward.automations.document import AutomationDoc, parse_model
from onward.automations.validate import validate
from onward.kinds import Registry, StepContext, step_kind
from onward.kinds import registry as default_registry


def problems_of(data: Any, registry: Registry = default_registry) -> list[str]:
    with pytest.raises(InvalidAutomation) as info:
        validate(data, registry)
    problems = info.value.problems
    assert problems, "InvalidAutomation must list at least one problem"
    # the message carries every problem too, so a log line or an API error shows them all
    for p in problems:
        assert p in str(info.value)
    return problems


def one_problem(data: Any, *needles: str) -> str:
    problems = problems_of(data)
    assert len(problems) == 1, problems
    for needle in needles:
        assert needle in problems[0], (needle, problems[0])
    return problems[0]


def doc(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": "flow", "steps": list(steps), **extra}


SET_X = {"values": {"x": "1"}}


# -- one problem at a time -------------------------------------------------------------------
def test_a_valid_document_passes() -> None:
    parsed = validate(
        doc(
            {"id": "a", "kind": "set", "with": SET_X, "next": "b"},
            {"id": "b", "kind": "wait_for", "with": {"duration": "2s"}, "next": "c"},
            {
                "id": "c",
                "kind": "branch",
                "with": {"cases": [{"when": "vars.x == 1", "next": "d"}], "default": "a"},
            },
            {"id": "d", "kind": "goto", "with": {"target": "e"}},
            {"id": "e", "kind": "set", "with": SET_X},
        ),
        default_registry,
    )
    assert isinstance(parsed, AutomationDoc)
    assert parsed.start_step == "a"


def test_unknown_step_kind_names_the_step_the_kind_and_the_known_kinds() -> None:
    p = one_problem(doc({"id": "a", "kind": "emial.send"}), "step a", "'emial.send'", "unknown")
    assert "wait_for" in p  # the known kinds are listed to help spot the typo


def test_dangling_static_next() -> None:
    one_problem(
        doc({"id": "a", "kind": "set", "with": SET_X, "next": "nowhere"}),
        "step a",
        "'nowhere'",
    )


def test_dangling_branch_case_target() -> None:
    one_problem(
        doc(
            {
                "id": "a",
                "kind": "branch",
                "with": {"cases": [{"when": "true", "next": "ghost"}], "default": "b"},
            },
            {"id": "b", "kind": "set", "with": SET_X},
        ),
        "step a",
        "'ghost'",
    )


def test_dangling_branch_default() -> None:
    one_problem(
        doc(
            {
                "id": "a",
                "kind": "branch",
                "with": {"cases": [{"when": "true", "next": "b"}], "default": "ghost"},
            },
            {"id": "b", "kind": "set", "with": SET_X},
        ),
        "step a",
        "'ghost'",
    )


def test_dangling_goto_target() -> None:
    one_problem(doc({"id": "a", "kind": "goto", "with": {"target": "ghost"}}), "step a", "'ghost'")


def test_start_that_is_not_a_step() -> None:
    one_problem(doc({"id": "a", "kind": "set", "with": SET_X}, start="ghost"), "start", "'ghost'")


def test_duplicate_step_id() -> None:
    one_problem(
        doc(
            {"id": "a", "kind": "set", "with": SET_X, "next": "a"},
            {"id": "a", "kind": "set", "with": SET_X},
        ),
        "duplicate",
        "'a'",
    )


def test_unreachable_step() -> None:
    one_problem(
        doc(
            {"id": "a", "kind": "set", "with": SET_X},  # no next: the run ends here
            {"id": "island", "kind": "set", "with": SET_X},
        ),
        "island",
        "unreachable",
    )


def test_bad_cel_syntax() -> None:
    one_problem(
        doc({"id": "a", "kind": "set", "with": {"values": {"x": "1 +"}}}),
        "step a",
        "'1 +'",
        "CEL",
    )


def test_bad_cel_syntax_in_a_branch_case() -> None:
    one_problem(
        doc(
            {"id": "a", "kind": "branch", "with": {"cases": [{"when": "vars.x ==", "next": "b"}]}},
            {"id": "b", "kind": "set", "with": SET_X},
        ),
        "step a",
        "'vars.x =='",
    )


def test_cel_with_an_unknown_root_variable() -> None:
    p = one_problem(
        doc({"id": "a", "kind": "set", "with": {"values": {"x": "contact.name == 'Maya'"}}}),
        "step a",
        "contact",
    )
    assert "input" in p and "vars" in p and "steps" in p  # says what may be used instead


def test_wait_for_without_duration() -> None:
    one_problem(doc({"id": "a", "kind": "wait_for"}), "step a", "duration", "required")


def test_wait_for_with_a_bad_duration() -> None:
    one_problem(
        doc({"id": "a", "kind": "wait_for", "with": {"duration": "5 parsecs"}}),
        "step a",
        "5 parsecs",
    )


@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf", "-5"])
def test_wait_for_with_a_non_finite_or_negative_duration(value: str) -> None:
    # YAML numbers that are not durations: published, they would be stored as null (JSON has
    # no Infinity/NaN) and the step could never run
    data = parse_text(f"id: flow\nsteps: [{{id: a, kind: wait_for, with: {{duration: {value}}}}}]")
    one_problem(data, "step a", "duration")


@pytest.mark.parametrize("value", [".inf", ".nan"])
def test_budget_with_a_non_finite_max_age(value: str) -> None:
    data = parse_text(
        f"id: flow\nbudget: {{max_age: {value}}}\nsteps: [{{id: a, kind: set, with: {{values: {{x: '1'}}}}}}]"
    )
    one_problem(data, "max_age")


def test_unknown_parameter_of_a_kind() -> None:
    one_problem(
        doc({"id": "a", "kind": "wait_for", "with": {"duration": "1s", "until": "09:00"}}),
        "step a",
        "until",
    )


def test_bad_step_timeout_and_lane() -> None:
    problems = problems_of(
        doc({"id": "a", "kind": "set", "with": SET_X, "timeout": "soon", "lane": "turbo"})
    )
    assert len(problems) == 2, problems
    assert any("timeout" in p and "soon" in p for p in problems)
    assert any("lane" in p and "turbo" in p for p in problems)


def test_empty_steps() -> None:
    one_problem(doc(), "steps")


def test_missing_id_and_steps() -> None:
    problems = problems_of({})
    assert any(p.startswith("id") for p in problems), problems
    assert any(p.startswith("steps") for p in problems), problems


def test_bad_step_id() -> None:
    one_problem(doc({"id": "has space", "kind": "set", "with": SET_X}), "steps.0.id")


def test_bad_budget() -> None:
    problems = problems_of(
        doc(
            {"id": "a", "kind": "set", "with": SET_X}, budget={"max_steps": 0, "max_age": "a while"}
        )
    )
    assert any("max_steps" in p for p in problems), problems
    assert any("max_age" in p and "a while" in p for p in problems), problems


@pytest.mark.parametrize("data", [["id", "steps"], "id: flow", 42, None])
def test_a_document_that_is_not_a_mapping(data: Any) -> None:
    problems = problems_of(data)
    assert len(problems) == 1, problems


def test_text_that_is_not_a_mapping() -> None:
    with pytest.raises(InvalidAutomation) as info:
        parse_text("- just\n- a list\n", source="flow.yaml")
    assert info.value.problems == ["flow.yaml: the document must be a mapping with id and steps"]


def test_invalid_yaml_names_the_source_and_the_position() -> None:
    with pytest.raises(InvalidAutomation) as info:
        parse_text("id: flow\nsteps: [ {id: a, kind: set\n", source="flow.yaml")
    (problem,) = info.value.problems
    assert problem.startswith("flow.yaml: not valid YAML/JSON")
    assert "line" in problem


def test_json_text_is_accepted() -> None:
    data = parse_text(
        '{"id": "flow", "steps": [{"id": "a", "kind": "set", "with": {"values": {"x": "1"}}}]}'
    )
    assert validate(data, default_registry).steps[0].id == "a"


# -- many problems at once -------------------------------------------------------------------
def test_every_problem_is_reported_in_one_pass() -> None:
    problems = problems_of(
        doc(
            {"id": "a", "kind": "set", "with": {"values": {"x": "1 +"}}, "next": "b"},
            {"id": "b", "kind": "wait_for", "with": {"duration": "5 parsecs"}, "next": "c"},
            {
                "id": "c",
                "kind": "branch",
                "with": {"cases": [{"when": "person.age > 3", "next": "ghost"}]},
                "next": "d",
            },
            {"id": "d", "kind": "mystery", "next": "e"},
            {"id": "e", "kind": "goto", "with": {"target": "phantom"}},
            {"id": "island", "kind": "set", "with": SET_X},
            {"id": "island", "kind": "set", "with": SET_X},
            {"id": "w", "kind": "wait_for"},
        )
    )
    expected = {
        "bad CEL": lambda p: "step a" in p and "'1 +'" in p,
        "bad duration": lambda p: "step b" in p and "5 parsecs" in p,
        "unknown root": lambda p: "step c" in p and "person" in p,
        "dangling case": lambda p: "step c" in p and "'ghost'" in p,
        "unknown kind": lambda p: "step d" in p and "'mystery'" in p,
        "dangling goto": lambda p: "step e" in p and "'phantom'" in p,
        "duplicate": lambda p: "duplicate" in p and "'island'" in p,
        "unreachable": lambda p: "island" in p and "unreachable" in p,
        "missing duration": lambda p: "step w" in p and "duration" in p,
    }
    missing = [name for name, match in expected.items() if not any(match(p) for p in problems)]
    assert not missing, (missing, problems)


def test_every_structural_problem_is_reported_in_one_pass() -> None:
    problems = problems_of(
        {
            "id": "bad id!",
            "budget": {"max_steps": -1},
            "steps": [{"id": "a"}, {"kind": "set"}, {"id": "b", "kind": "set", "colour": "red"}],
            "owner": "sam",
        }
    )
    assert len(problems) >= 5, problems
    joined = "\n".join(problems)
    for needle in ("id", "max_steps", "steps.0.kind", "steps.1.id", "steps.2.colour", "owner"):
        assert needle in joined, (needle, problems)


def test_problems_of_a_duplicated_step_are_not_hidden_by_its_twin() -> None:
    # Both steps named "e" are in the document; the first one's dangling goto must be reported
    # alongside the duplicate id, not silently dropped because the second "e" has no successor.
    problems = problems_of(
        doc(
            {"id": "a", "kind": "set", "with": SET_X, "next": "e"},
            {"id": "e", "kind": "goto", "with": {"target": "phantom"}},
            {"id": "e", "kind": "set", "with": SET_X},
        )
    )
    assert any("duplicate" in p and "'e'" in p for p in problems), problems
    assert any("step e" in p and "'phantom'" in p for p in problems), problems


# -- custom kinds: their own checks and successors take part ---------------------------------
def test_a_custom_registry_knows_only_its_kinds() -> None:
    reg = Registry()

    @step_kind("custom.ping", lane="fast", into=reg)
    async def ping(step: StepContext) -> None:
        return None

    assert validate(doc({"id": "a", "kind": "custom.ping"}), reg).steps[0].kind == "custom.ping"
    assert "custom.ping" not in default_registry
    p = problems_of(doc({"id": "a", "kind": "set", "with": SET_X}), reg)
    assert any("'set'" in x and "custom.ping" in x for x in p), p


# -- the builder -------------------------------------------------------------------------------
FOLLOW_UP_YAML = """
id: follow-up
name: Follow up
budget: {max_steps: 50, max_age: 7d}
steps:
  - id: greet
    kind: set
    with:
      values: {greeting: "'hello ' + input.name"}
    next: pause
  - id: pause
    kind: wait_for
    with: {duration: 2s}
    next: check
  - id: check
    kind: branch
    with:
      cases:
        - {when: "vars.greeting != ''", next: done}
      default: again
  - id: again
    kind: goto
    with: {target: greet}
  - id: done
    kind: set
    lane: io
    with:
      values: {finished: "true"}
"""


def built_follow_up() -> dict[str, Any]:
    return (
        Automation("follow-up", name="Follow up", max_steps=50, max_age="7d")
        .step("greet", "set", values={"greeting": "'hello ' + input.name"})
        .step("pause", "wait_for", duration="2s")
        .branch("check", cases=[("vars.greeting != ''", "done")], default="again")
        .goto("again", "greet")
        .step("done", "set", lane="io", values={"finished": "true"})
        .build()
    )


def test_builder_and_yaml_give_the_same_canonical_document() -> None:
    from_yaml = validate(parse_text(FOLLOW_UP_YAML), default_registry)
    from_code = validate(built_follow_up(), default_registry)
    assert from_code.canonical() == from_yaml.canonical()
    assert from_code.digest() == from_yaml.digest()


def test_digest_ignores_key_order_and_explicit_defaults() -> None:
    base = validate(built_follow_up(), default_registry)
    data = parse_text(FOLLOW_UP_YAML)
    data = {k: data[k] for k in reversed(list(data))}  # other key order
    data["steps"][0] = {"next": "pause", **data["steps"][0]}
    assert validate(data, default_registry).digest() == base.digest()
    # a default written out is the same content as a default left out
    plain = Automation("p").step("a", "set", values={"x": "1"}).build()
    explicit = {**plain, "budget": {"max_steps": 1000, "max_age": "30d"}}
    assert parse_model(plain).digest() == parse_model(explicit).digest()


def test_digest_changes_with_content() -> None:
    base = validate(built_follow_up(), default_registry).digest()
    changed = parse_text(FOLLOW_UP_YAML.replace("duration: 2s", "duration: 3s"))
    assert validate(changed, default_registry).digest() != base


def test_builder_links_steps_in_order_unless_told_otherwise() -> None:
    built = (
        Automation("links")
        .step("a", "set", values={"x": "1"})
        .step("b", "set", next="d", values={"x": "2"})
        .step("c", "set", end=True, values={"x": "3"})
        .step("d", "set", values={"x": "4"}, next="c")
        .build()
    )
    nexts = {s["id"]: s.get("next") for s in built["steps"]}
    assert nexts == {"a": "b", "b": "d", "c": None, "d": "c"}
    assert "budget" not in built and "name" not in built
    validate(built, default_registry)


def test_builder_output_is_validated_like_any_document() -> None:
    bad = Automation("bad").step("a", "set", values={"x": "1 +"}).goto("b", "nowhere").build()
    problems = problems_of(bad)
    assert any("'1 +'" in p for p in problems) and any("'nowhere'" in p for p in problems)


def test_a_document_built_in_python_is_checked_for_what_postgres_cannot_store() -> None:
    doc = AutomationDoc.model_validate(
        {"id": "nul", "steps": [{"id": "a", "kind": "set", "with": {"values": {"x": "'a\x00b'"}}}]}
    )
    problems = problems_of(doc)
    assert any("NUL" in p for p in problems), problems
