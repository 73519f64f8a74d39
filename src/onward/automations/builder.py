"""Build an automation in Python; ``build()`` returns the same document YAML would give.

    flow = (
        Automation("welcome")
        .step("greet", "set", values={"greeting": "'hello ' + input.name"})
        .step("pause", "wait_for", duration="2s")
        .branch("check", cases=[("vars.greeting != ''", "done")], default="greet")
        .step("done", "set", values={"finished": "true"})
    )
    onward.publish(pool, flow.build())

Steps are linked in the order they are added unless ``next=`` says otherwise; ``end=True``
leaves a step without a successor.
"""

from __future__ import annotations

from typing import Any

_UNSET: Any = object()


class Automation:
    def __init__(
        self,
        automation_id: str,
        *,
        name: str | None = None,
        max_steps: int | None = None,
        max_age: str | float | None = None,
    ) -> None:
        self.id = automation_id
        self.name = name
        self.budget: dict[str, Any] = {}
        if max_steps is not None:
            self.budget["max_steps"] = max_steps
        if max_age is not None:
            self.budget["max_age"] = max_age
        self._steps: list[dict[str, Any]] = []
        self._explicit_next: set[int] = set()
        self._schedules: list[dict[str, Any]] = []

    def step(
        self,
        step_id: str,
        kind: str,
        *,
        next: str | None = _UNSET,
        end: bool = False,
        lane: str | None = None,
        retry: dict[str, Any] | None = None,
        timeout: str | float | None = None,
        **params: Any,
    ) -> Automation:
        """A step: its kind's parameters as keywords (``with``); ``lane``, ``retry``
        (``{"max_attempts", "base", "cap"}``: over the kind's and the lane's) and ``timeout``
        are the step's own."""
        entry: dict[str, Any] = {"id": step_id, "kind": kind}
        if params:
            entry["with"] = params
        if lane:
            entry["lane"] = lane
        if retry is not None:
            entry["retry"] = retry
        if timeout is not None:
            entry["timeout"] = timeout
        index = len(self._steps)
        if next is not _UNSET and next is not None:
            entry["next"] = next
        if next is not _UNSET or end:
            self._explicit_next.add(index)
        self._steps.append(entry)
        return self

    def branch(
        self, step_id: str, *, cases: list[tuple[str, str]], default: str | None = None
    ) -> Automation:
        params: dict[str, Any] = {"cases": [{"when": w, "next": n} for w, n in cases]}
        if default:
            params["default"] = default
        return self.step(step_id, "branch", next=None, **params)

    def goto(self, step_id: str, target: str) -> Automation:
        return self.step(step_id, "goto", next=None, target=target)

    def schedule(
        self,
        schedule_id: str,
        rule: str,
        *,
        zone: str | None = None,
        start: str | None = None,
        end: str | None = None,
        jitter: str | float | None = None,
        overlap: str | None = None,
        catch_up: str | None = None,
        input: dict[str, Any] | None = None,
    ) -> Automation:
        """Start runs on a calendar rule (see ``onward.schedules``): ``zone`` defaults to the
        automation's timezone; ``overlap`` skip|allow|buffer_one, ``catch_up``
        skip|latest|all."""
        given = {
            "zone": zone,
            "start": start,
            "end": end,
            "jitter": jitter,
            "overlap": overlap,
            "catch_up": catch_up,
            "input": input,
        }
        entry: dict[str, Any] = {"id": schedule_id, "rule": rule}
        entry.update({k: v for k, v in given.items() if v is not None})
        self._schedules.append(entry)
        return self

    def build(self) -> dict[str, Any]:
        steps = [dict(s) for s in self._steps]
        for i, s in enumerate(steps[:-1]):
            if i not in self._explicit_next and "next" not in s:
                s["next"] = steps[i + 1]["id"]
        doc: dict[str, Any] = {"id": self.id, "steps": steps}
        if self.name:
            doc["name"] = self.name
        if self.budget:
            doc["budget"] = dict(self.budget)
        if self._schedules:
            doc["schedules"] = [dict(s) for s in self._schedules]
        return doc
