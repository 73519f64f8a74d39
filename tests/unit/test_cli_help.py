"""Every command's help speaks the user's language: no internal row numbers of the design
("R17", "B3"), and one example to copy."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer

from onward.cli import app

ROW_NUMBER = re.compile(r"\b[RB]\d+\b")


def commands(command: Any, path: tuple[str, ...] = ("onward",)) -> Iterator[tuple[str, Any]]:
    """Every command and group of the CLI, depth first, with its full name."""
    yield " ".join(path), command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from commands(sub, (*path, name))


def test_every_command_has_an_example_and_no_row_numbers() -> None:
    problems = []
    walked = list(commands(typer.main.get_command(app)))
    assert len(walked) > 70  # the walk reached the groups' commands too
    for name, command in walked:
        text = command.help or ""
        if found := ROW_NUMBER.findall(text):
            problems.append(f"{name}: internal row numbers {found} in its help")
        example = re.search(r"Example:\n\s+(onward\b.*)", text)
        if example is None:
            problems.append(f"{name}: no 'Example:' line followed by an onward command line")
        elif not command.hidden and not set(name.split()) <= set(example.group(1).split()):
            problems.append(f"{name}: its example {example.group(1)!r} does not run it")
    assert problems == [], "\n".join(problems)


def test_every_command_help_renders(capsys: Any) -> None:
    """``--help`` of each command prints its example (exit 0), as a user sees it."""
    from typer.testing import CliRunner

    runner = CliRunner()
    for name, command in commands(typer.main.get_command(app)):
        if command.hidden:
            continue
        result = runner.invoke(app, [*name.split(" ")[1:], "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "Example:" in result.output, name
        assert not ROW_NUMBER.search(result.output), name
