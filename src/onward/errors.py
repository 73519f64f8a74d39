"""Errors raised by onward, and what each one asks the caller to do.

The hierarchy::

    OnwardError
    ├── ConfigError                 bad configuration (env var, flag); fix it and restart
    ├── InvalidAutomation           an automation document is malformed; nothing was stored
    ├── InvalidInput                a payload, id or document cannot be stored as sent (too
    │                               deep, NUL, lone surrogate, NaN, too large a number, ...)
    ├── UnknownRun                  no run with that id in that organisation
    ├── UnknownAutomation           no published automation (or version) with that id
    ├── UnknownConnection           no connection with that id in that organisation
    ├── UnknownSchedule             no schedule with that id on that automation
    ├── UnknownApproval             no approval request with that id in that organisation
    ├── UnknownOperation            no bulk operation with that id in that organisation
    ├── SecretUnreadable            a stored secret cannot be decrypted: its key is not
    │                               configured, or it was copied from another organisation
    │                               or column (the value is never shown)
    ├── MigrationRefused            a migration's map or policy does not fit the versions;
    │                               ``problems`` lists why; no run was moved
    ├── ActionRefused               an operator action does not apply to the run as it is now
    │                               (not parked, already finished, ...); nothing changed
    ├── ContactErased               a start names a contact that was erased; nothing stored
    ├── SignalRefused               the signal's run has finished or was cancelled; the
    │                               signal was recorded as refused
    ├── DecisionRefused             an approval decision that decided nothing (expired, not
    │                               permitted, a stale or forged token); ``decision`` reads
    │                               back the one that stands, if any
    ├── Unavailable                 the database cannot be reached now: try again later
    ├── PayloadTooLarge             an input/payload exceeds the configured limit; nothing stored
    ├── SignatureRefused            a signed endpoint's request whose signature does not hold
    │                               (no detail about which part: 401); nothing stored
    ├── IntakeLimited               the organisation's intake rate is spent: try again after
    │                               ``retry_after`` seconds (429 + Retry-After); nothing stored
    ├── QueueMisconfigured          the queue cannot be used safely (e.g. Redis may evict keys)
    ├── LeaseLost                   this worker's fencing token is stale: stop, write nothing
    └── StepError                   raised by step kinds and connectors to classify a failure
        ├── RetryableError          try again later with backoff (5xx, timeouts, resets)
        │   └── RateLimited         try again after ``retry_after`` seconds (429 + Retry-After)
        ├── AuthorizationError      never retried: the run parks until the connection is restored
        ├── PermanentError          never retried: the step (and run) fails with this reason
        │   └── OutboundRefused     a non-public destination not allow-listed, or an answer
        │                           over the size cap (onward.outbound)
        ├── OutcomeUnknown          the call may or may not have happened (timeout after send)
        ├── NeedsReview             a person must look: parks the step with what is known
        ├── Deferred                a limit (cap, rate) held the call back: ready again after
        │                           ``delay_s``, no attempt spent
        ├── RunCancelled            the run was cancelled: the call was not made and the step
        │                           ends cancelled with its run
        ├── CircuitOpen             the provider's (connection's) circuit is open: the step
        │                           parks until the circuit closes, no attempt spent
        └── BudgetExhausted         the cost budget has no room: the step parks until the
                                    budget renews or is raised

Step kinds raise the ``StepError`` family; the worker turns each into one durable transition
(retry row, parked row, failed row). Anything else raised by a step kind is treated as
``RetryableError`` until the step's attempts run out.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any


class OnwardError(Exception):
    """Base class of every error onward raises on purpose."""


class ConfigError(OnwardError):
    """Configuration is missing or invalid."""


class InvalidAutomation(OnwardError):
    """An automation document failed validation. ``problems`` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid automation: " + "; ".join(self.problems))


class InvalidInput(OnwardError):
    """Input that cannot be stored as sent: a JSON or YAML body nested too deep, a ``\\u0000``
    or a lone surrogate in a string, ``NaN`` or a number PostgreSQL's jsonb cannot hold, a
    document whose aliases expand past the limit. Nothing was stored."""


class Unavailable(OnwardError):
    """The database cannot be reached right now; nothing was changed. Try again after
    ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UnknownRun(OnwardError):
    """No run with this id exists in this organisation."""

    def __init__(self, org_id: str, run_id: str) -> None:
        self.org_id, self.run_id = org_id, run_id
        super().__init__(f"unknown run {run_id!r} in organisation {org_id!r}")


class UnknownAutomation(OnwardError):
    """No published automation (or version) with this id exists."""


class UnknownConnection(OnwardError):
    """No connection with this id exists in this organisation."""

    def __init__(self, org_id: str, connection_id: str) -> None:
        self.org_id, self.connection_id = org_id, connection_id
        super().__init__(f"unknown connection {connection_id!r} in organisation {org_id!r}")


class SecretUnreadable(OnwardError):
    """A stored secret cannot be decrypted (``onward.vault``): the key it was encrypted under is
    not in ``ONWARD_SECRET_KEYS``, or the value does not belong to this organisation and
    column (copied from another row) or was altered. Nothing was changed; the message names
    the organisation and the column, never the value."""

    def __init__(self, org_id: str, purpose: str, why: str) -> None:
        self.org_id, self.purpose = org_id, purpose
        super().__init__(
            f"the {purpose} secret of organisation {org_id!r} cannot be decrypted: {why}"
        )


class UnknownSchedule(OnwardError):
    """No schedule with this id exists on this automation (in this organisation)."""

    def __init__(self, org_id: str, automation_id: str, schedule_id: str) -> None:
        self.org_id, self.automation_id, self.schedule_id = org_id, automation_id, schedule_id
        super().__init__(
            f"unknown schedule {schedule_id!r} of automation {automation_id!r} "
            f"in organisation {org_id!r}"
        )


class UnknownApproval(OnwardError):
    """No approval request with this id exists in this organisation."""

    def __init__(self, org_id: str, approval_id: str) -> None:
        self.org_id, self.approval_id = org_id, approval_id
        super().__init__(f"unknown approval {approval_id!r} in organisation {org_id!r}")


class UnknownOperation(OnwardError):
    """No bulk operation with this id exists in this organisation."""

    def __init__(self, org_id: str, operation_id: str) -> None:
        self.org_id, self.operation_id = org_id, operation_id
        super().__init__(f"unknown operation {operation_id!r} in organisation {org_id!r}")


class MigrationRefused(OnwardError):
    """A migration between versions was refused before any run moved: ``problems`` lists every
    reason (a map naming an unknown step id, a reachable step left unmapped, ...)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("migration refused: " + "; ".join(problems))


class ActionRefused(OnwardError):
    """An operator action (resume, resolve a review, fork, ...) does not apply to the run as it
    is now; ``reason`` says why. Nothing changed."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class ContactErased(OnwardError):
    """A start names a contact that was erased (or is being erased): nothing was started. A
    start that only carries an erased address in its input is not refused; its emails to that
    address are suppressed at send time."""

    def __init__(self, org_id: str, contact_id: str) -> None:
        self.org_id, self.contact_id = org_id, contact_id
        super().__init__(f"contact {contact_id!r} was erased in organisation {org_id!r}")


class SignalRefused(OnwardError):
    """The signal's run has finished or was cancelled. The signal is recorded (``refused``,
    with a history row on the run); nothing else changed."""

    def __init__(self, signal_id: str, run_id: str, reason: str) -> None:
        self.signal_id, self.run_id, self.reason = signal_id, run_id, reason
        super().__init__(f"signal {signal_id!r} refused: {reason} (run {run_id})")


class DecisionRefused(OnwardError):
    """An approval decision that decided nothing: ``reason`` says why (``expired``,
    ``not_permitted``, ``invalid_token``, ``superseded``, ``cancelled``, ``decided``);
    ``decision`` is the decision that stands, if one was made first (read back)."""

    def __init__(self, reason: str, message: str, decision: dict[str, Any] | None = None) -> None:
        self.reason, self.decision = reason, decision
        super().__init__(message)


class PayloadTooLarge(OnwardError):
    """A payload is larger than ``ONWARD_MAX_PAYLOAD_BYTES``."""

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(f"payload of {size} bytes exceeds the limit of {limit} bytes")


class SignatureRefused(OnwardError):
    """A request to an endpoint that requires a signature carries none that holds. The message
    never says which part failed (a missing header, the timestamp, the signature)."""

    def __init__(self) -> None:
        super().__init__("the request's webhook signature does not hold")


class IntakeLimited(OnwardError):
    """The organisation sent more intake requests than its window allows."""

    def __init__(self, limit: int, window_s: int, retry_after: float) -> None:
        self.retry_after = retry_after
        super().__init__(
            f"more than {limit} intake requests in {window_s} s: try again after the window"
        )


class QueueMisconfigured(OnwardError):
    """The queue is configured in a way that can lose wake-ups silently."""


class LeaseLost(OnwardError):
    """A newer attempt holds the step: the fencing token no longer matches."""


class StepError(OnwardError):
    """Base of the errors a step kind or connector raises to classify a failure."""

    retryable: bool = False

    def __init__(self, message: str, *, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.detail = detail or {}


class RetryableError(StepError):
    """A transient failure: retry with exponential backoff and full jitter."""

    retryable = True


class RateLimited(RetryableError):
    """The provider asked us to slow down; its wait wins over our backoff.

    ``retry_after``: seconds to wait (``Retry-After: 120``). ``retry_at``: an absolute instant
    (``Retry-After: <HTTP-date>``); the worker turns it into a delay against the *database's*
    clock, never its own, so a worker whose clock runs fast does not retry at once."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        retry_at: datetime | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, detail=detail)
        self.retry_after = retry_after
        self.retry_at = retry_at


class AuthorizationError(StepError):
    """The connection's credentials were refused. Not retried: park until reconnected."""

    def __init__(
        self, message: str, *, connection: str | None = None, detail: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, detail=detail)
        self.connection = connection


class PermanentError(StepError):
    """The request can never succeed as sent (400, 404, 422). Not retried."""


class OutboundRefused(PermanentError):
    """User-configured HTTP refused by the outbound check (onward.outbound): a loopback,
    private, link-local, metadata or reserved destination not on the allow-list, or an answer
    larger than the cap. Nothing was sent to a refused destination."""


class OutcomeUnknown(StepError):
    """The provider may have done the work (the connection dropped after sending)."""


class NeedsReview(StepError):
    """A person must decide: the outcome is unknown and the provider offers no safe retry."""


class Deferred(StepError):
    """A limit held the call back before it was made (``onward.limits``): the step is ready
    again after ``delay_s`` seconds, and no attempt is spent."""

    def __init__(self, delay_s: float, message: str, *, key: str) -> None:
        super().__init__(message, detail={"limit": key, "delay_s": round(delay_s, 3)})
        self.delay_s, self.key = delay_s, key


class RunCancelled(StepError):
    """The run was cancelled while this step ran: the outside call was not made (the effect
    claim read ``runs.cancel_requested_at`` in its own statement) and the step ends
    ``cancelled`` with its run (``onward.cancel``)."""


class CircuitOpen(StepError):
    """The circuit of ``key`` (``provider:<name>`` / ``connection:<id>``) is open: the call was
    not made and the step parks (``wait_kind = 'circuit'``) until the circuit closes; no
    attempt is spent (``onward.circuits``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message, detail={"circuit": key})
        self.key = key


class BudgetExhausted(StepError):
    """The cost budget of ``scope`` (``*`` or an automation) has no room for the call's
    maximum cost today: the step parks (``wait_kind = 'budget'``) until the budget renews or is
    raised (``onward.budgets``)."""

    def __init__(self, scope: str, unit: str, message: str, *, cost: float | None = None) -> None:
        detail: dict[str, Any] = {"budget": scope, "unit": unit}
        if cost is not None:  # the call's maximum cost in ``unit``: what must fit to resume it
            detail["cost"] = cost
        super().__init__(message, detail=detail)
        self.scope, self.unit, self.cost = scope, unit, cost
