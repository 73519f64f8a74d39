"""Request and response bodies of the HTTP API, and the ``--json`` output of the CLI.

The CLI prints these same models (``model_dump(mode="json")``), so a script reading
``onward show RUN --json`` sees exactly what ``GET /v1/runs/{run_id}`` answers: stable keys,
datetimes as ISO 8601 strings, JSON documents (input, context, outputs) as they are stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from onward.automations.document import ID_PATTERN
from onward.start import MAX_BATCH

MAX_EVENT_ID = 256
"""The longest event id (header, body field or ``--event-id``)."""
MAX_VERSION = 2**31 - 1

# -- errors --------------------------------------------------------------------------------

NO_NUL = r"^[^\x00]*$"
"""Text stored as PostgreSQL ``text`` or ``jsonb`` cannot hold ``\\u0000`` (NUL)."""

Text = Annotated[str, Field(pattern=NO_NUL)]


class ErrorBody(BaseModel):
    """Every error answer, whatever the status (4xx, 5xx): a machine-readable ``error`` name,
    a one-line ``detail``, and for an invalid document or request every ``problems`` found."""

    error: str = Field(
        description="what went wrong: unknown_run, unknown_automation, unknown_connection, "
        "unknown_schedule, unknown_approval, signal_refused, decision_refused, not_found, method_not_allowed, payload_too_large, invalid_input, "
        "invalid_request, invalid_automation, unavailable, internal"
    )
    detail: str = Field(description="one line for a person")
    problems: list[str] | None = Field(
        default=None, description="every problem found (invalid documents and requests)"
    )


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

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"automation_id": "welcome", "input": {"name": "Maya"}, "event_id": "evt_7Hq2"}
            ]
        },
    )
    automation_id: str = Field(pattern=ID_PATTERN, description="a published automation")
    input: dict[str, Any] = Field(default_factory=dict, description="the run's input")
    event_id: Text | None = Field(
        default=None,
        max_length=MAX_EVENT_ID,
        description="the provider's event id: the start key becomes <automation_id>:<event_id>",
    )
    key: Text | None = Field(
        default=None, max_length=512, description="your own start key (wins over event_id)"
    )
    version: int | None = Field(
        default=None, ge=1, le=MAX_VERSION, description="default: the latest version"
    )
    contact_id: Text | None = Field(default=None, max_length=320)


class StartAnswer(BaseModel):
    run_id: str
    created: bool = Field(description="true: this request started the run")
    duplicate: bool = Field(description="true: an earlier delivery already started this run")
    start_key: str
    start_key_kind: str = Field(
        description="event | payload_hash (weaker: identical payloads collapse) | caller"
    )


class StartBatchRequest(BaseModel):
    """Start up to 1,000 runs in one request (``POST /v1/runs:batch``): each item is the body
    ``POST /v1/runs`` takes."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "starts": [
                        {"automation_id": "welcome", "input": {"name": "Maya"}, "event_id": "e1"},
                        {"automation_id": "welcome", "input": {"name": "Sam"}, "key": "sam-1"},
                    ]
                }
            ]
        },
    )
    starts: list[StartRequest] = Field(
        min_length=1, max_length=MAX_BATCH, description="1 to 1,000 starts, answered in order"
    )


class StartBatchItem(StartAnswer):
    index: int = Field(description="the start's position in the request, from 0")


class StartBatchAnswer(BaseModel):
    started: list[StartBatchItem] = Field(description="one answer per start, in request order")
    created: int = Field(description="how many starts made a new run")
    duplicates: int = Field(description="how many answered a run that existed already")


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
    claimed_at: datetime | None = None  # when its current (or last) attempt was claimed
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
    claimed_at: datetime | None = None  # on a row that ends an attempt: when it was claimed
    detail: Any = None


class RunView(BaseModel):
    """One run on one screen: the run, its steps and every transition in order."""

    run: RunDetail
    steps: list[StepRow]
    history: list[HistoryEvent]


class Health(BaseModel):
    ok: bool
    database: str
    org_id: str


# -- connections and consent ---------------------------------------------------------------

URL_PATTERN = r"^https?://[A-Za-z0-9.\-]+(:[0-9]{1,5})?(/[!-~]*)?$"
"""An http(s) base URL: a host name or address, a port, a path of visible ASCII."""


class ConnectionIn(BaseModel):
    """Connect an account: which provider, where it is, and its credentials."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "connection_id": "mailbox",
                    "provider": "email",
                    "base_url": "https://mail.example.test/api",
                    "account": "team@example.test",
                    "secret": "tok_123",
                }
            ]
        },
    )
    connection_id: str = Field(pattern=ID_PATTERN)
    provider: str = Field(
        description="a registered connector (the schema lists the ones this server knows)",
        json_schema_extra=lambda schema: schema.update(enum=list[JsonValue](_providers())),
    )
    base_url: str = Field(pattern=URL_PATTERN, max_length=2048)
    account: Text = Field(min_length=1, max_length=320)
    secret: str = Field(
        pattern=r"^[!-~]+$",
        max_length=8192,
        repr=False,
        description="the token, sent as a bearer token: visible ASCII",
    )


def _providers() -> list[str]:
    """The providers a connection may name: the connectors registered in this process."""
    from onward import connectors

    return connectors.known_providers()


class ConnectionAnswer(BaseModel):
    connection_id: str
    provider: str


class RestoreAnswer(BaseModel):
    connection_id: str
    resumed: list[str] = Field(description="runs parked on this connection, resumed")


class ProbeAnswer(BaseModel):
    connection_id: str
    healthy: bool
    problem: str | None = Field(default=None, description="why not, when not healthy")


class SuppressionIn(BaseModel):
    """Never contact this person on this channel again."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"contact": "maya@example.test", "reason": "unsubscribed"}]
        },
    )
    contact: Text = Field(min_length=1, max_length=320)
    reason: Text = Field(min_length=1, max_length=500)
    channel: Text = Field(default="email", min_length=1, max_length=64)


class SuppressionAnswer(BaseModel):
    contact: str = Field(description="as stored: lower case")
    channel: str


# -- schedules that start runs -------------------------------------------------------------


class ScheduleView(BaseModel):
    """A schedule (``GET /v1/schedules``, ``onward schedules list --json``): what it is, where
    it stands, and what its last firing did."""

    automation_id: str
    schedule_id: str
    version: int = Field(description="the automation version that last synced it")
    rule: str
    zone: str
    start_at: datetime | None = None
    end_at: datetime | None = None
    jitter_s: float
    overlap: str = Field(description="skip | allow | buffer_one")
    catch_up: str = Field(description="skip | latest | all")
    input: Any = None
    paused: bool
    paused_at: datetime | None = None
    next_instant: datetime | None = Field(
        default=None, description="the next firing's instant (its identity); null: none left"
    )
    next_fire_at: datetime | None = Field(
        default=None, description="when the sweep fires it: the instant plus its jitter"
    )
    buffered_instant: datetime | None = Field(
        default=None, description="buffer_one: the firing waiting for the unfinished run"
    )
    last_instant: datetime | None = None
    last_outcome: str | None = Field(
        default=None,
        description="started | duplicate | skipped | buffered | missed | triggered | failed",
    )
    last_fired_at: datetime | None = None
    last_run_id: str | None = None
    last_run_status: str | None = None
    fired_count: int
    skipped_count: int
    error: str | None = None
    created_at: datetime
    updated_at: datetime


class TriggerAnswer(BaseModel):
    automation_id: str
    schedule_id: str
    outcome: str = Field(
        description="started | duplicate (this key already started run_id) | skipped (overlap: "
        "run_id is the unfinished run)"
    )
    instant: datetime = Field(description="now, by the database clock")
    run_id: str | None = None
    start_key: str | None = None
    reason: str | None = None


class OperationView(BaseModel):
    """A bulk operation (a cancel of many runs, a migration) and its progress."""

    model_config = ConfigDict(populate_by_name=True)
    operation_id: str
    kind: str
    status: str = Field(description="running, done or failed")
    params: dict[str, Any]
    requested_by: str
    pass_: int = Field(alias="pass", description="the pass over the runs (runs in flight defer)")
    done: int = Field(description="runs handled so far, each once, by its final outcome")
    deferred: int = Field(description="runs deferred (in flight) in the current pass")
    outcomes: dict[str, int] = Field(description="how many runs got each outcome")
    after_run_id: str = Field(description="the cursor: runs after this id are not handled yet")
    error: str | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    lease_until: datetime | None = None


def operation_view(row: dict[str, Any]) -> dict[str, Any]:
    """An operation row as the API shows it (``pass`` by its name)."""
    return OperationView.model_validate(row).model_dump(mode="json", by_alias=True)
