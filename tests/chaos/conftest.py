"""Chaos fixtures: the processes a test starts are reaped at teardown and their logs printed
(pytest shows them when the test failed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from onward.testing import Processes


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    with Processes(tmp_path / "logs", log_chars=6000) as group:
        yield group
