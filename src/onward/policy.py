"""The outcome policy: what one step's outcome means for its run, as the transition to write.

Pure: no database, no clock, no I/O. The worker asks it at two moments and writes whatever it
answers with one fenced statement (``settle.Settler``):

* :func:`at_claim` -- before the handler runs: a cancel request or an exhausted budget (R13)
  ends the run instead;
* :func:`after_error` -- the handler raised: ``RunCancelled`` (an effect refused to start for a
  cancelled run) ends the step and run cancelled; else park (reconnect, review, an open circuit, an
  exhausted budget), fail, defer (a limit held the call back: no attempt spent), or retry with
  backoff (``Retry-After`` wins); attempts are counted by failures, not claims;
* :func:`after_result` -- the handler answered: done and advance to the next step (or complete
  the run), wait on a timer, or fail when the answer cannot be stored or leads nowhere.

The table of docs/state-machine.md ("The settle table") lists every row; tests/unit/test_policy.py
checks each one without a database.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from onward import jsoncodec
from onward.automations.document import AutomationDoc, RetryPolicy, StepDef
from onward.backoff import retry_delay
from onward.errors import (
    AuthorizationError,
    BudgetExhausted,
    CircuitOpen,
    Deferred,
    InvalidInput,
    NeedsReview,
    PermanentError,
    RateLimited,
    RunCancelled,
    StepError,
)
from onward.inputs import check_storable
from onward.kinds import Advance, Registry, Wait

#: What a step may wait on (steps.wait_kind of a waiting step).
WAIT_KINDS = ("timer", "signal", "approval")

#: How long a step whose kind this worker lacks waits for a worker that has it (deploy skew).
KIND_MISSING_DELAY_S = 30.0


class NextStep(NamedTuple):
    """The step a run enters next: its id, kind, lane and iteration (nth entry, R4)."""

    step_id: str
    kind: str
    lane: str
    iteration: int


class Proceed(NamedTuple):
    """The step is done (or ``skipped`` on purpose); the run enters ``next_step`` or, when it is
    None, completes."""

    output: Any
    vars: dict[str, Any]
    next_step: NextStep | None
    skipped: str | None = None
    #: the output is copied into the run's context (``ctx.steps``): some expression of the
    #: automation reads it (``outputs_read``); it is on the step row either way
    keep_output: bool = True


@dataclass(frozen=True)
class WaitTimer:
    """The step waits until ``due_in`` seconds from now by the database clock, or until the
    instant ``due_at`` when the kind computed one (a calendar rule)."""

    due_in: float
    intent: dict[str, Any]
    due_at: datetime | None = None
    wait_kind: str = "timer"  # or 'signal' / 'approval': the timer is then the deadline
    signals: tuple[str, ...] = ()


@dataclass(frozen=True)
class Retry:
    """The step becomes ready again after ``delay`` seconds, or at ``retry_at`` (a provider's
    instant, compared with the database's clock) if that is later."""

    delay: float
    error: dict[str, Any]
    retry_at: datetime | None = None


@dataclass(frozen=True)
class Defer:
    """A limit (a concurrency cap, a rate) held the step's outside call back before it was
    made: the step is ready again after ``delay`` seconds, and no attempt is spent."""

    delay: float
    detail: dict[str, Any]


@dataclass(frozen=True)
class Stop:
    """The step ends without a successor, and the run with it -- or both park for a person
    (``step_status == run_status == 'parked'`` with a ``wait_kind``)."""

    step_status: str
    run_status: str
    reason: str
    error: dict[str, Any] | None = None
    wait_kind: str | None = None


Transition = Proceed | WaitTimer | Retry | Defer | Stop


def at_claim(claim: Mapping[str, Any]) -> Stop | None:
    """Before the handler runs. ``claim`` is the claim row (``leases.claim``) or its eager
    equivalent: ``cancel_requested``, ``over_steps``, ``over_age``, ``max_steps``."""
    if claim["cancel_requested"]:
        return cancelled()
    if claim["over_steps"]:
        return Stop("cancelled", "exceeded", f"step budget of {claim['max_steps']} steps exhausted")
    if claim["over_age"]:
        return Stop("cancelled", "exceeded", "maximum run age reached")
    return None


def cancelled(error: dict[str, Any] | None = None) -> Stop:
    """The run was cancelled: the step ends ``cancelled`` and the run with it."""
    return Stop("cancelled", "cancelled", "cancelled on request", error)


def step_not_in_version(step_id: str) -> Stop:
    return Stop("failed", "failed", f"step {step_id!r} not in its version")


def params_do_not_fit(step_id: str, kind: str, problems: str) -> Stop:
    return Stop(
        "failed", "failed", f"step {step_id}: parameters do not fit kind {kind!r}: {problems}"
    )


def kind_not_registered(kind: str, worker: str) -> Retry:
    """A deploy skew: this worker lacks the kind. Hand it back for a worker that has it."""
    message = f"step kind {kind!r} is not registered in worker {worker}"
    return Retry(KIND_MISSING_DELAY_S, {"message": message})


def engine_error(exc: BaseException) -> Stop:
    """A bug outside the handler (in the engine itself): never loop on it -- park the run for
    a person with what went wrong."""
    return Stop(
        "parked", "parked", f"engine error: {type(exc).__name__}: {exc}", wait_kind="review"
    )


def error_detail(exc: BaseException) -> dict[str, Any]:
    """What the step row and its history keep of an error."""
    error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)[:2000]}
    if isinstance(exc, StepError) and exc.detail:
        error["detail"] = exc.detail
    if isinstance(exc, AuthorizationError) and exc.connection:
        error["connection"] = exc.connection
    return error


def after_error(
    exc: BaseException,
    *,
    step_id: str,
    failures: int,
    retry: RetryPolicy,
    jitter: Callable[[float, float], float] = random.uniform,
) -> Stop | Retry | Defer:
    """The handler raised ``exc``; ``failures`` attempts of this step failed before this one
    (errors and lapsed leases -- not claims: a deferral or a resume spends none), so this is
    failed attempt number ``failures + 1``."""
    attempt = failures + 1
    error = error_detail(exc)
    if isinstance(exc, RunCancelled):
        return cancelled(error)
    if isinstance(exc, Deferred):
        return Defer(exc.delay_s, {"reason": str(exc), **exc.detail})
    if isinstance(exc, AuthorizationError):
        reason = str(exc) or "reconnect the connection"
        return Stop("parked", "parked", reason, error, wait_kind="reconnect")
    if isinstance(exc, CircuitOpen):
        return Stop(
            "parked", "parked", str(exc), {**error, "circuit": exc.key}, wait_kind="circuit"
        )
    if isinstance(exc, BudgetExhausted):
        return Stop(
            "parked", "parked", str(exc), {**error, "budget": exc.scope}, wait_kind="budget"
        )
    if isinstance(exc, NeedsReview):
        return Stop("parked", "parked", str(exc), error, wait_kind="review")
    if isinstance(exc, PermanentError):
        return Stop("failed", "failed", f"step {step_id}: {exc}", error)
    if attempt >= retry.max_attempts:
        reason = f"step {step_id}: gave up after {attempt} attempts: {exc}"
        return Stop("failed", "failed", reason, error)
    if isinstance(exc, RateLimited) and exc.retry_at is not None:
        return Retry(0.0, error, retry_at=exc.retry_at)
    retry_after = exc.retry_after if isinstance(exc, RateLimited) else None
    delay = retry_delay(
        attempt, base=retry.base, cap=retry.cap, retry_after=retry_after, jitter=jitter
    )
    return Retry(delay, error)


def after_result(
    result: Any,
    *,
    step: StepDef,
    doc: AutomationDoc,
    registry: Registry,
    visits: Mapping[str, int] | None,
    reads: frozenset[str] | None = None,
) -> Proceed | WaitTimer | Stop:
    """The handler answered ``result``: a plain value (done, follow ``next``), an ``Advance``
    (done, maybe choosing ``next``) or a ``Wait``. ``reads``: the outputs the automation reads
    (``outputs_read``; None: all of them)."""
    if isinstance(result, Wait):
        if result.on not in WAIT_KINDS:
            return Stop("failed", "failed", f"step {step.id}: cannot wait on {result.on!r}")
        if result.on == "signal" and not result.signals:
            return Stop("failed", "failed", f"step {step.id}: a signal wait names no signal")
        try:
            intent = _as_stored(result.intent, "the wait's intent")
        except (TypeError, ValueError, InvalidInput) as exc:
            return Stop("failed", "failed", f"step {step.id}: its wait is not JSON: {exc}")
        return WaitTimer(
            result.due_in,
            intent,
            result.due_at,
            result.on,
            tuple(result.signals or ()),
        )
    adv = result if isinstance(result, Advance) else Advance(output=result)
    try:
        output = _as_stored(adv.output)
        # a `set` step's output is its variables (one dict): stored once, read twice
        same = adv.vars is adv.output and isinstance(adv.vars, dict)
        new_vars = output if same else _as_stored(adv.vars or {}, "the variables")
    except (TypeError, ValueError, InvalidInput) as exc:
        return Stop("failed", "failed", f"step {step.id}: output is not JSON: {exc}")
    next_id = adv.next if adv.next is not None else step.next
    keep = reads is None or step.id in reads
    if next_id is None:
        return Proceed(output, new_vars, None, adv.skipped, keep)
    try:
        nd = doc.step(next_id)
    except KeyError:
        return Stop("failed", "failed", f"step {step.id}: no step {next_id!r}")
    lane = step_lane(nd, registry)
    iteration = int((visits or {}).get(nd.id, 0)) + 1
    return Proceed(output, new_vars, NextStep(nd.id, nd.kind, lane, iteration), adv.skipped, keep)


_STEPS_USE = re.compile(r"(?<![\w.])steps\b(?:\s*\.\s*([A-Za-z_]\w*))?")


def outputs_read(doc: AutomationDoc, registry: Registry) -> frozenset[str] | None:
    """The steps whose output some expression of ``doc`` reads (``steps.<id>`` in CEL): only
    these are copied into a run's context, so the run's row does not grow with every step.
    None (keep every output) when a step's kind does not say what it reads (a user's kind may
    read ``step.steps``), its parameters do not parse, or an expression reads ``steps`` as a
    whole or by a computed key."""
    from onward.automations import cel

    read: set[str] = set()
    for step in doc.steps:
        spec = registry.get(step.kind)
        if spec is None or spec.reads is None:
            return None
        try:
            sources = list(spec.reads(step, spec.parse_params(step.params)))
        except Exception:  # a bad parameter fails the step itself; here, keep everything
            return None
        for source in sources:
            if not isinstance(source, str):  # a user's ``reads`` that answers oddly
                return None
            try:
                roots = {str(v) for v in cel.compile_expr(source).variables()}
            except cel.CelError:
                return None
            if "steps" not in roots:
                continue
            # the library names roots only: each use of ``steps`` must be ``steps.<id>``
            uses = _STEPS_USE.findall(source)
            if not uses or any(not step_id for step_id in uses):
                return None
            read.update(uses)
    return frozenset(read)


def step_lane(step: StepDef, registry: Registry) -> str:
    """The lane a step runs in: its own, else its kind's, else ``io``."""
    spec = registry.get(step.kind)
    return step.lane or (spec.lane if spec else "io")


def skipped_by_operator(wake: Mapping[str, Any] | None) -> Advance | None:
    """A person resolved the step's review with "skip" (``onward.actions``): it ends skipped
    without running its kind, and the run goes on to its next step (then ``after_result``)."""
    if not wake or wake.get("by") != "review" or wake.get("how") != "skip":
        return None
    reason = f"skipped by {wake.get('operator') or 'an operator'} after review"
    return Advance(output={"skipped": True, "by": wake.get("operator")}, skipped=reason)


_STORED = json.JSONEncoder(default=str, allow_nan=False)  # made once, not on every call
# exact types (``type(v) in``): a subclass may write itself otherwise
_PLAIN = frozenset({str, int, bool, type(None)})


def _plain(value: dict[Any, Any]) -> bool:
    """A dict of str keys and str, int, bool, None or finite float values (a ``set`` step's
    variables, most outputs): orjson writes it as the standard library's encoder does, in
    under half the time. Anything else (a NaN, a nested value, a subclass, a date) takes the
    encoder, whose refusals and ``default=str`` stay as they were."""
    for k, v in value.items():
        t = type(v)
        if type(k) is not str or (t not in _PLAIN and (t is not float or not math.isfinite(v))):
            return False
    return True


def _as_stored(value: Any, what: str = "the output") -> Any:
    """What the database will store, so the eager path sees exactly what a claim would.
    ``InvalidInput`` for what jsonb cannot store (a ``\\u0000``, a lone surrogate): the step
    fails by itself, never the batch statement that settles it with other runs' steps."""
    kind = type(value)
    if value is None or kind is int or kind is bool:
        return value  # JSON as it is
    if kind is dict:
        if not value:
            return {}
        if _plain(value):
            try:  # refuses a lone surrogate and an int beyond 64 bits: the encoder's way then
                fast = orjson.dumps(value)
            except TypeError:
                pass
            else:
                if b"\\u0000" not in fast:  # jsonb refuses it: the encoder's way says so
                    return orjson.loads(fast)  # every int within 64 bits: read back exactly
    text = _STORED.encode(value)  # ASCII: every NUL and surrogate written as \u escape
    stored = jsoncodec.loads(text)  # read back as a claim reads it
    if "\\u0000" in text or "\\ud" in text:  # maybe (an emoji is a surrogate pair): walk it
        check_storable(stored, what)
    return stored


__all__ = [
    "Defer",
    "NextStep",
    "Proceed",
    "Retry",
    "Stop",
    "Transition",
    "WaitTimer",
    "after_error",
    "after_result",
    "at_claim",
    "cancelled",
    "engine_error",
    "error_detail",
    "kind_not_registered",
    "params_do_not_fit",
    "skipped_by_operator",
    "step_lane",
    "step_not_in_version",
]
