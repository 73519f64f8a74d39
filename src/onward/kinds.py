"""Step kinds: the registry, what a step sees when it runs, and what it may answer.

A step kind is an async function registered under a name and a lane::

    @onward.step_kind("crm.upsert", lane="io", params=CrmParams)
    async def crm_upsert(step: onward.StepContext) -> dict:
        ...
        return {"id": record_id}          # plain value: the step is done, follow ``next``

A kind may also answer ``Advance(output, vars=..., next=...)`` to choose the next step (what
``branch`` does), ``Wait(...)`` to wait on a timer (the kind is called again, with
``step.wake`` set, when it fires), or raise one of the ``StepError`` family (``onward.errors``)
to ask for a retry, a park or a failure. Anything else raised is retried with backoff.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from onward import ids
from onward.automations.document import AutomationDoc, RetryPolicy, StepDef

LANES = ("fast", "io", "slow", "wait")  # the built-in lanes; settings may add more
LANE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


@dataclass
class Advance:
    """The step is done. ``vars`` are merged into the run's variables; ``next`` overrides
    the document's static ``next`` (None there and here: the run completes)."""

    output: Any = None
    vars: dict[str, Any] | None = None
    next: str | None = None
    skipped: str | None = None  # a reason: the step did nothing on purpose (e.g. no consent)


@dataclass
class Wait:
    """Wait until ``due_in`` seconds from now (by the database clock), or until the instant
    ``due_at`` (aware; computed from ``step.now``, the database's clock), and then call the
    kind again with ``step.wake`` set. ``intent`` is stored beside the instant, as asked, so
    the instant can be recomputed (R6).

    ``on="signal"`` waits for the first of ``signals`` (names) with that instant as the
    deadline: ``step.wake`` then says ``by: "signal"`` (with the signal) or ``by: "timer"``
    (the deadline won). ``on="approval"`` waits for a decision (``onward.approvals``)."""

    due_in: float = 0.0
    intent: dict[str, Any] = field(default_factory=dict)
    due_at: datetime | None = None
    on: str = "timer"
    signals: list[str] | None = None


Outcome = Advance | Wait


@dataclass
class StepContext:
    """What a running step knows. ``effect_key`` names this step's outside effect: it is the
    same for every attempt and differs for every loop iteration (R4)."""

    org_id: str
    run_id: str
    seq: int
    step_id: str
    kind: str
    lane: str
    iteration: int
    attempt: int
    worker: str
    params: Any
    input: dict[str, Any]
    vars: dict[str, Any]
    steps: dict[str, Any]
    wake: dict[str, Any] | None
    definition: StepDef
    lease_lost: asyncio.Event = field(default_factory=asyncio.Event)
    #: the database's clock when this step was claimed: compute instants from it, never from
    #: this process's clock
    now: datetime | None = None
    automation: AutomationDoc | None = None  # the version this run follows
    integrations: Any = None  # the engine's connections and effect store (onward.connections)

    @property
    def effect_key(self) -> str:
        return ids.effect_key(self.run_id, self.step_id, self.iteration)

    @property
    def env(self) -> dict[str, Any]:
        """The variables CEL expressions see."""
        return {"input": self.input, "vars": self.vars, "steps": self.steps}


Handler = Callable[[StepContext], Awaitable[Any]]
Successors = Callable[[StepDef, Any], list[str]]
Checker = Callable[[StepDef, Any], list[str]]
Reads = Callable[[StepDef, Any], list[str]]


def reads_no_outputs(step: StepDef, params: Any) -> list[str]:
    """For a kind that reads no earlier step's output (only ``input`` and ``vars``)."""
    return []


def _static_next(step: StepDef, params: Any) -> list[str]:
    return [step.next] if step.next else []


def _no_checks(step: StepDef, params: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class KindSpec:
    name: str
    lane: str
    handler: Handler
    params: type[BaseModel] | None = None
    successors: Successors = _static_next
    check: Checker = _no_checks
    retry: RetryPolicy | None = None  # None: the lane's (onward.lanes)
    contacts_person: bool = False  # consent is checked at run time for these (R14)
    needs_zone: bool = False  # its params name a zone, or the automation's timezone serves
    #: the CEL expressions its parameters hold: what it reads of earlier outputs (``steps``).
    #: None (a kind that does not say) may read any of them through ``step.steps``, so a run
    #: of an automation using it keeps every output in its context (``policy.outputs_read``)
    reads: Reads | None = None

    def parse_params(self, raw: dict[str, Any]) -> Any:
        if self.params is None:
            return dict(raw)
        return self.params.model_validate(raw)


class Registry:
    """Step kinds by name. The default registry holds the built-ins and user kinds."""

    def __init__(self) -> None:
        self._kinds: dict[str, KindSpec] = {}

    def add(self, spec: KindSpec, *, replace: bool = False) -> KindSpec:
        if not LANE_NAME.match(spec.lane):
            raise ValueError(
                f"lane {spec.lane!r} of kind {spec.name!r}: lower-case letters, digits and _ "
                f"(the built-in lanes: {', '.join(LANES)})"
            )
        if spec.name in self._kinds and not replace:
            raise ValueError(f"step kind {spec.name!r} is already registered")
        self._kinds[spec.name] = spec
        return spec

    def get(self, name: str) -> KindSpec | None:
        return self._kinds.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def names(self) -> list[str]:
        return sorted(self._kinds)

    def lanes_of(self, names: list[str] | None = None) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for spec in self._kinds.values():
            if names is None or spec.name in names:
                out.setdefault(spec.lane, []).append(spec.name)
        return out


registry = Registry()


def step_kind(
    name: str,
    *,
    lane: str = "io",
    params: type[BaseModel] | None = None,
    successors: Successors | None = None,
    check: Checker | None = None,
    retry: RetryPolicy | None = None,
    contacts_person: bool = False,
    needs_zone: bool = False,
    reads: Reads | None = None,
    replace: bool = False,
    into: Registry | None = None,
) -> Callable[[Handler], Handler]:
    """Register an async function as a step kind (see the module docstring)."""

    def deco(fn: Handler) -> Handler:
        (into or registry).add(
            KindSpec(
                name=name,
                lane=lane,
                handler=fn,
                params=params,
                successors=successors or _static_next,
                check=check or _no_checks,
                retry=retry,
                contacts_person=contacts_person,
                needs_zone=needs_zone,
                reads=reads,
            ),
            replace=replace,
        )
        return fn

    return deco
