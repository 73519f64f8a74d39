"""CEL evaluation (``onward.automations.cel``): an expression is handed only the variables it
names, so what it does not read -- a run's other step outputs, however many or however odd --
neither costs nor breaks its evaluation."""

from __future__ import annotations

import pytest

from onward.automations import cel


class Unconvertible:
    """A value the CEL library cannot convert: present only where an expression must not look."""


ENV = {"input": {"a": 2, "items": [1, 2, 3]}, "vars": {"x": 1}, "steps": {"s": Unconvertible()}}


def test_an_expression_reads_only_the_variables_it_names() -> None:
    assert cel.evaluate("input.a * 2", ENV) == 4
    assert cel.evaluate("1", ENV) == 1
    assert cel.evaluate("[1, 2].exists(x, x == vars.x)", ENV) is True  # a macro's own name
    assert cel.evaluate("input.items.map(i, i * 2)", ENV) == [2, 4, 6]


def test_a_variable_it_names_is_still_converted_and_checked() -> None:
    with pytest.raises(cel.CelError, match="size\\(steps\\)"):
        cel.evaluate("size(steps)", ENV)  # names steps: its odd value is converted, and refused
    with pytest.raises(cel.CelError, match="no such field"):
        cel.evaluate("input.zz", ENV)


def test_a_missing_root_reads_as_empty() -> None:
    assert cel.evaluate("size(vars)", {"input": {}}) == 0
