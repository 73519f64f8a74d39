"""Request and response bodies of the HTTP API, and the ``--json`` output of the CLI.

The CLI prints these same models (``model_dump(mode="json")``), so a script reading
``onward show RUN --json`` sees exactly what ``GET /v1/runs/{run_id}`` answers: stable keys,
datetimes as ISO 8601 strings, JSON documents (input, context, outputs) as they are stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# -- errors --------------------------------------------------------------------------------


class ErrorBody(BaseModel):
    """Every error answer: a one-line ``detail`` and a machine-readable ``error`` name."""

    error: str = Field(description="what went wrong, e.g. unknown_run, payload_too_large")
    detail: str


class ProblemsBody(ErrorBody):
    """An invalid automation: every problem found, so it can be fixed in one pass."""

    problems: list[str]


# -- automations ---------------------------------------------------------------------------


class PublishAnswer(BaseModel):
    automation_id: str
    version: int
    digest: str = Field(description="sha256 of the canonical document")
    created: bool = Field(description="false: identical content was already this version")


class AutomationSummary(BaseModel):
    automation_id: str
    latest_version: int
    updated_at: datetime


# -- starting runs -------------------------------------------------------------------------


class StartRequest(BaseModel):
    """Start a run with explicit fields (``POST /v1/runs``)."""

    model_config = ConfigDict(extra="forbid")
    automation_id: str
    input: dict[str, Any] = Field(default_factory=dict, description="the run's input")
    event_id: str | None = Field(
        default=None,
        max_length=256,
        description="the provider's event id: the start key becomes <automation_id>:<event_id>",
    )
    key: str | None = Field(
        default=None, max_length=512, description="your own start key (wins over event_id)"
    )
    version: int | None = Field(default=None, ge=1, description="default: the latest version")
    contact_id: str | None = None


class StartAnswer(BaseModel):
    run_id: str
    created: bool = Field(description="true: this request started the run")
    duplicate: bool = Field(description="true: an earlier delivery already started this run")
    start_key: str
    start_key_kind: str = Field(
        description="event | payload_hash (weaker: identical payloads collapse) | caller"
    )


# -- runs ----------------------------------------------------------------------------------


class RunSummary(BaseModel):
    run_id: str
    automation_id: str
    version: int
    status: str
    status_reason: str | None = None
    steps_executed: int
    created_at: datetime
    finished_at: datetime | None = None


class RunDetail(RunSummary):
    start_key: str
    start_key_kind: str
    input: Any = None
    ctx: Any = None
    current_seq: int
    max_steps: int
    deadline_at: datetime


class StepRow(BaseModel):
    seq: int
    step_id: str
    kind: str
    lane: str
    iteration: int
    status: str
    attempt: int
    owner: str | None = None
    lease_until: datetime | None = None
    available_at: datetime | None = None
    wait_kind: str | None = None
    output: Any = None
    error: Any = None
    created_at: datetime
    finished_at: datetime | None = None


class HistoryEvent(BaseModel):
    event_id: int
    at: datetime
    event: str
    seq: int | None = None
    step_id: str | None = None
    attempt: int | None = None
    worker: str | None = None
    detail: Any = None


class RunView(BaseModel):
    """One run on one screen (R17): the run, its steps and every transition in order."""

    run: RunDetail
    steps: list[StepRow]
    history: list[HistoryEvent]


class Health(BaseModel):
    ok: bool
    database: str
    org_id: str
