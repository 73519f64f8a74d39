"""The reference scenario as the chaos runner drives it: Maya's follow-up, people included.

    wait (wait_for 1s) -> draft (model.generate) -> crm (crm.upsert)
        -> approve (approval: Sam or Alex in Slack, 60 s, then the default: approve)
        -> approved? --yes--> send (email.send) -> wait_reply (wait_signal reply|unsubscribe, 4 s)
                    |            -> replied? -> thank | unsubscribed | no_reply
                    |            -> pay? (input.charge) -> charge (payment.charge) -> done (set)
                    \\--no---> not_sent -> done

Every outside effect goes to the sandbox over real HTTP through a registered connection, so the
sandbox ledger is the record of the work the providers really did. One run in
``CHARGE_EVERY`` also charges a card at the payment provider, which offers neither an
idempotency key nor a search: an uncertain charge must park for a person, never repeat.

The people are played by the runner against the sandbox (:func:`decision`, :func:`reply`):
Sam clicks Approve (Reject on one run in ten) in the Slack message the approval posted, the
click signed by the sandbox as Slack signs it and sent to the engine API's interactivity URL;
on one run in four Alex clicks at the same moment (the other button, half of those times);
on one run in six the click is then retried by Slack and replayed byte for byte. Maya answers
the email through the sandbox, which delivers every reply twice to the engine's inbound-email
webhook: a reply on most runs, an unsubscribe on one in eight, nothing on one in eight (the
4 s deadline decides), and on one in eight she answers as soon as the email went out, before
the step waits for her.

Each run is started by a webhook-like event id (``evt-<i>``), delivered twice, naming its
contact (``contact-<i>``, ``runs.contact_id``).

A run's whole life (R11, R12, R14, R15): the runner cancels some runs (:func:`cancel_plan`),
erases one contact in ten (:func:`erase_plan`), publishes version 2 mid-run (``no_reply``
renamed by ``MIGRATION_MAP``, the email's subject changed) and migrates version 1's runs to
it, and breaks the mailbox's connection for a moment; the organisation's notifications go to
the sandbox's webhook receiver (``HOOK_INBOX``), which fails the first ``HOOK_FAILS`` attempts.

Flow control (R5) guards every outside call (:func:`configure_flow_control`): each connection
has a circuit breaker that opens after ``CIRCUIT_THRESHOLD`` failures in its window and
probes once after a short cool-down, and the automation has a budget in tokens per day that
fits only a few drafts (the model's maximum cost is reserved before each call), so drafts park
on it until the runner raises it. The runner makes the CRM fail in bursts
(:func:`burst_knobs`), long enough to open its circuit and fail its first probe; the next
probe closes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from onward.api_keys import with_key
from onward.automations.builder import Automation
from onward.connections import Integrations
from onward.sandbox.admin import SandboxAdmin

if TYPE_CHECKING:
    from onward.engine import Engine

AUTOMATION = "chaos-follow-up"
ACCOUNT = "acct_chaos"
CHARGE_EVERY = 5  # one run in five charges a card

# The Slack workspace of the approvals, its connection, and the people who may decide.
SLACK_WORKSPACE = "T_CHAOS"
SLACK_CONNECTION = "slack"
SLACK_CHANNEL = "#chaos-approvals"
SAM, ALEX = "U_SAM", "U_ALEX"
APPROVERS = (SAM, ALEX)
APPROVAL_DEADLINE = "60s"  # long enough that a person decides first; then the default approves
REPLY_DEADLINE = "4s"  # short: some replies lose the race to it, and are recorded late

# connection id -> provider (the Slack connection is added with its signing secret)
CONNECTIONS = {"model": "model", "crm": "crm", "mailbox": "email", "payments": "payment"}
# the effect steps of the scenario -> their provider (the approval's post is keyed by its id)
EFFECT_STEPS = {"draft": "model", "crm": "crm", "send": "email", "charge": "payment"}
IDEMPOTENT_PROVIDERS = ("email", "crm")  # a repeat is harmless: duplicates must be 0
# what the step after ``wait_reply`` records, by the signal that woke it (None: the deadline)
OUTCOME_STEPS = {"reply": "thank", "unsubscribe": "unsubscribed", None: "no_reply"}

# Generous attempts: every kill of a claimed step costs one attempt (the claim is the fence).
RETRY = {"max_attempts": 40, "base": 0.2, "cap": 2.0}

# Flow control. Every connection's circuit opens after 3 failures in 10 s and probes once
# after 1 s; the providers' circuits (which count the same failures) are left out of the
# play with a threshold no run reaches, so one circuit guards each call: when concurrent
# failures open a call's two circuits from two different steps, each circuit takes its own
# parked step as its probe and the two probes refuse each other ("one probe at a time") at
# every cool-down, so their runs never finish (circuits.admit / circuits.sql half_open_due).
CIRCUIT_THRESHOLD, CIRCUIT_WINDOW_S, CIRCUIT_COOLDOWN_S = 3, 10.0, 1.0
PROVIDER_CIRCUIT_THRESHOLD = 1_000_000
BURST_PROVIDER = "crm"  # the provider the runner makes fail in bursts
BURST_CONNECTION = "crm"
BURST = 4  # 503s per burst: 3 open the circuit, the 4th fails its probe, the next closes it
DRAFT_PROMPT = "Draft a short follow-up to {input.email}"
DRAFT_MAX_TOKENS = 64
BUDGET_UNIT = "tokens"
BUDGET_DRAFTS = 4  # the budget fits this many drafts' maximum cost at first ...
BUDGET_RAISE_DRAFTS = 5  # ... and each raise by the runner this many more
BUDGET_LEASE_S = 6.0  # a reservation's lease in the worker processes (default 120 s)


def event_id(i: int) -> str:
    return f"evt-{i}"


def payload(i: int) -> dict[str, Any]:
    return {
        "i": i,
        "email": f"maya+{i}@example.test",
        "contact": f"contact-{i}",
        "charge": i % CHARGE_EVERY == 0,
    }


@dataclass(frozen=True)
class Decision:
    """What the approvers of run ``i`` do once its Slack message is posted."""

    action: str  # Sam's button: "approve" or "reject"
    race: bool  # Alex clicks at the same moment: exactly one decision may stand
    other: str  # Alex's button in a race (the other one, half of the time)
    replay: bool  # then Slack retries the click, and the last click is resent byte for byte


def decision(i: int) -> Decision:
    action = "reject" if i % 10 == 7 else "approve"
    race = i % 4 == 1
    other = ("reject" if action == "approve" else "approve") if i % 8 == 1 else action
    return Decision(action=action, race=race, other=other, replay=i % 6 == 2)


@dataclass(frozen=True)
class Reply:
    """What Maya does with the email of run ``i``."""

    kind: str | None  # "reply", "unsubscribe", or None: silence (the deadline decides)
    early: bool  # she answers as soon as the email went out, before the step waits
    text: str


def reply(i: int) -> Reply:
    r = i % 8
    if r == 5:
        return Reply(kind=None, early=False, text="")
    kind = "unsubscribe" if r == 3 else "reply"
    return Reply(kind=kind, early=r == 6, text=f"Thursday works for me ({i}).")


# Some runs are cancelled by the runner (R12), through the API process: while they wait, or
# while one of their steps is in flight. By event index, i % 10.
CANCEL_WAITING, CANCEL_IN_FLIGHT = 4, 8


def cancel_plan(i: int) -> str | None:
    """When the runner cancels run ``i``: ``waiting`` (on its first wait or on the reply),
    ``in_flight`` (a step running; else while it waits for the reply), or never (None)."""
    return {CANCEL_WAITING: "waiting", CANCEL_IN_FLIGHT: "in_flight"}.get(i % 10)


# Some contacts are erased by the runner (R14), through the API process: while their run is in
# its first steps (the wait, the draft, the CRM; its step in flight or not), or once it has
# finished. By event index: i % 10 == ERASE.
ERASE = 1


def erase_plan(i: int) -> str | None:
    """When the runner erases the contact of run ``i``: ``early`` (in its first steps; else once
    it finished), ``finished``, or never (None)."""
    if i % 10 != ERASE:
        return None
    return "early" if (i // 10) % 2 == 0 else "finished"


EARLY_STEPS = ("wait", "draft", "crm")  # before anyone is asked or written to


def identifiers(i: int) -> list[str]:
    """What must be gone once run ``i``'s contact is erased: its id and its address."""
    return [payload(i)["contact"], payload(i)["email"]]


# Version 2 of the automation (R11), published mid-run; the runs of version 1 still unfinished
# are migrated to it. The same step ids but one: ``no_reply`` is renamed (the map says so), and
# the email's subject changes.
MIGRATION_MAP = {"no_reply": "no_answer"}
V2_SUBJECT = "Following up (v2)"


def outcome_step(step_id: str) -> str:
    """A step id of either version as version 1 names it (the figures count by those)."""
    renamed = {new: old for old, new in MIGRATION_MAP.items()}
    return renamed.get(step_id, step_id)


# A connection broken mid-run (R15): the mailbox's provider answers 401 for a moment, so a send
# marks it broken (the notification written), runs park on it until the runner restores it. The
# organisation's webhook destination is the sandbox's receiver, which fails the first attempts.
BREAK_PROVIDER, BREAK_CONNECTION = "email", "mailbox"
HOOK_INBOX = "chaos-ops"
HOOK_FAILS = 2  # the receiver answers the first attempts 503
DESTINATION = "ops"


def draft_cost(i: int) -> int:
    """The most run ``i``'s draft may cost in tokens, as the model connector estimates it
    (prompt tokens, four characters each, plus ``max_tokens``): what it reserves."""
    prompt = DRAFT_PROMPT.replace("{input.email}", payload(i)["email"])
    return math.ceil(len(prompt) / 4) + DRAFT_MAX_TOKENS


def budget_start() -> int:
    return BUDGET_DRAFTS * draft_cost(0)


def budget_raise() -> int:
    return BUDGET_RAISE_DRAFTS * draft_cost(0)


def charges(runs: int) -> int:
    """How many of ``runs`` runs (events 0..runs-1) reach the payment step."""
    return sum(1 for i in range(runs) if payload(i)["charge"])


# A schedule beside the scenario, so the elected sweeper fires runs while it is killed (crash
# point schedule.after_start). Its runs live in an organisation of their own: the scenario's
# figures stay the scenario's.
CLOCK_ORG = "chaos-clock"
CLOCK = "chaos-clock"
CLOCK_EVERY_S = 3
CLOCK_FIRINGS = 200  # ten minutes of firings; a COUNT keeps each calendar step cheap


def clock_document() -> dict[str, Any]:
    """An automation started every few seconds by its schedule (overlap allow, catch-up all:
    every instant must start exactly one run, whatever was killed)."""
    first = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    rule = (
        f"DTSTART:{first:%Y%m%dT%H%M%S}\n"
        f"RRULE:FREQ=SECONDLY;INTERVAL={CLOCK_EVERY_S};COUNT={CLOCK_FIRINGS}"
    )
    flow = (
        Automation(CLOCK)
        .step("tick", "set", values={"at": "input.schedule.instant"})
        .schedule("tick", rule, zone="UTC", overlap="allow", catch_up="all")
    )
    return flow.build()


def document(
    wait: str = "1s",
    *,
    approval_deadline: str = APPROVAL_DEADLINE,
    reply_deadline: str = REPLY_DEADLINE,
    version: int = 1,
) -> dict[str, Any]:
    """The scenario's automation; ``version=2`` is what the runner publishes mid-run
    (``MIGRATION_MAP``'s renamed step, ``V2_SUBJECT``)."""
    silent = MIGRATION_MAP["no_reply"] if version == 2 else "no_reply"
    flow = (
        Automation(AUTOMATION, name="Maya's follow-up (chaos)")
        .step("wait", "wait_for", duration=wait)
        .step(
            "draft",
            "model.generate",
            connection="model",
            prompt=DRAFT_PROMPT,
            max_tokens=DRAFT_MAX_TOKENS,
        )
        .step(
            "crm",
            "crm.upsert",
            connection="crm",
            external_id="{input.contact}",
            fields={"email": "{input.email}", "stage": "contacted"},
        )
        .step(
            "approve",
            "approval",
            connection=SLACK_CONNECTION,
            channel=SLACK_CHANNEL,
            approvers=list(APPROVERS),
            text="Send the follow-up to {input.email} ({input.contact})?",
            deadline=approval_deadline,
            on_deadline="default",
            default="approve",
        )
        .branch("approved", cases=[("steps.approve.approved", "send")], default="not_sent")
        .step(
            "send",
            "email.send",
            connection="mailbox",
            to="{input.email}",
            subject=V2_SUBJECT if version == 2 else "Following up",
            body="Hello {input.email}, thanks for your message.",
        )
        .step(
            "wait_reply", "wait_signal", signals=["reply", "unsubscribe"], deadline=reply_deadline
        )
        .branch(
            "replied",
            cases=[
                ("steps.wait_reply.signal == 'reply'", OUTCOME_STEPS["reply"]),
                ("steps.wait_reply.signal == 'unsubscribe'", OUTCOME_STEPS["unsubscribe"]),
            ],
            default=silent,
        )
        .step("thank", "set", values={"outcome": "'replied'"}, next="pay")
        .step("unsubscribed", "set", values={"outcome": "'unsubscribed'"}, next="pay")
        .step(silent, "set", values={"outcome": "'no reply'"}, next="pay")
        .branch("pay", cases=[("input.charge == true", "charge")], default="done")
        .step(
            "charge",
            "payment.charge",
            connection="payments",
            amount=1200,
            currency="eur",
            customer="{input.contact}",
            description="follow-up package",
            next="done",
        )
        .step("not_sent", "set", values={"outcome": "'not approved'"}, next="done")
        .step("done", "set", values={"finished": "true"})
    )
    doc = flow.build()
    for step in doc["steps"]:
        step["retry"] = dict(RETRY)
    return doc


async def add_connections(
    integrations: Integrations, org_id: str, sandbox_url: str, *, signing_secret: str | None = None
) -> None:
    """One connection per provider, all on the sandbox's chaos account, and the Slack
    connection on the chaos workspace with the secret its clicks are signed with (without
    one, no click is accepted)."""
    for connection_id, provider in CONNECTIONS.items():
        await integrations.add_connection(
            org_id,
            connection_id,
            provider=provider,
            base_url=sandbox_url,
            account=ACCOUNT,
            secret=ACCOUNT,  # the sandbox's bearer token names the account
        )
    await integrations.add_connection(
        org_id,
        SLACK_CONNECTION,
        provider="slack",
        base_url=sandbox_url,
        account=SLACK_WORKSPACE,
        secret=SLACK_WORKSPACE,
        signing_secret=signing_secret,
    )


async def configure_flow_control(engine: Engine) -> None:
    """The circuits of every connection (and of their providers) and the automation's budget
    in tokens, at its starting size."""
    for connection_id, provider in {**CONNECTIONS, SLACK_CONNECTION: "slack"}.items():
        for key, threshold in (
            (f"connection:{connection_id}", CIRCUIT_THRESHOLD),
            (f"provider:{provider}", PROVIDER_CIRCUIT_THRESHOLD),
        ):
            await engine.configure_circuit(
                key,
                threshold=threshold,
                window_seconds=CIRCUIT_WINDOW_S,
                cooldown_seconds=CIRCUIT_COOLDOWN_S,
            )
    await engine.set_budget(AUTOMATION, BUDGET_UNIT, budget_start())


def burst_knobs(base: dict[str, Any]) -> dict[str, Any]:
    """The burst provider's knobs during a burst: its usual ones, and ``BURST`` 503s next."""
    return {**base, "script": ["503"] * BURST}


def connect_people(admin: SandboxAdmin, api_url: str, signing_secret: str, api_key: str) -> None:
    """Point the sandbox's Slack app (clicks, signed) and the mailbox's inbound webhook
    (replies, with ``api_key`` as the URL's Basic user info) at the engine API (after
    :func:`configure_faults`, which resets the sandbox)."""
    admin.slack_app(
        SLACK_WORKSPACE,
        f"{api_url}/v1/slack/{SLACK_CONNECTION}/interactivity",
        signing_secret,
    )
    admin.email_inbound(ACCOUNT, with_key(f"{api_url}/v1/inbound/email", api_key))


# A draft takes a while, as a model's does: the runner's in-flight cancels need a step that is
# running long enough to be seen (a sandbox answering in a millisecond is rarely caught), and
# the cancel, sent through the API, must commit before the draft settles. At 40 ms a run of
# 1,000 caught 72 of its 100 planned in flight, and a run of 30 (three planned) once caught
# none of its three (2026-12-07, the suite's quick chaos test); 100 ms leaves the cancel time.
MODEL_LATENCY_MS = 100


def fault_knobs(seed: int, *, light: bool = True) -> dict[str, dict[str, Any]]:
    """A little of every provider failure the design names, on top of the kills.

    5xx and 429 are answers ("not done"): the attempt is withdrawn and retried. A dropped
    connection after the work is an unknown outcome: reconciled (email, CRM), repeated (a
    Slack approval message: its buttons decide once) or parked for a person (payment). The
    model gets no dropped responses: it has neither idempotency nor search, so an unknown
    generation parks too, and the kills already exercise that."""
    if not light:
        return {"model": {"latency_ms": MODEL_LATENCY_MS}}
    knobs: dict[str, dict[str, Any]] = {}
    for n, provider in enumerate(("email", "crm", "model", "payment", "slack")):
        k: dict[str, Any] = {
            "error_rate": 0.02,
            "rate_limit_rate": 0.01,
            "retry_after_s": 1,
            "seed": seed + n,
        }
        if provider != "model":
            k["drop_after_work_rate"] = 0.01
        else:
            k["latency_ms"] = MODEL_LATENCY_MS
        knobs[provider] = k
    return knobs


def configure_faults(admin: SandboxAdmin, knobs: dict[str, dict[str, Any]]) -> None:
    admin.reset()
    for provider, k in knobs.items():
        admin.faults(provider, **k)
