"""The automation document: what people draw, as data (YAML or JSON).

A document has an ``id``, optional ``budget``, an optional ``start`` (default: the first step),
and a list of ``steps``. Each step has a stable ``id`` (kept across edits, so runs can be
migrated between versions), a ``kind`` from the registry, an optional static ``next``, and the
kind's parameters under ``with``::

    id: welcome
    budget: {max_steps: 50, max_age: 7d}
    steps:
      - id: greet
        kind: set
        with: {values: {greeting: "'hello ' + input.name"}}
        next: pause
      - id: pause
        kind: wait_for
        with: {duration: 2s}
        next: check
      - id: check
        kind: branch
        with:
          cases: [{when: "vars.greeting != ''", next: done}]
          default: greet
      - id: done
        kind: set
        with: {values: {finished: "true"}}
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from onward.durations import parse_duration
from onward.errors import InvalidAutomation, InvalidInput
from onward.inputs import MAX_DEPTH, check_storable

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"


class RetryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_attempts: int = Field(default=5, ge=1, le=100)
    base: float = Field(default=1.0, gt=0, description="seconds; first backoff ceiling")
    cap: float = Field(default=300.0, gt=0, description="seconds; largest backoff ceiling")


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_steps: int = Field(default=1000, ge=1, le=1_000_000)
    max_age: str | float = "30d"

    @field_validator("max_age")
    @classmethod
    def _duration(cls, v: str | float) -> str | float:
        parse_duration(v)
        return v

    @property
    def max_age_seconds(self) -> float:
        return parse_duration(self.max_age)


class StepDef(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    id: str = Field(pattern=ID_PATTERN)
    kind: str
    next: str | None = None
    lane: str | None = None
    params: dict[str, Any] = Field(default_factory=dict, alias="with")
    retry: RetryPolicy | None = None
    timeout: str | float | None = None
    description: str | None = None


class ScheduleDef(BaseModel):
    """A schedule that starts runs (``onward.schedules``): a calendar ``rule`` read on the wall
    clock of ``zone``, optionally bounded by ``start``/``end`` (a date-time without an offset
    is local to ``zone``), with a deterministic ``jitter`` (a duration) added to when each
    firing happens, never to its identity."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=ID_PATTERN)
    rule: str = Field(min_length=1, max_length=2000, description="e.g. '09:00 on weekdays'")
    zone: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="an IANA zone (Europe/Berlin); default: the automation's timezone",
    )
    start: datetime | None = None
    end: datetime | None = None
    jitter: str | float = 0.0
    overlap: Literal["skip", "allow", "buffer_one"] = "skip"
    catch_up: Literal["skip", "latest", "all"] = "latest"
    input: dict[str, Any] | None = None


class AutomationDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=ID_PATTERN)
    name: str | None = None
    description: str | None = None
    start: str | None = None
    #: the IANA zone of calendar waits that name none of their own (R6)
    timezone: str | None = None
    budget: Budget = Field(default_factory=Budget)
    steps: list[StepDef] = Field(min_length=1)
    schedules: list[ScheduleDef] | None = Field(default=None, max_length=100)

    @property
    def start_step(self) -> str:
        return self.start or self.steps[0].id

    def step(self, step_id: str) -> StepDef:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    def canonical(self) -> dict[str, Any]:
        """The stored form: aliases applied, defaults filled, so equal content digests equal."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def digest(self) -> str:
        raw = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(raw.encode()).hexdigest()


MAX_DOCUMENT_BYTES = 1024 * 1024
"""The largest automation document once expanded (YAML aliases repeat a node each time they
are used: a 571-byte request could otherwise become a 15.8 MB automation)."""


def check_document(data: Any, source: str) -> None:
    """Refuse, before anything else reads it, a loaded document nested deeper than
    ``inputs.MAX_DEPTH``, larger than ``MAX_DOCUMENT_BYTES`` once its aliases are expanded, or
    holding text PostgreSQL cannot store (``\\u0000``, a lone surrogate). Numbers are left to
    validation (a ``.inf`` duration is a problem of its step; elsewhere it is stored as null)."""
    try:
        check_storable(data, source, max_bytes=MAX_DOCUMENT_BYTES, loose=True)
    except InvalidInput as exc:
        raise InvalidAutomation([str(exc)]) from None


def parse_text(text: str | bytes, *, source: str = "<document>") -> dict[str, Any]:
    """YAML (a superset of JSON) text to a mapping, with a clear error if it is neither, if it
    is not UTF-8, or if it is nested too deep or too large once expanded."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidAutomation(
                [f"{source}: not UTF-8 text (invalid byte at offset {exc.start})"]
            ) from None
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise InvalidAutomation([f"{source}: nested deeper than {MAX_DEPTH} levels"]) from None
    except (yaml.YAMLError, ValueError, TypeError) as exc:  # ValueError: a date, a long int
        one_line = " ".join(str(exc).split())
        raise InvalidAutomation([f"{source}: not valid YAML/JSON: {one_line}"]) from None
    if not isinstance(data, dict):
        raise InvalidAutomation([f"{source}: the document must be a mapping with id and steps"])
    check_document(data, source)
    return data


def load_file(path: str | Path) -> dict[str, Any]:
    """Read and parse one document file; ``InvalidAutomation`` (one line a problem) for a
    file that cannot be read, is not UTF-8, is not YAML/JSON, or is too deep or too large."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InvalidAutomation([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    return parse_text(raw, source=str(p))


def parse_model(data: dict[str, Any]) -> AutomationDoc:
    """Structural validation only (shapes and types); see ``validate`` for the graph checks."""
    check_document(data, "document")
    try:
        return AutomationDoc.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "document"
            problems.append(f"{where}: {err['msg']}")
        raise InvalidAutomation(problems) from None
