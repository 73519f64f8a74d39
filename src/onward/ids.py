"""Identifiers and keys, and the two rules that are easy to get backwards (R4, R16).

* **Effect keys name the effect, not the attempt**: ``<run_id>/<step_id>/<iteration>``. Every
  retry of the same send uses the same key, so a retry finds the first attempt's claim and the
  provider's idempotency key repeats; a loop's second pass is a new iteration, so a real second
  send is not mistaken for a duplicate.
* **Wake job ids include the attempt (or wake number)**: ``wake:<run_id>:<seq>:<attempt>`` for
  a step that became ready (the attempt it invites: the step's attempt + 1) and
  ``timer:<org_id>:<timer_id>:<wake_n>`` for a timer's due instant (``wake_n`` grows when the
  timer is recomputed). A queue that keeps finished job ids (BullMQ, our Redis adapter) silently
  drops a job whose id it has seen; a wake id without the attempt would swallow the second wake
  of a retried step. The outbox relay publishes each row under its ``job_id``, so a relay that
  crashes after publishing and republishes is deduplicated while the id is retained.

Inside a transition the wake ids are built by the SQL functions ``onward_step_wake_id`` and
``onward_timer_wake_id`` (migration ``0003_one_source``), used only through the shared fragment
``announce_ready`` (``db/fragments.sql``) and ``leases.sql settle_wait_timer``; the functions
here build the same strings (tests/integration/test_transitions.py compares them).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any


def new_run_id() -> str:
    """Time-ordered, unguessable: 12 hex digits of milliseconds, then 12 random hex digits."""
    return f"run_{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def new_operation_id() -> str:
    """A bulk operation (cancel, migrate): time-ordered like a run id, ``op_`` prefixed."""
    return f"op_{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def effect_key(run_id: str, step_id: str, iteration: int) -> str:
    return f"{run_id}/{step_id}/{iteration}"


def step_wake_id(run_id: str, seq: int, attempt: int) -> str:
    return f"wake:{run_id}:{seq}:{attempt}"


def timer_wake_id(org_id: str, timer_id: int, wake_n: int) -> str:
    return f"timer:{org_id}:{timer_id}:{wake_n}"


def payload_start_key(automation_id: str, payload: Any) -> str:
    """The weaker start key, used when the trigger has no event id: a hash of the payload.
    Two genuinely separate submissions with identical content collapse into one run."""
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return f"{automation_id}:sha256:{hashlib.sha256(raw.encode()).hexdigest()}"


def event_start_key(automation_id: str, event_id: str) -> str:
    return f"{automation_id}:{event_id}"


def schedule_start_key(automation_id: str, schedule_id: str, instant: str) -> str:
    """A schedule's firing: ``<automation_id>:schedule:<schedule_id>:<instant>``, the instant in
    UTC ISO 8601 (``2026-12-07T08:00:00Z``; a trigger's is ``trigger:<its key or instant>``).
    The schedule id is part of it because one automation may carry several schedules."""
    return f"{automation_id}:schedule:{schedule_id}:{instant}"


def fork_start_key(run_id: str, seq: int, version: int) -> str:
    """A fork's start key: ``fork:<run_id>:<seq>:v<version>`` -- the run and step entry it was
    forked from and the version it runs on, so asking for the same fork twice finds the first."""
    return f"fork:{run_id}:{seq}:v{version}"


def correlation_key(channel: str, ref: str) -> str:
    """What leads an answer back to its run (R9): ``<channel>:<the provider's id of the thing
    answered>``, e.g. ``email:msg_4f2a`` -- a reply names the message it answers
    (``In-Reply-To``). Recorded when the answered thing is created."""
    return f"{channel}:{ref}"


def signal_id(source: str, event_id: str) -> str:
    """A signal's identity: ``<source>:<the sender's event id>`` (``email:evt_91``), so two
    providers' event ids never collide and a transport duplicate is the same row."""
    return f"{source}:{event_id}"


def approval_id(run_id: str, step_id: str, iteration: int, request: int) -> str:
    """An approval request: the step's effect key plus the request number (a second request
    after an escalation or a changed draft is a new approval and a new Slack post). It is
    also the effect key of the post that asks."""
    return f"{effect_key(run_id, step_id, iteration)}/{request}"
