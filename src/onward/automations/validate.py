"""Graph checks of an automation document against the step-kind registry.

Every problem is collected (not just the first) so a person can fix a document in one pass:
unknown step kind, duplicate step id, a transition to a step that does not exist, a step no
path from ``start`` reaches, bad kind parameters, bad CEL. Nothing is stored unless the list
is empty.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from onward import schedules
from onward.automations.document import AutomationDoc, parse_model
from onward.calendar import UnknownZone, zone
from onward.durations import parse_duration
from onward.errors import InvalidAutomation, InvalidInput
from onward.inputs import check_storable
from onward.kinds import LANES, Registry


def validate(data: dict[str, Any] | AutomationDoc, registry: Registry) -> AutomationDoc:
    """Return the parsed document, or raise ``InvalidAutomation`` listing every problem."""
    if isinstance(data, AutomationDoc):
        # built in Python, so it skipped parse_model's check of what PostgreSQL can store
        try:
            check_storable(data.canonical(), "the document")
        except InvalidInput as exc:
            raise InvalidAutomation([str(exc)]) from None
    doc = data if isinstance(data, AutomationDoc) else parse_model(data)
    problems: list[str] = []
    ids: set[str] = set()
    if doc.timezone is not None:
        try:
            zone(doc.timezone)
        except UnknownZone as exc:
            problems.append(f"timezone: {exc}")
    for step in doc.steps:
        if step.id in ids:
            problems.append(f"duplicate step id {step.id!r}")
        ids.add(step.id)

    edges: dict[str, list[str]] = {}
    for step in doc.steps:
        spec = registry.get(step.kind)
        if spec is None:
            known = ", ".join(registry.names())
            problems.append(f"step {step.id}: unknown step kind {step.kind!r} (known: {known})")
            edges.setdefault(step.id, []).extend([step.next] if step.next else [])
            continue
        if step.lane is not None and step.lane not in LANES:
            problems.append(f"step {step.id}: unknown lane {step.lane!r} (choose one of {LANES})")
        if step.timeout is not None:
            try:
                parse_duration(step.timeout)
            except ValueError as exc:
                problems.append(f"step {step.id}: timeout: {exc}")
        try:
            params = spec.parse_params(step.params)
        except ValidationError as exc:
            for err in exc.errors():
                where = ".".join(str(p) for p in err["loc"])
                problems.append(f"step {step.id}: with.{where}: {err['msg']}")
            edges.setdefault(step.id, []).extend([step.next] if step.next else [])
            continue
        problems.extend(spec.check(step, params))
        if spec.needs_zone and not (
            getattr(params, "zone", None) or getattr(params, "zone_from", None) or doc.timezone
        ):
            problems.append(
                f"step {step.id}: no time zone: give with.zone, with.zone_from or the "
                "automation's timezone"
            )
        edges.setdefault(step.id, []).extend(spec.successors(step, params))

    problems.extend(schedules.check(doc))
    if doc.start is not None and doc.start not in ids:
        problems.append(f"start {doc.start!r} is not a step")
    for source, targets in edges.items():
        for target in targets:
            if target not in ids:
                problems.append(f"step {source}: transition to unknown step {target!r}")

    reached: set[str] = set()
    frontier = [doc.start_step] if doc.start_step in ids else []
    while frontier:
        current = frontier.pop()
        if current in reached:
            continue
        reached.add(current)
        frontier.extend(t for t in edges.get(current, []) if t in ids)
    for step in doc.steps:
        if step.id not in reached and doc.start_step in ids:
            problems.append(f"step {step.id}: unreachable from start {doc.start_step!r}")

    if problems:
        raise InvalidAutomation(problems)
    return doc
